//! Attention in f32 on the CPU: the fast path of [`super::nn::attention`]
//! (taken with the 8-bit products, see `crate::cpu_int8_activations`),
//! whose exact f64 version stays the reference of the GPU kernels.
//!
//! One task per query position (all its heads): the scores of the visible
//! keys (a causal query never looks at later keys), their exponentials
//! through a polynomial that vectorizes, and the weighted sum of the value
//! rows. The loops are written for the compiler to vectorize, and compiled
//! a second time for AVX2/FMA and AVX-512 where the processor has them.

use rayon::prelude::*;

use super::PAR_MIN;

/// The inputs of one attention, contiguous.
pub(super) struct Inputs<'a> {
    /// [b, tq, h, d]
    pub q: &'a [f32],
    /// [b, tk, kvh, d]
    pub k: &'a [f32],
    /// [b, tk, kvh, d]
    pub v: &'a [f32],
    /// The compact mask and its strides over (batch, head, query, key).
    pub mask: Option<(&'a [f32], &'a [usize])>,
    /// b, tq, h, d, tk, kvh
    pub dims: [usize; 6],
}

/// `y` [b, tq, h, d] = softmax(q kᵀ · scale + mask) v, keys after a
/// query's position hidden when `causal` (with tk - tq cached positions
/// before the first query).
pub(super) fn attention_f32(x: &Inputs<'_>, scale: f32, causal: bool, y: &mut [f32]) {
    let [_, _, h, d, _, _] = x.dims;
    if d == 0 || h == 0 {
        return;
    }
    let run = |scores: &mut Vec<f32>, (pos, o): (usize, &mut [f32])| {
        position(x, scale, causal, pos, scores, o);
    };
    if y.len() >= PAR_MIN {
        y.par_chunks_mut(h * d)
            .enumerate()
            .for_each_init(Vec::new, run);
    } else {
        let mut scores = Vec::new();
        y.chunks_mut(h * d)
            .enumerate()
            .for_each(|p| run(&mut scores, p));
    }
}

/// The heads of query position `pos` (batch-major) into `o` [h, d].
fn position(
    x: &Inputs<'_>,
    scale: f32,
    causal: bool,
    pos: usize,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        let isa = crate::cpu_isa();
        if isa >= crate::CpuIsa::Avx512 {
            // SAFETY: cpu_isa is never above what the processor has, which covers
            // the features the function is compiled for
            return unsafe { position_avx512(x, scale, causal, pos, scores, o) };
        }
        if isa >= crate::CpuIsa::Avx2 {
            // SAFETY: as above
            return unsafe { position_avx2(x, scale, causal, pos, scores, o) };
        }
    }
    position_any(x, scale, causal, pos, scores, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
fn position_avx512(
    x: &Inputs<'_>,
    scale: f32,
    causal: bool,
    pos: usize,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) {
    position_any(x, scale, causal, pos, scores, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn position_avx2(
    x: &Inputs<'_>,
    scale: f32,
    causal: bool,
    pos: usize,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) {
    position_any(x, scale, causal, pos, scores, o)
}

#[inline(always)]
fn position_any(
    x: &Inputs<'_>,
    scale: f32,
    causal: bool,
    pos: usize,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) {
    let [_, tq, h, d, tk, kvh] = x.dims;
    let (bi, i) = (pos / tq, pos % tq);
    let group = h / kvh;
    let visible = if causal { i + (tk - tq) + 1 } else { tk };
    scores.clear();
    scores.resize(visible, 0.0);
    for (hi, o) in o.chunks_exact_mut(d).enumerate() {
        let kv = hi / group;
        let q = &x.q[(pos * h + hi) * d..][..d];
        let at = |j: usize| ((bi * tk + j) * kvh + kv) * d;
        for (j, s) in scores.iter_mut().enumerate() {
            *s = dot(q, &x.k[at(j)..][..d]) * scale;
        }
        if let Some((m, ms)) = x.mask {
            let at = bi * ms[0] + hi * ms[1] + i * ms[2];
            for (j, s) in scores.iter_mut().enumerate() {
                *s += m[at + j * ms[3]];
            }
        }
        let max = scores.iter().fold(f32::NEG_INFINITY, |a, &s| a.max(s));
        for s in scores.iter_mut() {
            *s = exp(*s - max);
        }
        let sum: f32 = sum(scores);
        o.fill(0.0);
        for (j, &p) in scores.iter().enumerate() {
            for (a, &v) in o.iter_mut().zip(&x.v[at(j)..][..d]) {
                *a += p * v;
            }
        }
        // 0 / 0 = NaN when no key is visible, as in PyTorch
        let inv = 1.0 / sum;
        for a in o.iter_mut() {
            *a *= inv;
        }
    }
}

/// `a · b` in 16 lanes.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ac, at) = a.as_chunks::<16>();
    let (bc, bt) = b.as_chunks::<16>();
    for (x, y) in ac.iter().zip(bc) {
        for l in 0..16 {
            acc[l] += x[l] * y[l];
        }
    }
    let tail: f32 = at.iter().zip(bt).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// The sum of `v` in 16 lanes.
#[inline(always)]
fn sum(v: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (c, t) = v.as_chunks::<16>();
    for x in c {
        for l in 0..16 {
            acc[l] += x[l];
        }
    }
    acc.iter().sum::<f32>() + t.iter().sum::<f32>()
}

/// `e^x` within 2 ulp (Cephes' polynomial on x - n ln 2), 0 below -87
/// (where f32 becomes subnormal), for -∞ and for NaN, +∞ above 88.
/// Branch-free, so that loops over it vectorize.
#[inline(always)]
pub(super) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts: n * C1 is exact for the n that occur
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    let live = x >= -87.0;
    let xc = x.clamp(-87.0, 88.0);
    let n = (xc * LOG2E + 0.5).floor();
    let r = xc - n * C1 - n * C2;
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let e = (p * r).mul_add(r, r) + 1.0;
    // 2^n: n in [-126, 127] here
    let two_n = f32::from_bits(((n as i32 + 127) as u32) << 23);
    let e = if x > 88.0 { f32::INFINITY } else { e * two_n };
    if live { e } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f64 definition, as `nn::attention`'s exact path computes it.
    fn reference(x: &Inputs<'_>, scale: f32, causal: bool) -> Vec<f32> {
        let [b, tq, h, d, tk, kvh] = x.dims;
        let mut y = vec![0f32; b * tq * h * d];
        for (row, o) in y.chunks_exact_mut(d).enumerate() {
            let (bi, i, hi) = (row / (tq * h), (row / h) % tq, row % h);
            let kv = hi / (h / kvh);
            let visible = if causal { i + (tk - tq) + 1 } else { tk };
            let at = |j: usize| ((bi * tk + j) * kvh + kv) * d;
            let mut s: Vec<f64> = (0..visible)
                .map(|j| {
                    let dot: f64 = (0..d)
                        .map(|e| f64::from(x.q[row * d + e]) * f64::from(x.k[at(j) + e]))
                        .sum();
                    let m = x.mask.map_or(0.0, |(m, ms)| {
                        m[bi * ms[0] + hi * ms[1] + i * ms[2] + j * ms[3]]
                    });
                    dot * f64::from(scale) + f64::from(m)
                })
                .collect();
            let max = s.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v));
            for v in &mut s {
                *v = if *v == f64::NEG_INFINITY {
                    0.0
                } else {
                    (*v - max).exp()
                };
            }
            let sum: f64 = s.iter().sum();
            for (e, o) in o.iter_mut().enumerate() {
                let a: f64 = (0..visible).map(|j| s[j] * f64::from(x.v[at(j) + e])).sum();
                *o = (a / sum) as f32;
            }
        }
        y
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        // a small deterministic spread of values in [-2, 2)
        (0..n)
            .map(|i| {
                let t = (i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed * 97);
                (t >> 8) as f32 / (1 << 24) as f32 * 4.0 - 2.0
            })
            .collect()
    }

    #[test]
    fn matches_the_f64_definition() {
        // d past and short of 16 lanes, grouped heads, cached positions
        // before the queries, a mask broadcast over heads with -inf entries
        for &(b, tq, tk, h, kvh, d) in &[
            (1, 1, 1, 1, 1, 16),
            (1, 5, 5, 9, 3, 64),
            (2, 3, 7, 4, 2, 20),
            (1, 130, 130, 2, 1, 64),
            (1, 2, 40, 6, 6, 7),
        ] {
            let q = values(b * tq * h * d, 1);
            let k = values(b * tk * kvh * d, 2);
            let v = values(b * tk * kvh * d, 3);
            let mask: Vec<f32> = (0..b * tq * tk)
                .map(|i| match i % 5 {
                    0 => f32::NEG_INFINITY,
                    1 => -0.5,
                    _ => 0.0,
                })
                .collect();
            let strides = [tq * tk, 0, tk, 1];
            for (causal, masked) in [(true, false), (false, false), (false, true), (true, true)] {
                let x = Inputs {
                    q: &q,
                    k: &k,
                    v: &v,
                    mask: masked.then_some((&mask[..], &strides[..])),
                    dims: [b, tq, h, d, tk, kvh],
                };
                let want = reference(&x, 0.3, causal);
                let mut got = vec![0f32; want.len()];
                attention_f32(&x, 0.3, causal, &mut got);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let same =
                        (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-5 * w.abs().max(1.0);
                    assert!(
                        same,
                        "{:?} causal {causal} mask {masked} [{i}]: {g} vs {w}",
                        x.dims
                    );
                }
            }
        }
    }

    #[test]
    fn exp_is_close_to_the_f64_exp() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let want = f64::from(x).exp();
            let got = f64::from(exp(x));
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_37;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-1000.0), 0.0);
        assert_eq!(exp(f32::NAN), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        let big = f64::from(exp(88.0));
        assert!((big / 88f64.exp() - 1.0).abs() < 3e-7);
    }
}
