//! The library's fused ops, defined as custom ops (see [`crate::custom`]):
//! one GPU kernel where the device and operands allow it, the same ops one
//! after the other on the same device otherwise, and that composition on
//! the CPU as their reference.

use crate::custom::{CustomOp, GpuCall, Tolerance};
use crate::{DType, QFusion, QuantFormat, Result, RopeStyle, Tensor};

/// One decode step of [`Tensor::cached_attention`]: operands `[qkv, cos,
/// sin]`, the KV cache updated in place; the caller checked them.
pub(crate) struct AttentionStep {
    pub start: usize,
    pub style: RopeStyle,
    pub heads: usize,
    pub scale: f32,
    pub window: Option<usize>,
    pub softcap: Option<f32>,
}

impl AttentionStep {
    /// The first cache row the new position sees through the window.
    pub(crate) fn first_key(&self) -> usize {
        self.window
            .map_or(0, |w| (self.start + 1).saturating_sub(w))
    }

    fn composed(&self, inputs: &[&Tensor], cache: &mut Tensor) -> Result<Tensor> {
        let rope = (inputs[1], inputs[2], self.style);
        let opts = crate::CachedAttentionOpts {
            scale: self.scale,
            window: self.window,
            softcap: self.softcap,
        };
        inputs[0].cached_attention_composed(cache, 0, self.start, rope, self.heads, opts)
    }
}

impl CustomOp for AttentionStep {
    fn name(&self) -> &'static str {
        "cached_attention"
    }

    fn output(&self, inputs: &[&Tensor], _: &[&Tensor]) -> Result<(Vec<usize>, DType)> {
        let qkv = inputs[0];
        Ok((vec![1, self.heads, qkv.shape()[2]], qkv.dtype()))
    }

    fn cpu(&self, inputs: &[&Tensor], in_place: &mut [&mut Tensor]) -> Result<Tensor> {
        self.composed(inputs, in_place[0])
    }

    fn gpu(&self, call: &mut GpuCall<'_>) -> Result<bool> {
        crate::backend::gpu::custom::attention_step(call, self)
    }

    fn compose(&self, inputs: &[&Tensor], in_place: &mut [&mut Tensor]) -> Result<Option<Tensor>> {
        self.composed(inputs, in_place[0]).map(Some)
    }

    /// The output rounds as attention does, the cache row as rope does.
    fn tolerance(&self, dtype: DType, which: usize) -> Tolerance {
        if which == 0 {
            Tolerance::sums(dtype)
        } else {
            Tolerance::elementwise(dtype)
        }
    }
}

/// One step of [`Tensor::cached_attention_batch`]: operands `[qkv, cos,
/// sin, seqs]` (`seqs` U32 `[2 B]`, each sequence's first key row and key
/// count, for the kernel), the shared cache updated in place; the caller
/// checked them.
pub(crate) struct BatchAttentionStep {
    pub seqs: Vec<crate::CacheSeq>,
    pub style: RopeStyle,
    pub heads: usize,
    pub scale: f32,
    pub window: Option<usize>,
    pub softcap: Option<f32>,
}

impl BatchAttentionStep {
    fn opts(&self) -> crate::CachedAttentionOpts {
        crate::CachedAttentionOpts {
            scale: self.scale,
            window: self.window,
            softcap: self.softcap,
        }
    }

    /// Each sequence as [`Tensor::cached_attention_with`] over its rows of
    /// the cache, the outputs stacked.
    fn composed(&self, inputs: &[&Tensor], cache: &mut Tensor) -> Result<Tensor> {
        let (qkv, cos, sin) = (inputs[0], inputs[1], inputs[2]);
        let mut outs = Vec::with_capacity(self.seqs.len());
        let mut row = 0;
        for s in &self.seqs {
            let rope = (
                &cos.narrow(0, row, s.len)?,
                &sin.narrow(0, row, s.len)?,
                self.style,
            );
            let q = qkv.narrow(0, row, s.len)?;
            outs.push(q.cached_attention_composed(
                cache,
                s.base,
                s.start,
                rope,
                self.heads,
                self.opts(),
            )?);
            row += s.len;
        }
        let refs: Vec<&Tensor> = outs.iter().collect();
        Tensor::cat(&refs, 0)
    }
}

impl CustomOp for BatchAttentionStep {
    fn name(&self) -> &'static str {
        "cached_attention_batch"
    }

    fn output(&self, inputs: &[&Tensor], _: &[&Tensor]) -> Result<(Vec<usize>, DType)> {
        let qkv = inputs[0];
        Ok((
            vec![qkv.shape()[0], self.heads, qkv.shape()[2]],
            qkv.dtype(),
        ))
    }

    fn cpu(&self, inputs: &[&Tensor], in_place: &mut [&mut Tensor]) -> Result<Tensor> {
        self.composed(inputs, in_place[0])
    }

    fn gpu(&self, call: &mut GpuCall<'_>) -> Result<bool> {
        crate::backend::gpu::custom::attention_step_batch(call, self)
    }

    fn compose(&self, inputs: &[&Tensor], in_place: &mut [&mut Tensor]) -> Result<Option<Tensor>> {
        self.composed(inputs, in_place[0]).map(Some)
    }

    /// The output rounds as attention does, the cache rows as rope does.
    fn tolerance(&self, dtype: DType, which: usize) -> Tolerance {
        if which == 0 {
            Tolerance::sums(dtype)
        } else {
            Tolerance::elementwise(dtype)
        }
    }
}

/// A quantized product with the norm before it and the SwiGLU and residual
/// after it that `fusion` names: operands `[x, w]` as for
/// [`crate::Op::QMatmul`], then the norm weight and the residual where
/// `fusion` has them; the caller checked them.
pub(crate) struct FusedQMatmul {
    pub format: QuantFormat,
    pub fusion: QFusion,
    pub out_shape: Vec<usize>,
}

impl CustomOp for FusedQMatmul {
    fn name(&self) -> &'static str {
        self.fusion.name()
    }

    fn output(&self, inputs: &[&Tensor], _: &[&Tensor]) -> Result<(Vec<usize>, DType)> {
        Ok((self.out_shape.clone(), inputs[0].dtype()))
    }

    fn cpu(&self, inputs: &[&Tensor], _: &mut [&mut Tensor]) -> Result<Tensor> {
        crate::qtensor::qmatmul_composed(self.format, self.fusion, inputs)
    }

    fn gpu(&self, call: &mut GpuCall<'_>) -> Result<bool> {
        crate::backend::gpu::custom::fused_qmatmul(call, self.format, self.fusion)
    }

    fn compose(&self, inputs: &[&Tensor], _: &mut [&mut Tensor]) -> Result<Option<Tensor>> {
        crate::qtensor::qmatmul_composed(self.format, self.fusion, inputs).map(Some)
    }

    fn tolerance(&self, dtype: DType, _: usize) -> Tolerance {
        product_tolerance(dtype)
    }
}

/// A product's check-mode tolerance, as the plain product's (see
/// `dispatch::check_tolerance`).
fn product_tolerance(dtype: DType) -> Tolerance {
    if dtype == DType::F32 {
        Tolerance::sums(dtype)
    } else {
        Tolerance {
            rms_share: 1.0 / 32.0,
            ..Tolerance::sums(dtype)
        }
    }
}

/// `x @ wᵀ + bias` (`Tensor::linear`): operands `[x [.., k], w [n, k],
/// bias [n]]`, the caller checked them. On the CPU in f32 the product
/// accumulates into the bias rows; elsewhere, `matmul` then `add`.
pub(crate) struct Linear;

impl Linear {
    fn composed(inputs: &[&Tensor]) -> Result<Tensor> {
        inputs[0].matmul(&inputs[1].t()?)?.add(inputs[2])
    }
}

impl CustomOp for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn output(&self, inputs: &[&Tensor], _: &[&Tensor]) -> Result<(Vec<usize>, DType)> {
        let mut shape = inputs[0].shape().to_vec();
        let last = shape.len() - 1;
        shape[last] = inputs[1].shape()[0];
        Ok((shape, inputs[0].dtype()))
    }

    fn cpu(&self, inputs: &[&Tensor], _: &mut [&mut Tensor]) -> Result<Tensor> {
        let (x, w, b) = (inputs[0], inputs[1], inputs[2]);
        if x.dtype() == DType::F32 && w.dtype() == DType::F32 {
            let x = x.contiguous()?;
            let n = w.shape()[0];
            let m: usize = x.shape()[..x.rank() - 1].iter().product();
            crate::memory::host_check((m * n * 4) as u64)?;
            if let Some(out) = crate::backend::cpu::matmul::linear_f32(&x, w, b) {
                let (shape, _) = self.output(inputs, &[])?;
                return Tensor::from_vec(out, &shape, &crate::Device::Cpu);
            }
        }
        Self::composed(inputs)
    }

    fn compose(&self, inputs: &[&Tensor], _: &mut [&mut Tensor]) -> Result<Option<Tensor>> {
        Self::composed(inputs).map(Some)
    }
}

/// `x @ wᵀ + residual` (`Tensor::linear_add`): operands `[x [.., k],
/// w [n, k], residual [.., n]]`, the residual of the output's shape; the
/// caller checked them. On a GPU the products split along K add the
/// residual as they sum their parts (no dispatch of its own); elsewhere
/// `matmul`, then `add`, as [`Linear`]'s composition (the bias broadcast
/// there, the residual whole here).
pub(crate) struct LinearAdd;

impl CustomOp for LinearAdd {
    fn name(&self) -> &'static str {
        "linear_add"
    }

    fn output(&self, inputs: &[&Tensor], _: &[&Tensor]) -> Result<(Vec<usize>, DType)> {
        Linear.output(inputs, &[])
    }

    fn cpu(&self, inputs: &[&Tensor], _: &mut [&mut Tensor]) -> Result<Tensor> {
        Linear::composed(inputs)
    }

    fn gpu(&self, call: &mut GpuCall<'_>) -> Result<bool> {
        crate::backend::gpu::custom::linear_add(call)
    }

    fn compose(&self, inputs: &[&Tensor], _: &mut [&mut Tensor]) -> Result<Option<Tensor>> {
        Linear::composed(inputs).map(Some)
    }

    fn tolerance(&self, dtype: DType, _: usize) -> Tolerance {
        product_tolerance(dtype)
    }
}

/// `rms_norm(x, weight) + residual`: operands `[x, weight, residual]`,
/// the caller checked them.
pub(crate) struct RmsNormAdd {
    pub eps: f32,
}

impl CustomOp for RmsNormAdd {
    fn name(&self) -> &'static str {
        "rms_norm_add"
    }

    fn output(&self, inputs: &[&Tensor], _: &[&Tensor]) -> Result<(Vec<usize>, DType)> {
        Ok((inputs[0].shape().to_vec(), inputs[0].dtype()))
    }

    fn cpu(&self, inputs: &[&Tensor], _: &mut [&mut Tensor]) -> Result<Tensor> {
        let (x, w, r) = (inputs[0], inputs[1], inputs[2]);
        x.rms_norm(w, self.eps)?.add(r)
    }

    fn gpu(&self, call: &mut GpuCall<'_>) -> Result<bool> {
        crate::backend::gpu::custom::rms_norm_add(call, self.eps)
    }

    fn compose(&self, inputs: &[&Tensor], in_place: &mut [&mut Tensor]) -> Result<Option<Tensor>> {
        self.cpu(inputs, in_place).map(Some)
    }

    /// The norm's sum, and one rounding fewer than the composition's.
    fn tolerance(&self, dtype: DType, _: usize) -> Tolerance {
        Tolerance::sums(dtype)
    }
}

/// RMSNorm of the query heads and of the key heads of a packed QKV tensor
/// (Qwen3's and Gemma 3's head norms): operands `[qkv [T, H + 2 KVH, D],
/// q_weight [D], k_weight [D]]`, the caller checked them.
pub(crate) struct HeadNorm {
    pub q_heads: usize,
    pub k_heads: usize,
    pub eps: f32,
}

static HEAD_NORM: crate::custom::WgslKernel = crate::custom::WgslKernel {
    name: "head_norm",
    source: include_str!("backend/gpu/kernels/head_norm.wgsl"),
    needs: crate::KernelNeeds::NOTHING,
};

impl HeadNorm {
    fn composed(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        let (x, qw, kw) = (inputs[0], inputs[1], inputs[2]);
        let (h, kvh) = (self.q_heads, self.k_heads);
        let rest = x.shape()[1] - h - kvh;
        let q = x.narrow(1, 0, h)?.rms_norm(qw, self.eps)?;
        let k = x.narrow(1, h, kvh)?.rms_norm(kw, self.eps)?;
        Tensor::cat(&[&q, &k, &x.narrow(1, h + kvh, rest)?], 1)
    }
}

impl CustomOp for HeadNorm {
    fn name(&self) -> &'static str {
        "head_norm"
    }

    fn output(&self, inputs: &[&Tensor], _: &[&Tensor]) -> Result<(Vec<usize>, DType)> {
        Ok((inputs[0].shape().to_vec(), inputs[0].dtype()))
    }

    fn cpu(&self, inputs: &[&Tensor], _: &mut [&mut Tensor]) -> Result<Tensor> {
        self.composed(inputs)
    }

    fn gpu(&self, call: &mut GpuCall<'_>) -> Result<bool> {
        let x = call.inputs()[0];
        let [t, heads, d] = [x.shape()[0], x.shape()[1], x.shape()[2]];
        let half = match x.dtype() {
            DType::F32 => 0,
            DType::F16 if d.is_multiple_of(2) => 1,
            _ => return Ok(false),
        };
        let rows = t * heads;
        let fits = |v: usize| u32::try_from(v).ok();
        let (Some(rows32), Some(heads32), Some(d32)) = (fits(rows), fits(heads), fits(d)) else {
            return Ok(false);
        };
        let params = crate::custom::params(&[
            rows32,
            heads32,
            self.q_heads as u32,
            self.k_heads as u32,
            d32,
            self.eps.to_bits(),
            half,
            0,
        ]);
        let groups = call.groups_for(rows, 1)?;
        call.dispatch(&HEAD_NORM, &params, groups)?;
        Ok(true)
    }

    fn compose(&self, inputs: &[&Tensor], _: &mut [&mut Tensor]) -> Result<Option<Tensor>> {
        self.composed(inputs).map(Some)
    }

    /// As RMSNorm's.
    fn tolerance(&self, dtype: DType, _: usize) -> Tolerance {
        Tolerance {
            rel: Tolerance::elementwise(dtype).rel * 4.0,
            rms_share: 0.0,
        }
    }
}

/// The first product of a low-rank update, `x @ aᵀ` (of `x`'s RMS-normed
/// rows, without a weight, with `rms_eps`), in f32: operands `[x [.., k],
/// a [r, k]]`, the caller checked them.
pub(crate) struct LowRankIn {
    pub rms_eps: Option<f32>,
}

static LOW_RANK_IN: crate::custom::WgslKernel = crate::custom::WgslKernel {
    name: "low_rank_in",
    source: include_str!("backend/gpu/kernels/low_rank_in.wgsl"),
    needs: crate::KernelNeeds::NOTHING,
};

/// Rows of `x` up to which the kernel runs (decode); beyond, a matmul.
const LOW_RANK_IN_ROWS: usize = 8;

impl LowRankIn {
    fn composed(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        let (x, a) = (inputs[0], inputs[1]);
        let x = x.to_dtype(DType::F32)?;
        let x = match self.rms_eps {
            Some(eps) => {
                let k = x.dim(-1)?;
                let ones = Tensor::ones(&[k], DType::F32, x.device())?;
                x.rms_norm(&ones, eps)?
            }
            None => x,
        };
        x.matmul(&a.to_dtype(DType::F32)?.t()?)
    }
}

impl CustomOp for LowRankIn {
    fn name(&self) -> &'static str {
        "low_rank_in"
    }

    fn output(&self, inputs: &[&Tensor], _: &[&Tensor]) -> Result<(Vec<usize>, DType)> {
        let mut shape = inputs[0].shape().to_vec();
        let last = shape.len() - 1;
        shape[last] = inputs[1].shape()[0];
        Ok((shape, DType::F32))
    }

    fn cpu(&self, inputs: &[&Tensor], _: &mut [&mut Tensor]) -> Result<Tensor> {
        self.composed(inputs)
    }

    fn gpu(&self, call: &mut GpuCall<'_>) -> Result<bool> {
        let (x, a) = (call.inputs()[0], call.inputs()[1]);
        let k = x.shape().last().copied().unwrap_or(0);
        let (m, r) = (x.numel() / k.max(1), a.shape()[0]);
        let dt = match x.dtype() {
            DType::F32 => 0,
            DType::F16 if k.is_multiple_of(2) => 1,
            _ => return Ok(false),
        };
        let whole = |t: &Tensor| t.is_contiguous() && t.layout().offset() == 0;
        if m > LOW_RANK_IN_ROWS || !whole(x) || !whole(a) || r > 65_535 {
            return Ok(false);
        }
        let fits = |v: usize| u32::try_from(v).ok();
        let (Some(k32), Some(r32)) = (fits(k), fits(r)) else {
            return Ok(false);
        };
        let params = crate::custom::params(&[
            m as u32,
            k32,
            r32,
            self.rms_eps.unwrap_or(0.0).to_bits(),
            self.rms_eps.is_some() as u32,
            dt,
        ]);
        call.dispatch(&LOW_RANK_IN, &params, [r32, m as u32, 1])?;
        Ok(true)
    }

    fn compose(&self, inputs: &[&Tensor], _: &mut [&mut Tensor]) -> Result<Option<Tensor>> {
        self.composed(inputs).map(Some)
    }
}
