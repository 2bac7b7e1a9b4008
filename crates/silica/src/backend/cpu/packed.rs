//! Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 (and Q4_K where [`k_tiles`]) weights
//! on the CPU in tiles of rows, the layout of the VNNI kernels (as
//! llama.cpp repacks weights for its AMX and VNNI kernels): tiles of 16
//! rows on the AVX-512 VNNI path, of 8 on the AVX2 path (AVX-VNNI's
//! 256-bit `vpdpbusd` where the processor has it, `vpmaddubsw` and
//! `vpmaddwd` elsewhere).
//!
//! A matrix of `rows` (a multiple of the tile height `h`) by `nb` blocks
//! is stored as `rows / h` tiles, each its `nb` blocks in order, and each
//! block of a tile as `h` times the bytes of one block: first the quants,
//! as vectors of `4h` bytes whose 32-bit lane `r` holds bytes `4j..4j + 4`
//! of the quants of row `r` (4 vectors for Q4 and Q5, 8 for Q8_0), then
//! the bytes before the quants in the block, 2 at a time, each pair as an
//! array of `h` (the scales, the minima of Q4_1 and Q5_1, the two halves
//! of Q5's fifth bits). One load then gives `h` rows' quants in the lanes
//! that `vpdpbusd` sums: a Q4 vector's low nibbles hold values `4j..4j +
//! 4` of each row, its high nibbles values `16 + 4j..`, both met by 4
//! bytes of x broadcast to every lane, and a block's `h` results come out
//! as a vector with no horizontal sum. The matrix keeps its size; a
//! tile's blocks are one stream in memory. The words tensor of a tiled
//! matrix is `[tiles, words a tile]`, so its tile height is its rows over
//! its tiles.
//!
//! Q4_K superblocks take the same layout (tiles of 16): 32 vectors of quants (4 runs of
//! 8, each run's low nibbles one sub-block of 32 and its high nibbles the
//! next), then the 16 bytes before them 2 at a time (the scale, the
//! minimum's scale, the 12 bytes of 6-bit sub-block scales and minima).
//! Q5_K and Q6_K keep the file's layout and the row kernels (Q5_K's tiles
//! were slower on both processors measured).
//!
//! Where the processor, the instruction-set switch or the exact path rule
//! the kernel out, the products and lookups read the rows back out of the
//! tiles (`unpack`), a copy per product: correct, not fast.

use rayon::prelude::*;

use super::qdot::{GB, K_SUB, Path, QB, QuantizedRows, code, has_high, has_min, is_k, layout_of};
use crate::quant::QuantFormat;

/// Weight rows per tile on the AVX-512 VNNI path: the 16 lanes of a
/// 512-bit vector of i32.
pub(crate) const TILE: usize = 16;
/// Weight rows per tile on the AVX2 path: the 8 lanes of a 256-bit vector
/// of i32 (AVX-VNNI's `vpdpbusd` on Intel's cores from Alder Lake and on
/// Zen 5, `vpmaddubsw` elsewhere).
pub(crate) const TILE8: usize = 8;

/// The rows per tile in which the CPU stores a `[rows, cols]` matrix of
/// `format`, if it does: the formats of the kernels, whole tiles, and a
/// path with a tile kernel in effect, with 8-bit activations on.
pub(crate) fn tile_rows(format: QuantFormat, rows: usize, cols: usize) -> Option<usize> {
    let tile = tile_of_path()?;
    let simple = matches!(
        format,
        QuantFormat::Q4_0
            | QuantFormat::Q4_1
            | QuantFormat::Q5_0
            | QuantFormat::Q5_1
            | QuantFormat::Q8_0
    );
    let ok = (simple || format == QuantFormat::Q4_K && tile == TILE && k_tiles())
        && rows > 0
        && rows.is_multiple_of(tile)
        && cols > 0
        && cols.is_multiple_of(format.block_elems())
        && super::cpu_int8_activations();
    ok.then_some(tile)
}

/// Whether Q4_K matrices take tiles: on processors with AMX (Intel Xeons
/// from Sapphire Rapids on), where the tiles' 1B-shaped products were
/// 15–40% faster than the row kernels, and not elsewhere: on a Zen 5 EPYC
/// they were 15–35% slower (docs/tuning.md, "CPU weights in tiles of 16
/// rows"). AMX itself is not used.
fn k_tiles() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AMX: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
            // CPUID leaf 7: EDX bit 25 is AMX-INT8
            let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
            leaf7.edx & (1 << 25) != 0
        });
        *AMX
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The tile height of the kernel of the path in effect, if it has one.
fn tile_of_path() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        match Path::detect() {
            Some(Path::Avx512Vnni) => Some(TILE),
            Some(Path::Avx2) => Some(TILE8),
            _ => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// Whether the kernel of tiles of `tile` rows runs on this thread now.
pub(crate) fn fast_path(tile: usize) -> bool {
    tile_of_path() == Some(tile)
}

/// Where byte `i` of block `b` of row `row` lies in the tiled matrix of
/// `nb` blocks per row.
#[inline(always)]
fn place(tile: usize, bb: usize, at: usize, nb: usize, row: usize, b: usize, i: usize) -> usize {
    let (t, r) = (row / tile, row % tile);
    let base = (t * nb + b) * tile * bb;
    let quants = (bb - at) * tile;
    if i < at {
        // the scale (i < 2) or the minimum, 2 bytes per row
        let field = i / 2;
        base + quants + field * 2 * tile + r * 2 + i % 2
    } else {
        let q = i - at;
        base + (q / 4) * 4 * tile + r * 4 + q % 4
    }
}

/// `f(i, run)` for the runs of a block's bytes that stay together in the
/// tiles: 2-byte scales and minima, then 4-byte lanes of quants.
#[inline(always)]
fn each_run(bb: usize, at: usize, mut f: impl FnMut(usize, usize)) {
    let mut i = 0;
    while i < bb {
        let run = if i < at { 2 } else { 4 };
        f(i, run);
        i += run;
    }
}

/// The matrix `bytes` (`rows` rows of `nb` blocks, the file's layout) in
/// tiles of `tile` rows.
pub(crate) fn pack(
    format: QuantFormat,
    tile: usize,
    bytes: &[u8],
    rows: usize,
    nb: usize,
    out: &mut [u8],
) {
    let (bb, at, _) = layout_of(code(format));
    let tile_bytes = tile * nb * bb;
    let row_bytes = nb * bb;
    out[..rows * row_bytes]
        .par_chunks_mut(tile_bytes.max(1))
        .enumerate()
        .for_each(|(t, dst)| {
            for r in 0..tile {
                let row = t * tile + r;
                let src = &bytes[row * row_bytes..(row + 1) * row_bytes];
                for b in 0..nb {
                    each_run(bb, at, |i, run| {
                        let o = place(tile, bb, at, nb, r, b, i);
                        dst[o..o + run].copy_from_slice(&src[b * bb + i..b * bb + i + run]);
                    });
                }
            }
        });
}

/// The first `tile` rows of `nb` blocks in the file's layout, `bytes`, as
/// one tile, into `out` (resized, every byte written): a prompt's product
/// of weights kept in rows takes the tile kernel on them a tile at a time
/// ([`prefill_tile`]), the tile staying in the cache between its packing
/// and its use.
pub(crate) fn pack_tile(
    format: QuantFormat,
    tile: usize,
    bytes: &[u8],
    nb: usize,
    out: &mut Vec<u8>,
) {
    let (bb, at, _) = layout_of(code(format));
    let row_bytes = nb * bb;
    out.resize(tile * row_bytes, 0);
    match tile {
        TILE => pack_tile_of::<TILE>(bb, at, nb, bytes, row_bytes, out),
        TILE8 => pack_tile_of::<TILE8>(bb, at, nb, bytes, row_bytes, out),
        _ => unreachable!("tiles are of {TILE} or {TILE8} rows"),
    }
}

/// [`pack_tile`] for tiles of `T` rows: each output run of a block (a
/// word of quants, or a 2-byte field, of every row) written whole, in
/// order, from the `T` rows' blocks.
#[inline(always)]
fn pack_tile_of<const T: usize>(
    bb: usize,
    at: usize,
    nb: usize,
    bytes: &[u8],
    row_bytes: usize,
    out: &mut [u8],
) {
    let quants = (bb - at) * T;
    for (b, dst) in out.chunks_exact_mut(T * bb).enumerate().take(nb) {
        let src: [&[u8]; T] =
            std::array::from_fn(|r| &bytes[r * row_bytes + b * bb..r * row_bytes + (b + 1) * bb]);
        let (dq, dh) = dst.split_at_mut(quants);
        for (j, d) in dq.chunks_exact_mut(4 * T).enumerate() {
            for (r, d) in d.chunks_exact_mut(4).enumerate() {
                d.copy_from_slice(&src[r][at + 4 * j..at + 4 * j + 4]);
            }
        }
        for (f, d) in dh.chunks_exact_mut(2 * T).enumerate() {
            for (r, d) in d.chunks_exact_mut(2).enumerate() {
                d.copy_from_slice(&src[r][2 * f..2 * f + 2]);
            }
        }
    }
}

/// The tile height in which a prompt's product (8 rows of x or more) of
/// `format` weights kept in rows (`rows` of them) packs them for the tile
/// kernel a tile at a time, if it does: Q4_K of whole 16-row tiles where
/// the AVX-512 VNNI kernel runs (the processors without AMX keep Q4_K in
/// rows, whose decode products the tiles slow down). On a Zen 5 EPYC a 1B
/// model's Q4_K prompts of 16 to 512 tokens took 6–36% less time so
/// (docs/tuning.md, "CPU weights in tiles of 16 rows").
pub(crate) fn prefill_tile(format: QuantFormat, rows: usize) -> Option<usize> {
    (format == QuantFormat::Q4_K
        && fast_path(TILE)
        && rows.is_multiple_of(TILE)
        && super::cpu_int8_activations())
    .then_some(TILE)
}

/// Rows `first..first + out.len() / row_bytes` of the matrix `tiles` in
/// tiles of `tile` rows (`nb` blocks a row), in the file's layout.
pub(crate) fn unpack_rows(
    format: QuantFormat,
    tile: usize,
    tiles: &[u8],
    nb: usize,
    first: usize,
    out: &mut [u8],
) {
    let (bb, at, _) = layout_of(code(format));
    let row_bytes = nb * bb;
    for (i, dst) in out.chunks_exact_mut(row_bytes.max(1)).enumerate() {
        let row = first + i;
        for b in 0..nb {
            each_run(bb, at, |j, run| {
                let o = place(tile, bb, at, nb, row, b, j);
                dst[b * bb + j..b * bb + j + run].copy_from_slice(&tiles[o..o + run]);
            });
        }
    }
}

/// The whole matrix in tiles of `tile` rows (`rows` of `nb` blocks) in the
/// file's layout.
pub(crate) fn unpack(
    format: QuantFormat,
    tile: usize,
    tiles: &[u8],
    rows: usize,
    nb: usize,
) -> Vec<u8> {
    let row_bytes = format.bytes_for(nb * format.block_elems());
    let mut out = vec![0u8; rows * row_bytes];
    // a tile of rows per task
    out.par_chunks_mut((tile * row_bytes).max(1))
        .enumerate()
        .for_each(|(t, dst)| unpack_rows(format, tile, tiles, nb, t * tile, dst));
    out
}

/// As `qdot::dot_rows` on the tiles: `out[i * m + r] = w_{first + i} · x_r`
/// for the `out.len() / m` rows from `first` (a multiple of [`TILE`], as
/// is the row count): each tile against 4 rows of x at a time. Only where
/// [`fast_path`]`(tile)`: the AVX-512 VNNI kernel for tiles of 16 rows,
/// the AVX2 ones (AVX-VNNI or `vpmaddubsw`) for tiles of 8.
pub(crate) fn dot_tiles(
    format: QuantFormat,
    tile_rows: usize,
    tiles: &[u8],
    x: &QuantizedRows,
    m: usize,
    first: usize,
    out: &mut [f32],
) {
    dot_tiles_with(vnni256(), format, tile_rows, tiles, x, m, first, out)
}

/// Whether the processor has AVX-VNNI (256-bit `vpdpbusd`).
fn vnni256() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static VNNI256: std::sync::LazyLock<bool> =
            std::sync::LazyLock::new(|| std::arch::is_x86_feature_detected!("avxvnni"));
        *VNNI256
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// [`dot_tiles`], tiles of 8 rows through AVX-VNNI where `vnni`, else
/// through `vpmaddubsw`.
#[allow(clippy::too_many_arguments)]
fn dot_tiles_with(
    vnni: bool,
    format: QuantFormat,
    tile_rows: usize,
    tiles: &[u8],
    x: &QuantizedRows,
    m: usize,
    first: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        let (bb, ..) = layout_of(code(format));
        let blocks = if is_k(code(format)) {
            x.nb / K_SUB
        } else {
            x.nb
        };
        let tile_bytes = tile_rows * blocks * bb;
        for (t, dst) in out.chunks_mut(tile_rows * m).enumerate() {
            let tile = &tiles[(first / tile_rows + t) * tile_bytes..][..tile_bytes];
            let mut r = 0;
            while r < m {
                let n = (m - r).min(4);
                if tile_rows == TILE8 {
                    macro_rules! run8 {
                        ($k:ident) => {
                            match (code(format), n) {
                                (0, 1) => x86::$k::<0, 1>(tile, x, r, m, dst),
                                (0, 2) => x86::$k::<0, 2>(tile, x, r, m, dst),
                                (0, 3) => x86::$k::<0, 3>(tile, x, r, m, dst),
                                (0, _) => x86::$k::<0, 4>(tile, x, r, m, dst),
                                (1, 1) => x86::$k::<1, 1>(tile, x, r, m, dst),
                                (1, 2) => x86::$k::<1, 2>(tile, x, r, m, dst),
                                (1, 3) => x86::$k::<1, 3>(tile, x, r, m, dst),
                                (1, _) => x86::$k::<1, 4>(tile, x, r, m, dst),
                                (3, 1) => x86::$k::<3, 1>(tile, x, r, m, dst),
                                (3, 2) => x86::$k::<3, 2>(tile, x, r, m, dst),
                                (3, 3) => x86::$k::<3, 3>(tile, x, r, m, dst),
                                (3, _) => x86::$k::<3, 4>(tile, x, r, m, dst),
                                (4, 1) => x86::$k::<4, 1>(tile, x, r, m, dst),
                                (4, 2) => x86::$k::<4, 2>(tile, x, r, m, dst),
                                (4, 3) => x86::$k::<4, 3>(tile, x, r, m, dst),
                                (4, _) => x86::$k::<4, 4>(tile, x, r, m, dst),
                                (_, 1) => x86::$k::<2, 1>(tile, x, r, m, dst),
                                (_, 2) => x86::$k::<2, 2>(tile, x, r, m, dst),
                                (_, 3) => x86::$k::<2, 3>(tile, x, r, m, dst),
                                (_, _) => x86::$k::<2, 4>(tile, x, r, m, dst),
                            }
                        };
                    }
                    // SAFETY: as below (AVX2, FMA, F16C, and AVX-VNNI where
                    // `vnni`, which the caller checked)
                    unsafe {
                        if vnni {
                            run8!(tile8)
                        } else {
                            run8!(tile8_madd)
                        }
                    }
                    r += n;
                    continue;
                }
                // SAFETY: the caller checked that the processor has the
                // features the kernel enables (`fast_path`, or the test)
                unsafe {
                    match (code(format), n) {
                        (0, 1) => x86::tile::<0, 1>(tile, x, r, m, dst),
                        (0, 2) => x86::tile::<0, 2>(tile, x, r, m, dst),
                        (0, 3) => x86::tile::<0, 3>(tile, x, r, m, dst),
                        (0, _) => x86::tile::<0, 4>(tile, x, r, m, dst),
                        (1, 1) => x86::tile::<1, 1>(tile, x, r, m, dst),
                        (1, 2) => x86::tile::<1, 2>(tile, x, r, m, dst),
                        (1, 3) => x86::tile::<1, 3>(tile, x, r, m, dst),
                        (1, _) => x86::tile::<1, 4>(tile, x, r, m, dst),
                        (3, 1) => x86::tile::<3, 1>(tile, x, r, m, dst),
                        (3, 2) => x86::tile::<3, 2>(tile, x, r, m, dst),
                        (3, 3) => x86::tile::<3, 3>(tile, x, r, m, dst),
                        (3, _) => x86::tile::<3, 4>(tile, x, r, m, dst),
                        (4, 1) => x86::tile::<4, 1>(tile, x, r, m, dst),
                        (4, 2) => x86::tile::<4, 2>(tile, x, r, m, dst),
                        (4, 3) => x86::tile::<4, 3>(tile, x, r, m, dst),
                        (4, _) => x86::tile::<4, 4>(tile, x, r, m, dst),
                        (5, 1) => x86::tile_k::<5, 1>(tile, x, r, m, dst),
                        (5, 2) => x86::tile_k::<5, 2>(tile, x, r, m, dst),
                        (5, 3) => x86::tile_k::<5, 3>(tile, x, r, m, dst),
                        (5, _) => x86::tile_k::<5, 4>(tile, x, r, m, dst),
                        (_, 1) => x86::tile::<2, 1>(tile, x, r, m, dst),
                        (_, 2) => x86::tile::<2, 2>(tile, x, r, m, dst),
                        (_, 3) => x86::tile::<2, 3>(tile, x, r, m, dst),
                        (_, _) => x86::tile::<2, 4>(tile, x, r, m, dst),
                    }
                }
                r += n;
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (vnni, format, tile_rows, tiles, x, m, first, out);
        unreachable!("the tile kernel is x86-64 only (fast_path is false elsewhere)");
    }
}

/// Offset of the 4 quants of x that meet quant vector `j` of block `b`
/// (see the layout of `QuantizedRows`: a group's first halves, then its
/// second halves).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
const fn x_at(b: usize, j: usize) -> usize {
    (b / GB) * GB * QB + (b % GB) * 16 + if j < 4 { 4 * j } else { GB * 16 + 4 * (j - 4) }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{QuantizedRows, TILE, TILE8, has_high, has_min, layout_of, x_at};
    use std::arch::x86_64::*;

    /// Bytes ahead of the block being read that are asked for, as the row
    /// kernels (docs/tuning.md, "CPU weights in tiles of 16 rows").
    const AHEAD: usize = 2560;

    /// `Σ u·q` per lane of a block of 16 rows (`w`, `q` as for [`x_word`]):
    /// two chains of 4 `vpdpbusd`, then their sum.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni")]
    fn dot16(w: &[__m512i; 8], q: &[i8]) -> __m512 {
        let xb = |j: usize| _mm512_set1_epi32(x_word(q, j));
        let zero = _mm512_setzero_si512();
        let mut d0 = _mm512_dpbusd_epi32(zero, w[0], xb(0));
        let mut d1 = _mm512_dpbusd_epi32(zero, w[4], xb(4));
        for j in 1..4 {
            d0 = _mm512_dpbusd_epi32(d0, w[j], xb(j));
            d1 = _mm512_dpbusd_epi32(d1, w[j + 4], xb(j + 4));
        }
        _mm512_cvtepi32_ps(_mm512_add_epi32(d0, d1))
    }

    /// `(v >> shift) & mask` in each 32-bit lane.
    #[inline(always)]
    fn bits(v: __m512i, shift: u32, mask: i32) -> __m512i {
        // SAFETY: AVX-512 F, which every caller enables
        unsafe {
            _mm512_and_si512(
                _mm512_srlv_epi32(v, _mm512_set1_epi32(shift as i32)),
                _mm512_set1_epi32(mask),
            )
        }
    }

    /// One tile of Q4_K superblocks (`F` 5) against rows
    /// `r0..r0 + R` of x, as [`tile`]. A superblock's quants are 4 runs
    /// of 8 vectors, whose low nibbles are sub-block `2p` and high nibbles
    /// sub-block `2p + 1`; its 6-bit scales and minima are decoded for the
    /// 16 rows at once from the three words of each row's 12 bytes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub(super) fn tile_k<const F: u8, const R: usize>(
        tile: &[u8],
        x: &QuantizedRows,
        r0: usize,
        m: usize,
        dst: &mut [f32],
    ) {
        let (bb, at, _) = layout_of(F);
        let quants = (bb - at) * TILE;
        let tb = TILE * bb;
        let nsb = x.nb / super::K_SUB;
        assert!(tile.len() >= nsb * tb);
        let zero = _mm512_setzero_si512();
        let low4 = _mm512_set1_epi8(15);
        let xq: [&[i8]; R] = std::array::from_fn(|i| x.q_row(r0 + i));
        let xd: [&[f32]; R] = std::array::from_fn(|i| &x.d_row(r0 + i)[..x.nb]);
        let xs: [&[f32]; R] = std::array::from_fn(|i| &x.s_row(r0 + i)[..x.nb]);
        let mut acc = [_mm512_setzero_ps(); R];
        for sb in 0..nsb {
            let blk = &tile[sb * tb..(sb + 1) * tb];
            let ahead = blk.as_ptr().wrapping_add(AHEAD);
            for l in 0..tb.div_ceil(64) {
                // a prefetch never faults
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l).cast());
            }
            // SAFETY: every load reads inside `blk`: 64-byte vectors of
            // quants below `quants`, then arrays of 16 halves (32 bytes)
            let load = |o: usize| unsafe { _mm512_loadu_si512(blk[o..o + 64].as_ptr().cast()) };
            let half = |o: usize| unsafe {
                _mm512_cvtph_ps(_mm256_loadu_si256(blk[o..o + 32].as_ptr().cast()))
            };
            let u16s = |o: usize| unsafe {
                _mm512_cvtepu16_epi32(_mm256_loadu_si256(blk[o..o + 32].as_ptr().cast()))
            };
            // the bytes before the quants, 2 at a time: field f at quants + 32 f
            let word = |f: usize| {
                _mm512_or_si512(
                    u16s(quants + 32 * f),
                    _mm512_slli_epi32::<16>(u16s(quants + 32 * (f + 1))),
                )
            };
            let d = half(quants);
            let dmin = half(quants + 32);
            let (s0, s1, s2) = (word(2), word(4), word(6));
            for p in 0..4 {
                let mut lo = [zero; 8];
                let mut hi = [zero; 8];
                for v in 0..8 {
                    let q = load(64 * (8 * p + v));
                    lo[v] = _mm512_and_si512(q, low4);
                    hi[v] = _mm512_and_si512(_mm512_srli_epi16::<4>(q), low4);
                }
                // scales and minima of sub-blocks 2p and 2p + 1
                let scale = |j: usize| {
                    let (sc, mn) = if j < 4 {
                        (bits(s0, 8 * j as u32, 63), bits(s1, 8 * j as u32, 63))
                    } else {
                        let t = 8 * (j - 4) as u32;
                        (
                            _mm512_or_si512(
                                bits(s2, t, 15),
                                _mm512_slli_epi32::<4>(bits(s0, t + 6, 3)),
                            ),
                            _mm512_or_si512(
                                bits(s2, t + 4, 15),
                                _mm512_slli_epi32::<4>(bits(s1, t + 6, 3)),
                            ),
                        )
                    };
                    (
                        _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)),
                        _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn)),
                    )
                };
                let (dl, ml) = scale(2 * p);
                let (dh, mh) = scale(2 * p + 1);
                let b = sb * super::K_SUB + 2 * p;
                for i in 0..R {
                    let dot =
                        |u: &[__m512i; 8], b: usize| dot16(u, &xq[i][x_at(b, 0)..x_at(b, 7) + 4]);
                    // w = d·sc·u - dmin·m: dx · (d·sc) · Σu·q - (dmin·m) · sx
                    let (a, c) = (dot(&lo, b), dot(&hi, b + 1));
                    let t = _mm512_mul_ps(a, _mm512_set1_ps(xd[i][b]));
                    acc[i] = _mm512_fmadd_ps(dl, t, acc[i]);
                    acc[i] = _mm512_fnmadd_ps(ml, _mm512_set1_ps(xs[i][b]), acc[i]);
                    let t = _mm512_mul_ps(c, _mm512_set1_ps(xd[i][b + 1]));
                    acc[i] = _mm512_fmadd_ps(dh, t, acc[i]);
                    acc[i] = _mm512_fnmadd_ps(mh, _mm512_set1_ps(xs[i][b + 1]), acc[i]);
                }
            }
        }
        store(&acc, r0, m, dst);
    }

    /// The 16 lanes of each accumulator into `dst[lane * m + r0 + i]`.
    #[inline(always)]
    fn store<const R: usize>(acc: &[__m512; R], r0: usize, m: usize, dst: &mut [f32]) {
        for (i, acc) in acc.iter().enumerate() {
            let mut v = [0f32; TILE];
            // SAFETY: `v` holds 16 f32
            unsafe { _mm512_storeu_ps(v.as_mut_ptr(), *acc) };
            scatter(&v, r0 + i, m, dst);
        }
    }

    /// `dst[lane * m + col] = v[lane]`: one row of x's results for each
    /// row of a tile, into the product's transposed output.
    #[inline(always)]
    fn scatter(v: &[f32], col: usize, m: usize, dst: &mut [f32]) {
        for (lane, v) in v.iter().enumerate() {
            if let Some(d) = dst.get_mut(lane * m + col) {
                *d = *v;
            }
        }
    }

    /// Byte masks of the quants of vector `j` (4 bytes a lane) whose fifth
    /// bit is set in the lane's `qh`: for the low nibbles (bits `4j..4j +
    /// 4`) and the high ones (bits `16 + 4j..`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn fifth_bits(qh: __m512i, j: usize) -> (__mmask64, __mmask64) {
        // each byte of a lane takes the byte of qh holding its bit
        let (a, b) = ((j / 2) as i8, (2 + j / 2) as i8);
        let pick = |c: i8| {
            _mm512_broadcast_i32x4(_mm_setr_epi8(
                c,
                c,
                c,
                c,
                c + 4,
                c + 4,
                c + 4,
                c + 4,
                c + 8,
                c + 8,
                c + 8,
                c + 8,
                c + 12,
                c + 12,
                c + 12,
                c + 12,
            ))
        };
        let o = 4 * (j % 2) as u32;
        let bits = _mm512_set1_epi32(i32::from_le_bytes([1 << o, 2 << o, 4 << o, 8 << o]));
        (
            _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, pick(a)), bits),
            _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, pick(b)), bits),
        )
    }

    /// One tile against rows `r0..r0 + R` of x: `dst[lane * m + r0 + i]`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub(super) fn tile<const F: u8, const R: usize>(
        tile: &[u8],
        x: &QuantizedRows,
        r0: usize,
        m: usize,
        dst: &mut [f32],
    ) {
        let (bb, at, bias) = layout_of(F);
        let nq = (bb - at) / 4;
        let quants = nq * 64;
        let tb = TILE * bb;
        let nb = x.nb;
        assert!(tile.len() >= nb * tb);
        let zero = _mm512_setzero_si512();
        let low4 = _mm512_set1_epi8(15);
        let flip = _mm512_set1_epi8(-128);
        let xq: [&[i8]; R] = std::array::from_fn(|i| x.q_row(r0 + i));
        let xd: [&[f32]; R] = std::array::from_fn(|i| &x.d_row(r0 + i)[..nb]);
        let xs: [&[f32]; R] = std::array::from_fn(|i| &x.s_row(r0 + i)[..nb]);
        let mut acc = [_mm512_setzero_ps(); R];
        for b in 0..nb {
            let blk = &tile[b * tb..(b + 1) * tb];
            let ahead = blk.as_ptr().wrapping_add(AHEAD);
            for l in 0..tb.div_ceil(64) {
                // a prefetch never faults
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l).cast());
            }
            // SAFETY: every load reads inside `blk` (64-byte vectors from
            // 0 to `quants`, then 32 bytes of scales and of minima)
            let load = |o: usize| unsafe { _mm512_loadu_si512(blk[o..o + 64].as_ptr().cast()) };
            let half = |o: usize| unsafe {
                _mm512_cvtph_ps(_mm256_loadu_si256(blk[o..o + 32].as_ptr().cast()))
            };
            let mut w = [zero; 8];
            if F == 0 {
                for (j, w) in w.iter_mut().enumerate() {
                    *w = _mm512_xor_si512(load(64 * j), flip);
                }
            } else {
                for j in 0..4 {
                    let v = load(64 * j);
                    w[j] = _mm512_and_si512(v, low4);
                    w[j + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4);
                }
            }
            if has_high(F) {
                // the 16 rows' fifth bits (two arrays of halves), to bit 4
                // of each quant: vector j's low nibbles take bits
                // `4j..4j + 4`, its high ones bits `16 + 4j..`
                let half16 = |o: usize| unsafe {
                    _mm512_cvtepu16_epi32(_mm256_loadu_si256(blk[o..o + 32].as_ptr().cast()))
                };
                let qh = _mm512_or_si512(
                    half16(quants + 32 * ((at - 4) / 2)),
                    _mm512_slli_epi32::<16>(half16(quants + 32 * ((at - 2) / 2))),
                );
                let sixteen = _mm512_set1_epi8(16);
                for j in 0..4 {
                    let (lo, hi) = fifth_bits(qh, j);
                    w[j] = _mm512_or_si512(w[j], _mm512_maskz_mov_epi8(lo, sixteen));
                    w[j + 4] = _mm512_or_si512(w[j + 4], _mm512_maskz_mov_epi8(hi, sixteen));
                }
            }
            let dw = half(quants);
            for i in 0..R {
                let dot = dot16(&w, &xq[i][x_at(b, 0)..x_at(b, 7) + 4]);
                let (dx, sx) = (xd[i][b], xs[i][b]);
                if has_min(F) {
                    // Q4_1, Q5_1: dw · dx · Σu·q + m · sx
                    let mw = half(quants + 32);
                    acc[i] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[i]);
                    acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx), acc[i]);
                } else {
                    // dw · (dx · Σu·q - bias · sx)
                    let t = _mm512_fmadd_ps(dot, _mm512_set1_ps(dx), _mm512_set1_ps(-bias * sx));
                    acc[i] = _mm512_fmadd_ps(dw, t, acc[i]);
                }
            }
        }
        store(&acc, r0, m, dst);
    }

    /// The body of the kernels of tiles of 8 rows (`tile8`, `tile8_madd`),
    /// given the block dot product (`$dot`) and whether it leaves Q8_0's
    /// quants signed (`$signed8`).
    macro_rules! tile8_body {
        ($tile:ident, $x:ident, $r0:ident, $m:ident, $dst:ident, $dot:ident, $signed8:expr) => {{
            let (bb, at, bias) = layout_of(F);
            let quants = (bb - at) * TILE8;
            let tb = TILE8 * bb;
            let nb = $x.nb;
            assert!($tile.len() >= nb * tb);
            let zero = _mm256_setzero_si256();
            let low4 = _mm256_set1_epi8(15);
            let sixteen = _mm256_set1_epi8(16);
            let xq: [&[i8]; R] = std::array::from_fn(|i| $x.q_row($r0 + i));
            let xd: [&[f32]; R] = std::array::from_fn(|i| &$x.d_row($r0 + i)[..nb]);
            let xs: [&[f32]; R] = std::array::from_fn(|i| &$x.s_row($r0 + i)[..nb]);
            let mut acc = [_mm256_setzero_ps(); R];
            for b in 0..nb {
                let blk = &$tile[b * tb..(b + 1) * tb];
                let ahead = blk.as_ptr().wrapping_add(AHEAD);
                for l in 0..tb.div_ceil(64) {
                    // a prefetch never faults
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l).cast());
                }
                // SAFETY: every load reads inside `blk`: 32-byte vectors of
                // quants below `quants`, then arrays of 8 halves (16 bytes)
                let load = |o: usize| unsafe { _mm256_loadu_si256(blk[o..o + 32].as_ptr().cast()) };
                let half8 = |o: usize| unsafe { _mm_loadu_si128(blk[o..o + 16].as_ptr().cast()) };
                let mut w = [zero; 8];
                if F == 0 {
                    let flip = _mm256_set1_epi8(-128);
                    for (j, w) in w.iter_mut().enumerate() {
                        *w = _mm256_xor_si256(load(32 * j), flip);
                    }
                } else {
                    for j in 0..4 {
                        let v = load(32 * j);
                        w[j] = _mm256_and_si256(v, low4);
                        w[j + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4);
                    }
                }
                if has_high(F) {
                    // the fifth bits, as in `block`: byte c of lane r takes bit
                    // `4j + c` (low nibbles) or `16 + 4j + c` (high) of row r's qh
                    let qh = _mm256_or_si256(
                        _mm256_cvtepu16_epi32(half8(quants + 16 * ((at - 4) / 2))),
                        _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(half8(
                            quants + 16 * ((at - 2) / 2),
                        ))),
                    );
                    for j in 0..4 {
                        let (a, c) = ((j / 2) as i8, (2 + j / 2) as i8);
                        let pick = |c: i8| {
                            _mm256_setr_epi8(
                                c,
                                c,
                                c,
                                c,
                                c + 4,
                                c + 4,
                                c + 4,
                                c + 4,
                                c + 8,
                                c + 8,
                                c + 8,
                                c + 8,
                                c + 12,
                                c + 12,
                                c + 12,
                                c + 12,
                                c,
                                c,
                                c,
                                c,
                                c + 4,
                                c + 4,
                                c + 4,
                                c + 4,
                                c + 8,
                                c + 8,
                                c + 8,
                                c + 8,
                                c + 12,
                                c + 12,
                                c + 12,
                                c + 12,
                            )
                        };
                        let o = 4 * (j % 2) as u32;
                        let bits =
                            _mm256_set1_epi32(i32::from_le_bytes([1 << o, 2 << o, 4 << o, 8 << o]));
                        let set = |c: i8| {
                            let v = _mm256_and_si256(_mm256_shuffle_epi8(qh, pick(c)), bits);
                            _mm256_and_si256(_mm256_cmpeq_epi8(v, bits), sixteen)
                        };
                        w[j] = _mm256_or_si256(w[j], set(a));
                        w[j + 4] = _mm256_or_si256(w[j + 4], set(c));
                    }
                }
                let dw = _mm256_cvtph_ps(half8(quants));
                let mw = if has_min(F) {
                    _mm256_cvtph_ps(half8(quants + 16))
                } else if F == 0 && $signed8 {
                    // the dot product of Q8_0's signed quants: no offset
                    _mm256_setzero_ps()
                } else {
                    _mm256_mul_ps(dw, _mm256_set1_ps(-bias))
                };
                for i in 0..R {
                    let q = &xq[i][x_at(b, 0)..x_at(b, 7) + 4];
                    let dot = $dot::<F>(&w, q);
                    // dw · dx · Σu·q + mw · sx
                    let t = _mm256_mul_ps(dot, _mm256_set1_ps(xd[i][b]));
                    acc[i] = _mm256_fmadd_ps(dw, t, acc[i]);
                    acc[i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xs[i][b]), acc[i]);
                }
            }
            for (i, acc) in acc.iter().enumerate() {
                let mut v = [0f32; TILE8];
                // SAFETY: `v` holds 8 f32
                unsafe { _mm256_storeu_ps(v.as_mut_ptr(), *acc) };
                scatter(&v, $r0 + i, $m, $dst);
            }
        }};
    }

    /// As [`tile`] for tiles of 8 rows, with AVX-VNNI's 256-bit `vpdpbusd`
    /// (the AVX2 path on processors that have it).
    #[inline]
    #[target_feature(enable = "avx2,avxvnni,fma,f16c")]
    pub(super) fn tile8<const F: u8, const R: usize>(
        tile: &[u8],
        x: &QuantizedRows,
        r0: usize,
        m: usize,
        dst: &mut [f32],
    ) {
        tile8_body!(tile, x, r0, m, dst, dot8_vnni, false)
    }

    /// As [`tile8`] with AVX2 alone (`vpmaddubsw`, `vpmaddwd`), for
    /// processors without AVX-VNNI.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn tile8_madd<const F: u8, const R: usize>(
        tile: &[u8],
        x: &QuantizedRows,
        r0: usize,
        m: usize,
        dst: &mut [f32],
    ) {
        tile8_body!(tile, x, r0, m, dst, dot8_madd, true)
    }

    /// The 4 quants of x (`q` from `x_at(b, 0)` on) that meet a block's
    /// quant vector `j`, as one word (each kernel broadcasts it).
    #[inline(always)]
    fn x_word(q: &[i8], j: usize) -> i32 {
        let o = x_at(0, j);
        i32::from_le_bytes([q[o] as u8, q[o + 1] as u8, q[o + 2] as u8, q[o + 3] as u8])
    }

    /// [`x_word`] broadcast to 8 lanes.
    #[inline(always)]
    fn bcast8(q: &[i8], j: usize) -> __m256i {
        // SAFETY: AVX, which every caller enables
        unsafe { _mm256_set1_epi32(x_word(q, j)) }
    }

    /// `Σ u·q` per lane of a block of 8 rows: two chains of 4 `vpdpbusd`.
    #[inline]
    #[target_feature(enable = "avx2,avxvnni")]
    fn dot8_vnni<const F: u8>(w: &[__m256i; 8], q: &[i8]) -> __m256 {
        let xb = |j: usize| bcast8(q, j);
        let zero = _mm256_setzero_si256();
        let mut d0 = _mm256_dpbusd_avx_epi32(zero, w[0], xb(0));
        let mut d1 = _mm256_dpbusd_avx_epi32(zero, w[4], xb(4));
        for j in 1..4 {
            d0 = _mm256_dpbusd_avx_epi32(d0, w[j], xb(j));
            d1 = _mm256_dpbusd_avx_epi32(d1, w[j + 4], xb(j + 4));
        }
        _mm256_cvtepi32_ps(_mm256_add_epi32(d0, d1))
    }

    /// The same with `vpmaddubsw`: Q4 and Q5 quants (at most 31) sum four
    /// products of pairs in 16 bits without overflow (4 · 2 · 31 · 127 <
    /// 2^15) before `vpmaddwd` widens them; Q8_0's are taken signed, as
    /// |q| against x with q's sign, and widened one vector at a time.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn dot8_madd<const F: u8>(w: &[__m256i; 8], q: &[i8]) -> __m256 {
        let xb = |j: usize| bcast8(q, j);
        let ones = _mm256_set1_epi16(1);
        let mut sum = _mm256_setzero_si256();
        if F == 0 {
            let flip = _mm256_set1_epi8(-128);
            for (j, w) in w.iter().enumerate() {
                let s = _mm256_xor_si256(*w, flip);
                let p = _mm256_maddubs_epi16(_mm256_abs_epi8(s), _mm256_sign_epi8(xb(j), s));
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, ones));
            }
        } else {
            for h in [0, 4] {
                let p = |j: usize| _mm256_maddubs_epi16(w[h + j], xb(h + j));
                let p =
                    _mm256_add_epi16(_mm256_add_epi16(p(0), p(1)), _mm256_add_epi16(p(2), p(3)));
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, ones));
            }
        }
        _mm256_cvtepi32_ps(sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::qdot::{self, WeightRows};

    const FORMATS: [QuantFormat; 6] = [
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q5_0,
        QuantFormat::Q5_1,
        QuantFormat::Q4_K,
    ];

    /// `simple` for the formats of 32-value blocks, whole superblocks of
    /// 256 (one, three, nine) for the K-quants.
    fn shapes(format: QuantFormat, simple: &'static [(usize, usize)]) -> &'static [(usize, usize)] {
        if format.block_elems() == 256 {
            &[(16, 256), (32, 768), (48, 2304)]
        } else {
            simple
        }
    }

    fn values(n: usize, seed: u64) -> Vec<f32> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
    }

    #[test]
    fn unpacking_gives_back_the_file_layout() {
        for tile in [TILE, TILE8] {
            for format in FORMATS {
                for &(rows, k) in shapes(format, &[(16, 32), (32, 96), (48, 160)]) {
                    let bytes = qdot::tests::quantize(format, &values(rows * k, 3));
                    let nb = k / format.block_elems();
                    let mut tiles = vec![0u8; bytes.len()];
                    pack(format, tile, &bytes, rows, nb, &mut tiles);
                    let what = format!("{format} {rows}x{k} in tiles of {tile}");
                    assert!(tiles != bytes, "{what}: the tiles are a new order");
                    // a prompt's packing, a tile at a time, gives the same
                    let mut one = Vec::new();
                    let tile_bytes = tile * format.bytes_for(k);
                    for (t, want) in tiles.chunks_exact(tile_bytes).enumerate() {
                        pack_tile(format, tile, &bytes[t * tile_bytes..], nb, &mut one);
                        assert!(one == want, "{what}: pack_tile of tile {t}");
                    }
                    assert!(unpack(format, tile, &tiles, rows, nb) == bytes, "{what}");
                    let row_bytes = format.bytes_for(k);
                    let mut one = vec![0u8; row_bytes];
                    unpack_rows(format, tile, &tiles, nb, rows - 3, &mut one);
                    assert!(one == bytes[(rows - 3) * row_bytes..(rows - 2) * row_bytes]);
                }
            }
        }
    }

    /// The tile kernels (of 16 rows on AVX-512 VNNI, of 8 on AVX2 with and
    /// without AVX-VNNI) against the scalar row kernel, which they must match up to the
    /// order of f32 additions.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn tiles_match_the_row_kernel() {
        let isas = crate::cpu_isa_available();
        let mut kernels = Vec::new();
        if isas.contains(&crate::CpuIsa::Avx512) {
            kernels.push((TILE, Path::Avx512Vnni, true));
        }
        if isas.contains(&crate::CpuIsa::Avx2) {
            kernels.push((TILE8, Path::Avx2, false));
        }
        if std::arch::is_x86_feature_detected!("avxvnni") {
            kernels.push((TILE8, Path::Avx2, true));
        }
        if kernels.is_empty() {
            eprintln!("no AVX2 here: no tile kernel is run");
        }
        for (tile, path, vnni) in kernels {
            for format in FORMATS {
                if tile == TILE8 && is_k(code(format)) {
                    continue; // K-quants take tiles of 16 only
                }
                // group of 4 blocks whole, cut short, and long rows
                const SIMPLE: [(usize, usize); 5] =
                    [(16, 32), (32, 96), (48, 160), (16, 576), (32, 2080)];
                for &(rows, k) in shapes(format, &SIMPLE) {
                    let bytes = qdot::tests::quantize(format, &values(rows * k, 7));
                    let nb = k / format.block_elems();
                    let mut tiles = vec![0u8; bytes.len()];
                    pack(format, tile, &bytes, rows, nb, &mut tiles);
                    for m in [1, 2, 3, 4, 5, 7, 8, 13] {
                        let xs = values(m * k, 11 + m as u64);
                        let x = QuantizedRows::new(path, &xs, m, k);
                        let mut want = vec![0f32; rows * m];
                        let w = WeightRows::new(format, &bytes, format.bytes_for(k));
                        qdot::dot_rows(Path::Scalar, w, &x, m, &mut want);
                        // from the second tile on, as a task of a split product
                        let first = if rows > tile { tile } else { 0 };
                        let mut got = vec![0f32; (rows - first) * m];
                        dot_tiles_with(vnni, format, tile, &tiles, &x, m, first, &mut got);
                        let want = &want[first * m..];
                        let scale = want.iter().fold(1e-3f32, |a, v| a.max(v.abs()));
                        for (i, (g, w)) in got.iter().zip(want).enumerate() {
                            assert!(
                                (g - w).abs() <= 1e-5 * scale * (k as f32).sqrt(),
                                "{format} {rows}x{k} tiles of {tile} m={m} #{i}: {g} vs {w}"
                            );
                        }
                    }
                }
            }
        }
    }
}
