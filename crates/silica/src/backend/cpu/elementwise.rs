//! Elementwise ops on the CPU.

use std::mem::MaybeUninit;

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
    if op == UnaryOp::GeluErf && super::int8_now() {
        // a contiguous f32 x is read where it lies
        if let (CpuStorage::F32(v), true) = (host(x), x.is_contiguous()) {
            let at = x.layout().offset();
            return CpuStorage::from_f32(gelu_erf_f32(&v[at..at + x.numel()]), out);
        }
        return CpuStorage::from_f32(gelu_erf_f32(&host(x).gather_f32(x.layout())), out);
    }
    let xs = host(x).gather_f32(x.layout());
    finish(map_index(xs.len(), |i| op.apply(xs[i] as f64)), out)
}

pub fn binary(op: BinaryOp, a: &Tensor, b: &Tensor, out: DType) -> CpuStorage {
    if let Some(y) = binary_f32(op, a, b, out) {
        return CpuStorage::F32(y);
    }
    let av = host(a).gather_f32(a.layout());
    let bv = host(b).gather_f32(b.layout());
    if op == BinaryOp::SiluMul && super::int8_now() {
        return CpuStorage::from_f32(silu_mul_f32(&av, &bv), out);
    }
    finish(
        map_index(av.len(), |i| op.apply(av[i] as f64, bv[i] as f64)),
        out,
    )
}

/// `a op b` for f32 operands and result of +, −, × and ÷,
/// `a` contiguous and `b` contiguous or one row repeated (a bias): in f32
/// straight into the result, without gathering either operand. The f64
/// reference rounds to the same f32 for these operations (a double has
/// more than twice a float's precision plus two bits), so the results are
/// identical; `None` for every other case.
fn binary_f32(op: BinaryOp, a: &Tensor, b: &Tensor, out: DType) -> Option<Vec<f32>> {
    // one copy of the loop per operation, so that each is vectorized
    match op {
        BinaryOp::Add => binary_f32_with(a, b, out, |x, y| x + y),
        BinaryOp::Sub => binary_f32_with(a, b, out, |x, y| x - y),
        BinaryOp::Mul => binary_f32_with(a, b, out, |x, y| x * y),
        BinaryOp::Div => binary_f32_with(a, b, out, |x, y| x / y),
        _ => None,
    }
}

fn binary_f32_with(
    a: &Tensor,
    b: &Tensor,
    out: DType,
    f: impl Fn(f32, f32) -> f32 + Sync,
) -> Option<Vec<f32>> {
    let (CpuStorage::F32(av), CpuStorage::F32(bv)) = (host(a), host(b)) else {
        return None;
    };
    let (la, lb) = (a.layout(), b.layout());
    if out != DType::F32 || !la.is_contiguous() || la.shape() != lb.shape() {
        return None;
    }
    let n = la.numel();
    let x = &av[la.offset()..la.offset() + n];
    let row = *la.shape().last()?;
    let (bo, strides) = (lb.offset(), lb.strides());
    // b's elements for one row of a: its own (b contiguous) or the one
    // repeated row
    let repeated = strides
        .split_last()
        .is_some_and(|(&last, outer)| (last == 1 || row == 1) && outer.iter().all(|&s| s == 0));
    let contiguous = lb.is_contiguous();
    let span = match (contiguous, repeated) {
        (true, _) => n,
        (false, true) => row,
        (false, false) => return None,
    };
    if row == 0 || bv.len() < bo + span {
        return None;
    }
    let b_row = |e: usize| match contiguous {
        true => &bv[bo + e..bo + e + row],
        false => &bv[bo..bo + row],
    };
    // whole rows a task (a run of at least 4,096 elements), written once
    // without zeroing first
    let rows_per_task = 4096usize.div_ceil(row).max(1);
    let y = super::nn::new_rows(n, rows_per_task * row, |t, ys| {
        let e0 = t * rows_per_task * row;
        for (r, yr) in ys.chunks_mut(row).enumerate() {
            let e = e0 + r * row;
            let (xr, br) = (&x[e..e + yr.len()], b_row(e));
            for ((o, &p), &q) in yr.iter_mut().zip(xr).zip(br) {
                o.write(f(p, q));
            }
        }
    });
    Some(y)
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

/// `silu(a) * b` in f32 with the vectorized exponential: the fast CPU
/// path (`super::int8_now`) of the SwiGLU activation.
fn silu_mul_f32(a: &[f32], b: &[f32]) -> Vec<f32> {
    const RUN: usize = 4096;
    super::nn::new_rows(a.len(), RUN, |i, y| {
        let (a, b) = (&a[i * RUN..][..y.len()], &b[i * RUN..][..y.len()]);
        silu_mul_run(a, b, y);
    })
}

fn silu_mul_run(a: &[f32], b: &[f32], y: &mut [MaybeUninit<f32>]) {
    #[cfg(target_arch = "x86_64")]
    {
        let isa = crate::cpu_isa();
        if isa >= crate::CpuIsa::Avx512 {
            // SAFETY: cpu_isa is never above what the processor has, which covers
            // the features the function is compiled for
            return unsafe { silu_mul_avx512(a, b, y) };
        }
        if isa >= crate::CpuIsa::Avx2 {
            // SAFETY: as above
            return unsafe { silu_mul_avx2(a, b, y) };
        }
    }
    silu_mul_any::<{ super::attention::FMA_IN_TARGET }>(a, b, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn silu_mul_avx512(a: &[f32], b: &[f32], y: &mut [MaybeUninit<f32>]) {
    silu_mul_any::<true>(a, b, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn silu_mul_avx2(a: &[f32], b: &[f32], y: &mut [MaybeUninit<f32>]) {
    silu_mul_any::<true>(a, b, y)
}

#[inline(always)]
fn silu_mul_any<const FUSED: bool>(a: &[f32], b: &[f32], y: &mut [MaybeUninit<f32>]) {
    for ((y, &a), &b) in y.iter_mut().zip(a).zip(b) {
        y.write(a / (1.0 + super::attention::exp::<FUSED>(-a)) * b);
    }
}

/// GELU (erf form) in f32 with a vectorized erf: the fast CPU path
/// (`super::int8_now`) of BERT's activation, where the f64 `erf` took a
/// fifth of an encoder's time.
fn gelu_erf_f32(x: &[f32]) -> Vec<f32> {
    const RUN: usize = 4096;
    super::nn::new_rows(x.len(), RUN, |i, y| {
        gelu_erf_run(&x[i * RUN..][..y.len()], y)
    })
}

fn gelu_erf_run(x: &[f32], y: &mut [MaybeUninit<f32>]) {
    #[cfg(target_arch = "x86_64")]
    {
        let isa = crate::cpu_isa();
        if isa >= crate::CpuIsa::Avx512 {
            // SAFETY: cpu_isa is never above what the processor has, which
            // covers the features the function is compiled for
            return unsafe { gelu_erf_avx512(x, y) };
        }
        if isa >= crate::CpuIsa::Avx2 {
            // SAFETY: as above
            return unsafe { gelu_erf_avx2(x, y) };
        }
    }
    gelu_erf_any::<{ super::attention::FMA_IN_TARGET }>(x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn gelu_erf_avx512(x: &[f32], y: &mut [MaybeUninit<f32>]) {
    gelu_erf_any::<true>(x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn gelu_erf_avx2(x: &[f32], y: &mut [MaybeUninit<f32>]) {
    gelu_erf_any::<true>(x, y)
}

#[inline(always)]
fn gelu_erf_any<const FUSED: bool>(x: &[f32], y: &mut [MaybeUninit<f32>]) {
    for (y, &x) in y.iter_mut().zip(x) {
        y.write(0.5 * x * (1.0 + erf_f32::<FUSED>(x * std::f32::consts::FRAC_1_SQRT_2)));
    }
}

/// erf to within 1.5e-7 (Abramowitz and Stegun 7.1.26), branch-free so
/// that loops over it vectorize.
#[inline(always)]
fn erf_f32<const FUSED: bool>(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_8 + t * (-1.453_152 + t * 1.061_405_4))));
    (1.0 - poly * super::attention::exp::<FUSED>(-a * a)).copysign(x)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_erf_f32_matches_the_f64_definition() {
        let mut x: Vec<f32> = (0..40_000)
            .map(|i| (i as f32 - 20_000.0) * 0.0005)
            .collect();
        x.extend([0.0, -0.0, 6.0, -6.0, 100.0, -100.0]);
        let got = gelu_erf_f32(&x);
        for (&g, &x) in got.iter().zip(&x) {
            let want = UnaryOp::GeluErf.apply(f64::from(x)) as f32;
            assert!(
                (g - want).abs() <= 2e-6 * want.abs().max(x.abs()) + 1e-7,
                "gelu({x}): {g} vs {want}"
            );
        }
        // as the definition: -∞ · 0 is NaN
        let inf = gelu_erf_f32(&[f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
        assert_eq!(inf[0], f32::INFINITY);
        assert!(UnaryOp::GeluErf.apply(f64::NEG_INFINITY).is_nan());
        assert!(inf[1].is_nan() && inf[2].is_nan(), "{inf:?}");
    }

    #[test]
    fn silu_mul_f32_matches_the_f64_definition() {
        let mut a: Vec<f32> = (0..40_000).map(|i| (i as f32 - 20_000.0) * 0.005).collect();
        a.extend([
            0.0,
            -0.0,
            100.0,
            -100.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        let b: Vec<f32> = (0..a.len()).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let got = silu_mul_f32(&a, &b);
        for ((&g, &x), &y) in got.iter().zip(&a).zip(&b) {
            let want = BinaryOp::SiluMul.apply(f64::from(x), f64::from(y)) as f32;
            let same = (g.is_nan() && want.is_nan())
                || g == want
                || (g - want).abs() <= 1e-6 * want.abs() + 1e-30;
            assert!(same, "silu({x}) * {y}: {g} vs {want}");
        }
    }

    /// The f32 path of +, −, ×, ÷ gives the f64 reference's results bit
    /// for bit: a contiguous operand, a repeated row (a bias), a row of
    /// one element, offsets, shapes over and under the parallel threshold,
    /// and the special values.
    #[test]
    fn binary_f32_equals_the_f64_reference() {
        let dev = crate::Device::Cpu;
        let mut special = vec![
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-40,
        ];
        special.extend((0..58).map(|i| (i as f32 - 29.0) * 0.37));
        for (rows, row) in [(3usize, 64usize), (700, 37), (1, 5), (9, 1)] {
            let n = rows * row;
            let av: Vec<f32> = (0..n + 3)
                .map(|i| special[(i * 7) % special.len()] * 1.5)
                .collect();
            let bv: Vec<f32> = (0..n + 3)
                .map(|i| special[(i * 11 + 3) % special.len()])
                .collect();
            let a = Tensor::from_vec(av, &[n + 3], &dev)
                .unwrap()
                .narrow(0, 3, n)
                .unwrap()
                .reshape(&[rows, row])
                .unwrap();
            let full = Tensor::from_vec(bv.clone(), &[n + 3], &dev)
                .unwrap()
                .narrow(0, 2, n)
                .unwrap()
                .reshape(&[rows, row])
                .unwrap();
            let bias = Tensor::from_vec(bv[..row + 1].to_vec(), &[row + 1], &dev)
                .unwrap()
                .narrow(0, 1, row)
                .unwrap();
            let bias = bias.broadcast_to(&[rows, row]).unwrap();
            for b in [&full, &bias] {
                for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
                    let got = binary_f32(op, &a, b, DType::F32).expect("the f32 path takes it");
                    let (x, y) = (
                        host(&a).gather_f32(a.layout()),
                        host(b).gather_f32(b.layout()),
                    );
                    for (i, &g) in got.iter().enumerate() {
                        let want = op.apply(x[i] as f64, y[i] as f64) as f32;
                        assert!(
                            g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                            "{op:?} [{rows}, {row}] at {i}: {} and {}: {g} vs {want}",
                            x[i],
                            y[i]
                        );
                    }
                }
            }
            // not taken: another output dtype, or an operation without the guarantee
            assert!(binary_f32(BinaryOp::Add, &a, &full, DType::F16).is_none());
            assert!(binary_f32(BinaryOp::Pow, &a, &full, DType::F32).is_none());
        }
    }
}
