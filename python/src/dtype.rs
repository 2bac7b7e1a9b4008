//! Dtypes as Python sees them: the short strings silica prints (`"f32"`,
//! `"f16"`, `"bf16"`, `"u32"`, `"i64"`), and NumPy's names and dtype
//! objects for the same types.

use pyo3::prelude::*;
use pyo3::types::PyString;
use silica::DType;

use crate::errors::value_error;

/// The dtype a name stands for: silica's (`f32`), NumPy's (`float32`),
/// PyTorch's (`float`, `half`, `bfloat16`, `long`).
pub fn from_name(name: &str) -> Option<DType> {
    let n = name.trim().to_ascii_lowercase();
    let n = n.strip_prefix("torch.").unwrap_or(&n);
    Some(match n {
        "f32" | "float32" | "float" => DType::F32,
        "f16" | "float16" | "half" => DType::F16,
        "bf16" | "bfloat16" => DType::BF16,
        "u32" | "uint32" => DType::U32,
        "i64" | "int64" | "long" => DType::I64,
        _ => return None,
    })
}

/// A dtype argument: a name, or anything `numpy.dtype()` accepts
/// (`numpy.float16`, `numpy.dtype("float32")`, `ml_dtypes.bfloat16`).
pub fn parse(obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    if let Ok(s) = obj.cast::<PyString>() {
        let s = s.to_cow()?;
        return from_name(&s).ok_or_else(|| {
            value_error(format!(
                "unknown dtype {s:?}: expected f32, f16, bf16, u32 or i64 (or NumPy's names)"
            ))
        });
    }
    let np = obj.py().import("numpy")?;
    let name: String = np
        .call_method1("dtype", (obj,))
        .and_then(|d| d.getattr("name"))
        .and_then(|n| n.extract())
        .map_err(|_| value_error(format!("{obj} is not a dtype")))?;
    from_name(&name).ok_or_else(|| {
        value_error(format!(
            "silica has no dtype for NumPy's {name}: it holds f32, f16, bf16, u32 and i64"
        ))
    })
}

/// An optional dtype argument.
pub fn parse_opt(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<DType>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => parse(o).map(Some),
    }
}

/// A model's compute dtype (f32 when `None`).
pub fn compute(d: Option<&Bound<'_, PyAny>>) -> PyResult<DType> {
    let dt = parse_opt(d)?.unwrap_or(DType::F32);
    if !dt.is_float() {
        return Err(value_error(format!(
            "a model computes in f32, f16 or bf16, not {dt}"
        )));
    }
    Ok(dt)
}
