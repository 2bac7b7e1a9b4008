//! Matrix products with batch broadcasting.

use crate::dispatch::run;
use crate::layout::broadcast_shapes;
use crate::{Error, Op, Result, Tensor};

impl Tensor {
    /// A linear layer as checkpoints store it: `self [.., k] @ wᵀ + bias`
    /// for `w [n, k]` and `bias [n]`, the result `[.., n]` (as PyTorch's
    /// `F.linear`). On the CPU in f32 the product accumulates into the bias
    /// rows, so no separate pass adds the bias; elsewhere it is
    /// [`Tensor::matmul`] then [`Tensor::add`].
    ///
    /// ```
    /// # use silica::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let x = Tensor::from_slice(&[1.0f32, 2.0], &[1, 2], &dev)?;
    /// let w = Tensor::from_slice(&[1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2], &dev)?;
    /// let b = Tensor::from_slice(&[0.5f32, 0.0, -1.0], &[3], &dev)?;
    /// assert_eq!(x.linear(&w, &b)?.to_vec::<f32>()?, vec![1.5, 2.0, 2.0]);
    /// # Ok::<(), silica::Error>(())
    /// ```
    pub fn linear(&self, w: &Tensor, bias: &Tensor) -> Result<Tensor> {
        let n = w.shape().first().copied().unwrap_or(0);
        let hint = format!("the bias has one value per output column: [{n}]");
        self.check_linear("linear", w, bias, &[n], hint)?;
        crate::custom::apply(&crate::fused::Linear, &[self, w, bias])
    }

    /// `self @ wᵀ + residual` for `self [.., k]`, `w [n, k]` and `residual`
    /// of the result's shape `[.., n]`, all of one float dtype: a linear
    /// layer whose output joins a residual stream. On a GPU, where the
    /// product is split along K (prompts of a few hundred rows on narrow
    /// outputs, and up to 32 rows), the parts' sum adds the residual, which
    /// saves the add's dispatch; elsewhere it is `matmul`, then `add`.
    ///
    /// ```
    /// # use silica::{Device, Tensor};
    /// let dev = Device::cpu();
    /// let x = Tensor::from_slice(&[1.0f32, 2.0], &[1, 2], &dev)?;
    /// let w = Tensor::from_slice(&[1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2], &dev)?;
    /// let r = Tensor::from_slice(&[0.5f32, 0.0, -1.0], &[1, 3], &dev)?;
    /// assert_eq!(x.linear_add(&w, &r)?.to_vec::<f32>()?, vec![1.5, 2.0, 2.0]);
    /// # Ok::<(), silica::Error>(())
    /// ```
    pub fn linear_add(&self, w: &Tensor, residual: &Tensor) -> Result<Tensor> {
        let mut want = self.shape().to_vec();
        if let (Some(last), Some(&n)) = (want.last_mut(), w.shape().first()) {
            *last = n;
        }
        let hint = format!("the residual has the product's shape: {want:?}");
        self.check_linear("linear_add", w, residual, &want, hint)?;
        crate::custom::apply(&crate::fused::LinearAdd, &[self, w, residual])
    }

    /// The checks of [`Tensor::linear`] and [`Tensor::linear_add`]: one
    /// device, `self [.., k]` and `w [n, k]`, `extra` (the bias, the
    /// residual) of shape `want` (`hint` says which), one float dtype.
    fn check_linear(
        &self,
        op: &'static str,
        w: &Tensor,
        extra: &Tensor,
        want: &[usize],
        hint: String,
    ) -> Result<()> {
        self.same_device(w, op)?;
        self.same_device(extra, op)?;
        let k = self.shape().last().copied().unwrap_or(0);
        if self.rank() == 0 || w.rank() != 2 || w.shape()[1] != k {
            return Err(Error::ShapeMismatch {
                op,
                lhs: self.shape().to_vec(),
                rhs: w.shape().to_vec(),
                hint: format!("x @ wᵀ needs x [.., k] and w [n, k] with k = {k}"),
            });
        }
        if extra.shape() != want {
            return Err(Error::ShapeMismatch {
                op,
                lhs: extra.shape().to_vec(),
                rhs: want.to_vec(),
                hint,
            });
        }
        for t in [w, extra] {
            if !self.dtype().is_float() || t.dtype() != self.dtype() {
                return Err(Error::DTypeMismatch {
                    op,
                    lhs: self.dtype(),
                    rhs: t.dtype(),
                });
            }
        }
        Ok(())
    }

    /// Matrix product as `torch.matmul` defines it: `[.., M, K] @ [.., K, N]`
    /// with the batch dimensions broadcast; a 1-D operand is treated as a row
    /// (left) or column (right) vector and its dimension removed from the
    /// result. Operands may be transposed or strided views: no copy is made.
    ///
    /// ```
    /// # use silica::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &dev)?;
    /// let c = a.matmul(&a.t()?)?;
    /// assert_eq!(c.to_vec::<f32>()?, vec![5.0, 11.0, 11.0, 25.0]);
    /// # Ok::<(), silica::Error>(())
    /// ```
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        let op = "matmul";
        self.same_device(rhs, op)?;
        if self.dtype() != rhs.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: self.dtype(),
                rhs: rhs.dtype(),
            });
        }
        if self.rank() == 0 || rhs.rank() == 0 {
            return Err(Error::ShapeMismatch {
                op,
                lhs: self.shape().to_vec(),
                rhs: rhs.shape().to_vec(),
                hint: "matmul needs operands of rank 1 or more".into(),
            });
        }
        let a = if self.rank() == 1 {
            self.unsqueeze(0)?
        } else {
            self.clone()
        };
        let b = if rhs.rank() == 1 {
            rhs.unsqueeze(1)?
        } else {
            rhs.clone()
        };
        let (ar, br) = (a.rank(), b.rank());
        let (m, k) = (a.shape()[ar - 2], a.shape()[ar - 1]);
        let (k2, n) = (b.shape()[br - 2], b.shape()[br - 1]);
        if k != k2 {
            return Err(Error::ShapeMismatch {
                op,
                lhs: self.shape().to_vec(),
                rhs: rhs.shape().to_vec(),
                hint: format!("inner dimensions {k} and {k2} differ"),
            });
        }
        let batch = broadcast_shapes(op, &a.shape()[..ar - 2], &b.shape()[..br - 2])?;
        let mut a_shape = batch.clone();
        a_shape.extend([m, k]);
        let mut b_shape = batch.clone();
        b_shape.extend([k, n]);
        let a = a.broadcast_to(&a_shape)?;
        let b = b.broadcast_to(&b_shape)?;
        let mut out_shape = batch;
        out_shape.extend([m, n]);
        let mut out = run(Op::Matmul, &[&a, &b], out_shape, self.dtype())?;
        // the row first: with two vectors, [1, 1] becomes [1], then a scalar
        if self.rank() == 1 {
            out = out.squeeze(-2)?;
        }
        if rhs.rank() == 1 {
            out = out.squeeze(-1)?;
        }
        Ok(out)
    }
}
