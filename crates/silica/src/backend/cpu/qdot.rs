//! Integer dot products of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 and Q4_K / Q5_K
//! / Q6_K weight rows with activations quantized to 8 bits, as llama.cpp
//! computes them.
//!
//! The activations are quantized once per product ([`QuantizedRows`]):
//! blocks of 32 values with an f32 scale `dx` and `sx = dx * Σq`. Every
//! weight block is read as unsigned 8-bit quants `u` with an affine map
//! `w = dw * u + mw` (Q4_0: `mw = -8 dw`; Q4_1: its minimum; Q5_0: the
//! nibble with its fifth bit from the block's `qh`, `mw = -16 dw`; Q5_1:
//! the same quants, its minimum; Q8_0:
//! `u = q + 128`, `mw = -128 dw`), so that one block contributes
//! `dw * dx * Σ u·q + mw * sx`: the inner sum is an unsigned × signed byte
//! product, which x86 computes 64 pairs per instruction (AVX-512 VNNI
//! `vpdpbusd`) or 32 per two instructions (AVX2 `vpmaddubsw`).
//!
//! Layout of the quantized activations: in each group of 4 blocks, the
//! first 16 values of the 4 blocks come first, then their last 16. The low
//! and high nibbles of 4 Q4 blocks, read as one 64-byte vector each, then
//! line up with them without any shuffle.
//!
//! The scalar kernel is the definition the SIMD kernels are tested against;
//! the product itself falls back to the f32 block-dot path where neither
//! SIMD kernel runs (it vectorizes better than scalar integer code).
//!
//! K-quants (superblocks of 256 values, [`K_SUB`] sub-blocks of 32) have
//! their own kernels. Q4_K and Q5_K give each sub-block a 6-bit scale and
//! minimum, which is the same affine map per block of 32
//! (`dw = d · sc`, `mw = -dmin · m`); their nibbles hold sub-blocks `2i`
//! (low) and `2i + 1` (high) of each 32 bytes, so the kernels move 16-byte
//! lanes and shift them by lane to meet the interleaved x. Q6_K has a scale
//! per 16 values and `w = d · sc · (u - 32)`: the 16-bit pair products of
//! `u · q` less those of `32 · q` are weighted by the two scales of the
//! block in one `vpmaddwd` (or `vpdpwssd`), then scaled by `d · dx`.

use crate::quant::{QuantFormat, f16_le};

/// Values per block.
pub(super) const QB: usize = 32;
/// Blocks per group (the unit of the interleaved layout).
pub(super) const GB: usize = 4;
/// Blocks of scales handled at once by the kernels (scale arrays are padded
/// to a multiple of it).
const SB: usize = 16;

/// The instruction set a kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// Plain Rust, one block at a time: the definition.
    #[cfg_attr(not(test), allow(dead_code))] // only tests choose it
    Scalar,
    /// AVX2 `vpmaddubsw` / `vpmaddwd`, two blocks per instruction.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512 VNNI `vpdpbusd`, four blocks per two instructions.
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
}

impl Path {
    /// The SIMD path of the instruction set in effect ([`crate::cpu_isa`]),
    /// if it has one.
    pub(crate) fn detect() -> Option<Path> {
        match crate::cpu_isa() {
            #[cfg(target_arch = "x86_64")]
            crate::CpuIsa::Avx512 => Some(Path::Avx512Vnni),
            #[cfg(target_arch = "x86_64")]
            crate::CpuIsa::Avx2 => Some(Path::Avx2),
            _ => None,
        }
    }

    /// Every path this processor can run (for tests).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Path> {
        let mut v = vec![Path::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            let isas = crate::cpu_isa_available();
            if isas.contains(&crate::CpuIsa::Avx2) {
                v.push(Path::Avx2);
            }
            if isas.contains(&crate::CpuIsa::Avx512) {
                v.push(Path::Avx512Vnni);
            }
        }
        v
    }
}

/// Whether the integer kernels cover `format`.
pub(crate) fn supports(format: QuantFormat) -> bool {
    matches!(
        format,
        QuantFormat::Q4_0
            | QuantFormat::Q4_1
            | QuantFormat::Q5_0
            | QuantFormat::Q5_1
            | QuantFormat::Q8_0
            | QuantFormat::Q4_K
            | QuantFormat::Q5_K
            | QuantFormat::Q6_K
    )
}

/// Blocks of 32 per K-quant superblock.
pub(super) const K_SUB: usize = 8;

/// Whether format `F` is a K-quant (Q4_K, Q5_K, Q6_K), of [`K_SUB`] blocks
/// per superblock.
pub(super) const fn is_k(f: u8) -> bool {
    f >= 5
}

/// Rows of activations quantized to 8 bits in blocks of 32 (see the module
/// doc for the layout). Blocks past the end of a row are zero.
pub(crate) struct QuantizedRows {
    /// Blocks per row.
    pub(super) nb: usize,
    /// Quants per row: whole groups of 4 blocks.
    q_stride: usize,
    /// Scales per row: whole runs of [`SB`] blocks.
    pub(super) s_stride: usize,
    /// [rows, q_stride]
    q: Vec<i8>,
    /// [rows, s_stride] block scales
    d: Vec<f32>,
    /// [rows, s_stride] scale times the sum of the block's quants
    s: Vec<f32>,
}

impl QuantizedRows {
    /// Quantizes `rows` rows of `k` values (`k` a multiple of 32).
    pub(crate) fn new(path: Path, xs: &[f32], rows: usize, k: usize) -> QuantizedRows {
        let nb = k / QB;
        let q_stride = nb.div_ceil(GB) * GB * QB;
        let s_stride = nb.next_multiple_of(SB);
        let mut out = QuantizedRows {
            nb,
            q_stride,
            s_stride,
            q: vec![0; rows * q_stride],
            d: vec![0.0; rows * s_stride],
            s: vec![0.0; rows * s_stride],
        };
        // (x row, quant row), (scale row, sum row)
        type Row<'a> = ((&'a [f32], &'a mut [i8]), (&'a mut [f32], &'a mut [f32]));
        let quantize = |((x, q), (d, s)): Row<'_>| {
            match path {
                Path::Scalar => quantize_row(x, q, d, s),
                // SAFETY: as for the kernels of `path`
                #[cfg(target_arch = "x86_64")]
                Path::Avx2 => unsafe { x86::quantize_row_avx2(x, q, d, s) },
                #[cfg(target_arch = "x86_64")]
                Path::Avx512Vnni => unsafe { x86::quantize_row_avx512(x, q, d, s) },
            }
        };
        let parts = xs
            .chunks_exact(k.max(1))
            .zip(out.q.chunks_exact_mut(q_stride.max(1)))
            .zip(
                out.d
                    .chunks_exact_mut(s_stride.max(1))
                    .zip(out.s.chunks_exact_mut(s_stride.max(1))),
            );
        if rows * k >= 1 << 15 {
            use rayon::prelude::*;
            parts.par_bridge().for_each(quantize);
        } else {
            parts.for_each(quantize);
        }
        out
    }

    pub(super) fn q_row(&self, r: usize) -> &[i8] {
        &self.q[r * self.q_stride..(r + 1) * self.q_stride]
    }

    pub(super) fn d_row(&self, r: usize) -> &[f32] {
        &self.d[r * self.s_stride..(r + 1) * self.s_stride]
    }

    pub(super) fn s_row(&self, r: usize) -> &[f32] {
        &self.s[r * self.s_stride..(r + 1) * self.s_stride]
    }
}

/// Position of value `i` of block `b` in a row of the interleaved layout.
#[inline(always)]
fn q_index(b: usize, i: usize) -> usize {
    (b / GB) * GB * QB + (i / 16) * GB * 16 + (b % GB) * 16 + i % 16
}

/// One row: `d = amax / 127`, `q = round(x / d)` per block (as ggml's Q8
/// formats), stored interleaved. Inlined into versions compiled for each
/// path, where the rounding becomes one instruction instead of a call.
#[inline(always)]
fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (b, xb) in x.chunks_exact(QB).enumerate() {
        let xb: &[f32; QB] = xb.try_into().unwrap_or(&[0.0; QB]);
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let db = amax / 127.0;
        let id = if db > 0.0 { 1.0 / db } else { 0.0 };
        let mut qb = [0i8; QB];
        let mut sum = 0i32;
        for (q, &v) in qb.iter_mut().zip(xb) {
            // |v * id| <= 127 (up to rounding): the cast never saturates
            *q = (v * id).round_ties_even() as i8;
            sum += i32::from(*q);
        }
        let g = (b / GB) * GB * QB + (b % GB) * 16;
        q[g..g + 16].copy_from_slice(&qb[..16]);
        q[g + GB * 16..g + GB * 16 + 16].copy_from_slice(&qb[16..]);
        d[b] = db;
        s[b] = db * sum as f32;
    }
}

/// `xs` (rows of whole blocks of 32) replaced by the values the kernels
/// see: each block's quants times its scale, rounded as [`quantize_row`]
/// rounds them.
pub(crate) fn round_to_8_bits(path: Path, xs: &mut [f32]) {
    match path {
        Path::Scalar => round_blocks(xs),
        // SAFETY: as for the kernels of `path` (both have AVX2)
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 | Path::Avx512Vnni => unsafe { x86::round_blocks_avx2(xs) },
    }
}

/// [`round_to_8_bits`], inlined into a version compiled for AVX2, where
/// the rounding is one instruction instead of a call (as `quantize_row`).
#[inline(always)]
fn round_blocks(xs: &mut [f32]) {
    for xb in xs.chunks_exact_mut(QB) {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let db = amax / 127.0;
        let id = if db > 0.0 { 1.0 / db } else { 0.0 };
        for v in xb {
            *v = (*v * id).round_ties_even() * db;
        }
    }
}

/// Byte offset of the quants in a block of `format`, and the weight of the
/// scale in the block's minimum (`mw = -bias * dw` unless the block stores it).
pub(super) const fn layout_of(f: u8) -> (usize, usize, f32) {
    // (block bytes, offset of the quants, bias)
    match f {
        0 => (34, 2, 128.0),
        1 => (18, 2, 8.0),
        3 => (22, 6, 16.0),
        4 => (24, 8, 0.0),
        // K-quants: per superblock; the offset of the (low) quants
        5 => (144, 16, 0.0),
        6 => (176, 48, 0.0),
        7 => (210, 0, 32.0),
        _ => (20, 4, 0.0),
    }
}

/// `F` of the kernels: 0 = Q8_0, 1 = Q4_0, 2 = Q4_1, 3 = Q5_0, 4 = Q5_1,
/// 5 = Q4_K, 6 = Q5_K, 7 = Q6_K.
pub(super) fn code(format: QuantFormat) -> u8 {
    match format {
        QuantFormat::Q8_0 => 0,
        QuantFormat::Q4_0 => 1,
        QuantFormat::Q5_0 => 3,
        QuantFormat::Q5_1 => 4,
        QuantFormat::Q4_K => 5,
        QuantFormat::Q5_K => 6,
        QuantFormat::Q6_K => 7,
        _ => 2,
    }
}

/// Whether format `F` stores its block's minimum (Q4_1, Q5_1).
pub(super) const fn has_min(f: u8) -> bool {
    f == 2 || f == 4
}

/// Whether format `F` has fifth bits (Q5_0, Q5_1), in the 4 bytes before
/// its nibbles.
pub(super) const fn has_high(f: u8) -> bool {
    f == 3 || f == 4
}

/// The fifth bits of a Q5_0 or Q5_1 block (`blk` from its start; `at` the
/// offset of its nibbles).
#[inline(always)]
fn q5_high(blk: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([blk[at - 4], blk[at - 3], blk[at - 2], blk[at - 1]])
}

/// The unsigned quants and the affine map `(dw, mw)` of block `blk`
/// (`blk.len()` is the block size of format `F`).
#[inline(always)]
pub(super) fn block_u8<const F: u8>(blk: &[u8]) -> ([u8; QB], f32, f32) {
    let (_, at, bias) = layout_of(F);
    let d = f16_le(blk[0], blk[1]);
    let m = if has_min(F) {
        f16_le(blk[2], blk[3])
    } else {
        -bias * d
    };
    let mut u = [0u8; QB];
    if F == 0 {
        for (u, &b) in u.iter_mut().zip(&blk[at..at + QB]) {
            *u = b ^ 0x80;
        }
    } else {
        for j in 0..16 {
            u[j] = blk[at + j] & 15;
            u[j + 16] = blk[at + j] >> 4;
        }
        if has_high(F) {
            let qh = q5_high(blk, at);
            for (j, u) in u.iter_mut().enumerate() {
                *u |= (((qh >> j) & 1) << 4) as u8;
            }
        }
    }
    (u, d, m)
}

/// Sub-block `j` (of [`K_SUB`]) of K-quant superblock `blk` of format `F`:
/// its unsigned quants and, per half (16 values), the affine map
/// `w = dw · u + mw` (the halves differ only for Q6_K).
#[inline(always)]
pub(super) fn k_sub<const F: u8>(blk: &[u8], j: usize) -> ([u8; QB], [f32; 2], [f32; 2]) {
    let mut u = [0u8; QB];
    if F == 7 {
        // half n of the superblock: sub-block t takes the low (t < 2) or
        // high nibbles of 32 of its 64 bytes of ql, and bits 2t of qh
        let (n, t) = (j / 4, j % 4);
        let ql = &blk[64 * n + 32 * (t & 1)..][..QB];
        let qh = &blk[128 + 32 * n..][..QB];
        let (sl, sh) = (4 * (t >> 1), 2 * t);
        for ((u, &l), &h) in u.iter_mut().zip(ql).zip(qh) {
            *u = ((l >> sl) & 15) | (((h >> sh) & 3) << 4);
        }
        let d = f16_le(blk[208], blk[209]);
        let s0 = d * f32::from(blk[192 + 2 * j] as i8);
        let s1 = d * f32::from(blk[193 + 2 * j] as i8);
        return (u, [s0, s1], [-32.0 * s0, -32.0 * s1]);
    }
    let scales: &[u8; 12] = blk[4..16].try_into().unwrap_or(&[0; 12]);
    let (sc, mn) = crate::quant::scale_min_k4(j, scales);
    let dw = f16_le(blk[0], blk[1]) * f32::from(sc);
    let mw = -f16_le(blk[2], blk[3]) * f32::from(mn);
    let at = layout_of(F).1 + 32 * (j / 2);
    let shift = 4 * (j & 1);
    for (u, &b) in u.iter_mut().zip(&blk[at..at + QB]) {
        *u = (b >> shift) & 15;
    }
    if F == 6 {
        for (u, &h) in u.iter_mut().zip(&blk[16..48]) {
            *u |= ((h >> j) & 1) << 4;
        }
    }
    (u, [dw; 2], [mw; 2])
}

/// Rows of a quantized weight from row `first` on: the blocks of row `i`
/// start at byte `i * row_bytes` of `bytes`.
#[derive(Clone, Copy)]
pub(crate) struct WeightRows<'a> {
    pub format: QuantFormat,
    pub bytes: &'a [u8],
    pub first: usize,
    pub row_bytes: usize,
}

impl<'a> WeightRows<'a> {
    /// The rows of `bytes` from the first on.
    pub fn new(format: QuantFormat, bytes: &'a [u8], row_bytes: usize) -> Self {
        Self {
            format,
            bytes,
            first: 0,
            row_bytes,
        }
    }

    /// Row `first + i` and every byte after it.
    pub fn row_on(&self, i: usize) -> &'a [u8] {
        &self.bytes[(self.first + i) * self.row_bytes..]
    }

    /// The same rows from row `first + i` on.
    pub fn skip(self, i: usize) -> Self {
        Self {
            first: self.first + i,
            ..self
        }
    }
}

/// `out[i * m + r] = w_{first + i} · x_r` for `out.len() / m` rows of `w`
/// and every row `r` of `x`. The kernels are given the rest of `w` after
/// each row: where it holds more bytes, they read past the row without
/// masking (and ignore them).
pub(crate) fn dot_rows(
    path: Path,
    w: WeightRows<'_>,
    x: &QuantizedRows,
    m: usize,
    out: &mut [f32],
) {
    match path {
        Path::Scalar => dot_rows_on(path, w, x, m, out),
        // SAFETY: `Path::detect` (or the test that forces a path) checked
        // that the processor has the features these functions enable
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { x86::dot_rows_avx2(w, x, m, out) },
        #[cfg(target_arch = "x86_64")]
        Path::Avx512Vnni => unsafe { x86::dot_rows_avx512(w, x, m, out) },
    }
}

/// The loop of [`dot_rows`], inlined into a version per path so that each
/// row's kernel is inlined too.
#[inline(always)]
fn dot_rows_on(path: Path, w: WeightRows<'_>, x: &QuantizedRows, m: usize, out: &mut [f32]) {
    let f = code(w.format);
    for (i, dst) in out.chunks_exact_mut(m).enumerate() {
        let row = w.row_on(i);
        let mut r = 0;
        while r < m {
            let tile = (m - r).min(4);
            let d = &mut dst[r..r + tile];
            match (f, tile) {
                (0, 1) => dot_tile::<0, 1>(path, row, x, r, d),
                (0, 2) => dot_tile::<0, 2>(path, row, x, r, d),
                (0, 3) => dot_tile::<0, 3>(path, row, x, r, d),
                (0, _) => dot_tile::<0, 4>(path, row, x, r, d),
                (1, 1) => dot_tile::<1, 1>(path, row, x, r, d),
                (1, 2) => dot_tile::<1, 2>(path, row, x, r, d),
                (1, 3) => dot_tile::<1, 3>(path, row, x, r, d),
                (1, _) => dot_tile::<1, 4>(path, row, x, r, d),
                (3, 1) => dot_tile::<3, 1>(path, row, x, r, d),
                (3, 2) => dot_tile::<3, 2>(path, row, x, r, d),
                (3, 3) => dot_tile::<3, 3>(path, row, x, r, d),
                (3, _) => dot_tile::<3, 4>(path, row, x, r, d),
                (4, 1) => dot_tile::<4, 1>(path, row, x, r, d),
                (4, 2) => dot_tile::<4, 2>(path, row, x, r, d),
                (4, 3) => dot_tile::<4, 3>(path, row, x, r, d),
                (4, _) => dot_tile::<4, 4>(path, row, x, r, d),
                (5, 1) => dot_tile::<5, 1>(path, row, x, r, d),
                (5, 2) => dot_tile::<5, 2>(path, row, x, r, d),
                (5, 3) => dot_tile::<5, 3>(path, row, x, r, d),
                (5, _) => dot_tile::<5, 4>(path, row, x, r, d),
                (6, 1) => dot_tile::<6, 1>(path, row, x, r, d),
                (6, 2) => dot_tile::<6, 2>(path, row, x, r, d),
                (6, 3) => dot_tile::<6, 3>(path, row, x, r, d),
                (6, _) => dot_tile::<6, 4>(path, row, x, r, d),
                (7, 1) => dot_tile::<7, 1>(path, row, x, r, d),
                (7, 2) => dot_tile::<7, 2>(path, row, x, r, d),
                (7, 3) => dot_tile::<7, 3>(path, row, x, r, d),
                (7, _) => dot_tile::<7, 4>(path, row, x, r, d),
                (_, 1) => dot_tile::<2, 1>(path, row, x, r, d),
                (_, 2) => dot_tile::<2, 2>(path, row, x, r, d),
                (_, 3) => dot_tile::<2, 3>(path, row, x, r, d),
                (_, _) => dot_tile::<2, 4>(path, row, x, r, d),
            }
            r += tile;
        }
    }
}

/// `dst[i] = row · x_{r0 + i}` for `R` rows of x.
#[inline(always)]
fn dot_tile<const F: u8, const R: usize>(
    path: Path,
    row: &[u8],
    x: &QuantizedRows,
    r0: usize,
    dst: &mut [f32],
) {
    let v: [f32; R] = match path {
        Path::Scalar if is_k(F) => dot_scalar_k::<F, R>(row, x, r0),
        Path::Scalar => dot_scalar::<F, R>(row, x, r0),
        // SAFETY: `Path::detect` (or the test that forces a path) checked
        // that the processor has the features these functions enable
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 if is_k(F) => unsafe { x86::dot_avx2_k::<F, R>(row, x, r0) },
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { x86::dot_avx2::<F, R>(row, x, r0) },
        #[cfg(target_arch = "x86_64")]
        Path::Avx512Vnni if is_k(F) => unsafe { x86::dot_avx512_k::<F, R>(row, x, r0) },
        #[cfg(target_arch = "x86_64")]
        Path::Avx512Vnni => unsafe { x86::dot_avx512::<F, R>(row, x, r0) },
    };
    dst.copy_from_slice(&v);
}

fn dot_scalar<const F: u8, const R: usize>(row: &[u8], x: &QuantizedRows, r0: usize) -> [f32; R] {
    let bb = layout_of(F).0;
    let mut acc = [0f32; R];
    for (b, blk) in row.chunks_exact(bb).take(x.nb).enumerate() {
        let (u, dw, mw) = block_u8::<F>(blk);
        for (i, a) in acc.iter_mut().enumerate() {
            let q = x.q_row(r0 + i);
            let dot: i32 = (0..QB)
                .map(|j| i32::from(u[j]) * i32::from(q[q_index(b, j)]))
                .sum();
            *a += dw * x.d_row(r0 + i)[b] * dot as f32 + mw * x.s_row(r0 + i)[b];
        }
    }
    acc
}

/// The definition for K-quants: per half of each sub-block, the integer
/// dot `Σ u·q` and sum `Σ q` mapped through the half's `(dw, mw)`, times dx;
/// summed in f64, since a long row of Q6_K (no minimum) can cancel to a
/// result that f32 sums in a different order would not agree on.
fn dot_scalar_k<const F: u8, const R: usize>(row: &[u8], x: &QuantizedRows, r0: usize) -> [f32; R] {
    let bb = layout_of(F).0;
    let mut acc = [0f64; R];
    for (s, blk) in row.chunks_exact(bb).take(x.nb / K_SUB).enumerate() {
        for j in 0..K_SUB {
            let (u, dw, mw) = k_sub::<F>(blk, j);
            let b = s * K_SUB + j;
            for (i, a) in acc.iter_mut().enumerate() {
                let q = x.q_row(r0 + i);
                for h in 0..2 {
                    let (mut dot, mut sum) = (0i32, 0i32);
                    for e in 16 * h..16 * h + 16 {
                        let v = i32::from(q[q_index(b, e)]);
                        dot += i32::from(u[e]) * v;
                        sum += v;
                    }
                    let (dx, dot, sum) = (x.d_row(r0 + i)[b], dot as f32, sum as f32);
                    *a += f64::from(dx * (dw[h] * dot + mw[h] * sum));
                }
            }
        }
    }
    acc.map(|a| a as f32)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The SIMD kernels. Both walk a weight row in runs of [`SB`] blocks:
    //! the run's scales are combined with those of x as vectors, then its
    //! blocks are dotted a group at a time; a run's last group may be cut by
    //! the end of the row and is copied to a zeroed buffer first, so that no
    //! load reads past the row.

    use super::{
        GB, K_SUB, Path, QB, QuantizedRows, WeightRows, has_high, has_min, layout_of, q5_high,
    };
    use std::arch::x86_64::*;

    /// The blocks `b0..` of `row`, whole if `nb - b0 >= n`, otherwise the
    /// remaining ones copied into `buf` followed by zeros.
    #[inline(always)]
    fn blocks_at<'a>(
        row: &'a [u8],
        bb: usize,
        b0: usize,
        n: usize,
        buf: &'a mut [u8; GB * 34],
    ) -> *const u8 {
        let nb = row.len() / bb;
        if b0 + n <= nb {
            row[b0 * bb..].as_ptr()
        } else {
            buf.fill(0);
            let have = &row[b0 * bb..nb * bb];
            buf[..have.len()].copy_from_slice(have);
            buf.as_ptr()
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_rows_avx2(
        w: WeightRows<'_>,
        x: &QuantizedRows,
        m: usize,
        out: &mut [f32],
    ) {
        super::dot_rows_on(Path::Avx2, w, x, m, out)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub(super) unsafe fn dot_rows_avx512(
        w: WeightRows<'_>,
        x: &QuantizedRows,
        m: usize,
        out: &mut [f32],
    ) {
        super::dot_rows_on(Path::Avx512Vnni, w, x, m, out)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn round_blocks_avx2(xs: &mut [f32]) {
        super::round_blocks(xs)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_row_avx2(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
        super::quantize_row(x, q, d, s)
    }

    /// As `quantize_row`, a block in two vectors: the conversion rounds
    /// to nearest even (the default rounding mode), as the scalar code.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    pub(super) unsafe fn quantize_row_avx512(
        x: &[f32],
        q: &mut [i8],
        d: &mut [f32],
        s: &mut [f32],
    ) {
        for (b, xb) in x.chunks_exact(QB).enumerate() {
            // SAFETY: `xb` holds 32 values
            let (lo, hi) = unsafe {
                (
                    _mm512_loadu_ps(xb.as_ptr()),
                    _mm512_loadu_ps(xb.as_ptr().add(16)),
                )
            };
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
            let db = amax / 127.0;
            let id = _mm512_set1_ps(if db > 0.0 { 1.0 / db } else { 0.0 });
            let ql = _mm512_cvtps_epi32(_mm512_mul_ps(lo, id));
            let qh = _mm512_cvtps_epi32(_mm512_mul_ps(hi, id));
            let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(ql, qh));
            let g = (b / GB) * GB * QB + (b % GB) * 16;
            let (ql, qh) = (_mm512_cvtsepi32_epi8(ql), _mm512_cvtsepi32_epi8(qh));
            q[g..g + 16].copy_from_slice(&i8x16(ql));
            q[g + GB * 16..g + GB * 16 + 16].copy_from_slice(&i8x16(qh));
            d[b] = db;
            s[b] = db * sum as f32;
        }
    }

    /// The 16 bytes of `v`.
    #[inline(always)]
    fn i8x16(v: __m128i) -> [i8; 16] {
        // SAFETY: both are 16 plain bytes
        unsafe { std::mem::transmute(v) }
    }

    /// AVX-512: per group of 4 blocks, the low nibbles (or first 16 bytes)
    /// of the 4 blocks in one vector and the high ones in another, each
    /// against the matching half of the interleaved x; `vpdpbusd` leaves 4
    /// lanes per block, which are scaled by the block's `dw * dx`. Blocks
    /// past the end of the row are read as zeros through masked loads,
    /// which do not touch the memory of masked bytes. (The scales are
    /// loaded with the blocks, not gathered: a gather waits for every cache
    /// line it touches before anything else can use it.)
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub(super) unsafe fn dot_avx512<const F: u8, const R: usize>(
        row: &[u8],
        x: &QuantizedRows,
        r0: usize,
    ) -> [f32; R] {
        let (bb, at, bias) = layout_of(F);
        let nb = x.nb;
        let mut acc = [_mm512_setzero_ps(); R];
        let mut off = [_mm_setzero_ps(); R];
        let low4 = _mm512_set1_epi8(15);
        let flip = _mm512_set1_epi8(-128);
        // lane l takes the scale of block l / 4
        let spread = _mm512_srli_epi32::<2>(_mm512_setr_epi32(
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
        ));
        for b in (0..nb).step_by(GB) {
            // the last group of a row may reach past it: its loads are
            // plain where the bytes are there (part of the next row), masked
            // (slower) at the end of `w`
            let live = (nb - b).min(GB);
            let plain = b * bb + (GB - 1) * bb + at + 32 <= row.len();
            let keep = |t: usize| if t < live { 0xffff } else { 0 };
            let p = row[b * bb..].as_ptr();
            // the blocks 32 groups ahead, far enough to cover the memory's
            // latency at decode (docs/tuning.md, "CPU prefetch distance";
            // a prefetch never faults)
            let ahead = p.wrapping_add(32 * GB * bb);
            for l in 0..(GB * bb).div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l).cast());
            }
            // SAFETY: plain loads read inside `row`, masked ones inside its
            // blocks
            let load = |o: usize, t: usize| unsafe {
                let at = p.wrapping_add(o + t * bb);
                if plain {
                    _mm_loadu_si128(at.cast())
                } else {
                    _mm_maskz_loadu_epi8(keep(t), at.cast())
                }
            };
            let part = |o: usize| {
                let v = _mm512_castsi128_si512(load(o, 0));
                let v = _mm512_inserti32x4::<1>(v, load(o, 1));
                let v = _mm512_inserti32x4::<2>(v, load(o, 2));
                _mm512_inserti32x4::<3>(v, load(o, 3))
            };
            // the first 4 bytes of the 4 blocks: d, and m for Q4_1
            let heads = _mm_unpacklo_epi64(
                _mm_unpacklo_epi32(load(0, 0), load(0, 1)),
                _mm_unpacklo_epi32(load(0, 2), load(0, 3)),
            );
            // the scales of blocks past the row are zero (what was read
            // there may be NaN); their quants meet zeros of x
            let heads = _mm_maskz_mov_epi32(((1u16 << live) - 1) as u8, heads);
            let dw = _mm_cvtph_ps(_mm_cvtepi32_epi16(heads));
            let mw = if has_min(F) {
                _mm_cvtph_ps(_mm_cvtepi32_epi16(_mm_srli_epi32::<16>(heads)))
            } else {
                _mm_mul_ps(dw, _mm_set1_ps(-bias))
            };
            let (lo, hi) = if F == 0 {
                (
                    _mm512_xor_si512(part(at), flip),
                    _mm512_xor_si512(part(at + 16), flip),
                )
            } else {
                let v = part(at);
                let (lo, hi) = (
                    _mm512_and_si512(v, low4),
                    _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4),
                );
                if has_high(F) {
                    // the 4 blocks' qh words, each repeated over its lane
                    let h = at - 4;
                    let qh = _mm_unpacklo_epi64(
                        _mm_unpacklo_epi32(load(h, 0), load(h, 1)),
                        _mm_unpacklo_epi32(load(h, 2), load(h, 3)),
                    );
                    let qh = _mm512_permutexvar_epi32(
                        _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                        _mm512_castsi128_si512(qh),
                    );
                    (
                        _mm512_or_si512(lo, fifth_bits_512(qh, 0)),
                        _mm512_or_si512(hi, fifth_bits_512(qh, 2)),
                    )
                } else {
                    (lo, hi)
                }
            };
            for i in 0..R {
                let q = x.q_row(r0 + i)[b * QB..].as_ptr();
                // SAFETY: the quant rows hold whole groups of 4 blocks, the
                // scale rows whole runs of 16
                let (xl, xh, dx, sx) = unsafe {
                    (
                        _mm512_loadu_si512(q.cast()),
                        _mm512_loadu_si512(q.add(64).cast()),
                        _mm_loadu_ps(x.d_row(r0 + i)[b..].as_ptr()),
                        _mm_loadu_ps(x.s_row(r0 + i)[b..].as_ptr()),
                    )
                };
                let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xl);
                let dot = _mm512_dpbusd_epi32(dot, hi, xh);
                let sc = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_mul_ps(dw, dx)));
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, acc[i]);
                off[i] = _mm_fmadd_ps(mw, sx, off[i]);
            }
        }
        let mut out = [0f32; R];
        for i in 0..R {
            out[i] = _mm512_reduce_add_ps(acc[i]) + hsum128(off[i]);
        }
        out
    }

    /// 16 in byte j of each 128-bit lane where bit `8 * byte0 + j` of the
    /// lane's (repeated) 32-bit word is set, 0 elsewhere: Q5_0's fifth
    /// bits of the low (`byte0` 0) or high (2) nibbles.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn fifth_bits_512(qh: __m512i, byte0: i8) -> __m512i {
        let (a, b) = (byte0, byte0 + 1);
        let pick = _mm512_broadcast_i32x4(_mm_setr_epi8(
            a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b,
        ));
        let bits = _mm512_broadcast_i32x4(_mm_setr_epi8(
            1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128,
        ));
        let set = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, pick), bits);
        _mm512_maskz_mov_epi8(set, _mm512_set1_epi8(16))
    }

    /// As `fifth_bits_512`, for two lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn fifth_bits_256(qh: __m256i, byte0: i8) -> __m256i {
        let (a, b) = (byte0, byte0 + 1);
        let pick = _mm256_setr_epi8(
            a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b, a, a, a, a, a, a, a, a, b, b, b, b, b,
            b, b, b,
        );
        let bits = _mm256_setr_epi8(
            1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64,
            -128, 1, 2, 4, 8, 16, 32, 64, -128,
        );
        let v = _mm256_and_si256(_mm256_shuffle_epi8(qh, pick), bits);
        _mm256_and_si256(_mm256_cmpeq_epi8(v, bits), _mm256_set1_epi8(16))
    }

    /// The sum of the 4 lanes of `v`.
    #[inline(always)]
    fn hsum128(v: __m128) -> f32 {
        // SAFETY: SSE3 is part of every target that runs these kernels
        unsafe {
            let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
            _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
        }
    }

    /// The dw and mw of blocks `b0..b0 + 8` of `row` (zero past its end),
    /// the halves converted by F16C (mw is 0 for Q8_0, whose quants the
    /// AVX2 kernel uses signed).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn scales8<const F: u8>(row: &[u8], b0: usize) -> (__m256, __m256) {
        let (bb, _, bias) = layout_of(F);
        let mut d = [0u16; 8];
        let mut m = [0u16; 8];
        for (i, blk) in row[b0 * bb..].chunks_exact(bb).take(8).enumerate() {
            d[i] = u16::from_le_bytes([blk[0], blk[1]]);
            if has_min(F) {
                m[i] = u16::from_le_bytes([blk[2], blk[3]]);
            }
        }
        // SAFETY: `d` and `m` are 16 bytes each
        let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(d.as_ptr().cast()) });
        let mw = match F {
            0 => _mm256_setzero_ps(),
            // SAFETY: as above
            2 | 4 => _mm256_cvtph_ps(unsafe { _mm_loadu_si128(m.as_ptr().cast()) }),
            _ => _mm256_mul_ps(dw, _mm256_set1_ps(-bias)),
        };
        (dw, mw)
    }

    /// AVX2: as the AVX-512 kernel with two blocks per vector (`vpmaddubsw`
    /// then `vpmaddwd` against ones). Q8_0 quants are used signed here
    /// (`vpsignb`), since 255 · 127 · 2 overflows `vpmaddubsw`'s 16-bit sums.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_avx2<const F: u8, const R: usize>(
        row: &[u8],
        x: &QuantizedRows,
        r0: usize,
    ) -> [f32; R] {
        const RUN: usize = 8;
        let (bb, at, _) = layout_of(F);
        let nb = x.nb;
        let row = &row[..nb * bb];
        let mut acc = [_mm256_setzero_ps(); R];
        let mut off = [_mm256_setzero_ps(); R];
        let low4 = _mm256_set1_epi8(15);
        let ones = _mm256_set1_epi16(1);
        let mut buf = [0u8; GB * 34];
        for run in 0..nb.div_ceil(RUN) {
            let b0 = run * RUN;
            let live = (nb - b0).min(RUN);
            // the blocks eight runs ahead (the rest of the row, then the
            // next rows: rows follow each other in memory; docs/tuning.md,
            // "CPU prefetch distance")
            let ahead = row.as_ptr().wrapping_add((b0 + 8 * RUN) * bb);
            for l in 0..(RUN * bb).div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l).cast());
            }
            let (dw, mw) = scales8::<F>(row, b0);
            let mut sc = [_mm256_setzero_ps(); R];
            for i in 0..R {
                // SAFETY: the scale rows hold whole runs of SB >= 8 blocks
                let (dx, sx) = unsafe {
                    (
                        _mm256_loadu_ps(x.d_row(r0 + i)[b0..].as_ptr()),
                        _mm256_loadu_ps(x.s_row(r0 + i)[b0..].as_ptr()),
                    )
                };
                sc[i] = _mm256_mul_ps(dw, dx);
                off[i] = _mm256_fmadd_ps(mw, sx, off[i]);
            }
            for pair in 0..live.div_ceil(2) {
                let b = b0 + 2 * pair;
                let p = blocks_at(row, bb, b, 2, &mut buf);
                // SAFETY: `p` points at 2 whole blocks
                let (lo, hi) = unsafe {
                    let part =
                        |o: usize| _mm256_loadu2_m128i(p.add(o + bb).cast(), p.add(o).cast());
                    if F == 0 {
                        (part(at), part(at + 16))
                    } else {
                        let v = part(at);
                        let (lo, hi) = (
                            _mm256_and_si256(v, low4),
                            _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4),
                        );
                        if has_high(F) {
                            let (h0, h1) = (
                                q5_high(std::slice::from_raw_parts(p, at), at) as i32,
                                q5_high(std::slice::from_raw_parts(p.add(bb), at), at) as i32,
                            );
                            let qh = _mm256_setr_epi32(h0, h0, h0, h0, h1, h1, h1, h1);
                            (
                                _mm256_or_si256(lo, fifth_bits_256(qh, 0)),
                                _mm256_or_si256(hi, fifth_bits_256(qh, 2)),
                            )
                        } else {
                            (lo, hi)
                        }
                    }
                };
                let pick = _mm256_setr_epi32(
                    2 * pair as i32,
                    2 * pair as i32,
                    2 * pair as i32,
                    2 * pair as i32,
                    2 * pair as i32 + 1,
                    2 * pair as i32 + 1,
                    2 * pair as i32 + 1,
                    2 * pair as i32 + 1,
                );
                // blocks b and b + 1 sit in the same group, at half b % 4 / 2
                let q_at = (b / GB) * GB * QB + (b % GB) * 16;
                for i in 0..R {
                    let q = x.q_row(r0 + i)[q_at..].as_ptr();
                    // SAFETY: the quant rows hold whole groups of 4 blocks
                    let (xl, xh) = unsafe {
                        (
                            _mm256_loadu_si256(q.cast()),
                            _mm256_loadu_si256(q.add(GB * 16).cast()),
                        )
                    };
                    let dot = if F == 0 {
                        let l = _mm256_maddubs_epi16(_mm256_abs_epi8(lo), _mm256_sign_epi8(xl, lo));
                        let h = _mm256_maddubs_epi16(_mm256_abs_epi8(hi), _mm256_sign_epi8(xh, hi));
                        _mm256_add_epi32(_mm256_madd_epi16(l, ones), _mm256_madd_epi16(h, ones))
                    } else {
                        // at most 4 · 31 · 127 per 16-bit lane (Q5_0)
                        let s = _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo, xl),
                            _mm256_maddubs_epi16(hi, xh),
                        );
                        _mm256_madd_epi16(s, ones)
                    };
                    let s = _mm256_permutevar8x32_ps(sc[i], pick);
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s, acc[i]);
                }
            }
        }
        let mut out = [0f32; R];
        for i in 0..R {
            let v = _mm256_add_ps(acc[i], off[i]);
            let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
            let v = _mm_add_ss(v, _mm_movehdup_ps(v));
            out[i] = _mm_cvtss_f32(v);
        }
        out
    }

    /// The 8 sub-block scales `d · sc` and minima `-dmin · m` of a Q4_K or
    /// Q5_K superblock: the 6-bit fields unpacked with word operations.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn k4_scales8(blk: &[u8]) -> (__m256, __m256) {
        let word = |o: usize| u32::from_le_bytes([blk[o], blk[o + 1], blk[o + 2], blk[o + 3]]);
        let (a, b, c) = (word(4), word(8), word(12));
        // sub-blocks 0..4 keep 6 bits of bytes 0..4 (scales) and 4..8
        // (minima); 4..8 take 4 bits of bytes 8..12 and their top 2 bits
        // from the top bits of bytes 0..4 (scales) and 4..8 (minima)
        let sc = u64::from(a & 0x3f3f_3f3f)
            | u64::from((c & 0x0f0f_0f0f) | (((a >> 6) & 0x0303_0303) << 4)) << 32;
        let mn = u64::from(b & 0x3f3f_3f3f)
            | u64::from(((c >> 4) & 0x0f0f_0f0f) | (((b >> 6) & 0x0303_0303) << 4)) << 32;
        let f = |v: u64| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)));
        let d = crate::quant::f16_le(blk[0], blk[1]);
        let dmin = crate::quant::f16_le(blk[2], blk[3]);
        (
            _mm256_mul_ps(f(sc), _mm256_set1_ps(d)),
            _mm256_mul_ps(f(mn), _mm256_set1_ps(-dmin)),
        )
    }

    /// AVX-512 for K-quants: per superblock, two groups of 4 sub-blocks
    /// against the interleaved x. Q4_K / Q5_K: the group's 64 bytes of
    /// nibbles, 16-byte lanes repeated and shifted per lane so that one
    /// vector holds the first 16 quants of the 4 sub-blocks and another
    /// their last 16 (fifth bits added under a mask); then as Q4_1. Q6_K:
    /// see the module doc. Whole superblocks only, so no load leaves the row.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub(super) unsafe fn dot_avx512_k<const F: u8, const R: usize>(
        row: &[u8],
        x: &QuantizedRows,
        r0: usize,
    ) -> [f32; R] {
        let (bb, at, _) = layout_of(F);
        let nsb = x.nb / K_SUB;
        let row = &row[..nsb * bb];
        let mut acc = [_mm512_setzero_ps(); R];
        let mut off = [_mm256_setzero_ps(); R];
        let low4 = _mm512_set1_epi8(15);
        let sixteen = _mm512_set1_epi8(16);
        let m32 = _mm512_set1_epi8(32);
        // lane l takes the scale of block l / 4
        let spread = _mm512_srli_epi32::<2>(_mm512_setr_epi32(
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
        ));
        // Q4_K / Q5_K lanes are (low, high, low, high) nibbles; Q6_K's
        // (low, low, high, high)
        let nib = if F == 7 {
            _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4)
        } else {
            _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)
        };
        // Q6_K: bits 2t..2t + 2 of qh rotated to bits 4..6 in lane t
        let rot6 = _mm512_setr_epi64(4, 4, 2, 2, 0, 0, 62, 62);
        for s in 0..nsb {
            let blk = &row[s * bb..(s + 1) * bb];
            let p = blk.as_ptr();
            // 16 superblocks ahead (the next rows after the last; a
            // prefetch never faults): about the distance of the other
            // kernels, in bytes
            let ahead = p.wrapping_add(16 * bb);
            for l in 0..bb.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l).cast());
            }
            let (dw8, mw8) = if F == 7 {
                (_mm256_setzero_ps(), _mm256_setzero_ps())
            } else {
                k4_scales8(blk)
            };
            // SAFETY (loads from `p`): each reads inside the superblock
            // Q6_K's 16 scales widened to 16 bits, and d
            let (sc16, d6) = if F == 7 {
                let v = unsafe { _mm_loadu_si128(p.add(192).cast()) };
                (
                    _mm512_castsi256_si512(_mm256_cvtepi8_epi16(v)),
                    _mm_set1_ps(crate::quant::f16_le(blk[208], blk[209])),
                )
            } else {
                (_mm512_setzero_si512(), _mm_setzero_ps())
            };
            // Q5_K's fifth bits of the first and last 16 values of each
            // sub-block, repeated over the 4 lanes
            let (h0, h1) = if F == 6 {
                unsafe {
                    (
                        _mm512_broadcast_i32x4(_mm_loadu_si128(p.add(16).cast())),
                        _mm512_broadcast_i32x4(_mm_loadu_si128(p.add(32).cast())),
                    )
                }
            } else {
                (_mm512_setzero_si512(), _mm512_setzero_si512())
            };
            for g in 0..2 {
                let b = s * K_SUB + g * GB;
                let (wl, wh) = if F == 7 {
                    // half g: ql lanes (0, 2, 0, 2) and (1, 3, 1, 3)
                    let v = unsafe { _mm512_loadu_si512(p.add(64 * g).cast()) };
                    let wl = _mm512_and_si512(
                        _mm512_srlv_epi64(_mm512_shuffle_i64x2::<0x88>(v, v), nib),
                        low4,
                    );
                    let wh = _mm512_and_si512(
                        _mm512_srlv_epi64(_mm512_shuffle_i64x2::<0xdd>(v, v), nib),
                        low4,
                    );
                    let hb = |o: usize| {
                        let h = unsafe { _mm_loadu_si128(p.add(128 + 32 * g + o).cast()) };
                        let h = _mm512_rolv_epi64(_mm512_broadcast_i32x4(h), rot6);
                        _mm512_and_si512(h, _mm512_set1_epi8(0x30))
                    };
                    (_mm512_or_si512(wl, hb(0)), _mm512_or_si512(wh, hb(16)))
                } else {
                    // sub-blocks 4g..4g + 4: lanes (0, 0, 2, 2) and (1, 1, 3, 3)
                    let v = unsafe { _mm512_loadu_si512(p.add(at + 64 * g).cast()) };
                    let wl = _mm512_and_si512(
                        _mm512_srlv_epi64(_mm512_shuffle_i64x2::<0xa0>(v, v), nib),
                        low4,
                    );
                    let wh = _mm512_and_si512(
                        _mm512_srlv_epi64(_mm512_shuffle_i64x2::<0xf5>(v, v), nib),
                        low4,
                    );
                    if F == 6 {
                        // bit 4g + t of each qh byte, in lane t
                        let bit = |t: usize| (0x0101_0101u32 << (4 * g + t)) as i32;
                        let bits = _mm512_setr_epi32(
                            bit(0),
                            bit(0),
                            bit(0),
                            bit(0),
                            bit(1),
                            bit(1),
                            bit(1),
                            bit(1),
                            bit(2),
                            bit(2),
                            bit(2),
                            bit(2),
                            bit(3),
                            bit(3),
                            bit(3),
                            bit(3),
                        );
                        (
                            _mm512_mask_add_epi8(wl, _mm512_test_epi8_mask(h0, bits), wl, sixteen),
                            _mm512_mask_add_epi8(wh, _mm512_test_epi8_mask(h1, bits), wh, sixteen),
                        )
                    } else {
                        (wl, wh)
                    }
                };
                // Q6_K: lane t holds the scales of the two halves of
                // sub-block 4g + t as a pair of 16-bit words
                let pair = if F == 7 {
                    let idx = _mm512_add_epi32(spread, _mm512_set1_epi32(4 * g as i32));
                    _mm512_permutexvar_epi32(idx, sc16)
                } else {
                    sc16
                };
                let dw4 = if F == 7 {
                    d6
                } else if g == 0 {
                    _mm256_castps256_ps128(dw8)
                } else {
                    _mm256_extractf128_ps::<1>(dw8)
                };
                for (i, acc) in acc.iter_mut().enumerate() {
                    let q = x.q_row(r0 + i)[b * QB..].as_ptr();
                    // SAFETY: the quant rows hold whole groups of 4 blocks,
                    // the scale rows whole runs of 16
                    let (xl, xh, dx) = unsafe {
                        (
                            _mm512_loadu_si512(q.cast()),
                            _mm512_loadu_si512(q.add(64).cast()),
                            _mm_loadu_ps(x.d_row(r0 + i)[b..].as_ptr()),
                        )
                    };
                    let dot = if F == 7 {
                        // (u - 32) · q in pairs, at most 2 · 32 · 127
                        let pl = _mm512_sub_epi16(
                            _mm512_maddubs_epi16(wl, xl),
                            _mm512_maddubs_epi16(m32, xl),
                        );
                        let ph = _mm512_sub_epi16(
                            _mm512_maddubs_epi16(wh, xh),
                            _mm512_maddubs_epi16(m32, xh),
                        );
                        let dot = _mm512_dpwssd_epi32(
                            _mm512_setzero_si512(),
                            _mm512_unpacklo_epi16(pl, ph),
                            pair,
                        );
                        _mm512_dpwssd_epi32(dot, _mm512_unpackhi_epi16(pl, ph), pair)
                    } else {
                        let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wl, xl);
                        _mm512_dpbusd_epi32(dot, wh, xh)
                    };
                    let sc =
                        _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_mul_ps(dw4, dx)));
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, *acc);
                }
            }
            if F != 7 {
                for (i, off) in off.iter_mut().enumerate() {
                    // SAFETY: the scale rows hold whole runs of 16 blocks
                    let sx = unsafe { _mm256_loadu_ps(x.s_row(r0 + i)[s * K_SUB..].as_ptr()) };
                    *off = _mm256_fmadd_ps(mw8, sx, *off);
                }
            }
        }
        let mut out = [0f32; R];
        for i in 0..R {
            let o = _mm_add_ps(
                _mm256_castps256_ps128(off[i]),
                _mm256_extractf128_ps::<1>(off[i]),
            );
            out[i] = _mm512_reduce_add_ps(acc[i]) + hsum128(o);
        }
        out
    }

    /// AVX2 for K-quants: per superblock, four pairs of sub-blocks (two
    /// blocks per vector, as the AVX2 kernel). Q4_K / Q5_K: the 16 bytes of
    /// nibbles holding the first (then last) 16 quants of sub-blocks 2p and
    /// 2p + 1, repeated in both lanes and shifted by 0 and 4. Q6_K: as the
    /// module doc says, with `vpmaddwd` against the pair of 16-bit scales.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_avx2_k<const F: u8, const R: usize>(
        row: &[u8],
        x: &QuantizedRows,
        r0: usize,
    ) -> [f32; R] {
        let (bb, at, _) = layout_of(F);
        let nsb = x.nb / K_SUB;
        let row = &row[..nsb * bb];
        let mut acc = [_mm256_setzero_ps(); R];
        let mut off = [_mm256_setzero_ps(); R];
        let low4 = _mm256_set1_epi8(15);
        let ones = _mm256_set1_epi16(1);
        let sixteen = _mm256_set1_epi8(16);
        let m32 = _mm256_set1_epi8(32);
        let mask6 = _mm256_set1_epi8(0x30);
        let nib = _mm256_setr_epi64x(0, 0, 4, 4);
        let pick = |a: i32| _mm256_setr_epi32(a, a, a, a, a + 1, a + 1, a + 1, a + 1);
        for s in 0..nsb {
            let blk = &row[s * bb..(s + 1) * bb];
            let p = blk.as_ptr();
            // 8 superblocks ahead, about the other AVX2 kernel's distance
            let ahead = p.wrapping_add(8 * bb);
            for l in 0..bb.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l).cast());
            }
            let b0 = s * K_SUB;
            let (dw8, mw8) = if F == 7 {
                let d = crate::quant::f16_le(blk[208], blk[209]);
                (_mm256_set1_ps(d), _mm256_setzero_ps())
            } else {
                k4_scales8(blk)
            };
            let mut sc = [_mm256_setzero_ps(); R];
            for i in 0..R {
                // SAFETY: the scale rows hold whole runs of 16 >= 8 blocks
                let (dx, sx) = unsafe {
                    (
                        _mm256_loadu_ps(x.d_row(r0 + i)[b0..].as_ptr()),
                        _mm256_loadu_ps(x.s_row(r0 + i)[b0..].as_ptr()),
                    )
                };
                sc[i] = _mm256_mul_ps(dw8, dx);
                if F != 7 {
                    off[i] = _mm256_fmadd_ps(mw8, sx, off[i]);
                }
            }
            // SAFETY (loads from `p`): each reads inside the superblock
            let sc16 = if F == 7 {
                _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(p.add(192).cast()) })
            } else {
                _mm256_setzero_si256()
            };
            let bcast =
                |o: usize| unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(o).cast())) };
            for pr in 0..4 {
                let (wl, wh) = if F == 7 {
                    // half n, low (c = 0) or high nibbles of ql lanes
                    // (0, 2) and (1, 3); bits 4c.. and 4c + 2.. of qh
                    let (n, c) = (pr / 2, pr % 2);
                    let (v02, v13) = unsafe {
                        let l = p.add(64 * n);
                        (
                            _mm256_loadu2_m128i(l.add(32).cast(), l.cast()),
                            _mm256_loadu2_m128i(l.add(48).cast(), l.add(16).cast()),
                        )
                    };
                    let (h0, h1) = (bcast(128 + 32 * n), bcast(128 + 32 * n + 16));
                    let (lo, hi) = if c == 0 {
                        let sh = _mm256_setr_epi64x(4, 4, 2, 2);
                        (
                            (v02, _mm256_sllv_epi64(h0, sh)),
                            (v13, _mm256_sllv_epi64(h1, sh)),
                        )
                    } else {
                        let sh = _mm256_setr_epi64x(0, 0, 2, 2);
                        (
                            (_mm256_srli_epi16::<4>(v02), _mm256_srlv_epi64(h0, sh)),
                            (_mm256_srli_epi16::<4>(v13), _mm256_srlv_epi64(h1, sh)),
                        )
                    };
                    let join = |(q, h): (__m256i, __m256i)| {
                        _mm256_or_si256(_mm256_and_si256(q, low4), _mm256_and_si256(h, mask6))
                    };
                    (join(lo), join(hi))
                } else {
                    let o = at + 32 * pr;
                    let wl = _mm256_and_si256(_mm256_srlv_epi64(bcast(o), nib), low4);
                    let wh = _mm256_and_si256(_mm256_srlv_epi64(bcast(o + 16), nib), low4);
                    if F == 6 {
                        // bits 2p and 2p + 1 of each qh byte, by lane
                        let (a, b) = (1i8 << (2 * pr), (2u8 << (2 * pr)) as i8);
                        let bits = _mm256_setr_epi8(
                            a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b,
                            b, b, b, b, b, b, b, b,
                        );
                        let fifth = |h: __m256i| {
                            let set = _mm256_cmpeq_epi8(_mm256_and_si256(h, bits), bits);
                            _mm256_and_si256(set, sixteen)
                        };
                        (
                            _mm256_or_si256(wl, fifth(bcast(16))),
                            _mm256_or_si256(wh, fifth(bcast(32))),
                        )
                    } else {
                        (wl, wh)
                    }
                };
                // sub-blocks 2p and 2p + 1: half (2p % 4) / 2 of group 2p / 4
                let b = b0 + 2 * pr;
                let q_at = (b / GB) * GB * QB + (b % GB) * 16;
                // Q6_K: the two 16-bit scales of each sub-block, by lane
                let pair = _mm256_permutevar8x32_epi32(sc16, pick(2 * pr as i32));
                for i in 0..R {
                    let q = x.q_row(r0 + i)[q_at..].as_ptr();
                    // SAFETY: the quant rows hold whole groups of 4 blocks
                    let (xl, xh) = unsafe {
                        (
                            _mm256_loadu_si256(q.cast()),
                            _mm256_loadu_si256(q.add(GB * 16).cast()),
                        )
                    };
                    let dot = if F == 7 {
                        // (u - 32) · q in pairs, at most 2 · 32 · 127
                        let pl = _mm256_sub_epi16(
                            _mm256_maddubs_epi16(wl, xl),
                            _mm256_maddubs_epi16(m32, xl),
                        );
                        let ph = _mm256_sub_epi16(
                            _mm256_maddubs_epi16(wh, xh),
                            _mm256_maddubs_epi16(m32, xh),
                        );
                        _mm256_add_epi32(
                            _mm256_madd_epi16(_mm256_unpacklo_epi16(pl, ph), pair),
                            _mm256_madd_epi16(_mm256_unpackhi_epi16(pl, ph), pair),
                        )
                    } else {
                        // at most 4 · 31 · 127 per 16-bit lane (Q5_K)
                        let s = _mm256_add_epi16(
                            _mm256_maddubs_epi16(wl, xl),
                            _mm256_maddubs_epi16(wh, xh),
                        );
                        _mm256_madd_epi16(s, ones)
                    };
                    let s = _mm256_permutevar8x32_ps(sc[i], pick(2 * pr as i32));
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s, acc[i]);
                }
            }
        }
        let mut out = [0f32; R];
        for i in 0..R {
            let v = _mm256_add_ps(acc[i], off[i]);
            let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            out[i] = hsum128(v);
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_distr::StandardNormal;

    fn gaussian(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n).map(|_| rng.sample(StandardNormal)).collect()
    }

    /// Blocks of `format` for `v`: quantized, or random K-quant blocks of
    /// the same length (silica has no K-quant quantizer).
    pub(crate) fn quantize(format: QuantFormat, v: &[f32]) -> Vec<u8> {
        match format {
            QuantFormat::Q8_0 => crate::quant::quantize_q8_0(v),
            QuantFormat::Q4_0 => crate::quant::quantize_q4_0(v),
            QuantFormat::Q5_0 => crate::quant::quantize_q5_0(v),
            QuantFormat::Q5_1 => crate::quant::quantize_q5_1(v),
            QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K => {
                random_k(format, v.len(), v.len() as u64 ^ u64::from(v[0].to_bits()))
            }
            _ => crate::quant::quantize_q4_1(v),
        }
    }

    /// Random K-quant blocks for `n` values: random quants, sub-scales and
    /// minima, and f16 scales that keep the values of order one.
    fn random_k(format: QuantFormat, n: usize, seed: u64) -> Vec<u8> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut bytes = vec![0u8; format.bytes_for(n)];
        rng.fill(&mut bytes[..]);
        // (offset of an f16 scale, the largest quant times sub-scale)
        let scales: &[(usize, f32)] = match format {
            QuantFormat::Q4_K => &[(0, 15.0 * 63.0), (2, 63.0)],
            QuantFormat::Q5_K => &[(0, 31.0 * 63.0), (2, 63.0)],
            _ => &[(208, 32.0 * 127.0)],
        };
        for blk in bytes.chunks_exact_mut(format.block_bytes()) {
            for &(at, range) in scales {
                let v = rng.random_range(0.5f32..1.5) / range;
                blk[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
            }
        }
        bytes
    }

    /// Every format of the kernels.
    pub(crate) const FORMATS: [QuantFormat; 8] = [
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q5_0,
        QuantFormat::Q5_1,
        QuantFormat::Q4_K,
        QuantFormat::Q5_K,
        QuantFormat::Q6_K,
    ];

    /// Row lengths to test `format` with: one block, groups cut short (not
    /// for K-quants, whose superblocks are whole groups) and long rows.
    pub(crate) fn lengths(format: QuantFormat) -> &'static [usize] {
        if format.block_elems() == 256 {
            &[256, 768, 2048 + 256]
        } else {
            &[32, 64, 96, 160, 544, 2048 + 32]
        }
    }

    /// ‖a - b‖ / ‖b‖
    fn rel_err(a: &[f32], b: &[f32]) -> f64 {
        let num: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
        (num / den.max(1e-30)).sqrt()
    }

    /// x as the kernels see it: the quants times their block's scale.
    fn dequantized(x: &QuantizedRows, rows: usize) -> Vec<f32> {
        let k = x.nb * QB;
        (0..rows * k)
            .map(|t| {
                let (r, i) = (t / k, t % k);
                f32::from(x.q_row(r)[q_index(i / QB, i % QB)]) * x.d_row(r)[i / QB]
            })
            .collect()
    }

    /// `a @ bᵀ` in f64, transposed: `[n, m]` for `a` `[m, k]`, `b` `[n, k]`.
    fn product_t(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
        (0..n * m)
            .map(|t| {
                let (j, r) = (t / m, t % m);
                (0..k)
                    .map(|i| f64::from(b[j * k + i]) * f64::from(a[r * k + i]))
                    .sum::<f64>() as f32
            })
            .collect()
    }

    #[test]
    fn every_path_matches_the_scalar_kernel_and_the_f32_product() {
        let shapes = [
            (1, 1),
            (1, 7),
            (2, 5),
            (3, 3),
            (4, 9),
            (5, 2),
            (7, 3),
            (8, 1),
            (9, 11),
            (17, 4),
            (33, 13),
        ];
        for format in FORMATS {
            for &k in lengths(format) {
                // the 8-bit activations' error, over all shapes of this k
                let (mut all_got, mut all_want) = (Vec::new(), Vec::new());
                for &(m, n) in &shapes {
                    let xs = gaussian(m * k, (k * 131 + m) as u64);
                    let ws = gaussian(n * k, (k * 7 + n) as u64 + 99);
                    let xq = QuantizedRows::new(Path::Scalar, &xs, m, k);
                    let wb = quantize(format, &ws);
                    let wf = crate::quant::dequantize(format, &wb);
                    let rb = format.bytes_for(k);
                    let mut reference = vec![0f32; n * m];
                    dot_rows(
                        Path::Scalar,
                        WeightRows::new(format, &wb, rb),
                        &xq,
                        m,
                        &mut reference,
                    );
                    // the kernel itself is exact up to f32 rounding
                    let exact = product_t(&dequantized(&xq, m), &wf, m, n, k);
                    let e = rel_err(&reference, &exact);
                    assert!(e < 1e-5, "{format} scalar k {k} m {m} n {n}: {e}");
                    for path in Path::available() {
                        let mut got = vec![0f32; n * m];
                        dot_rows(path, WeightRows::new(format, &wb, rb), &xq, m, &mut got);
                        let e = rel_err(&got, &reference);
                        assert!(
                            e < 1e-5,
                            "{format} {path:?} k {k} m {m} n {n}: {e} against scalar"
                        );
                    }
                    all_want.extend(product_t(&xs, &wf, m, n, k));
                    all_got.extend(reference);
                }
                let e = rel_err(&all_got, &all_want);
                assert!(e < 1e-2, "{format} k {k}: {e} against the f32 product");
            }
        }
    }

    #[test]
    fn rounding_to_8_bits_gives_the_values_the_kernels_see() {
        let (rows, k) = (3, 96);
        let mut xs = gaussian(rows * k, 21);
        xs[32..64].fill(0.0);
        let xq = QuantizedRows::new(Path::Scalar, &xs, rows, k);
        let want = dequantized(&xq, rows);
        for path in Path::available() {
            let mut got = xs.clone();
            round_to_8_bits(path, &mut got);
            assert_eq!(got, want, "{path:?}");
        }
    }

    #[test]
    fn every_path_quantizes_as_the_scalar_code() {
        for &(rows, k) in &[(1, 32), (3, 96), (5, 544)] {
            let mut xs = gaussian(rows * k, k as u64);
            xs[..32].fill(0.0); // a zero block
            xs[rows * k - 1] = 1e-30;
            let want = QuantizedRows::new(Path::Scalar, &xs, rows, k);
            for path in Path::available() {
                let got = QuantizedRows::new(path, &xs, rows, k);
                assert_eq!(got.q, want.q, "{path:?} {rows}x{k}");
                assert_eq!(got.d, want.d, "{path:?} {rows}x{k}");
                assert_eq!(got.s, want.s, "{path:?} {rows}x{k}");
            }
        }
    }

    #[test]
    fn bytes_read_past_a_row_are_ignored() {
        // 3 blocks per row: the last group of 4 reads into the next row,
        // whose scales here are NaN (one superblock per row for K-quants)
        for format in FORMATS {
            let k = if format.block_elems() == 256 { 256 } else { 96 };
            let xs = gaussian(2 * k, 3);
            let xq = QuantizedRows::new(Path::Scalar, &xs, 2, k);
            let mut wb = quantize(format, &gaussian(2 * k, 4));
            let (rb, bb) = (format.bytes_for(k), format.block_bytes());
            for blk in wb[rb..].chunks_exact_mut(bb) {
                if format == QuantFormat::Q6_K {
                    blk[208..].copy_from_slice(&[0x00, 0x7e]);
                } else {
                    blk[..4].copy_from_slice(&[0x00, 0x7e, 0x00, 0x7e]);
                }
            }
            let mut want = vec![0f32; 2];
            dot_rows(
                Path::Scalar,
                WeightRows::new(format, &wb[..rb], rb),
                &xq,
                2,
                &mut want,
            );
            for path in Path::available() {
                let mut got = vec![0f32; 2];
                dot_rows(path, WeightRows::new(format, &wb, rb), &xq, 2, &mut got);
                assert!(
                    rel_err(&got, &want) < 1e-5,
                    "{format} {path:?}: {got:?} vs {want:?}"
                );
            }
        }
    }

    #[test]
    fn zero_and_constant_rows() {
        for format in FORMATS {
            let k = if format.block_elems() == 256 { 256 } else { 96 };
            let xs: Vec<f32> = (0..2 * k).map(|i| if i < k { 0.0 } else { 1.5 }).collect();
            let ws = gaussian(3 * k, 5);
            let xq = QuantizedRows::new(Path::Scalar, &xs, 2, k);
            let wb = quantize(format, &ws);
            let wf = crate::quant::dequantize(format, &wb);
            for path in Path::available() {
                let mut got = vec![0f32; 6];
                dot_rows(
                    path,
                    WeightRows::new(format, &wb, format.bytes_for(k)),
                    &xq,
                    2,
                    &mut got,
                );
                for j in 0..3 {
                    assert_eq!(got[2 * j], 0.0, "{format} {path:?}");
                    let want: f32 = wf[j * k..(j + 1) * k].iter().map(|w| w * 1.5).sum();
                    assert!((got[2 * j + 1] - want).abs() <= 1e-3 * want.abs().max(1.0));
                }
            }
        }
    }
}
