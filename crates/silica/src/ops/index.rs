//! Concatenation and gathers along an axis.

use crate::dispatch::run;
use crate::layout::normalize_dim;
use crate::{DType, Error, Op, Result, Tensor};

impl Tensor {
    /// Concatenates `tensors` along `dim`; all other dimensions must agree.
    pub fn cat(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let op = "cat";
        let first = tensors.first().ok_or_else(|| Error::InvalidArgument {
            op,
            msg: "needs at least one tensor".into(),
        })?;
        let axis = normalize_dim(op, dim, first.shape())?;
        let mut out_shape = first.shape().to_vec();
        out_shape[axis] = 0;
        for t in tensors {
            first.same_device(t, op)?;
            if t.dtype() != first.dtype() {
                return Err(Error::DTypeMismatch {
                    op,
                    lhs: first.dtype(),
                    rhs: t.dtype(),
                });
            }
            let compatible = t.rank() == first.rank()
                && t.shape()
                    .iter()
                    .zip(first.shape())
                    .enumerate()
                    .all(|(d, (a, b))| d == axis || a == b);
            if !compatible {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: first.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                    hint: format!("all dimensions but {axis} must agree"),
                });
            }
            out_shape[axis] += t.shape()[axis];
        }
        run(Op::Cat { axis }, tensors, out_shape, first.dtype())
    }

    /// Picks entries of dimension `dim` by the 1-D `indices` (`U32` or
    /// `I64`): embedding lookup is `table.index_select(0, &ids)`. On the CPU
    /// an index past the end is an error; a GPU kernel cannot report one, and
    /// yields zeros for it instead.
    pub fn index_select(&self, dim: isize, indices: &Tensor) -> Result<Tensor> {
        let op = "index_select";
        self.same_device(indices, op)?;
        let axis = normalize_dim(op, dim, self.shape())?;
        if !matches!(indices.dtype(), DType::U32 | DType::I64) {
            return Err(Error::InvalidArgument {
                op,
                msg: format!("indices must be u32 or i64, not {}", indices.dtype()),
            });
        }
        if indices.rank() != 1 {
            return Err(Error::InvalidArgument {
                op,
                msg: format!("indices must be 1-D, not of shape {:?}", indices.shape()),
            });
        }
        let mut out_shape = self.shape().to_vec();
        out_shape[axis] = indices.shape()[0];
        run(
            Op::IndexSelect { axis },
            &[self, indices],
            out_shape,
            self.dtype(),
        )
    }
}
