//! Reductions over one axis, softmax and log-softmax.

use crate::dispatch::run;
use crate::layout::normalize_dim;
use crate::{DType, Error, Op, Result, Tensor};

/// Reductions over one axis. The discriminant is the GPU kernel's `OP`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    /// Index of the first maximum, as `U32`.
    Argmax,
    /// Index of the first minimum, as `U32`.
    Argmin,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 6] = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Argmax,
        ReduceOp::Argmin,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Argmax => "argmax",
            ReduceOp::Argmin => "argmin",
        }
    }

    /// The dtype of the result for an input of `dtype`.
    pub fn out_dtype(self, dtype: DType) -> DType {
        match self {
            ReduceOp::Argmax | ReduceOp::Argmin => DType::U32,
            _ => dtype,
        }
    }
}

impl Tensor {
    /// Reduces dimension `dim`; with `keepdim` the dimension stays with size 1.
    pub fn reduce(&self, op: ReduceOp, dim: isize, keepdim: bool) -> Result<Tensor> {
        let d = normalize_dim(op.name(), dim, self.shape())?;
        if self.shape()[d] == 0 && !matches!(op, ReduceOp::Sum | ReduceOp::Mean) {
            return Err(Error::InvalidArgument {
                op: op.name(),
                msg: format!(
                    "cannot reduce the empty dimension {d} of shape {:?}",
                    self.shape()
                ),
            });
        }
        // Move the reduced axis last: kernels reduce the last dimension.
        let moved = self.move_dim_last(d)?;
        let mut out_shape = moved.shape().to_vec();
        out_shape.pop();
        let out = run(
            Op::Reduce(op),
            &[&moved],
            out_shape,
            op.out_dtype(self.dtype()),
        )?;
        if keepdim {
            out.unsqueeze(d as isize)
        } else {
            Ok(out)
        }
    }

    pub fn sum(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, dim, keepdim)
    }
    pub fn mean(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Mean, dim, keepdim)
    }
    pub fn max(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, dim, keepdim)
    }
    pub fn min(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, dim, keepdim)
    }
    /// Index of the first maximum along `dim`, as `U32`.
    pub fn argmax(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Argmax, dim, keepdim)
    }
    /// Index of the first minimum along `dim`, as `U32`.
    pub fn argmin(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Argmin, dim, keepdim)
    }

    /// Softmax over `dim` (usually `-1`), computed in f32 with max subtraction.
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl(dim, false)
    }

    /// Log-softmax over `dim`.
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl(dim, true)
    }

    fn softmax_impl(&self, dim: isize, log: bool) -> Result<Tensor> {
        let op = Op::Softmax { log };
        let d = normalize_dim(op.name(), dim, self.shape())?;
        let last = self.rank() - 1;
        let moved = self.move_dim_last(d)?;
        let out = run(op, &[&moved], moved.shape().to_vec(), self.dtype())?;
        if d == last {
            return Ok(out);
        }
        // undo the move: result dimension `p` comes from dimension `perm^-1(p)`
        let perm = dim_last_perm(self.rank(), d);
        let mut inverse = vec![0; perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            inverse[p] = i;
        }
        out.permute(&inverse)
    }

    /// A view with dimension `d` moved to the end and the others in order
    /// (softmax and reductions work on the last dimension).
    fn move_dim_last(&self, d: usize) -> Result<Tensor> {
        self.permute(&dim_last_perm(self.rank(), d))
    }
}

/// The permutation that moves dimension `d` of `rank` to the end.
fn dim_last_perm(rank: usize, d: usize) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..rank).filter(|&i| i != d).collect();
    perm.push(d);
    perm
}
