//! Elementwise functions of one tensor.

use crate::dispatch::run;
use crate::{Op, Result, Tensor};

/// Elementwise unary functions. The CPU definition is [`UnaryOp::apply`]; the
/// GPU kernel is `backend/gpu/kernels/unary.wgsl` (same order: the discriminant is the
/// kernel's `OP` constant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Recip,
    Sqr,
    Sin,
    Cos,
    Tanh,
    Relu,
    Sigmoid,
    Silu,
    GeluErf,
    GeluTanh,
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 16] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Recip,
        UnaryOp::Sqr,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tanh,
        UnaryOp::Relu,
        UnaryOp::Sigmoid,
        UnaryOp::Silu,
        UnaryOp::GeluErf,
        UnaryOp::GeluTanh,
    ];

    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Recip => "recip",
            UnaryOp::Sqr => "sqr",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Relu => "relu",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Silu => "silu",
            UnaryOp::GeluErf => "gelu_erf",
            UnaryOp::GeluTanh => "gelu_tanh",
        }
    }

    /// The reference definition, in f64.
    pub fn apply(self, x: f64) -> f64 {
        match self {
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => 1.0 / x.sqrt(),
            UnaryOp::Recip => 1.0 / x,
            UnaryOp::Sqr => x * x,
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Relu => x.max(0.0),
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Silu => x / (1.0 + (-x).exp()),
            UnaryOp::GeluErf => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
            UnaryOp::GeluTanh => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
            }
        }
    }
}

macro_rules! unary_methods {
    ($($fn_name:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(
                #[doc = concat!("Elementwise `", stringify!($fn_name), "`.")]
                pub fn $fn_name(&self) -> Result<Tensor> {
                    self.unary(UnaryOp::$op)
                }
            )*
        }
    };
}

unary_methods!(
    neg => Neg, abs => Abs, exp => Exp, log => Log, sqrt => Sqrt, rsqrt => Rsqrt,
    recip => Recip, sqr => Sqr, sin => Sin, cos => Cos, tanh => Tanh, relu => Relu,
    sigmoid => Sigmoid, silu => Silu, gelu_erf => GeluErf, gelu_tanh => GeluTanh,
);

impl Tensor {
    /// Applies `op` elementwise; the result is contiguous, of the same dtype.
    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        run(Op::Unary(op), &[self], self.shape().to_vec(), self.dtype())
    }
}
