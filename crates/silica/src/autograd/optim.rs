//! Optimizers: SGD with momentum and AdamW, with PyTorch's update rules.
//!
//! An optimizer updates the parameters it is given from their gradients
//! ([`crate::autograd::Var::grad`]) with tensor ops on the parameters'
//! device, and keeps its state (momentum, moment estimates) there as well,
//! keyed by [`Var::id`]. A parameter without a gradient is skipped, and
//! its state is left as it was. The new value replaces the old in the
//! parameter ([`Var::set_value`]): graphs built before the step keep the
//! value they were built from.
//!
//! Hyperparameters are `f64` and public, so that a schedule can change
//! `lr` between steps; they are rounded to `f32` where they meet tensors.

use std::collections::{HashMap, HashSet};

use super::Var;
use crate::{Error, Result, Tensor};

/// A rule that updates parameters from their gradients.
pub trait Optimizer {
    /// Updates every parameter of `params` that has a gradient, once (a
    /// parameter listed twice is updated once).
    fn step(&mut self, params: &[Var]) -> Result<()>;

    /// Clears the gradients of `params` (call it before each backward pass,
    /// since gradients accumulate).
    fn zero_grad(&self, params: &[Var]) {
        for p in params {
            p.zero_grad();
        }
    }
}

/// The parameters of `params` that have a gradient, each once.
fn with_grads(params: &[Var]) -> Vec<(&Var, Tensor)> {
    let mut seen = HashSet::new();
    params
        .iter()
        .filter(|p| seen.insert(p.id()))
        .filter_map(|p| p.grad().map(|g| (p, g)))
        .collect()
}

fn check(op: &'static str, name: &str, value: f64, ok: bool) -> Result<()> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            op,
            msg: format!("invalid {name} {value}"),
        })
    }
}

/// Stochastic gradient descent with momentum and L2 weight decay, as
/// `torch.optim.SGD` (no dampening, no Nesterov). For a parameter `p` with
/// gradient `g`:
///
/// ```text
/// d = g + weight_decay * p
/// b = d                        on the first step (momentum != 0)
/// b = momentum * b + d         on later steps
/// p = p - lr * b               (p - lr * d without momentum)
/// ```
#[derive(Debug)]
pub struct Sgd {
    pub lr: f64,
    pub momentum: f64,
    pub weight_decay: f64,
    /// The momentum buffer `b` of each parameter.
    buffers: HashMap<u64, Tensor>,
}

impl Sgd {
    /// Plain SGD with learning rate `lr`: no momentum, no weight decay.
    pub fn new(lr: f64) -> Self {
        Sgd {
            lr,
            momentum: 0.0,
            weight_decay: 0.0,
            buffers: HashMap::new(),
        }
    }

    pub fn with_momentum(mut self, momentum: f64) -> Self {
        self.momentum = momentum;
        self
    }

    pub fn with_weight_decay(mut self, weight_decay: f64) -> Self {
        self.weight_decay = weight_decay;
        self
    }

    /// Forgets the momentum of every parameter.
    pub fn reset(&mut self) {
        self.buffers.clear();
    }
}

impl Optimizer for Sgd {
    fn step(&mut self, params: &[Var]) -> Result<()> {
        let op = "Sgd::step";
        check(op, "learning rate", self.lr, self.lr >= 0.0)?;
        check(op, "momentum", self.momentum, self.momentum >= 0.0)?;
        check(
            op,
            "weight decay",
            self.weight_decay,
            self.weight_decay >= 0.0,
        )?;
        for (param, g) in with_grads(params) {
            let p = param.value();
            let mut d = g;
            if self.weight_decay != 0.0 {
                d = d.add(&p.mul_scalar(self.weight_decay as f32)?)?;
            }
            if self.momentum != 0.0 {
                let b = match self.buffers.get(&param.id()) {
                    Some(b) => b.mul_scalar(self.momentum as f32)?.add(&d)?,
                    None => d,
                };
                self.buffers.insert(param.id(), b.clone());
                d = b;
            }
            param.set_value(p.sub(&d.mul_scalar(self.lr as f32)?)?)?;
        }
        Ok(())
    }
}

/// Adam with decoupled weight decay, as `torch.optim.AdamW` (without
/// `amsgrad`). For a parameter `p` with gradient `g`, at its step `t`
/// (counted from 1, per parameter):
///
/// ```text
/// p = p * (1 - lr * weight_decay)
/// m = m + (1 - beta1) * (g - m)          (m, v start at 0)
/// v = beta2 * v + (1 - beta2) * g * g
/// denom = sqrt(v) / sqrt(1 - beta2^t) + eps
/// p = p - lr / (1 - beta1^t) * m / denom
/// ```
///
/// The bias corrections are computed in `f64`, as PyTorch computes them
/// in Python floats.
#[derive(Debug)]
pub struct AdamW {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    state: HashMap<u64, AdamState>,
}

#[derive(Debug)]
struct AdamState {
    step: i32,
    /// first moment estimate `m`
    m: Tensor,
    /// second moment estimate `v`
    v: Tensor,
}

impl AdamW {
    /// AdamW with learning rate `lr` and PyTorch's defaults: betas (0.9,
    /// 0.999), eps 1e-8, weight decay 0.01.
    pub fn new(lr: f64) -> Self {
        AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 1e-2,
            state: HashMap::new(),
        }
    }

    pub fn with_betas(mut self, beta1: f64, beta2: f64) -> Self {
        self.beta1 = beta1;
        self.beta2 = beta2;
        self
    }

    pub fn with_eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }

    pub fn with_weight_decay(mut self, weight_decay: f64) -> Self {
        self.weight_decay = weight_decay;
        self
    }

    /// Forgets the moments and step counts of every parameter.
    pub fn reset(&mut self) {
        self.state.clear();
    }
}

impl Optimizer for AdamW {
    fn step(&mut self, params: &[Var]) -> Result<()> {
        let op = "AdamW::step";
        check(op, "learning rate", self.lr, self.lr >= 0.0)?;
        check(op, "beta1", self.beta1, (0.0..1.0).contains(&self.beta1))?;
        check(op, "beta2", self.beta2, (0.0..1.0).contains(&self.beta2))?;
        check(op, "eps", self.eps, self.eps >= 0.0)?;
        check(
            op,
            "weight decay",
            self.weight_decay,
            self.weight_decay >= 0.0,
        )?;
        for (param, g) in with_grads(params) {
            let mut p = param.value();
            let (step, m, v) = match self.state.get(&param.id()) {
                Some(s) => (s.step, s.m.clone(), s.v.clone()),
                None => {
                    let zeros = Tensor::zeros(p.shape(), p.dtype(), p.device())?;
                    (0, zeros.clone(), zeros)
                }
            };
            let t = step.saturating_add(1);
            if self.weight_decay != 0.0 {
                p = p.mul_scalar((1.0 - self.lr * self.weight_decay) as f32)?;
            }
            let m = m.add(&g.sub(&m)?.mul_scalar((1.0 - self.beta1) as f32)?)?;
            let v = v
                .mul_scalar(self.beta2 as f32)?
                .add(&g.mul(&g)?.mul_scalar((1.0 - self.beta2) as f32)?)?;
            let bias1 = 1.0 - self.beta1.powi(t);
            let bias2 = 1.0 - self.beta2.powi(t);
            let denom = v
                .sqrt()?
                .div_scalar(bias2.sqrt() as f32)?
                .add_scalar(self.eps as f32)?;
            let p = p.sub(&m.div(&denom)?.mul_scalar((self.lr / bias1) as f32)?)?;
            param.set_value(p)?;
            self.state.insert(param.id(), AdamState { step: t, m, v });
        }
        Ok(())
    }
}
