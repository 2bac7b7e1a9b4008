//! Ops defined outside the built-in set: a CPU reference, optionally a
//! GPU kernel in WGSL, and the same dispatch the built-in ops get.
//!
//! A [`CustomOp`] runs through [`apply`] (or [`apply_in_place`] for ops that
//! update tensors in place) on the device of its inputs:
//!
//! - on the CPU, [`CustomOp::cpu`] computes it;
//! - on a GPU, [`CustomOp::gpu`] records its kernels. Where it declines (a
//!   device without what the kernel needs, inputs it does not serve),
//!   [`CustomOp::compose`] may build the op from other ops on the same
//!   device; failing that the CPU reference runs on host copies, which is
//!   a CPU fallback like any other: warned about once, counted in
//!   [`crate::GpuDevice::fallback_report`], an error in strict mode;
//! - in check mode (`SILICA_CHECK=1`) every GPU result, in-place updates
//!   included, is compared with the CPU reference at the op's
//!   [`CustomOp::tolerance`];
//! - outputs come from the device's caching allocator, so they count in
//!   [`crate::Device::memory_stats`] and respect its memory limit.
//!
//! The fused ops of the library (the quantized products with their norm,
//! SwiGLU and residual, and the decode step of
//! [`crate::Tensor::cached_attention`]) are custom ops too.
//!
//! A GPU kernel binds its parameters as a uniform block at binding 0 of
//! group 0 (`@group(0) @binding(0) var<uniform> p: Params;`), the inputs
//! after it as read-only storage buffers (bindings 1..=N, in order), then
//! the tensors updated in place and last the output as read-write storage
//! buffers. Its entry point is `main`. Tensors are bound whole and
//! contiguous, each as the elements of its dtype (`array<f32>` for F32;
//! 16-bit tensors hold two elements a word, so declare them `array<u32>`
//! and unpack with `unpack2x16float`, or as `array<f16>` with the
//! [`KernelNeeds::F16`] need).
//!
//! ```
//! use silica::custom::{self, CustomOp, GpuCall, WgslKernel};
//! use silica::{DType, Device, KernelNeeds, Result, Tensor};
//!
//! /// `y = x * sigmoid(alpha * x)`, for F32 tensors.
//! struct Swish { alpha: f32 }
//!
//! static SWISH: WgslKernel = WgslKernel {
//!     name: "swish",
//!     source: "
//!         struct Params { n: u32, alpha: f32 }
//!         @group(0) @binding(0) var<uniform> p: Params;
//!         @group(0) @binding(1) var<storage, read> x: array<f32>;
//!         @group(0) @binding(2) var<storage, read_write> y: array<f32>;
//!         @compute @workgroup_size(64)
//!         fn main(@builtin(global_invocation_id) id: vec3<u32>) {
//!             if id.x < p.n { y[id.x] = x[id.x] / (1.0 + exp(-p.alpha * x[id.x])); }
//!         }",
//!     needs: KernelNeeds::NOTHING,
//! };
//!
//! impl CustomOp for Swish {
//!     fn name(&self) -> &'static str { "swish" }
//!     fn output(&self, inputs: &[&Tensor], _: &[&Tensor]) -> Result<(Vec<usize>, DType)> {
//!         custom::expect_dtype(self.name(), inputs[0], DType::F32)?;
//!         Ok((inputs[0].shape().to_vec(), DType::F32))
//!     }
//!     fn cpu(&self, inputs: &[&Tensor], _: &mut [&mut Tensor]) -> Result<Tensor> {
//!         let x: Vec<f32> = inputs[0].to_vec()?;
//!         let y: Vec<f32> = x.iter().map(|v| v / (1.0 + (-self.alpha * v).exp())).collect();
//!         Tensor::from_vec(y, inputs[0].shape(), &Device::Cpu)
//!     }
//!     fn gpu(&self, call: &mut GpuCall<'_>) -> Result<bool> {
//!         let n = call.inputs()[0].numel();
//!         let params = custom::params(&[n as u32, self.alpha.to_bits()]);
//!         let groups = call.groups_for(n, 64)?;
//!         call.dispatch(&SWISH, &params, groups)?;
//!         Ok(true)
//!     }
//! }
//!
//! let dev = Device::best()?;
//! let x = Tensor::randn(&[1000], DType::F32, 0, &dev)?;
//! let y = custom::apply(&Swish { alpha: 1.0 }, &[&x])?;
//! let want = x.silu()?;
//! let err = y.sub(&want)?.abs()?.max(-1, false)?.to_vec::<f32>()?[0];
//! assert!(err < 1e-5);
//! # Ok::<(), silica::Error>(())
//! ```

use crate::{DType, Error, KernelNeeds, Result, Tensor};

pub use crate::backend::gpu::GpuCall;

/// A user-defined op. Only [`CustomOp::name`], [`CustomOp::output`] and
/// [`CustomOp::cpu`] are required: an op without a GPU kernel runs on the
/// CPU wherever its inputs are, as a counted fallback on a GPU.
pub trait CustomOp: Send + Sync {
    /// The op's name in errors, fallback reports and check-mode messages.
    /// [`crate::GpuDevice::disable_kernel_for_testing`] with this name
    /// makes a GPU skip [`CustomOp::gpu`].
    fn name(&self) -> &'static str;

    /// Checks the operands (`inputs`, then the tensors updated in place;
    /// all on one device, which the dispatcher has checked) and returns the
    /// output's shape and dtype. Bad operands are an error here, before
    /// anything runs.
    fn output(&self, inputs: &[&Tensor], in_place: &[&Tensor]) -> Result<(Vec<usize>, DType)>;

    /// The CPU reference: the output computed from operands on the CPU,
    /// with the tensors of `in_place` updated. It also serves as a GPU's
    /// fallback (on host copies, the updates copied back) and as the
    /// reference of check mode.
    fn cpu(&self, inputs: &[&Tensor], in_place: &mut [&mut Tensor]) -> Result<Tensor>;

    /// The op on a GPU: records its kernels through `call` and returns
    /// `true`, or returns `false` (having recorded nothing) where it does
    /// not serve this device or these operands. The default declines.
    fn gpu(&self, call: &mut GpuCall<'_>) -> Result<bool> {
        let _ = call;
        Ok(false)
    }

    /// The op as other ops on the operands' own device, for a GPU where
    /// [`CustomOp::gpu`] declined: `Some` is the result (no fallback: the
    /// ops it ran each had their own kernel or fallback), `None` (the
    /// default) runs the CPU reference instead.
    fn compose(&self, inputs: &[&Tensor], in_place: &mut [&mut Tensor]) -> Result<Option<Tensor>> {
        let _ = (inputs, in_place);
        Ok(None)
    }

    /// How far check mode lets result `which` (0: the output; `i + 1`: the
    /// `i`-th tensor updated in place) of `dtype` stray from the CPU
    /// reference. The default suits sums of products.
    fn tolerance(&self, dtype: DType, which: usize) -> Tolerance {
        let _ = which;
        Tolerance::sums(dtype)
    }
}

/// A check-mode tolerance: element `i` of a result may differ from the
/// reference `r` by `rel * (1 + |r_i|) + rel * rms_share * rms(r)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub rel: f64,
    pub rms_share: f64,
}

impl Tolerance {
    /// The rounding of one operation in `dtype` (elementwise ops, copies).
    pub fn elementwise(dtype: DType) -> Tolerance {
        let rel = match dtype {
            DType::F32 => 1e-4,
            DType::F16 => 2e-3,
            DType::BF16 => 1.6e-2,
            DType::U32 | DType::I64 => 0.0,
        };
        Tolerance {
            rel,
            rms_share: 0.0,
        }
    }

    /// Sums of many rounded products in `dtype` (products, reductions,
    /// attention): ten times [`Tolerance::elementwise`].
    pub fn sums(dtype: DType) -> Tolerance {
        let e = Self::elementwise(dtype);
        Tolerance {
            rel: e.rel * 10.0,
            rms_share: 0.0,
        }
    }
}

/// A WGSL compute kernel of a custom op (see the module's documentation
/// for its bindings). `name` must be unique among custom kernels: the
/// device caches the built pipeline under it.
#[derive(Debug)]
pub struct WgslKernel {
    pub name: &'static str,
    pub source: &'static str,
    /// What the kernel needs of the device; [`GpuCall::dispatch`] fails
    /// with [`Error::NotSupported`] on a device without it (check
    /// [`GpuCall::features`] first and decline instead).
    pub needs: KernelNeeds,
}

/// Runs `op` on `inputs` (all on one device) and returns its output.
pub fn apply(op: &dyn CustomOp, inputs: &[&Tensor]) -> Result<Tensor> {
    crate::dispatch::run_custom(op, inputs, &mut [])
}

/// Runs `op` on `inputs` and updates the tensors of `in_place`, which get
/// storage of their own first where they share it with other tensors (as
/// [`Tensor::slice_assign`] does); returns the op's output.
pub fn apply_in_place(
    op: &dyn CustomOp,
    inputs: &[&Tensor],
    in_place: &mut [&mut Tensor],
) -> Result<Tensor> {
    crate::dispatch::run_custom(op, inputs, in_place)
}

/// A kernel's uniform block from 32-bit words (`f32::to_bits` for floats),
/// padded to a whole 16 bytes as WGSL lays out uniform structs.
pub fn params(words: &[u32]) -> Vec<u8> {
    let mut w = words.to_vec();
    w.resize(words.len().next_multiple_of(4).max(4), 0);
    bytemuck::cast_slice(&w).to_vec()
}

/// An error naming `op` unless `t` has `dtype`: for [`CustomOp::output`].
pub fn expect_dtype(op: &'static str, t: &Tensor, dtype: DType) -> Result<()> {
    if t.dtype() == dtype {
        Ok(())
    } else {
        Err(Error::UnsupportedDType {
            op,
            dtype: t.dtype(),
        })
    }
}
