//! `x @ wᵀ` for quantized `w` on the CPU: blocks are decoded into a small
//! buffer next to their use, never into a copy of the matrix.
//!
//! For few rows of x (decode) each weight row is decoded one block at a
//! time and dotted with every row of x. For more rows, panels of weight rows
//! are decoded and multiplied through the `gemm` crate. Both split the
//! weight rows across threads; the inner loops are written so that the
//! compiler vectorizes them, and are compiled a second time for AVX2/FMA and
//! AVX-512 where the processor has them (chosen at run time).

use rayon::prelude::*;

use super::host;
use super::matmul::{Operand, gemm_f32};
use crate::quant::QuantFormat;
use crate::storage::CpuStorage;
use crate::{DType, Error, Result, Tensor};

/// Rows of x up to which the block-dot path is used.
const DOT_MAX_M: usize = 8;
/// Weight rows decoded per panel of the gemm path.
const PANEL: usize = 32;
/// Weight rows per task of the block-dot path (at least).
const DOT_TASK: usize = 16;

pub fn qmatmul(
    format: QuantFormat,
    x: &Tensor,
    w: &Tensor,
    out_shape: &[usize],
    out: DType,
) -> CpuStorage {
    let k = x.shape().last().copied().unwrap_or(0);
    let n = out_shape.last().copied().unwrap_or(0);
    let m = if k == 0 { 0 } else { x.numel() / k };
    let xs = host(x).gather_f32(x.layout());
    let wb: &[u8] = host(w).as_bytes();
    let row_bytes = format.bytes_for(k);
    // results transposed, [n, m]: each task owns a run of weight rows
    let mut out_t = vec![0f32; n * m];
    if m > 0 && n > 0 {
        if m <= DOT_MAX_M {
            out_t
                .par_chunks_mut(m)
                .with_min_len(DOT_TASK)
                .enumerate()
                .for_each(|(j, dst)| {
                    let row = &wb[j * row_bytes..(j + 1) * row_bytes];
                    row_dots(format, row, &xs, k, dst);
                });
        } else {
            out_t
                .par_chunks_mut(PANEL * m)
                .enumerate()
                .for_each(|(p, dst)| {
                    let rows = dst.len() / m;
                    let j0 = p * PANEL;
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
                    gemm_f32(rows, m, k, &lhs, &rhs, dst, false);
                });
        }
    }
    let mut result = vec![0f32; m * n];
    for (j, col) in out_t.chunks_exact(m.max(1)).enumerate().take(n) {
        for (r, &v) in col.iter().enumerate() {
            result[r * n + j] = v;
        }
    }
    CpuStorage::from_f32(result, out)
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
    for (&id, dst) in ids.iter().zip(result.chunks_exact_mut(k.max(1))) {
        let id = id as usize;
        if id >= rows {
            return Err(Error::IndexOutOfRange {
                op: "embedding_q",
                index: id as i64,
                size: rows,
            });
        }
        format.decode_into(&wb[id * row_bytes..(id + 1) * row_bytes], dst);
    }
    Ok(CpuStorage::from_f32(result, out))
}

/// `dst[r] = x[r] · row` for each of the `dst.len()` rows of `xs` (`k`
/// values each), `row` one weight row of blocks.
fn row_dots(format: QuantFormat, row: &[u8], xs: &[f32], k: usize, dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the processor has the features the function is compiled for
            return unsafe { row_dots_avx512(format, row, xs, k, dst) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: as above
            return unsafe { row_dots_avx2(format, row, xs, k, dst) };
        }
    }
    row_dots_body(format, row, xs, k, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn row_dots_avx512(format: QuantFormat, row: &[u8], xs: &[f32], k: usize, dst: &mut [f32]) {
    row_dots_body(format, row, xs, k, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn row_dots_avx2(format: QuantFormat, row: &[u8], xs: &[f32], k: usize, dst: &mut [f32]) {
    row_dots_body(format, row, xs, k, dst)
}

#[inline(always)]
fn row_dots_body(format: QuantFormat, row: &[u8], xs: &[f32], k: usize, dst: &mut [f32]) {
    let (be, bb) = (format.block_elems(), format.block_bytes());
    let mut buf = [0f32; crate::quant::QK_K];
    let buf = &mut buf[..be];
    dst.fill(0.0);
    for (b, block) in row.chunks_exact(bb).enumerate() {
        format.decode_into(block, buf);
        for (r, acc) in dst.iter_mut().enumerate() {
            let x = &xs[r * k + b * be..r * k + (b + 1) * be];
            *acc += dot(buf, x);
        }
    }
}

/// A dot product in 16 independent lanes, so that it vectorizes.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let (ac, _) = a.as_chunks::<16>();
    let (bc, _) = b.as_chunks::<16>();
    for (a, b) in ac.iter().zip(bc) {
        for i in 0..16 {
            lanes[i] += a[i] * b[i];
        }
    }
    lanes.iter().sum()
}
