//! Elementwise ops on the CPU.

use rayon::prelude::*;

use super::{PAR_MIN, host};
use crate::ops::{BinaryOp, CmpOp, UnaryOp};
use crate::storage::CpuStorage;
use crate::{DType, Tensor};

/// `f` over `0..n`, in parallel for large `n`.
fn map_index<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync + Send) -> Vec<T> {
    if n >= PAR_MIN {
        (0..n).into_par_iter().map(f).collect()
    } else {
        (0..n).map(f).collect()
    }
}

/// Rounds f64 results to f32 the way the GPU stores them, then to `dtype`.
fn finish(values: Vec<f64>, dtype: DType) -> CpuStorage {
    CpuStorage::from_f32(values.into_iter().map(|v| v as f32).collect(), dtype)
}

pub fn unary(op: UnaryOp, x: &Tensor, out: DType) -> CpuStorage {
    let xs = host(x).gather_f32(x.layout());
    finish(map_index(xs.len(), |i| op.apply(xs[i] as f64)), out)
}

pub fn binary(op: BinaryOp, a: &Tensor, b: &Tensor, out: DType) -> CpuStorage {
    let av = host(a).gather_f32(a.layout());
    let bv = host(b).gather_f32(b.layout());
    finish(
        map_index(av.len(), |i| op.apply(av[i] as f64, bv[i] as f64)),
        out,
    )
}

pub fn binary_scalar(op: BinaryOp, a: &Tensor, s: f32, out: DType) -> CpuStorage {
    let av = host(a).gather_f32(a.layout());
    finish(
        map_index(av.len(), |i| op.apply(av[i] as f64, s as f64)),
        out,
    )
}

pub fn compare(op: CmpOp, a: &Tensor, b: &Tensor) -> CpuStorage {
    let av = host(a).gather_f32(a.layout());
    let bv = host(b).gather_f32(b.layout());
    CpuStorage::U32(map_index(av.len(), |i| {
        op.apply(av[i] as f64, bv[i] as f64) as u32
    }))
}

/// Conversion between any two dtypes: float targets round to nearest even,
/// integer targets truncate toward zero and saturate.
pub fn cast(x: &Tensor, out: DType) -> CpuStorage {
    let src = host(x).gather(x.layout());
    match (&src, out) {
        // integer to integer without a detour through floating point
        (CpuStorage::U32(v), DType::I64) => CpuStorage::I64(v.iter().map(|&x| x as i64).collect()),
        (CpuStorage::I64(v), DType::U32) => CpuStorage::U32(
            v.iter()
                .map(|&x| x.clamp(0, u32::MAX as i64) as u32)
                .collect(),
        ),
        _ => {
            // every float (and u32 up to 2^24) is exact in f32, as in the GPU kernel
            let values: Vec<f64> = src.to_f64().iter().map(|&v| v as f32 as f64).collect();
            CpuStorage::from_f64(&values, out)
        }
    }
}
