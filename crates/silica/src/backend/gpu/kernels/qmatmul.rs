//! Launchers of the quantized matmul kernels: `x @ wᵀ` with `w` in a GGML
//! block format, decoded inside the kernel (GEMV for few rows of x, tiled
//! for many).

use super::elementwise::via_f32;
use super::launch::{buffer, to_u32};
use super::{Context, Kernel, KernelNeeds};
use crate::memory::GpuBuffer;
use crate::quant::QuantFormat;
use crate::storage::Storage;
use crate::{DType, Error, QFusion, Result, Tensor};

macro_rules! qkernel {
    ($($file:literal),+) => {
        concat!(
            include_str!("shared/common.wgsl"),
            include_str!("shared/qmatmul_common.wgsl"),
            include_str!("shared/qmatmul_x4.wgsl"),
            include_str!("shared/quant_blocks.wgsl"),
            $(include_str!($file)),+
        )
    };
}

pub(crate) static QGEMV: Kernel = Kernel {
    name: "qgemv",
    source: qkernel!(
        "shared/qgemv_common.wgsl",
        "shared/lanes.wgsl",
        "qgemv.wgsl"
    ),
    // x, the blocks, the norm weight, the residual, the blocks again, the
    // low-rank update's u and b (x in place of those not fused; see
    // qgemv_common.wgsl)
    inputs: 7,
    trusted: true,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};

pub(crate) static QGEMV_I8: Kernel = Kernel {
    name: "qgemv_i8",
    source: qkernel!(
        "shared/qgemv_common.wgsl",
        "shared/lanes.wgsl",
        "shared/rows.wgsl",
        "qgemv_i8.wgsl"
    ),
    inputs: 7,
    trusted: true,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};

pub(crate) static QMATMUL: Kernel = Kernel {
    name: "qmatmul",
    source: qkernel!("shared/store4.wgsl", "qmatmul.wgsl"),
    inputs: 2,
    trusted: true,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};

pub(crate) static QMATMUL_COOP: Kernel = Kernel {
    name: "qmatmul_coop",
    source: concat!(
        "enable f16;\nenable wgpu_cooperative_matrix;\n",
        include_str!("shared/coop16.wgsl"),
        include_str!("shared/common.wgsl"),
        include_str!("shared/qmatmul_common.wgsl"),
        include_str!("shared/quant_blocks.wgsl"),
        include_str!("shared/halves8.wgsl"),
        include_str!("shared/qmatmul_coop.wgsl"),
        include_str!("coop_tiles.wgsl"),
        include_str!("shared/coop_frags.wgsl"),
        include_str!("shared/coop_store.wgsl")
    ),
    inputs: 2,
    trusted: true,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::COOP16,
};

pub(crate) static QMATMUL_NARROW: Kernel = Kernel {
    name: "qmatmul_narrow",
    source: concat!(
        "enable f16;\nenable wgpu_cooperative_matrix;\n",
        include_str!("shared/coop16.wgsl"),
        include_str!("shared/common.wgsl"),
        include_str!("shared/qmatmul_common.wgsl"),
        include_str!("shared/quant_blocks.wgsl"),
        include_str!("shared/halves8.wgsl"),
        include_str!("qmatmul_narrow.wgsl")
    ),
    inputs: 2,
    trusted: true,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::COOP16,
};

pub(crate) static SPLIT_SUM: Kernel = Kernel {
    name: "split_sum",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/store.wgsl"),
        include_str!("split_sum.wgsl")
    ),
    inputs: 2,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};

/// Workgroups of the cooperative-matrix kernel up to which a split of K
/// adds parts: about two per SM of a large GPU (132 on an H100 or H200).
const SPLIT_GROUPS: usize = 256;

/// Elements of K a part of a split K walks at least (8 steps of 32).
const SPLIT_MIN_K: usize = 256;

/// Parts of K for the cooperative-matrix kernel on a product of `tiles`
/// 128x128 tiles and depth `k`: the most (a power of two, at most `most`)
/// that keep the grid within [`SPLIT_GROUPS`] and each part at least
/// [`SPLIT_MIN_K`] deep. Narrow products (a 1B model's 2,048-column ones
/// at up to 128 rows: 16 tiles) otherwise leave most of a large GPU's SMs
/// idle (docs/tuning.md, "Split K").
pub(crate) fn coop_splits(tiles: usize, k: usize, most: usize) -> usize {
    let mut parts = 1;
    while parts * 2 <= most && tiles * parts * 2 <= SPLIT_GROUPS && k / (parts * 2) >= SPLIT_MIN_K {
        parts *= 2;
    }
    parts
}

/// Rows of f16 x from which the cooperative-matrix kernel takes every
/// product (its tiles have 128 rows; fewer rows: [`narrow_coop`]);
/// `qtensor.rs` keeps an f16 prefill in f16 from here on.
pub(crate) const COOP_MIN_M: usize = 64;

/// Weights (rows times K) from which a product of f16 x with fewer than
/// [`COOP_MIN_M`] rows takes the cooperative-matrix kernel (from
/// `GpuFeatures::coop_rows` rows on, up to [`COOP_NARROW_MAX_K`]). A small
/// model's products (SmolLM2's are at most 1.8 M weights) stay on the GEMV
/// kernels, where a narrow grid of the tiled kernel loses; a 1B model's
/// (4.2 M and more) gain (docs/tuning.md, "Narrow products on tensor
/// cores").
const COOP_NARROW_WEIGHTS: usize = 1 << 22;

/// Depth up to which a narrow product takes the 128-row tiles (the
/// K-quants): they wait on their loads, and deeper products were slower
/// there than in GEMV chunks. qmatmul_narrow.wgsl takes any depth whose
/// partial products fit [`NARROW_PARTIAL_BYTES`], which is faster than
/// the GEMV chunks at every depth measured (docs/tuning.md, "Narrow
/// products, a subgroup a tile").
const COOP_NARROW_MAX_K: usize = 2048;

/// Whether a product of `m` rows of f16 x with `weight_rows` rows of K
/// values, fewer than [`COOP_MIN_M`] rows, takes a cooperative-matrix
/// kernel on this device (qmatmul_narrow.wgsl where [`narrow_kernel`] and
/// its partial products fit, else the 128-row tiles up to
/// [`COOP_NARROW_MAX_K`]; split along K so that few tiles still fill the
/// GPU) rather than the GEMV kernels in chunks of 8 rows, each of which
/// decodes the weights again.
pub(crate) fn narrow_coop(
    ctx: &Context,
    format: QuantFormat,
    m: usize,
    weight_rows: usize,
    k: usize,
) -> bool {
    super::matmul::coop_tiles(ctx)
        && m > GEMV_MAX_M
        && m >= ctx.features().coop_rows as usize
        && (k <= COOP_NARROW_MAX_K || narrow_kernel_fits(ctx, format, m, weight_rows, k))
        && weight_rows * k >= COOP_NARROW_WEIGHTS
}

/// Whether qmatmul_narrow.wgsl can take this product: a format it reads,
/// at most [`NARROW_MAX_M`] rows, partial products within
/// [`NARROW_PARTIAL_BYTES`].
fn narrow_kernel_fits(
    ctx: &Context,
    format: QuantFormat,
    m: usize,
    weight_rows: usize,
    k: usize,
) -> bool {
    narrow_kernel(ctx, format)
        && m <= NARROW_MAX_M
        && narrow_partials(m, weight_rows, k) <= NARROW_PARTIAL_BYTES
}

pub(crate) static QROWS: Kernel = Kernel {
    name: "qrows",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("qrows.wgsl"),
        include_str!("shared/quant_blocks.wgsl")
    ),
    inputs: 2,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};

/// Rows `ids` (contiguous u32) of the quantized matrix `w` with rows of
/// `k` values, decoded into `out` (`[ids, k]` of `out_dtype`).
pub(crate) fn qrows(
    ctx: &Context,
    format: QuantFormat,
    ids: &Tensor,
    w: &Tensor,
    k: usize,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    decode_rows(ctx, format, Some(ids), ids.numel(), w, k, out, out_dtype)
}

/// qrows.wgsl over `count` rows: those `ids` names, or with `None` the
/// first `count` rows of `w` in order.
#[allow(clippy::too_many_arguments)]
fn decode_rows(
    ctx: &Context,
    format: QuantFormat,
    ids: Option<&Tensor>,
    count: usize,
    w: &Tensor,
    k: usize,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    let row_bytes = format.bytes_for(k);
    let rows = (w.numel() * 4) / row_bytes.max(1);
    let threads = count * k / 8;
    let groups = threads.div_ceil(256);
    let max = ctx.max_groups() as usize;
    let grid = [groups.min(max), groups.div_ceil(max), 1];
    if grid[1] > max {
        return Err(Error::NotSupported {
            op: "embedding_q",
            reason: format!("grid {grid:?} exceeds the adapter's workgroup limit"),
        });
    }
    let header = [
        to_u32(count, "ids")?,
        to_u32(k, "K")?,
        to_u32(row_bytes, "row bytes")?,
        to_u32(rows, "rows")?,
        to_u32(ids.map_or(0, |i| i.layout().offset()), "offset")?,
        ids.is_none() as u32,
        0,
        0,
    ];
    ctx.dispatch(
        &QROWS,
        &[
            ("FMT", format.gpu_code() as f64),
            ("OUT_DT", out_dtype.gpu_code() as f64),
            ("HW_PACK", super::matmul::coop_tiles(ctx) as u32 as f64),
        ],
        bytemuck::cast_slice(&header),
        &[buffer(ids.unwrap_or(w)), buffer(w)],
        out,
        [grid[0] as u32, grid[1] as u32, 1],
    )
}

/// Rows of x up to which the GEMV kernel is used.
const GEMV_MAX_M: usize = 8;

/// Weight rows that one set of lanes of the GEMV kernel dots with the
/// same values of x, for `n` output columns (`gated`: SwiGLU's gate and
/// up rows of them): as many as 8 accumulators allow for M rows of x, but
/// 2 instead of 4 for outputs of up to [`GEMV_FEW_COLUMNS`] columns, and 1
/// for one row of x and up to [`GEMV_FEWEST_COLUMNS`]. SwiGLU keeps 4 at
/// up to 2 rows of x and takes 2 beyond (a gate and an up row; with 5 to
/// 8 rows of x, 16 accumulators).
fn gemv_rows(m: usize, n: usize, gated: bool) -> usize {
    match m {
        1 | 2 if gated || n > GEMV_FEW_COLUMNS => 4,
        1 if n <= GEMV_FEWEST_COLUMNS => 1,
        1..=4 => 2,
        _ if gated => 2,
        _ => 1,
    }
}

/// Output columns up to which a GEMV lane set takes 1 weight row: with
/// sets of 32 lanes (8 a workgroup) there are at most 128 workgroups then,
/// fewer than a large GPU has SMs, so spreading the rows over more
/// workgroups gains more than sharing x between rows; on wider outputs it
/// loses. Measured with qgemv_i8; the f32 GEMV (devices without 8-bit
/// activations) follows the same bound unmeasured (docs/tuning.md,
/// "Decode GEMV rows").
const GEMV_FEWEST_COLUMNS: usize = 1024;

/// Output columns up to which a GEMV lane set takes 2 weight rows rather
/// than 4: with 4, outputs this narrow (a 1B model's attention output and
/// down projections, 2,048 columns, and its q, k, v product, 3,072) make
/// too few workgroups to keep a large GPU's SMs busy with loads. From
/// 4,096 columns on, 4 rows win (docs/tuning.md, "Decode GEMV rows").
const GEMV_FEW_COLUMNS: usize = 3072;

/// Lanes per set of the GEMV kernel: 32, or more when the sets (one per
/// `rows` weight rows) are too few to keep about half a million threads
/// busy and each lane still decodes at least 2 parts.
fn gemv_lanes(n: usize, k: usize, rows: usize) -> usize {
    let groups = k / 32;
    let sets = n.div_ceil(rows);
    let mut lanes = 32;
    while lanes < 128 && sets * lanes < 1 << 19 && groups * 4 >= lanes * 2 * 2 {
        lanes *= 2;
    }
    lanes
}

/// Whether the GEMV kernels take (and fuse, every fusion: SwiGLU's lane
/// sets take two weight rows at least, see [`gemv_rows`]) a product of `m`
/// rows of x with `weight_rows` rows of w on this device: up to 8 rows of
/// x always; up to `GpuFeatures::gemv_rows` in chunks of at most 8 while
/// there are at most [`GEMV_ANY_CHUNKS`] or the chunks times the weight
/// rows (of `k` values) stay within [`GEMV_CHUNK_ROWS`], except f16 x
/// (`x16`) that [`narrow_coop`] sends to the cooperative-matrix kernel or
/// [`decodes_first`] to the f16 kernels.
pub(crate) fn takes_gemv(
    ctx: &Context,
    format: QuantFormat,
    m: usize,
    weight_rows: usize,
    k: usize,
    x16: bool,
) -> bool {
    let coop = x16
        && (narrow_coop(ctx, format, m, weight_rows, k) || decodes_first(ctx, m, weight_rows, k));
    m <= GEMV_MAX_M
        || (!coop
            && m <= ctx.features().gemv_rows as usize
            && (gemv_chunks(m).0 <= GEMV_ANY_CHUNKS
                || gemv_chunks(m).0 * weight_rows <= GEMV_CHUNK_ROWS))
}

/// Weight rows times chunks of 8 rows of x up to which the GEMV kernels
/// beat the tiled ones. Each chunk reads the weight again (from the
/// cache where it fits), while the tiled kernel's 64-column tiles leave
/// most of a large GPU idle on narrow products: on an H200 a 1B model's
/// 2,048-column products take the GEMV up to 64 rows of x (8 chunks),
/// its 8,192-column up product up to 32 rows (4), as measured
/// (docs/tuning.md, "GEMV chunks").
const GEMV_CHUNK_ROWS: usize = 1 << 15;

/// Chunks up to which the GEMV kernels take a product whatever its weight
/// rows: two chunks read the weights at about half the tiled kernel's
/// cost per weight on tall products too (an 8B model's gate and up at 16
/// rows, docs/tuning.md, "GEMV chunks").
const GEMV_ANY_CHUNKS: usize = 2;

/// The chunks of a GEMV product of `m` rows of x (`fuses`): how many, and
/// the rows each takes (the last may take fewer). As even as whole chunks
/// of at most [`GEMV_MAX_M`] rows allow, since a chunk of M rows costs
/// about the same whatever its rows.
fn gemv_chunks(m: usize) -> (usize, usize) {
    let chunks = m.div_ceil(GEMV_MAX_M).max(1);
    (chunks, m.div_ceil(chunks))
}

/// Output columns of one GEMV lane set dotting `rows` weight rows: all of
/// them, or half with SwiGLU (gate and up rows of the same columns).
fn output_columns(rows: usize, fusion: QFusion) -> usize {
    if fusion.gated() { rows / 2 } else { rows }
}

/// `x @ wᵀ` (inputs as for `Op::QMatmul`), with the fusions of the GEMV
/// kernel; a fusion it cannot do is `NotSupported` (the op layer runs
/// those as separate ops). `int8`: decode may round x to 8 bits
/// (qgemv_i8).
#[allow(clippy::too_many_arguments)]
pub(crate) fn qmatmul(
    ctx: &Context,
    format: QuantFormat,
    fusion: QFusion,
    int8: bool,
    inputs: &[&Tensor],
    out_shape: &[usize],
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    let (x, w) = (inputs[0], inputs[1]);
    let k = x.shape().last().copied().unwrap_or(0);
    let n = out_shape.last().copied().unwrap_or(0);
    let m = x.numel() / k.max(1);
    if !k.is_multiple_of(32) || !x.layout().offset().is_multiple_of(8) || !x.is_contiguous() {
        // the op layer hands over contiguous, aligned x and whole blocks
        return Err(Error::NotSupported {
            op: "matmul_q",
            reason: "x must be contiguous from a multiple of 8 elements".into(),
        });
    }
    let weight_rows = if fusion.gated() { 2 * n } else { n };
    let x16 = x.dtype() == DType::F16;
    let gemv_path = takes_gemv(ctx, format, m, weight_rows, k, x16);
    // past the GEMV kernels a residual alone is added by the sum of a
    // split product's parts, or after the product
    let residual = match fusion {
        _ if gemv_path || fusion.is_none() => None,
        _ if fusion == QFusion::RESIDUAL => Some(inputs[2]),
        _ => {
            return Err(Error::NotSupported {
                op: "matmul_q",
                reason: format!("no kernel fuses {fusion:?} for {m} rows"),
            });
        }
    };
    if !gemv_path && x16 && decodes_first(ctx, m, weight_rows, k) {
        match decoded_product(ctx, format, x, w, [m, n, k], residual, out, out_dtype) {
            // the scratch matrix did not fit: the quantized tiles need none
            Err(Error::OutOfMemory { .. }) => {}
            done => return done,
        }
    }
    let row_bytes = format.bytes_for(k);
    let max = ctx.max_groups() as usize;
    let (kernel, grid, gemv) = if gemv_path {
        // in chunks of up to 8 rows of x, one a grid row (the shaders'
        // `start_chunk`)
        let (chunks, m) = gemv_chunks(m);
        // qgemv_i8 where the device allows 8-bit activations, else the f32
        // kernel. Both take 4 weight rows per lane set, 2 for outputs of up
        // to 3,072 columns, 1 up to 1,024 (see gemv_rows); SwiGLU keeps 4.
        // qgemv_i8 takes at most 2 for Q6_K, and for Q4_K/Q5_K in SwiGLU
        // and in short rows (see integer_rows). 2 rows at 4,096 columns and
        // 4 at 2,048 both lose (docs/tuning.md, "Decode GEMV rows").
        let rows = gemv_rows(m, n, fusion.gated());
        let integer = integer_rows(format, m, rows, fusion.gated(), n, k);
        let lora_bytes = match fusion.project {
            true => m * low_rank_rank(fusion, inputs) * 4,
            false => 0,
        };
        let x_blocks = integer_gemv(ctx, int8, format, m, k, integer, lora_bytes);
        let rows = if x_blocks.is_some() { integer } else { rows };
        let oc = output_columns(rows, fusion);
        let lanes = match x_blocks {
            Some(_) => I8_LANES,
            None => gemv_lanes(n, k, oc),
        };
        let groups = n.div_ceil(256 / lanes * oc);
        let depth = match x_blocks {
            Some(_) if m == 1 => integer_depth(format, groups),
            _ => 1,
        };
        let gemv = Gemv {
            m,
            rows,
            lanes,
            fusion,
            low_rank: low_rank_rank(fusion, inputs),
            project: fusion.project,
            residual: x.dtype(),
            x_blocks,
            depth,
        };
        let kernel = if x_blocks.is_some() {
            &QGEMV_I8
        } else {
            &QGEMV
        };
        (
            kernel,
            [groups.min(max), groups.div_ceil(max), chunks],
            Some(gemv),
        )
    } else if x16 && takes_narrow(ctx, format, m, weight_rows, k) {
        let (mnk, r) = ([m, weight_rows, k], residual);
        return narrow_product(ctx, format, x, w, mnk, row_bytes, r, out, out_dtype);
    } else if x16
        && super::matmul::coop_tiles(ctx)
        && (m >= COOP_MIN_M || narrow_coop(ctx, format, m, weight_rows, k))
    {
        let tiles = [n.div_ceil(128), m.div_ceil(128)];
        let most = ctx.features().split_k as usize;
        let parts = coop_splits(tiles[0] * tiles[1], k, most);
        (&QMATMUL_COOP, [tiles[0], tiles[1], parts], None)
    } else {
        (&QMATMUL, [n.div_ceil(64), m.div_ceil(64), 1], None)
    };
    if grid.iter().any(|&g| g > max) {
        return Err(Error::NotSupported {
            op: "matmul_q",
            reason: format!("grid {grid:?} exceeds the adapter's workgroup limit"),
        });
    }
    let mut next = 2;
    let mut fused = |on: bool| {
        let t = on.then(|| inputs[next]);
        next += on as usize;
        t
    };
    let g = fused(fusion.rms_norm.is_some());
    let r = fused(fusion.residual);
    let lu = fused(fusion.low_rank);
    let lb = fused(fusion.low_rank);
    let header = [
        to_u32(m, "M")?,
        to_u32(n, "N")?,
        to_u32(k, "K")?,
        to_u32(row_bytes, "row bytes")?,
        to_u32(x.layout().offset(), "offset")?,
        fusion.rms_norm.unwrap_or(0.0).to_bits(),
        to_u32(g.map_or(0, |g| g.layout().offset()), "offset")?,
        to_u32(r.map_or(0, |r| r.layout().offset()), "offset")?,
    ];
    let bytes: &[u8] = bytemuck::cast_slice(&header);
    if gemv.is_none() && grid[2] > 1 {
        return split_product(
            ctx,
            format,
            x.dtype(),
            bytes,
            &[buffer(x), buffer(w)],
            grid,
            m * n,
            residual,
            out,
            out_dtype,
        );
    }
    let srcs = match gemv {
        Some(_) => vec![
            buffer(x),
            buffer(w),
            buffer(g.unwrap_or(x)),
            buffer(r.unwrap_or(x)),
            buffer(w),
            buffer(lu.unwrap_or(x)),
            buffer(lb.unwrap_or(x)),
        ],
        None => vec![buffer(x), buffer(w)],
    };
    plus_residual(ctx, residual, out_shape, out, out_dtype, |out| {
        via_f32(ctx, out_shape, out, out_dtype, |dst, dt| {
            ctx.dispatch(
                kernel,
                &constants(format, x.dtype(), dt, gemv),
                bytes,
                &srcs,
                dst,
                [grid[0] as u32, grid[1] as u32, grid[2] as u32],
            )
        })
    })
}

/// Most bytes of f16 weights a product decodes ahead of the f16 kernels
/// (a scratch buffer of the pool): an 8B model's gate and up product
/// (28,672 x 4,096) takes 235 MB; larger ones (a large vocabulary's LM
/// head) keep the quantized tiles.
const DECODED_MAX_BYTES: usize = 256 << 20;

/// Whether a product of `m` rows of f16 x takes [`decoded_product`]: from
/// `GpuFeatures::decoded_rows` rows on (0: never), where the f16
/// tensor-core kernels run, and within [`DECODED_MAX_BYTES`]; or on its
/// kept f16 weights (see [`keeps_decoded`]).
pub(crate) fn decodes_first(ctx: &Context, m: usize, weight_rows: usize, k: usize) -> bool {
    let rows = ctx.features().decoded_rows as usize;
    keeps_decoded(ctx, m, weight_rows, k)
        || (rows > 0
            && m >= rows
            && super::matmul::coop_tiles(ctx)
            && weight_rows * k * 2 <= DECODED_MAX_BYTES)
}

/// Whether a product of `m` rows of f16 x multiplies an f16 copy of its
/// weights kept beside them: from `GpuFeatures::keep_decoded` rows on (0:
/// never, the user's choice, since the copy takes 2 bytes a weight), on
/// any adapter with f16 kernels, for weights of one buffer binding, until
/// memory runs short (the pool then lets every copy go).
pub(crate) fn keeps_decoded(ctx: &Context, m: usize, weight_rows: usize, k: usize) -> bool {
    let rows = ctx.features().keep_decoded as usize;
    rows > 0
        && m >= rows
        && ctx.features().f16
        && (weight_rows * k * 2) as u64 <= ctx.pool.max_binding()
        && ctx.pool.keeps_derived()
}

/// What a weight buffer's decoded f16 copy is kept under: the words'
/// offset and length, and the format.
fn kept_key(format: QuantFormat, w: &Tensor) -> crate::memory::DerivedKey {
    [
        1,
        w.layout().offset() as u64,
        w.numel() as u64,
        format as u64,
    ]
}

/// The f16 copy `[n, k]` of the weights `w`: the one kept with `w`'s
/// buffer, or decoded now into a buffer of the pool (and kept when `keep`,
/// except while kernels are only being built: nothing runs then, so the
/// copy would hold undefined values).
fn decoded_weights(
    ctx: &Context,
    format: QuantFormat,
    w: &Tensor,
    n: usize,
    k: usize,
    keep: bool,
) -> Result<Tensor> {
    let key = kept_key(format, w);
    if keep && let Some(t) = buffer(w).derived(key) {
        return Ok(t);
    }
    let scratch = ctx.pool.alloc((n * k * 2) as u64)?;
    decode_rows(ctx, format, None, n, w, k, &scratch, DType::F16)?;
    let device = w.device().clone();
    let wt = Tensor::from_parts(Storage::Gpu(scratch), &[n, k], DType::F16, device);
    if keep && !crate::backend::gpu::building_only() {
        buffer(w).keep_derived(key, wt.clone());
    }
    Ok(wt)
}

/// `x @ wᵀ` with the weights first decoded into an f16 scratch matrix
/// (qrows.wgsl over every row) and multiplied on the f16 tensor-core
/// kernels, which run at about twice the rate of the quantized tiles on
/// long prompts (docs/tuning.md, "Weights decoded for long prompts").
#[allow(clippy::too_many_arguments)]
fn decoded_product(
    ctx: &Context,
    format: QuantFormat,
    x: &Tensor,
    w: &Tensor,
    [m, n, k]: [usize; 3],
    residual: Option<&Tensor>,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    let keep = keeps_decoded(ctx, m, n, k);
    let wt = decoded_weights(ctx, format, w, n, k, keep)?;
    let x = x.reshape(&[m, k])?;
    // (the f16 kernels split K themselves where the tiles are few)
    super::matmul::matmul_plus(ctx, &x, &wt.t()?, &[m, n], residual, out, out_dtype)
}

/// The cooperative-matrix product on a grid of `grid[2]` parts of K: each
/// part's f32 product of `count` elements goes to a scratch buffer, and
/// split_sum.wgsl adds them into `out`.
#[allow(clippy::too_many_arguments)]
fn split_product(
    ctx: &Context,
    format: QuantFormat,
    x_dtype: DType,
    header: &[u8],
    srcs: &[&GpuBuffer],
    grid: [usize; 3],
    count: usize,
    residual: Option<&Tensor>,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    let parts = grid[2];
    let partial = ctx.pool.alloc((parts * count * 4) as u64)?;
    ctx.dispatch(
        &QMATMUL_COOP,
        &constants(format, x_dtype, DType::F32, None),
        header,
        srcs,
        &partial,
        [grid[0] as u32, grid[1] as u32, parts as u32],
    )?;
    sum_parts(ctx, &partial, parts, count, None, residual, out, out_dtype)
}

/// split_sum.wgsl: `out` (`count` elements in `out_dtype`) = the sum of
/// the `parts` f32 partial products in `partial`, laid end to end, or with
/// `rows` (columns of out, row pitch of the parts) as qmatmul_narrow.wgsl
/// lays them; plus `residual` (contiguous, in `out_dtype`) where given.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sum_parts(
    ctx: &Context,
    partial: &GpuBuffer,
    parts: usize,
    count: usize,
    rows: Option<(usize, usize)>,
    residual: Option<&Tensor>,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    let (cols, pitch) = rows.unwrap_or((0, 0));
    let res_off = residual.map_or(0, |r| r.layout().offset());
    let sum = [
        to_u32(count, "element count")?,
        to_u32(parts, "parts")?,
        to_u32(cols, "columns")?,
        to_u32(pitch, "pitch")?,
        to_u32(res_off, "offset")?,
        0,
        0,
        0,
    ];
    let units = match out_dtype {
        DType::F16 | DType::BF16 => count.div_ceil(2),
        _ => count,
    };
    let res = residual.map_or(partial, buffer);
    ctx.dispatch(
        &SPLIT_SUM,
        &[
            ("OUT_DT", out_dtype.gpu_code() as f64),
            ("RES", residual.is_some() as u8 as f64),
        ],
        bytemuck::cast_slice(&sum),
        &[partial, res],
        out,
        ctx.grid_for_threads(units)?,
    )
}

/// `out = product + residual`: without a residual `product` writes `out`
/// itself; with one it writes a scratch buffer of the pool, which
/// binary_vec then adds to the residual into `out` (the products that end
/// in split_sum.wgsl add it there instead).
pub(crate) fn plus_residual(
    ctx: &Context,
    residual: Option<&Tensor>,
    out_shape: &[usize],
    out: &GpuBuffer,
    out_dtype: DType,
    product: impl FnOnce(&GpuBuffer) -> Result<()>,
) -> Result<()> {
    let Some(r) = residual else {
        return product(out);
    };
    let count: usize = out_shape.iter().product();
    let scratch = ctx.pool.alloc((count * out_dtype.size_in_bytes()) as u64)?;
    product(&scratch)?;
    let y = Tensor::from_parts(
        Storage::Gpu(scratch),
        out_shape,
        out_dtype,
        r.device().clone(),
    );
    let add = crate::ops::BinaryOp::Add as u32;
    super::elementwise::binary(ctx, add, &y, Some(r), 0.0, out, out_dtype)
}

/// Whether narrow products in `format` take qmatmul_narrow.wgsl rather
/// than the 128-row tiles (see [`narrow_coop`]): the formats of 32-value
/// blocks, whose raw blocks the kernel copies four a row a step, on a
/// device that runs it (`GpuFeatures::narrow`). The K-quants' blocks of
/// 256 values would not fit a subgroup's share of workgroup memory.
pub(crate) fn narrow_kernel(ctx: &Context, format: QuantFormat) -> bool {
    ctx.features().narrow && format.block_elems() == 32
}

/// Rows of x up to which narrow products take qmatmul_narrow.wgsl (two
/// fragments of 16): with three or four, x's slice holds only 128 values
/// of K, and the parts' partial products (16 for K = 2,048) outweigh what
/// the kernel saves; those rows keep the 128-row tiles (not measured on
/// the new kernel).
const NARROW_MAX_M: usize = 32;

/// Bytes of partial products above which a narrow product keeps the
/// 128-row tiles: a large vocabulary's LM head (128,256 columns) would
/// write and sum 33 MB at 16 rows, 131 MB at 32, where a 1B model's
/// largest product (gate and up, 16,384 columns) writes 16 MB at 32.
const NARROW_PARTIAL_BYTES: usize = 16 << 20;

/// The most of K a part of qmatmul_narrow.wgsl walks for `mf` (1 or 2)
/// fragments of 16 rows (its `KA`, 512 or 256): x's slice, 16 mf (KA + 8)
/// halves, fits its 2,112 vec4 slots.
pub(crate) fn narrow_depth(mf: usize) -> usize {
    512 / mf
}

/// Workgroups of qmatmul_narrow.wgsl that a split of K aims for: about 8
/// an SM of a 132-SM GPU.
const NARROW_GROUPS: usize = 1024;

/// qmatmul_narrow.wgsl's grid for `m` rows of x, `n` weight rows and depth
/// `k`: (workgroups along the weight rows, parts of K).
pub(crate) fn narrow_grid(m: usize, n: usize, k: usize) -> (usize, usize) {
    let cols = n.div_ceil(64);
    let steps = k.div_ceil(128);
    // parts of whole steps of 128, each at most narrow_depth deep; more
    // (down to 2 steps a part) while the grid is short of NARROW_GROUPS
    let mut parts = k.div_ceil(narrow_depth(m.div_ceil(16)));
    while cols * parts < NARROW_GROUPS && steps / (parts * 2) >= 2 {
        parts *= 2;
    }
    (cols, parts)
}

/// The launch of a narrow kernel (qmatmul_narrow.wgsl, matmul_narrow.wgsl)
/// for `m` rows of x, `n` weight rows and depth `k`: its grid (columns
/// folded into two dimensions within the adapter's limit, parts of K) and
/// the row pitch of its partial products; `NotSupported` for `op` past
/// the limit.
pub(crate) fn narrow_launch(
    ctx: &Context,
    op: &'static str,
    m: usize,
    n: usize,
    k: usize,
) -> Result<([usize; 3], usize)> {
    let (cols, parts) = narrow_grid(m, n, k);
    let max = ctx.max_groups() as usize;
    let grid = [cols.min(max), cols.div_ceil(max), parts];
    if grid[1] > max || parts > max {
        return Err(Error::NotSupported {
            op,
            reason: format!("grid {grid:?} exceeds the adapter's workgroup limit"),
        });
    }
    Ok((grid, grid[0] * grid[1] * 64))
}

/// Bytes of the partial products of qmatmul_narrow.wgsl for this product:
/// each part's rows padded to whole fragments, its columns to the grid's.
pub(crate) fn narrow_partials(m: usize, n: usize, k: usize) -> usize {
    let (cols, parts) = narrow_grid(m, n, k);
    parts * m.div_ceil(16) * 16 * cols * 64 * 4
}

/// Whether a product of `m` rows of f16 x past the GEMV kernels takes
/// qmatmul_narrow.wgsl: up to [`NARROW_MAX_M`] rows, a format it reads,
/// partial products within [`NARROW_PARTIAL_BYTES`], and no f16 copy of
/// the weights to multiply instead.
pub(crate) fn takes_narrow(
    ctx: &Context,
    format: QuantFormat,
    m: usize,
    weight_rows: usize,
    k: usize,
) -> bool {
    narrow_kernel_fits(ctx, format, m, weight_rows, k)
        && narrow_coop(ctx, format, m, weight_rows, k)
        && !decodes_first(ctx, m, weight_rows, k)
}

/// A product of `m` (up to [`NARROW_MAX_M`]) rows of f16 x on
/// qmatmul_narrow.wgsl, split
/// along K into parts summed by split_sum.wgsl.
#[allow(clippy::too_many_arguments)]
fn narrow_product(
    ctx: &Context,
    format: QuantFormat,
    x: &Tensor,
    w: &Tensor,
    [m, n, k]: [usize; 3],
    row_bytes: usize,
    residual: Option<&Tensor>,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    let mf = m.div_ceil(16);
    let depth = narrow_depth(mf);
    let (grid, pitch) = narrow_launch(ctx, "matmul_q", m, n, k)?;
    let parts = grid[2];
    let header = [
        to_u32(m, "M")?,
        to_u32(n, "N")?,
        to_u32(k, "K")?,
        to_u32(row_bytes, "row bytes")?,
        to_u32(x.layout().offset(), "offset")?,
        to_u32(pitch, "pitch")?,
        0,
        0,
    ];
    let partial = ctx.pool.alloc((parts * mf * 16 * pitch * 4) as u64)?;
    ctx.dispatch(
        &QMATMUL_NARROW,
        &[
            ("FMT", format.gpu_code() as f64),
            ("MF", mf as f64),
            ("KA", depth as f64),
        ],
        bytemuck::cast_slice(&header),
        &[buffer(x), buffer(w)],
        &partial,
        [grid[0] as u32, grid[1] as u32, parts as u32],
    )?;
    sum_parts(
        ctx,
        &partial,
        parts,
        m * n,
        Some((n, pitch)),
        residual,
        out,
        out_dtype,
    )
}

/// The rank of `fusion`'s low-rank update, 0 without one: the last
/// dimension of u, or with `project` the rows of a (the second-to-last
/// input either way).
fn low_rank_rank(fusion: QFusion, inputs: &[&Tensor]) -> usize {
    if !fusion.low_rank {
        return 0;
    }
    let t = inputs[inputs.len() - 2];
    match fusion.project {
        true => t.shape().first().copied().unwrap_or(0),
        false => t.shape().last().copied().unwrap_or(0),
    }
}

/// Elements of u (rows of x in a chunk times the rank) up to which the
/// GEMV kernels compute a low-rank update's u themselves (`LORA_IN`): 4 KiB
/// of workgroup memory.
pub(crate) const LORA_IN_MAX: usize = 1024;

/// Whether a fused product of `m` rows of x with `fusion` on `inputs`
/// (as `Op::QMatmul`'s, then the fusions') can compute its low-rank
/// update's u in the GEMV kernel: always without `project`.
pub(crate) fn projects_in_kernel(fusion: QFusion, inputs: &[&Tensor], m: usize) -> bool {
    !fusion.project || gemv_chunks(m).1 * low_rank_rank(fusion, inputs) <= LORA_IN_MAX
}

/// The GEMV kernel's specialization: rows of x, lanes per weight row,
/// fusions and the residual's dtype.
#[derive(Clone, Copy)]
struct Gemv {
    m: usize,
    rows: usize,
    lanes: usize,
    fusion: QFusion,
    /// The rank of the low-rank update (`LORA`), 0 without one.
    low_rank: usize,
    /// The kernel computes the update's u itself (`LORA_IN`).
    project: bool,
    residual: DType,
    /// qgemv_i8's blocks of x in workgroup memory (`XB`).
    x_blocks: Option<usize>,
    /// qgemv_i8's units of each weight row in flight per lane (`DEPTH`,
    /// see [`integer_depth`]).
    depth: usize,
}

/// The formats qgemv_i8 multiplies: those whose values are whole bytes or
/// nibbles (Q5_K's and Q6_K's with their high bits joined to them) under
/// a scale (and minimum) per group of 32 or 16.
pub(crate) fn integer_format(format: QuantFormat) -> bool {
    matches!(
        format,
        QuantFormat::Q8_0
            | QuantFormat::Q4_0
            | QuantFormat::Q4_1
            | QuantFormat::Q4_K
            | QuantFormat::Q5_K
            | QuantFormat::Q6_K
    )
}

/// Weight rows per lane set of qgemv_i8 for `format`, where the f32 GEMV
/// would take `rows`: at most 2 for Q6_K, whose lanes hold 22 words of
/// each row's next unit besides the current one's (with 4 rows those
/// spill out of registers). Q4_K and Q5_K take 2 in their SwiGLU products
/// (gate and up rows of the same columns) and in rows of up to
/// [`I8_SHORT_K`] values, where 2 are faster; their other products keep 4,
/// as the simple formats do everywhere: there 2 rows are slower. Q5_K
/// follows Q4_K without a model of its own measured. 8 rows (the most the
/// accumulators hold) gain in too few products to be worth a rule
/// (docs/tuning.md, "8-bit GEMV rows by format").
///
/// Several rows of x (`m` > 1) take 2 weight rows in plain products of
/// more than [`GEMV_FEWEST_COLUMNS`] columns and 1 in narrower ones, where
/// the f32 GEMV takes 1 to 4: each unit of a weight row is dotted with m
/// rows of x from workgroup memory, so 1 row loads x's blocks twice as
/// often, and 4 make too few workgroups; on narrow outputs more
/// workgroups win, as with one row of x (docs/tuning.md, "8-bit GEMV for
/// several rows").
fn integer_rows(
    format: QuantFormat,
    m: usize,
    rows: usize,
    swiglu: bool,
    n: usize,
    k: usize,
) -> usize {
    let rows = match m > 1 && !swiglu {
        true if n <= GEMV_FEWEST_COLUMNS => 1,
        true => 2,
        false => rows,
    };
    match format {
        QuantFormat::Q6_K => rows.min(2),
        QuantFormat::Q4_K | QuantFormat::Q5_K if swiglu || k <= I8_SHORT_K => rows.min(2),
        _ => rows,
    }
}

/// Values a weight row holds up to which qgemv_i8's Q4_K/Q5_K lanes take
/// 2 rows in every product (see [`integer_rows`]). A lane then does at
/// most 2 units of each row (with 32 lanes a row); with 4 rows it would
/// hold 4 rows' units of 48 or 80 bytes twice (the current and the next),
/// which presumably keeps fewer workgroups on an SM (not profiled). On
/// longer rows (the down products) 4 rows are faster again, and the
/// simple formats are slower with 2 even on short rows (docs/tuning.md,
/// "8-bit GEMV short rows").
const I8_SHORT_K: usize = 4096;

/// qgemv_i8's two sizes of x's buffer (`XB`, see [`integer_gemv`]), each
/// with the longest row it takes that still counts as short for
/// [`integer_rows`]: the specializations the shader test builds.
#[cfg(test)]
const I8_BUFFERS: [(usize, usize); 2] = [(128, I8_SHORT_K), (512, usize::MAX)];

/// Units of each weight row that a lane of qgemv_i8 has in flight while it
/// works on one (`DEPTH`): 2 for the formats of 32-value blocks (Q4_0,
/// Q4_1, Q8_0) in products of at most [`I8_DEEP_GROUPS`] workgroups, 1
/// otherwise. Few workgroups leave each SM few weight loads in flight
/// with one unit ahead; a second buffer doubles them. Where the workgroups
/// are many (the LM heads, a 7B model's up products), the second buffer's
/// registers cost occupancy instead, and the K formats, whose units are
/// larger, are slower with it even on few workgroups (docs/tuning.md,
/// "Decode GEMV depth").
fn integer_depth(format: QuantFormat, groups: usize) -> usize {
    let simple = matches!(
        format,
        QuantFormat::Q4_0 | QuantFormat::Q4_1 | QuantFormat::Q8_0
    );
    if simple && groups <= I8_DEEP_GROUPS {
        2
    } else {
        1
    }
}

/// Workgroups up to which qgemv_i8 keeps two units in flight (see
/// [`integer_depth`]): about 1.5 an SM of a 132-SM GPU, enough for the
/// 4,096-row products of a 7B model and the 2,048- and 3,072-row ones of
/// a 1B model, but not for the 256 of the 1B up product, which is slower
/// with two (docs/tuning.md, "Decode GEMV depth").
/// tests/quant.rs checks both sides of the bound (2,050 rows, 129
/// workgroups; 6,200 rows, 194): a new bound needs shapes on both sides.
const I8_DEEP_GROUPS: usize = 192;

/// Lanes per weight row of qgemv_i8 (each takes whole blocks).
const I8_LANES: usize = 32;

/// Slots of 256 f32 that the GEMV kernels' final sums take (`SLOTS`): one
/// an accumulator, at least 8 (qgemv.wgsl's norm takes one a row of x).
fn gemv_slots(m: usize, rows: usize) -> usize {
    (m * rows).max(8)
}

/// Workgroup memory of qgemv_i8 besides x's blocks, for `m` rows of x and
/// `rows` weight rows a lane set: the final sums' slots, the norm's 8
/// factors and the sum of squares' slots (rows.wgsl).
fn integer_fixed_bytes(m: usize, rows: usize) -> usize {
    gemv_slots(m, rows) * 256 * 4 + 32 + 256 * 4
}

/// Workgroup memory per block of x in qgemv_i8: 32 quants, scale and sum.
const I8_BLOCK_BYTES: usize = 32 + 8;

/// The blocks of x that qgemv_i8 holds (`XB`) for a product of `m` rows
/// of x with rows of `k` values in `format`, `rows` weight rows a lane
/// set, or `None` where the f32 GEMV takes it: the device allows 8-bit
/// activations (`int8`, see `GpuDevice::int8_activations`), up to
/// [`GEMV_MAX_M`] rows of x (decode, one sequence or a server's step of
/// several), a format of `integer_format`, and the buffer fits the
/// workgroup memory. One row of x: 128 or 512 blocks (K up to 4,096 and
/// to 16,384), so that the small one leaves room for more workgroups and
/// few pipelines are built. Several: the smallest of
/// [`I8_ROWS_BUFFERS`] that holds every row's blocks, or else the largest
/// that fits and holds a slice of [`I8_LANES`] units of each row (x is
/// then rounded a slice at a time).
#[allow(clippy::too_many_arguments)]
fn integer_gemv(
    ctx: &Context,
    int8: bool,
    format: QuantFormat,
    m: usize,
    k: usize,
    rows: usize,
    lora_bytes: usize,
) -> Option<usize> {
    if !int8 || m > GEMV_MAX_M || !integer_format(format) {
        return None;
    }
    let blocks = k / 32;
    let fixed = integer_fixed_bytes(m, rows) + lora_bytes;
    let fits = |xb: usize| fixed + xb * I8_BLOCK_BYTES <= ctx.workgroup_memory() as usize;
    if m == 1 {
        let xb = if blocks <= 128 { 128 } else { 512 };
        return (blocks <= xb && fits(xb)).then_some(xb);
    }
    // blocks of a unit: 1, 2 in the K formats (64 values)
    let unit = if format.block_elems() == 256 { 2 } else { 1 };
    let slice = m * I8_LANES * unit;
    let mut sizes = I8_ROWS_BUFFERS.into_iter();
    sizes
        .clone()
        .find(|&xb| m * blocks <= xb && fits(xb))
        .or_else(|| sizes.rfind(|&xb| slice <= xb && fits(xb)))
}

/// Sizes of qgemv_i8's buffer of x (`XB`, in blocks) for several rows of
/// x: 512 holds a slice of the 32 lanes' units of 8 rows in every format;
/// 256 fits the 32 KiB of workgroup memory of some devices (lavapipe) with
/// 16 slots of final sums (see [`integer_fixed_bytes`]).
const I8_ROWS_BUFFERS: [usize; 3] = [128, 256, 512];

fn constants(
    format: QuantFormat,
    input: DType,
    out: DType,
    gemv: Option<Gemv>,
) -> Vec<(&'static str, f64)> {
    // room for every constant, so that a dispatch allocates once
    let mut c = Vec::with_capacity(16);
    c.extend([
        ("FMT", format.gpu_code() as f64),
        ("IN_DT", input.gpu_code() as f64),
        ("OUT_DT", out.gpu_code() as f64),
    ]);
    if let Some(g) = gemv {
        let rows = g.rows;
        let flag = |on: bool| if on { 1.0 } else { 0.0 };
        c.extend([
            ("M", g.m as f64),
            ("LANES", g.lanes as f64),
            ("R", rows as f64),
            ("OC", output_columns(rows, g.fusion) as f64),
            ("NORM", flag(g.fusion.rms_norm.is_some())),
            ("SWIGLU", flag(g.fusion.gated())),
            ("GELU", flag(g.fusion.geglu)),
            ("RESIDUAL", flag(g.fusion.residual)),
            ("RES_DT", g.residual.gpu_code() as f64),
            ("LORA", g.low_rank as f64),
        ]);
        if g.project {
            c.extend([("LORA_IN", 1.0), ("LORA_U", (g.m * g.low_rank) as f64)]);
        }
        if let Some(xb) = g.x_blocks {
            c.extend([("XB", xb as f64), ("DEPTH", g.depth as f64)]);
        }
        // set only past the default, so that the other products keep
        // their pipelines
        let slots = gemv_slots(g.m, rows);
        if slots > 8 {
            c.push(("SLOTS", slots as f64));
        }
    }
    c
}

#[cfg(test)]
pub(crate) fn specializations() -> Vec<(&'static Kernel, Vec<(&'static str, f64)>)> {
    let mut out = Vec::new();
    for format in QuantFormat::ALL {
        for o in [DType::F32, DType::F16, DType::BF16] {
            for pack in [0.0, 1.0] {
                let c = vec![
                    ("FMT", format.gpu_code() as f64),
                    ("OUT_DT", o.gpu_code() as f64),
                    ("HW_PACK", pack),
                ];
                out.push((&QROWS, c));
            }
        }
        for dt in [DType::F32, DType::F16, DType::BF16] {
            let outs = if dt == DType::F32 {
                vec![dt]
            } else {
                vec![dt, DType::F32]
            };
            for o in outs {
                let gemv = |m, rows, lanes, fusion| {
                    let g = Gemv {
                        m,
                        rows,
                        lanes,
                        fusion,
                        low_rank: if fusion.low_rank { 16 } else { 0 },
                        project: fusion.project,
                        residual: dt,
                        x_blocks: None,
                        depth: 1,
                    };
                    (&QGEMV, constants(format, dt, o, Some(g)))
                };
                // qgemv_i8 with each depth its format takes (one row of x)
                let integer_m = |m, rows, fusion, xb| {
                    let depths = 1..=if m == 1 { integer_depth(format, 0) } else { 1 };
                    depths.map(move |depth| {
                        let g = Gemv {
                            m,
                            rows,
                            lanes: I8_LANES,
                            fusion,
                            low_rank: if fusion.low_rank { 16 } else { 0 },
                            project: fusion.project,
                            residual: dt,
                            x_blocks: Some(xb),
                            depth,
                        };
                        (&QGEMV_I8, constants(format, dt, o, Some(g)))
                    })
                };
                let integer = |rows, fusion, xb| integer_m(1, rows, fusion, xb);
                let rows = |m| gemv_rows(m, usize::MAX, false);
                out.push((&QMATMUL, constants(format, dt, o, None)));
                if dt == DType::F16 {
                    out.push((&QMATMUL_COOP, constants(format, dt, o, None)));
                    if o == DType::F32 && format.block_elems() == 32 {
                        for mf in 1..=NARROW_MAX_M.div_ceil(16) {
                            out.push((
                                &QMATMUL_NARROW,
                                vec![
                                    ("FMT", format.gpu_code() as f64),
                                    ("MF", mf as f64),
                                    ("KA", narrow_depth(mf) as f64),
                                ],
                            ));
                        }
                    }
                }
                if format == QuantFormat::Q4_0 {
                    for res in [0.0, 1.0] {
                        let c = vec![("OUT_DT", o.gpu_code() as f64), ("RES", res)];
                        out.push((&SPLIT_SUM, c));
                    }
                }
                for m in 1..=GEMV_MAX_M {
                    out.push(gemv(m, rows(m), 32, QFusion::NONE));
                }
                for lanes in [64, 128] {
                    out.push(gemv(1, rows(1), lanes, QFusion::NONE));
                }
                // two weight rows per lane set at M = 1 (few output columns),
                // and one (fewer)
                out.push(gemv(
                    1,
                    gemv_rows(1, GEMV_FEW_COLUMNS, false),
                    128,
                    QFusion::NONE,
                ));
                out.push(gemv(
                    1,
                    gemv_rows(1, GEMV_FEWEST_COLUMNS, false),
                    32,
                    QFusion::NONE,
                ));
                // every fusion at decode (one row, four weight rows per
                // lane set) and SwiGLU with two weight rows per lane set;
                // with a low-rank update too for two formats
                let bits = match format {
                    QuantFormat::Q4_0 | QuantFormat::Q4_K => 1..16u32,
                    QuantFormat::Q6_K => 1..8u32,
                    _ => 0..0,
                };
                if integer_format(format) {
                    for (xb, k) in I8_BUFFERS {
                        out.extend(integer(
                            integer_rows(format, 1, rows(1), false, usize::MAX, k),
                            QFusion::NONE,
                            xb,
                        ));
                        out.extend(integer(
                            gemv_rows(1, GEMV_FEW_COLUMNS, false),
                            QFusion::NONE,
                            xb,
                        ));
                        out.extend(integer(
                            gemv_rows(1, GEMV_FEWEST_COLUMNS, false),
                            QFusion::NONE,
                            xb,
                        ));
                    }
                    // several rows of x: each size of x's buffer at 2, 3
                    // and 8 rows of x
                    for m in [2, 3, 8] {
                        for xb in I8_ROWS_BUFFERS {
                            for n in [GEMV_FEWEST_COLUMNS, usize::MAX] {
                                let rows =
                                    integer_rows(format, m, gemv_rows(m, n, false), false, n, 0);
                                out.extend(integer_m(m, rows, QFusion::NONE, xb));
                            }
                        }
                    }
                }
                // GeGLU (Gemma's gate) with the norm, as Gemma decodes
                let geglu = QFusion {
                    rms_norm: Some(1e-5),
                    geglu: true,
                    ..QFusion::NONE
                };
                // (bit 16: the low-rank update's u computed in the kernel)
                let all = bits
                    .clone()
                    .chain(bits.clone().filter(|b| b & 8 != 0).map(|b| b | 16));
                let fusions = all.map(|bits| QFusion {
                    rms_norm: (bits & 1 != 0).then_some(1e-5),
                    swiglu: bits & 2 != 0,
                    geglu: false,
                    residual: bits & 4 != 0,
                    low_rank: bits & 8 != 0,
                    project: bits & 16 != 0,
                });
                let fusions = fusions.chain((!bits.is_empty()).then_some(geglu));
                for fusion in fusions {
                    out.push(gemv(1, rows(1), 32, fusion));
                    if integer_format(format) {
                        for (xb, k) in I8_BUFFERS {
                            let rows =
                                integer_rows(format, 1, rows(1), fusion.gated(), usize::MAX, k);
                            out.extend(integer(rows, fusion, xb));
                        }
                        // several rows of x, as the model's steps take them
                        for m in [2, 8] {
                            let rows = gemv_rows(m, GEMV_FEW_COLUMNS, fusion.gated());
                            let rows =
                                integer_rows(format, m, rows, fusion.gated(), GEMV_FEW_COLUMNS, 0);
                            out.extend(integer_m(m, rows, fusion, 512));
                        }
                    }
                    if fusion.gated() {
                        for m in [3, 8] {
                            out.push(gemv(m, gemv_rows(m, 0, true), 32, fusion));
                        }
                    }
                }
            }
        }
    }
    out
}
