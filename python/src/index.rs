//! Python's indexing and shape arguments on tensors: `t[0, 1:3, None, ...]`,
//! `t[[2, 0]]`, `reshape(2, -1)`, reductions over several or all
//! dimensions.

use pyo3::exceptions::{PyIndexError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyEllipsis, PyList, PySlice, PySliceMethods, PyTuple};
use silica::{DType, ReduceOp, Tensor};

use crate::errors::{Res, detach, value_error};
use crate::tensor::PyTensor;

/// One item of an index, read while the interpreter is held.
enum Item {
    /// An integer: the dimension is removed.
    Int(i64),
    /// `start, step, count` as `slice.indices` computes them.
    Slice(isize, isize, usize),
    NewAxis,
    Ellipsis,
    /// A 1-D tensor of indices (u32 or i64), already checked when it came
    /// from a list or an array.
    Array(Tensor),
}

/// `t[key]`: integers, slices (any step), `None`, `...`, and one 1-D
/// index array (a list, a NumPy integer array or an integer tensor).
pub fn getitem(t: &Tensor, key: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let keys: Vec<Bound<'_, PyAny>> = match key.cast::<PyTuple>() {
        Ok(tuple) => tuple.iter().collect(),
        Err(_) => vec![key.clone()],
    };
    let rank = t.rank();
    let consumed = keys
        .iter()
        .filter(|k| !k.is_none() && !k.is(PyEllipsis::get(k.py())))
        .count();
    if consumed > rank {
        return Err(PyIndexError::new_err(format!(
            "too many indices ({consumed}) for a tensor of shape {:?}",
            t.shape()
        )));
    }
    // read every item first, with the size of the dimension it indexes
    let mut items = Vec::with_capacity(keys.len());
    let mut dim = 0; // dimension of `t` the next item indexes
    let mut arrays = 0;
    for k in &keys {
        let py = k.py();
        if k.is_none() {
            items.push(Item::NewAxis);
        } else if k.is(PyEllipsis::get(py)) {
            if items.iter().any(|i| matches!(i, Item::Ellipsis)) {
                return Err(PyIndexError::new_err("an index can only have one ellipsis"));
            }
            items.push(Item::Ellipsis);
            dim += rank - consumed;
        } else {
            let size = t.shape()[dim];
            if let Ok(s) = k.cast::<PySlice>() {
                let ix = s.indices(size as isize)?;
                items.push(Item::Slice(ix.start, ix.step, ix.slicelength));
            } else if let Some(arr) = index_array(k, size, t.device())? {
                arrays += 1;
                items.push(Item::Array(arr));
            } else {
                let i: i64 = k.extract().map_err(|_| {
                    PyIndexError::new_err(format!(
                        "tensors are indexed by integers, slices, None, ... and one 1-D integer array, not {}",
                        k.get_type().name().map(|n| n.to_string()).unwrap_or_default()
                    ))
                })?;
                let j = if i < 0 { i + size as i64 } else { i };
                if j < 0 || j >= size as i64 {
                    return Err(PyIndexError::new_err(format!(
                        "index {i} is out of range for dimension {dim} of size {size}"
                    )));
                }
                items.push(Item::Int(j));
            }
            dim += 1;
        }
    }
    if arrays > 1 {
        return Err(PyIndexError::new_err(
            "only one index array per index is supported",
        ));
    }
    detach(key.py(), || apply(t, items))
}

/// The view (or gather) that `items` select.
fn apply(t: &Tensor, items: Vec<Item>) -> Res<Tensor> {
    let rank = t.rank();
    let consumed = items
        .iter()
        .filter(|i| !matches!(i, Item::NewAxis | Item::Ellipsis))
        .count();
    let mut out = t.clone();
    // position in `out` of the next dimension to index
    let mut d = 0usize;
    for item in items {
        let di = d as isize;
        match item {
            Item::Int(i) => out = out.narrow(di, i as usize, 1)?.squeeze(di)?,
            Item::NewAxis => {
                out = out.unsqueeze(di)?;
                d += 1;
            }
            Item::Ellipsis => d += rank - consumed,
            Item::Slice(start, step, count) => {
                out = if count == 0 {
                    out.narrow(di, 0, 0)?
                } else if step == 1 {
                    out.narrow(di, start as usize, count)?
                } else {
                    let idx: Vec<u32> = (0..count as isize)
                        .map(|k| (start + k * step) as u32)
                        .collect();
                    let idx = Tensor::from_vec(idx, &[count], out.device())?;
                    out.index_select(di, &idx)?
                };
                d += 1;
            }
            Item::Array(idx) => {
                out = out.index_select(di, &idx)?;
                d += 1;
            }
        }
    }
    Ok(out)
}

/// An index array for a dimension of `size`, if `k` is one: a list, a
/// NumPy integer array (negative entries counted from the end), or an
/// integer tensor (used as it is).
fn index_array(
    k: &Bound<'_, PyAny>,
    size: usize,
    device: &silica::Device,
) -> PyResult<Option<Tensor>> {
    let py = k.py();
    if let Ok(t) = k.cast::<PyTensor>() {
        let t = &t.get().t;
        if !matches!(t.dtype(), DType::U32 | DType::I64) || t.rank() != 1 {
            return Err(PyIndexError::new_err(format!(
                "an index tensor must be 1-D u32 or i64, not {:?} {}",
                t.shape(),
                t.dtype()
            )));
        }
        let t = t.clone();
        let device = device.clone();
        return detach(py, || Ok(t.to_device(&device)?)).map(Some);
    }
    let np = py.import("numpy")?;
    let is_array =
        k.is_instance(&np.getattr("ndarray")?)? && k.getattr("ndim")?.extract::<usize>()? > 0;
    if !k.is_instance_of::<PyList>() && !is_array {
        return Ok(None);
    }
    let arr = np.call_method1("asarray", (k,))?;
    let kind: String = arr.getattr("dtype")?.getattr("kind")?.extract()?;
    let ndim: usize = arr.getattr("ndim")?.extract()?;
    if kind == "b" {
        return Err(PyIndexError::new_err(
            "boolean masks are not supported as indices; use silica.where, or index with integers",
        ));
    }
    if ndim != 1 || !(kind == "i" || kind == "u" || arr.getattr("size")?.extract::<usize>()? == 0) {
        return Err(PyIndexError::new_err(
            "an index array must be a 1-D list or array of integers",
        ));
    }
    let raw: Vec<i64> = arr
        .call_method1("astype", ("int64",))?
        .call_method0("tolist")?
        .extract()?;
    let mut idx = Vec::with_capacity(raw.len());
    for &i in &raw {
        let j = if i < 0 { i + size as i64 } else { i };
        if j < 0 || j >= size as i64 {
            return Err(PyIndexError::new_err(format!(
                "index {i} is out of range for a dimension of size {size}"
            )));
        }
        idx.push(j as u32);
    }
    let n = idx.len();
    let device = device.clone();
    detach(py, || Ok(Tensor::from_vec(idx, &[n], &device)?)).map(Some)
}

/// A shape given as `f(2, 3)` or `f((2, 3))`, with at most one `-1`
/// inferred from `numel`.
pub fn shape_arg(args: &Bound<'_, PyTuple>, numel: usize) -> PyResult<Vec<usize>> {
    let dims: Vec<i64> =
        if args.len() == 1 && !args.get_item(0)?.is_instance_of::<pyo3::types::PyInt>() {
            args.get_item(0)?.extract()?
        } else {
            args.extract()?
        };
    infer_shape(&dims, numel)
}

/// `dims` with a `-1` replaced by what makes `numel` elements.
pub fn infer_shape(dims: &[i64], numel: usize) -> PyResult<Vec<usize>> {
    let unknown = dims.iter().filter(|&&d| d == -1).count();
    if unknown > 1 || dims.iter().any(|&d| d < -1) {
        return Err(value_error(format!(
            "invalid shape {dims:?}: sizes must be 0 or more, with at most one -1"
        )));
    }
    let known: usize = dims
        .iter()
        .filter(|&&d| d >= 0)
        .map(|&d| d as usize)
        .product();
    Ok(dims
        .iter()
        .map(|&d| {
            if d == -1 {
                numel.checked_div(known).unwrap_or(0)
            } else {
                d as usize
            }
        })
        .collect())
}

/// Dimensions given as an int, a sequence of ints, or `None` (all).
pub fn dims_arg(dim: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<isize>>> {
    let Some(d) = dim.filter(|d| !d.is_none()) else {
        return Ok(None);
    };
    let v: Vec<isize> = match d.extract::<isize>() {
        Ok(one) => vec![one],
        Err(_) => d
            .extract()
            .map_err(|_| PyTypeError::new_err("dim must be an int, a sequence of ints or None"))?,
    };
    Ok(Some(v))
}

/// A reduction over `dims` (all dimensions when `None`), keeping them as
/// size 1 when `keepdim`.
pub fn reduce(t: &Tensor, op: ReduceOp, dims: Option<Vec<isize>>, keepdim: bool) -> Res<Tensor> {
    let rank = t.rank();
    let Some(dims) = dims else {
        let flat = t.reshape(&[t.numel()])?;
        let r = flat.reduce(op, 0, false)?;
        return Ok(if keepdim {
            r.reshape(&vec![1; rank])?
        } else {
            r
        });
    };
    let mut norm: Vec<usize> = Vec::with_capacity(dims.len());
    for &d in &dims {
        let n = if d < 0 { d + rank as isize } else { d };
        if n < 0 || n >= rank as isize {
            return Err(silica::Error::DimOutOfRange {
                op: op.name(),
                dim: d,
                shape: t.shape().to_vec(),
            }
            .into());
        }
        if norm.contains(&(n as usize)) {
            return Err(crate::errors::Failure::Value(format!(
                "dimension {d} is repeated"
            )));
        }
        norm.push(n as usize);
    }
    if norm.len() > 1 && matches!(op, ReduceOp::Argmax | ReduceOp::Argmin) {
        return Err(crate::errors::Failure::Value(format!(
            "{} takes one dimension or None",
            op.name()
        )));
    }
    norm.sort_unstable_by(|a, b| b.cmp(a));
    let mut out = t.clone();
    for &d in &norm {
        out = out.reduce(op, d as isize, true)?;
    }
    if !keepdim {
        for &d in &norm {
            out = out.squeeze(d as isize)?;
        }
    }
    Ok(out)
}
