//! Launchers of the elementwise kernels: unary (and float conversions),
//! binary with broadcasting (and scalar forms and comparisons), where.

use super::launch::{buffer, pack, params, to_u32};
use super::{Context, Kernel, KernelNeeds};
use crate::memory::GpuBuffer;
use crate::{DType, Layout, Result, Tensor};

pub(crate) static UNARY: Kernel = Kernel {
    name: "unary",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/store.wgsl"),
        include_str!("unary.wgsl")
    ),
    inputs: 1,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};
pub(crate) static BINARY: Kernel = Kernel {
    name: "binary",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/store.wgsl"),
        include_str!("shared/binary_ops.wgsl"),
        include_str!("binary.wgsl")
    ),
    inputs: 2,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};
pub(crate) static BINARY_VEC: Kernel = Kernel {
    name: "binary_vec",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/binary_ops.wgsl"),
        include_str!("binary_vec.wgsl")
    ),
    inputs: 2,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};
pub(crate) static WHERE: Kernel = Kernel {
    name: "where",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("where.wgsl")
    ),
    inputs: 3,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};

/// `OP` of the unary kernel for a dtype conversion.
pub(crate) const OP_CAST: u32 = 100;
/// `OP` of the binary kernel for the first comparison (`CmpOp::Eq`).
pub(crate) const CMP_BASE: u32 = 16;
fn code(d: DType) -> f64 {
    d.gpu_code() as f64
}

/// Threads of an elementwise launch: one per output unit (see store.wgsl).
fn units(n: usize, out: DType) -> usize {
    match out {
        DType::F16 | DType::BF16 => n.div_ceil(2),
        _ => n,
    }
}

pub(crate) fn unary(
    ctx: &Context,
    op: u32,
    x: &Tensor,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    unary_view(ctx, op, buffer(x), x.layout(), x.dtype(), out, out_dtype)
}

/// `unary` on the view `layout` of a raw buffer.
pub(crate) fn unary_view(
    ctx: &Context,
    op: u32,
    src: &GpuBuffer,
    layout: &Layout,
    dtype: DType,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    let l = &Layout::coalesce(&[layout])[0];
    let n = layout.numel();
    let header = [
        to_u32(n, "element count")?,
        l.rank() as u32,
        to_u32(l.offset(), "offset")?,
        0,
    ];
    ctx.dispatch(
        &UNARY,
        &[
            ("OP", op as f64),
            ("SRC_DT", code(dtype)),
            ("OUT_DT", code(out_dtype)),
        ],
        &params(&header, &[pack(l.shape())?, pack(l.strides())?]),
        &[src],
        out,
        ctx.grid_for_threads(units(n, out_dtype))?,
    )
}

pub(crate) fn binary(
    ctx: &Context,
    op: u32,
    a: &Tensor,
    b: Option<&Tensor>,
    scalar: f32,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    let n = a.numel();
    let views = match b {
        Some(b) => Layout::coalesce(&[a.layout(), b.layout()]),
        None => {
            let la = Layout::coalesce(&[a.layout()]).remove(0);
            vec![la.clone(), la]
        }
    };
    if let Some(q) = vec_quads(a.dtype(), out_dtype, op, n, &views) {
        let words = [
            to_u32(n, "element count")?,
            q.offsets[0],
            q.offsets[1],
            scalar.to_bits(),
            q.row_quads,
            q.pitches[0],
            q.pitches[1],
            0,
        ];
        let per_quad = if a.dtype() == DType::F32 { 4 } else { 8 };
        return ctx.dispatch(
            &BINARY_VEC,
            &[
                ("OP", op as f64),
                ("DT", code(a.dtype())),
                ("B_SCALAR", if b.is_none() { 1.0 } else { 0.0 }),
            ],
            bytemuck::cast_slice(&words),
            &[buffer(a), buffer(b.unwrap_or(a))],
            out,
            ctx.grid_for_threads(n.div_ceil(per_quad))?,
        );
    }
    let header = [
        to_u32(n, "element count")?,
        views[0].rank() as u32,
        to_u32(views[0].offset(), "offset")?,
        to_u32(views[1].offset(), "offset")?,
        scalar.to_bits(),
    ];
    let arrays = [
        pack(views[0].shape())?,
        pack(views[0].strides())?,
        pack(views[1].strides())?,
    ];
    ctx.dispatch(
        &BINARY,
        &[
            ("OP", op as f64),
            ("IN_DT", code(a.dtype())),
            ("OUT_DT", code(out_dtype)),
            ("B_SCALAR", if b.is_none() { 1.0 } else { 0.0 }),
        ],
        &params(&header, &arrays),
        &[buffer(a), buffer(b.unwrap_or(a))],
        out,
        ctx.grid_for_threads(units(n, out_dtype))?,
    )
}

/// How binary_vec.wgsl walks both operands, in vec4 words.
struct Quads {
    offsets: [u32; 2],
    /// Words per row (all of them for a contiguous run).
    row_quads: u32,
    /// Each operand's row pitch.
    pitches: [u32; 2],
}

/// Where the binary op can take the vectorized kernel: a float op (not a
/// comparison) keeping the dtype, both views contiguous and unbroadcast
/// (rank 1), or rows of whole vec4 words contiguous along the row (rank 2:
/// the gate and up halves of a stacked product, a broadcast row), every
/// start on a vec4 word.
fn vec_quads(dt: DType, out: DType, op: u32, n: usize, views: &[Layout]) -> Option<Quads> {
    let per_quad = match dt {
        DType::F32 => 4,
        DType::F16 | DType::BF16 => 8,
        _ => return None,
    };
    if op >= CMP_BASE || out != dt || n == 0 {
        return None;
    }
    let word = |x: usize| {
        x.is_multiple_of(per_quad)
            .then(|| u32::try_from(x / per_quad).ok())?
    };
    let rank = views[0].rank();
    let mut q = Quads {
        offsets: [0; 2],
        row_quads: u32::try_from(n.div_ceil(per_quad)).ok()?,
        pitches: [0; 2],
    };
    if rank == 2 {
        let cols = views[0].shape()[1];
        q.row_quads = word(cols)?;
    }
    for (i, v) in views.iter().enumerate() {
        q.offsets[i] = word(v.offset())?;
        match v.rank() {
            0 => {}
            1 if v.strides()[0] == 1 => {}
            2 if v.strides()[1] == 1 => q.pitches[i] = word(v.strides()[0])?,
            _ => return None,
        }
    }
    Some(q)
}

pub(crate) fn where_cond(ctx: &Context, inputs: &[&Tensor], out: &GpuBuffer) -> Result<()> {
    let (c, a, b) = (inputs[0], inputs[1], inputs[2]);
    let n = a.numel();
    let v = Layout::coalesce(&[c.layout(), a.layout(), b.layout()]);
    let header = [
        to_u32(n, "element count")?,
        v[0].rank() as u32,
        to_u32(v[0].offset(), "offset")?,
        to_u32(v[1].offset(), "offset")?,
        to_u32(v[2].offset(), "offset")?,
    ];
    let arrays = [
        pack(v[0].shape())?,
        pack(v[0].strides())?,
        pack(v[1].strides())?,
        pack(v[2].strides())?,
    ];
    ctx.dispatch(
        &WHERE,
        &[
            ("COND_DT", code(c.dtype())),
            ("ELEM_BYTES", a.dtype().size_in_bytes() as f64),
        ],
        &params(&header, &arrays),
        &[buffer(c), buffer(a), buffer(b)],
        out,
        ctx.grid_for_threads(units(n, a.dtype()))?,
    )
}

/// Every specialization the launchers above can ask for (for the shader test).
#[cfg(test)]
pub(crate) fn specializations() -> Vec<(&'static Kernel, Vec<(&'static str, f64)>)> {
    let mut out = Vec::new();
    let dts = [0.0, 1.0, 2.0, 3.0, 4.0];
    for op in (0..16).chain([OP_CAST]) {
        for src in dts {
            for dst in dts {
                out.push((
                    &UNARY,
                    vec![("OP", op as f64), ("SRC_DT", src), ("OUT_DT", dst)],
                ));
            }
        }
    }
    for op in (0..8).chain(CMP_BASE..CMP_BASE + 6) {
        for dt in [0.0, 1.0, 2.0] {
            for dst in [dt, 3.0] {
                for s in [0.0, 1.0] {
                    out.push((
                        &BINARY,
                        vec![
                            ("OP", op as f64),
                            ("IN_DT", dt),
                            ("OUT_DT", dst),
                            ("B_SCALAR", s),
                        ],
                    ));
                }
            }
        }
    }
    for op in 0..8 {
        for dt in [0.0, 1.0, 2.0] {
            for s in [0.0, 1.0] {
                out.push((
                    &BINARY_VEC,
                    vec![("OP", op as f64), ("DT", dt), ("B_SCALAR", s)],
                ));
            }
        }
    }
    for c in dts {
        for bytes in [2.0, 4.0, 8.0] {
            out.push((&WHERE, vec![("COND_DT", c), ("ELEM_BYTES", bytes)]));
        }
    }
    out
}

/// Runs `kernel(dst, dtype)` so that its rows start on word boundaries: a
/// 16-bit output whose last dimension is odd is computed into an f32
/// buffer first and then converted (see the row kernels' comments).
pub(crate) fn via_f32(
    ctx: &Context,
    out_shape: &[usize],
    out: &GpuBuffer,
    out_dtype: DType,
    kernel: impl FnOnce(&GpuBuffer, DType) -> Result<()>,
) -> Result<()> {
    let last = out_shape.last().copied().unwrap_or(1);
    if !matches!(out_dtype, DType::F16 | DType::BF16) || last % 2 == 0 {
        return kernel(out, out_dtype);
    }
    let n: usize = out_shape.iter().product();
    let tmp = ctx.pool.alloc((n * 4) as u64)?;
    kernel(&tmp, DType::F32)?;
    unary_view(
        ctx,
        OP_CAST,
        &tmp,
        &Layout::contiguous(&[n]),
        DType::F32,
        out,
        out_dtype,
    )
}
