//! The ops every backend implements, and the `Tensor` methods that check
//! their arguments and dispatch them.
//!
//! An op is a small value ([`Op`]) that names its kernel and carries its
//! parameters; the CPU scalar function of each elementwise op sits beside its
//! definition so that adding an op touches few places.

mod binary;
mod index;
mod matmul;
mod nn;
mod reduce;
mod unary;

pub use binary::{BinaryOp, CmpOp};
pub use nn::{AttentionOpts, CacheSeq, CacheSeqs, CachedAttentionOpts, RopeStyle};
pub use reduce::ReduceOp;
pub use unary::UnaryOp;

use crate::{DType, QuantFormat};

/// What a quantized product fuses around `x @ wᵀ` (see
/// [`crate::Tensor::matmul_q_fused`]): an RMSNorm of the rows of `x`
/// before, and SwiGLU over the two halves of the columns and a residual add
/// after.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QFusion {
    /// RMSNorm of `x` with this epsilon (and the op's third input as the
    /// weight).
    pub rms_norm: Option<f32>,
    /// `silu(y[.., :n]) * y[.., n:]` of the product `y [.., 2n]`.
    pub swiglu: bool,
    /// `gelu_tanh(y[.., :n]) * y[.., n:]` (GeGLU) instead; not with
    /// `swiglu`.
    pub geglu: bool,
    /// The op's residual input (after the norm weight) added to the result.
    pub residual: bool,
    /// A low-rank update `u @ b` added to the product before the SwiGLU:
    /// the op's last two inputs, `u [.., r]` (f32) and `b [r, rows of w]`.
    pub low_rank: bool,
    /// With `low_rank`: the op's input is `a [r, k]` (x's dtype) instead
    /// of u, and u is `project_low_rank(x, a)` (normed with `rms_norm`'s
    /// epsilon where it is set), computed by the op.
    pub project: bool,
}

impl QFusion {
    /// Nothing fused: the plain product.
    pub const NONE: QFusion = QFusion {
        rms_norm: None,
        swiglu: false,
        geglu: false,
        residual: false,
        low_rank: false,
        project: false,
    };

    /// Only the residual added.
    pub const RESIDUAL: QFusion = QFusion {
        residual: true,
        ..QFusion::NONE
    };

    /// Whether the product is gated (SwiGLU or GeGLU): `w` holds gate and
    /// up stacked, and the result has half its rows.
    pub fn gated(&self) -> bool {
        self.swiglu || self.geglu
    }

    pub fn is_none(&self) -> bool {
        *self == Self::NONE
    }

    /// The name of the product with these fusions, as fallback reports
    /// and errors give it.
    pub fn name(&self) -> &'static str {
        const NAMES: [&str; 16] = [
            "matmul_q",
            "rms_norm+matmul_q",
            "matmul_q+swiglu",
            "rms_norm+matmul_q+swiglu",
            "matmul_q+add",
            "rms_norm+matmul_q+add",
            "matmul_q+swiglu+add",
            "rms_norm+matmul_q+swiglu+add",
            "matmul_q+low_rank",
            "rms_norm+matmul_q+low_rank",
            "matmul_q+low_rank+swiglu",
            "rms_norm+matmul_q+low_rank+swiglu",
            "matmul_q+low_rank+add",
            "rms_norm+matmul_q+low_rank+add",
            "matmul_q+low_rank+swiglu+add",
            "rms_norm+matmul_q+low_rank+swiglu+add",
        ];
        const GEGLU: [&str; 8] = [
            "matmul_q+geglu",
            "rms_norm+matmul_q+geglu",
            "matmul_q+geglu+add",
            "rms_norm+matmul_q+geglu+add",
            "matmul_q+low_rank+geglu",
            "rms_norm+matmul_q+low_rank+geglu",
            "matmul_q+low_rank+geglu+add",
            "rms_norm+matmul_q+low_rank+geglu+add",
        ];
        let norm = self.rms_norm.is_some() as usize;
        if self.geglu {
            return GEGLU[norm | (self.residual as usize) << 1 | (self.low_rank as usize) << 2];
        }
        let i = norm
            | (self.swiglu as usize) << 1
            | (self.residual as usize) << 2
            | (self.low_rank as usize) << 3;
        NAMES[i]
    }
}

/// One operation as the backends see it. Shapes are already checked and
/// broadcast by the `Tensor` method; outputs are always new contiguous tensors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// `f(x)` elementwise.
    Unary(UnaryOp),
    /// `f(a, b)` elementwise; both inputs already have the output's shape
    /// (broadcast dimensions have stride 0).
    Binary(BinaryOp),
    /// `f(a, scalar)` elementwise.
    BinaryScalar(BinaryOp, f32),
    /// `a <cmp> b` elementwise, producing a `U32` mask of 0s and 1s.
    Compare(CmpOp),
    /// `cond != 0 ? a : b` elementwise over three inputs of one shape.
    Where,
    /// Reduction of the last dimension of the input.
    Reduce(ReduceOp),
    /// Softmax (or log-softmax) over the last dimension.
    Softmax { log: bool },
    /// `a [.., M, K] @ b [.., K, N]`, batch dimensions already broadcast.
    Matmul,
    /// `x [.., K] @ wᵀ` for a quantized `w [N, K]`; inputs `[x, w]`, `x`
    /// contiguous from a multiple of 8 elements, `w` the blocks as a flat
    /// `U32` tensor (see [`crate::QTensor`]; on the CPU, `[tiles, words]`
    /// for blocks in tiles of 16 rows, `backend::cpu::packed`). Its fusions with a norm,
    /// SwiGLU and a residual are a custom op (`Tensor::matmul_q_fused`).
    QMatmul { format: QuantFormat },
    /// Rows of a quantized matrix with rows of `k` values, decoded; inputs
    /// `[ids, w]`, `ids` contiguous `U32`, `w` the blocks as for `QMatmul`.
    QRows { format: QuantFormat, k: usize },
    /// Conversion to the output dtype.
    Cast,
    /// A contiguous copy of a strided view (bitwise, any dtype).
    Copy,
    /// Concatenation of all inputs along `axis`.
    Cat { axis: usize },
    /// `out = src.index_select(axis, indices)`; inputs are `[src, indices]`.
    IndexSelect { axis: usize },
    /// RMSNorm of the last dimension; inputs `[x, weight]`.
    RmsNorm { eps: f32 },
    /// LayerNorm of the last dimension; inputs `[x, weight, bias]`.
    LayerNorm { eps: f32 },
    /// Rotary embeddings; inputs `[x [.., T, H, D], cos [T, D/2], sin [T, D/2]]`.
    /// Heads from `rotated` on are copied unchanged.
    Rope { style: RopeStyle, rotated: usize },
    /// Attention; inputs `[q, k, v]` or `[q, k, v, mask]`, all rank 4
    /// (`[B, T, heads, D]`, the mask broadcast to `[B, H, Tq, Tk]`).
    Attention { scale: f32, causal: bool },
}

impl Op {
    /// The name used in fallback reports, errors and the `--ops` table.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::BinaryScalar(b, _) => b.scalar_name(),
            Op::Compare(c) => c.name(),
            Op::Where => "where",
            Op::Reduce(r) => r.name(),
            Op::Softmax { log: false } => "softmax",
            Op::Softmax { log: true } => "log_softmax",
            Op::Matmul => "matmul",
            Op::QMatmul { .. } => "matmul_q",
            Op::QRows { .. } => "embedding_q",
            Op::Cast => "to_dtype",
            Op::Copy => "contiguous",
            Op::Cat { .. } => "cat",
            Op::IndexSelect { .. } => "index_select",
            Op::RmsNorm { .. } => "rms_norm",
            Op::LayerNorm { .. } => "layer_norm",
            Op::Rope { .. } => "rope",
            Op::Attention { .. } => "attention",
        }
    }

    /// One representative of every op, for reports and tests.
    pub fn catalogue() -> Vec<Op> {
        let mut ops: Vec<Op> = UnaryOp::ALL.iter().map(|&u| Op::Unary(u)).collect();
        ops.extend(BinaryOp::ALL.iter().map(|&b| Op::Binary(b)));
        ops.extend(BinaryOp::ALL.iter().map(|&b| Op::BinaryScalar(b, 1.0)));
        ops.extend(CmpOp::ALL.iter().map(|&c| Op::Compare(c)));
        ops.push(Op::Where);
        ops.extend(ReduceOp::ALL.iter().map(|&r| Op::Reduce(r)));
        ops.push(Op::Softmax { log: false });
        ops.push(Op::Softmax { log: true });
        ops.push(Op::Matmul);
        ops.push(Op::QMatmul {
            format: QuantFormat::Q4_0,
        });
        ops.push(Op::QRows {
            format: QuantFormat::Q4_0,
            k: 32,
        });
        ops.push(Op::Cast);
        ops.push(Op::Copy);
        ops.push(Op::Cat { axis: 0 });
        ops.push(Op::IndexSelect { axis: 0 });
        ops.push(Op::RmsNorm { eps: 1e-6 });
        ops.push(Op::LayerNorm { eps: 1e-12 });
        ops.push(Op::Rope {
            style: RopeStyle::Adjacent,
            rotated: usize::MAX,
        });
        ops.push(Op::Attention {
            scale: 1.0,
            causal: true,
        });
        ops
    }

    /// Whether the op is defined for inputs of `dtype` at all (on any device).
    pub fn accepts(&self, dtype: DType) -> bool {
        match self {
            Op::Cast | Op::Copy | Op::Cat { .. } | Op::IndexSelect { .. } | Op::Where => true,
            Op::QRows { .. } => dtype == DType::U32,
            _ => dtype.is_float(),
        }
    }
}
