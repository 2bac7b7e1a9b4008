//! Integer products of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 and Q4_K / Q5_K
//! weights with many rows of 8-bit activations (prefill), as matrix tiles
//! rather than row dots. Q6_K's panels hold a second scale per block (one
//! per 16 values) and its quants less 32 are dotted as `u · q - 32 Σ q`,
//! the sums of x computed once per tile row for the panel's 4 rows.
//!
//! A task decodes its weight rows once, [`NR`] at a time, into a [`Panel`]:
//! the unsigned quants in the interleaved order of the activations (see
//! `qdot`), each group's scales spread over the 16 lanes that `vpdpbusd`
//! leaves for its 4 blocks, and the blocks' minima. The panel is then
//! multiplied with every row of x in tiles of [`MR`] × [`NR`], so that each
//! loaded vector of x meets 4 weight rows and each vector of weights 4 rows
//! of x. The panel is a few kilobytes: the quantized matrix is never copied
//! whole.

use crate::quant::QuantFormat;

use super::qdot::{
    GB, K_SUB, Path, QB, QuantizedRows, WeightRows, block_u8, code, is_k, k_sub, layout_of,
};

/// Weight rows per panel.
pub(crate) const NR: usize = 4;
/// Rows of x per tile.
const MR: usize = 4;

/// [`NR`] weight rows decoded for the tile kernels. Rows past the end of
/// the matrix are zero.
struct Panel {
    /// Groups of 4 blocks per row.
    groups: usize,
    /// Scales per row in `mw`: whole runs of 16 blocks, as those of x.
    nbp: usize,
    /// [groups, NR, 128]: per group and row, the first 16 quants of its 4
    /// blocks, then their last 16
    u: Vec<u8>,
    /// [groups, NR, 16]: lane l holds dw of block 4 g + l / 4
    dw: Vec<f32>,
    /// As `dw`, the scales of the blocks' last 16 values (Q6_K; `dw` then
    /// scales their first 16), else empty
    dw2: Vec<f32>,
    /// [NR, nbp] the blocks' minima (w = dw · u + mw)
    mw: Vec<f32>,
}

impl Panel {
    /// A panel for x; `two` for formats with two scales per block (Q6_K).
    fn new(x: &QuantizedRows, two: bool) -> Panel {
        let groups = x.nb.div_ceil(GB);
        let nbp = x.s_stride;
        Panel {
            groups,
            nbp,
            u: vec![0; groups * NR * GB * QB],
            dw: vec![0.0; groups * NR * 16],
            dw2: vec![0.0; if two { groups * NR * 16 } else { 0 }],
            mw: vec![0.0; NR * nbp],
        }
    }

    /// Decodes rows `j0..j0 + live` (`live <= NR`) of `w`, `nb` blocks
    /// each. What lies past the `nb` blocks stays zero from `new`.
    #[inline(always)]
    fn fill<const F: u8>(&mut self, w: WeightRows<'_>, live: usize, nb: usize) {
        if live < NR {
            // the rows past the matrix, which a previous fill may have set
            self.u.fill(0);
            self.dw.fill(0.0);
            self.dw2.fill(0.0);
            self.mw.fill(0.0);
        }
        let bb = layout_of(F).0;
        for c in 0..live {
            if is_k(F) {
                // Q4_K / Q5_K: one affine map per sub-block of 32; Q6_K:
                // a scale per half, its offset (-32) left to the tiles
                let row = &w.row_on(c)[..nb / K_SUB * bb];
                for (s, blk) in row.chunks_exact(bb).enumerate() {
                    for j in 0..K_SUB {
                        let (u, dw, mw) = k_sub::<F>(blk, j);
                        let b = s * K_SUB + j;
                        if F == 7 {
                            self.put(c, b, &u, dw[0], 0.0);
                            let (g, t) = (b / GB, b % GB);
                            let lanes = (g * NR + c) * 16 + t * 4;
                            self.dw2[lanes..lanes + 4].fill(dw[1]);
                        } else {
                            self.put(c, b, &u, dw[0], mw[0]);
                        }
                    }
                }
            } else {
                let row = &w.row_on(c)[..nb * bb];
                for (b, blk) in row.chunks_exact(bb).enumerate() {
                    let (u, dw, mw) = block_u8::<F>(blk);
                    self.put(c, b, &u, dw, mw);
                }
            }
        }
    }

    /// Block `b` of panel row `c`: quants `u`, `w = dw · u + mw`.
    #[inline(always)]
    fn put(&mut self, c: usize, b: usize, u: &[u8; QB], dw: f32, mw: f32) {
        let (g, t) = (b / GB, b % GB);
        let at = (g * NR + c) * GB * QB + t * 16;
        self.u[at..at + 16].copy_from_slice(&u[..16]);
        self.u[at + GB * 16..at + GB * 16 + 16].copy_from_slice(&u[16..]);
        let lanes = (g * NR + c) * 16 + t * 4;
        self.dw[lanes..lanes + 4].fill(dw);
        self.mw[c * self.nbp + b] = mw;
    }
}

/// Whether products of many rows of x in `format` should take the integer
/// path on `path`. K-quants do only where they have tiles (AVX-512): their
/// row dots at prefill are slower than the f32 panels (1B 512 × 2048 × 2048
/// on the 2-core Xeon: Q4_K 120–130 ms on AVX2, Q6_K 130–170 ms on AVX-512,
/// against 100 ms for the panels).
pub(crate) fn integer_prefill(path: Path, format: QuantFormat) -> bool {
    // the paths with tile kernels (`Path::Scalar` is for tests)
    let tiles = match path {
        #[cfg(target_arch = "x86_64")]
        Path::Avx512Vnni => true,
        _ => false,
    };
    match format {
        QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K => tiles,
        _ => true,
    }
}

/// As `qdot::dot_rows`: `out[i * m + r] = w_{first + i} · x_r` for the
/// `out.len() / m` rows of `w` and every row `r` of x, by tiles. Only
/// [`Path::Avx512Vnni`] and [`Path::Scalar`] (the definition, for tests)
/// have tile kernels: other paths take the row dots.
pub(crate) fn gemm_rows(
    path: Path,
    w: WeightRows<'_>,
    x: &QuantizedRows,
    m: usize,
    out: &mut [f32],
) {
    match path {
        Path::Scalar => gemm_rows_on(path, w, x, m, out),
        // SAFETY: `Path::detect` (or the test that forces a path) checked
        // that the processor has the features this function enables
        #[cfg(target_arch = "x86_64")]
        Path::Avx512Vnni => unsafe { x86::gemm_rows_avx512(w, x, m, out) },
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => super::qdot::dot_rows(path, w, x, m, out),
    }
}

#[inline(always)]
fn gemm_rows_on(path: Path, w: WeightRows<'_>, x: &QuantizedRows, m: usize, out: &mut [f32]) {
    match code(w.format) {
        0 => gemm_rows_of::<0>(path, w, x, m, out),
        1 => gemm_rows_of::<1>(path, w, x, m, out),
        3 => gemm_rows_of::<3>(path, w, x, m, out),
        4 => gemm_rows_of::<4>(path, w, x, m, out),
        5 => gemm_rows_of::<5>(path, w, x, m, out),
        6 => gemm_rows_of::<6>(path, w, x, m, out),
        7 => gemm_rows_of::<7>(path, w, x, m, out),
        _ => gemm_rows_of::<2>(path, w, x, m, out),
    }
}

#[inline(always)]
fn gemm_rows_of<const F: u8>(
    path: Path,
    w: WeightRows<'_>,
    x: &QuantizedRows,
    m: usize,
    out: &mut [f32],
) {
    if m == 0 {
        return;
    }
    let mut panel = Panel::new(x, F == 7);
    for (p, dst) in out.chunks_mut(NR * m).enumerate() {
        let live = dst.len() / m;
        panel.fill::<F>(w.skip(p * NR), live, x.nb);
        let mut r = 0;
        while r < m {
            let tile = (m - r).min(MR);
            const TWO: bool = false;
            match (tile, F == 7) {
                (1, TWO) => tile_into::<1, TWO>(path, &panel, x, r, m, dst),
                (2, TWO) => tile_into::<2, TWO>(path, &panel, x, r, m, dst),
                (3, TWO) => tile_into::<3, TWO>(path, &panel, x, r, m, dst),
                (_, TWO) => tile_into::<4, TWO>(path, &panel, x, r, m, dst),
                (1, _) => tile_into::<1, true>(path, &panel, x, r, m, dst),
                (2, _) => tile_into::<2, true>(path, &panel, x, r, m, dst),
                (3, _) => tile_into::<3, true>(path, &panel, x, r, m, dst),
                (_, _) => tile_into::<4, true>(path, &panel, x, r, m, dst),
            }
            r += tile;
        }
    }
}

/// One tile: rows `r0..r0 + R` of x against the panel, into the panel's
/// live rows of `dst` ([live, m]); `TWO` for a panel of two scales per
/// block (Q6_K).
#[inline(always)]
fn tile_into<const R: usize, const TWO: bool>(
    path: Path,
    panel: &Panel,
    x: &QuantizedRows,
    r0: usize,
    m: usize,
    dst: &mut [f32],
) {
    let v: [[f32; R]; NR] = match path {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: only `gemm_rows_avx512` passes this path, on a processor
        // that has its features
        Path::Avx512Vnni => unsafe { x86::tile_avx512::<R, TWO>(panel, x, r0) },
        _ => tile_scalar::<R, TWO>(panel, x, r0),
    };
    for (c, d) in dst.chunks_exact_mut(m).enumerate() {
        d[r0..r0 + R].copy_from_slice(&v[c]);
    }
}

/// The definition: per block, the integer dot of the quants scaled by
/// `dw · dx`, plus `mw · sx`; with `TWO` (Q6_K), per half of the block the
/// dot of `u - 32` scaled by the half's `dw`, summed in f64 (as the row
/// dots' definition, for the same reason).
fn tile_scalar<const R: usize, const TWO: bool>(
    p: &Panel,
    x: &QuantizedRows,
    r0: usize,
) -> [[f32; R]; NR] {
    let mut out = [[0f32; R]; NR];
    for (c, o) in out.iter_mut().enumerate() {
        for (i, o) in o.iter_mut().enumerate() {
            let (q, d, s) = (x.q_row(r0 + i), x.d_row(r0 + i), x.s_row(r0 + i));
            let mut acc = 0f32;
            let mut acc2 = 0f64;
            for b in 0..x.nb {
                let (g, t) = (b / GB, b % GB);
                let u = &p.u[(g * NR + c) * GB * QB..][..GB * QB];
                let qg = &q[g * GB * QB..][..GB * QB];
                if TWO {
                    let lane = (g * NR + c) * 16 + t * 4;
                    for (h, dw) in [p.dw[lane], p.dw2[lane]].into_iter().enumerate() {
                        let dot: i32 = (0..16)
                            .map(|e| h * GB * 16 + t * 16 + e)
                            .map(|e| (i32::from(u[e]) - 32) * i32::from(qg[e]))
                            .sum();
                        acc2 += f64::from(dw * d[b] * dot as f32);
                    }
                    continue;
                }
                let dot: i32 = (0..16)
                    .flat_map(|e| [t * 16 + e, GB * 16 + t * 16 + e])
                    .map(|e| i32::from(u[e]) * i32::from(qg[e]))
                    .sum();
                let dw = p.dw[(g * NR + c) * 16 + t * 4];
                acc += dw * d[b] * dot as f32 + p.mw[c * p.nbp + b] * s[b];
            }
            *o = if TWO { acc2 as f32 } else { acc };
        }
    }
    out
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{GB, NR, Panel, QB, QuantizedRows, WeightRows};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub(super) unsafe fn gemm_rows_avx512(
        w: WeightRows<'_>,
        x: &QuantizedRows,
        m: usize,
        out: &mut [f32],
    ) {
        super::gemm_rows_on(super::Path::Avx512Vnni, w, x, m, out)
    }

    /// Per group of 4 blocks and pair (row of x, row of the panel): two
    /// `vpdpbusd` (first and last 16 quants of the 4 blocks), converted and
    /// scaled by `dw · dx` spread over the lanes of each block. The minima
    /// times the sums of x are added 16 blocks at a time at the end. With
    /// `TWO` (Q6_K), the two dots are kept apart, each less `32 Σ q` (one
    /// `vpdpbusd` of 32s per row of x and group, shared by the panel's
    /// rows), and scaled by their own `dw`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
    pub(super) unsafe fn tile_avx512<const R: usize, const TWO: bool>(
        p: &Panel,
        x: &QuantizedRows,
        r0: usize,
    ) -> [[f32; R]; NR] {
        const G: usize = GB * QB;
        let mut acc = [[_mm512_setzero_ps(); NR]; R];
        // lane l takes the scale of block l / 4
        let spread = _mm512_srli_epi32::<2>(_mm512_setr_epi32(
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
        ));
        let m32 = _mm512_set1_epi8(32);
        let mut qs: [&[i8]; R] = [&[]; R];
        let mut ds: [&[f32]; R] = [&[]; R];
        for i in 0..R {
            (qs[i], ds[i]) = (x.q_row(r0 + i), x.d_row(r0 + i));
        }
        for g in 0..p.groups {
            let u = &p.u[g * NR * G..(g + 1) * NR * G];
            let dw = &p.dw[g * NR * 16..(g + 1) * NR * 16];
            // SAFETY (all loads below): the panel holds NR rows of whole
            // groups; the quant rows of x whole groups, its scale rows
            // whole runs of 16 blocks (so 4 g + 4 fits)
            let mut wl = [_mm512_setzero_si512(); NR];
            let mut wh = [_mm512_setzero_si512(); NR];
            let mut wd = [_mm512_setzero_ps(); NR];
            let mut wd2 = [_mm512_setzero_ps(); NR];
            for c in 0..NR {
                unsafe {
                    wl[c] = _mm512_loadu_si512(u[c * G..].as_ptr().cast());
                    wh[c] = _mm512_loadu_si512(u[c * G + G / 2..].as_ptr().cast());
                    wd[c] = _mm512_loadu_ps(dw[c * 16..].as_ptr());
                    if TWO {
                        wd2[c] = _mm512_loadu_ps(p.dw2[(g * NR + c) * 16..].as_ptr());
                    }
                }
            }
            for i in 0..R {
                let (xl, xh, d4) = unsafe {
                    let q = qs[i][g * G..].as_ptr();
                    (
                        _mm512_loadu_si512(q.cast()),
                        _mm512_loadu_si512(q.add(G / 2).cast()),
                        _mm_loadu_ps(ds[i][GB * g..].as_ptr()),
                    )
                };
                let dx = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d4));
                if TWO {
                    let zero = _mm512_setzero_si512();
                    let (sl, sh) = (
                        _mm512_dpbusd_epi32(zero, m32, xl),
                        _mm512_dpbusd_epi32(zero, m32, xh),
                    );
                    for c in 0..NR {
                        let dl = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, wl[c], xl), sl);
                        let dh = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, wh[c], xh), sh);
                        let a = _mm512_fmadd_ps(
                            _mm512_cvtepi32_ps(dl),
                            _mm512_mul_ps(wd[c], dx),
                            acc[i][c],
                        );
                        acc[i][c] =
                            _mm512_fmadd_ps(_mm512_cvtepi32_ps(dh), _mm512_mul_ps(wd2[c], dx), a);
                    }
                    continue;
                }
                for c in 0..NR {
                    let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wl[c], xl);
                    let dot = _mm512_dpbusd_epi32(dot, wh[c], xh);
                    let sc = _mm512_mul_ps(wd[c], dx);
                    acc[i][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, acc[i][c]);
                }
            }
        }
        // minima times the sums of x, 16 blocks at a time
        for b in (0..p.nbp).step_by(16) {
            for (i, acc) in acc.iter_mut().enumerate() {
                // SAFETY: `nbp` is a whole number of runs of 16, in both
                let sx = unsafe { _mm512_loadu_ps(x.s_row(r0 + i)[b..].as_ptr()) };
                for (c, a) in acc.iter_mut().enumerate() {
                    let mw = unsafe { _mm512_loadu_ps(p.mw[c * p.nbp + b..].as_ptr()) };
                    *a = _mm512_fmadd_ps(mw, sx, *a);
                }
            }
        }
        let mut out = [[0f32; R]; NR];
        for (i, acc) in acc.iter().enumerate() {
            for (c, a) in acc.iter().enumerate() {
                out[c][i] = _mm512_reduce_add_ps(*a);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::qdot::tests::{FORMATS, lengths, quantize};

    fn values(n: usize, seed: u64) -> Vec<f32> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n)
            .map(|_| rng.sample(rand_distr::StandardNormal))
            .collect()
    }

    /// ‖a - b‖ / ‖b‖
    fn rel_err(a: &[f32], b: &[f32]) -> f64 {
        let num: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
        (num / den.max(1e-30)).sqrt()
    }

    #[test]
    fn tiles_match_the_row_dots() {
        // m and n not multiples of the tile, k of one block, of groups cut
        // short and of more than 64 blocks; a task that starts past row 0
        let paths = Path::available();
        for format in FORMATS {
            for &k in lengths(format) {
                // per path, all values of this k (got, want)
                let mut all = vec![(Vec::new(), Vec::new()); paths.len()];
                for &(m, n) in &[(1, 1), (3, 5), (4, 4), (8, 9), (13, 6), (33, 17)] {
                    let xs = values(m * k, (k * 31 + m) as u64);
                    let ws = values(n * k, (k * 17 + n) as u64 + 5);
                    let wb = quantize(format, &ws);
                    let rb = format.bytes_for(k);
                    for (&path, all) in paths.iter().zip(&mut all) {
                        let xq = QuantizedRows::new(path, &xs, m, k);
                        let mut want = vec![0f32; n * m];
                        crate::backend::cpu::qdot::dot_rows(
                            Path::Scalar,
                            WeightRows::new(format, &wb, rb),
                            &xq,
                            m,
                            &mut want,
                        );
                        for j0 in [0, n / 2] {
                            let mut got = vec![0f32; (n - j0) * m];
                            gemm_rows(
                                path,
                                WeightRows::new(format, &wb, rb).skip(j0),
                                &xq,
                                m,
                                &mut got,
                            );
                            // per value (the offsets of Q4_0 and Q8_0 cancel much
                            // of the sum), and below over all values of this k
                            // (one value alone may cancel to next to nothing:
                            // Q6_K's random rows have no offset)
                            let want = &want[j0 * m..];
                            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                                assert!(
                                    (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                                    "{format} {path:?} k {k} m {m} n {n} j0 {j0} [{i}]: {g} vs {w}"
                                );
                            }
                            all.0.extend_from_slice(&got);
                            all.1.extend_from_slice(want);
                        }
                    }
                }
                for (path, (got, want)) in paths.iter().zip(&all) {
                    let e = rel_err(got, want);
                    assert!(e < 1e-5, "{format} {path:?} k {k}: {e}");
                }
            }
        }
    }
}
