//! Dequantization of GGUF tensors to f32. The block formats (their layouts,
//! decoding and the reference quantizers) live in [`silica::quant`], which
//! the device kernels share; this module maps GGUF types onto them.

use half::{bf16, f16};
use rayon::prelude::*;
pub use silica::QuantFormat;
pub use silica::quant::{QK, QK_K, quantize_q4_0, quantize_q4_1, quantize_q8_0};

use crate::gguf::GgmlType;

/// Below this many elements, decode on the calling thread.
const PARALLEL_MIN: usize = 1 << 16;
/// Elements per rayon task (at least).
const TASK_MIN: usize = 1 << 14;
/// Why a tensor could not be dequantized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// silica has no dequantizer for this type.
    #[error("dequantizing {0} is not supported")]
    Unsupported(GgmlType),
    /// The element count is not a whole number of blocks.
    #[error("{numel} elements are not a whole number of {ty} blocks of {block}")]
    PartialBlock {
        ty: GgmlType,
        numel: usize,
        block: usize,
    },
    /// The data is not exactly the size `numel` elements need.
    #[error("{numel} elements of {ty} need {expected} bytes, got {got}")]
    Length {
        ty: GgmlType,
        numel: usize,
        expected: usize,
        got: usize,
    },
}

/// The block format of `ty` in which silica can keep weights quantized.
pub fn quant_format(ty: GgmlType) -> Option<QuantFormat> {
    Some(match ty {
        GgmlType::Q8_0 => QuantFormat::Q8_0,
        GgmlType::Q4_0 => QuantFormat::Q4_0,
        GgmlType::Q4_1 => QuantFormat::Q4_1,
        GgmlType::Q5_0 => QuantFormat::Q5_0,
        GgmlType::Q5_1 => QuantFormat::Q5_1,
        GgmlType::Q4_K => QuantFormat::Q4_K,
        GgmlType::Q5_K => QuantFormat::Q5_K,
        GgmlType::Q6_K => QuantFormat::Q6_K,
        _ => return None,
    })
}

/// The GGML type of a block format.
pub fn ggml_type(format: QuantFormat) -> GgmlType {
    match format {
        QuantFormat::Q8_0 => GgmlType::Q8_0,
        QuantFormat::Q4_0 => GgmlType::Q4_0,
        QuantFormat::Q4_1 => GgmlType::Q4_1,
        QuantFormat::Q5_0 => GgmlType::Q5_0,
        QuantFormat::Q5_1 => GgmlType::Q5_1,
        QuantFormat::Q4_K => GgmlType::Q4_K,
        QuantFormat::Q5_K => GgmlType::Q5_K,
        QuantFormat::Q6_K => GgmlType::Q6_K,
    }
}

/// Whether [`dequantize`] can decode `ty`.
pub fn is_supported(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16 | BF16 | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q4_K | Q5_K | Q6_K
    )
}

/// Decodes `numel` elements of type `ty` from `bytes`, which must hold
/// exactly that many (whole blocks).
pub fn dequantize(ty: GgmlType, bytes: &[u8], numel: usize) -> Result<Vec<f32>, QuantError> {
    let (Some(block), Some(type_size)) = (ty.block_size(), ty.type_size()) else {
        return Err(QuantError::Unsupported(ty));
    };
    if !is_supported(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    if !numel.is_multiple_of(block) {
        return Err(QuantError::PartialBlock { ty, numel, block });
    }
    let expected = (numel / block).checked_mul(type_size);
    if expected != Some(bytes.len()) {
        return Err(QuantError::Length {
            ty,
            numel,
            expected: expected.unwrap_or(usize::MAX),
            got: bytes.len(),
        });
    }
    Ok(match ty {
        GgmlType::F32 => elements::<4>(bytes, |x| f32::from_le_bytes(*x)),
        GgmlType::F16 => elements::<2>(bytes, |x| f16::from_le_bytes(*x).to_f32()),
        GgmlType::BF16 => elements::<2>(bytes, |x| bf16::from_le_bytes(*x).to_f32()),
        _ => match quant_format(ty) {
            Some(format) => silica::quant::dequantize(format, bytes),
            None => return Err(QuantError::Unsupported(ty)),
        },
    })
}

/// Applies `f` to each `TS`-byte element of `bytes`, in parallel for large
/// inputs (the unquantized types; blocks decode in `silica::quant`).
fn elements<const TS: usize>(bytes: &[u8], f: impl Fn(&[u8; TS]) -> f32 + Sync + Send) -> Vec<f32> {
    let (src, _) = bytes.as_chunks::<TS>();
    if src.len() >= PARALLEL_MIN {
        src.par_iter().with_min_len(TASK_MIN).map(f).collect()
    } else {
        src.iter().map(f).collect()
    }
}
