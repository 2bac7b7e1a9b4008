//! Classification losses: softmax cross-entropy and binary cross-entropy on
//! logits, each the mean over the batch, optionally weighted per sample.

use super::Var;
use super::grad_fn::GradFn;
use crate::layout::broadcast_shapes;
use crate::{DType, Error, Result, Tensor};

impl Var {
    /// Softmax cross-entropy of `logits [N, C]` (this var) against the class
    /// indices `targets [N]` (`U32` or `I64`), averaged over the `N` rows:
    /// `-mean_i log_softmax(logits)[i, targets[i]]`, as
    /// `torch.nn.functional.cross_entropy`.
    ///
    /// A target outside `0..C` is an error on the CPU; on a GPU (where
    /// checking would wait for the device) its row contributes
    /// `logsumexp(logits[i])`, as if no class were picked.
    pub fn cross_entropy(&self, targets: &Tensor) -> Result<Var> {
        self.cross_entropy_impl(targets, None)
    }

    /// [`Var::cross_entropy`] with a weight per row, `weights [N]` of the
    /// logits' dtype: `-sum_i weights[i] * log_softmax(logits)[i, targets[i]] / N`
    /// (divided by `N`, not by the sum of the weights).
    pub fn cross_entropy_weighted(&self, targets: &Tensor, weights: &Tensor) -> Result<Var> {
        self.cross_entropy_impl(targets, Some(weights))
    }

    fn cross_entropy_impl(&self, targets: &Tensor, weights: Option<&Tensor>) -> Result<Var> {
        let op = "cross_entropy";
        let logits = self.value();
        let &[n, c] = logits.shape() else {
            return Err(Error::InvalidArgument {
                op,
                msg: format!("logits must be [N, C], not {:?}", logits.shape()),
            });
        };
        logits.same_device(targets, op)?;
        if !matches!(targets.dtype(), DType::U32 | DType::I64) {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "targets must be u32 or i64 class indices, not {}",
                    targets.dtype()
                ),
            });
        }
        if targets.shape() != [n] {
            return Err(Error::ShapeMismatch {
                op,
                lhs: logits.shape().to_vec(),
                rhs: targets.shape().to_vec(),
                hint: format!("targets must be [{n}], one class per row"),
            });
        }
        if n == 0 {
            return Err(Error::InvalidArgument {
                op,
                msg: "the batch is empty: its mean is undefined".into(),
            });
        }
        if targets.device().is_cpu()
            && let Some(bad) = targets.to_f64_vec()?.into_iter().find(|&t| t >= c as f64)
        {
            return Err(Error::IndexOutOfRange {
                op,
                index: bad as i64,
                size: c,
            });
        }
        // one-hot rows [N, C] of the logits' dtype, times the row weights
        let classes = Tensor::arange(0.0, c as f64, 1.0, DType::F32, logits.device())?;
        let mut pick = targets
            .to_dtype(DType::F32)?
            .reshape(&[n, 1])?
            .eq(&classes)?
            .to_dtype(logits.dtype())?;
        if let Some(w) = weights {
            check_weights(op, &logits, w, &[n])?;
            pick = pick.mul(&w.broadcast_to(&[n])?.unsqueeze(1)?)?;
        }
        self.log_softmax(-1)?
            .mul(&Var::constant(pick))?
            .sum_all()?
            .mul_scalar(-1.0 / n as f32)
    }

    /// Binary cross-entropy of the logits (this var, any shape) against
    /// `targets` in `[0, 1]` of the same shape (or one that broadcasts to
    /// it) and dtype, averaged over all
    /// elements, as `torch.nn.functional.binary_cross_entropy_with_logits`:
    /// `mean(max(x, 0) - x * y + log(1 + exp(-|x|)))`, a form that does not
    /// overflow. Its gradient is `(sigmoid(x) - y) / numel`.
    pub fn bce_with_logits(&self, targets: &Tensor) -> Result<Var> {
        self.bce_impl(targets, None)
    }

    /// [`Var::bce_with_logits`] with weights that broadcast to the logits'
    /// shape (one per sample: `[N, 1]` for logits `[N, K]`), as torch's
    /// `weight` argument: `mean(weights * loss)`.
    pub fn bce_with_logits_weighted(&self, targets: &Tensor, weights: &Tensor) -> Result<Var> {
        self.bce_impl(targets, Some(weights))
    }

    fn bce_impl(&self, targets: &Tensor, weights: Option<&Tensor>) -> Result<Var> {
        let op = "bce_with_logits";
        let x = self.value();
        check_weights(op, &x, targets, x.shape())?;
        if let Some(w) = weights {
            check_weights(op, &x, w, x.shape())?;
        }
        let n = x.numel();
        if n == 0 {
            return Err(Error::InvalidArgument {
                op,
                msg: "the logits are empty: their mean is undefined".into(),
            });
        }
        let softplus = x.abs()?.neg()?.exp()?.add_scalar(1.0)?.log()?;
        let mut loss = x.relu()?.sub(&x.mul(targets)?)?.add(&softplus)?;
        if let Some(w) = weights {
            loss = loss.mul(w)?;
        }
        let mean = loss.reshape(&[n])?.mean(0, false)?;
        Ok(Var::from_op(mean, &[self], || GradFn::BceWithLogits {
            x,
            y: targets.clone(),
            w: weights.cloned(),
            n,
        }))
    }
}

/// Checks that `t` has the dtype and device of `x` and broadcasts to `shape`.
fn check_weights(op: &'static str, x: &Tensor, t: &Tensor, shape: &[usize]) -> Result<()> {
    x.same_device(t, op)?;
    if t.dtype() != x.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            lhs: x.dtype(),
            rhs: t.dtype(),
        });
    }
    if broadcast_shapes(op, shape, t.shape())? != shape {
        return Err(Error::ShapeMismatch {
            op,
            lhs: shape.to_vec(),
            rhs: t.shape().to_vec(),
            hint: format!("must broadcast to {shape:?}"),
        });
    }
    Ok(())
}
