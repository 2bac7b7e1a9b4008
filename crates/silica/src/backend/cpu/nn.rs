//! Fused transformer ops on the CPU: norms, rotary embeddings, attention.
//! Sums run in f64, so these are also the references of the GPU kernels.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::{PAR_MIN, host};
use crate::layout::Layout;
use crate::ops::RopeStyle;
use crate::storage::CpuStorage;
use crate::{DType, Tensor};

/// The elements of `t` as contiguous f32: borrowed where `t` is contiguous
/// f32 already, a gathered copy otherwise.
pub(super) fn values(t: &Tensor) -> std::borrow::Cow<'_, [f32]> {
    match host(t) {
        CpuStorage::F32(v) if t.is_contiguous() => {
            let at = t.layout().offset();
            std::borrow::Cow::Borrowed(&v[at..at + t.numel()])
        }
        other => std::borrow::Cow::Owned(other.gather_f32(t.layout())),
    }
}

/// A new vector of `len` values that `f` writes row by row (`f(r, row)`
/// for each row of `n`, in parallel when large), not zeroed first: a pass
/// over the whole output saved. `f` must write every element of its row.
pub(super) fn new_rows(
    len: usize,
    n: usize,
    f: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync + Send,
) -> Vec<f32> {
    if n == 0 || len == 0 {
        return vec![0f32; len];
    }
    let mut y: Vec<f32> = Vec::with_capacity(len);
    let spare = &mut y.spare_capacity_mut()[..len];
    if len >= PAR_MIN {
        spare
            .par_chunks_mut(n)
            .enumerate()
            .for_each(|(r, o)| f(r, o));
    } else {
        spare.chunks_mut(n).enumerate().for_each(|(r, o)| f(r, o));
    }
    // SAFETY: the rows cover the first `len` elements and `f` wrote each
    // (its contract); a panic above leaves the length at 0
    unsafe { y.set_len(len) };
    y
}

/// Runs `f` on each output row of length `n` (in parallel when large).
pub(super) fn map_rows(out: &mut [f32], n: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if n == 0 {
        return;
    }
    if out.len() >= PAR_MIN {
        out.par_chunks_mut(n).enumerate().for_each(|(r, o)| f(r, o));
    } else {
        out.chunks_mut(n).enumerate().for_each(|(r, o)| f(r, o));
    }
}

pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32, out: DType) -> CpuStorage {
    let n = *x.shape().last().unwrap_or(&0);
    let xs = values(x);
    let ws = values(w);
    if super::int8_now() {
        // the fast path: the mean square in f32 lanes
        let isa = crate::cpu_isa();
        let y = new_rows(xs.len(), n, |r, o| {
            rms_norm_row(isa, &xs[r * n..(r + 1) * n], &ws, eps, o)
        });
        return CpuStorage::from_f32(y, out);
    }
    let mut y = vec![0f32; xs.len()];
    map_rows(&mut y, n, |r, o| {
        let row = &xs[r * n..(r + 1) * n];
        let ms = row.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / n as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for ((o, &v), &g) in o.iter_mut().zip(row).zip(ws.iter()) {
            *o = (v as f64 * inv * g as f64) as f32;
        }
    });
    CpuStorage::from_f32(y, out)
}

pub fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f32, out: DType) -> CpuStorage {
    let n = *x.shape().last().unwrap_or(&0);
    let xs = values(x);
    let ws = values(w);
    let bs = values(b);
    if super::int8_now() {
        // the fast path: sums in f32 lanes
        let isa = crate::cpu_isa();
        let y = new_rows(xs.len(), n, |r, o| {
            layer_norm_row(isa, &xs[r * n..(r + 1) * n], &ws, &bs, eps, o)
        });
        return CpuStorage::from_f32(y, out);
    }
    let mut y = vec![0f32; xs.len()];
    map_rows(&mut y, n, |r, o| {
        let row = &xs[r * n..(r + 1) * n];
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        let var = row
            .iter()
            .map(|&v| (v as f64 - mean) * (v as f64 - mean))
            .sum::<f64>()
            / n as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for (i, o) in o.iter_mut().enumerate() {
            *o = ((row[i] as f64 - mean) * inv * ws[i] as f64 + bs[i] as f64) as f32;
        }
    });
    CpuStorage::from_f32(y, out)
}

/// One row of RMSNorm in f32 (the mean square in 16 lanes), through the
/// widest kernel `isa` allows.
fn rms_norm_row(isa: crate::CpuIsa, x: &[f32], w: &[f32], eps: f32, o: &mut [MaybeUninit<f32>]) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= crate::CpuIsa::Avx512 {
            // SAFETY: cpu_isa is never above what the processor has, which
            // covers the features the function is compiled for
            return unsafe { rms_norm_row_avx512(x, w, eps, o) };
        }
        if isa >= crate::CpuIsa::Avx2 {
            // SAFETY: as above
            return unsafe { rms_norm_row_avx2(x, w, eps, o) };
        }
    }
    let _ = isa;
    rms_norm_row_any(x, w, eps, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn rms_norm_row_avx512(x: &[f32], w: &[f32], eps: f32, o: &mut [MaybeUninit<f32>]) {
    rms_norm_row_any(x, w, eps, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn rms_norm_row_avx2(x: &[f32], w: &[f32], eps: f32, o: &mut [MaybeUninit<f32>]) {
    rms_norm_row_any(x, w, eps, o)
}

#[inline(always)]
fn rms_norm_row_any(x: &[f32], w: &[f32], eps: f32, o: &mut [MaybeUninit<f32>]) {
    let ms = lanes_sum::<16>(x, |v| v * v) / x.len() as f32;
    let inv = 1.0 / (ms + eps).sqrt();
    for ((o, &v), &g) in o.iter_mut().zip(x).zip(w) {
        o.write(v * inv * g);
    }
}

/// One row of LayerNorm in f32 (mean, then the variance around it, in 16
/// lanes), through the widest kernel `isa` allows.
fn layer_norm_row(
    isa: crate::CpuIsa,
    x: &[f32],
    w: &[f32],
    b: &[f32],
    eps: f32,
    o: &mut [MaybeUninit<f32>],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= crate::CpuIsa::Avx512 {
            // SAFETY: cpu_isa is never above what the processor has, which
            // covers the features the function is compiled for
            return unsafe { layer_norm_row_avx512(x, w, b, eps, o) };
        }
        if isa >= crate::CpuIsa::Avx2 {
            // SAFETY: as above
            return unsafe { layer_norm_row_avx2(x, w, b, eps, o) };
        }
    }
    let _ = isa;
    layer_norm_row_any(x, w, b, eps, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn layer_norm_row_avx512(x: &[f32], w: &[f32], b: &[f32], eps: f32, o: &mut [MaybeUninit<f32>]) {
    layer_norm_row_any(x, w, b, eps, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn layer_norm_row_avx2(x: &[f32], w: &[f32], b: &[f32], eps: f32, o: &mut [MaybeUninit<f32>]) {
    layer_norm_row_any(x, w, b, eps, o)
}

#[inline(always)]
fn layer_norm_row_any(x: &[f32], w: &[f32], b: &[f32], eps: f32, o: &mut [MaybeUninit<f32>]) {
    let n = x.len() as f32;
    // 64 lanes: four vectors of 16 added independently, so that the
    // sums do not wait on one register's additions
    let mean = lanes_sum::<64>(x, |v| v) / n;
    let var = lanes_sum::<64>(x, |v| (v - mean) * (v - mean)) / n;
    let inv = 1.0 / (var + eps).sqrt();
    for (((o, &v), &g), &c) in o.iter_mut().zip(x).zip(w).zip(b) {
        o.write((v - mean) * inv * g + c);
    }
}

/// The sum of `f` over `x` in `L` lanes (a power of two) folded by halves
/// (a sum in order is a chain of scalar additions, which does not
/// vectorize).
#[inline(always)]
pub(super) fn lanes_sum<const L: usize>(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; L];
    let (chunks, tail) = x.as_chunks::<L>();
    for c in chunks {
        for l in 0..L {
            acc[l] += f(c[l]);
        }
    }
    let mut w = L / 2;
    while w > 0 {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
        w /= 2;
    }
    acc[0] + tail.iter().map(|&v| f(v)).sum::<f32>()
}

pub fn rope(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    style: RopeStyle,
    rotated: usize,
    out: DType,
) -> CpuStorage {
    let r = x.rank();
    let (t, h, d) = (x.shape()[r - 3], x.shape()[r - 2], x.shape()[r - 1]);
    let half = d / 2;
    let xs = values(x);
    let (cs, sn) = (values(cos), values(sin));
    let mut y = vec![0f32; xs.len()];
    map_rows(&mut y, d, |row, o| {
        let pos = (row / h) % t;
        let src = &xs[row * d..(row + 1) * d];
        if row % h >= rotated {
            o.copy_from_slice(src);
            return;
        }
        for i in 0..half {
            let (c, s) = (cs[pos * half + i] as f64, sn[pos * half + i] as f64);
            let (i0, i1) = match style {
                RopeStyle::Adjacent => (2 * i, 2 * i + 1),
                RopeStyle::Half => (i, i + half),
            };
            let (x0, x1) = (src[i0] as f64, src[i1] as f64);
            o[i0] = (x0 * c - x1 * s) as f32;
            o[i1] = (x0 * s + x1 * c) as f32;
        }
    });
    CpuStorage::from_f32(y, out)
}

/// The elements of a view whose broadcast dimensions (stride 0) are kept
/// once, with the strides that index that compact copy (0 where broadcast).
fn compact(t: &Tensor) -> (Vec<f32>, Vec<usize>) {
    let l = t.layout();
    let shape: Vec<usize> = l
        .shape()
        .iter()
        .zip(l.strides())
        .map(|(&n, &s)| if s == 0 { 1 } else { n })
        .collect();
    let view = Layout::new(shape.clone(), l.strides().to_vec(), l.offset());
    let data = host(t).gather_f32(&view);
    let mut strides = vec![0; shape.len()];
    let mut acc = 1;
    for i in (0..shape.len()).rev() {
        strides[i] = if l.strides()[i] == 0 { 0 } else { acc };
        acc *= shape[i];
    }
    (data, strides)
}

/// The f32 storage under `t` [b, tk, kvh, d] from its first element, and
/// its strides over (batch, key, head), when its rows of `d` are contiguous.
fn in_place(t: &Tensor) -> Option<(&[f32], [usize; 3])> {
    let l = t.layout();
    match (host(t), l.strides()) {
        (CpuStorage::F32(v), &[sb, sj, sh, 1]) => Some((&v[l.offset()..], [sb, sj, sh])),
        _ => None,
    }
}

/// `inputs`: `[q, k, v]` or `[q, k, v, mask]`, rank 4 (see `Tensor::attention`).
/// In f32 with the fast CPU path (`super::int8_now`), else in f64: the
/// reference of the GPU kernels.
pub fn attention(inputs: &[&Tensor], scale: f32, causal: bool, out: DType) -> CpuStorage {
    let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
    let [b, tq, h, d] = [q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]];
    let (tk, kvh) = (k.shape()[1], k.shape()[2]);
    let group = h / kvh;
    let packed: (std::borrow::Cow<'_, [f32]>, std::borrow::Cow<'_, [f32]>);
    let mask = inputs.get(3).map(|m| compact(m));
    let mut y = vec![0f32; b * tq * h * d];
    if super::int8_now() {
        let dims = [b, tq, h, d, tk, kvh];
        let qs = values(q);
        let x = match (in_place(k), in_place(v)) {
            // a KV cache's f32 view: read where it lies, no copy a step
            (Some((ks, kst)), Some((vs, vst))) if kst == vst => super::attention::Inputs {
                q: &qs,
                k: ks,
                v: vs,
                kv_strides: kst,
                mask: None,
                dims,
            },
            _ => {
                packed = (values(k), values(v));
                super::attention::Inputs {
                    q: &qs,
                    k: &packed.0,
                    v: &packed.1,
                    kv_strides: super::attention::Inputs::packed_kv(dims),
                    mask: None,
                    dims,
                }
            }
        };
        let x = super::attention::Inputs {
            mask: mask.as_ref().map(|(m, ms)| (&m[..], &ms[..])),
            ..x
        };
        super::attention::attention_f32(&x, scale, causal, &mut y);
        return CpuStorage::from_f32(y, out);
    }
    let (qs, ks, vs) = (values(q), values(k), values(v));
    // one output row per (batch, query, head), as the layout [B, Tq, H, D] orders them
    map_rows(&mut y, d, |row, o| {
        let (bi, i, hi) = (row / (tq * h), (row / h) % tq, row % h);
        let kv = hi / group;
        let qrow = &qs[row * d..(row + 1) * d];
        let visible = if causal { i + (tk - tq) + 1 } else { tk };
        let mut scores = Vec::with_capacity(visible);
        for j in 0..visible {
            let krow = &ks[((bi * tk + j) * kvh + kv) * d..][..d];
            let dot: f64 = qrow
                .iter()
                .zip(krow)
                .map(|(&a, &c)| a as f64 * c as f64)
                .sum();
            let mut s = dot * scale as f64;
            if let Some((m, ms)) = &mask {
                s += m[bi * ms[0] + hi * ms[1] + i * ms[2] + j * ms[3]] as f64;
            }
            scores.push(s);
        }
        let max = scores.iter().fold(f64::NEG_INFINITY, |a, &s| a.max(s));
        let mut acc = vec![0f64; d];
        let mut sum = 0f64;
        for (j, &s) in scores.iter().enumerate() {
            // keys hidden by -inf weigh nothing, even when every key is hidden
            let p = if s == f64::NEG_INFINITY {
                0.0
            } else {
                (s - max).exp()
            };
            sum += p;
            let vrow = &vs[((bi * tk + j) * kvh + kv) * d..][..d];
            for (a, &x) in acc.iter_mut().zip(vrow) {
                *a += p * x as f64;
            }
        }
        for (o, a) in o.iter_mut().zip(&acc) {
            // 0 / 0 = NaN when no key is visible, as in PyTorch
            *o = (a / sum) as f32;
        }
    });
    CpuStorage::from_f32(y, out)
}

#[cfg(test)]
mod tests {
    use super::{layer_norm_row, rms_norm_row};

    #[test]
    fn the_f32_rms_norm_matches_the_f64_one() {
        // rows shorter than, equal to and past 16 lanes, on every path
        for isa in crate::cpu_isa_available() {
            for n in [1usize, 7, 16, 33, 576, 2048] {
                let x: Vec<f32> = (0..n)
                    .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.75)
                    .collect();
                let w: Vec<f32> = (0..n).map(|i| 0.5 + (i % 3) as f32 * 0.25).collect();
                let mut out = vec![std::mem::MaybeUninit::uninit(); n];
                rms_norm_row(isa, &x, &w, 1e-5, &mut out);
                // SAFETY: the row function writes every element
                let got: Vec<f32> = out.iter().map(|v| unsafe { v.assume_init() }).collect();
                let ms = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n as f64;
                let inv = 1.0 / (ms + 1e-5).sqrt();
                for i in 0..n {
                    let want = x[i] as f64 * inv * w[i] as f64;
                    assert!(
                        (got[i] as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "{isa:?} n {n} [{i}]: {} vs {want}",
                        got[i]
                    );
                }
            }
        }
    }

    #[test]
    fn the_f32_layer_norm_matches_the_f64_one() {
        // rows shorter than, equal to and past 16 lanes, with an offset far
        // larger than the spread (where a one-pass variance would cancel)
        for isa in crate::cpu_isa_available() {
            for n in [1usize, 7, 16, 33, 384, 1000] {
                let x: Vec<f32> = (0..n)
                    .map(|i| 100.0 + ((i * 37 % 11) as f32 - 5.0) * 0.25)
                    .collect();
                let w: Vec<f32> = (0..n).map(|i| 0.5 + (i % 3) as f32 * 0.25).collect();
                let b: Vec<f32> = (0..n).map(|i| (i % 5) as f32 * 0.1 - 0.2).collect();
                let mut out = vec![std::mem::MaybeUninit::uninit(); n];
                layer_norm_row(isa, &x, &w, &b, 1e-5, &mut out);
                // SAFETY: the row function writes every element
                let got: Vec<f32> = out.iter().map(|v| unsafe { v.assume_init() }).collect();
                let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
                let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
                let inv = 1.0 / (var + 1e-5).sqrt();
                for i in 0..n {
                    let want = (x[i] as f64 - mean) * inv * w[i] as f64 + b[i] as f64;
                    assert!(
                        (got[i] as f64 - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "{isa:?} n {n} [{i}]: {} vs {want}",
                        got[i]
                    );
                }
            }
        }
    }
}
