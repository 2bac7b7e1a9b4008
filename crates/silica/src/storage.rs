//! Where tensor elements live: host vectors or GPU buffers.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::backend::gpu::GpuBuffer;
use crate::layout::Layout;
use crate::memory::HostBlock;
use crate::{DType, Element, Result};

/// The storage behind one or more tensor views.
pub(crate) enum Storage {
    /// Host elements and their place in the CPU device's counters (held
    /// for its `Drop`, which gives the bytes back).
    Cpu(CpuStorage, #[allow(dead_code)] HostBlock),
    Gpu(GpuBuffer),
}

impl Storage {
    /// Host storage, counted against the CPU device's memory limit.
    pub(crate) fn host(data: CpuStorage) -> Result<Storage> {
        let block = HostBlock::take(data.as_bytes().len() as u64)?;
        Ok(Storage::Cpu(data, block))
    }
}

/// Host elements, typed.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum CpuStorage {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    U32(Vec<u32>),
    I64(Vec<i64>),
}

/// Applies `$body` to the vector inside a `CpuStorage`, whatever its type,
/// and wraps a vector result back into the same variant.
macro_rules! map_cpu {
    ($s:expr, $v:ident => $body:expr) => {
        match $s {
            CpuStorage::F32($v) => CpuStorage::F32($body),
            CpuStorage::F16($v) => CpuStorage::F16($body),
            CpuStorage::BF16($v) => CpuStorage::BF16($body),
            CpuStorage::U32($v) => CpuStorage::U32($body),
            CpuStorage::I64($v) => CpuStorage::I64($body),
        }
    };
}
pub(crate) use map_cpu;

/// Like `map_cpu!`, for bodies that return something other than a vector.
macro_rules! with_cpu {
    ($s:expr, $v:ident => $body:expr) => {
        match $s {
            CpuStorage::F32($v) => $body,
            CpuStorage::F16($v) => $body,
            CpuStorage::BF16($v) => $body,
            CpuStorage::U32($v) => $body,
            CpuStorage::I64($v) => $body,
        }
    };
}

/// Conversions between element types and f64, the reference precision.
pub(crate) trait Scalar: Element {
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
}

impl Scalar for f32 {
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}
impl Scalar for f16 {
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        // via f32, as the GPU does: both round to nearest even
        f16::from_f32(v as f32)
    }
}
impl Scalar for bf16 {
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        bf16::from_f32(v as f32)
    }
}
impl Scalar for u32 {
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as u32 // saturating, NaN to 0
    }
}
impl Scalar for i64 {
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as i64
    }
}

impl CpuStorage {
    pub fn dtype(&self) -> DType {
        match self {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F16(_) => DType::F16,
            CpuStorage::BF16(_) => DType::BF16,
            CpuStorage::U32(_) => DType::U32,
            CpuStorage::I64(_) => DType::I64,
        }
    }

    pub fn len(&self) -> usize {
        with_cpu!(self, v => v.len())
    }

    pub fn from_slice<T: Element>(data: &[T]) -> Self {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        Self::from_bytes(T::DTYPE, bytes)
    }

    /// Takes ownership of a typed vector without copying it.
    pub fn from_vec<T: Element>(data: Vec<T>) -> Self {
        // invariant: T::DTYPE names T's own type, so each cast is T -> T
        let cast = "Element::DTYPE matches the element type";
        match T::DTYPE {
            DType::F32 => CpuStorage::F32(
                bytemuck::allocation::try_cast_vec(data).unwrap_or_else(|_| unreachable!("{cast}")),
            ),
            DType::F16 => CpuStorage::F16(
                bytemuck::allocation::try_cast_vec(data).unwrap_or_else(|_| unreachable!("{cast}")),
            ),
            DType::BF16 => CpuStorage::BF16(
                bytemuck::allocation::try_cast_vec(data).unwrap_or_else(|_| unreachable!("{cast}")),
            ),
            DType::U32 => CpuStorage::U32(
                bytemuck::allocation::try_cast_vec(data).unwrap_or_else(|_| unreachable!("{cast}")),
            ),
            DType::I64 => CpuStorage::I64(
                bytemuck::allocation::try_cast_vec(data).unwrap_or_else(|_| unreachable!("{cast}")),
            ),
        }
    }

    /// Elements from little-endian bytes (`bytes.len()` is a multiple of the element size).
    pub fn from_bytes(dtype: DType, bytes: &[u8]) -> Self {
        fn v<T: bytemuck::Pod>(b: &[u8]) -> Vec<T> {
            // pod_collect_to_vec copies, so the source needs no alignment
            bytemuck::pod_collect_to_vec(b)
        }
        match dtype {
            DType::F32 => CpuStorage::F32(v(bytes)),
            DType::F16 => CpuStorage::F16(v(bytes)),
            DType::BF16 => CpuStorage::BF16(v(bytes)),
            DType::U32 => CpuStorage::U32(v(bytes)),
            DType::I64 => CpuStorage::I64(v(bytes)),
        }
    }

    /// The elements as `T`, when `T` is their type.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        if T::DTYPE != self.dtype() {
            return None;
        }
        with_cpu!(self, v => bytemuck::try_cast_slice(v.as_slice()).ok())
    }

    pub fn as_bytes(&self) -> &[u8] {
        with_cpu!(self, v => bytemuck::cast_slice(v.as_slice()))
    }

    pub fn from_f64(values: &[f64], dtype: DType) -> Self {
        fn conv<T: Scalar>(values: &[f64]) -> Vec<T> {
            values.iter().map(|&x| T::from_f64(x)).collect()
        }
        match dtype {
            DType::F32 => CpuStorage::F32(conv(values)),
            DType::F16 => CpuStorage::F16(conv(values)),
            DType::BF16 => CpuStorage::BF16(conv(values)),
            DType::U32 => CpuStorage::U32(conv(values)),
            DType::I64 => CpuStorage::I64(conv(values)),
        }
    }

    pub fn full(value: f64, n: usize, dtype: DType) -> Self {
        fn fill<T: Scalar>(value: f64, n: usize) -> Vec<T> {
            vec![T::from_f64(value); n]
        }
        match dtype {
            DType::F32 => CpuStorage::F32(fill(value, n)),
            DType::F16 => CpuStorage::F16(fill(value, n)),
            DType::BF16 => CpuStorage::BF16(fill(value, n)),
            DType::U32 => CpuStorage::U32(fill(value, n)),
            DType::I64 => CpuStorage::I64(fill(value, n)),
        }
    }

    /// The elements of the view `layout`, contiguous.
    pub fn gather(&self, layout: &Layout) -> CpuStorage {
        if layout.is_contiguous() {
            let start = layout.offset();
            let end = start + layout.numel();
            return map_cpu!(self, v => v[start..end].to_vec());
        }
        map_cpu!(self, v => layout.offsets().map(|o| v[o]).collect())
    }

    /// Overwrites elements `offset..offset + src.len()` with `src` (same dtype).
    pub fn write_at(&mut self, offset: usize, src: &CpuStorage) {
        match (self, src) {
            (CpuStorage::F32(d), CpuStorage::F32(s)) => {
                d[offset..offset + s.len()].copy_from_slice(s)
            }
            (CpuStorage::F16(d), CpuStorage::F16(s)) => {
                d[offset..offset + s.len()].copy_from_slice(s)
            }
            (CpuStorage::BF16(d), CpuStorage::BF16(s)) => {
                d[offset..offset + s.len()].copy_from_slice(s)
            }
            (CpuStorage::U32(d), CpuStorage::U32(s)) => {
                d[offset..offset + s.len()].copy_from_slice(s)
            }
            (CpuStorage::I64(d), CpuStorage::I64(s)) => {
                d[offset..offset + s.len()].copy_from_slice(s)
            }
            // invariant: the caller checked that the dtypes match
            _ => unreachable!("write_at between storages of different dtypes"),
        }
    }

    /// The elements of the view `layout` as f32 (floats and integers).
    pub fn gather_f32(&self, layout: &Layout) -> Vec<f32> {
        fn g<T: Scalar>(v: &[T], layout: &Layout) -> Vec<f32> {
            layout.offsets().map(|o| v[o].to_f64() as f32).collect()
        }
        fn halves<T>(v: &[T], layout: &Layout) -> Vec<f32>
        where
            [T]: HalfFloatSliceExt,
        {
            let mut out = vec![0f32; layout.numel()];
            v[layout.offset()..layout.offset() + layout.numel()].convert_to_f32_slice(&mut out);
            out
        }
        match self {
            CpuStorage::F32(v) if layout.is_contiguous() => {
                v[layout.offset()..layout.offset() + layout.numel()].to_vec()
            }
            CpuStorage::F32(v) => match layout.shape().split_last() {
                // rows contiguous in memory (a KV cache's view): one copy per row
                Some((&len, outer)) if layout.strides().last() == Some(&1) && len >= 8 => {
                    let strides = &layout.strides()[..outer.len()];
                    let rows = Layout::new(outer.to_vec(), strides.to_vec(), layout.offset());
                    let mut out = Vec::with_capacity(layout.numel());
                    rows.offsets()
                        .for_each(|o| out.extend_from_slice(&v[o..o + len]));
                    out
                }
                _ => layout.offsets().map(|o| v[o]).collect(),
            },
            // contiguous halves: the slice conversion (F16C where the CPU has it)
            CpuStorage::F16(v) if layout.is_contiguous() => halves(v, layout),
            CpuStorage::BF16(v) if layout.is_contiguous() => halves(v, layout),
            CpuStorage::F16(v) => g(v, layout),
            CpuStorage::BF16(v) => g(v, layout),
            CpuStorage::U32(v) => g(v, layout),
            CpuStorage::I64(v) => g(v, layout),
        }
    }

    /// f32 results stored as `dtype` (round to nearest even).
    pub fn from_f32(values: Vec<f32>, dtype: DType) -> Self {
        match dtype {
            DType::F32 => CpuStorage::F32(values),
            DType::F16 => CpuStorage::F16(values.iter().map(|&x| f16::from_f32(x)).collect()),
            DType::BF16 => CpuStorage::BF16(values.iter().map(|&x| bf16::from_f32(x)).collect()),
            DType::U32 => CpuStorage::U32(values.iter().map(|&x| x as u32).collect()),
            DType::I64 => CpuStorage::I64(values.iter().map(|&x| x as i64).collect()),
        }
    }

    pub fn to_f64(&self) -> Vec<f64> {
        with_cpu!(self, v => v.iter().map(|x| Scalar::to_f64(*x)).collect())
    }

    /// The elements as `&[T]` when the storage holds `T` (`_like` only names the type).
    pub fn as_typed<T: Element>(&self, _like: &[T]) -> Option<&[T]> {
        if T::DTYPE != self.dtype() {
            return None;
        }
        with_cpu!(self, v => bytemuck::try_cast_slice(v.as_slice()).ok())
    }

    pub fn into_vec<T: Element>(self) -> Option<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return None;
        }
        Some(with_cpu!(self, v => bytemuck::allocation::try_cast_vec(v).ok()?))
    }
}
