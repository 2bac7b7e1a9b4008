//! GGML block formats: the layouts silica keeps quantized weights in, their
//! dequantization to f32, and the reference quantizers for Q8_0, Q4_0 and
//! Q4_1.
//!
//! The layouts and arithmetic follow ggml's reference code
//! (`ggml-quants.c`): a quantized row is a sequence of blocks, each holding
//! its scale(s) as f16 and its quants packed as bits. Large inputs are
//! decoded in parallel over blocks.

use std::fmt;

use half::f16;
use rayon::prelude::*;

/// Elements per block of the simple formats (Q4_0 ... Q8_0).
pub const QK: usize = 32;
/// Elements per super-block of the K-quants.
pub const QK_K: usize = 256;
/// Below this many elements, decode on the calling thread.
const PARALLEL_MIN: usize = 1 << 16;
/// Elements per rayon task (at least).
const TASK_MIN: usize = 1 << 14;

/// A GGML block format in which silica keeps weights quantized
/// ([`crate::QTensor`]).
#[allow(non_camel_case_types)] // the GGML names
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// 32 values: f16 scale, 32 signed bytes (8.5 bits per weight).
    Q8_0,
    /// 32 values: f16 scale, 4-bit quants minus 8 (4.5 bits).
    Q4_0,
    /// 32 values: f16 scale and minimum, 4-bit quants (5 bits).
    Q4_1,
    /// 32 values: f16 scale, 5-bit quants minus 16 (5.5 bits).
    Q5_0,
    /// 32 values: f16 scale and minimum, 5-bit quants (6 bits).
    Q5_1,
    /// 256 values: f16 scale and minimum, 6-bit sub-block scales and
    /// minimums, 4-bit quants (4.5 bits).
    Q4_K,
    /// As Q4_K with 5-bit quants (5.5 bits).
    Q5_K,
    /// 256 values: 6-bit quants minus 32, an 8-bit scale per 16 (6.5625 bits).
    Q6_K,
}

impl QuantFormat {
    /// Every format, in a stable order.
    pub const ALL: [QuantFormat; 8] = [
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q5_0,
        QuantFormat::Q5_1,
        QuantFormat::Q4_K,
        QuantFormat::Q5_K,
        QuantFormat::Q6_K,
    ];

    /// Values per block.
    pub fn block_elems(self) -> usize {
        match self {
            QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K => QK_K,
            _ => QK,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantFormat::Q8_0 => 34,
            QuantFormat::Q4_0 => 18,
            QuantFormat::Q4_1 => 20,
            QuantFormat::Q5_0 => 22,
            QuantFormat::Q5_1 => 24,
            QuantFormat::Q4_K => 144,
            QuantFormat::Q5_K => 176,
            QuantFormat::Q6_K => 210,
        }
    }

    /// The GGML name: `q8_0`, `q4_k`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            QuantFormat::Q8_0 => "q8_0",
            QuantFormat::Q4_0 => "q4_0",
            QuantFormat::Q4_1 => "q4_1",
            QuantFormat::Q5_0 => "q5_0",
            QuantFormat::Q5_1 => "q5_1",
            QuantFormat::Q4_K => "q4_k",
            QuantFormat::Q5_K => "q5_k",
            QuantFormat::Q6_K => "q6_k",
        }
    }

    /// Bytes of `n` values (`n` a multiple of [`Self::block_elems`]).
    pub fn bytes_for(self, n: usize) -> usize {
        n / self.block_elems() * self.block_bytes()
    }

    /// The code that WGSL kernels use for this format (`FMT`).
    pub(crate) fn gpu_code(self) -> u32 {
        self as u32
    }

    /// Decodes whole blocks of this format from `bytes` into `out`
    /// (`out.len()` values: `bytes` must hold exactly that many).
    pub(crate) fn decode_into(self, bytes: &[u8], out: &mut [f32]) {
        match self {
            QuantFormat::Q8_0 => blocks(bytes, out, dequantize_q8_0),
            QuantFormat::Q4_0 => blocks(bytes, out, dequantize_q4_0),
            QuantFormat::Q4_1 => blocks(bytes, out, dequantize_q4_1),
            QuantFormat::Q5_0 => blocks(bytes, out, dequantize_q5_0),
            QuantFormat::Q5_1 => blocks(bytes, out, dequantize_q5_1),
            QuantFormat::Q4_K => blocks(bytes, out, dequantize_q4_k),
            QuantFormat::Q5_K => blocks(bytes, out, dequantize_q5_k),
            QuantFormat::Q6_K => blocks(bytes, out, dequantize_q6_k),
        }
    }
}

impl fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Decodes whole blocks of `format` (a partial trailing block of `bytes` is
/// ignored), in parallel for large inputs.
pub fn dequantize(format: QuantFormat, bytes: &[u8]) -> Vec<f32> {
    let n = bytes.len() / format.block_bytes() * format.block_elems();
    let mut out = vec![0.0f32; n];
    let used = format.bytes_for(n);
    if n >= PARALLEL_MIN {
        let per_task = TASK_MIN.next_multiple_of(format.block_elems());
        out.par_chunks_mut(per_task)
            .zip(bytes[..used].par_chunks(format.bytes_for(per_task)))
            .for_each(|(y, x)| format.decode_into(x, y));
    } else {
        format.decode_into(&bytes[..used], &mut out);
    }
    out
}

/// Applies `f` to each `TS`-byte block of `bytes`, giving `BS` values per
/// block into `out`.
fn blocks<const TS: usize, const BS: usize>(
    bytes: &[u8],
    out: &mut [f32],
    f: impl Fn(&[u8; TS], &mut [f32; BS]),
) {
    let (src, _) = bytes.as_chunks::<TS>();
    let (dst, _) = out.as_chunks_mut::<BS>();
    dst.iter_mut().zip(src).for_each(|(y, x)| f(x, y));
}

/// An f16 from its little-endian bytes, as f32, exactly (subnormals,
/// infinities and NaN included). Inlined and branch-free: the magnitude's
/// bits moved into f32 position and scaled by 2^112 rebias the exponent
/// (and normalize subnormals); only infinities and NaN need their exponent
/// set apart. `half`'s conversion chooses an implementation at run time,
/// which costs more than the rest of a block's decoding.
#[inline(always)]
pub(crate) fn f16_le(lo: u8, hi: u8) -> f32 {
    let h = u32::from(u16::from_le_bytes([lo, hi]));
    let mag = h & 0x7fff;
    let scaled = f32::from_bits(mag << 13) * f32::from_bits(0x7780_0000);
    let bits = if mag >= 0x7c00 {
        0x7f80_0000 | ((mag & 0x3ff) << 13)
    } else {
        scaled.to_bits()
    };
    f32::from_bits(bits | ((h & 0x8000) << 16))
}

/// Q8_0: f16 d, i8 qs[32]; x = d * q.
fn dequantize_q8_0(x: &[u8; 34], y: &mut [f32; 32]) {
    let d = f16_le(x[0], x[1]);
    for (y, &q) in y.iter_mut().zip(&x[2..]) {
        *y = f32::from(i8::from_le_bytes([q])) * d;
    }
}

/// Q4_0: f16 d, u8 qs[16]; element j is the low nibble of qs[j], element
/// j + 16 the high one; x = d * (q - 8).
fn dequantize_q4_0(x: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_le(x[0], x[1]);
    let (lo, hi) = y.split_at_mut(QK / 2);
    for ((&q, a), b) in x[2..].iter().zip(lo).zip(hi) {
        *a = f32::from(i16::from(q & 0xF) - 8) * d;
        *b = f32::from(i16::from(q >> 4) - 8) * d;
    }
}

/// Q4_1: f16 d, f16 m, u8 qs[16]; nibbles as Q4_0; x = d * q + m.
fn dequantize_q4_1(x: &[u8; 20], y: &mut [f32; 32]) {
    let d = f16_le(x[0], x[1]);
    let m = f16_le(x[2], x[3]);
    let (lo, hi) = y.split_at_mut(QK / 2);
    for ((&q, a), b) in x[4..].iter().zip(lo).zip(hi) {
        *a = f32::from(q & 0xF) * d + m;
        *b = f32::from(q >> 4) * d + m;
    }
}

/// The 5-bit quants of a Q5_0/Q5_1 block: nibbles as Q4_0, and the fifth
/// bit of element j in bit j of the little-endian u32 `qh`.
fn q5_quants(qh: [u8; 4], qs: &[u8], mut f: impl FnMut(usize, u8, u8)) {
    let qh = u32::from_le_bytes(qh);
    for (j, &q) in qs.iter().enumerate().take(QK / 2) {
        let xh0 = (((qh >> j) << 4) & 0x10) as u8;
        let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
        f(j, (q & 0xF) | xh0, (q >> 4) | xh1);
    }
}

/// Q5_0: f16 d, u32 qh, u8 qs[16]; x = d * (q - 16).
fn dequantize_q5_0(x: &[u8; 22], y: &mut [f32; 32]) {
    let d = f16_le(x[0], x[1]);
    let (lo, hi) = y.split_at_mut(QK / 2);
    q5_quants([x[2], x[3], x[4], x[5]], &x[6..], |j, x0, x1| {
        if let (Some(a), Some(b)) = (lo.get_mut(j), hi.get_mut(j)) {
            *a = f32::from(i16::from(x0) - 16) * d;
            *b = f32::from(i16::from(x1) - 16) * d;
        }
    });
}

/// Q5_1: f16 d, f16 m, u32 qh, u8 qs[16]; x = d * q + m.
fn dequantize_q5_1(x: &[u8; 24], y: &mut [f32; 32]) {
    let d = f16_le(x[0], x[1]);
    let m = f16_le(x[2], x[3]);
    let (lo, hi) = y.split_at_mut(QK / 2);
    q5_quants([x[4], x[5], x[6], x[7]], &x[8..], |j, x0, x1| {
        if let (Some(a), Some(b)) = (lo.get_mut(j), hi.get_mut(j)) {
            *a = f32::from(x0) * d + m;
            *b = f32::from(x1) * d + m;
        }
    });
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K block.
pub(crate) fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Scales and mins of sub-blocks `2n` and `2n + 1`, multiplied out:
/// `(d1, m1, d2, m2)`.
fn k4_scales(n: usize, scales: &[u8; 12], d: f32, dmin: f32) -> (f32, f32, f32, f32) {
    let (sc1, m1) = scale_min_k4(2 * n, scales);
    let (sc2, m2) = scale_min_k4(2 * n + 1, scales);
    (
        d * f32::from(sc1),
        dmin * f32::from(m1),
        d * f32::from(sc2),
        dmin * f32::from(m2),
    )
}

/// Splits `x` after `N` bytes: a fixed-size head and the rest. (Callers
/// split fixed-size blocks longer than `N`; a shorter `x` would give zeros.)
fn head<const N: usize>(x: &[u8]) -> (&[u8; N], &[u8]) {
    let (head, rest) = x.split_first_chunk::<N>().unwrap_or((&[0; N], &[]));
    (head, rest)
}

/// Q4_K: f16 d, f16 dmin, u8 scales[12], u8 qs[128]. Eight sub-blocks of 32
/// with 6-bit scales and mins; each 64 outputs take the low then the high
/// nibbles of 32 bytes of qs; x = d * sc * q - dmin * m.
fn dequantize_q4_k(x: &[u8; 144], y: &mut [f32; 256]) {
    let d = f16_le(x[0], x[1]);
    let dmin = f16_le(x[2], x[3]);
    let (scales, qs) = head::<12>(&x[4..]);
    for (n, (y, q)) in y.chunks_exact_mut(64).zip(qs.chunks_exact(32)).enumerate() {
        let (d1, m1, d2, m2) = k4_scales(n, scales, d, dmin);
        let (lo, hi) = y.split_at_mut(32);
        for ((&q, a), b) in q.iter().zip(lo).zip(hi) {
            *a = d1 * f32::from(q & 0xF) - m1;
            *b = d2 * f32::from(q >> 4) - m2;
        }
    }
}

/// Q5_K: f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]. As Q4_K,
/// plus a fifth bit per element: for the n-th 64 outputs, bit 2n of qh[l]
/// (first 32) and bit 2n + 1 (next 32).
fn dequantize_q5_k(x: &[u8; 176], y: &mut [f32; 256]) {
    let d = f16_le(x[0], x[1]);
    let dmin = f16_le(x[2], x[3]);
    let (scales, rest) = head::<12>(&x[4..]);
    let (qh, ql) = head::<32>(rest);
    for (n, (y, ql)) in y.chunks_exact_mut(64).zip(ql.chunks_exact(32)).enumerate() {
        let (d1, m1, d2, m2) = k4_scales(n, scales, d, dmin);
        let (u1, u2) = (1u8 << (2 * n), 2u8 << (2 * n));
        let (lo, hi) = y.split_at_mut(32);
        for (((&q, &h), a), b) in ql.iter().zip(qh).zip(lo).zip(hi) {
            let h1 = if h & u1 != 0 { 16 } else { 0 };
            let h2 = if h & u2 != 0 { 16 } else { 0 };
            *a = d1 * f32::from((q & 0xF) + h1) - m1;
            *b = d2 * f32::from((q >> 4) + h2) - m2;
        }
    }
}

/// Q6_K: u8 ql[128], u8 qh[64], i8 scales[16], f16 d (last). 6-bit quants
/// (minus 32), one scale per 16 elements; x = d * sc * q.
fn dequantize_q6_k(x: &[u8; 210], y: &mut [f32; 256]) {
    let (ql, rest) = head::<128>(x);
    let (qh, rest) = head::<64>(rest);
    let (sc, d) = head::<16>(rest);
    let d = f16_le(d[0], d[1]);
    let sc = sc.map(|s| f32::from(i8::from_le_bytes([s])));
    for (n, y) in y.chunks_exact_mut(128).enumerate() {
        let ql = &ql[64 * n..64 * n + 64];
        let qh = &qh[32 * n..32 * n + 32];
        let sc = &sc[8 * n..8 * n + 8];
        for (l, &h) in qh.iter().enumerate() {
            let is = l / 16;
            let q1 = i16::from((ql[l] & 0xF) | ((h & 3) << 4)) - 32;
            let q2 = i16::from((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) - 32;
            let q3 = i16::from((ql[l] >> 4) | (((h >> 4) & 3) << 4)) - 32;
            let q4 = i16::from((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) - 32;
            y[l] = d * sc[is] * f32::from(q1);
            y[l + 32] = d * sc[is + 2] * f32::from(q2);
            y[l + 64] = d * sc[is + 4] * f32::from(q3);
            y[l + 96] = d * sc[is + 6] * f32::from(q4);
        }
    }
}

/// Applies `f` to each block of 32 values, giving `TS` bytes per block; in
/// parallel for large inputs.
///
/// # Panics
///
/// If `values.len()` is not a multiple of 32.
fn quantize_blocks<const TS: usize>(
    values: &[f32],
    f: impl Fn(&[f32; 32], &mut [u8; TS]) + Sync + Send,
) -> Vec<u8> {
    assert!(
        values.len().is_multiple_of(QK),
        "quantizing {} values: not a multiple of the block size {QK}",
        values.len()
    );
    let (src, _) = values.as_chunks::<QK>();
    let mut out = vec![0u8; src.len() * TS];
    let (dst, _) = out.as_chunks_mut::<TS>();
    if values.len() >= PARALLEL_MIN {
        dst.par_iter_mut()
            .zip(src.par_iter())
            .with_min_len(TASK_MIN / QK)
            .for_each(|(y, x)| f(x, y));
    } else {
        dst.iter_mut().zip(src).for_each(|(y, x)| f(x, y));
    }
    out
}

/// Quantizes to Q8_0 (ggml's reference rounding: d = amax / 127,
/// q = round(x / d)). The result is `values.len() / 32 * 34` bytes.
///
/// # Panics
///
/// If `values.len()` is not a multiple of 32.
pub fn quantize_q8_0(values: &[f32]) -> Vec<u8> {
    quantize_blocks::<34>(values, |x, out| {
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let (dst, qs) = out.split_at_mut(2);
        dst.copy_from_slice(&f16::from_f32(d).to_le_bytes());
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = ((v * id).round() as i8).to_le_bytes()[0];
        }
    })
}

/// Quantizes to Q4_0 (ggml's reference rounding: d = max / -8 where max is
/// the value of largest magnitude, q = min(15, trunc(x / d + 8.5))). The
/// result is `values.len() / 32 * 18` bytes.
///
/// # Panics
///
/// If `values.len()` is not a multiple of 32.
pub fn quantize_q4_0(values: &[f32]) -> Vec<u8> {
    quantize_blocks::<18>(values, |x, out| {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let (dst, qs) = out.split_at_mut(2);
        dst.copy_from_slice(&f16::from_f32(d).to_le_bytes());
        let (lo, hi) = x.split_at(QK / 2);
        for ((q, &a), &b) in qs.iter_mut().zip(lo).zip(hi) {
            let q0 = ((a * id + 8.5) as u8).min(15);
            let q1 = ((b * id + 8.5) as u8).min(15);
            *q = q0 | (q1 << 4);
        }
    })
}

/// The 5-bit quants `quant(x)` of a block in Q5_0/Q5_1's layout: the
/// fifth bits in `out[..4]` (value j's at bit j), the nibbles after them
/// (values j and j + 16 in byte j).
fn put_q5(x: &[f32], out: &mut [u8], quant: impl Fn(f32) -> u8) {
    let mut qh = 0u32;
    let (lo, hi) = x.split_at(QK / 2);
    for (j, (&a, &b)) in lo.iter().zip(hi).enumerate() {
        let (q0, q1) = (quant(a), quant(b));
        out[4 + j] = (q0 & 15) | ((q1 & 15) << 4);
        qh |= u32::from(q0 >> 4) << j;
        qh |= u32::from(q1 >> 4) << (j + QK / 2);
    }
    out[..4].copy_from_slice(&qh.to_le_bytes());
}

/// Quantizes to Q5_0 (ggml's reference rounding: d = the value of largest
/// magnitude / -16, q = min(31, trunc(x / d + 16.5)), the fifth bits in
/// `qh`). The result is `values.len() / 32 * 22` bytes.
///
/// # Panics
///
/// If `values.len()` is not a multiple of 32.
pub fn quantize_q5_0(values: &[f32]) -> Vec<u8> {
    quantize_blocks::<22>(values, |x, out| {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        put_q5(x, &mut out[2..], |v| ((v * id + 16.5) as u8).min(31));
    })
}

/// Quantizes to Q5_1 (ggml's reference rounding: d = (max - min) / 31,
/// m = min, q = min(31, trunc((x - min) / d + 0.5)), the fifth bits in
/// `qh`). The result is `values.len() / 32 * 24` bytes.
///
/// # Panics
///
/// If `values.len()` is not a multiple of 32.
pub fn quantize_q5_1(values: &[f32]) -> Vec<u8> {
    quantize_blocks::<24>(values, |x, out| {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in x {
            min = min.min(v);
            max = max.max(v);
        }
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        out[2..4].copy_from_slice(&f16::from_f32(min).to_le_bytes());
        put_q5(x, &mut out[4..], |v| (((v - min) * id + 0.5) as u8).min(31));
    })
}

/// Quantizes to Q4_1 (ggml's reference rounding: d = (max - min) / 15,
/// m = min, q = min(15, trunc((x - min) / d + 0.5))). The result is
/// `values.len() / 32 * 20` bytes.
///
/// # Panics
///
/// If `values.len()` is not a multiple of 32.
pub fn quantize_q4_1(values: &[f32]) -> Vec<u8> {
    quantize_blocks::<20>(values, |x, out| {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in x {
            min = if v < min { v } else { min };
            max = if v > max { v } else { max };
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let (dm, qs) = out.split_at_mut(4);
        dm[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        dm[2..].copy_from_slice(&f16::from_f32(min).to_le_bytes());
        let (lo, hi) = x.split_at(QK / 2);
        for ((q, &a), &b) in qs.iter_mut().zip(lo).zip(hi) {
            let q0 = (((a - min) * id + 0.5) as u8).min(15);
            let q1 = (((b - min) * id + 0.5) as u8).min(15);
            *q = q0 | (q1 << 4);
        }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn f16_decoding_is_exact_for_every_value() {
        for bits in 0..=u16::MAX {
            let want = half::f16::from_bits(bits).to_f32();
            let [lo, hi] = bits.to_le_bytes();
            let got = super::f16_le(lo, hi);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{bits:#06x}: {got} vs {want}"
            );
        }
    }
}
