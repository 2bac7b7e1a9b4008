//! The arguments of tensor ops as Python passes them: the other operand of
//! an operator (a tensor, a number, an array), tensor arguments, and
//! optional norm parameters.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt};
use silica::{BinaryOp, RopeStyle, Tensor};

use crate::convert::to_tensor;
use crate::errors::{Res, detach, value_error};
use crate::tensor::PyTensor;

/// The other operand of a binary op.
pub enum Operand {
    Tensor(Tensor),
    Scalar(f64),
}

/// `obj` as an operand next to `me`: a tensor as it is, a Python or NumPy
/// number as a scalar, anything else (lists, arrays) as a tensor on `me`'s
/// device with `me`'s dtype.
pub fn operand(me: &Tensor, obj: &Bound<'_, PyAny>) -> PyResult<Operand> {
    if let Ok(t) = obj.cast::<PyTensor>() {
        return Ok(Operand::Tensor(t.get().t.clone()));
    }
    let py = obj.py();
    let is_number = obj.is_instance_of::<PyFloat>()
        || obj.is_instance_of::<PyInt>()
        || obj.is_instance_of::<PyBool>()
        || obj.is_instance(&py.import("numpy")?.getattr("generic")?)?;
    if is_number {
        return Ok(Operand::Scalar(obj.extract::<f64>()?));
    }
    Ok(Operand::Tensor(to_tensor(
        obj,
        me.device(),
        Some(me.dtype()),
    )?))
}

/// `value` as a 0-d tensor like `like` (dtype and device).
pub fn scalar_like(like: &Tensor, value: f64) -> Res<Tensor> {
    Ok(Tensor::full(value, &[], like.dtype(), like.device())?)
}

/// `a <op> b`, or `b <op> a` when `reflected` (`2 - t`).
pub fn binary(
    py: Python<'_>,
    a: &Tensor,
    b: &Bound<'_, PyAny>,
    op: BinaryOp,
    reflected: bool,
) -> PyResult<PyTensor> {
    let b = operand(a, b)?;
    detach(py, || {
        let out = match (b, reflected) {
            (Operand::Tensor(b), false) => a.binary(&b, op)?,
            (Operand::Tensor(b), true) => b.binary(a, op)?,
            // x ** 2 as a square: exact, and defined for negative x on every device
            (Operand::Scalar(s), false) if op == BinaryOp::Pow && s == 2.0 => a.sqr()?,
            (Operand::Scalar(s), false) => a.binary_scalar(s as f32, op)?,
            (Operand::Scalar(s), true) if matches!(op, BinaryOp::Add | BinaryOp::Mul) => {
                a.binary_scalar(s as f32, op)?
            }
            (Operand::Scalar(s), true) => scalar_like(a, s)?.binary(a, op)?,
        };
        Ok(out.into())
    })
}

/// A rope style by name.
pub fn rope_style(style: &str) -> PyResult<RopeStyle> {
    match style {
        "half" | "neox" | "rotate_half" => Ok(RopeStyle::Half),
        "adjacent" | "interleaved" | "gptj" => Ok(RopeStyle::Adjacent),
        other => Err(value_error(format!(
            "unknown rope style {other:?}: expected \"half\" (rotate-half, Hugging Face) or \"adjacent\" (pairs 2i, 2i+1)"
        ))),
    }
}

/// The tensor argument `obj` must be.
pub fn tensor_arg<'a>(obj: &'a Bound<'_, PyAny>, what: &str) -> PyResult<&'a Tensor> {
    obj.cast::<PyTensor>()
        .map(|t| &t.get().t)
        .map_err(|_| PyTypeError::new_err(format!("{what} must be a silica.Tensor")))
}

/// A norm parameter: the given tensor (or array), else a `[last dim]`
/// tensor of `default`.
pub fn param_or(
    py: Python<'_>,
    obj: Option<&Bound<'_, PyAny>>,
    like: &Tensor,
    default: f64,
) -> PyResult<Tensor> {
    match obj.filter(|o| !o.is_none()) {
        Some(o) => match o.cast::<PyTensor>() {
            Ok(t) => Ok(t.get().t.clone()),
            Err(_) => to_tensor(o, like.device(), Some(like.dtype())),
        },
        None => {
            let n = *like.shape().last().unwrap_or(&0);
            detach(py, || {
                Ok(Tensor::full(default, &[n], like.dtype(), like.device())?)
            })
        }
    }
}
