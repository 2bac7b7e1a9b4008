//! The CPU backend: every op, multi-threaded with rayon. It is also the
//! reference the GPU kernels are tested against, so elementwise functions
//! and accumulations are evaluated in f64 and rounded once.

mod elementwise;
mod index;
mod matmul;
mod nn;
mod qdot;
mod qmatmul;
mod reduce;

use super::Backend;
use crate::storage::{CpuStorage, Storage};
use crate::{DType, Op, Result, Tensor};

pub(crate) struct CpuBackend;

/// Below this many elements, splitting work across threads costs more than it saves.
const PAR_MIN: usize = 1 << 14;

/// The host storage of a tensor the dispatcher placed on the CPU.
fn host(t: &Tensor) -> &CpuStorage {
    match t.storage() {
        Storage::Cpu(c, _) => c,
        // invariant: the dispatcher moves every input to the host before calling the CPU backend
        Storage::Gpu(_) => unreachable!("CPU kernel given a GPU tensor"),
    }
}

impl Backend for CpuBackend {
    fn execute(
        &self,
        op: &Op,
        inputs: &[&Tensor],
        out_shape: &[usize],
        out_dtype: DType,
    ) -> Result<Storage> {
        // refuse a result over the CPU's memory limit before computing it
        let numel = out_shape.iter().product::<usize>() as u64;
        crate::memory::host_check(numel.saturating_mul(out_dtype.size_in_bytes() as u64))?;
        let out = match *op {
            Op::Unary(u) => elementwise::unary(u, inputs[0], out_dtype),
            Op::Binary(b) => elementwise::binary(b, inputs[0], inputs[1], out_dtype),
            Op::BinaryScalar(b, s) => elementwise::binary_scalar(b, inputs[0], s, out_dtype),
            Op::Compare(c) => elementwise::compare(c, inputs[0], inputs[1]),
            Op::Where => index::where_cond(inputs[0], inputs[1], inputs[2]),
            Op::Reduce(r) => reduce::reduce(r, inputs[0], out_dtype),
            Op::Softmax { log } => reduce::softmax(inputs[0], log, out_dtype),
            Op::Matmul => matmul::matmul(inputs[0], inputs[1], out_shape, out_dtype),
            Op::QRows { format, k } => qmatmul::qrows(format, inputs[0], inputs[1], k, out_dtype)?,
            Op::QMatmul { format, fusion } if fusion.is_none() => {
                qmatmul::qmatmul(format, inputs[0], inputs[1], out_shape, out_dtype)
            }
            // the CPU has no fused kernel: the parts one after the other
            Op::QMatmul { format, fusion } => {
                host(&crate::qtensor::qmatmul_composed(format, fusion, inputs)?).clone()
            }
            Op::Cast => elementwise::cast(inputs[0], out_dtype),
            Op::Copy => host(inputs[0]).gather(inputs[0].layout()),
            Op::Cat { axis } => index::cat(inputs, axis, out_shape),
            Op::IndexSelect { axis } => index::index_select(inputs[0], inputs[1], axis)?,
            Op::RmsNorm { eps } => nn::rms_norm(inputs[0], inputs[1], eps, out_dtype),
            Op::LayerNorm { eps } => {
                nn::layer_norm(inputs[0], inputs[1], inputs[2], eps, out_dtype)
            }
            Op::Rope { style, rotated } => {
                nn::rope(inputs[0], inputs[1], inputs[2], style, rotated, out_dtype)
            }
            Op::Attention { scale, causal } => nn::attention(inputs, scale, causal, out_dtype),
        };
        debug_assert_eq!(out.len(), out_shape.iter().product::<usize>());
        Storage::host(out)
    }
}
