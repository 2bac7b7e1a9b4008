//! The reference quantizer of the K-quant Q4_K, a port of ggml's
//! `quantize_row_q4_K_ref` (`ggml-quants.c`) without an importance matrix.
//!
//! A Q4_K super-block holds 256 values as 8 sub-blocks of 32: each sub-block
//! has a 6-bit scale and a 6-bit min, both multiples of the super-block's
//! f16 `d` and `dmin`; a value is `d * scale * q - dmin * min` with a 4-bit
//! `q`. Each sub-block's scale and min are fitted by a weighted least-squares
//! search (`make_qkx2_quants`), then rounded to 6 bits, then the quants are
//! recomputed with the rounded ones. The arithmetic follows ggml's in f32,
//! step by step, so the bytes match its reference output.
//!
//! (Kept apart from `quant.rs`, which holds the simple formats, to be merged
//! with it later.)

use half::f16;
use rayon::prelude::*;

use crate::quant::QK_K;

/// Bytes of a Q4_K super-block: `d`, `dmin` (f16), 12 bytes of packed
/// scales and mins, 128 bytes of quants.
const BLOCK_BYTES: usize = 144;
/// Below this many values, quantize on the calling thread.
const PARALLEL_MIN: usize = 1 << 16;

/// ggml's `nearest_int`: rounds half to even (its float trick does).
fn nearest_int(x: f32) -> i32 {
    x.round_ties_even() as i32
}

/// ggml's `make_qkx2_quants` for `x.len()` values with weights `w`: the
/// quants `l` (0..=nmax) and the (scale, -min) of the best fit
/// `x ≈ scale * l + min`, searching `nstep + 1` scales from
/// `(nmax + rmin) / (max - min)` in steps of `rdelta / (max - min)`, with
/// squared error.
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32; 32],
    w: &[f32; 32],
    l: &mut [u8; 32],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..32 {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..32 {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * q as f32 + min - x[i];
        best_error += w[i] * (diff * diff);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..32 {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let q = q as f32;
            sum_l += w[i] * q;
            sum_l2 += w[i] * q * q;
            sum_xl += w[i] * q * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..32 {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += w[i] * (diff * diff);
            }
            if cur_error < best_error {
                *l = laux;
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `get_scale_min_k4`: sub-block `j`'s 6-bit scale and min.
fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Quantizes one super-block of 256 values.
fn quantize_block(x: &[f32; QK_K], out: &mut [u8; BLOCK_BYTES]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    let (subs, _) = x.as_chunks::<32>();
    let (ls_sub, _) = l.as_chunks_mut::<32>();
    for (j, (xs, ls)) in subs.iter().zip(ls_sub.iter_mut()).enumerate() {
        let sum_x2: f32 = xs.iter().fold(0.0, |s, v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        let w = xs.map(|v| av_x + v.abs());
        (scales[j], mins[j]) = make_qkx2_quants(15, xs, &w, ls, -1.0, 0.1, 20);
        max_scale = max_scale.max(scales[j]);
        max_min = max_min.max(mins[j]);
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        // `as u8` truncates like ggml's assignment of an int to a uint8_t
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);
    for (j, (xs, ls)) in subs.iter().zip(ls_sub.iter_mut()).enumerate() {
        let (sc, m) = scale_min_k4(j, &packed);
        let d = d.to_f32() * f32::from(sc);
        if d == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * f32::from(m);
        for (q, &v) in ls.iter_mut().zip(xs) {
            *q = nearest_int((v + dm) / d).clamp(0, 15) as u8;
        }
    }
    let (head, qs) = out.split_at_mut(16);
    head[..2].copy_from_slice(&d.to_le_bytes());
    head[2..4].copy_from_slice(&dmin.to_le_bytes());
    head[4..].copy_from_slice(&packed);
    // 64 values per 32 bytes: the first 32 in the low nibbles, the next 32
    // in the high ones.
    for (q, l) in qs.chunks_exact_mut(32).zip(l.chunks_exact(64)) {
        for (i, b) in q.iter_mut().enumerate() {
            *b = l[i] | (l[i + 32] << 4);
        }
    }
}

/// Quantizes to Q4_K (ggml's reference algorithm, no importance matrix).
/// The result is `values.len() / 256 * 144` bytes.
///
/// # Panics
///
/// If `values.len()` is not a multiple of 256.
pub fn quantize_q4_k(values: &[f32]) -> Vec<u8> {
    assert!(
        values.len().is_multiple_of(QK_K),
        "quantizing {} values: not a multiple of the super-block size {QK_K}",
        values.len()
    );
    let (src, _) = values.as_chunks::<QK_K>();
    let mut out = vec![0u8; src.len() * BLOCK_BYTES];
    let (dst, _) = out.as_chunks_mut::<BLOCK_BYTES>();
    if values.len() >= PARALLEL_MIN {
        dst.par_iter_mut()
            .zip(src.par_iter())
            .for_each(|(y, x)| quantize_block(x, y));
    } else {
        dst.iter_mut()
            .zip(src)
            .for_each(|(y, x)| quantize_block(x, y));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgmlType;
    use crate::quant;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as f32 / u32::MAX as f32 * 2.0 - 1.0
            })
            .collect()
    }

    fn round_trip(x: &[f32]) -> Vec<f32> {
        let q = quantize_q4_k(x);
        assert_eq!(q.len(), x.len() / 256 * 144);
        quant::dequantize(GgmlType::Q4_K, &q, x.len()).unwrap()
    }

    #[test]
    fn nearest_int_rounds_half_to_even_like_ggml() {
        let got = [0.5f32, 1.5, 2.5, -0.5, -1.5, 2.4999, 7.6].map(nearest_int);
        assert_eq!(got, [0, 2, 2, 0, -2, 2, 8]);
    }

    #[test]
    fn packed_scales_unpack_to_what_was_packed() {
        // every sub-block scale/min pair through the packing and back
        for (ls, lm) in [(0u8, 63u8), (63, 0), (37, 22), (16, 48)] {
            let mut packed = [0u8; 12];
            for j in 0..8 {
                if j < 4 {
                    packed[j] = ls;
                    packed[j + 4] = lm;
                } else {
                    packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
                    packed[j - 4] |= (ls >> 4) << 6;
                    packed[j] |= (lm >> 4) << 6;
                }
            }
            for j in 0..8 {
                assert_eq!(scale_min_k4(j, &packed), (ls, lm), "j {j}");
            }
        }
    }

    #[test]
    fn error_is_small_for_uniform_and_gaussian_like_values() {
        let x = values(256 * 64, 1);
        let y = round_trip(&x);
        let rms = |v: &[f32]| (v.iter().map(|a| a * a).sum::<f32>() / v.len() as f32).sqrt();
        let err: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a - b).collect();
        // 4 bits over a range of 2: a step of 2/15, rms error about step/sqrt(12)
        assert!(rms(&err) < 0.05, "rms error {}", rms(&err));
        let worst = err.iter().fold(0.0f32, |m, e| m.max(e.abs()));
        assert!(worst < 0.15, "worst error {worst}");
    }

    #[test]
    fn constant_and_zero_blocks_are_exact_enough() {
        assert!(round_trip(&[0.0; 256]).iter().all(|&v| v == 0.0));
        let y = round_trip(&[0.25; 512]);
        assert!(y.iter().all(|&v| (v - 0.25).abs() < 2e-3), "{:?}", &y[..4]);
        let y = round_trip(&[-3.0; 256]);
        assert!(y.iter().all(|&v| (v + 3.0).abs() < 0.02), "{:?}", &y[..4]);
    }

    #[test]
    fn values_keep_their_position() {
        // a ramp shows any mix-up of sub-blocks or nibbles
        let x: Vec<f32> = (0..512).map(|i| (i % 256) as f32 / 256.0 - 0.3).collect();
        let y = round_trip(&x);
        for (s, (xs, ys)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
            // a sub-block spans [min(lo, 0), max(hi, 0)] in 15 steps (the
            // min only ever subtracts); allow a bit over half a step
            let lo = xs.iter().fold(0.0f32, |m, &v| m.min(v));
            let hi = xs.iter().fold(0.0f32, |m, &v| m.max(v));
            let bound = (hi - lo) / 15.0 * 0.6;
            for (i, (a, b)) in xs.iter().zip(ys).enumerate() {
                let at = s * 32 + i;
                assert!((a - b).abs() < bound, "element {at}: {b}, want {a}");
            }
        }
    }

    #[test]
    fn parallel_and_serial_agree() {
        let x = values(PARALLEL_MIN * 2, 3);
        let whole = quantize_q4_k(&x);
        let parts: Vec<u8> = x.chunks(256 * 4).flat_map(quantize_q4_k).collect();
        assert_eq!(whole, parts);
    }
}
