//! Module-level tensor constructors and the ops that take several tensors.
//! (The ops of one tensor are its methods; `silica/__init__.py` adds
//! function forms of them.)

use pyo3::prelude::*;
use silica::{DType, Tensor};

use crate::convert::to_tensor;
use crate::device;
use crate::dtype;
use crate::errors::{detach, value_error};
use crate::operands::tensor_arg;
use crate::tensor::PyTensor;

/// A tensor of `data` (a NumPy array, nested lists, a scalar or a tensor)
/// on `device` (default: `silica.default_device()`), of `dtype` (default:
/// the array's: float32, float16, bfloat16 (ml_dtypes), uint32 and int64
/// as they are, float64 as f32, bool as u32, other integers as i64).
#[pyfunction]
#[pyo3(signature = (data, device=None, dtype=None))]
pub fn tensor(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
    dtype: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyTensor> {
    let dev = device::resolve(py, device)?;
    let dt = dtype::parse_opt(dtype)?;
    Ok(to_tensor(data, &dev, dt)?.into())
}

fn shape_of(shape: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    match shape.extract::<usize>() {
        Ok(n) => Ok(vec![n]),
        Err(_) => shape.extract(),
    }
}

fn dtype_or_f32(dt: Option<&Bound<'_, PyAny>>) -> PyResult<DType> {
    Ok(dtype::parse_opt(dt)?.unwrap_or(DType::F32))
}

/// A tensor of `shape` filled with `value`.
#[pyfunction]
#[pyo3(signature = (shape, value, dtype=None, device=None))]
pub fn full(
    py: Python<'_>,
    shape: &Bound<'_, PyAny>,
    value: f64,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyTensor> {
    let (s, dt, dev) = (
        shape_of(shape)?,
        dtype_or_f32(dtype)?,
        device::resolve(py, device)?,
    );
    detach(py, || Ok(Tensor::full(value, &s, dt, &dev)?.into()))
}

/// A tensor of `shape` filled with zeros.
#[pyfunction]
#[pyo3(signature = (shape, dtype=None, device=None))]
pub fn zeros(
    py: Python<'_>,
    shape: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyTensor> {
    full(py, shape, 0.0, dtype, device)
}

/// A tensor of `shape` filled with ones.
#[pyfunction]
#[pyo3(signature = (shape, dtype=None, device=None))]
pub fn ones(
    py: Python<'_>,
    shape: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyTensor> {
    full(py, shape, 1.0, dtype, device)
}

/// `arange(end)` or `arange(start, end, step=1)`: a 1-D tensor.
#[pyfunction]
#[pyo3(signature = (start, end=None, step=1.0, dtype=None, device=None))]
pub fn arange(
    py: Python<'_>,
    start: f64,
    end: Option<f64>,
    step: f64,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyTensor> {
    let (start, end) = match end {
        Some(e) => (start, e),
        None => (0.0, start),
    };
    let (dt, dev) = (dtype_or_f32(dtype)?, device::resolve(py, device)?);
    detach(
        py,
        || Ok(Tensor::arange(start, end, step, dt, &dev)?.into()),
    )
}

/// Standard normal samples from a seeded generator (the same seed gives
/// the same values on every device).
#[pyfunction]
#[pyo3(signature = (shape, seed=0, dtype=None, device=None))]
pub fn randn(
    py: Python<'_>,
    shape: &Bound<'_, PyAny>,
    seed: u64,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyTensor> {
    let (s, dt, dev) = (
        shape_of(shape)?,
        dtype_or_f32(dtype)?,
        device::resolve(py, device)?,
    );
    detach(py, || Ok(Tensor::randn(&s, dt, seed, &dev)?.into()))
}

/// Uniform samples in `[0, 1)` from a seeded generator.
#[pyfunction]
#[pyo3(signature = (shape, seed=0, dtype=None, device=None))]
pub fn rand(
    py: Python<'_>,
    shape: &Bound<'_, PyAny>,
    seed: u64,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyTensor> {
    let (s, dt, dev) = (
        shape_of(shape)?,
        dtype_or_f32(dtype)?,
        device::resolve(py, device)?,
    );
    detach(py, || Ok(Tensor::rand(&s, dt, seed, &dev)?.into()))
}

fn tensors(seq: &Bound<'_, PyAny>) -> PyResult<Vec<Tensor>> {
    let mut out = Vec::new();
    for item in seq.try_iter()? {
        out.push(tensor_arg(&item?, "every element")?.clone());
    }
    if out.is_empty() {
        return Err(value_error("needs at least one tensor"));
    }
    Ok(out)
}

/// Concatenates tensors along `dim` (the other dimensions must agree).
#[pyfunction]
#[pyo3(signature = (tensors, dim=0))]
pub fn cat(py: Python<'_>, tensors: &Bound<'_, PyAny>, dim: isize) -> PyResult<PyTensor> {
    let ts = self::tensors(tensors)?;
    detach(py, || {
        let refs: Vec<&Tensor> = ts.iter().collect();
        Ok(Tensor::cat(&refs, dim)?.into())
    })
}

/// Stacks tensors of one shape along a new dimension `dim`.
#[pyfunction]
#[pyo3(signature = (tensors, dim=0))]
pub fn stack(py: Python<'_>, tensors: &Bound<'_, PyAny>, dim: isize) -> PyResult<PyTensor> {
    let ts = self::tensors(tensors)?;
    detach(py, || {
        let parts: Vec<Tensor> = ts
            .iter()
            .map(|t| t.unsqueeze(dim))
            .collect::<silica::Result<_>>()?;
        let refs: Vec<&Tensor> = parts.iter().collect();
        Ok(Tensor::cat(&refs, dim)?.into())
    })
}

/// `x` where `condition` is non-zero, else `y`, with broadcasting; `x` and
/// `y` may be numbers.
#[pyfunction]
#[pyo3(name = "where")]
pub fn where_(
    py: Python<'_>,
    condition: &Bound<'_, PyAny>,
    x: &Bound<'_, PyAny>,
    y: &Bound<'_, PyAny>,
) -> PyResult<PyTensor> {
    let c = tensor_arg(condition, "condition")?.clone();
    // the dtype of whichever branch is a tensor (f32 when both are numbers)
    let like = [x, y]
        .iter()
        .find_map(|o| o.cast::<PyTensor>().ok().map(|t| t.get().t.dtype()))
        .unwrap_or(DType::F32);
    let a = to_tensor(x, c.device(), Some(like))?;
    let b = to_tensor(y, c.device(), Some(like))?;
    detach(py, || Ok(c.where_cond(&a, &b)?.into()))
}

/// The rotary angle tables for `rope`: f32 `cos` and `sin` of shape
/// `[T, head_dim / 2]`, where pair `i` of position `p` turns by
/// `p * theta^(-2i / head_dim)`. `positions` is a count `T` (positions
/// `0..T`) or a sequence of positions.
#[pyfunction]
#[pyo3(signature = (positions, head_dim, theta=10000.0, device=None))]
pub fn rope_tables(
    py: Python<'_>,
    positions: &Bound<'_, PyAny>,
    head_dim: usize,
    theta: f64,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<(PyTensor, PyTensor)> {
    if head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(value_error(format!(
            "head_dim {head_dim} must be even and positive"
        )));
    }
    let pos: Vec<f64> = match positions.extract::<usize>() {
        Ok(n) => (0..n).map(|p| p as f64).collect(),
        Err(_) => positions.extract()?,
    };
    let dev = device::resolve(py, device)?;
    let half = head_dim / 2;
    let mut cos = Vec::with_capacity(pos.len() * half);
    let mut sin = Vec::with_capacity(pos.len() * half);
    for &p in &pos {
        for i in 0..half {
            let angle = p * theta.powf(-2.0 * i as f64 / head_dim as f64);
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    let t = pos.len();
    detach(py, || {
        Ok((
            Tensor::from_vec(cos, &[t, half], &dev)?.into(),
            Tensor::from_vec(sin, &[t, half], &dev)?.into(),
        ))
    })
}
