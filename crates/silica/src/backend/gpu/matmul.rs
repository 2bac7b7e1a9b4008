//! Launchers of the matmul kernels: tiled for many rows, GEMV-style for few.

use super::elementwise::{buffer, pack, params, to_u32, via_f32};
use super::{Context, Kernel};
use crate::memory::GpuBuffer;
use crate::{DType, Error, Layout, Result, Tensor};

pub(crate) static MATMUL: Kernel = Kernel {
    name: "matmul",
    source: concat!(include_str!("common.wgsl"), include_str!("matmul.wgsl")),
    inputs: 2,
};

pub(crate) static GEMV: Kernel = Kernel {
    name: "gemv",
    source: concat!(include_str!("common.wgsl"), include_str!("gemv.wgsl")),
    inputs: 2,
};

/// Rows of `a` up to which the GEMV kernel is used.
const GEMV_MAX_M: usize = 8;
/// Output columns per GEMV workgroup.
const GEMV_COLS: usize = 8;

/// The batch part (all dimensions but the last two) of a layout, merged
/// where contiguous, with the batch strides of both operands.
fn batch_views(a: &Layout, b: &Layout) -> Vec<Layout> {
    let r = a.rank();
    let cut = |l: &Layout| {
        Layout::new(
            l.shape()[..r - 2].to_vec(),
            l.strides()[..r - 2].to_vec(),
            0,
        )
    };
    Layout::coalesce(&[&cut(a), &cut(b)])
}

pub(crate) fn matmul(
    ctx: &Context,
    a: &Tensor,
    b: &Tensor,
    out_shape: &[usize],
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    let r = out_shape.len();
    let (m, n, k) = (out_shape[r - 2], out_shape[r - 1], a.shape()[r - 1]);
    let batches: usize = out_shape[..r - 2].iter().product();
    let (kernel, grid) = if m <= GEMV_MAX_M {
        (&GEMV, [n.div_ceil(GEMV_COLS), 1, batches])
    } else {
        (&MATMUL, [n.div_ceil(64), m.div_ceil(64), batches])
    };
    if grid.iter().any(|&g| g > ctx.max_groups() as usize) {
        return Err(Error::NotSupported {
            op: "matmul",
            reason: format!("grid {grid:?} exceeds the adapter's workgroup limit"),
        });
    }
    let batch = batch_views(a.layout(), b.layout());
    let (la, lb) = (a.layout(), b.layout());
    let header = [
        to_u32(m, "M")?,
        to_u32(n, "N")?,
        to_u32(k, "K")?,
        batch[0].rank() as u32,
        to_u32(la.offset(), "offset")?,
        to_u32(lb.offset(), "offset")?,
        to_u32(la.strides()[r - 2], "stride")?,
        to_u32(la.strides()[r - 1], "stride")?,
        to_u32(lb.strides()[r - 2], "stride")?,
        to_u32(lb.strides()[r - 1], "stride")?,
    ];
    let bytes = params(
        &header,
        &[
            pack(batch[0].shape())?,
            pack(batch[0].strides())?,
            pack(batch[1].strides())?,
        ],
    );
    via_f32(ctx, out_shape, out, out_dtype, |dst, dt| {
        ctx.dispatch(
            kernel,
            &constants(kernel, a.dtype(), dt, m),
            &bytes,
            &[buffer(a), buffer(b)],
            dst.raw(),
            [grid[0] as u32, grid[1] as u32, grid[2] as u32],
        )
    })
}

/// The specialization constants of a launch: dtypes, and for GEMV the row count.
fn constants(kernel: &Kernel, input: DType, out: DType, m: usize) -> Vec<(&'static str, f64)> {
    let mut c = vec![
        ("IN_DT", input.gpu_code() as f64),
        ("OUT_DT", out.gpu_code() as f64),
    ];
    if std::ptr::eq(kernel, &GEMV) {
        c.push(("M", m as f64));
    }
    c
}

#[cfg(test)]
pub(crate) fn specializations() -> Vec<(&'static Kernel, Vec<(&'static str, f64)>)> {
    let mut out = Vec::new();
    for dt in [0.0, 1.0, 2.0] {
        for o in [dt, 0.0] {
            out.push((&MATMUL, vec![("IN_DT", dt), ("OUT_DT", o)]));
            for m in 1..=GEMV_MAX_M {
                out.push((&GEMV, vec![("IN_DT", dt), ("OUT_DT", o), ("M", m as f64)]));
            }
        }
    }
    out
}
