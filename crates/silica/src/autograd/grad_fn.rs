//! The backward formula of every differentiable op: how the gradient of an
//! op's result becomes the gradients of its inputs, written with tensor ops.

use crate::{DType, Result, Tensor, UnaryOp};

/// What an op's backward needs, saved when the op ran. Tensors are saved by
/// value (cheap handles), so a parameter updated after the forward pass does
/// not change the gradient of the graph built before.
pub(super) enum GradFn {
    /// `a + b` with broadcasting.
    Add { a: Vec<usize>, b: Vec<usize> },
    /// `a - b` with broadcasting.
    Sub { a: Vec<usize>, b: Vec<usize> },
    /// `a * b` with broadcasting.
    Mul { a: Tensor, b: Tensor },
    /// `a / b` with broadcasting (the result is the node's value).
    Div { a: Vec<usize>, b: Tensor },
    /// `x + s` or `x - s`.
    Shift,
    /// `x * s`.
    Scale(f32),
    /// `x / s`.
    DivScalar(f32),
    /// `x ^ p`.
    PowScalar { x: Tensor, p: f32 },
    /// `f(x)` elementwise (the result is the node's value).
    Unary { op: UnaryOp, x: Tensor },
    /// `a @ b` as `Tensor::matmul` defines it.
    Matmul { a: Tensor, b: Tensor },
    /// Sum (or mean, `scale` = 1/n) over `dim` of an input of `shape`.
    Reduce {
        shape: Vec<usize>,
        dim: usize,
        keepdim: bool,
        scale: Option<f32>,
    },
    /// Softmax over `dim` (the result is the node's value).
    Softmax { dim: isize },
    /// Log-softmax over `dim` (the result is the node's value).
    LogSoftmax { dim: isize },
    /// A view or copy with another shape.
    Reshape { shape: Vec<usize> },
    /// Dimensions `d0` and `d1` swapped.
    Transpose { d0: isize, d1: isize },
    /// Dimensions reordered: result dimension `i` is input dimension `perm[i]`.
    Permute { perm: Vec<usize> },
    /// Entries `start..` of dimension `dim` of an input of `shape`.
    Narrow {
        shape: Vec<usize>,
        dim: usize,
        start: usize,
    },
    /// Broadcast of an input of `shape`.
    BroadcastTo { shape: Vec<usize> },
    /// Concatenation along `dim` of inputs of these sizes along it.
    Cat { dim: usize, sizes: Vec<usize> },
    /// Conversion from `dtype`.
    Cast { dtype: DType },
    /// `mean(w * bce(sigmoid(x), y))` over all `n` elements.
    BceWithLogits {
        x: Tensor,
        y: Tensor,
        w: Option<Tensor>,
        n: usize,
    },
}

impl GradFn {
    pub(super) fn name(&self) -> &'static str {
        match self {
            GradFn::Add { .. } => "add",
            GradFn::Sub { .. } => "sub",
            GradFn::Mul { .. } => "mul",
            GradFn::Div { .. } => "div",
            GradFn::Shift => "add_scalar",
            GradFn::Scale(_) => "mul_scalar",
            GradFn::DivScalar(_) => "div_scalar",
            GradFn::PowScalar { .. } => "pow_scalar",
            GradFn::Unary { op, .. } => op.name(),
            GradFn::Matmul { .. } => "matmul",
            GradFn::Reduce { scale: None, .. } => "sum",
            GradFn::Reduce { scale: Some(_), .. } => "mean",
            GradFn::Softmax { .. } => "softmax",
            GradFn::LogSoftmax { .. } => "log_softmax",
            GradFn::Reshape { .. } => "reshape",
            GradFn::Transpose { .. } => "transpose",
            GradFn::Permute { .. } => "permute",
            GradFn::Narrow { .. } => "narrow",
            GradFn::BroadcastTo { .. } => "broadcast_to",
            GradFn::Cat { .. } => "cat",
            GradFn::Cast { .. } => "to_dtype",
            GradFn::BceWithLogits { .. } => "bce_with_logits",
        }
    }

    /// The gradients of the inputs, given the gradient `g` of the result
    /// `out`; `None` for the inputs whose `needs` is false.
    pub(super) fn backward(
        &self,
        g: &Tensor,
        out: &Tensor,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor>>> {
        let want = |i: usize| needs.get(i).copied().unwrap_or(false);
        Ok(match self {
            GradFn::Add { a, b } => vec![
                want(0).then(|| sum_to_shape(g, a)).transpose()?,
                want(1).then(|| sum_to_shape(g, b)).transpose()?,
            ],
            GradFn::Sub { a, b } => vec![
                want(0).then(|| sum_to_shape(g, a)).transpose()?,
                want(1).then(|| sum_to_shape(&g.neg()?, b)).transpose()?,
            ],
            GradFn::Mul { a, b } => vec![
                want(0)
                    .then(|| sum_to_shape(&g.mul(b)?, a.shape()))
                    .transpose()?,
                want(1)
                    .then(|| sum_to_shape(&g.mul(a)?, b.shape()))
                    .transpose()?,
            ],
            // d(a/b)/db = -a/b² = -out/b
            GradFn::Div { a, b } => vec![
                want(0).then(|| sum_to_shape(&g.div(b)?, a)).transpose()?,
                want(1)
                    .then(|| sum_to_shape(&g.mul(out)?.div(b)?.neg()?, b.shape()))
                    .transpose()?,
            ],
            GradFn::Shift => vec![Some(g.clone())],
            GradFn::Scale(s) => vec![Some(g.mul_scalar(*s)?)],
            GradFn::DivScalar(s) => vec![Some(g.div_scalar(*s)?)],
            GradFn::PowScalar { x, p } => {
                vec![Some(g.mul(&x.pow_scalar(p - 1.0)?)?.mul_scalar(*p)?)]
            }
            GradFn::Unary { op, x } => vec![Some(g.mul(&unary_derivative(*op, x, out)?)?)],
            GradFn::Matmul { a, b } => matmul_backward(g, a, b, want(0), want(1))?,
            GradFn::Reduce {
                shape,
                dim,
                keepdim,
                scale,
            } => {
                let g = if *keepdim {
                    g.clone()
                } else {
                    g.unsqueeze(*dim as isize)?
                };
                let g = match scale {
                    Some(s) => g.mul_scalar(*s)?,
                    None => g,
                };
                vec![Some(g.broadcast_to(shape)?)]
            }
            // dx = y * (g - sum(g * y))
            GradFn::Softmax { dim } => {
                let dot = g.mul(out)?.sum(*dim, true)?;
                vec![Some(out.mul(&g.sub(&dot)?)?)]
            }
            // dx = g - softmax(x) * sum(g), softmax(x) = exp(y)
            GradFn::LogSoftmax { dim } => {
                let total = g.sum(*dim, true)?;
                vec![Some(g.sub(&out.exp()?.mul(&total)?)?)]
            }
            GradFn::Reshape { shape } => vec![Some(g.reshape(shape)?)],
            GradFn::Transpose { d0, d1 } => vec![Some(g.transpose(*d0, *d1)?)],
            GradFn::Permute { perm } => {
                let mut inverse = vec![0; perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    inverse[p] = i;
                }
                vec![Some(g.permute(&inverse)?)]
            }
            GradFn::Narrow { shape, dim, start } => vec![Some(pad(g, shape, *dim, *start)?)],
            GradFn::BroadcastTo { shape } => vec![Some(sum_to_shape(g, shape)?)],
            GradFn::Cat { dim, sizes } => {
                let mut start = 0;
                let mut grads = Vec::with_capacity(sizes.len());
                for (i, &len) in sizes.iter().enumerate() {
                    grads.push(
                        want(i)
                            .then(|| g.narrow(*dim as isize, start, len))
                            .transpose()?,
                    );
                    start += len;
                }
                grads
            }
            GradFn::Cast { dtype } => vec![Some(g.to_dtype(*dtype)?)],
            // d/dx = (sigmoid(x) - y) * w / n
            GradFn::BceWithLogits { x, y, w, n } => {
                let mut d = x.sigmoid()?.sub(y)?;
                if let Some(w) = w {
                    d = d.mul(w)?;
                }
                vec![Some(d.mul(g)?.div_scalar(*n as f32)?)]
            }
        })
    }
}

/// Sums `g` over the dimensions that broadcasting added or stretched, back
/// to `shape` (from which `g`'s shape was broadcast).
pub(super) fn sum_to_shape(g: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let mut g = g.clone();
    while g.rank() > shape.len() {
        g = g.sum(0, false)?;
    }
    for (d, &size) in shape.iter().enumerate() {
        if size == 1 && g.shape()[d] != 1 {
            g = g.sum(d as isize, true)?;
        }
    }
    Ok(g)
}

/// The gradient of a matrix product `out = a @ b` (batched, broadcast, with
/// 1-D operands as `Tensor::matmul` treats them).
fn matmul_backward(
    g: &Tensor,
    a: &Tensor,
    b: &Tensor,
    want_a: bool,
    want_b: bool,
) -> Result<Vec<Option<Tensor>>> {
    // the operands as the product saw them: a row vector, a column vector
    let a2 = if a.rank() == 1 {
        a.unsqueeze(0)?
    } else {
        a.clone()
    };
    let b2 = if b.rank() == 1 {
        b.unsqueeze(1)?
    } else {
        b.clone()
    };
    // g with the dimensions a 1-D operand removed put back: [.., M, N]
    let mut g2 = g.clone();
    if a.rank() == 1 {
        g2 = g2.unsqueeze(-1 - (b.rank() != 1) as isize)?;
    }
    if b.rank() == 1 {
        g2 = g2.unsqueeze(-1)?;
    }
    let ga = if want_a {
        // [.., M, N] @ [.., N, K]
        let full = g2.matmul(&b2.t()?)?;
        Some(sum_to_shape(&full, a2.shape())?.reshape(a.shape())?)
    } else {
        None
    };
    let gb = if want_b {
        // [.., K, M] @ [.., M, N]
        let full = a2.t()?.matmul(&g2)?;
        Some(sum_to_shape(&full, b2.shape())?.reshape(b.shape())?)
    } else {
        None
    };
    Ok(vec![ga, gb])
}

/// `g` put back at `start..` of dimension `dim` of a zero tensor of `shape`.
fn pad(g: &Tensor, shape: &[usize], dim: usize, start: usize) -> Result<Tensor> {
    let after = shape[dim] - start - g.shape()[dim];
    let zeros = |len: usize| {
        let mut s = shape.to_vec();
        s[dim] = len;
        Tensor::zeros(&s, g.dtype(), g.device())
    };
    let mut parts = Vec::with_capacity(3);
    if start > 0 {
        parts.push(zeros(start)?);
    }
    parts.push(g.clone());
    if after > 0 {
        parts.push(zeros(after)?);
    }
    if parts.len() == 1 {
        return Ok(g.clone());
    }
    let refs: Vec<&Tensor> = parts.iter().collect();
    Tensor::cat(&refs, dim as isize)
}

/// `f'(x)` elementwise, for `y = f(x)`.
fn unary_derivative(op: UnaryOp, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    let zero = Tensor::zeros(&[], x.dtype(), x.device())?;
    let mask = |m: Tensor| m.to_dtype(x.dtype());
    match op {
        UnaryOp::Neg => Tensor::full(-1.0, &[], x.dtype(), x.device()),
        // sign(x), 0 at 0 (as torch)
        UnaryOp::Abs => mask(x.gt(&zero)?)?.sub(&mask(x.lt(&zero)?)?),
        UnaryOp::Exp => Ok(y.clone()),
        UnaryOp::Log => x.recip(),
        UnaryOp::Sqrt => y.recip()?.mul_scalar(0.5),
        // -x^(-3/2) / 2 = -y³ / 2
        UnaryOp::Rsqrt => y.mul(y)?.mul(y)?.mul_scalar(-0.5),
        UnaryOp::Recip => y.sqr()?.neg(),
        UnaryOp::Sqr => x.mul_scalar(2.0),
        UnaryOp::Sin => x.cos(),
        UnaryOp::Cos => x.sin()?.neg(),
        UnaryOp::Tanh => y.sqr()?.neg()?.add_scalar(1.0),
        // 0 at 0 (as torch)
        UnaryOp::Relu => mask(x.gt(&zero)?),
        UnaryOp::Sigmoid => y.mul(&y.neg()?.add_scalar(1.0)?),
        // s * (1 + x * (1 - s)), s = sigmoid(x)
        UnaryOp::Silu => {
            let s = x.sigmoid()?;
            s.mul(&x.mul(&s.neg()?.add_scalar(1.0)?)?.add_scalar(1.0)?)
        }
        // Φ(x) + x φ(x), with Φ(x) = gelu(x) / x (there being no erf op),
        // 1/2 at 0
        UnaryOp::GeluErf => {
            let cdf = y.div(x)?;
            let cdf = x
                .eq(&zero)?
                .where_cond(&Tensor::full(0.5, &[], x.dtype(), x.device())?, &cdf)?;
            let pdf = x
                .sqr()?
                .mul_scalar(-0.5)?
                .exp()?
                .mul_scalar((0.5 / std::f64::consts::PI).sqrt() as f32)?;
            cdf.add(&x.mul(&pdf)?)
        }
        // t = tanh(c (x + k x³)):
        // (1 + t) / 2 + x (1 - t²) c (1 + 3 k x²) / 2
        UnaryOp::GeluTanh => {
            const K: f32 = 0.044715;
            let c = (2.0 / std::f64::consts::PI).sqrt() as f32;
            let x2 = x.sqr()?;
            let t = x2
                .mul_scalar(K)?
                .add_scalar(1.0)?
                .mul(x)?
                .mul_scalar(c)?
                .tanh()?;
            let inner = x2.mul_scalar(3.0 * K)?.add_scalar(1.0)?.mul_scalar(c)?;
            let outer = t.sqr()?.neg()?.add_scalar(1.0)?.mul(&inner)?.mul(x)?;
            t.add_scalar(1.0)?.add(&outer)?.mul_scalar(0.5)
        }
    }
}
