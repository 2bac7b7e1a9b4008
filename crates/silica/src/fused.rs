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
}

impl AttentionStep {
    fn composed(&self, inputs: &[&Tensor], cache: &mut Tensor) -> Result<Tensor> {
        let rope = (inputs[1], inputs[2], self.style);
        inputs[0].cached_attention_composed(cache, self.start, rope, self.heads, self.scale)
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
        let (start, style) = (self.start, self.style);
        crate::backend::gpu::custom::attention_step(call, start, style, self.heads, self.scale)
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

    /// As the plain product's (see `dispatch::check_tolerance`).
    fn tolerance(&self, dtype: DType, _: usize) -> Tolerance {
        if dtype == DType::F32 {
            Tolerance::sums(dtype)
        } else {
            Tolerance {
                rms_share: 1.0 / 32.0,
                ..Tolerance::sums(dtype)
            }
        }
    }
}
