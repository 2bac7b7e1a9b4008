//! Launchers of the row kernels: reductions and softmax.

use super::elementwise::via_f32;
use super::launch::{MAX_RANK, buffer, pack, params, to_u32};
use super::{Context, Kernel, KernelNeeds};
use crate::memory::GpuBuffer;
use crate::ops::ReduceOp;
use crate::{DType, Layout, Result, Tensor};

pub(crate) static REDUCE: Kernel = Kernel {
    name: "reduce",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("reduce.wgsl")
    ),
    inputs: 1,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};
pub(crate) static SOFTMAX: Kernel = Kernel {
    name: "softmax",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/rows.wgsl"),
        include_str!("softmax.wgsl")
    ),
    inputs: 1,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};
/// Softmax and the norms of rows read as whole vec4 words: one source,
/// named per use so that profiles tell softmax from norms.
const ROWS_VEC_SOURCE: &str = concat!(
    include_str!("shared/common.wgsl"),
    include_str!("shared/rows.wgsl"),
    include_str!("rows_vec.wgsl")
);
pub(crate) static SOFTMAX_VEC: Kernel = Kernel {
    name: "softmax_vec",
    source: ROWS_VEC_SOURCE,
    inputs: 3,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};
pub(crate) static NORM_VEC: Kernel = Kernel {
    name: "norm_vec",
    source: ROWS_VEC_SOURCE,
    inputs: 3,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};

/// The row operations of rows_vec.wgsl (its `OP` constant).
#[derive(Clone, Copy)]
pub(crate) enum RowOp {
    Softmax = 0,
    LogSoftmax = 1,
    RmsNorm = 2,
    LayerNorm = 3,
}

/// Runs `op` on the rows of `x` through rows_vec.wgsl when they can be read
/// as whole vec4 words (see rows_vec.wgsl) and the output keeps the input's
/// dtype; returns false, having done nothing, otherwise. `weights` are the
/// norm's weight and bias (contiguous from offset 0, as the ops pass them).
pub(crate) fn rows_vec(
    ctx: &Context,
    op: RowOp,
    x: &Tensor,
    weights: [&Tensor; 2],
    eps: f32,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<bool> {
    rows_vec_plus(ctx, op, x, weights, None, eps, out, out_dtype)
}

/// Whether [`rms_norm_add`] runs with these operands: rows that
/// rows_vec.wgsl reads as whole words, and a contiguous residual of `x`'s
/// shape and dtype from a whole word.
pub(crate) fn rms_norm_add_fits(x: &Tensor, residual: &Tensor) -> bool {
    vec_rows(x, x.dtype()).is_some()
        && residual.is_contiguous()
        && residual.shape() == x.shape()
        && residual.dtype() == x.dtype()
        && residual
            .layout()
            .offset()
            .is_multiple_of(16 / x.dtype().size_in_bytes())
}

/// [`rows_vec`] of an RMSNorm with `residual` added to its output in the
/// same kernel; the caller checked [`rms_norm_add_fits`].
pub(crate) fn rms_norm_add(
    ctx: &Context,
    x: &Tensor,
    weight: &Tensor,
    residual: &Tensor,
    eps: f32,
    out: &GpuBuffer,
) -> Result<()> {
    let (op, w) = (RowOp::RmsNorm, [weight, weight]);
    let done = rows_vec_plus(ctx, op, x, w, Some(residual), eps, out, x.dtype())?;
    debug_assert!(done, "rms_norm_add_fits passed operands rows_vec refused");
    Ok(())
}

/// The rows of `x` as rows_vec.wgsl reads them, for an output of
/// `out_dtype`: (rows, elements a row, words between row starts, elements
/// a word); `None` where it cannot.
fn vec_rows(x: &Tensor, out_dtype: DType) -> Option<(usize, usize, usize, usize)> {
    let dt = x.dtype();
    if out_dtype != dt || !matches!(dt, DType::F32 | DType::F16 | DType::BF16) {
        return None;
    }
    let per_word = 16 / dt.size_in_bytes();
    let l = x.layout();
    let r = l.rank();
    let n = l.shape()[r - 1];
    if n == 0 || !n.is_multiple_of(per_word) || (n > 1 && l.strides()[r - 1] != 1) {
        return None;
    }
    let outer = Layout::new(
        l.shape()[..r - 1].to_vec(),
        l.strides()[..r - 1].to_vec(),
        0,
    );
    let rows = outer.numel();
    let outer = &Layout::coalesce(&[&outer])[0];
    let row_stride = match outer.strides() {
        [] => 0,
        [s] => *s,
        _ => return None,
    };
    if !l.offset().is_multiple_of(per_word) || !row_stride.is_multiple_of(per_word) {
        return None;
    }
    Some((rows, n, row_stride, per_word))
}

#[allow(clippy::too_many_arguments)]
fn rows_vec_plus(
    ctx: &Context,
    op: RowOp,
    x: &Tensor,
    weights: [&Tensor; 2],
    residual: Option<&Tensor>,
    eps: f32,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<bool> {
    let dt = x.dtype();
    let Some((rows, n, row_stride, per_word)) = vec_rows(x, out_dtype) else {
        return Ok(false);
    };
    let l = x.layout();
    let header = [
        to_u32(rows, "row count")?,
        to_u32(n / per_word, "row length")?,
        to_u32(l.offset() / per_word, "offset")?,
        to_u32(row_stride / per_word, "stride")?,
        eps.to_bits(),
        to_u32(
            residual.map_or(0, |r| r.layout().offset() / per_word),
            "offset",
        )?,
    ];
    // about four words per thread: short rows (16-bit ones above all) in
    // smaller workgroups, which spend less on their reductions
    // (docs/tuning.md, "Row kernels")
    let nq = n / per_word;
    let threads = (nq / 4).next_power_of_two().clamp(64, 256);
    let kernel = match op {
        RowOp::Softmax | RowOp::LogSoftmax => &SOFTMAX_VEC,
        RowOp::RmsNorm | RowOp::LayerNorm => &NORM_VEC,
    };
    let second = residual.unwrap_or(weights[1]);
    ctx.dispatch(
        kernel,
        &[
            ("OP", op as u32 as f64),
            ("DT", dt.gpu_code() as f64),
            ("ROW_THREADS", threads as f64),
            ("RESIDUAL", if residual.is_some() { 1.0 } else { 0.0 }),
        ],
        &params(&header, &[]),
        &[buffer(x), buffer(weights[0]), buffer(second)],
        out,
        ctx.grid(to_u32(rows, "row count")?),
    )?;
    Ok(true)
}

/// Rows of the last dimension of `x`: the row count, the header `[rows,
/// n, rank, offset, stride]` and the packed shape and strides of the rows.
pub(crate) fn row_layout(x: &Tensor) -> Result<(usize, [u32; 5], [[u32; MAX_RANK]; 2])> {
    let l = x.layout();
    let r = l.rank();
    let n = l.shape()[r - 1];
    let outer = Layout::new(
        l.shape()[..r - 1].to_vec(),
        l.strides()[..r - 1].to_vec(),
        0,
    );
    let rows = outer.numel();
    let outer = &Layout::coalesce(&[&outer])[0];
    let header = [
        to_u32(rows, "row count")?,
        to_u32(n, "row length")?,
        outer.rank() as u32,
        to_u32(l.offset(), "offset")?,
        to_u32(l.strides()[r - 1], "stride")?,
    ];
    Ok((rows, header, [pack(outer.shape())?, pack(outer.strides())?]))
}

/// Rows of the last dimension of `x`: (row count, params).
fn row_params(x: &Tensor) -> Result<(usize, Vec<u8>)> {
    let (rows, header, arrays) = row_layout(x)?;
    Ok((rows, params(&header, &arrays)))
}

/// Rows at least this long are reduced in two passes when there are few
/// of them: one workgroup per row would leave most of a GPU idle, as in
/// the greedy pick over a large vocabulary (docs/tuning.md, "Two-pass
/// reductions").
const SPLIT_MIN: usize = 16_384;
/// Elements per workgroup in the first of two passes.
const CHUNK: usize = 4_096;

pub(crate) fn reduce(
    ctx: &Context,
    op: ReduceOp,
    x: &Tensor,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    let (rows, header, arrays) = row_layout(x)?;
    let n = x.shape().last().copied().unwrap_or(1);
    let units = match out_dtype {
        DType::F16 | DType::BF16 => rows.div_ceil(2),
        _ => rows,
    };
    let constants = |phase: u32| {
        [
            ("OP", op as u32 as f64),
            ("SRC_DT", x.dtype().gpu_code() as f64),
            ("OUT_DT", out_dtype.gpu_code() as f64),
            ("PHASE", phase as f64),
        ]
    };
    if n < SPLIT_MIN || rows > 256 {
        return ctx.dispatch(
            &REDUCE,
            &constants(0),
            &params(&header, &arrays),
            &[buffer(x)],
            out,
            ctx.grid(to_u32(units, "row count")?),
        );
    }
    // pass 1: a (value, index) pair per chunk of each row
    let parts = n.div_ceil(CHUNK);
    let header = {
        let mut h = header.to_vec();
        h.extend([to_u32(CHUNK, "chunk")?, to_u32(parts, "chunk count")?]);
        h
    };
    let bytes = params(&header, &arrays);
    let pairs = ctx.pool.alloc((rows * parts * 8) as u64)?;
    ctx.dispatch(
        &REDUCE,
        &constants(1),
        &bytes,
        &[buffer(x)],
        &pairs,
        ctx.grid(to_u32(rows * parts, "workgroup count")?),
    )?;
    // pass 2: the pairs of each row
    ctx.dispatch(
        &REDUCE,
        &constants(2),
        &bytes,
        &[&pairs],
        out,
        ctx.grid(to_u32(units, "row count")?),
    )
}

pub(crate) fn softmax(
    ctx: &Context,
    log: bool,
    x: &Tensor,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    let op = if log {
        RowOp::LogSoftmax
    } else {
        RowOp::Softmax
    };
    if rows_vec(ctx, op, x, [x, x], 0.0, out, out_dtype)? {
        return Ok(());
    }
    let (rows, bytes) = row_params(x)?;
    via_f32(ctx, x.shape(), out, out_dtype, |dst, dt| {
        ctx.dispatch(
            &SOFTMAX,
            &[
                ("LOG", if log { 1.0 } else { 0.0 }),
                ("SRC_DT", x.dtype().gpu_code() as f64),
                ("OUT_DT", dt.gpu_code() as f64),
            ],
            &bytes,
            &[buffer(x)],
            dst,
            ctx.grid(to_u32(rows, "row count")?),
        )
    })
}

#[cfg(test)]
pub(crate) fn specializations() -> Vec<(&'static Kernel, Vec<(&'static str, f64)>)> {
    let mut out = Vec::new();
    for dt in [0.0, 1.0, 2.0] {
        for op in 0..6 {
            let o = if op >= 4 { 3.0 } else { dt };
            for phase in 0..3 {
                out.push((
                    &REDUCE,
                    vec![
                        ("OP", op as f64),
                        ("SRC_DT", dt),
                        ("OUT_DT", o),
                        ("PHASE", phase as f64),
                    ],
                ));
            }
        }
        for op in 0..4 {
            for threads in [64.0, 256.0] {
                let kernel = if op < 2 { &SOFTMAX_VEC } else { &NORM_VEC };
                out.push((
                    kernel,
                    vec![("OP", op as f64), ("DT", dt), ("ROW_THREADS", threads)],
                ));
            }
        }
        out.push((
            &NORM_VEC,
            vec![
                ("OP", 2.0),
                ("DT", dt),
                ("ROW_THREADS", 64.0),
                ("RESIDUAL", 1.0),
            ],
        ));
        for log in [0.0, 1.0] {
            for o in [dt, 0.0] {
                out.push((&SOFTMAX, vec![("LOG", log), ("SRC_DT", dt), ("OUT_DT", o)]));
            }
        }
    }
    out
}
