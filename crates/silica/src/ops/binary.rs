//! Elementwise functions of two tensors with numpy broadcasting, their
//! scalar forms, comparisons and `where`.

use crate::dispatch::run;
use crate::layout::broadcast_shapes;
use crate::{DType, Error, Op, Result, Tensor};

/// Elementwise binary arithmetic. The discriminant is the GPU kernel's `OP`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
    Pow,
    /// `silu(a) * b`: the gated unit of SwiGLU feed-forward blocks, in one pass.
    SiluMul,
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 8] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Pow,
        BinaryOp::SiluMul,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::Pow => "pow",
            BinaryOp::SiluMul => "silu_mul",
        }
    }

    pub fn scalar_name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add_scalar",
            BinaryOp::Sub => "sub_scalar",
            BinaryOp::Mul => "mul_scalar",
            BinaryOp::Div => "div_scalar",
            BinaryOp::Maximum => "maximum_scalar",
            BinaryOp::Minimum => "minimum_scalar",
            BinaryOp::Pow => "pow_scalar",
            BinaryOp::SiluMul => "silu_mul_scalar",
        }
    }

    /// The reference definition, in f64.
    pub fn apply(self, a: f64, b: f64) -> f64 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Maximum => a.max(b),
            BinaryOp::Minimum => a.min(b),
            BinaryOp::Pow => a.powf(b),
            BinaryOp::SiluMul => a / (1.0 + (-a).exp()) * b,
        }
    }
}

/// Elementwise comparisons; they produce `U32` masks (1 where true, 0 where
/// false). The GPU kernel's `OP` is `16 + discriminant`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub const ALL: [CmpOp; 6] = [
        CmpOp::Eq,
        CmpOp::Ne,
        CmpOp::Lt,
        CmpOp::Le,
        CmpOp::Gt,
        CmpOp::Ge,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        }
    }

    /// The reference definition.
    pub fn apply(self, a: f64, b: f64) -> bool {
        match self {
            CmpOp::Eq => a == b,
            CmpOp::Ne => a != b,
            CmpOp::Lt => a < b,
            CmpOp::Le => a <= b,
            CmpOp::Gt => a > b,
            CmpOp::Ge => a >= b,
        }
    }
}

impl Tensor {
    /// Broadcasts both operands to their common shape (zero-copy views).
    fn broadcast_pair(&self, other: &Tensor, op: &'static str) -> Result<(Tensor, Tensor)> {
        self.same_device(other, op)?;
        if self.dtype() != other.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: self.dtype(),
                rhs: other.dtype(),
            });
        }
        let shape = broadcast_shapes(op, self.shape(), other.shape())?;
        Ok((self.broadcast_to(&shape)?, other.broadcast_to(&shape)?))
    }

    /// `op(self, other)` elementwise with numpy broadcasting.
    pub fn binary(&self, other: &Tensor, op: BinaryOp) -> Result<Tensor> {
        let (a, b) = self.broadcast_pair(other, op.name())?;
        run(Op::Binary(op), &[&a, &b], a.shape().to_vec(), a.dtype())
    }

    /// `op(self, scalar)` elementwise.
    pub fn binary_scalar(&self, scalar: f32, op: BinaryOp) -> Result<Tensor> {
        run(
            Op::BinaryScalar(op, scalar),
            &[self],
            self.shape().to_vec(),
            self.dtype(),
        )
    }

    /// `self <op> other` elementwise with broadcasting, as a `U32` mask.
    pub fn compare(&self, other: &Tensor, op: CmpOp) -> Result<Tensor> {
        let (a, b) = self.broadcast_pair(other, op.name())?;
        run(Op::Compare(op), &[&a, &b], a.shape().to_vec(), DType::U32)
    }

    /// Picks `on_true` where `self` (the condition, any dtype) is non-zero and
    /// `on_false` elsewhere; all three broadcast together.
    pub fn where_cond(&self, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        let op = "where";
        self.same_device(on_true, op)?;
        self.same_device(on_false, op)?;
        if on_true.dtype() != on_false.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: on_true.dtype(),
                rhs: on_false.dtype(),
            });
        }
        let shape = broadcast_shapes(op, self.shape(), on_true.shape())?;
        let shape = broadcast_shapes(op, &shape, on_false.shape())?;
        let c = self.broadcast_to(&shape)?;
        let a = on_true.broadcast_to(&shape)?;
        let b = on_false.broadcast_to(&shape)?;
        run(Op::Where, &[&c, &a, &b], shape, a.dtype())
    }
}

macro_rules! binary_methods {
    ($($fn_name:ident, $scalar_name:ident => $op:ident);* $(;)?) => {
        impl Tensor {
            $(
                #[doc = concat!("Elementwise `", stringify!($fn_name), "` with numpy broadcasting.")]
                pub fn $fn_name(&self, other: &Tensor) -> Result<Tensor> {
                    self.binary(other, BinaryOp::$op)
                }
                #[doc = concat!("Elementwise `", stringify!($fn_name), "` with a scalar right operand.")]
                pub fn $scalar_name(&self, scalar: f32) -> Result<Tensor> {
                    self.binary_scalar(scalar, BinaryOp::$op)
                }
            )*
        }
    };
}

binary_methods!(
    add, add_scalar => Add;
    sub, sub_scalar => Sub;
    mul, mul_scalar => Mul;
    div, div_scalar => Div;
    maximum, maximum_scalar => Maximum;
    minimum, minimum_scalar => Minimum;
    pow, pow_scalar => Pow;
    silu_mul, silu_mul_scalar => SiluMul;
);

impl Tensor {
    /// SwiGLU's gate: `silu(self) * up` elementwise with broadcasting, in one
    /// kernel (`self` is the gate projection).
    ///
    /// ```
    /// use silica::{DType, Device, Tensor};
    /// let dev = Device::cpu();
    /// let gate = Tensor::from_slice(&[0.0f32, 1.0], &[2], &dev)?;
    /// let up = Tensor::from_slice(&[2.0f32, 2.0], &[2], &dev)?;
    /// let y: Vec<f32> = gate.swiglu(&up)?.to_vec()?;
    /// assert!((y[1] - 2.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);
    /// # Ok::<(), silica::Error>(())
    /// ```
    pub fn swiglu(&self, up: &Tensor) -> Result<Tensor> {
        self.silu_mul(up)
    }
}

macro_rules! cmp_methods {
    ($($fn_name:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(
                #[doc = concat!("Elementwise `", stringify!($fn_name), "` comparison with broadcasting; a `U32` mask.")]
                pub fn $fn_name(&self, other: &Tensor) -> Result<Tensor> {
                    self.compare(other, CmpOp::$op)
                }
            )*
        }
    };
}

cmp_methods!(eq => Eq, ne => Ne, lt => Lt, le => Le, gt => Gt, ge => Ge);
