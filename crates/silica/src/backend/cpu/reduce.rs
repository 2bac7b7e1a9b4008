//! Reductions and softmax over the last dimension, on the CPU.

use rayon::prelude::*;

use super::{PAR_MIN, host};
use crate::ops::ReduceOp;
use crate::storage::CpuStorage;
use crate::{DType, Tensor};

/// The rows of the last dimension of `x`, contiguous, as f32.
fn rows(x: &Tensor) -> (Vec<f32>, usize) {
    let n = *x.shape().last().unwrap_or(&1);
    (host(x).gather_f32(x.layout()), n)
}

/// The number of rows of the last dimension.
fn row_count(x: &Tensor) -> usize {
    x.shape()[..x.rank() - 1].iter().product()
}

/// `f` over each row of length `n`, in parallel when the data is large.
fn per_row<T: Send>(
    data: &[f32],
    n: usize,
    count: usize,
    f: impl Fn(&[f32]) -> T + Sync + Send,
) -> Vec<T> {
    let row = |r: usize| f(&data[r * n..(r + 1) * n]);
    if count * n.max(1) >= PAR_MIN {
        (0..count).into_par_iter().map(row).collect()
    } else {
        (0..count).map(row).collect()
    }
}

pub fn reduce(op: ReduceOp, x: &Tensor, out: DType) -> CpuStorage {
    let (data, n) = rows(x);
    let count = x.numel() / n.max(1);
    // an empty reduced dimension: sums are 0, means NaN (as in PyTorch)
    let count = if n == 0 {
        x.shape()[..x.rank() - 1].iter().product()
    } else {
        count
    };
    let values: Vec<f64> = per_row(&data, n, count, |r| match op {
        ReduceOp::Sum => r.iter().map(|&v| v as f64).sum(),
        ReduceOp::Mean => r.iter().map(|&v| v as f64).sum::<f64>() / n as f64,
        ReduceOp::Max => r.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64)),
        ReduceOp::Min => r.iter().fold(f64::INFINITY, |m, &v| m.min(v as f64)),
        ReduceOp::Argmax => first_best(r, |a, b| a > b) as f64,
        ReduceOp::Argmin => first_best(r, |a, b| a < b) as f64,
    });
    if out == DType::U32 {
        return CpuStorage::U32(values.iter().map(|&v| v as u32).collect());
    }
    CpuStorage::from_f32(values.into_iter().map(|v| v as f32).collect(), out)
}

/// Index of the first element that no later element beats.
fn first_best(r: &[f32], better: impl Fn(f32, f32) -> bool) -> usize {
    let mut best = 0;
    for (i, &v) in r.iter().enumerate().skip(1) {
        if better(v, r[best]) {
            best = i;
        }
    }
    best
}

pub fn softmax(x: &Tensor, log: bool, out: DType) -> CpuStorage {
    if super::int8_now() && !log {
        return softmax_fast(x, out);
    }
    let (data, n) = rows(x);
    let count = row_count(x);
    let result: Vec<Vec<f32>> = per_row(&data, n, count, |r| {
        let max = r.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let sum: f64 = r.iter().map(|&v| (v as f64 - max).exp()).sum();
        if log {
            let lse = max + sum.ln();
            r.iter().map(|&v| (v as f64 - lse) as f32).collect()
        } else {
            r.iter()
                .map(|&v| ((v as f64 - max).exp() / sum) as f32)
                .collect()
        }
    });
    CpuStorage::from_f32(result.concat(), out)
}

/// Softmax in f32 (the fast path): each row's maximum, then `e^(x - max)`
/// through the vectorizable exponential of the attention kernels, then a
/// scale by 1 / their sum in 16 lanes, written once into the output.
fn softmax_fast(x: &Tensor, out: DType) -> CpuStorage {
    let n = *x.shape().last().unwrap_or(&0);
    let data = super::nn::values(x);
    let isa = crate::cpu_isa();
    let y = super::nn::new_rows(data.len(), n, |r, o| {
        super::attention::softmax_row(isa, &data[r * n..(r + 1) * n], o)
    });
    CpuStorage::from_f32(y, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    /// The f32 softmax against the f64 one: rows of several lengths (the
    /// 16-lane tails), masked entries (-inf) and a row with a NaN (all NaN
    /// on both paths).
    #[test]
    fn the_fast_softmax_agrees_with_the_exact_one() {
        for n in [1usize, 7, 16, 37, 300, 4096] {
            let mut v: Vec<f32> = (0..3 * n)
                .map(|i| ((i * 7919) % 1000) as f32 / 50.0 - 10.0)
                .collect();
            v[0] = f32::NEG_INFINITY;
            if n > 1 {
                v[n + 1] = f32::NAN;
            }
            let x = Tensor::from_vec(v, &[3, n], &Device::Cpu).unwrap();
            let CpuStorage::F32(fast) = softmax_fast(&x, DType::F32) else {
                unreachable!()
            };
            let CpuStorage::F32(exact) =
                crate::backend::cpu::exact(|| softmax(&x, false, DType::F32))
            else {
                unreachable!()
            };
            for (i, (a, b)) in fast.iter().zip(&exact).enumerate() {
                if b.is_nan() {
                    assert!(a.is_nan(), "n {n} at {i}: {a} against NaN");
                } else {
                    assert!(
                        (a - b).abs() <= 2e-6 * b.abs() + 1e-12,
                        "n {n} at {i}: {a} against {b}"
                    );
                }
            }
        }
    }
}
