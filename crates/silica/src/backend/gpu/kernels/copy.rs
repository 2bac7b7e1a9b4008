//! Launchers of the bitwise kernels: contiguous copies (and integer
//! conversions), concatenation, index_select.

use super::launch::{buffer, pack, params, to_u32};
use super::{Context, Kernel, KernelNeeds};
use crate::memory::GpuBuffer;
use crate::{DType, Layout, Result, Tensor};

pub(crate) static COPY: Kernel = Kernel {
    name: "copy",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/bits.wgsl"),
        include_str!("copy.wgsl")
    ),
    inputs: 1,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};
pub(crate) static COPY_VEC: Kernel = Kernel {
    name: "copy_vec",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("copy_vec.wgsl")
    ),
    inputs: 1,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};
pub(crate) static CAT: Kernel = Kernel {
    name: "cat",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/bits.wgsl"),
        include_str!("cat.wgsl")
    ),
    inputs: 1,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};
pub(crate) static INDEX_SELECT: Kernel = Kernel {
    name: "index_select",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/bits.wgsl"),
        include_str!("index_select.wgsl")
    ),
    inputs: 2,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};

fn elem_bytes(d: DType) -> f64 {
    d.size_in_bytes() as f64
}

/// Threads for `n` elements of `dtype`: one per word for 16-bit dtypes.
fn units(n: usize, dtype: DType) -> usize {
    if dtype.size_in_bytes() == 2 {
        n.div_ceil(2)
    } else {
        n
    }
}

/// A contiguous copy of `x` as `out_dtype`, which is `x`'s dtype or, for
/// integer conversions, the other integer dtype.
pub(crate) fn copy(ctx: &Context, x: &Tensor, out: &GpuBuffer, out_dtype: DType) -> Result<()> {
    copy_at(ctx, x, out, 0, out_dtype)
}

/// Whether `copy_into` can write `n` elements of `dtype` at element `offset`
/// of a buffer without touching the words of other elements.
pub(crate) fn can_copy_into(dtype: DType, offset: usize, n: usize) -> bool {
    dtype.size_in_bytes() != 2 || (offset.is_multiple_of(2) && n.is_multiple_of(2))
}

/// Writes the elements of `x`, in row-major order, into `dst` from element
/// `offset` on (same dtype; see `can_copy_into`).
pub(crate) fn copy_into(ctx: &Context, x: &Tensor, dst: &GpuBuffer, offset: usize) -> Result<()> {
    let word = offset * x.dtype().size_in_bytes() / 4;
    copy_at(ctx, x, dst, to_u32(word, "destination offset")?, x.dtype())
}

fn copy_at(
    ctx: &Context,
    x: &Tensor,
    out: &GpuBuffer,
    dst_word: u32,
    out_dtype: DType,
) -> Result<()> {
    let int_cast = match (x.dtype(), out_dtype) {
        (DType::U32, DType::I64) => 1.0,
        (DType::I64, DType::U32) => 2.0,
        _ => 0.0,
    };
    let l = &Layout::coalesce(&[x.layout()])[0];
    let n = x.numel();
    let es = x.dtype().size_in_bytes();
    let contiguous = l.rank() == 0 || (l.rank() == 1 && l.strides()[0] == 1);
    if int_cast == 0.0
        && n > 0
        && contiguous
        && (l.offset() * es).is_multiple_of(16)
        && dst_word.is_multiple_of(4)
    {
        // whole words: a 16-bit run of odd length ends in a half word, which
        // is only written past the end of a fresh output (copy_into takes
        // even runs, see can_copy_into)
        let words = (n * es).div_ceil(4);
        let header = [
            to_u32(words, "word count")?,
            to_u32(l.offset() * es / 16, "offset")?,
            dst_word / 4,
            0,
        ];
        return ctx.dispatch(
            &COPY_VEC,
            &[],
            bytemuck::cast_slice(&header),
            &[buffer(x)],
            out,
            ctx.grid_for_threads(words.div_ceil(4))?,
        );
    }
    let header = [
        to_u32(n, "element count")?,
        l.rank() as u32,
        to_u32(l.offset(), "offset")?,
        dst_word,
    ];
    ctx.dispatch(
        &COPY,
        &[
            ("ELEM_BYTES", elem_bytes(x.dtype())),
            ("INT_CAST", int_cast),
        ],
        &params(&header, &[pack(l.shape())?, pack(l.strides())?]),
        &[buffer(x)],
        out,
        ctx.grid_for_threads(units(n, out_dtype))?,
    )
}

pub(crate) fn cat(
    ctx: &Context,
    inputs: &[&Tensor],
    axis: usize,
    out_shape: &[usize],
    out: &GpuBuffer,
) -> Result<()> {
    let outer: usize = out_shape[..axis].iter().product();
    let inner: usize = out_shape[axis + 1..].iter().product();
    let total = out_shape[axis] * inner;
    let dtype = inputs[0].dtype();
    let mut start = 0;
    for t in inputs {
        let width = t.shape()[axis] * inner;
        if width == 0 || outer == 0 {
            continue;
        }
        // with nothing between its rows, an input is one long row
        let (rows, len, row_stride) = if width == total {
            (1, outer * width, outer * width)
        } else {
            (outer, width, total)
        };
        let words_per_row = len / 2 + 1;
        let l = &Layout::coalesce(&[t.layout()])[0];
        let header = [
            to_u32(rows, "rows")?,
            to_u32(len, "row length")?,
            to_u32(row_stride, "row stride")?,
            to_u32(start, "start")?,
            to_u32(words_per_row, "row words")?,
            l.rank() as u32,
            to_u32(l.offset(), "offset")?,
        ];
        let threads = if dtype.size_in_bytes() == 2 {
            rows * words_per_row
        } else {
            rows * len
        };
        ctx.dispatch(
            &CAT,
            &[("ELEM_BYTES", elem_bytes(dtype))],
            &params(&header, &[pack(l.shape())?, pack(l.strides())?]),
            &[buffer(t)],
            out,
            ctx.grid_for_threads(threads)?,
        )?;
        start += width;
    }
    Ok(())
}

pub(crate) fn index_select(
    ctx: &Context,
    src: &Tensor,
    idx: &Tensor,
    axis: usize,
    out_shape: &[usize],
    out: &GpuBuffer,
) -> Result<()> {
    let l = src.layout();
    let n: usize = out_shape.iter().product();
    let header = [
        to_u32(n, "element count")?,
        l.rank() as u32,
        to_u32(l.offset(), "offset")?,
        axis as u32,
        to_u32(idx.layout().offset(), "offset")?,
        to_u32(idx.layout().strides()[0], "stride")?,
        to_u32(l.shape()[axis], "dimension")?,
    ];
    ctx.dispatch(
        &INDEX_SELECT,
        &[
            ("ELEM_BYTES", elem_bytes(src.dtype())),
            ("IDX_DT", idx.dtype().gpu_code() as f64),
        ],
        &params(&header, &[pack(out_shape)?, pack(l.strides())?]),
        &[buffer(src), buffer(idx)],
        out,
        ctx.grid_for_threads(units(n, src.dtype()))?,
    )
}

#[cfg(test)]
pub(crate) fn specializations() -> Vec<(&'static Kernel, Vec<(&'static str, f64)>)> {
    let mut out = Vec::new();
    for e in [2.0, 4.0, 8.0] {
        out.push((&COPY, vec![("ELEM_BYTES", e), ("INT_CAST", 0.0)]));
        out.push((&CAT, vec![("ELEM_BYTES", e)]));
        for i in [3.0, 4.0] {
            out.push((&INDEX_SELECT, vec![("ELEM_BYTES", e), ("IDX_DT", i)]));
        }
    }
    out.push((&COPY, vec![("ELEM_BYTES", 4.0), ("INT_CAST", 1.0)]));
    out.push((&COPY_VEC, vec![]));
    out.push((&COPY, vec![("ELEM_BYTES", 8.0), ("INT_CAST", 2.0)]));
    out
}
