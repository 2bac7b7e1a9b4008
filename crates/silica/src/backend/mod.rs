//! The backend contract.
//!
//! A backend runs an [`Op`] on tensors that live on it and returns the
//! storage of a new contiguous output. The CPU backend implements every op;
//! the GPU backend may answer [`Error::NotSupported`](crate::Error) for an
//! op, dtype or layout it has no kernel for, and the dispatcher
//! (`crate::dispatch`) then runs the CPU kernel instead.

pub(crate) mod cpu;
pub mod gpu;

use crate::storage::Storage;
use crate::{DType, Op, Result, Tensor};

/// What every backend provides.
pub(crate) trait Backend {
    /// Runs `op` on `inputs` (checked and broadcast by the `Tensor` method),
    /// producing a contiguous output of `out_shape` and `out_dtype`.
    fn execute(
        &self,
        op: &Op,
        inputs: &[&Tensor],
        out_shape: &[usize],
        out_dtype: DType,
    ) -> Result<Storage>;
}
