//! What every launcher needs: the buffer of a tensor, sizes as 32-bit
//! kernel parameters, and the parameter block's layout.

use crate::memory::GpuBuffer;
use crate::storage::Storage;
use crate::{Error, Result, Tensor};

/// Most dimensions a kernel takes (after merging contiguous ones).
pub(crate) const MAX_RANK: usize = 8;

/// The device buffer of a GPU tensor.
pub(crate) fn buffer(t: &Tensor) -> &GpuBuffer {
    match t.storage() {
        Storage::Gpu(b) => b,
        // invariant: the dispatcher only hands GPU tensors to GPU kernels
        Storage::Cpu(..) => unreachable!("GPU kernel given a CPU tensor"),
    }
}

pub(crate) fn to_u32(x: usize, what: &str) -> Result<u32> {
    u32::try_from(x).map_err(|_| Error::NotSupported {
        op: "gpu kernel",
        reason: format!("{what} {x} does not fit in 32 bits"),
    })
}

/// Shape or strides packed for a WGSL `array<vec4<u32>, 2>`.
pub(crate) fn pack(values: &[usize]) -> Result<[u32; MAX_RANK]> {
    if values.len() > MAX_RANK {
        return Err(Error::NotSupported {
            op: "gpu kernel",
            reason: format!(
                "{} dimensions after merging (at most {MAX_RANK})",
                values.len()
            ),
        });
    }
    let mut out = [0u32; MAX_RANK];
    for (o, &v) in out.iter_mut().zip(values) {
        *o = to_u32(v, "a dimension or stride")?;
    }
    Ok(out)
}

/// Uniform bytes: a header of scalars (padded to 16 bytes), then packed arrays.
pub(crate) fn params(header: &[u32], arrays: &[[u32; MAX_RANK]]) -> Vec<u8> {
    let mut words = header.to_vec();
    words.resize(header.len().next_multiple_of(4), 0);
    for a in arrays {
        words.extend_from_slice(a);
    }
    bytemuck::cast_slice(&words).to_vec()
}
