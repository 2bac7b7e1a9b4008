//! Reverse-mode automatic differentiation over [`Tensor`] ops, and the
//! optimizers that use its gradients ([`optim`]).
//!
//! A [`Var`] wraps a tensor. [`Var::param`] makes a leaf whose gradient is
//! wanted, [`Var::constant`] one whose gradient is not; every op on vars
//! ([`Var::matmul`], [`Var::add`], [`Var::sigmoid`], [`Var::log_softmax`],
//! the losses [`Var::cross_entropy`] and [`Var::bce_with_logits`], ...)
//! computes its value at once with the ordinary tensor op, on the tensors'
//! device, and records how to take its gradient. [`Var::backward`] on a
//! one-element result walks the recorded graph in reverse topological order
//! and adds the gradient of every parameter it reaches to
//! [`Var::grad`]. The backward formulas are tensor ops as well, so
//! gradients are computed on the device of the values, with the same CPU
//! fallback and check modes as any other op.
//!
//! Gradients have the dtype of their value. They accumulate over backward
//! passes until [`Var::zero_grad`] (or [`optim::Optimizer::zero_grad`])
//! clears them, as in PyTorch.
//!
//! A logistic regression trained with AdamW:
//!
//! ```
//! use silica::autograd::{Var, optim::{AdamW, Optimizer}};
//! use silica::{DType, Device, Tensor};
//!
//! let dev = Device::cpu();
//! // two features; the label is 1 when their sum is positive
//! let xs = [[1.0f32, 2.0], [-1.5, -0.5], [0.5, 1.0], [-2.0, 0.5], [2.0, -1.0], [-0.5, -1.0]];
//! let ys: Vec<f32> = xs.iter().map(|p| (p[0] + p[1] > 0.0) as u8 as f32).collect();
//! let x = Var::constant(Tensor::from_slice(xs.as_flattened(), &[6, 2], &dev)?);
//! let y = Tensor::from_slice(&ys, &[6, 1], &dev)?;
//!
//! let w = Var::param(Tensor::zeros(&[2, 1], DType::F32, &dev)?);
//! let b = Var::param(Tensor::zeros(&[1], DType::F32, &dev)?);
//! let mut opt = AdamW::new(0.1);
//! for _ in 0..100 {
//!     let logits = x.matmul(&w)?.add(&b)?; // [6, 1]
//!     let loss = logits.bce_with_logits(&y)?;
//!     opt.zero_grad(&[w.clone(), b.clone()]);
//!     loss.backward()?;
//!     opt.step(&[w.clone(), b.clone()])?;
//! }
//! let logits: Vec<f32> = x.matmul(&w)?.add(&b)?.value().to_vec()?;
//! assert!(logits.iter().zip(&ys).all(|(z, y)| (*z > 0.0) == (*y > 0.5)));
//! # Ok::<(), silica::Error>(())
//! ```

mod grad_fn;
mod loss;
mod ops;
pub mod optim;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use crate::{Error, Result, Tensor};
use grad_fn::GradFn;

/// A tensor in a differentiable computation: a parameter, a constant, or
/// the result of an op on other vars.
///
/// Cloning is cheap and shares the node: a clone sees the same value and
/// gradient. Vars are `Send + Sync`. Ops return a `Result` with the error
/// of the underlying tensor op (shapes, dtypes, devices).
#[derive(Clone)]
pub struct Var(Arc<Node>);

struct Node {
    /// Unique for the life of the process: the key of the optimizers' state
    /// and of the gradients during a backward pass.
    id: u64,
    /// Replaced by [`Var::set_value`] (optimizers); fixed for op results.
    value: RwLock<Tensor>,
    /// The accumulated gradient; only leaves that require grad keep one.
    grad: Mutex<Option<Tensor>>,
    requires_grad: bool,
    /// The op's inputs, for the results of ops that require grad; empty for
    /// leaves and for results that depend on no parameter.
    parents: Vec<Var>,
    /// How to turn the gradient of this node into its parents'; `None` for
    /// leaves.
    grad_fn: Option<GradFn>,
}

impl Drop for Node {
    /// Drops a chain of nodes in a loop: the default drop would recurse once
    /// per node and overflow the stack on long graphs.
    fn drop(&mut self) {
        let mut stack = std::mem::take(&mut self.parents);
        while let Some(var) = stack.pop() {
            if let Ok(mut node) = Arc::try_unwrap(var.0) {
                stack.append(&mut node.parents);
            }
        }
    }
}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Locks a mutex, going on after a panic in another holder: the data is a
/// tensor handle, always in a valid state.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl std::fmt::Debug for Var {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let value = self.value();
        write!(
            f,
            "Var({:?}, {}, {}",
            value.shape(),
            value.dtype(),
            value.device()
        )?;
        match (&self.0.grad_fn, self.0.requires_grad) {
            (Some(g), _) => write!(f, ", from {})", g.name()),
            (None, true) => write!(f, ", param)"),
            (None, false) => write!(f, ", constant)"),
        }
    }
}

impl Var {
    fn leaf(value: Tensor, requires_grad: bool) -> Var {
        Var(Arc::new(Node {
            id: next_id(),
            value: RwLock::new(value),
            grad: Mutex::new(None),
            requires_grad,
            parents: Vec::new(),
            grad_fn: None,
        }))
    }

    /// A leaf whose gradient is computed: a trainable parameter.
    pub fn param(value: Tensor) -> Var {
        Var::leaf(value, true)
    }

    /// A leaf without gradient: inputs, targets, frozen weights.
    pub fn constant(value: Tensor) -> Var {
        Var::leaf(value, false)
    }

    /// The result of an op: `value` computed from `parents`, with `grad_fn`
    /// (called only when some parent requires grad) to differentiate it.
    fn from_op(value: Tensor, parents: &[&Var], grad_fn: impl FnOnce() -> GradFn) -> Var {
        if !parents.iter().any(|p| p.requires_grad()) {
            return Var::constant(value);
        }
        Var(Arc::new(Node {
            id: next_id(),
            value: RwLock::new(value),
            grad: Mutex::new(None),
            requires_grad: true,
            parents: parents.iter().map(|&p| p.clone()).collect(),
            grad_fn: Some(grad_fn()),
        }))
    }

    /// The current value (a cheap handle to the same storage).
    pub fn value(&self) -> Tensor {
        self.0
            .value
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the value of a leaf (a parameter or a constant) with a tensor
    /// of the same shape, dtype and device. Results of ops are fixed: their
    /// value is what the graph was built from.
    pub fn set_value(&self, value: Tensor) -> Result<()> {
        let op = "set_value";
        if !self.is_leaf() {
            return Err(Error::InvalidArgument {
                op,
                msg: "only a leaf (Var::param or Var::constant) can take a new value".into(),
            });
        }
        let mut slot = self.0.value.write().unwrap_or_else(|e| e.into_inner());
        slot.same_device(&value, op)?;
        if slot.dtype() != value.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: slot.dtype(),
                rhs: value.dtype(),
            });
        }
        if slot.shape() != value.shape() {
            return Err(Error::ShapeMismatch {
                op,
                lhs: slot.shape().to_vec(),
                rhs: value.shape().to_vec(),
                hint: "the new value must have the shape of the old".into(),
            });
        }
        *slot = value;
        Ok(())
    }

    /// The gradient accumulated by backward passes, if any reached this var
    /// (only parameters keep one).
    pub fn grad(&self) -> Option<Tensor> {
        lock(&self.0.grad).clone()
    }

    /// Clears the accumulated gradient.
    pub fn zero_grad(&self) {
        *lock(&self.0.grad) = None;
    }

    /// Whether a gradient flows to this var: a parameter, or an op result
    /// that depends on one.
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad
    }

    /// Whether this var was made by [`Var::param`] or [`Var::constant`]
    /// (or is an op result that depends on no parameter).
    pub fn is_leaf(&self) -> bool {
        self.0.grad_fn.is_none()
    }

    /// A constant with the same value: gradients do not flow through it.
    pub fn detach(&self) -> Var {
        Var::constant(self.value())
    }

    /// A number unique to this var (clones share it) for the life of the
    /// process; optimizers key their state by it.
    pub fn id(&self) -> u64 {
        self.0.id
    }

    pub fn shape(&self) -> Vec<usize> {
        self.value().shape().to_vec()
    }

    pub fn dtype(&self) -> crate::DType {
        self.value().dtype()
    }

    pub fn device(&self) -> crate::Device {
        self.value().device().clone()
    }

    /// Computes the gradient of this one-element var (a loss) with respect
    /// to every parameter it depends on, and adds it to their
    /// [`Var::grad`]. An error if the var has more than one element or
    /// depends on no parameter.
    pub fn backward(&self) -> Result<()> {
        let value = self.value();
        if value.numel() != 1 {
            return Err(Error::InvalidArgument {
                op: "backward",
                msg: format!(
                    "needs a one-element var (a loss), not one of shape {:?}; \
                     reduce it first or use backward_with",
                    value.shape()
                ),
            });
        }
        let seed = Tensor::ones(value.shape(), value.dtype(), value.device())?;
        self.backward_with(&seed)
    }

    /// Like [`Var::backward`] for a var of any shape: `grad` (of this var's
    /// shape, dtype and device) is the gradient of the final scalar with
    /// respect to this var, as `torch.Tensor.backward(gradient)` takes it.
    pub fn backward_with(&self, grad: &Tensor) -> Result<()> {
        let op = "backward";
        let value = self.value();
        value.same_device(grad, op)?;
        if grad.dtype() != value.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: value.dtype(),
                rhs: grad.dtype(),
            });
        }
        if grad.shape() != value.shape() {
            return Err(Error::ShapeMismatch {
                op,
                lhs: value.shape().to_vec(),
                rhs: grad.shape().to_vec(),
                hint: "the gradient must have the var's shape".into(),
            });
        }
        if !self.requires_grad() {
            return Err(Error::InvalidArgument {
                op,
                msg: "the var depends on no parameter (Var::param): there is nothing to differentiate".into(),
            });
        }
        // The gradients of the nodes not yet handled; each is removed when
        // its node is, so intermediate gradients are freed as the walk goes.
        let mut grads: HashMap<u64, Tensor> = HashMap::new();
        grads.insert(self.id(), grad.clone());
        for node in self.topological_order().iter().rev() {
            let Some(g) = grads.remove(&node.id()) else {
                continue;
            };
            let Some(grad_fn) = &node.0.grad_fn else {
                node.accumulate(g)?;
                continue;
            };
            let needs: Vec<bool> = node.0.parents.iter().map(Var::requires_grad).collect();
            let parent_grads = grad_fn.backward(&g, &node.value(), &needs)?;
            for (parent, pg) in node.0.parents.iter().zip(parent_grads) {
                let Some(pg) = pg else { continue };
                let sum = match grads.remove(&parent.id()) {
                    Some(prev) => prev.add(&pg)?,
                    None => pg,
                };
                grads.insert(parent.id(), sum);
            }
        }
        Ok(())
    }

    /// Adds `g` to the gradient kept by this leaf.
    fn accumulate(&self, g: Tensor) -> Result<()> {
        let mut slot = lock(&self.0.grad);
        let sum = match slot.take() {
            Some(prev) => prev.add(&g)?,
            None => g,
        };
        *slot = Some(sum);
        Ok(())
    }

    /// The vars that require grad reachable from `self`, every var after all
    /// of its parents (an iterative depth-first walk: no recursion, however
    /// long the graph).
    fn topological_order(&self) -> Vec<Var> {
        let mut order = Vec::new();
        let mut seen = HashSet::new();
        // (var, whether its parents have been pushed already)
        let mut stack = vec![(self.clone(), false)];
        while let Some((var, expanded)) = stack.pop() {
            if expanded {
                order.push(var);
                continue;
            }
            if !seen.insert(var.id()) {
                continue;
            }
            let parents: Vec<Var> = var
                .0
                .parents
                .iter()
                .filter(|p| p.requires_grad() && !seen.contains(&p.id()))
                .cloned()
                .collect();
            stack.push((var, true));
            stack.extend(parents.into_iter().map(|p| (p, false)));
        }
        order
    }
}
