//! Element types.

use std::fmt;

/// The element type of a tensor.
///
/// `F32`, `F16` and `BF16` are the compute types; `U32` and `I64` hold indices
/// (token ids, `argmax` results) and comparison masks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    U32,
    I64,
}

impl DType {
    /// Every dtype, in a stable order (used by reports and tests).
    pub const ALL: [DType; 5] = [DType::F32, DType::F16, DType::BF16, DType::U32, DType::I64];
    /// The floating-point dtypes, on which arithmetic is defined.
    pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::U32 => 4,
            DType::I64 => 8,
        }
    }

    /// True for `F32`, `F16` and `BF16`.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// The short name used in messages and reports (`f32`, `bf16`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::U32 => "u32",
            DType::I64 => "i64",
        }
    }

    /// The code that WGSL kernels use for this dtype (`override` constants).
    pub(crate) fn gpu_code(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::BF16 => 2,
            DType::U32 => 3,
            DType::I64 => 4,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Rust element types that map to a [`DType`]; used by `from_slice` and `to_vec`.
pub trait Element: Copy + Send + Sync + 'static + bytemuck::Pod {
    /// The dtype of this element type.
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
}
impl Element for u32 {
    const DTYPE: DType = DType::U32;
}
impl Element for i64 {
    const DTYPE: DType = DType::I64;
}
