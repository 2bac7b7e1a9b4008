//! Runs an op on the device of its inputs, falling back to the CPU where
//! the GPU has no kernel (ARCHITECTURE.md §3).

use crate::backend::Backend;
use crate::backend::cpu::CpuBackend;
use crate::storage::{CpuStorage, Storage};
use crate::{DType, Device, Error, Op, Result, Tensor};

/// Runs `op` on `inputs` (all on one device), producing a new contiguous
/// tensor of `out_shape` and `out_dtype` on that device.
pub(crate) fn run(
    op: Op,
    inputs: &[&Tensor],
    out_shape: Vec<usize>,
    out_dtype: DType,
) -> Result<Tensor> {
    let first = inputs[0];
    if !op.accepts(first.dtype()) {
        return Err(Error::UnsupportedDType {
            op: op.name(),
            dtype: first.dtype(),
        });
    }
    let device = first.device().clone();
    match &device {
        Device::Cpu => {
            let out = CpuBackend.execute(&op, inputs, &out_shape, out_dtype)?;
            Ok(Tensor::from_parts(out, &out_shape, out_dtype, device))
        }
        Device::Gpu(g) => {
            g.check_alive()?;
            if g.has_kernel(&op, inputs) {
                match g.execute(&op, inputs, &out_shape, out_dtype) {
                    Ok(out) => {
                        let t = Tensor::from_parts(out, &out_shape, out_dtype, device.clone());
                        if g.check_mode() {
                            check_against_cpu(&op, inputs, &t)?;
                        }
                        return Ok(t);
                    }
                    Err(Error::NotSupported { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            g.record_fallback(&op, first.dtype())?;
            let out = run_on_cpu(&op, inputs, &out_shape, out_dtype)?;
            Tensor::from_cpu(out, &out_shape, &device)
        }
    }
}

/// Runs `op` with the CPU kernel on host copies of `inputs`.
fn run_on_cpu(
    op: &Op,
    inputs: &[&Tensor],
    out_shape: &[usize],
    out_dtype: DType,
) -> Result<CpuStorage> {
    let host: Vec<Tensor> = inputs
        .iter()
        .map(|t| t.to_device(&Device::Cpu))
        .collect::<Result<_>>()?;
    let refs: Vec<&Tensor> = host.iter().collect();
    match CpuBackend.execute(op, &refs, out_shape, out_dtype)? {
        Storage::Cpu(c, _) => Ok(c),
        // invariant: the CPU backend only produces host storage
        Storage::Gpu(_) => unreachable!("the CPU backend returned GPU storage"),
    }
}

/// Tolerance of `SILICA_CHECK`: element i of a result may differ from the
/// CPU's r by `rel * (1 + |r_i|) + rel * rms_share * rms(r)`.
#[derive(Clone, Copy)]
struct CheckTol {
    rel: f64,
    rms_share: f64,
}

/// The `SILICA_CHECK` tolerance of `op` with results of `dtype`.
fn check_tolerance(op: &Op, dtype: DType) -> CheckTol {
    let base = match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        DType::U32 | DType::I64 => 0.0,
    };
    let rel = match op {
        // sums of many rounded products
        Op::Matmul | Op::QMatmul { .. } | Op::Reduce(_) | Op::Attention { .. } => base * 10.0,
        Op::RmsNorm { .. } | Op::LayerNorm { .. } => base * 4.0,
        _ => base,
    };
    // The cooperative-matrix kernel of a quantized product with 16-bit
    // activations rounds the decoded weights to f16, as a model dequantized
    // at load holds them. In a sum of K products that rounding's error
    // grows like the outputs' typical size (both like √K), not like the
    // element's, so outputs near zero are allowed 1/32 of the outputs' RMS
    // at the op's tolerance on top.
    let rms_share = match op {
        Op::QMatmul { .. } if dtype != DType::F32 => 1.0 / 32.0,
        _ => 0.0,
    };
    CheckTol { rel, rms_share }
}

/// `SILICA_CHECK=1`: compares a GPU result with the CPU kernel's.
fn check_against_cpu(op: &Op, inputs: &[&Tensor], gpu_out: &Tensor) -> Result<()> {
    // the exact CPU path: 8-bit activations (`cpu_int8_activations`) would
    // differ from a correct GPU result by more than the tolerance
    let reference =
        crate::backend::cpu::exact(|| run_on_cpu(op, inputs, gpu_out.shape(), gpu_out.dtype()))?
            .to_f64();
    let tol = check_tolerance(op, gpu_out.dtype());
    let shapes = inputs.iter().map(|t| t.shape().to_vec()).collect();
    let input = (inputs[0].dtype(), shapes);
    check_close(op.name(), input, &reference, gpu_out, tol)
}

/// `SILICA_CHECK=1` for a fused step of several ops: compares the GPU's
/// result `got` with `reference` (the same ops' CPU results, in f64) at
/// the tolerance of `like` (the op whose rounding the step shares).
pub(crate) fn check_fused(
    name: &'static str,
    like: &Op,
    shapes: Vec<Vec<usize>>,
    reference: &Tensor,
    got: &Tensor,
) -> Result<()> {
    let tol = check_tolerance(like, got.dtype());
    check_close(
        name,
        (got.dtype(), shapes),
        &reference.to_f64_vec()?,
        got,
        tol,
    )
}

/// The element of `got` furthest from `reference` beyond `tol` (see
/// [`CheckTol`]), as an error naming the op's input (dtype and shapes);
/// NaN matches NaN.
fn check_close(
    op: &'static str,
    (dtype, shapes): (DType, Vec<Vec<usize>>),
    reference: &[f64],
    got: &Tensor,
    CheckTol {
        rel: tol,
        rms_share,
    }: CheckTol,
) -> Result<()> {
    let floor = if rms_share > 0.0 {
        let mean_sq = reference.iter().map(|r| r * r).sum::<f64>() / reference.len().max(1) as f64;
        tol * rms_share * mean_sq.sqrt()
    } else {
        0.0
    };
    let gpu_out = got;
    let got = gpu_out.to_f64_vec()?;
    let mut worst: Option<(usize, f64)> = None;
    for (i, (g, r)) in got.iter().zip(reference).enumerate() {
        let both_nan = g.is_nan() && r.is_nan();
        let err = if both_nan || g == r {
            0.0
        } else {
            (g - r).abs()
        };
        let bad = err.is_nan() || err > tol * (1.0 + r.abs()) + floor;
        if bad && worst.is_none_or(|(_, w)| err > w || err.is_nan()) {
            worst = Some((i, err));
        }
    }
    match worst {
        None => Ok(()),
        Some((index, max_abs_err)) => Err(Error::CheckFailed {
            op,
            device: gpu_out.device().to_string(),
            dtype,
            shapes,
            max_abs_err,
            index,
            tolerance: tol,
        }),
    }
}
