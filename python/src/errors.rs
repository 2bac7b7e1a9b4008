//! Rust errors as Python exceptions, and the one way the bindings run
//! library code: with the interpreter released and panics caught.
//!
//! | Rust error | Python exception |
//! |---|---|
//! | shapes, dimensions, arguments, element counts, devices that differ, bad files, bad model input | `ValueError` |
//! | dtypes that differ or an op undefined for a dtype | `TypeError` |
//! | an index past the end of a dimension | `IndexError` |
//! | out of memory, a buffer larger than the adapter binds | `MemoryError` |
//! | a lost device | `silica.DeviceLostError` (a `RuntimeError`) |
//! | no such device, strict-mode fallbacks, check-mode differences, other GPU errors, a model that cannot be found or fetched | `RuntimeError` |
//! | a file that cannot be read | `FileNotFoundError` / `OSError` |
//!
//! Every message is the Rust error's own.

use std::panic::{AssertUnwindSafe, catch_unwind};

use pyo3::exceptions::{
    PyFileNotFoundError, PyIndexError, PyMemoryError, PyOSError, PyRuntimeError, PyTypeError,
    PyValueError,
};
use pyo3::prelude::*;

pyo3::create_exception!(
    silica,
    DeviceLostError,
    PyRuntimeError,
    "The GPU device was lost (driver reset, device removed or destroyed); tensors on it are gone, and `silica.Device(...)` opens it anew."
);

/// What went wrong in library code, turned into a Python exception once the
/// interpreter is held again.
#[derive(Debug)]
pub enum Failure {
    Tensor(silica::Error),
    Model(silica_models::Error),
    /// Bad input found by the bindings themselves.
    Value(String),
    /// A Rust panic: a bug, reported instead of taking the interpreter down.
    Panic(String),
}

pub type Res<T> = Result<T, Failure>;

impl From<silica::Error> for Failure {
    fn from(e: silica::Error) -> Self {
        Failure::Tensor(e)
    }
}

impl From<silica_models::Error> for Failure {
    fn from(e: silica_models::Error) -> Self {
        match e {
            silica_models::Error::Tensor(t) => Failure::Tensor(t),
            other => Failure::Model(other),
        }
    }
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> PyErr {
        match f {
            Failure::Tensor(e) => tensor_error(e),
            Failure::Model(e) => model_error(e),
            Failure::Value(msg) => PyValueError::new_err(msg),
            Failure::Panic(msg) => PyRuntimeError::new_err(format!(
                "internal error in silica (a Rust panic, please report it): {msg}"
            )),
        }
    }
}

/// The exception for an error of the `silica` crate.
pub fn tensor_error(e: silica::Error) -> PyErr {
    use silica::Error as E;
    let msg = e.to_string();
    match e {
        E::ShapeMismatch { .. }
        | E::InvalidArgument { .. }
        | E::ElementCount { .. }
        | E::DeviceMismatch { .. } => PyValueError::new_err(msg),
        E::DimOutOfRange { .. } | E::IndexOutOfRange { .. } => PyIndexError::new_err(msg),
        E::DTypeMismatch { .. } | E::UnsupportedDType { .. } => PyTypeError::new_err(msg),
        E::OutOfMemory { .. } | E::TooLarge { .. } => PyMemoryError::new_err(msg),
        E::DeviceLost { .. } => DeviceLostError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

/// The exception for an error of the `silica-models` crate.
pub fn model_error(e: silica_models::Error) -> PyErr {
    use silica_models::Error as E;
    let msg = e.to_string();
    match e {
        E::Tensor(t) => tensor_error(t),
        E::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(msg)
        }
        E::Io { .. } => PyOSError::new_err(msg),
        E::Resolve { .. } => PyRuntimeError::new_err(msg),
        _ => PyValueError::new_err(msg),
    }
}

/// Runs `f` with the interpreter released (other Python threads run while
/// the device works), catching a panic so that it surfaces as a
/// `RuntimeError` instead of aborting the interpreter.
pub fn detach<T: Send>(py: Python<'_>, f: impl FnOnce() -> Res<T> + Send) -> PyResult<T> {
    py.detach(|| catch(f)).map_err(PyErr::from)
}

/// `f`'s result, a panic turned into [`Failure::Panic`].
pub fn catch<T>(f: impl FnOnce() -> Res<T>) -> Res<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| Err(panic_failure(payload)))
}

/// The message a panic carried.
pub fn panic_failure(payload: Box<dyn std::any::Any + Send>) -> Failure {
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string());
    Failure::Panic(msg)
}

/// A `ValueError` built by the bindings.
pub fn value_error(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}
