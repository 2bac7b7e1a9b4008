//! A custom op with a WGSL kernel: the low-rank update of a LoRA adapter,
//! `y = scale · (x · A) · B`, in one kernel. One workgroup takes one row
//! of `x`: it first forms the row's `r` values of `x · A` in workgroup
//! memory, then every thread produces outputs from them.
//!
//! `cargo run --release -p silica --example lora_delta` runs it on the
//! default device and compares it with the same product as two matmuls.

use silica::custom::{self, CustomOp, GpuCall, WgslKernel};
use silica::{DType, Device, Error, KernelNeeds, Result, Tensor};

/// Largest rank the kernel takes (its workgroup memory holds one row of
/// `x · A`).
pub const MAX_RANK: usize = 64;

/// `scale · (x [m, k] · a [k, r]) · b [r, n]`, all F32.
pub struct LoraDelta {
    pub scale: f32,
}

static LORA_DELTA: WgslKernel = WgslKernel {
    name: "lora_delta",
    source: include_str!("lora_delta.wgsl"),
    needs: KernelNeeds::NOTHING,
};

impl CustomOp for LoraDelta {
    fn name(&self) -> &'static str {
        "lora_delta"
    }

    fn output(&self, inputs: &[&Tensor], _: &[&Tensor]) -> Result<(Vec<usize>, DType)> {
        let [x, a, b] = inputs else {
            return Err(Error::InvalidArgument {
                op: self.name(),
                msg: format!("takes x, A and B, not {} tensors", inputs.len()),
            });
        };
        for t in [x, a, b] {
            custom::expect_dtype(self.name(), t, DType::F32)?;
        }
        let fits = x.rank() == 2
            && a.rank() == 2
            && b.rank() == 2
            && x.shape()[1] == a.shape()[0]
            && a.shape()[1] == b.shape()[0];
        if !fits {
            return Err(Error::ShapeMismatch {
                op: self.name(),
                lhs: x.shape().to_vec(),
                rhs: a.shape().to_vec(),
                hint: format!("x [m, k], A [k, r] and B [r, n] (B is {:?})", b.shape()),
            });
        }
        Ok((vec![x.shape()[0], b.shape()[1]], DType::F32))
    }

    fn cpu(&self, inputs: &[&Tensor], _: &mut [&mut Tensor]) -> Result<Tensor> {
        let [x, a, b] = [inputs[0], inputs[1], inputs[2]];
        x.matmul(a)?.matmul(b)?.mul_scalar(self.scale)
    }

    fn gpu(&self, call: &mut GpuCall<'_>) -> Result<bool> {
        let (x, a, b) = (call.inputs()[0], call.inputs()[1], call.inputs()[2]);
        let (m, k, r, n) = (x.shape()[0], x.shape()[1], a.shape()[1], b.shape()[1]);
        // one workgroup a row, along x only: WebGPU guarantees 65,535
        if r > MAX_RANK || m > 65_535 {
            return Ok(false);
        }
        let words = [m, k, r, n].map(|v| v as u32);
        let params =
            custom::params(&[words[0], words[1], words[2], words[3], self.scale.to_bits()]);
        call.dispatch(&LORA_DELTA, &params, [m as u32, 1, 1])?;
        Ok(true)
    }
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let dev = Device::best()?;
    let (m, k, r, n) = (4, 512, 16, 768);
    let x = Tensor::randn(&[m, k], DType::F32, 1, &dev)?;
    let a = Tensor::randn(&[k, r], DType::F32, 2, &dev)?;
    let b = Tensor::randn(&[r, n], DType::F32, 3, &dev)?;
    let y = custom::apply(&LoraDelta { scale: 0.5 }, &[&x, &a, &b])?;
    let want = x.matmul(&a)?.matmul(&b)?.mul_scalar(0.5)?;
    let err = y
        .sub(&want)?
        .abs()?
        .max(-1, false)?
        .max(0, false)?
        .to_vec::<f32>()?[0];
    println!(
        "lora_delta on {dev}: y {:?}, largest difference from two matmuls {err:e}",
        y.shape()
    );
    if let Device::Gpu(g) = &dev {
        println!("CPU fallbacks: {:?}", g.fallback_report());
    }
    Ok(())
}
