//! Launchers of the fused transformer kernels: norms, rotary embeddings,
//! attention.

use super::elementwise::via_f32;
use super::launch::{buffer, params, to_u32};
use super::reduce::{RowOp, row_layout, rows_vec};
use super::{Context, Kernel, KernelNeeds};
use crate::memory::GpuBuffer;
use crate::ops::RopeStyle;
use crate::{DType, Layout, Result, Tensor};

pub(crate) static NORM: Kernel = Kernel {
    name: "norm",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/rows.wgsl"),
        include_str!("norm.wgsl")
    ),
    inputs: 3,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};
pub(crate) static ROPE: Kernel = Kernel {
    name: "rope",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/store.wgsl"),
        include_str!("rope.wgsl")
    ),
    inputs: 3,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};
/// Attention, one query row per workgroup: the fallback for head sizes
/// over [`TILED_MAX_D`] and for devices with little workgroup memory.
pub(crate) static ATTENTION: Kernel = Kernel {
    name: "attention",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/attention_params.wgsl"),
        include_str!("shared/attention_io.wgsl"),
        include_str!("shared/attention_loads.wgsl"),
        include_str!("attention.wgsl")
    ),
    inputs: 4,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};
/// Flash attention (many queries) with key tiles of 32: 48 KiB of
/// workgroup memory.
pub(crate) static FLASH_ATTENTION_32: Kernel = Kernel {
    name: "flash_attention_32",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/attention_params.wgsl"),
        include_str!("shared/attention_io.wgsl"),
        include_str!("shared/attention_loads.wgsl"),
        "const BK: u32 = 32u;\n",
        include_str!("flash_attention.wgsl")
    ),
    inputs: 4,
    trusted: true,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};
/// Flash attention with key tiles of 16: 32 KiB of workgroup memory.
pub(crate) static FLASH_ATTENTION_16: Kernel = Kernel {
    name: "flash_attention_16",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/attention_params.wgsl"),
        include_str!("shared/attention_io.wgsl"),
        include_str!("shared/attention_loads.wgsl"),
        "const BK: u32 = 16u;\n",
        include_str!("flash_attention.wgsl")
    ),
    inputs: 4,
    trusted: true,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};
/// Flash attention of f16 q, k, v on cooperative matrices (blocks of 64
/// queries, key tiles of 32), where [`coop_flash`] allows it.
pub(crate) static FLASH_COOP: Kernel = Kernel {
    name: "flash_coop",
    source: concat!(
        "enable f16;\nenable wgpu_cooperative_matrix;\n",
        include_str!("shared/common.wgsl"),
        include_str!("shared/attention_params.wgsl"),
        include_str!("shared/halves8.wgsl"),
        include_str!("flash_coop.wgsl")
    ),
    inputs: 4,
    trusted: true,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::COOP16,
};
/// Split-K attention for few queries: partial results per chunk of keys.
pub(crate) static DECODE_ATTENTION: Kernel = Kernel {
    name: "decode_attention",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/attention_params.wgsl"),
        include_str!("shared/attention_io.wgsl"),
        include_str!("shared/attention_loads.wgsl"),
        include_str!("shared/rows.wgsl"),
        include_str!("decode_attention.wgsl"),
        include_str!("shared/scores.wgsl")
    ),
    inputs: 4,
    trusted: true,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};
/// [`DECODE_ATTENTION`] for one decode step over a KV cache: the rotary
/// embedding of the new queries and key and the cache update in the same
/// kernel (attention_step_io.wgsl).
pub(crate) static ATTENTION_STEP: Kernel = Kernel {
    name: "attention_step",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/attention_params.wgsl"),
        include_str!("shared/attention_step_io.wgsl"),
        include_str!("shared/attention_loads.wgsl"),
        include_str!("shared/rows.wgsl"),
        include_str!("decode_attention.wgsl"),
        include_str!("shared/scores.wgsl")
    ),
    inputs: 3,
    outputs: 2,
    immediates: true,
    needs: KernelNeeds::NOTHING,
    trusted: true,
};
/// [`ATTENTION_STEP`] with one barrier, a workgroup a query head (or a
/// chunk of its keys, for long caches): a key split over lanes of a
/// subgroup (attention_step_sg.wgsl).
pub(crate) static ATTENTION_STEP_SG: Kernel = Kernel {
    name: "attention_step_sg",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/attention_params.wgsl"),
        include_str!("shared/attention_step_sg_io.wgsl"),
        include_str!("attention_step_sg.wgsl")
    ),
    inputs: 3,
    outputs: 2,
    immediates: true,
    needs: KernelNeeds::SUBGROUPS,
    trusted: true,
};
/// [`ATTENTION_STEP_SG`] for one new position of each of several
/// sequences whose caches share one tensor (a server's pooled cache).
pub(crate) static ATTENTION_STEP_SG_BATCH: Kernel = Kernel {
    name: "attention_step_sg_batch",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/attention_params.wgsl"),
        include_str!("shared/attention_step_sg_batch_io.wgsl"),
        include_str!("attention_step_sg.wgsl")
    ),
    inputs: 4,
    outputs: 2,
    immediates: true,
    needs: KernelNeeds::SUBGROUPS,
    trusted: true,
};
/// Merges the chunks of [`DECODE_ATTENTION`], [`ATTENTION_STEP`] and
/// [`ATTENTION_STEP_SG`].
pub(crate) static ATTENTION_COMBINE: Kernel = Kernel {
    name: "attention_combine",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("attention_combine.wgsl")
    ),
    inputs: 1,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};

/// Largest head size of the tiled (flash and decode) kernels.
const TILED_MAX_D: usize = 128;
/// Queries up to which attention is split over the keys (decode steps).
const DECODE_MAX_TQ: usize = 4;
/// Largest head size of the split-K decode kernels (Gemma 3's 256).
const DECODE_MAX_D: usize = 256;
/// Keys per workgroup of the split-K decode kernel: smaller chunks give
/// more workgroups, but each chunk's phases cost more than that parallelism
/// gains (docs/tuning.md, "Decode attention workgroup").
const DECODE_CHUNK: usize = 256;
/// Workgroups below which a long cache of few rows (Gemma 3's four query
/// heads) is split into more, shorter chunks: one workgroup over 256 keys
/// of a 256-wide head took 75 µs on an H200.
const DECODE_MIN_GROUPS: usize = 64;
/// The shortest chunk of such a split.
const DECODE_MIN_CHUNK: usize = 64;

/// Keys a workgroup of the split-K decode kernel takes, and chunks a row,
/// for `rows` rows over `tk` keys.
fn decode_split(tk: usize, rows: usize) -> (usize, usize) {
    let mut chunks = tk.div_ceil(DECODE_CHUNK).max(1);
    if tk > DECODE_CHUNK && rows * chunks < DECODE_MIN_GROUPS {
        let more = DECODE_MIN_GROUPS.div_ceil(rows.max(1));
        chunks = chunks.max(more.min(tk.div_ceil(DECODE_MIN_CHUNK)));
    }
    let chunk = tk.div_ceil(chunks).max(1);
    (chunk, tk.div_ceil(chunk).max(1))
}
/// Queries per workgroup of the flash kernel.
const FLASH_BQ: usize = 32;
/// Queries per workgroup, and keys per tile, of the cooperative-matrix
/// flash kernel.
const COOP_BQ: usize = 64;
const COOP_BK: usize = 32;

/// Whether flash_coop.wgsl can read q, k and v as whole 16x16 fragments:
/// f16 on an adapter with 16x16 cooperative matrices and the workgroup
/// memory of the matmul tiles (more than the kernel's), at least 16 queries
/// and a key tile of keys, a head size that is a multiple of 16, and rows
/// contiguous along the head that start on 16 bytes.
fn coop_flash(ctx: &Context, views: [&Tensor; 3], tq: usize, tk: usize, d: usize) -> bool {
    super::matmul::coop_tiles(ctx)
        && views[0].dtype() == DType::F16
        && tq >= 16
        && tk >= COOP_BK
        && d.is_multiple_of(16)
        && d <= TILED_MAX_D
        && views.iter().all(|t| {
            let l = t.layout();
            l.strides()[3] == 1
                && l.offset().is_multiple_of(8)
                && l.strides()[..3].iter().all(|s| s.is_multiple_of(8))
        })
}

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
    let (op, b) = match bias {
        Some(b) => (RowOp::LayerNorm, b),
        None => (RowOp::RmsNorm, weight),
    };
    if rows_vec(ctx, op, x, [weight, b], eps, out, out_dtype)? {
        return Ok(());
    }
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
            dst,
            ctx.grid(to_u32(rows, "row count")?),
        )
    })
}

pub(crate) fn rope(
    ctx: &Context,
    inputs: &[&Tensor],
    style: RopeStyle,
    rotated: usize,
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
        to_u32(rotated.min(h), "head count")?,
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
        out,
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

/// Whether a chunk of four elements of a row of `l` can be loaded as whole
/// words: a unit last stride and, for 16-bit dtypes, even element offsets.
fn word_rows(l: &Layout, dtype: DType) -> bool {
    let s = l.strides();
    s[3] == 1
        && (dtype.size_in_bytes() != 2
            || (l.offset().is_multiple_of(2) && s[..3].iter().all(|x| x.is_multiple_of(2))))
}

/// Attention on the GPU: split-K decoding for up to [`DECODE_MAX_TQ`]
/// queries, the flash kernel for more, the row kernel for head sizes over
/// [`TILED_MAX_D`] or too little workgroup memory.
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
    let dt = q.dtype();
    let fast = [q, k, v]
        .iter()
        .enumerate()
        .map(|(i, t)| (word_rows(t.layout(), dt) as u32) << i)
        .sum::<u32>();
    let rows = b * tq * h;
    let (chunk, chunks) = decode_split(tk, rows);
    let record = decode_record(d);
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
    words.extend_from_slice(&[
        0,
        to_u32(chunk, "chunk size")?,
        to_u32(chunks, "chunk count")?,
        record as u32,
    ]);
    let bytes: &[u8] = bytemuck::cast_slice(&words);
    let srcs = [buffer(q), buffer(k), buffer(v), buffer(mask.unwrap_or(q))];
    let has_mask = if mask.is_some() { 1.0 } else { 0.0 };
    let wg_memory = ctx.workgroup_memory();
    let decodes = tq <= DECODE_MAX_TQ && d <= DECODE_MAX_D;
    let kernel = if wg_memory < 32 * 1024 || (d > TILED_MAX_D && !decodes) {
        &ATTENTION
    } else if decodes {
        let decode = Decode {
            kernel: &DECODE_ATTENTION,
            constants: decode_constants([
                ("DT", code(dt)),
                ("FAST", fast as f64),
                ("HAS_MASK", has_mask),
            ]),
            params: bytes,
            inputs: &srcs,
            updated: None,
            rows,
            chunks,
            d,
        };
        return decode.run(ctx, out, out_dtype);
    } else if coop_flash(ctx, [q, k, v], tq, tk, d) {
        return ctx.dispatch(
            &FLASH_COOP,
            &[
                ("DT", code(dt)),
                ("OUT_DT", code(out_dtype)),
                ("HAS_MASK", has_mask),
                ("DF", (d / 16) as f64),
            ],
            bytes,
            &srcs,
            out,
            ctx.grid(to_u32(b * h * tq.div_ceil(COOP_BQ), "workgroup count")?),
        );
    } else if wg_memory >= 48 * 1024 {
        &FLASH_ATTENTION_32
    } else {
        &FLASH_ATTENTION_16
    };
    let groups = if std::ptr::eq(kernel, &ATTENTION) {
        rows
    } else {
        b * h * tq.div_ceil(FLASH_BQ)
    };
    ctx.dispatch(
        kernel,
        &[
            ("DT", code(dt)),
            ("FAST", fast as f64),
            ("OUT_DT", code(out_dtype)),
            ("HAS_MASK", has_mask),
        ],
        bytes,
        &srcs,
        out,
        ctx.grid(to_u32(groups, "workgroup count")?),
    )
}

/// A launch of the split-K decode kernel ([`DECODE_ATTENTION`] or
/// [`ATTENTION_STEP`]).
struct Decode<'a> {
    kernel: &'static Kernel,
    /// The override constants other than those [`Decode::run`] adds.
    constants: Vec<(&'static str, f64)>,
    params: &'a [u8],
    inputs: &'a [&'a GpuBuffer],
    /// The buffer the kernel updates besides its output (the KV cache of
    /// a step).
    updated: Option<&'a GpuBuffer>,
    rows: usize,
    chunks: usize,
    d: usize,
}

/// A decode kernel's first constants, with room for those `Decode::run`
/// adds, so that a dispatch allocates once.
fn decode_constants(first: [(&'static str, f64); 3]) -> Vec<(&'static str, f64)> {
    let mut c = Vec::with_capacity(10);
    c.extend(first);
    c
}

impl Decode<'_> {
    /// One dispatch that writes the output when one chunk holds every key;
    /// otherwise the chunks' partial results into a scratch buffer, then
    /// their merge.
    fn run(mut self, ctx: &Context, out: &GpuBuffer, out_dtype: DType) -> Result<()> {
        let (rows, chunks, d) = (self.rows, self.chunks, self.d);
        // whole chunks of 4 dimensions
        let whole = d.is_multiple_of(4);
        // lanes a key in scores_sg.wgsl: a head's chunks rounded up to a
        // power of two, within a subgroup
        let width = ctx.subgroup_width().max(1) as usize;
        let kl = d.div_ceil(4).next_power_of_two().min(width).min(32);
        // threads a workgroup (ROW_THREADS, also decode_attention.wgsl's
        // THREADS): 256 where one takes every key of its row
        self.constants.extend([
            ("D4", d.div_ceil(4) as f64),
            ("KL", kl as f64),
            ("ROW_THREADS", if chunks == 1 { 256.0 } else { 128.0 }),
            ("WHOLE", if whole { 1.0 } else { 0.0 }),
        ]);
        let mut outputs: Vec<&GpuBuffer> = self.updated.into_iter().collect();
        if chunks == 1 && whole {
            self.constants
                .extend([("FINAL", 1.0), ("OUT_DT", code(out_dtype))]);
            outputs.push(out);
            return ctx.dispatch_outputs(
                self.kernel,
                &self.constants,
                self.params,
                self.inputs,
                &outputs,
                ctx.grid(to_u32(rows, "workgroup count")?),
            );
        }
        let scratch = chunk_records(ctx, rows, chunks, d)?;
        outputs.push(&scratch);
        ctx.dispatch_outputs(
            self.kernel,
            &self.constants,
            self.params,
            self.inputs,
            &outputs,
            ctx.grid(to_u32(rows * chunks, "workgroup count")?),
        )?;
        combine(ctx, &scratch, rows, chunks, d, out, out_dtype)
    }
}

/// A scratch buffer for the partial results of `chunks` chunks of keys of
/// each of `rows` rows (see [`decode_record`]).
fn chunk_records(ctx: &Context, rows: usize, chunks: usize, d: usize) -> Result<GpuBuffer> {
    ctx.pool
        .alloc((rows * chunks * decode_record(d) * 4) as u64)
}

/// Merges the chunks' partial results in `scratch` into the output rows
/// ([`ATTENTION_COMBINE`]).
fn combine(
    ctx: &Context,
    scratch: &GpuBuffer,
    rows: usize,
    chunks: usize,
    d: usize,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    let header = [
        to_u32(rows, "row count")?,
        d as u32,
        chunks as u32,
        decode_record(d) as u32,
    ];
    ctx.dispatch(
        &ATTENTION_COMBINE,
        &[("OUT_DT", code(out_dtype))],
        bytemuck::cast_slice(&header),
        &[scratch],
        out,
        ctx.grid(header[0]),
    )
}

/// Words of one chunk's partial result: m, l, two unused words, the head.
fn decode_record(d: usize) -> usize {
    4 + d.next_multiple_of(4)
}

/// Whether [`attention_step`] runs a step with these operands: a head size
/// the decode kernel takes whose halves are whole vec4 chunks, contiguous
/// operands at even offsets (whole words of 16-bit dtypes), f32 angles.
pub(crate) fn fuses_step(
    ctx: &Context,
    qkv: &Tensor,
    cache: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
) -> bool {
    let d = qkv.shape()[2];
    d.is_multiple_of(8)
        && d <= DECODE_MAX_D
        && ctx.workgroup_memory() >= 32 * 1024
        && [qkv, cache, cos, sin]
            .iter()
            .all(|t| t.is_contiguous() && t.layout().offset().is_multiple_of(2))
}

/// One decode step of attention over a KV cache: through subgroups
/// ([`ATTENTION_STEP_SG`]) where the adapter's subgroups allow it,
/// otherwise [`ATTENTION_STEP`]; one kernel, or two (the chunks of keys,
/// then their merge) when the cache spans several chunks: `qkv` `[1,
/// heads + 2 KVH, D]`
/// holds the new position's queries, key and value (not rotated); `cos`
/// and `sin` `[1, D / 2]` its angles; `cache` `[capacity, 2 KVH, D]` the
/// keys and values of positions `0..start`, to which the kernel adds
/// position `start` (the key rotated). `out` gets `[1, heads, D]`. The
/// caller checked shapes, dtypes and [`fuses_step`].
pub(crate) fn attention_step(
    ctx: &Context,
    qkv: &Tensor,
    cache: &Tensor,
    (cos, sin): (&Tensor, &Tensor),
    step: &crate::fused::AttentionStep,
    out: &GpuBuffer,
) -> Result<()> {
    let (start, style, heads, scale) = (step.start, step.style, step.heads, step.scale);
    let d = qkv.shape()[2];
    // a window starts the keys further in: the kernel sees the cache from
    // row `first` on, and writes the new position at its last row
    let first = step.first_key();
    let tk = start + 1 - first;
    let lanes = step_sg_lanes(ctx, qkv, cache, style);
    // keys a workgroup takes, and workgroups a head
    let (chunk, chunks) = match lanes {
        Some(_) => sg_chunks(tk),
        None => decode_split(tk, heads),
    };
    let u = |v: usize, what: &str| to_u32(v, what);
    let words = step_words(
        qkv,
        cache,
        (cos, sin),
        [1, tk, first, heads, chunk, chunks],
        scale,
        step.softcap,
    )?;
    let adjacent = if style == RopeStyle::Adjacent {
        1.0
    } else {
        0.0
    };
    let dt = qkv.dtype();
    if let Some((lanes, wide)) = lanes {
        let scratch = if chunks > 1 {
            Some(chunk_records(ctx, heads, chunks, d)?)
        } else {
            None
        };
        ctx.dispatch_outputs(
            &ATTENTION_STEP_SG,
            &[
                ("DT", code(dt)),
                ("ADJACENT", adjacent),
                ("LK", lanes as f64),
                ("WIDE", if wide { 1.0 } else { 0.0 }),
            ],
            bytemuck::cast_slice(&words),
            &[buffer(qkv), buffer(cos), buffer(sin)],
            &[buffer(cache), scratch.as_ref().unwrap_or(out)],
            ctx.grid(u(heads * chunks, "workgroup count")?),
        )?;
        return match &scratch {
            Some(s) => combine(ctx, s, heads, chunks, d, out, dt),
            None => Ok(()),
        };
    }
    Decode {
        kernel: &ATTENTION_STEP,
        constants: decode_constants([("DT", code(dt)), ("FAST", 7.0), ("ADJACENT", adjacent)]),
        params: bytemuck::cast_slice(&words),
        inputs: &[buffer(qkv), buffer(cos), buffer(sin)],
        updated: Some(buffer(cache)),
        rows: heads,
        chunks,
        d,
    }
    .run(ctx, out, dt)
}

/// The parameters (attention_params.wgsl) of a decode step over a cache
/// for the step kernels: `[batch, key count, first cache row, query
/// heads, chunk, chunks]` in `sizes`; attention_step_io.wgsl says where
/// the new position's parts sit.
fn step_words(
    qkv: &Tensor,
    cache: &Tensor,
    (cos, sin): (&Tensor, &Tensor),
    sizes: [usize; 6],
    scale: f32,
    softcap: Option<f32>,
) -> Result<Vec<u32>> {
    let [batch, tk, first, heads, chunk, chunks] = sizes;
    let u = |v: usize, what: &str| to_u32(v, what);
    let d = qkv.shape()[2];
    let kvh = cache.shape()[1] / 2;
    let oq = qkv.layout().offset();
    let oc = cache.layout().offset() + first * 2 * kvh * d;
    let (row_q, row_c) = (
        u(qkv.shape()[1] * d, "row size")?,
        u(2 * kvh * d, "row size")?,
    );
    let mut words = vec![
        u(batch, "batch")?,
        1,
        u(tk, "key count")?,
        u(heads, "head count")?,
        u(kvh, "KV head count")?,
        u(d, "head size")?,
        scale.to_bits(),
        1,
        u(oq, "offset")?,
        u(oc, "offset")?,
        u(oc + kvh * d, "offset")?,
        // the new keys and values in qkv, the angles (attention_step_io.wgsl)
        u(oq + heads * d, "offset")?,
    ];
    let d32 = d as u32;
    words.extend_from_slice(&[0, row_q, d32, 1]);
    words.extend_from_slice(&[0, row_c, d32, 1]);
    words.extend_from_slice(&[0, row_c, d32, 1]);
    words.extend_from_slice(&[
        u(oq + (heads + kvh) * d, "offset")?,
        u(cos.layout().offset(), "offset")?,
        u(sin.layout().offset(), "offset")?,
        0,
    ]);
    words.extend_from_slice(&[
        softcap.unwrap_or(0.0).to_bits(),
        u(chunk, "chunk size")?,
        u(chunks, "chunk count")?,
        decode_record(d) as u32,
    ]);
    Ok(words)
}

/// Whether [`attention_step_batch`] runs a batched step with these
/// operands: those of [`fuses_step`] with the subgroup kernel's lanes.
pub(crate) fn fuses_batch_step(
    ctx: &Context,
    qkv: &Tensor,
    cache: &Tensor,
    (cos, sin): (&Tensor, &Tensor),
    style: RopeStyle,
) -> bool {
    fuses_step(ctx, qkv, cache, cos, sin) && step_sg_lanes(ctx, qkv, cache, style).is_some()
}

/// One decode step of several sequences whose caches are runs of rows of
/// one `cache` ([`ATTENTION_STEP_SG_BATCH`]): row b of `qkv` `[B, heads +
/// 2 KVH, D]`, `cos` and `sin` `[B, D / 2]` is sequence b's new position;
/// `seqs` (U32 `[2 B]`) holds each one's first key row in the cache and
/// its key count (the new position's included, written at its last
/// row). `out` gets `[B, heads, D]`. The caller checked
/// [`fuses_batch_step`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_step_batch(
    ctx: &Context,
    qkv: &Tensor,
    cache: &Tensor,
    (cos, sin): (&Tensor, &Tensor),
    seqs: &Tensor,
    max_keys: usize,
    step: &crate::fused::BatchAttentionStep,
    out: &GpuBuffer,
) -> Result<()> {
    let (batch, d) = (qkv.shape()[0], qkv.shape()[2]);
    let heads = step.heads;
    let Some((lanes, wide)) = step_sg_lanes(ctx, qkv, cache, step.style) else {
        return Err(crate::Error::NotSupported {
            op: "cached_attention_batch",
            reason: "the batched step kernel needs the subgroup step kernel's lanes".into(),
        });
    };
    let (chunk, chunks) = sg_chunks(max_keys);
    let sizes = [batch, max_keys, 0, heads, chunk, chunks];
    let words = step_words(qkv, cache, (cos, sin), sizes, step.scale, step.softcap)?;
    let rows = batch * heads;
    let scratch = if chunks > 1 {
        Some(chunk_records(ctx, rows, chunks, d)?)
    } else {
        None
    };
    let adjacent = if step.style == RopeStyle::Adjacent {
        1.0
    } else {
        0.0
    };
    let dt = qkv.dtype();
    ctx.dispatch_outputs(
        &ATTENTION_STEP_SG_BATCH,
        &[
            ("DT", code(dt)),
            ("ADJACENT", adjacent),
            ("LK", lanes as f64),
            ("WIDE", if wide { 1.0 } else { 0.0 }),
        ],
        bytemuck::cast_slice(&words),
        &[buffer(qkv), buffer(cos), buffer(sin), buffer(seqs)],
        &[buffer(cache), scratch.as_ref().unwrap_or(out)],
        ctx.grid(to_u32(rows * chunks, "workgroup count")?),
    )?;
    match &scratch {
        Some(s) => combine(ctx, s, rows, chunks, d, out, dt),
        None => Ok(()),
    }
}

/// Keys of one workgroup of [`ATTENTION_STEP_SG`] and their number a head
/// for a step over `tk` keys: one workgroup a head up to
/// [`SG_MIN_CHUNK`] keys, otherwise about [`SG_CHUNKS`] chunks of at least
/// that many keys, in whole multiples of 128 keys.
///
/// A long cache split over workgroups keeps more of the GPU busy than one
/// workgroup a head, from about 2,000 keys on; chunks of 512 keys are best
/// up to about 4,000 keys, and about ten chunks a head beyond
/// (docs/tuning.md, "Attention split").
const SG_MIN_CHUNK: usize = 512;
const SG_CHUNKS: usize = 10;

fn sg_chunks(tk: usize) -> (usize, usize) {
    if tk <= SG_MIN_CHUNK {
        return (tk, 1);
    }
    let chunk = tk
        .div_ceil(SG_CHUNKS)
        .next_multiple_of(128)
        .max(SG_MIN_CHUNK);
    (chunk, tk.div_ceil(chunk))
}

/// The lanes a key of [`ATTENTION_STEP_SG`] takes where that kernel runs
/// this step, and whether each lane takes 32 bytes (`WIDE`, f32 heads
/// whose 16-byte chunks outnumber a subgroup) instead of 16: subgroups of
/// one width that hold a key's lanes, a power of two of them, halves of
/// whole chunks for the rotate-half layout, and operands at multiples of
/// 16 bytes.
fn step_sg_lanes(
    ctx: &Context,
    qkv: &Tensor,
    cache: &Tensor,
    style: RopeStyle,
) -> Option<(usize, bool)> {
    let size = qkv.dtype().size_in_bytes();
    let d = qkv.shape()[2];
    let width = ctx.subgroup_width() as usize;
    let wide = size == 4 && d / 4 > width;
    let per_chunk = if wide { 8 } else { 16 / size };
    let lanes = d / per_chunk;
    let half_whole = style == RopeStyle::Adjacent || (d / 2).is_multiple_of(per_chunk);
    let aligned = [qkv, cache]
        .iter()
        .all(|t| t.layout().offset().is_multiple_of(16 / size));
    (width >= lanes
        && d.is_multiple_of(per_chunk)
        && lanes.is_power_of_two()
        && half_whole
        && aligned)
        .then_some((lanes, wide))
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
            for kernel in [&ATTENTION, &FLASH_ATTENTION_32, &FLASH_ATTENTION_16] {
                out.push((
                    kernel,
                    vec![
                        ("DT", dt),
                        ("OUT_DT", dt),
                        ("HAS_MASK", mask),
                        ("FAST", 7.0),
                    ],
                ));
            }
            out.push((
                &DECODE_ATTENTION,
                vec![
                    ("DT", dt),
                    ("HAS_MASK", mask),
                    ("FAST", 6.0),
                    ("ROW_THREADS", 128.0),
                ],
            ));
            out.push((
                &DECODE_ATTENTION,
                vec![
                    ("DT", dt),
                    ("HAS_MASK", mask),
                    ("FINAL", 1.0),
                    ("OUT_DT", dt),
                    ("D4", 32.0),
                    ("KL", 32.0),
                    ("ROW_THREADS", 128.0),
                    ("WHOLE", 1.0),
                ],
            ));
        }
        for (adjacent, last) in [(0.0, 1.0), (1.0, 1.0), (0.0, 0.0)] {
            let mut c = vec![("DT", dt), ("FAST", 7.0), ("ADJACENT", adjacent)];
            c.extend([("D4", 16.0), ("KL", 8.0), ("WHOLE", 1.0)]);
            if last == 1.0 {
                c.extend([("FINAL", 1.0), ("OUT_DT", dt), ("ROW_THREADS", 256.0)]);
            } else {
                c.push(("ROW_THREADS", 128.0));
            }
            out.push((&ATTENTION_STEP, c));
        }
        for (adjacent, lanes) in [(0.0, 8.0), (1.0, 16.0)] {
            for kernel in [&ATTENTION_STEP_SG, &ATTENTION_STEP_SG_BATCH] {
                out.push((
                    kernel,
                    vec![("DT", dt), ("ADJACENT", adjacent), ("LK", lanes)],
                ));
            }
            if dt == 0.0 {
                out.push((
                    &ATTENTION_STEP_SG,
                    vec![
                        ("DT", dt),
                        ("ADJACENT", adjacent),
                        ("LK", lanes),
                        ("WIDE", 1.0),
                    ],
                ));
            }
        }
        out.push((&ATTENTION_COMBINE, vec![("OUT_DT", dt)]));
        for (mask, df) in [(0.0, 8.0), (1.0, 4.0), (0.0, 1.0)] {
            out.push((
                &FLASH_COOP,
                vec![("DT", 1.0), ("OUT_DT", dt), ("HAS_MASK", mask), ("DF", df)],
            ));
        }
    }
    out
}
