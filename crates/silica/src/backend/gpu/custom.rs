//! The GPU side of custom ops: what [`crate::custom::CustomOp::gpu`] is
//! given to record its kernels with, and the pipelines of user kernels.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use super::kernels::launch::buffer;
use super::{Context, GpuDevice, GpuFeatures, Kernel};
use crate::custom::WgslKernel;
use crate::memory::GpuBuffer;
use crate::{DType, Error, Result, Tensor};

/// How the pipelines of custom kernels are named, before the kernel's own
/// name: a program registers them as it runs.
pub(crate) const CUSTOM_PREFIX: &str = "custom/";

/// One run of a custom op on a GPU: its operands, the output to produce,
/// and the device to record kernels on.
pub struct GpuCall<'a> {
    device: &'a GpuDevice,
    inputs: &'a [&'a Tensor],
    in_place: &'a [&'a Tensor],
    out_shape: &'a [usize],
    out_dtype: DType,
    out: Option<GpuBuffer>,
    /// Whole contiguous copies of inputs that were views, alive until the
    /// call ends.
    copies: Vec<Tensor>,
}

impl<'a> GpuCall<'a> {
    pub(crate) fn new(
        device: &'a GpuDevice,
        inputs: &'a [&'a Tensor],
        in_place: &'a [&'a Tensor],
        out_shape: &'a [usize],
        out_dtype: DType,
    ) -> Self {
        Self {
            device,
            inputs,
            in_place,
            out_shape,
            out_dtype,
            out: None,
            copies: Vec::new(),
        }
    }

    /// The read-only operands, as given.
    pub fn inputs(&self) -> &[&Tensor] {
        self.inputs
    }

    /// The operands updated in place: contiguous tensors of their own.
    pub fn in_place(&self) -> &[&Tensor] {
        self.in_place
    }

    /// The output's shape, as [`crate::custom::CustomOp::output`] gave it.
    pub fn out_shape(&self) -> &[usize] {
        self.out_shape
    }

    pub fn out_dtype(&self) -> DType {
        self.out_dtype
    }

    /// What the device runs with: decline in `gpu` where a kernel's needs
    /// are missing.
    pub fn features(&self) -> &GpuFeatures {
        self.device.features()
    }

    pub fn device(&self) -> &GpuDevice {
        self.device
    }

    /// The workgroup grid for `threads` threads in workgroups of
    /// `workgroup_size`: `[groups, 1, 1]`, or split over x and y past the
    /// device's limit per dimension, in which case a kernel finds its
    /// thread as `(wid.y * num_workgroups.x + wid.x) * size + lid.x`.
    pub fn groups_for(&self, threads: usize, workgroup_size: u32) -> Result<[u32; 3]> {
        let groups = threads.div_ceil(workgroup_size.max(1) as usize);
        let groups = u32::try_from(groups).map_err(|_| Error::NotSupported {
            op: "dispatch",
            reason: format!("{threads} threads exceed one dispatch"),
        })?;
        Ok(self.ctx().grid(groups))
    }

    /// Records `kernel` over `groups` workgroups with `params` as its
    /// uniform block (at most 256 bytes, a multiple of 16 for a uniform
    /// struct: see [`crate::custom::params`]). The inputs are bound as they
    /// are where they are whole contiguous tensors, else as contiguous
    /// copies; the output is allocated on the first dispatch and bound
    /// last, so several dispatches may build it up.
    pub fn dispatch(&mut self, kernel: &WgslKernel, params: &[u8], groups: [u32; 3]) -> Result<()> {
        if !self.features().runs(kernel.needs) {
            return Err(Error::NotSupported {
                op: kernel.name,
                reason: format!(
                    "{} lacks what the kernel needs ({:?})",
                    self.device.info().name,
                    kernel.needs
                ),
            });
        }
        if params.len() > 256 || !params.len().is_multiple_of(4) {
            return Err(Error::InvalidArgument {
                op: kernel.name,
                msg: format!(
                    "the parameters are {} bytes: at most 256, a multiple of 4",
                    params.len()
                ),
            });
        }
        let registered = register(kernel, self.inputs.len(), self.in_place.len() + 1)?;
        for t in self.inputs {
            if !whole(t) {
                self.copies.push(t.copy()?);
            }
        }
        self.output()?;
        let mut copies = self.copies.iter();
        let bound: Vec<&GpuBuffer> = self
            .inputs
            .iter()
            .map(|t| {
                if whole(t) {
                    buffer(t)
                } else {
                    // invariant: a copy was made above for every view, in order
                    buffer(copies.next().expect("a copy of the view"))
                }
            })
            .collect();
        let mut outputs: Vec<&GpuBuffer> = self.in_place.iter().map(|t| buffer(t)).collect();
        // invariant: allocated just above
        outputs.push(self.out.as_ref().expect("the output buffer"));
        // uniform blocks are at least 16 bytes in WGSL
        let mut block = params.to_vec();
        block.resize(params.len().max(16), 0);
        self.ctx()
            .dispatch_outputs(registered, &[], &block, &bound, &outputs, groups)
    }

    pub(crate) fn ctx(&self) -> &Context {
        &self.device.ctx
    }

    /// The output buffer, allocated from the device's pool on first use.
    pub(crate) fn output(&mut self) -> Result<&GpuBuffer> {
        if self.out.is_none() {
            let n: usize = self.out_shape.iter().product();
            let bytes = (n * self.out_dtype.size_in_bytes()) as u64;
            self.out = Some(self.device.ctx.pool.alloc(bytes)?);
        }
        // invariant: set just above
        Ok(self.out.as_ref().expect("the output buffer"))
    }

    /// The output, where a kernel produced it.
    pub(crate) fn finish(self) -> Option<GpuBuffer> {
        self.out
    }
}

/// Whether `t` can be bound as it is: contiguous from the start of its
/// buffer.
fn whole(t: &Tensor) -> bool {
    t.is_contiguous() && t.layout().offset() == 0
}

/// The kernel a device builds for a custom kernel with `inputs` read-only
/// and `outputs` read-write bindings: made once per (name, source, binding
/// counts) and kept for the process, under the name `custom/<name>` so that
/// it never shares a pipeline with a built-in kernel.
fn register(kernel: &WgslKernel, inputs: usize, outputs: usize) -> Result<&'static Kernel> {
    type Key = (&'static str, usize, usize);
    static KERNELS: OnceLock<Mutex<HashMap<Key, (&'static str, &'static Kernel)>>> =
        OnceLock::new();
    let mut map = KERNELS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let same = |s: &str| std::ptr::eq(s, kernel.source) || s == kernel.source;
    let clash = || Error::InvalidArgument {
        op: kernel.name,
        msg: format!(
            "another custom kernel named {:?} was registered with a different source: \
             custom kernel names must be unique",
            kernel.name
        ),
    };
    let key = (kernel.name, inputs, outputs);
    // the common case, a kernel dispatched before: one lookup
    if let Some(&(source, k)) = map.get(&key) {
        return if same(source) { Ok(k) } else { Err(clash()) };
    }
    if map
        .iter()
        .any(|((n, ..), (s, _))| *n == kernel.name && !same(s))
    {
        return Err(clash());
    }
    let name: &'static str =
        Box::leak(format!("{CUSTOM_PREFIX}{}/{inputs}/{outputs}", kernel.name).into_boxed_str());
    let k: &'static Kernel = Box::leak(Box::new(Kernel {
        name,
        source: kernel.source,
        inputs,
        outputs,
        trusted: false,
        // user kernels name their uniform block as they like
        immediates: false,
        needs: kernel.needs,
    }));
    map.insert(key, (kernel.source, k));
    Ok(k)
}

/// The decode step of `Tensor::cached_attention` as one kernel (operands
/// `[qkv, cos, sin]`, the cache in place), where the kernel serves these
/// operands; `false` otherwise, with nothing recorded.
pub(crate) fn attention_step(
    call: &mut GpuCall<'_>,
    step: &crate::fused::AttentionStep,
) -> Result<bool> {
    let (qkv, cos, sin) = (call.inputs[0], call.inputs[1], call.inputs[2]);
    let cache = call.in_place[0];
    if !super::nn::fuses_step(call.ctx(), qkv, cache, cos, sin) {
        return Ok(false);
    }
    call.output()?;
    // invariant: allocated just above
    let out = call.out.as_ref().expect("the output buffer");
    super::nn::attention_step(&call.device.ctx, qkv, cache, (cos, sin), step, out)?;
    Ok(true)
}

/// A batched decode step of `Tensor::cached_attention_batch` as one kernel
/// (operands `[qkv, cos, sin, seqs]`, the shared cache in place) where
/// every sequence has one new position and the subgroup step kernel
/// serves the operands; `false` otherwise, with nothing recorded.
pub(crate) fn attention_step_batch(
    call: &mut GpuCall<'_>,
    step: &crate::fused::BatchAttentionStep,
) -> Result<bool> {
    let (qkv, cos, sin, seqs) = (
        call.inputs[0],
        call.inputs[1],
        call.inputs[2],
        call.inputs[3],
    );
    let cache = call.in_place[0];
    let ones = step.seqs.iter().all(|s| s.len == 1);
    let tables = (cos, sin);
    if !ones || !super::nn::fuses_batch_step(call.ctx(), qkv, cache, tables, step.style) {
        return Ok(false);
    }
    let max_keys = step
        .seqs
        .iter()
        .map(|s| s.start + 1 - step.window.map_or(0, |w| (s.start + 1).saturating_sub(w)))
        .max()
        .unwrap_or(1);
    call.output()?;
    // invariant: allocated just above
    let out = call.out.as_ref().expect("the output buffer");
    let c = &call.device.ctx;
    super::nn::attention_step_batch(c, qkv, cache, tables, seqs, max_keys, step, out)?;
    Ok(true)
}

/// `rms_norm(x, weight) + residual` (operands in that order) as one row
/// kernel where it reads them as whole words; `false` otherwise, with
/// nothing recorded.
pub(crate) fn rms_norm_add(call: &mut GpuCall<'_>, eps: f32) -> Result<bool> {
    let (x, w, r) = (call.inputs[0], call.inputs[1], call.inputs[2]);
    if !super::reduce::rms_norm_add_fits(x, r) {
        return Ok(false);
    }
    call.output()?;
    // invariant: allocated just above
    let out = call.out.as_ref().expect("the output buffer");
    super::reduce::rms_norm_add(&call.device.ctx, x, w, r, eps, out)?;
    Ok(true)
}

/// `x @ wᵀ + residual` (operands `[x, w, residual]`) through the float
/// products, whose split parts take the residual into their sum; `false`
/// for operands that are not contiguous (x, the residual) or empty.
pub(crate) fn linear_add(call: &mut GpuCall<'_>) -> Result<bool> {
    let (x, w, r) = (call.inputs[0], call.inputs[1], call.inputs[2]);
    let (n, k) = (w.shape()[0], w.shape()[1]);
    let m = x.numel() / k.max(1);
    if m * n * k == 0 || !x.is_contiguous() || !r.is_contiguous() {
        return Ok(false);
    }
    let x = x.reshape(&[m, k])?;
    let wt = w.t()?;
    let dtype = call.out_dtype;
    call.output()?;
    // invariant: allocated just above
    let out = call.out.as_ref().expect("the output buffer");
    let ctx = &call.device.ctx;
    super::matmul::matmul_plus(ctx, &x, &wt, &[m, n], Some(r), out, dtype)?;
    Ok(true)
}

/// A quantized product with the norm, SwiGLU or residual of `fusion` as
/// one kernel (operands as for `Op::QMatmul`, then the norm weight and the
/// residual), where the GEMV kernel fuses them for this many rows, or a
/// residual alone with f16 x on an adapter with the cooperative-matrix
/// kernels (whose split products add it as they sum their parts); `false`
/// otherwise, with nothing recorded.
pub(crate) fn fused_qmatmul(
    call: &mut GpuCall<'_>,
    format: crate::QuantFormat,
    fusion: crate::QFusion,
) -> Result<bool> {
    let x = call.inputs[0];
    let k = x.shape().last().copied().unwrap_or(0);
    let rows = x.numel() / k.max(1);
    let n = call.out_shape.last().copied().unwrap_or(0);
    let weight_rows = if fusion.gated() { 2 * n } else { n };
    let ctx = &call.device.ctx;
    let x16 = x.dtype() == DType::F16;
    let residual_only = fusion == crate::QFusion::RESIDUAL && x16 && super::matmul::coop_tiles(ctx);
    if !x.dtype().is_float()
        || !(super::qmatmul::takes_gemv(ctx, format, rows, weight_rows, k, x16) || residual_only)
        || !super::qmatmul::projects_in_kernel(fusion, call.inputs, rows)
    {
        return Ok(false);
    }
    // check mode compares with the CPU's exact products
    let int8 = call.device.int8_activations() && !call.device.check_mode();
    let (shape, dtype) = (call.out_shape, call.out_dtype);
    call.output()?;
    // invariant: allocated just above
    let out = call.out.as_ref().expect("the output buffer");
    let c = &call.device.ctx;
    super::qmatmul::qmatmul(c, format, fusion, int8, call.inputs, shape, out, dtype)?;
    Ok(true)
}
