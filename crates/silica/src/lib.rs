//! silica: tensors on every GPU from Rust.
//!
//! One WGSL kernel source runs on Metal, Vulkan and DX12 through wgpu, and a
//! multi-threaded CPU backend covers machines without a GPU. Every op works
//! on every device: where a GPU has no kernel for an op, the op runs on the
//! CPU, is counted in [`GpuDevice::fallback_report`] and warned about once,
//! and is an error under `SILICA_STRICT=1`.
//!
//! ```
//! use silica::{DType, Device, Tensor};
//! let dev = Device::best()?; // SILICA_DEVICE, else the best GPU, else the CPU
//! let a = Tensor::randn(&[64, 32], DType::F16, 0, &dev)?;
//! let b = a.matmul(&a.t()?)?.softmax(-1)?.to_dtype(DType::F32)?;
//! let v: Vec<f32> = b.to_vec()?;
//! assert_eq!(v.len(), 64 * 64);
//! println!("{:?}", dev.memory_stats());
//! dev.synchronize()?;
//! # Ok::<(), silica::Error>(())
//! ```

pub mod autograd;
pub mod backend;
pub mod config;
pub mod custom;
mod device;
mod dispatch;
mod dtype;
mod error;
mod fused;
mod layout;
mod memory;
pub mod ops;
mod qtensor;
pub mod quant;
mod storage;
mod tensor;

pub use backend::cpu::{
    CpuIsa, cpu_int8_activations, cpu_isa, cpu_isa_available, set_cpu_int8_activations, set_cpu_isa,
};
pub use backend::gpu::{FallbackCount, GpuDevice, GpuFeatures, KernelNeeds, KernelTime};
pub use config::GpuOptions;
pub use device::{
    BackendKind, Device, DeviceInfo, Selector, adapters, default_gpu_index, device_count,
    is_available, save_pipeline_caches,
};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use layout::{Layout, broadcast_shapes};
pub use memory::MemoryStats;
pub use ops::{
    AttentionOpts, BinaryOp, CacheSeq, CacheSeqs, CachedAttentionOpts, CmpOp, Op, QFusion,
    ReduceOp, RopeStyle, UnaryOp,
};
pub use qtensor::{QFuse, QTensor};
pub use quant::QuantFormat;
pub use tensor::{PendingRead, Tensor};
