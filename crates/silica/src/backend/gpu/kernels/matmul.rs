//! Launchers of the matmul kernels: tiled for many rows, GEMV-style for few.

use super::elementwise::via_f32;
use super::launch::{buffer, pack, params, to_u32};
// matmul_narrow.wgsl keeps qmatmul_narrow.wgsl's tiles and slice of x,
// so its grid and the depth of its parts are that kernel's
use super::qmatmul::{narrow_depth, narrow_launch, narrow_partials};
use super::{Context, Kernel, KernelNeeds};
use crate::memory::GpuBuffer;
use crate::{DType, Error, Layout, Result, Tensor};

pub(crate) static MATMUL: Kernel = Kernel {
    name: "matmul",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/matmul_common.wgsl"),
        include_str!("shared/store4.wgsl"),
        include_str!("matmul.wgsl")
    ),
    inputs: 2,
    trusted: false,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};

pub(crate) static MATMUL_BIG: Kernel = Kernel {
    name: "matmul_big",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/matmul_common.wgsl"),
        include_str!("shared/store4.wgsl"),
        include_str!("matmul_big.wgsl")
    ),
    inputs: 2,
    trusted: true,
    outputs: 1,
    immediates: false,
    needs: KernelNeeds::NOTHING,
};

/// matmul_coop.wgsl's source on the fragments of `$frag` (coop16.wgsl or
/// coop8.wgsl).
macro_rules! staged_coop_source {
    ($frag:literal) => {
        concat!(
            "enable f16;\nenable wgpu_cooperative_matrix;\n",
            include_str!($frag),
            include_str!("shared/common.wgsl"),
            include_str!("shared/matmul_common.wgsl"),
            include_str!("shared/store4.wgsl"),
            include_str!("matmul_coop.wgsl"),
            include_str!("shared/coop_store.wgsl")
        )
    };
}

pub(crate) static MATMUL_COOP: Kernel = Kernel {
    name: "matmul_coop",
    source: staged_coop_source!("shared/coop16.wgsl"),
    inputs: 2,
    trusted: true,
    outputs: 1,
    immediates: false,
    needs: KernelNeeds::COOP16,
};

/// matmul_coop.wgsl on the 8x8 fragments of Apple GPUs.
pub(crate) static MATMUL_COOP8: Kernel = Kernel {
    name: "matmul_coop8",
    source: staged_coop_source!("shared/coop8.wgsl"),
    inputs: 2,
    trusted: true,
    outputs: 1,
    immediates: false,
    needs: KernelNeeds::COOP8,
};

/// matmul_coop_vec.wgsl's source on the loop of `$tiles` (coop_tiles.wgsl
/// or coop_wide.wgsl).
macro_rules! vec_coop_source {
    ($tiles:literal) => {
        concat!(
            "enable f16;\nenable wgpu_cooperative_matrix;\n",
            include_str!("shared/coop16.wgsl"),
            include_str!("shared/common.wgsl"),
            include_str!("shared/matmul_common.wgsl"),
            include_str!("shared/store4.wgsl"),
            include_str!("shared/halves8.wgsl"),
            include_str!("shared/matmul_coop_vec.wgsl"),
            include_str!($tiles),
            include_str!("shared/coop_frags.wgsl"),
            include_str!("shared/coop_store.wgsl")
        )
    };
}

pub(crate) static MATMUL_COOP_VEC: Kernel = Kernel {
    name: "matmul_coop_vec",
    source: vec_coop_source!("coop_tiles.wgsl"),
    inputs: 2,
    trusted: true,
    outputs: 1,
    immediates: false,
    needs: KernelNeeds::COOP16,
};

/// matmul_coop_vec.wgsl on tiles of 128x256 (coop_wide.wgsl).
pub(crate) static MATMUL_COOP_WIDE: Kernel = Kernel {
    name: "matmul_coop_wide",
    source: vec_coop_source!("coop_wide.wgsl"),
    inputs: 2,
    trusted: true,
    outputs: 1,
    immediates: false,
    needs: KernelNeeds::COOP16,
};

/// matmul_narrow.wgsl: f16 products of up to 32 rows on 16 weight rows a
/// subgroup, each walking its part of K on its own.
pub(crate) static MATMUL_NARROW: Kernel = Kernel {
    name: "matmul_narrow",
    source: concat!(
        "enable f16;\nenable wgpu_cooperative_matrix;\n",
        include_str!("shared/coop16.wgsl"),
        include_str!("shared/common.wgsl"),
        include_str!("shared/halves8.wgsl"),
        include_str!("matmul_narrow.wgsl")
    ),
    inputs: 2,
    trusted: true,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::COOP16,
};

pub(crate) static GEMV: Kernel = Kernel {
    name: "gemv",
    source: concat!(
        include_str!("shared/common.wgsl"),
        include_str!("shared/matmul_common.wgsl"),
        include_str!("gemv.wgsl"),
        include_str!("shared/gemv_finish.wgsl")
    ),
    inputs: 2,
    trusted: true,
    outputs: 1,
    immediates: true,
    needs: KernelNeeds::NOTHING,
};

/// Rows of `a` up to which the GEMV kernel is used.
const GEMV_MAX_M: usize = 8;
/// Threads per output column of the GEMV kernel: 32, or 64 and 128 when
/// the columns are too few to keep about half a million threads busy and
/// each row long enough that every thread still reads 8 vec4 words.
fn gemv_lanes(n: usize, k: usize, dt: DType) -> usize {
    let words = k / if dt == DType::F32 { 4 } else { 8 };
    let mut lanes = 32;
    while lanes < 128 && n * lanes < 1 << 19 && words >= lanes * 16 {
        lanes *= 2;
    }
    lanes
}
/// Workgroups of 128x128 from which the large tile is used: with its steps
/// written out, matmul_big.wgsl beats the 64x64 kernel even on grids that
/// leave most of a large GPU's SMs idle, down to the smallest measured (20
/// workgroups). Smaller grids keep the 64x64 tiles, which waste less past
/// the edges of small products (docs/tuning.md, "Large-tile threshold").
const BIG_MIN_GROUPS: usize = 16;
/// Workgroup memory of the kernels on coop_tiles.wgsl, in bytes.
const COOP_TILES_MEMORY: u32 = 49_152;
/// Workgroups of 128x256 from which the f16 matmul takes coop_wide.wgsl's
/// tiles rather than coop_tiles.wgsl's 128x128: with fewer, a large GPU's
/// SMs (one such workgroup each) are not all busy twice over, and the
/// twice as many 128x128 tiles are faster (docs/tuning.md,
/// "Cooperative-matrix tile shapes").
const WIDE_MIN_GROUPS: usize = 256;

/// Columns from which an f16 product of more than 8 rows takes
/// matmul_coop_vec.wgsl (tiles of 128 columns) rather than the f32 tiles
/// of matmul.wgsl and matmul_big.wgsl: a LoRA adapter's projection of a
/// 1,702-token prompt (N the rank, 8 to 48) took 139 µs there, about 22
/// on tensor cores (docs/tuning.md, "LoRA at prefill"), and a 1B model's
/// products of 16 rows a quarter of matmul_big's time ("Decoded weights
/// kept"). Below 8 columns a row of b is under 16 bytes.
const VEC_COOP_MIN_N: usize = 8;

/// The grid of a tiled matmul kernel (not the staged `matmul_coop` ones,
/// whose tile depends on the adapter) over an `m` x `n` product: one
/// workgroup per tile of 64x64 (`matmul`), 128 rows by 256 columns
/// (`matmul_coop_wide`) or 128x128 (the others).
fn tile_grid(kernel: &Kernel, m: usize, n: usize, batches: usize) -> [usize; 3] {
    let (rows, cols) = match kernel.name {
        "matmul" => (64, 64),
        "matmul_coop_wide" => (128, 256),
        _ => (128, 128),
    };
    [n.div_ceil(cols), m.div_ceil(rows), batches]
}

/// Whether the adapter runs the kernels on coop_tiles.wgsl: 16x16 f16
/// cooperative matrices and the workgroup memory for their tiles.
pub(crate) fn coop_tiles(ctx: &Context) -> bool {
    ctx.coop16() && ctx.workgroup_memory() >= COOP_TILES_MEMORY
}

/// Whether matmul_coop_vec.wgsl can read the operands 8 halves at a time:
/// a contiguous along k and b along k or n, row starts on 16 bytes (`acc`
/// for 8-half words), K a multiple of 8, and N a multiple of 8 when b is
/// read along n; and whether the adapter runs it.
fn vec_coop(ctx: &Context, acc: &Access, n: usize, k: usize) -> bool {
    acc.a_vec
        && (acc.b_mode == 1 || (acc.b_mode == 2 && n.is_multiple_of(8)))
        && k.is_multiple_of(8)
        && coop_tiles(ctx)
}

/// The staged cooperative-matrix kernel (matmul_coop.wgsl) an adapter runs,
/// and its workgroup tile.
#[derive(Clone, Copy)]
struct StagedCoop {
    kernel: &'static Kernel,
    /// Subgroups of 32 per workgroup (the SG constant).
    sg: u32,
    tm: usize,
    tn: usize,
}

/// matmul_coop.wgsl for f16 operands where the adapter has cooperative
/// matrices: 16x16 fragments in 8 subgroups (128x128 tiles), or Apple's
/// 8x8 in 4 (64x32, the shape of llama.cpp's Metal kernel). `sg4` asks for
/// the 16x16 kernel in 4 subgroups (128x64), a test hook that runs the
/// Apple arrangement of subgroups on the fragments NVIDIA has.
fn staged_coop(ctx: &Context, dt: DType, sg4: bool) -> Option<StagedCoop> {
    if dt != DType::F16 {
        None
    } else if ctx.coop16() {
        let sg = if sg4 { 4 } else { 8 };
        Some(StagedCoop {
            kernel: &MATMUL_COOP,
            sg,
            tm: 128,
            tn: 16 * sg as usize,
        })
    } else if ctx.coop8() {
        Some(StagedCoop {
            kernel: &MATMUL_COOP8,
            sg: 4,
            tm: 64,
            tn: 32,
        })
    } else {
        None
    }
}

/// Which operand-loading path a launch can take, from the layouts.
struct Access {
    /// a is contiguous along k, every row start a multiple of `align`.
    a_vec: bool,
    /// 1: b contiguous along k; 2: contiguous along n; 0: any strides.
    b_mode: u32,
}

/// Whether every start offset of a strided view, `off + i * stride + batch
/// offsets`, is a multiple of `align` elements.
fn aligned(off: usize, mut strides: impl Iterator<Item = usize>, align: usize) -> bool {
    off.is_multiple_of(align) && strides.all(|s| s.is_multiple_of(align))
}

fn access(a: &Layout, b: &Layout, batch: &[Layout], align: usize) -> Access {
    let r = a.rank();
    let (sa_m, sa_k) = (a.strides()[r - 2], a.strides()[r - 1]);
    let (sb_k, sb_n) = (b.strides()[r - 2], b.strides()[r - 1]);
    let with_batch =
        |s: usize, i: usize| std::iter::once(s).chain(batch[i].strides().iter().copied());
    let a_vec = sa_k == 1 && aligned(a.offset(), with_batch(sa_m, 0), align);
    let b_mode = if sb_k == 1 && aligned(b.offset(), with_batch(sb_n, 1), align) {
        1
    } else if sb_n == 1 && aligned(b.offset(), with_batch(sb_k, 1), align) {
        2
    } else {
        0
    };
    Access { a_vec, b_mode }
}

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
    matmul_plus(ctx, a, b, out_shape, None, out, out_dtype)
}

/// `a @ b + residual` (`residual` contiguous, of the output's shape and
/// dtype, where given): the split products add it as they sum their
/// parts, the others after the product.
pub(crate) fn matmul_plus(
    ctx: &Context,
    a: &Tensor,
    b: &Tensor,
    out_shape: &[usize],
    residual: Option<&Tensor>,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    let r = out_shape.len();
    let (m, n, k) = (out_shape[r - 2], out_shape[r - 1], a.shape()[r - 1]);
    let batches: usize = out_shape[..r - 2].iter().product();
    let batch = batch_views(a.layout(), b.layout());
    let dt = a.dtype();
    // elements per vec4 word of the vector paths
    let word = if dt == DType::F32 { 4 } else { 8 };
    let acc = access(a.layout(), b.layout(), &batch, word);
    let lanes = gemv_lanes(n, k, dt);
    let big_groups = tile_grid(&MATMUL_BIG, m, n, batches)
        .iter()
        .product::<usize>();
    let wide_groups = tile_grid(&MATMUL_COOP_WIDE, m, n, batches)
        .iter()
        .product::<usize>();
    let forced = *ctx.forced_matmul.lock().unwrap_or_else(|e| e.into_inner());
    let staged = staged_coop(ctx, dt, forced == Some("matmul_coop_sg4"));
    let vec = staged.is_some() && vec_coop(ctx, &acc, n, k);
    let tiles = n.div_ceil(128) * m.div_ceil(128);
    let narrow = batches == 1 && narrow_fits(ctx, &acc, dt, m, n, k);
    let chosen = forced.is_none() && (NARROW_MIN_M..=NARROW_AUTO_MAX_M).contains(&m);
    if narrow && (forced == Some("matmul_narrow") || chosen) {
        return narrow_product(ctx, a, b, [m, n, k], residual, out, out_dtype);
    }
    if forced.is_none() && batches == 1 && vec && n >= VEC_COOP_MIN_N && tiles <= SPLIT_TILES {
        let mut parts = super::qmatmul::coop_splits(tiles, k, ctx.features().split_k as usize);
        while parts > 1 && !k.is_multiple_of(parts * 8) {
            parts /= 2;
        }
        if parts > 1 {
            return split_k(ctx, a, b, [m, n, k], parts, residual, out, out_dtype);
        }
    }
    if residual.is_some() {
        return super::qmatmul::plus_residual(ctx, residual, out_shape, out, out_dtype, |out| {
            matmul_plus(ctx, a, b, out_shape, None, out, out_dtype)
        });
    }
    let (kernel, grid) = if let Some(name) = forced.filter(|&f| match f {
        "matmul_coop" | "matmul_coop_sg4" => staged.is_some(),
        "matmul_coop_vec" | "matmul_coop_wide" => vec,
        // taken above where the product fits it
        "matmul_narrow" => false,
        "gemv" => m <= GEMV_MAX_M,
        _ => true,
    }) {
        if let (Some(s), "matmul_coop" | "matmul_coop_sg4") = (staged, name) {
            (s.kernel, [n.div_ceil(s.tn), m.div_ceil(s.tm), batches])
        } else {
            let kernel = [
                &MATMUL,
                &MATMUL_BIG,
                &MATMUL_COOP_VEC,
                &MATMUL_COOP_WIDE,
                &GEMV,
            ]
            .into_iter()
            .find(|k| k.name == name)
            .unwrap_or(&MATMUL);
            if kernel.name == "gemv" {
                (kernel, [n.div_ceil(256 / lanes), 1, batches])
            } else {
                (kernel, tile_grid(kernel, m, n, batches))
            }
        }
    } else if m <= GEMV_MAX_M {
        (&GEMV, [n.div_ceil(256 / lanes), 1, batches])
    } else if vec && wide_groups >= WIDE_MIN_GROUPS {
        let kernel = &MATMUL_COOP_WIDE;
        (kernel, tile_grid(kernel, m, n, batches))
    } else if vec && n >= VEC_COOP_MIN_N {
        let kernel = &MATMUL_COOP_VEC;
        (kernel, tile_grid(kernel, m, n, batches))
    } else if let Some(s) = staged.filter(|_| m >= 64 && n >= 64) {
        (s.kernel, [n.div_ceil(s.tn), m.div_ceil(s.tm), batches])
    } else if big_groups >= BIG_MIN_GROUPS {
        (&MATMUL_BIG, tile_grid(&MATMUL_BIG, m, n, batches))
    } else {
        (&MATMUL, tile_grid(&MATMUL, m, n, batches))
    };
    if grid.iter().any(|&g| g > ctx.max_groups() as usize) {
        return Err(Error::NotSupported {
            op: "matmul",
            reason: format!("grid {grid:?} exceeds the adapter's workgroup limit"),
        });
    }
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
            &constants(
                kernel,
                a.dtype(),
                dt,
                m,
                &acc,
                lanes,
                staged.map_or(8, |s| s.sg),
            ),
            &bytes,
            &[buffer(a), buffer(b)],
            dst,
            [grid[0] as u32, grid[1] as u32, grid[2] as u32],
        )
    })
}

/// Rows of f16 x from which a product takes matmul_narrow.wgsl (up to
/// [`NARROW_AUTO_MAX_M`]); fewer take the GEMV kernel.
const NARROW_MIN_M: usize = GEMV_MAX_M + 1;

/// Rows of f16 x up to which a product takes matmul_narrow.wgsl by
/// itself: one fragment of 16. At 32 rows (two fragments, K in parts of
/// 256) a 1B model's pooled step of 32 sequences lost 18% against
/// `matmul_coop_vec`, which stays the choice there (docs/tuning.md,
/// "Narrow f16 products").
const NARROW_AUTO_MAX_M: usize = 16;

/// Rows of x up to which matmul_narrow.wgsl runs (two fragments of 16;
/// past [`NARROW_AUTO_MAX_M`] only where the kernel is forced).
const NARROW_MAX_M: usize = 32;

/// Bytes of partial products above which a narrow product keeps the
/// 128-row tiles: a 1B model's gate and up (16,384 columns) write 16.8 MB
/// at 32 rows, a large vocabulary's LM head (128,256) 131 MB.
const NARROW_PARTIAL_BYTES: usize = 32 << 20;

/// Whether matmul_narrow.wgsl can take an f16 product of `m` rows: a read
/// along k with rows on 16 bytes, b read along k (a weight `[n, k]`
/// transposed), K a multiple of 8, at most [`NARROW_MAX_M`] rows, partial
/// products within [`NARROW_PARTIAL_BYTES`], on an adapter that runs the
/// narrow kernels (`GpuFeatures::narrow`) with the workgroup memory.
fn narrow_fits(ctx: &Context, acc: &Access, dt: DType, m: usize, n: usize, k: usize) -> bool {
    dt == DType::F16
        && acc.a_vec
        && acc.b_mode == 1
        && (1..=NARROW_MAX_M).contains(&m)
        && n > 0
        && k > 0
        && k.is_multiple_of(8)
        && ctx.features().narrow
        && ctx.workgroup_memory() >= NARROW_MEMORY
        && narrow_partials(m, n, k) <= NARROW_PARTIAL_BYTES
}

/// Workgroup memory of matmul_narrow.wgsl, in bytes.
const NARROW_MEMORY: u32 = 34_304;

/// `a @ b` of one batch `[m, k] @ [k, n]` (b a weight `[n, k]` transposed)
/// on matmul_narrow.wgsl, split along K into parts summed by
/// split_sum.wgsl.
fn narrow_product(
    ctx: &Context,
    a: &Tensor,
    b: &Tensor,
    [m, n, k]: [usize; 3],
    residual: Option<&Tensor>,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    let mf = m.div_ceil(16);
    let (grid, pitch) = narrow_launch(ctx, "matmul", m, n, k)?;
    let parts = grid[2];
    let (la, lb) = (a.layout(), b.layout());
    let r = la.rank();
    let header = [
        to_u32(m, "M")?,
        to_u32(n, "N")?,
        to_u32(k, "K")?,
        to_u32(la.strides()[r - 2], "stride")?,
        to_u32(lb.strides()[r - 1], "stride")?,
        to_u32(la.offset(), "offset")?,
        to_u32(lb.offset(), "offset")?,
        to_u32(pitch, "pitch")?,
    ];
    let partial = ctx.pool.alloc((parts * mf * 16 * pitch * 4) as u64)?;
    ctx.dispatch(
        &MATMUL_NARROW,
        &[("MF", mf as f64), ("KA", narrow_depth(mf) as f64)],
        bytemuck::cast_slice(&header),
        &[buffer(a), buffer(b)],
        &partial,
        [grid[0] as u32, grid[1] as u32, parts as u32],
    )?;
    super::qmatmul::sum_parts(
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

/// Tiles of 128x128 up to which an f16 product on the tensor-core kernels
/// is split along K (each part a batch, then summed): a 1B model's 64-tile
/// products gain from 4 parts at 512 rows, and its 16-tile ones (2,048
/// columns) from 8 at 16 rows, while 96 tiles in 2 parts and 128 lost
/// (docs/tuning.md, "Weights decoded for long prompts").
const SPLIT_TILES: usize = 64;

/// `a @ b` of one batch `[m, k] @ [k, n]` (leading dimensions of size one
/// aside) in `parts` parts of K, each part a batch of the f16 kernels into
/// an f32 scratch, summed into `out` by split_sum.wgsl.
#[allow(clippy::too_many_arguments)]
fn split_k(
    ctx: &Context,
    a: &Tensor,
    b: &Tensor,
    [m, n, k]: [usize; 3],
    parts: usize,
    residual: Option<&Tensor>,
    out: &GpuBuffer,
    out_dtype: DType,
) -> Result<()> {
    let kp = k / parts;
    let (la, lb) = (a.layout(), b.layout());
    let r = la.rank();
    let (sa, sb) = (&la.strides()[r - 2..], &lb.strides()[r - 2..]);
    let a = a.view(Layout::new(
        vec![parts, m, kp],
        vec![kp * sa[1], sa[0], sa[1]],
        la.offset(),
    ));
    let b = b.view(Layout::new(
        vec![parts, kp, n],
        vec![kp * sb[0], sb[0], sb[1]],
        lb.offset(),
    ));
    let partial = ctx.pool.alloc((parts * m * n * 4) as u64)?;
    matmul(ctx, &a, &b, &[parts, m, n], &partial, DType::F32)?;
    super::qmatmul::sum_parts(ctx, &partial, parts, m * n, None, residual, out, out_dtype)
}

/// The specialization constants of a launch: dtypes, the loading paths, and
/// for GEMV the row count.
fn constants(
    kernel: &Kernel,
    input: DType,
    out: DType,
    m: usize,
    acc: &Access,
    lanes: usize,
    sg: u32,
) -> Vec<(&'static str, f64)> {
    let mut c = vec![("OUT_DT", out.gpu_code() as f64)];
    let vec = std::ptr::eq(kernel, &MATMUL_COOP_VEC) || std::ptr::eq(kernel, &MATMUL_COOP_WIDE);
    let staged = std::ptr::eq(kernel, &MATMUL_COOP) || std::ptr::eq(kernel, &MATMUL_COOP8);
    let coop = staged || vec;
    if !coop {
        c.push(("IN_DT", input.gpu_code() as f64));
    }
    if std::ptr::eq(kernel, &GEMV) {
        c.push(("M", m as f64));
        let vec = acc.a_vec && acc.b_mode == 1;
        c.push(("VEC", vec as u8 as f64));
        c.push(("LANES", lanes as f64));
    }
    if std::ptr::eq(kernel, &MATMUL_BIG) || staged {
        c.push(("A_VEC", acc.a_vec as u8 as f64));
    }
    if staged {
        c.push(("SG", sg as f64));
    }
    if std::ptr::eq(kernel, &MATMUL_BIG) || coop {
        c.push(("B_MODE", acc.b_mode as f64));
    }
    c
}

#[cfg(test)]
pub(crate) fn specializations() -> Vec<(&'static Kernel, Vec<(&'static str, f64)>)> {
    let mut out = Vec::new();
    for dt in [0.0, 1.0, 2.0] {
        for o in [dt, 0.0] {
            out.push((&MATMUL, vec![("IN_DT", dt), ("OUT_DT", o)]));
            for a_vec in [0.0, 1.0] {
                for b_mode in [0.0, 1.0, 2.0] {
                    let v = vec![
                        ("IN_DT", dt),
                        ("OUT_DT", o),
                        ("A_VEC", a_vec),
                        ("B_MODE", b_mode),
                    ];
                    out.push((&MATMUL_BIG, v));
                    if dt == 1.0 {
                        for (kernel, sg) in [
                            (&MATMUL_COOP, 8.0),
                            (&MATMUL_COOP, 4.0),
                            (&MATMUL_COOP8, 4.0),
                        ] {
                            let v = vec![
                                ("OUT_DT", o),
                                ("A_VEC", a_vec),
                                ("B_MODE", b_mode),
                                ("SG", sg),
                            ];
                            out.push((kernel, v));
                        }
                        if a_vec == 1.0 && b_mode != 0.0 {
                            let v = vec![("OUT_DT", o), ("B_MODE", b_mode)];
                            out.push((&MATMUL_COOP_VEC, v.clone()));
                            out.push((&MATMUL_COOP_WIDE, v));
                        }
                    }
                }
            }
            if dt == 1.0 && o == 0.0 {
                for mf in 1..=NARROW_MAX_M.div_ceil(16) {
                    let v = vec![("MF", mf as f64), ("KA", narrow_depth(mf) as f64)];
                    out.push((&MATMUL_NARROW, v));
                }
            }
            for m in 1..=GEMV_MAX_M {
                for vec in [0.0, 1.0] {
                    for lanes in [32.0, 64.0, 128.0] {
                        let v = vec![
                            ("IN_DT", dt),
                            ("OUT_DT", o),
                            ("M", m as f64),
                            ("VEC", vec),
                            ("LANES", lanes),
                        ];
                        out.push((&GEMV, v));
                    }
                }
            }
        }
    }
    out
}
