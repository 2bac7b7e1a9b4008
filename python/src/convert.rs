//! NumPy arrays to tensors and back.
//!
//! An array's elements are read straight into the tensor's storage (on a
//! GPU, uploaded from the array's memory): one copy. A CPU tensor's
//! `.numpy()` is a read-only view of its storage, with its strides, kept
//! alive by the tensor (silica's tensors never change under a view);
//! a GPU tensor's is one read-back into a vector the array then owns.
//!
//! NumPy has no bfloat16: a bf16 tensor comes back as float32 (exactly:
//! every bf16 value is a float32 value), and an `ml_dtypes.bfloat16` array
//! becomes a bf16 tensor. float64 becomes f32, bool becomes u32 (silica's
//! masks), and other integer types become i64.

use numpy::ndarray::{ArrayView, IxDyn, ShapeBuilder};
use numpy::{PyArray, PyArray1, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use silica::{DType, Device, Tensor};

use crate::errors::{Res, detach};
use crate::tensor::PyTensor;

/// A tensor of `obj` (a `Tensor`, a NumPy array, or anything
/// `numpy.asarray` takes: nested lists, scalars) on `device`, converted
/// to `dtype` when one is given.
pub fn to_tensor(
    obj: &Bound<'_, PyAny>,
    device: &Device,
    dtype: Option<DType>,
) -> PyResult<Tensor> {
    let py = obj.py();
    if let Ok(t) = obj.cast::<PyTensor>() {
        let t = t.get().t.clone();
        return detach(py, || {
            let t = t.to_device(device)?;
            Ok(match dtype {
                Some(d) => t.to_dtype(d)?,
                None => t,
            })
        });
    }
    let np = py.import("numpy")?;
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("order", "C")?;
    let mut arr = np.call_method("asarray", (obj,), Some(&kwargs))?;
    let name: String = arr.getattr("dtype")?.getattr("name")?.extract()?;
    let natural = match name.as_str() {
        "float32" => DType::F32,
        "float16" => DType::F16,
        "bfloat16" => DType::BF16,
        "uint32" => DType::U32,
        "int64" => DType::I64,
        "float64" | "longdouble" | "float128" => {
            arr = arr.call_method1("astype", ("float32",))?;
            DType::F32
        }
        "bool" => {
            arr = arr.call_method1("astype", ("uint32",))?;
            DType::U32
        }
        n if n.starts_with("int") || n.starts_with("uint") => {
            arr = arr.call_method1("astype", ("int64",))?;
            DType::I64
        }
        other => {
            return Err(PyTypeError::new_err(format!(
                "cannot make a tensor of NumPy dtype {other}: silica holds f32, f16, bf16, u32 and i64"
            )));
        }
    };
    // astype and asarray keep the byte order; the elements are read as native
    if !arr
        .getattr("dtype")?
        .getattr("isnative")?
        .extract::<bool>()?
    {
        arr = arr.call_method1(
            "astype",
            (arr.getattr("dtype")?.call_method1("newbyteorder", ("=",))?,),
        )?;
    }
    let t = match natural {
        DType::F32 => upload::<f32, f32>(&arr, device, |s| s)?,
        DType::F16 => upload::<half::f16, half::f16>(&arr, device, |s| s)?,
        DType::BF16 => {
            let bits = arr.call_method1("view", ("uint16",))?;
            upload::<u16, half::bf16>(&bits, device, bytemuck::cast_slice)?
        }
        DType::U32 => upload::<u32, u32>(&arr, device, |s| s)?,
        DType::I64 => upload::<i64, i64>(&arr, device, |s| s)?,
    };
    match dtype {
        Some(d) if d != natural => detach(py, || Ok(t.to_dtype(d)?)),
        _ => Ok(t),
    }
}

/// The tensor of a C-contiguous array of `N` elements, read as `T`.
fn upload<N, T>(arr: &Bound<'_, PyAny>, device: &Device, view: fn(&[N]) -> &[T]) -> PyResult<Tensor>
where
    N: numpy::Element + Sync,
    T: silica::Element,
{
    let a = arr.cast::<PyArrayDyn<N>>()?.readonly();
    let shape = a.shape().to_vec();
    let data = a
        .as_slice()
        .map_err(|e| PyTypeError::new_err(e.to_string()))?;
    detach(arr.py(), || {
        Ok(Tensor::from_slice(view(data), &shape, device)?)
    })
}

/// A read-only NumPy view of the CPU tensor in `owner`, sharing its
/// storage, or `None` where the elements cannot be shared (a GPU tensor;
/// bf16, which NumPy lacks).
pub fn numpy_view<'py>(owner: &Bound<'py, PyTensor>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let t = &owner.get().t;
    let arr = match t.dtype() {
        DType::F32 => view::<f32>(owner, t)?,
        DType::F16 => view::<half::f16>(owner, t)?,
        DType::U32 => view::<u32>(owner, t)?,
        DType::I64 => view::<i64>(owner, t)?,
        DType::BF16 => None,
    };
    let Some(arr) = arr else { return Ok(None) };
    let kw = PyDict::new(owner.py());
    kw.set_item("write", false)?;
    arr.call_method("setflags", (), Some(&kw))?;
    Ok(Some(arr))
}

fn view<'py, T>(owner: &Bound<'py, PyTensor>, t: &Tensor) -> PyResult<Option<Bound<'py, PyAny>>>
where
    T: silica::Element + numpy::Element,
{
    let Some(data) = t.host_storage::<T>() else {
        return Ok(None);
    };
    let l = t.layout();
    let shape = IxDyn(l.shape()).strides(IxDyn(l.strides()));
    // SAFETY: the layout addresses elements inside `data` (offset plus
    // strides stay below the storage's extent), the storage is never
    // written while shared, and the array holds `owner`, which holds it.
    let arr = unsafe {
        let v = ArrayView::from_shape_ptr(shape, data.as_ptr().wrapping_add(l.offset()));
        PyArray::borrow_from_array(&v, owner.clone().into_any())
    };
    Ok(Some(arr.into_any()))
}

/// A NumPy array holding a copy of `t`'s elements (bf16 as float32).
pub fn to_numpy<'py>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    let shape = t.shape().to_vec();
    let arr = match t.dtype() {
        DType::F32 => array(py, detach(py, || Ok(t.to_vec::<f32>()?))?, &shape)?,
        DType::F16 => array(py, detach(py, || Ok(t.to_vec::<half::f16>()?))?, &shape)?,
        DType::BF16 => {
            let v = detach(py, || -> Res<Vec<f32>> {
                Ok(t.to_vec::<half::bf16>()?
                    .iter()
                    .map(|x| x.to_f32())
                    .collect())
            })?;
            array(py, v, &shape)?
        }
        DType::U32 => array(py, detach(py, || Ok(t.to_vec::<u32>()?))?, &shape)?,
        DType::I64 => array(py, detach(py, || Ok(t.to_vec::<i64>()?))?, &shape)?,
    };
    Ok(arr)
}

/// An array that owns `v`, with `shape`.
fn array<'py, T: numpy::Element>(
    py: Python<'py>,
    v: Vec<T>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    Ok(PyArray1::from_vec(py, v).reshape(shape)?.into_any())
}
