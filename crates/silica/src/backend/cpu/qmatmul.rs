//! `x @ wᵀ` for quantized `w` on the CPU: blocks are decoded into a small
//! buffer next to their use, never into a copy of the matrix.
//!
//! For few rows of x (decode) each weight row is decoded one block at a
//! time and dotted with every row of x. For more rows, panels of weight rows
//! are decoded and multiplied through the `gemm` crate. Both split the
//! weight rows across threads; the inner loops are written so that the
//! compiler vectorizes them, and are compiled a second time for AVX2/FMA and
//! AVX-512 where the processor has them (chosen at run time).
//!
//! With 8-bit activations (the default), Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0
//! and the K-quants take integer kernels instead: row dots (`qdot`) for
//! fewer than `GEMM_MIN_M` rows of x, tiles over decoded panels of 4 weight
//! rows (`qgemm`) from there on. K-quants without tiles on the path
//! (`qgemm::integer_prefill`) take the f32 panels there, with x rounded to
//! 8 bits as the integer kernels round it.
//!
//! Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 (and on some processors Q4_K)
//! matrices that the CPU stores in tiles of rows (`packed`: 16 on the
//! AVX-512 VNNI path, 8 on the AVX2 path) take the tile kernels for any
//! number of rows of x, or are read back out of the tiles where the path
//! in effect has changed since they were loaded.

use rayon::prelude::*;

use super::host;
use super::matmul::{Operand, gemm_f32};
use super::packed;
use super::qdot;
use super::qgemm;
use crate::quant::QuantFormat;
use crate::storage::CpuStorage;
use crate::{DType, Error, Result, Tensor};

/// Rows of x up to which the block-dot path is used.
const DOT_MAX_M: usize = 8;
/// Weight rows decoded per panel of the gemm path (at least; more for
/// large matrices, since each panel packs x again).
const PANEL: usize = 64;
/// Weight rows per task of the block-dot path (at least).
const DOT_TASK: usize = 16;
/// Rows of x from which the integer path multiplies tiles (`qgemm`).
const GEMM_MIN_M: usize = 8;
/// Multiply-adds per task of the integer path (at least): below it, handing
/// work to another thread costs more than it saves (docs/tuning.md, "CPU
/// thread-pool thresholds").
const INT8_TASK_MIN: usize = 1 << 15;

pub fn qmatmul(
    format: QuantFormat,
    x: &Tensor,
    w: &Tensor,
    out_shape: &[usize],
    out: DType,
) -> CpuStorage {
    let k = x.shape().last().copied().unwrap_or(0);
    let n = out_shape.last().copied().unwrap_or(0);
    let m = x.numel().checked_div(k).unwrap_or(0);
    let mut xs = host(x).gather_f32(x.layout());
    let mut wb: &[u8] = host(w).as_bytes();
    let row_bytes = format.bytes_for(k);
    // results transposed, [n, m]: each task owns a run of weight rows
    let mut out_t = vec![0f32; n * m];
    // 8-bit activations unless the exact path is asked for
    // (`crate::set_cpu_int8_activations`)
    let int8 = if qdot::supports(format) && super::int8_now() {
        qdot::Path::detect()
    } else {
        None
    };
    // weights in tiles of 16 rows (`packed`): their kernels where the
    // path has them, else the rows read back out
    let tile = tile_rows(w, n);
    // the path of the tile kernels, where they run
    let tiles_run = int8.filter(|_| tile > 0 && packed::fast_path(tile));
    let unpacked: Vec<u8>;
    if tile > 0 && tiles_run.is_none() {
        unpacked = packed::unpack(format, tile, wb, n, k / format.block_elems());
        wb = &unpacked;
    }
    if let Some(path) = tiles_run
        && m > 0
        && n > 0
    {
        let xq = qdot::QuantizedRows::new(path, &xs, m, k);
        let rows = int8_task_rows(n, m, k).next_multiple_of(tile);
        let run =
            |t: usize, dst: &mut [f32]| packed::dot_tiles(format, tile, wb, &xq, m, t * rows, dst);
        if m < GEMM_MIN_M {
            // decode: workers that stay awake between products
            super::spin::for_each_chunk(&mut out_t, rows * m, run);
        } else {
            // each tile meets every row of x, 4 at a time, while its blocks
            // stay in the first-level cache
            out_t
                .par_chunks_mut(rows * m)
                .enumerate()
                .for_each(|(t, dst)| run(t, dst));
        }
    } else if m > 0 && n > 0 {
        if let Some(path) = int8
            && (m < GEMM_MIN_M || qgemm::integer_prefill(path, format))
        {
            let xq = qdot::QuantizedRows::new(path, &xs, m, k);
            let w = qdot::WeightRows::new(format, wb, row_bytes);
            // tiles for many rows of x, row dots for few (decode)
            let tiled = m >= GEMM_MIN_M;
            let mut rows = int8_task_rows(n, m, k);
            // Q4_K's rows packed into tiles by each task, where that wins
            let repack = packed::prefill_tile(format, n).filter(|_| tiled);
            if tiled {
                rows = rows.next_multiple_of(repack.unwrap_or(qgemm::NR));
            }
            if tiled {
                let nb = k / format.block_elems();
                out_t
                    .par_chunks_mut(rows * m)
                    .enumerate()
                    .for_each(|(t, dst)| match repack {
                        Some(h) => {
                            let mut tile = Vec::new();
                            for (i, dst) in dst.chunks_mut(h * m).enumerate() {
                                let first = (t * rows + i * h) * row_bytes;
                                packed::pack_tile(format, h, &wb[first..], nb, &mut tile);
                                packed::dot_tiles(format, h, &tile, &xq, m, 0, dst);
                            }
                        }
                        None => qgemm::gemm_rows(path, w.skip(t * rows), &xq, m, dst),
                    });
            } else {
                // decode: workers that stay awake between products
                super::spin::for_each_chunk(&mut out_t, rows * m, |t, dst| {
                    qdot::dot_rows(path, w.skip(t * rows), &xq, m, dst);
                });
            }
        } else if m <= DOT_MAX_M && int8.is_none() {
            // sums of each run of 16 values of x (the groups' offsets multiply them)
            let sums: Vec<f32> = xs.chunks_exact(16).map(|c| c.iter().sum()).collect();
            // runs of at least DOT_TASK rows, up to 4 per thread
            let threads = rayon::current_num_threads().max(1);
            let rows = n.div_ceil(4 * threads).max(DOT_TASK);
            super::spin::for_each_chunk(&mut out_t, rows * m, |t, dst| {
                for (i, dst) in dst.chunks_mut(m).enumerate() {
                    let j = t * rows + i;
                    let row = &wb[j * row_bytes..(j + 1) * row_bytes];
                    row_dots(format, row, &xs, &sums, k, dst);
                }
            });
        } else {
            if let Some(path) = int8 {
                // a product the integer kernels would be slower at: the
                // panels with x rounded as those kernels round it, so that
                // its numbers do not depend on the path
                qdot::round_to_8_bits(path, &mut xs);
            }
            // about two panels per thread, whole 16s of rows
            let threads = rayon::current_num_threads().max(1);
            let panel = (n.div_ceil(2 * threads).next_multiple_of(16)).clamp(PANEL, 1024);
            out_t
                .par_chunks_mut(panel * m)
                .enumerate()
                .for_each(|(p, dst)| {
                    let rows = dst.len() / m;
                    let j0 = p * panel;
                    let mut panel = vec![0f32; rows * k];
                    format.decode_into(&wb[j0 * row_bytes..(j0 + rows) * row_bytes], &mut panel);
                    // dst [rows, m] = panel [rows, k] @ xᵀ
                    let lhs = Operand {
                        data: &panel,
                        offset: 0,
                        rs: k,
                        cs: 1,
                    };
                    let rhs = Operand {
                        data: &xs,
                        offset: 0,
                        rs: 1,
                        cs: k,
                    };
                    gemm_f32(rows, m, k, &lhs, &rhs, dst, false, false);
                });
        }
    }
    if m == 1 {
        // [n, 1] is already [1, n]
        return CpuStorage::from_f32(out_t, out);
    }
    CpuStorage::from_f32(transpose(&out_t, n, m), out)
}

/// `t` [n, m] transposed to [m, n], in tiles of 64 columns, whose rows of
/// `t` stay in cache while each row of the result is written; rows in
/// parallel (runs of `m.div_ceil(8)`) for large matrices.
fn transpose(t: &[f32], n: usize, m: usize) -> Vec<f32> {
    const TILE: usize = 64;
    let mut result = vec![0f32; m * n];
    if m == 0 || n == 0 {
        return result;
    }
    let chunk_rows = m.div_ceil(8);
    // chunk c: rows c * chunk_rows.. of the result (the last chunk may hold
    // fewer rows, so its first row is not c * its own row count)
    let run = |(c, dst): (usize, &mut [f32])| {
        let r0 = c * chunk_rows;
        for j0 in (0..n).step_by(TILE) {
            let j1 = (j0 + TILE).min(n);
            for (r, dst) in dst.chunks_exact_mut(n).enumerate() {
                for (j, v) in dst[j0..j1].iter_mut().enumerate() {
                    *v = t[(j0 + j) * m + r0 + r];
                }
            }
        }
    };
    if m * n >= super::PAR_MIN {
        result
            .par_chunks_mut(n * chunk_rows)
            .enumerate()
            .for_each(run);
    } else {
        result.chunks_mut(n * chunk_rows).enumerate().for_each(run);
    }
    result
}

/// Weight rows per task of the integer path: up to 4 tasks per thread,
/// but none below `INT8_TASK_MIN` multiply-adds, where handing work to
/// another thread costs more than it saves.
fn int8_task_rows(n: usize, m: usize, k: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let tasks = (n * m * k / INT8_TASK_MIN).clamp(1, 4 * threads);
    n.div_ceil(tasks).max(1)
}

/// The rows per tile of a quantized matrix of `n` rows stored in tiles
/// (`packed`: `[tiles, words]` rather than the file's flat `[words]`), 0
/// for the file's layout.
pub(crate) fn tile_rows(w: &Tensor, n: usize) -> usize {
    match w.shape() {
        &[tiles, _] if tiles > 0 => n / tiles,
        _ => 0,
    }
}

/// Rows `ids` of the quantized matrix `w` (rows of `k` values), decoded.
pub fn qrows(
    format: QuantFormat,
    ids: &Tensor,
    w: &Tensor,
    k: usize,
    out: DType,
) -> Result<CpuStorage> {
    let wb: &[u8] = host(w).as_bytes();
    let row_bytes = format.bytes_for(k);
    let rows = wb.len() / row_bytes.max(1);
    let ids: Vec<u32> = host(ids)
        .gather(ids.layout())
        .into_vec()
        .unwrap_or_default();
    let mut result = vec![0f32; ids.len() * k];
    let tile = tile_rows(w, rows);
    let mut row = vec![0u8; if tile > 0 { row_bytes } else { 0 }];
    for (&id, dst) in ids.iter().zip(result.chunks_exact_mut(k.max(1))) {
        let id = id as usize;
        if id >= rows {
            return Err(Error::IndexOutOfRange {
                op: "embedding_q",
                index: id as i64,
                size: rows,
            });
        }
        if tile > 0 {
            packed::unpack_rows(format, tile, wb, k / format.block_elems(), id, &mut row);
            format.decode_into(&row, dst);
        } else {
            format.decode_into(&wb[id * row_bytes..(id + 1) * row_bytes], dst);
        }
    }
    Ok(CpuStorage::from_f32(result, out))
}

/// `dst[r] = x[r] · row` for each of the `dst.len()` rows of `xs` (`k`
/// values each), `row` one weight row of blocks; `sums` holds the sums of
/// each run of 16 values of each row of `xs`.
fn row_dots(format: QuantFormat, row: &[u8], xs: &[f32], sums: &[f32], k: usize, dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        let isa = crate::cpu_isa();
        if isa >= crate::CpuIsa::Avx512 {
            // SAFETY: cpu_isa is never above what the processor has, which
            // covers the features the function is compiled for
            return unsafe { row_dots_avx512(format, row, xs, sums, k, dst) };
        }
        if isa >= crate::CpuIsa::Avx2 {
            // SAFETY: as above
            return unsafe { row_dots_avx2(format, row, xs, sums, k, dst) };
        }
    }
    row_dots_any(format, row, xs, sums, k, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn row_dots_avx512(
    format: QuantFormat,
    row: &[u8],
    xs: &[f32],
    sums: &[f32],
    k: usize,
    dst: &mut [f32],
) {
    row_dots_any(format, row, xs, sums, k, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn row_dots_avx2(
    format: QuantFormat,
    row: &[u8],
    xs: &[f32],
    sums: &[f32],
    k: usize,
    dst: &mut [f32],
) {
    row_dots_any(format, row, xs, sums, k, dst)
}

/// One instance of the block loop per format, so that each is inlined and
/// vectorized on its own.
#[inline(always)]
fn row_dots_any(
    format: QuantFormat,
    row: &[u8],
    xs: &[f32],
    sums: &[f32],
    k: usize,
    dst: &mut [f32],
) {
    use QuantFormat as Q;
    match format {
        Q::Q8_0 => row_dots_of::<0>(row, xs, sums, k, dst),
        Q::Q4_0 => row_dots_of::<1>(row, xs, sums, k, dst),
        Q::Q4_1 => row_dots_of::<2>(row, xs, sums, k, dst),
        Q::Q5_0 => row_dots_of::<3>(row, xs, sums, k, dst),
        Q::Q5_1 => row_dots_of::<4>(row, xs, sums, k, dst),
        Q::Q4_K => row_dots_of::<5>(row, xs, sums, k, dst),
        Q::Q5_K => row_dots_of::<6>(row, xs, sums, k, dst),
        Q::Q6_K => row_dots_of::<7>(row, xs, sums, k, dst),
    }
}

/// The block loop of format `F` (`QuantFormat::gpu_code` order): per group
/// of 32 values, the raw quants times x in 16 lanes scaled by the group's
/// scale, and the group's offset times the sums of x.
#[inline(always)]
fn row_dots_of<const F: u8>(row: &[u8], xs: &[f32], sums: &[f32], k: usize, dst: &mut [f32]) {
    let format = QuantFormat::ALL[F as usize];
    let bb = format.block_bytes();
    let gpb = format.block_elems() / 32;
    let m = dst.len();
    if m == 1 {
        // decode: the accumulators stay in registers
        let mut acc = [0f32; 16];
        let mut offs = 0f32;
        let mut q = [0f32; 32];
        let (xg, _) = xs[..k].as_chunks::<32>();
        let (sg, _) = sums[..k / 16].as_chunks::<2>();
        for (b, block) in row.chunks_exact(bb).enumerate() {
            for g in 0..gpb {
                let s = group_quants::<F>(block, g, &mut q);
                let (x, xs16) = (&xg[b * gpb + g], &sg[b * gpb + g]);
                for i in 0..16 {
                    acc[i] += s[0] * (q[i] * x[i]) + s[2] * (q[i + 16] * x[i + 16]);
                }
                offs += s[1] * xs16[0] + s[3] * xs16[1];
            }
        }
        dst[0] = acc.iter().sum::<f32>() + offs;
        return;
    }
    let mut acc = [[0f32; 16]; DOT_MAX_M];
    let mut offs = [0f32; DOT_MAX_M];
    let mut q = [0f32; 32];
    for (b, block) in row.chunks_exact(bb).enumerate() {
        for g in 0..gpb {
            let s = group_quants::<F>(block, g, &mut q);
            let gi = b * gpb + g;
            for r in 0..m {
                let x = &xs[r * k + gi * 32..r * k + gi * 32 + 32];
                let a = &mut acc[r];
                for i in 0..16 {
                    a[i] += s[0] * (q[i] * x[i]) + s[2] * (q[i + 16] * x[i + 16]);
                }
                let xs16 = &sums[r * (k / 16) + 2 * gi..];
                offs[r] += s[1] * xs16[0] + s[3] * xs16[1];
            }
        }
    }
    for r in 0..m {
        dst[r] = acc[r].iter().sum::<f32>() + offs[r];
    }
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    crate::quant::f16_le(b[at], b[at + 1])
}

/// The raw quants of group `g` (32 values) of a block of format `F` into
/// `q`, and the affine maps `[d0, m0, d1, m1]` of its first and last 16
/// values (value = d * q + m), as `quant_blocks.wgsl` reads them.
#[inline(always)]
fn group_quants<const F: u8>(x: &[u8], g: usize, q: &mut [f32; 32]) -> [f32; 4] {
    match F {
        0 => {
            let d = f16_at(x, 0);
            for (q, &b) in q.iter_mut().zip(&x[2..34]) {
                *q = f32::from(b as i8);
            }
            [d, 0.0, d, 0.0]
        }
        1 | 2 => {
            let d = f16_at(x, 0);
            let (m, at) = if F == 1 {
                (-8.0 * d, 2)
            } else {
                (f16_at(x, 2), 4)
            };
            let qs = &x[at..at + 16];
            for j in 0..16 {
                q[j] = f32::from(qs[j] & 15);
                q[j + 16] = f32::from(qs[j] >> 4);
            }
            [d, m, d, m]
        }
        3 | 4 => {
            let d = f16_at(x, 0);
            let (m, at) = if F == 3 {
                (-16.0 * d, 2)
            } else {
                (f16_at(x, 2), 4)
            };
            let qh = u32::from_le_bytes([x[at], x[at + 1], x[at + 2], x[at + 3]]);
            let qs = &x[at + 4..at + 20];
            for j in 0..16 {
                q[j] = f32::from((qs[j] & 15) | ((((qh >> j) & 1) as u8) << 4));
                q[j + 16] = f32::from((qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4));
            }
            [d, m, d, m]
        }
        5 | 6 => {
            let scales: &[u8; 12] = x[4..16].try_into().unwrap_or(&[0; 12]);
            let (sc, mn) = crate::quant::scale_min_k4(g, scales);
            let d = f16_at(x, 0) * f32::from(sc);
            let m = -f16_at(x, 2) * f32::from(mn);
            let shift = 4 * (g & 1);
            if F == 5 {
                let qs = &x[16 + 32 * (g / 2)..16 + 32 * (g / 2) + 32];
                for (q, &b) in q.iter_mut().zip(qs) {
                    *q = f32::from((b >> shift) & 15);
                }
            } else {
                let qs = &x[48 + 32 * (g / 2)..48 + 32 * (g / 2) + 32];
                let qh = &x[16..48];
                for ((q, &b), &h) in q.iter_mut().zip(qs).zip(qh) {
                    *q = f32::from(((b >> shift) & 15) | (((h >> g) & 1) << 4));
                }
            }
            [d, m, d, m]
        }
        _ => {
            let (n, t) = (g / 4, g % 4);
            let ql = &x[64 * n + 32 * (t & 1)..64 * n + 32 * (t & 1) + 32];
            let qh = &x[128 + 32 * n..128 + 32 * n + 32];
            let (sl, sh) = (4 * (t >> 1), 2 * t);
            for ((q, &l), &h) in q.iter_mut().zip(ql).zip(qh) {
                *q = f32::from(((l >> sl) & 15) | (((h >> sh) & 3) << 4));
            }
            let d = f16_at(x, 208);
            let s0 = d * f32::from(x[192 + 8 * n + 2 * t] as i8);
            let s1 = d * f32::from(x[193 + 8 * n + 2 * t] as i8);
            [s0, -32.0 * s0, s1, -32.0 * s1]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_matches_the_plain_transpose() {
        // m not a multiple of 8 (a shorter last run of rows), n past a tile
        // and the parallel threshold
        for m in [1, 2, 7, 8, 9, 10, 15, 16, 17, 23, 33] {
            for n in [1, 3, 64, 65, 130, 2000] {
                let t: Vec<f32> = (0..n * m).map(|i| i as f32).collect();
                let mut want = vec![0f32; m * n];
                for j in 0..n {
                    for r in 0..m {
                        want[r * n + j] = t[j * m + r];
                    }
                }
                assert_eq!(transpose(&t, n, m), want, "[{n}, {m}]");
            }
        }
    }
}
