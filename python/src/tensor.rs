//! `silica.Tensor`: a silica tensor with Python's operators, NumPy
//! conversion and the op set. Every op releases the interpreter while
//! silica works.

use pyo3::basic::CompareOp;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyTuple};
use silica::{AttentionOpts, BinaryOp, CmpOp, DType, ReduceOp, Tensor, UnaryOp};

use crate::convert::{numpy_view, to_numpy, to_tensor};
use crate::device::PyDevice;
use crate::dtype;
use crate::errors::{Res, detach, value_error};
use crate::index;
use crate::operands::{Operand, binary, operand, param_or, rope_style, scalar_like, tensor_arg};

/// An n-dimensional array on a silica device.
#[pyclass(name = "Tensor", module = "silica", frozen)]
pub struct PyTensor {
    pub t: Tensor,
}

impl From<Tensor> for PyTensor {
    fn from(t: Tensor) -> Self {
        Self { t }
    }
}

impl PyTensor {
    fn unary(&self, py: Python<'_>, op: UnaryOp) -> PyResult<PyTensor> {
        detach(py, || Ok(self.t.unary(op)?.into()))
    }

    fn map(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Tensor) -> Res<Tensor> + Send,
    ) -> PyResult<PyTensor> {
        detach(py, || Ok(f(&self.t)?.into()))
    }

    fn reduce(
        &self,
        py: Python<'_>,
        op: ReduceOp,
        dim: Option<&Bound<'_, PyAny>>,
        keepdim: bool,
    ) -> PyResult<PyTensor> {
        let dims = index::dims_arg(dim)?;
        self.map(py, |t| index::reduce(t, op, dims, keepdim))
    }
}

#[pymethods]
impl PyTensor {
    // ----- what it is ---------------------------------------------------

    /// The dimensions, as a tuple.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.t.shape())
    }

    /// The element type: `"f32"`, `"f16"`, `"bf16"`, `"u32"` or `"i64"`.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.t.dtype().as_str()
    }

    /// The device the elements live on.
    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice::of(self.t.device())
    }

    /// The number of dimensions.
    #[getter]
    fn ndim(&self) -> usize {
        self.t.rank()
    }

    /// The number of elements.
    fn numel(&self) -> usize {
        self.t.numel()
    }

    /// Bytes of the elements.
    #[getter]
    fn nbytes(&self) -> usize {
        self.t.numel() * self.t.dtype().size_in_bytes()
    }

    /// Size of dimension `dim`, or the shape when `dim` is `None`.
    #[pyo3(signature = (dim=None))]
    fn size<'py>(&self, py: Python<'py>, dim: Option<isize>) -> PyResult<Bound<'py, PyAny>> {
        match dim {
            None => Ok(self.shape(py)?.into_any()),
            Some(d) => Ok(self
                .t
                .dim(d)
                .map_err(crate::errors::tensor_error)?
                .into_pyobject(py)?
                .into_any()),
        }
    }

    fn is_contiguous(&self) -> bool {
        self.t.is_contiguous()
    }

    fn __len__(&self) -> PyResult<usize> {
        self.t
            .shape()
            .first()
            .copied()
            .ok_or_else(|| PyTypeError::new_err("len() of a 0-d tensor"))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let head = format!(
            "dtype={}, device='{}'",
            self.t.dtype(),
            PyDevice::of(self.t.device()).selector()
        );
        if self.t.numel() <= 1000 {
            let text = to_numpy(py, &self.t).and_then(|arr| {
                let kw = pyo3::types::PyDict::new(py);
                kw.set_item("separator", ", ")?;
                py.import("numpy")?
                    .call_method("array2string", (arr,), Some(&kw))?
                    .extract::<String>()
            });
            if let Ok(text) = text {
                let text = text.replace('\n', "\n       ");
                return format!("tensor({text}, {head})");
            }
        }
        format!("tensor(shape={:?}, {head})", self.t.shape())
    }

    // ----- conversions --------------------------------------------------

    /// The elements as a NumPy array: on the CPU a read-only view that
    /// shares the tensor's memory (bf16 excepted), from a GPU one copy.
    /// bf16 comes back as float32, exactly.
    fn numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        match numpy_view(slf)? {
            Some(arr) => Ok(arr),
            None => to_numpy(slf.py(), &slf.get().t),
        }
    }

    /// NumPy's array protocol: `numpy.asarray(t)` (a view on the CPU, as
    /// `.numpy()`), `numpy.array(t)` (a writable copy).
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let dtype = dtype.filter(|d| !d.is_none());
        let arr = match copy {
            Some(true) => to_numpy(py, &slf.get().t)?,
            _ => match numpy_view(slf)? {
                Some(v) => v,
                None if copy == Some(false) => {
                    return Err(PyValueError::new_err(
                        "only a CPU tensor of f32, f16, u32 or i64 can be viewed by NumPy without a copy",
                    ));
                }
                None => to_numpy(py, &slf.get().t)?,
            },
        };
        match dtype {
            Some(d) if copy == Some(false) => {
                if !arr.getattr("dtype")?.eq(d)? {
                    return Err(PyValueError::new_err(format!(
                        "viewing as {d} without a copy is not possible"
                    )));
                }
                Ok(arr)
            }
            Some(d) => arr.call_method1("astype", (d,)),
            None => Ok(arr),
        }
    }

    /// NumPy leaves `ndarray <op> Tensor` to the tensor (which then
    /// computes on its device) instead of converting it.
    #[classattr]
    fn __array_ufunc__(py: Python<'_>) -> Py<PyAny> {
        py.None()
    }

    /// The elements as nested Python lists.
    fn tolist<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_numpy(py, &self.t)?.call_method0("tolist")
    }

    /// The one element of a tensor with one element, as a Python number.
    fn item<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if self.t.numel() != 1 {
            return Err(value_error(format!(
                "item() needs a tensor of one element, not of shape {:?}",
                self.t.shape()
            )));
        }
        to_numpy(py, &self.t)?.call_method0("item")
    }

    fn __float__(&self, py: Python<'_>) -> PyResult<f64> {
        self.item(py)?.extract()
    }

    fn __int__(&self, py: Python<'_>) -> PyResult<i64> {
        let v: f64 = self.item(py)?.extract()?;
        Ok(v as i64)
    }

    fn __bool__(&self, py: Python<'_>) -> PyResult<bool> {
        if self.t.numel() != 1 {
            return Err(value_error(format!(
                "the truth value of a tensor of shape {:?} is ambiguous",
                self.t.shape()
            )));
        }
        Ok(self.item(py)?.extract::<f64>()? != 0.0)
    }

    /// `to(device)`, `to(dtype)`, `to(device, dtype)` or with keywords: a
    /// copy on that device and/or of that dtype (the tensor itself when
    /// nothing changes).
    #[pyo3(signature = (*args, device=None, dtype=None))]
    fn to(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        device: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyTensor> {
        let mut dev = device
            .filter(|d| !d.is_none())
            .map(crate::device::device_arg)
            .transpose()?;
        let mut dt = dtype::parse_opt(dtype)?;
        for a in args.iter() {
            let as_dtype = match a.cast::<pyo3::types::PyString>() {
                Ok(s) => dtype::from_name(&s.to_cow()?),
                Err(_) if a.cast::<PyDevice>().is_ok() => None,
                Err(_) => Some(dtype::parse(&a)?),
            };
            match as_dtype {
                Some(d) => dt = Some(d),
                None => dev = Some(crate::device::device_arg(&a)?),
            }
        }
        detach(py, || {
            let mut t = self.t.clone();
            if let Some(d) = &dev {
                t = t.to_device(&d.open()?)?;
            }
            if let Some(d) = dt {
                t = t.to_dtype(d)?;
            }
            Ok(t.into())
        })
    }

    /// A copy converted to `dtype`.
    fn astype(&self, py: Python<'_>, dtype: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        let d = dtype::parse(dtype)?;
        self.map(py, |t| Ok(t.to_dtype(d)?))
    }

    /// A copy on the CPU.
    fn cpu(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.map(py, |t| Ok(t.to_device(&silica::Device::Cpu)?))
    }

    /// The same elements in a contiguous layout.
    fn contiguous(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.map(py, |t| Ok(t.contiguous()?))
    }

    /// A contiguous copy.
    fn clone(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.map(py, |t| Ok(t.copy()?))
    }

    // ----- views ----------------------------------------------------------

    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        let _ = py;
        Ok(index::getitem(&self.t, key)?.into())
    }

    /// The same elements with another shape (`reshape(2, -1)` or
    /// `reshape((2, -1))`): a view where the layout allows, else a copy.
    #[pyo3(signature = (*shape))]
    fn reshape(&self, py: Python<'_>, shape: &Bound<'_, PyTuple>) -> PyResult<PyTensor> {
        let s = index::shape_arg(shape, self.t.numel())?;
        self.map(py, |t| Ok(t.reshape(&s)?))
    }

    /// Same as `reshape`.
    #[pyo3(signature = (*shape))]
    fn view(&self, py: Python<'_>, shape: &Bound<'_, PyTuple>) -> PyResult<PyTensor> {
        self.reshape(py, shape)
    }

    /// Dimensions `start_dim..=end_dim` merged into one.
    #[pyo3(signature = (start_dim=0, end_dim=-1))]
    fn flatten(&self, py: Python<'_>, start_dim: isize, end_dim: isize) -> PyResult<PyTensor> {
        let shape = self.t.shape();
        let rank = shape.len().max(1) as isize;
        let norm = |d: isize| if d < 0 { d + rank } else { d };
        let (s, e) = (norm(start_dim), norm(end_dim));
        if s < 0 || e >= rank || s > e {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "flatten({start_dim}, {end_dim}) does not fit shape {shape:?}"
            )));
        }
        if shape.is_empty() {
            return self.map(py, |t| Ok(t.reshape(&[1])?));
        }
        let (s, e) = (s as usize, e as usize);
        let mut new: Vec<usize> = shape[..s].to_vec();
        new.push(shape[s..=e].iter().product());
        new.extend_from_slice(&shape[e + 1..]);
        self.map(py, |t| Ok(t.reshape(&new)?))
    }

    /// Swaps two dimensions (a view).
    fn transpose(&self, py: Python<'_>, dim0: isize, dim1: isize) -> PyResult<PyTensor> {
        self.map(py, |t| Ok(t.transpose(dim0, dim1)?))
    }

    /// Swaps the last two dimensions (a view).
    fn t(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.map(py, |t| Ok(t.t()?))
    }

    /// The dimensions in reverse order (a view; a matrix's transpose), as
    /// NumPy's `.T`.
    #[getter(T)]
    fn reversed(&self, py: Python<'_>) -> PyResult<PyTensor> {
        let perm: Vec<usize> = (0..self.t.rank()).rev().collect();
        self.map(py, |t| Ok(t.permute(&perm)?))
    }

    /// The last two dimensions swapped (a view).
    #[getter(mT)]
    fn m_t(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.t(py)
    }

    /// Reorders the dimensions (a view): `permute(2, 0, 1)`.
    #[pyo3(signature = (*dims))]
    fn permute(&self, py: Python<'_>, dims: &Bound<'_, PyTuple>) -> PyResult<PyTensor> {
        let raw: Vec<isize> = if dims.len() == 1 && !dims.get_item(0)?.is_instance_of::<PyInt>() {
            dims.get_item(0)?.extract()?
        } else {
            dims.extract()?
        };
        let rank = self.t.rank() as isize;
        let perm: Vec<usize> = raw
            .iter()
            .map(|&d| (if d < 0 { d + rank } else { d }).max(0) as usize)
            .collect();
        self.map(py, |t| Ok(t.permute(&perm)?))
    }

    /// Entries `start..start + length` of dimension `dim` (a view).
    fn narrow(
        &self,
        py: Python<'_>,
        dim: isize,
        start: usize,
        length: usize,
    ) -> PyResult<PyTensor> {
        self.map(py, |t| Ok(t.narrow(dim, start, length)?))
    }

    /// Removes dimension `dim` (size 1), or every size-1 dimension.
    #[pyo3(signature = (dim=None))]
    fn squeeze(&self, py: Python<'_>, dim: Option<isize>) -> PyResult<PyTensor> {
        self.map(py, |t| {
            Ok(match dim {
                Some(d) => t.squeeze(d)?,
                None => {
                    let shape: Vec<usize> = t.shape().iter().copied().filter(|&s| s != 1).collect();
                    t.reshape(&shape)?
                }
            })
        })
    }

    /// Inserts a size-1 dimension at `dim`.
    fn unsqueeze(&self, py: Python<'_>, dim: isize) -> PyResult<PyTensor> {
        self.map(py, |t| Ok(t.unsqueeze(dim)?))
    }

    /// NumPy-style broadcast to `shape` (a view).
    #[pyo3(signature = (*shape))]
    fn broadcast_to(&self, py: Python<'_>, shape: &Bound<'_, PyTuple>) -> PyResult<PyTensor> {
        let s = index::shape_arg(shape, self.t.numel())?;
        self.map(py, |t| Ok(t.broadcast_to(&s)?))
    }

    /// Same as `broadcast_to`.
    #[pyo3(signature = (*shape))]
    fn expand(&self, py: Python<'_>, shape: &Bound<'_, PyTuple>) -> PyResult<PyTensor> {
        self.broadcast_to(py, shape)
    }

    /// Entries of dimension `dim` picked by a 1-D index tensor or list.
    fn index_select(
        &self,
        py: Python<'_>,
        dim: isize,
        index: &Bound<'_, PyAny>,
    ) -> PyResult<PyTensor> {
        let idx = match index.cast::<PyTensor>() {
            Ok(t) => t.get().t.clone(),
            Err(_) => to_tensor(index, self.t.device(), Some(DType::I64))?,
        };
        self.map(py, |t| Ok(t.index_select(dim, &idx)?))
    }

    // ----- operators ------------------------------------------------------

    fn __add__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        binary(py, &self.t, o, BinaryOp::Add, false)
    }
    fn __radd__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        binary(py, &self.t, o, BinaryOp::Add, true)
    }
    fn __sub__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        binary(py, &self.t, o, BinaryOp::Sub, false)
    }
    fn __rsub__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        binary(py, &self.t, o, BinaryOp::Sub, true)
    }
    fn __mul__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        binary(py, &self.t, o, BinaryOp::Mul, false)
    }
    fn __rmul__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        binary(py, &self.t, o, BinaryOp::Mul, true)
    }
    fn __truediv__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        binary(py, &self.t, o, BinaryOp::Div, false)
    }
    fn __rtruediv__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        binary(py, &self.t, o, BinaryOp::Div, true)
    }
    fn __pow__(
        &self,
        py: Python<'_>,
        o: &Bound<'_, PyAny>,
        _modulo: &Bound<'_, PyAny>,
    ) -> PyResult<PyTensor> {
        binary(py, &self.t, o, BinaryOp::Pow, false)
    }
    fn __rpow__(
        &self,
        py: Python<'_>,
        o: &Bound<'_, PyAny>,
        _modulo: &Bound<'_, PyAny>,
    ) -> PyResult<PyTensor> {
        binary(py, &self.t, o, BinaryOp::Pow, true)
    }
    fn __matmul__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        self.matmul(py, o)
    }
    fn __rmatmul__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        let a = to_tensor(o, self.t.device(), Some(self.t.dtype()))?;
        detach(py, || Ok(a.matmul(&self.t)?.into()))
    }
    fn __neg__(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.unary(py, UnaryOp::Neg)
    }
    fn __pos__(&self) -> PyTensor {
        self.t.clone().into()
    }
    fn __abs__(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.unary(py, UnaryOp::Abs)
    }

    /// `==`, `!=`, `<`, `<=`, `>`, `>=` elementwise with broadcasting: a
    /// u32 mask of 0s and 1s.
    fn __richcmp__(
        &self,
        py: Python<'_>,
        o: &Bound<'_, PyAny>,
        op: CompareOp,
    ) -> PyResult<PyTensor> {
        let cmp = match op {
            CompareOp::Eq => CmpOp::Eq,
            CompareOp::Ne => CmpOp::Ne,
            CompareOp::Lt => CmpOp::Lt,
            CompareOp::Le => CmpOp::Le,
            CompareOp::Gt => CmpOp::Gt,
            CompareOp::Ge => CmpOp::Ge,
        };
        let b = operand(&self.t, o)?;
        detach(py, || {
            let b = match b {
                Operand::Tensor(b) => b,
                Operand::Scalar(s) => scalar_like(&self.t, s)?,
            };
            Ok(self.t.compare(&b, cmp)?.into())
        })
    }

    // ----- elementwise ------------------------------------------------------

    fn exp(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.unary(py, UnaryOp::Exp)
    }
    fn log(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.unary(py, UnaryOp::Log)
    }
    fn sqrt(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.unary(py, UnaryOp::Sqrt)
    }
    fn rsqrt(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.unary(py, UnaryOp::Rsqrt)
    }
    fn abs(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.unary(py, UnaryOp::Abs)
    }
    fn neg(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.unary(py, UnaryOp::Neg)
    }
    fn reciprocal(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.unary(py, UnaryOp::Recip)
    }
    fn square(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.unary(py, UnaryOp::Sqr)
    }
    fn sin(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.unary(py, UnaryOp::Sin)
    }
    fn cos(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.unary(py, UnaryOp::Cos)
    }
    fn tanh(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.unary(py, UnaryOp::Tanh)
    }
    fn relu(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.unary(py, UnaryOp::Relu)
    }
    fn sigmoid(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.unary(py, UnaryOp::Sigmoid)
    }
    fn silu(&self, py: Python<'_>) -> PyResult<PyTensor> {
        self.unary(py, UnaryOp::Silu)
    }
    /// GELU: `approximate="none"` (erf, the default) or `"tanh"`.
    #[pyo3(signature = (approximate="none"))]
    fn gelu(&self, py: Python<'_>, approximate: &str) -> PyResult<PyTensor> {
        match approximate {
            "none" => self.unary(py, UnaryOp::GeluErf),
            "tanh" => self.unary(py, UnaryOp::GeluTanh),
            other => Err(value_error(format!(
                "approximate must be \"none\" or \"tanh\", not {other:?}"
            ))),
        }
    }
    fn pow(&self, py: Python<'_>, exponent: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        binary(py, &self.t, exponent, BinaryOp::Pow, false)
    }
    fn maximum(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        binary(py, &self.t, other, BinaryOp::Maximum, false)
    }
    fn minimum(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        binary(py, &self.t, other, BinaryOp::Minimum, false)
    }

    // ----- reductions -------------------------------------------------------

    /// Sum over `dim` (an int, a sequence of ints, or `None`: everything).
    #[pyo3(signature = (dim=None, keepdim=false))]
    fn sum(
        &self,
        py: Python<'_>,
        dim: Option<&Bound<'_, PyAny>>,
        keepdim: bool,
    ) -> PyResult<PyTensor> {
        self.reduce(py, ReduceOp::Sum, dim, keepdim)
    }
    #[pyo3(signature = (dim=None, keepdim=false))]
    fn mean(
        &self,
        py: Python<'_>,
        dim: Option<&Bound<'_, PyAny>>,
        keepdim: bool,
    ) -> PyResult<PyTensor> {
        self.reduce(py, ReduceOp::Mean, dim, keepdim)
    }
    /// The largest value over `dim` (values only; `argmax` gives indices).
    #[pyo3(signature = (dim=None, keepdim=false))]
    fn max(
        &self,
        py: Python<'_>,
        dim: Option<&Bound<'_, PyAny>>,
        keepdim: bool,
    ) -> PyResult<PyTensor> {
        self.reduce(py, ReduceOp::Max, dim, keepdim)
    }
    #[pyo3(signature = (dim=None, keepdim=false))]
    fn min(
        &self,
        py: Python<'_>,
        dim: Option<&Bound<'_, PyAny>>,
        keepdim: bool,
    ) -> PyResult<PyTensor> {
        self.reduce(py, ReduceOp::Min, dim, keepdim)
    }
    /// Index of the largest value along `dim` (of the flattened tensor when
    /// `None`), as u32.
    #[pyo3(signature = (dim=None, keepdim=false))]
    fn argmax(
        &self,
        py: Python<'_>,
        dim: Option<&Bound<'_, PyAny>>,
        keepdim: bool,
    ) -> PyResult<PyTensor> {
        self.reduce(py, ReduceOp::Argmax, dim, keepdim)
    }
    #[pyo3(signature = (dim=None, keepdim=false))]
    fn argmin(
        &self,
        py: Python<'_>,
        dim: Option<&Bound<'_, PyAny>>,
        keepdim: bool,
    ) -> PyResult<PyTensor> {
        self.reduce(py, ReduceOp::Argmin, dim, keepdim)
    }
    #[pyo3(signature = (dim=-1))]
    fn softmax(&self, py: Python<'_>, dim: isize) -> PyResult<PyTensor> {
        self.map(py, |t| Ok(t.softmax(dim)?))
    }
    #[pyo3(signature = (dim=-1))]
    fn log_softmax(&self, py: Python<'_>, dim: isize) -> PyResult<PyTensor> {
        self.map(py, |t| Ok(t.log_softmax(dim)?))
    }

    // ----- products and transformer ops -------------------------------------

    /// Matrix product as `torch.matmul` defines it (batch dimensions broadcast).
    fn matmul(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        let b = match operand(&self.t, other)? {
            Operand::Tensor(b) => b,
            Operand::Scalar(_) => return Err(value_error("matmul needs a tensor, not a scalar")),
        };
        self.map(py, |t| Ok(t.matmul(&b)?))
    }

    /// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) * weight`
    /// (weight: ones when `None`).
    #[pyo3(signature = (weight=None, eps=1e-6))]
    fn rms_norm(
        &self,
        py: Python<'_>,
        weight: Option<&Bound<'_, PyAny>>,
        eps: f32,
    ) -> PyResult<PyTensor> {
        let w = param_or(py, weight, &self.t, 1.0)?;
        self.map(py, |t| Ok(t.rms_norm(&w, eps)?))
    }

    /// LayerNorm over the last dimension (weight: ones, bias: zeros when `None`).
    #[pyo3(signature = (weight=None, bias=None, eps=1e-5))]
    fn layer_norm(
        &self,
        py: Python<'_>,
        weight: Option<&Bound<'_, PyAny>>,
        bias: Option<&Bound<'_, PyAny>>,
        eps: f32,
    ) -> PyResult<PyTensor> {
        let w = param_or(py, weight, &self.t, 1.0)?;
        let b = param_or(py, bias, &self.t, 0.0)?;
        self.map(py, |t| Ok(t.layer_norm(&w, &b, eps)?))
    }

    /// Rotary embeddings of `[.., T, heads, D]` with f32 angle tables `cos`,
    /// `sin` of shape `[T, D/2]` (see `silica.rope_tables`); `style="half"`
    /// pairs `i` with `i + D/2` (Hugging Face), `"adjacent"` pairs `2i` with
    /// `2i+1` (GGUF).
    #[pyo3(signature = (cos, sin, style="half"))]
    fn rope(
        &self,
        py: Python<'_>,
        cos: &Bound<'_, PyAny>,
        sin: &Bound<'_, PyAny>,
        style: &str,
    ) -> PyResult<PyTensor> {
        let style = rope_style(style)?;
        let c = to_tensor(cos, self.t.device(), Some(DType::F32))?;
        let s = to_tensor(sin, self.t.device(), Some(DType::F32))?;
        self.map(py, |t| Ok(t.rope(&c, &s, style)?))
    }

    /// Scaled dot-product attention with these queries: `q`, `k`, `v` are
    /// `[B, T, heads, D]` or `[T, heads, D]` (silica's layout: heads after
    /// positions); KV heads may divide the query heads (grouped-query).
    /// `mask` is added to the scores (broadcast to `[B, heads, Tq, Tk]`);
    /// `scale` defaults to `1/sqrt(D)`.
    #[pyo3(signature = (k, v, mask=None, scale=None, causal=false))]
    fn attention(
        &self,
        py: Python<'_>,
        k: &Bound<'_, PyAny>,
        v: &Bound<'_, PyAny>,
        mask: Option<&Bound<'_, PyAny>>,
        scale: Option<f32>,
        causal: bool,
    ) -> PyResult<PyTensor> {
        let k = tensor_arg(k, "k")?.clone();
        let v = tensor_arg(v, "v")?.clone();
        let mask = match mask.filter(|m| !m.is_none()) {
            Some(m) => Some(to_tensor(m, self.t.device(), Some(self.t.dtype()))?),
            None => None,
        };
        let d = *self.t.shape().last().unwrap_or(&1);
        let opts = AttentionOpts {
            scale: scale.unwrap_or(1.0 / (d.max(1) as f32).sqrt()),
            causal,
        };
        self.map(py, |q| Ok(q.attention(&k, &v, mask.as_ref(), opts)?))
    }

    /// `silu(self) * up`: the gated unit of Llama's feed-forward block.
    fn swiglu(&self, py: Python<'_>, up: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        let up = match operand(&self.t, up)? {
            Operand::Tensor(u) => u,
            Operand::Scalar(_) => return Err(value_error("swiglu needs a tensor")),
        };
        self.map(py, |t| Ok(t.swiglu(&up)?))
    }
}
