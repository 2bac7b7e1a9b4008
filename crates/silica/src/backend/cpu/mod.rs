//! The CPU backend: every op, multi-threaded with rayon. It is also the
//! reference the GPU kernels are tested against, so elementwise functions
//! and accumulations are evaluated in f64 and rounded once.

mod attention;
mod elementwise;
mod index;
pub(crate) mod matmul;
mod nn;
pub(crate) mod packed;
mod qdot;
mod qgemm;
mod qmatmul;
mod reduce;
mod spin;

use std::cell::Cell;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

use super::Backend;
use crate::storage::{CpuStorage, Storage};
use crate::{DType, Op, Result, Tensor};

pub(crate) struct CpuBackend;

/// Below this many elements, splitting work across threads costs more than it saves.
const PAR_MIN: usize = 1 << 14;

/// The switch behind [`cpu_int8_activations`]: on unless `SILICA_CPU_INT8`
/// is `0`, `false` or `off` when it is first read.
static INT8_ACTIVATIONS: LazyLock<AtomicBool> =
    LazyLock::new(|| AtomicBool::new(crate::config::cpu_int8_from_env()));

thread_local! {
    /// Set while this thread computes a reference (`SILICA_CHECK`): the
    /// exact path whatever the switch says.
    static EXACT: Cell<bool> = const { Cell::new(false) };
}

/// Whether the CPU's Q4_0 / Q4_1 / Q8_0 products round the activations to
/// 8 bits per block of 32 and multiply with integer dot products (as
/// llama.cpp does), instead of the exact f32 path that every other format
/// takes.
///
/// On by default (faster decoding); the analogue of PyTorch's
/// `allow_tf32`: speed by default, exactness on request. Each output may
/// then differ from the exact product by up to `Σ |w| · amax(x) / 254`
/// over the blocks of 32 (`amax(x)` the largest |x| of the block). The
/// same switch runs attention, softmax and SwiGLU's activation in f32 (a
/// vectorized exponential, relative errors near 1e-6) instead of f64. Turn it
/// off with [`set_cpu_int8_activations`]`(false)` or by starting the
/// process with `SILICA_CPU_INT8=0` (read once, on first use), where the
/// CPU serves as a reference, as the parity tests do. `SILICA_CHECK`
/// compares GPU results with the exact path whatever this says.
pub fn cpu_int8_activations() -> bool {
    INT8_ACTIVATIONS.load(Ordering::Relaxed)
}

/// Turns the CPU's 8-bit activations on or off for the whole process (see
/// [`cpu_int8_activations`]); products already running are not affected.
/// As with [`set_cpu_isa`], matrices loaded in tiles for the integer
/// kernels are read back out of them by each exact product.
pub fn set_cpu_int8_activations(on: bool) {
    INT8_ACTIVATIONS.store(on, Ordering::Relaxed);
}

/// Runs `f` with this thread's CPU products on the exact path (a reference
/// for `SILICA_CHECK`), whatever [`cpu_int8_activations`] says.
pub(crate) fn exact<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            EXACT.set(self.0);
        }
    }
    let _restore = Restore(EXACT.replace(true));
    f()
}

/// An instruction set the CPU's integer kernels can use (see [`cpu_isa`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CpuIsa {
    /// Plain Rust that the compiler vectorizes for the build's target: what
    /// every other architecture (Apple's CPUs among them) runs.
    Portable,
    /// AVX2 with FMA and F16C (`vpmaddubsw` integer dot products).
    Avx2,
    /// AVX-512 F/BW/VL with VNNI (`vpdpbusd`).
    Avx512,
}

impl CpuIsa {
    pub fn name(self) -> &'static str {
        match self {
            CpuIsa::Portable => "portable",
            CpuIsa::Avx2 => "avx2",
            CpuIsa::Avx512 => "avx512",
        }
    }

    /// The instruction set named `s` (`portable`, `avx2`, `avx512`).
    pub fn parse(s: &str) -> Option<CpuIsa> {
        match s.trim().to_ascii_lowercase().as_str() {
            "portable" | "none" | "scalar" => Some(CpuIsa::Portable),
            "avx2" => Some(CpuIsa::Avx2),
            "avx512" | "avx512vnni" | "avx-512" => Some(CpuIsa::Avx512),
            _ => None,
        }
    }
}

impl std::fmt::Display for CpuIsa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The instruction sets this processor runs, slowest first (always
/// [`CpuIsa::Portable`]).
pub fn cpu_isa_available() -> Vec<CpuIsa> {
    let mut v = vec![CpuIsa::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            v.push(CpuIsa::Avx2);
            if has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni") {
                v.push(CpuIsa::Avx512);
            }
        }
    }
    v
}

/// The switch behind [`cpu_isa`]: the best instruction set unless
/// `SILICA_CPU_ISA` names a lower one when it is first read.
static CPU_ISA: LazyLock<std::sync::atomic::AtomicU8> = LazyLock::new(|| {
    let available = cpu_isa_available();
    let best = *available.last().unwrap_or(&CpuIsa::Portable);
    let isa = match crate::config::cpu_isa_from_env() {
        None => best,
        Some(s) => match CpuIsa::parse(&s) {
            Some(isa) if available.contains(&isa) => isa,
            Some(isa) => {
                tracing::warn!("SILICA_CPU_ISA={s}: this processor lacks {isa}; using {best}");
                best
            }
            None => {
                tracing::warn!(
                    "SILICA_CPU_ISA={s} is not one of portable, avx2, avx512; using {best}"
                );
                best
            }
        },
    };
    std::sync::atomic::AtomicU8::new(isa as u8)
});

/// The instruction set of the CPU's integer products (8-bit activations
/// against Q4_0 / Q4_1 / Q8_0 blocks): the best this processor has, or
/// the one `SILICA_CPU_ISA=portable|avx2|avx512` names (never above what
/// the processor has; read once, on first use), or [`set_cpu_isa`]'s. On
/// [`CpuIsa::Portable`] those products take the f32 path of the other
/// formats. The f32 matmuls (the `gemm` crate) choose their own.
pub fn cpu_isa() -> CpuIsa {
    match CPU_ISA.load(Ordering::Relaxed) {
        2 => CpuIsa::Avx512,
        1 => CpuIsa::Avx2,
        _ => CpuIsa::Portable,
    }
}

/// Switches the CPU's integer products to `isa` for the whole process, so
/// that each path can be tested and measured on one machine; an error
/// where the processor lacks it. Quantized matrices are laid out at load
/// for the path then in effect (tiles of rows for the VNNI kernels): those
/// loaded before a switch still give the same results, but each product
/// reads them back out of their tiles, so reload a model to measure a
/// path (as `SILICA_CPU_ISA` does, read before anything is loaded).
pub fn set_cpu_isa(isa: CpuIsa) -> Result<()> {
    if !cpu_isa_available().contains(&isa) {
        return Err(crate::Error::NotSupported {
            op: "set_cpu_isa",
            reason: format!("this processor lacks {isa}"),
        });
    }
    CPU_ISA.store(isa as u8, Ordering::Relaxed);
    Ok(())
}

/// Whether a product started now on this thread uses 8-bit activations.
fn int8_now() -> bool {
    !EXACT.get() && cpu_int8_activations()
}

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
            Op::QMatmul { format } => {
                qmatmul::qmatmul(format, inputs[0], inputs[1], out_shape, out_dtype)
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
