//! The differentiable ops on [`Var`]: each runs the tensor op of the same
//! name and records its backward formula (`grad_fn.rs`).

use super::Var;
use super::grad_fn::GradFn;
use crate::layout::normalize_dim;
use crate::{DType, Error, Result, Tensor, UnaryOp};

macro_rules! unary_vars {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl Var {
            $(
                #[doc = concat!("Elementwise `", stringify!($name), "` (see [`UnaryOp::", stringify!($op), "`]).")]
                pub fn $name(&self) -> Result<Var> {
                    self.unary(UnaryOp::$op)
                }
            )*
        }
    };
}

unary_vars!(
    neg => Neg, abs => Abs, exp => Exp, log => Log, sqrt => Sqrt, rsqrt => Rsqrt,
    recip => Recip, sqr => Sqr, sin => Sin, cos => Cos, tanh => Tanh, relu => Relu,
    sigmoid => Sigmoid, silu => Silu, gelu_erf => GeluErf, gelu_tanh => GeluTanh,
);

impl Var {
    /// `self + rhs` elementwise with numpy broadcasting; the gradient of a
    /// broadcast operand is summed back to its shape (as for all four
    /// arithmetic ops).
    pub fn add(&self, rhs: &Var) -> Result<Var> {
        let (a, b) = (self.value(), rhs.value());
        let out = a.add(&b)?;
        Ok(Var::from_op(out, &[self, rhs], || GradFn::Add {
            a: a.shape().to_vec(),
            b: b.shape().to_vec(),
        }))
    }

    /// `self - rhs` elementwise with numpy broadcasting.
    pub fn sub(&self, rhs: &Var) -> Result<Var> {
        let (a, b) = (self.value(), rhs.value());
        let out = a.sub(&b)?;
        Ok(Var::from_op(out, &[self, rhs], || GradFn::Sub {
            a: a.shape().to_vec(),
            b: b.shape().to_vec(),
        }))
    }

    /// `self * rhs` elementwise with numpy broadcasting.
    pub fn mul(&self, rhs: &Var) -> Result<Var> {
        let (a, b) = (self.value(), rhs.value());
        let out = a.mul(&b)?;
        Ok(Var::from_op(out, &[self, rhs], || GradFn::Mul { a, b }))
    }

    /// `self / rhs` elementwise with numpy broadcasting.
    pub fn div(&self, rhs: &Var) -> Result<Var> {
        let (a, b) = (self.value(), rhs.value());
        let out = a.div(&b)?;
        Ok(Var::from_op(out, &[self, rhs], || GradFn::Div {
            a: a.shape().to_vec(),
            b,
        }))
    }

    /// `op(self)` elementwise. Where the function has a kink (`abs`, `relu`
    /// at 0) the gradient there is 0, as in PyTorch.
    pub fn unary(&self, op: UnaryOp) -> Result<Var> {
        let x = self.value();
        let out = x.unary(op)?;
        Ok(Var::from_op(out, &[self], || GradFn::Unary { op, x }))
    }

    /// `self + s` elementwise.
    pub fn add_scalar(&self, s: f32) -> Result<Var> {
        let out = self.value().add_scalar(s)?;
        Ok(Var::from_op(out, &[self], || GradFn::Shift))
    }

    /// `self - s` elementwise.
    pub fn sub_scalar(&self, s: f32) -> Result<Var> {
        let out = self.value().sub_scalar(s)?;
        Ok(Var::from_op(out, &[self], || GradFn::Shift))
    }

    /// `self * s` elementwise.
    pub fn mul_scalar(&self, s: f32) -> Result<Var> {
        let out = self.value().mul_scalar(s)?;
        Ok(Var::from_op(out, &[self], || GradFn::Scale(s)))
    }

    /// `self / s` elementwise.
    pub fn div_scalar(&self, s: f32) -> Result<Var> {
        let out = self.value().div_scalar(s)?;
        Ok(Var::from_op(out, &[self], || GradFn::DivScalar(s)))
    }

    /// `self ^ p` elementwise.
    pub fn pow_scalar(&self, p: f32) -> Result<Var> {
        let x = self.value();
        let out = x.pow_scalar(p)?;
        Ok(Var::from_op(out, &[self], || GradFn::PowScalar { x, p }))
    }

    /// Matrix product as [`Tensor::matmul`] defines it (batch dimensions
    /// broadcast, 1-D operands as vectors).
    pub fn matmul(&self, rhs: &Var) -> Result<Var> {
        let (a, b) = (self.value(), rhs.value());
        let out = a.matmul(&b)?;
        Ok(Var::from_op(out, &[self, rhs], || GradFn::Matmul { a, b }))
    }

    /// Sum over `dim`; with `keepdim` the dimension stays with size 1.
    pub fn sum(&self, dim: isize, keepdim: bool) -> Result<Var> {
        self.reduce(dim, keepdim, false)
    }

    /// Mean over `dim`; with `keepdim` the dimension stays with size 1.
    pub fn mean(&self, dim: isize, keepdim: bool) -> Result<Var> {
        self.reduce(dim, keepdim, true)
    }

    fn reduce(&self, dim: isize, keepdim: bool, mean: bool) -> Result<Var> {
        let x = self.value();
        let out = if mean {
            x.mean(dim, keepdim)?
        } else {
            x.sum(dim, keepdim)?
        };
        let d = normalize_dim(if mean { "mean" } else { "sum" }, dim, x.shape())?;
        let n = x.shape()[d];
        Ok(Var::from_op(out, &[self], || GradFn::Reduce {
            shape: x.shape().to_vec(),
            dim: d,
            keepdim,
            scale: mean.then(|| 1.0 / n as f32),
        }))
    }

    /// The sum of all elements, as a tensor of shape `[]`.
    pub fn sum_all(&self) -> Result<Var> {
        self.reshape(&[self.value().numel()])?.sum(0, false)
    }

    /// The mean of all elements, as a tensor of shape `[]`.
    pub fn mean_all(&self) -> Result<Var> {
        self.reshape(&[self.value().numel()])?.mean(0, false)
    }

    /// Softmax over `dim`.
    pub fn softmax(&self, dim: isize) -> Result<Var> {
        let out = self.value().softmax(dim)?;
        Ok(Var::from_op(out, &[self], || GradFn::Softmax { dim }))
    }

    /// Log-softmax over `dim`.
    pub fn log_softmax(&self, dim: isize) -> Result<Var> {
        let out = self.value().log_softmax(dim)?;
        Ok(Var::from_op(out, &[self], || GradFn::LogSoftmax { dim }))
    }

    /// The same elements with another shape.
    pub fn reshape(&self, shape: &[usize]) -> Result<Var> {
        let x = self.value();
        let out = x.reshape(shape)?;
        Ok(Var::from_op(out, &[self], || GradFn::Reshape {
            shape: x.shape().to_vec(),
        }))
    }

    /// Inserts a size-1 dimension at `dim`.
    pub fn unsqueeze(&self, dim: isize) -> Result<Var> {
        let x = self.value();
        let out = x.unsqueeze(dim)?;
        Ok(Var::from_op(out, &[self], || GradFn::Reshape {
            shape: x.shape().to_vec(),
        }))
    }

    /// Removes dimension `dim`, which must have size 1.
    pub fn squeeze(&self, dim: isize) -> Result<Var> {
        let x = self.value();
        let out = x.squeeze(dim)?;
        Ok(Var::from_op(out, &[self], || GradFn::Reshape {
            shape: x.shape().to_vec(),
        }))
    }

    /// Swaps two dimensions.
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Var> {
        let out = self.value().transpose(d0, d1)?;
        Ok(Var::from_op(out, &[self], || GradFn::Transpose { d0, d1 }))
    }

    /// Swaps the last two dimensions; for a matrix, its transpose.
    pub fn t(&self) -> Result<Var> {
        let out = self.value().t()?;
        Ok(Var::from_op(out, &[self], || GradFn::Transpose {
            d0: -2,
            d1: -1,
        }))
    }

    /// Reorders the dimensions: result dimension `i` is `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Result<Var> {
        let out = self.value().permute(perm)?;
        Ok(Var::from_op(out, &[self], || GradFn::Permute {
            perm: perm.to_vec(),
        }))
    }

    /// Entries `start..start + len` of dimension `dim`; the gradient of the
    /// other entries is 0.
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Var> {
        let x = self.value();
        let out = x.narrow(dim, start, len)?;
        let d = normalize_dim("narrow", dim, x.shape())?;
        Ok(Var::from_op(out, &[self], || GradFn::Narrow {
            shape: x.shape().to_vec(),
            dim: d,
            start,
        }))
    }

    /// Numpy-style broadcast to `shape`; the gradient is summed back.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Var> {
        let x = self.value();
        let out = x.broadcast_to(shape)?;
        Ok(Var::from_op(out, &[self], || GradFn::BroadcastTo {
            shape: x.shape().to_vec(),
        }))
    }

    /// Concatenates `vars` along `dim` (see [`Tensor::cat`]).
    pub fn cat(vars: &[&Var], dim: isize) -> Result<Var> {
        let values: Vec<Tensor> = vars.iter().map(|v| v.value()).collect();
        let refs: Vec<&Tensor> = values.iter().collect();
        let out = Tensor::cat(&refs, dim)?;
        // cat succeeded: there is a first tensor and `dim` is valid for it
        let d = normalize_dim("cat", dim, values[0].shape())?;
        Ok(Var::from_op(out, vars, || GradFn::Cat {
            dim: d,
            sizes: values.iter().map(|v| v.shape()[d]).collect(),
        }))
    }

    /// Converts the value to `dtype`; the gradient is converted back to the
    /// input's dtype. A var that requires grad converts only between float
    /// dtypes.
    pub fn to_dtype(&self, dtype: DType) -> Result<Var> {
        let x = self.value();
        if self.requires_grad() && !(dtype.is_float() && x.dtype().is_float()) {
            return Err(Error::InvalidArgument {
                op: "to_dtype",
                msg: format!(
                    "gradients flow only between float dtypes, not {} and {dtype}",
                    x.dtype()
                ),
            });
        }
        let out = x.to_dtype(dtype)?;
        Ok(Var::from_op(out, &[self], || GradFn::Cast {
            dtype: x.dtype(),
        }))
    }
}
