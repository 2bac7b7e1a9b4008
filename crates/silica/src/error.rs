//! The one error type of the `silica` crate.

use crate::DType;

/// Everything that can go wrong in silica. Messages name the shapes, dtypes
/// and devices involved so that a failure can be traced without a debugger.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Two shapes that had to agree (or broadcast) do not.
    #[error("{op}: shapes {lhs:?} and {rhs:?} are incompatible{}", hint_suffix(.hint))]
    ShapeMismatch {
        op: &'static str,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
        hint: String,
    },
    /// A dimension index outside `-rank..rank`.
    #[error("{op}: dimension {dim} is out of range for a tensor of shape {shape:?}")]
    DimOutOfRange {
        op: &'static str,
        dim: isize,
        shape: Vec<usize>,
    },
    /// An argument that is wrong for reasons other than shape agreement.
    #[error("{op}: {msg}")]
    InvalidArgument { op: &'static str, msg: String },
    /// Operands of different dtypes.
    #[error("{op}: dtypes {lhs} and {rhs} differ (convert one with to_dtype)")]
    DTypeMismatch {
        op: &'static str,
        lhs: DType,
        rhs: DType,
    },
    /// The op is not defined for this dtype on any device.
    #[error("{op} is not defined for dtype {dtype}")]
    UnsupportedDType { op: &'static str, dtype: DType },
    /// Operands live on different devices.
    #[error("{op}: operands are on different devices ({lhs} and {rhs}); move one with to_device")]
    DeviceMismatch {
        op: &'static str,
        lhs: String,
        rhs: String,
    },
    /// The number of elements given does not fill the shape.
    #[error("{op}: shape {shape:?} holds {expected} elements but {got} were given")]
    ElementCount {
        op: &'static str,
        shape: Vec<usize>,
        expected: usize,
        got: usize,
    },
    /// An index (for example in `index_select`) past the end of a dimension.
    #[error("{op}: index {index} is out of range for a dimension of size {size}")]
    IndexOutOfRange {
        op: &'static str,
        index: i64,
        size: usize,
    },
    /// A device allocation would exceed the memory limit or the device's memory.
    #[error(
        "out of memory on {device}: requested {requested} bytes with {allocated} bytes allocated{}",
        limit_suffix(*.limit)
    )]
    OutOfMemory {
        device: String,
        requested: u64,
        allocated: u64,
        limit: Option<u64>,
    },
    /// One buffer larger than the adapter can bind to a kernel.
    #[error(
        "{device}: a buffer of {bytes} bytes exceeds the adapter's largest binding of {max} bytes"
    )]
    TooLarge {
        device: String,
        bytes: u64,
        max: u64,
    },
    /// The GPU device was lost (driver reset, device removed, or destroyed).
    #[error("device {device} was lost: {reason}")]
    DeviceLost { device: String, reason: String },
    /// No device matches a selection (`SILICA_DEVICE` or an API call).
    #[error("no device matches {selector:?}: {reason}")]
    NoDevice { selector: String, reason: String },
    /// A GPU kernel is missing and strict mode forbids the CPU fallback.
    #[error(
        "{op} ({dtype}) has no kernel on {device} and strict mode (SILICA_STRICT=1) forbids the CPU fallback"
    )]
    FallbackForbidden {
        op: &'static str,
        dtype: DType,
        device: String,
    },
    /// `SILICA_CHECK=1` found a GPU result that differs from the CPU.
    #[error(
        "SILICA_CHECK: {op} on {device} differs from the CPU: inputs {shapes:?} ({dtype}), max abs error {max_abs_err:e} at element {index} (tolerance {tolerance:e})"
    )]
    CheckFailed {
        op: &'static str,
        device: String,
        dtype: DType,
        shapes: Vec<Vec<usize>>,
        max_abs_err: f64,
        index: usize,
        tolerance: f64,
    },
    /// The backend has no kernel for this case; the dispatcher falls back to the CPU.
    #[error("{op}: no kernel on this backend ({reason})")]
    NotSupported { op: &'static str, reason: String },
    /// Any other error reported by wgpu.
    #[error("GPU error on {device}: {msg}")]
    Gpu { device: String, msg: String },
}

fn hint_suffix(hint: &str) -> String {
    if hint.is_empty() {
        String::new()
    } else {
        format!(" ({hint})")
    }
}

fn limit_suffix(limit: Option<u64>) -> String {
    match limit {
        Some(l) => format!(" and a limit of {l} bytes"),
        None => " (the device has no more memory)".to_string(),
    }
}

/// `Result` with silica's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
