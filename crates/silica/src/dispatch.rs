//! Runs an op, built-in or custom, on the device of its inputs, falling
//! back to the CPU where the GPU has no kernel, and compares GPU results
//! with the CPU's in check mode (ARCHITECTURE.md, "How an op runs").

use crate::backend::Backend;
use crate::backend::cpu::CpuBackend;
use crate::custom::{CustomOp, Tolerance};
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
            g.record_fallback(op.name(), first.dtype())?;
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

/// The `SILICA_CHECK` tolerance of `op` with results of `dtype`.
fn check_tolerance(op: &Op, dtype: DType) -> Tolerance {
    match op {
        // The cooperative-matrix kernel of a quantized product with 16-bit
        // activations rounds the decoded weights to f16, as a model
        // dequantized at load holds them. In a sum of K products that
        // rounding's error grows like the outputs' typical size (both like
        // √K), not like the element's, so outputs near zero are allowed
        // 1/32 of the outputs' RMS on top.
        Op::QMatmul { .. } if dtype != DType::F32 => Tolerance {
            rms_share: 1.0 / 32.0,
            ..Tolerance::sums(dtype)
        },
        Op::Matmul | Op::QMatmul { .. } | Op::Reduce(_) | Op::Attention { .. } => {
            Tolerance::sums(dtype)
        }
        Op::RmsNorm { .. } | Op::LayerNorm { .. } => {
            let e = Tolerance::elementwise(dtype);
            Tolerance {
                rel: e.rel * 4.0,
                rms_share: 0.0,
            }
        }
        _ => Tolerance::elementwise(dtype),
    }
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

/// The element of `got` furthest from `reference` beyond `tol` (see
/// [`Tolerance`]), as an error naming the op's input (dtype and shapes);
/// NaN matches NaN.
fn check_close(
    op: &'static str,
    (dtype, shapes): (DType, Vec<Vec<usize>>),
    reference: &[f64],
    got: &Tensor,
    Tolerance {
        rel: tol,
        rms_share,
    }: Tolerance,
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

/// Runs a custom op (see [`crate::custom`]): its CPU reference on the CPU;
/// on a GPU its kernels, else its composition of other ops, else its CPU
/// reference on host copies as a counted fallback.
pub(crate) fn run_custom(
    op: &dyn CustomOp,
    inputs: &[&Tensor],
    in_place: &mut [&mut Tensor],
) -> Result<Tensor> {
    let name = op.name();
    let (device, first_dtype) = {
        let Some(first) = inputs.first().copied().or(in_place.first().map(|t| &**t)) else {
            return Err(Error::InvalidArgument {
                op: name,
                msg: "a custom op needs at least one operand".into(),
            });
        };
        for t in inputs.iter().copied().chain(in_place.iter().map(|t| &**t)) {
            first.same_device(t, name)?;
        }
        (first.device().clone(), first.dtype())
    };
    let (shape, dtype) = {
        let ip: Vec<&Tensor> = in_place.iter().map(|t| &**t).collect();
        op.output(inputs, &ip)?
    };
    let g = match &device {
        Device::Cpu => {
            let out = op.cpu(inputs, in_place)?;
            return expect_output(name, out, &shape, dtype);
        }
        Device::Gpu(g) => g.clone(),
    };
    g.check_alive()?;
    for t in in_place.iter_mut() {
        t.make_own()?;
    }
    let reference = if g.check_mode() {
        Some(cpu_reference(op, inputs, in_place)?)
    } else {
        None
    };
    if !g.is_disabled(name) {
        let ip: Vec<&Tensor> = in_place.iter().map(|t| &**t).collect();
        let mut call = crate::backend::gpu::GpuCall::new(&g, inputs, &ip, &shape, dtype);
        let served = match op.gpu(&mut call) {
            Ok(served) => served,
            Err(Error::NotSupported { .. }) => false,
            Err(e) => return Err(e),
        };
        if served {
            let Some(buf) = call.finish() else {
                return Err(Error::InvalidArgument {
                    op: name,
                    msg: "the GPU kernel ran but produced no output".into(),
                });
            };
            let out = Tensor::from_parts(
                crate::storage::Storage::Gpu(buf),
                &shape,
                dtype,
                device.clone(),
            );
            if let Some((want, want_in_place)) = reference {
                let shapes: Vec<Vec<usize>> = inputs
                    .iter()
                    .chain(&ip)
                    .map(|t| t.shape().to_vec())
                    .collect();
                let input = (first_dtype, shapes);
                let tol = op.tolerance(dtype, 0);
                check_close(name, input.clone(), &want.to_f64_vec()?, &out, tol)?;
                for (i, (w, got)) in want_in_place.iter().zip(&ip).enumerate() {
                    let tol = op.tolerance(got.dtype(), i + 1);
                    check_close(name, input.clone(), &w.to_f64_vec()?, got, tol)?;
                }
            }
            return Ok(out);
        }
    }
    if let Some(out) = op.compose(inputs, in_place)? {
        return expect_output(name, out, &shape, dtype);
    }
    g.record_fallback(name, first_dtype)?;
    let (out, updated) = match reference {
        Some(r) => r,
        None => cpu_reference(op, inputs, in_place)?,
    };
    for (t, host) in in_place.iter_mut().zip(updated) {
        **t = host.to_device(&device)?;
    }
    let out = out.to_device(&device)?;
    expect_output(name, out, &shape, dtype)
}

/// A custom op's CPU reference on host copies of its operands, on the
/// exact CPU path: its output and the updated copies of `in_place`.
fn cpu_reference(
    op: &dyn CustomOp,
    inputs: &[&Tensor],
    in_place: &[&mut Tensor],
) -> Result<(Tensor, Vec<Tensor>)> {
    let host = Device::Cpu;
    let inputs: Vec<Tensor> = inputs
        .iter()
        .map(|t| t.to_device(&host))
        .collect::<Result<_>>()?;
    let mut updated: Vec<Tensor> = in_place
        .iter()
        .map(|t| t.to_device(&host)?.copy())
        .collect::<Result<_>>()?;
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let mut muts: Vec<&mut Tensor> = updated.iter_mut().collect();
    let out = crate::backend::cpu::exact(|| op.cpu(&refs, &mut muts))?;
    Ok((out, updated))
}

/// `out` if it has the shape and dtype the op declared, else an error
/// naming the op (a custom op whose parts disagree).
fn expect_output(name: &'static str, out: Tensor, shape: &[usize], dtype: DType) -> Result<Tensor> {
    if out.shape() == shape && out.dtype() == dtype {
        Ok(out)
    } else {
        Err(Error::InvalidArgument {
            op: name,
            msg: format!(
                "produced {:?} {} where its output was declared {shape:?} {dtype}",
                out.shape(),
                out.dtype()
            ),
        })
    }
}
