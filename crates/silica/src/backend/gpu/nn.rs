//! Launchers of the fused transformer kernels: norms, rotary embeddings,
//! attention.

use super::elementwise::{buffer, params, to_u32, via_f32};
use super::reduce::row_layout;
use super::{Context, Kernel};
use crate::memory::GpuBuffer;
use crate::ops::RopeStyle;
use crate::{DType, Layout, Result, Tensor};

pub(crate) static NORM: Kernel = Kernel {
    name: "norm",
    source: concat!(
        include_str!("common.wgsl"),
        include_str!("rows.wgsl"),
        include_str!("norm.wgsl")
    ),
    inputs: 3,
    trusted: false,
};
pub(crate) static ROPE: Kernel = Kernel {
    name: "rope",
    source: concat!(
        include_str!("common.wgsl"),
        include_str!("store.wgsl"),
        include_str!("rope.wgsl")
    ),
    inputs: 3,
    trusted: false,
};
pub(crate) static ATTENTION: Kernel = Kernel {
    name: "attention",
    source: concat!(include_str!("common.wgsl"), include_str!("attention.wgsl")),
    inputs: 4,
    trusted: false,
};

fn code(d: DType) -> f64 {
    d.gpu_code() as f64
}

/// RMSNorm (`bias` None) or LayerNorm of the rows of `x`.
pub(crate) fn norm(
    ctx: &Context,
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    eps: f32,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    let (rows, h, arrays) = row_layout(x)?;
    let header = [h[0], h[1], h[2], h[3], h[4], eps.to_bits()];
    let bytes = params(&header, &arrays);
    via_f32(ctx, x.shape(), out, out_dtype, |dst, dt| {
        ctx.dispatch(
            &NORM,
            &[
                ("LAYER", if bias.is_some() { 1.0 } else { 0.0 }),
                ("SRC_DT", code(x.dtype())),
                ("OUT_DT", code(dt)),
            ],
            &bytes,
            &[buffer(x), buffer(weight), buffer(bias.unwrap_or(weight))],
            dst.raw(),
            ctx.grid(to_u32(rows, "row count")?),
        )
    })
}

pub(crate) fn rope(
    ctx: &Context,
    inputs: &[&Tensor],
    style: RopeStyle,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    let x = inputs[0];
    let r = x.rank();
    let (t, h, d) = (x.shape()[r - 3], x.shape()[r - 2], x.shape()[r - 1]);
    let (_, rows, arrays) = row_layout(x)?;
    let n = x.numel();
    let header = [
        to_u32(n, "element count")?,
        to_u32(d, "head size")?,
        to_u32(h, "head count")?,
        to_u32(t, "position count")?,
        rows[2],
        rows[3],
        rows[4],
        to_u32(inputs[1].layout().offset(), "offset")?,
        to_u32(inputs[2].layout().offset(), "offset")?,
    ];
    let units = match out_dtype {
        DType::F16 | DType::BF16 => n.div_ceil(2),
        _ => n,
    };
    ctx.dispatch(
        &ROPE,
        &[
            (
                "ADJACENT",
                if style == RopeStyle::Adjacent {
                    1.0
                } else {
                    0.0
                },
            ),
            ("SRC_DT", code(x.dtype())),
            ("OUT_DT", code(out_dtype)),
        ],
        &params(&header, &arrays),
        &[buffer(x), buffer(inputs[1]), buffer(inputs[2])],
        out.raw(),
        ctx.grid_for_threads(units)?,
    )
}

/// The offset and the four strides of a rank-4 view.
fn view4(l: &Layout) -> Result<(u32, [u32; 4])> {
    let mut s = [0u32; 4];
    for (o, &v) in s.iter_mut().zip(l.strides()) {
        *o = to_u32(v, "stride")?;
    }
    Ok((to_u32(l.offset(), "offset")?, s))
}

pub(crate) fn attention(
    ctx: &Context,
    inputs: &[&Tensor],
    scale: f32,
    causal: bool,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
    let mask = inputs.get(3).copied();
    let [b, tq, h, d] = [q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]];
    let (tk, kvh) = (k.shape()[1], k.shape()[2]);
    let (oq, sq) = view4(q.layout())?;
    let (ok, sk) = view4(k.layout())?;
    let (ov, sv) = view4(v.layout())?;
    let (om, sm) = match mask {
        Some(m) => view4(m.layout())?,
        None => (0, [0; 4]),
    };
    let mut words = vec![
        to_u32(b, "batch")?,
        to_u32(tq, "query count")?,
        to_u32(tk, "key count")?,
        to_u32(h, "head count")?,
        to_u32(kvh, "KV head count")?,
        to_u32(d, "head size")?,
        scale.to_bits(),
        causal as u32,
        oq,
        ok,
        ov,
        om,
    ];
    for s in [sq, sk, sv, sm] {
        words.extend_from_slice(&s);
    }
    let rows = b * tq * h;
    ctx.dispatch(
        &ATTENTION,
        &[
            ("DT", code(q.dtype())),
            ("OUT_DT", code(out_dtype)),
            ("HAS_MASK", if mask.is_some() { 1.0 } else { 0.0 }),
        ],
        bytemuck::cast_slice(&words),
        &[buffer(q), buffer(k), buffer(v), buffer(mask.unwrap_or(q))],
        out.raw(),
        ctx.grid(to_u32(rows, "row count")?),
    )
}

#[cfg(test)]
pub(crate) fn specializations() -> Vec<(&'static Kernel, Vec<(&'static str, f64)>)> {
    let mut out = Vec::new();
    for dt in [0.0, 1.0, 2.0] {
        for o in [dt, 0.0] {
            for layer in [0.0, 1.0] {
                out.push((&NORM, vec![("LAYER", layer), ("SRC_DT", dt), ("OUT_DT", o)]));
            }
        }
        for adjacent in [0.0, 1.0] {
            out.push((
                &ROPE,
                vec![("ADJACENT", adjacent), ("SRC_DT", dt), ("OUT_DT", dt)],
            ));
        }
        for mask in [0.0, 1.0] {
            out.push((
                &ATTENTION,
                vec![("DT", dt), ("OUT_DT", dt), ("HAS_MASK", mask)],
            ));
        }
    }
    out
}
