//! What a device runs with: the adapter's features, less those that
//! [`GpuOptions`] turns off, and what each kernel needs of them.

use crate::config::GpuOptions;

/// What a GPU device runs with (see `GpuDevice::features`): the adapter's
/// features less those its [`GpuOptions`] turned off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuFeatures {
    /// 16x16x16 f16 cooperative matrices with f32 accumulators and
    /// subgroups of exactly 32: the tensor-core kernels can run.
    pub coop16: bool,
    /// 8x8x8 f16 cooperative matrices on an Apple GPU (simdgroups of 32).
    pub coop8: bool,
    /// The width of the subgroups that reductions run on; 0 where they
    /// keep their trees in workgroup memory.
    pub subgroup_width: u32,
    /// 16-bit floats in shaders (`enable f16`).
    pub f16: bool,
    /// Bytes of immediate data (push constants) kernel parameters may use;
    /// 0: parameters go in uniform buffers.
    pub immediate_bytes: u32,
    /// Tensor buffers are mapped by the host (unified memory): uploads and
    /// read-backs need no staging copies.
    pub mapped_buffers: bool,
    /// The adapter runs packed 8-bit dot products as one instruction: the
    /// default of `GpuDevice::int8_activations`.
    pub integer_dots: bool,
    /// Dispatches recorded before a batch is submitted.
    pub submit_every: u32,
    /// Dispatches of the first batch after the GPU was found idle (at most
    /// `submit_every`).
    pub first_batch: u32,
    /// Rows of x up to which quantized products may take the GEMV kernels
    /// (in chunks of up to 8).
    pub gemv_rows: u32,
    /// Most parts of K a quantized product of many rows is split into on
    /// the cooperative-matrix kernel.
    pub split_k: u32,
    /// Rows of f16 x from which quantized products take the
    /// cooperative-matrix kernel (where `coop16`).
    pub coop_rows: u32,
    /// qmatmul_narrow.wgsl and matmul_narrow.wgsl run: `coop16` and subgroup barriers, and
    /// [`GpuOptions::narrow_kernel`].
    pub narrow: bool,
    /// Rows of f16 x from which quantized products decode their weights
    /// into f16 and take the f16 tensor-core kernels (0: never).
    pub decoded_rows: u32,
    /// Rows of f16 x from which quantized products multiply an f16 copy of
    /// their weights kept beside them (0: never).
    pub keep_decoded: u32,
}

impl GpuFeatures {
    /// The features of `adapter` under `opts`.
    pub(crate) fn probe(adapter: &wgpu::Adapter, opts: &GpuOptions) -> GpuFeatures {
        let coop16 = opts.cooperative_matrix && coop16_available(adapter);
        let coop8 = opts.cooperative_matrix && !coop16 && coop8_available(adapter);
        let immediate_bytes =
            if opts.immediates && adapter.features().contains(wgpu::Features::IMMEDIATES) {
                adapter.limits().max_immediate_size.min(IMMEDIATE_BYTES)
            } else {
                0
            };
        GpuFeatures {
            coop16,
            coop8,
            subgroup_width: subgroup_width(adapter, opts),
            f16: adapter.features().contains(wgpu::Features::SHADER_F16),
            immediate_bytes,
            mapped_buffers: opts.mapped_buffers && unified_memory(adapter),
            integer_dots: integer_dots(adapter),
            submit_every: opts.submit_every.clamp(1, crate::config::MAX_SUBMIT_EVERY),
            first_batch: opts.first_batch.clamp(
                1,
                opts.submit_every.clamp(1, crate::config::MAX_SUBMIT_EVERY),
            ),
            gemv_rows: opts
                .gemv_rows
                .clamp(crate::config::MIN_GEMV_ROWS, crate::config::MAX_GEMV_ROWS),
            split_k: opts.split_k.clamp(1, crate::config::MAX_SPLIT_K),
            coop_rows: opts
                .coop_rows
                .clamp(crate::config::MIN_COOP_ROWS, crate::config::MAX_COOP_ROWS),
            narrow: coop16
                && opts.narrow_kernel
                && adapter
                    .features()
                    .contains(wgpu::Features::SUBGROUP | wgpu::Features::SUBGROUP_BARRIER),
            decoded_rows: opts.decoded_rows,
            keep_decoded: match opts.keep_decoded {
                0 => 0,
                n => n.max(crate::config::MIN_KEPT_ROWS),
            },
        }
    }

    /// Whether a kernel that needs `needs` can run with these features.
    pub fn runs(&self, needs: KernelNeeds) -> bool {
        (!needs.f16 || self.f16)
            && (!needs.subgroups || self.subgroup_width > 0)
            && (!needs.coop16 || self.coop16)
            && (!needs.coop8 || self.coop8)
    }
}

/// What a kernel needs of the device beyond plain WGSL; a kernel whose
/// needs the device lacks is never built there and its op takes another
/// kernel or the CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelNeeds {
    /// `enable f16;`
    pub f16: bool,
    /// Subgroup operations, with subgroups of one fixed width.
    pub subgroups: bool,
    /// 16x16 cooperative matrices (and subgroups of 32).
    pub coop16: bool,
    /// 8x8 cooperative matrices (Apple GPUs).
    pub coop8: bool,
}

impl KernelNeeds {
    /// Plain WGSL: runs on every device.
    pub const NOTHING: KernelNeeds = KernelNeeds {
        f16: false,
        subgroups: false,
        coop16: false,
        coop8: false,
    };
    /// `enable f16;`
    pub const F16: KernelNeeds = KernelNeeds {
        f16: true,
        ..Self::NOTHING
    };
    /// Subgroup operations.
    pub const SUBGROUPS: KernelNeeds = KernelNeeds {
        subgroups: true,
        ..Self::NOTHING
    };
    /// 16x16 cooperative matrices with f16 operands (the feature implies
    /// subgroups of 32, whether or not reductions use them).
    pub const COOP16: KernelNeeds = KernelNeeds {
        f16: true,
        coop16: true,
        ..Self::NOTHING
    };
    /// 8x8 cooperative matrices with f16 operands.
    pub const COOP8: KernelNeeds = KernelNeeds {
        f16: true,
        coop8: true,
        ..Self::NOTHING
    };
}

/// Immediate data asked of the device at most: the largest parameter block
/// of any kernel. Where the adapter offers less (lavapipe: 128 bytes), the
/// kernels whose parameters do not fit read them from a uniform buffer.
pub(super) const IMMEDIATE_BYTES: u32 = 256;

/// The subgroup width of the adapter where kernels reduce through subgroup
/// operations (rows_sg.wgsl, lanes_sg.wgsl, scores_sg.wgsl), 0 where they
/// keep their trees in workgroup memory: the adapter has subgroup
/// operations and its subgroups all have one width of 4 or more (Metal
/// reports 4..64 whatever the GPU: Apple GPUs, 32 wide, are told by name).
/// [`GpuOptions::subgroups`] off keeps the trees.
fn subgroup_width(adapter: &wgpu::Adapter, opts: &GpuOptions) -> u32 {
    if !opts.subgroups || !adapter.features().contains(wgpu::Features::SUBGROUP) {
        return 0;
    }
    let info = adapter.get_info();
    if info.backend == wgpu::Backend::Metal {
        return if info.name.starts_with("Apple") {
            32
        } else {
            0
        };
    }
    let fixed = info.subgroup_min_size == info.subgroup_max_size && info.subgroup_min_size >= 4;
    if fixed { info.subgroup_min_size } else { 0 }
}

/// Whether the adapter offers `m`x`m`x`m` cooperative matrices of f16
/// operands with f32 accumulators, and the features their kernels need.
fn coop_config(adapter: &wgpu::Adapter, m: u32) -> bool {
    use wgpu::CooperativeScalarType as T;
    let need = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
    adapter.features().contains(need)
        && adapter.cooperative_matrix_properties().iter().any(|c| {
            (c.m_size, c.n_size, c.k_size) == (m, m, m)
                && c.ab_type == T::F16
                && c.cr_type == T::F32
        })
}

/// Whether the adapter runs the kernels on 16x16 cooperative matrices
/// (matmul_coop, coop_tiles, flash_coop): subgroups of
/// exactly 32 (the kernels split their threads into subgroups of 32), and
/// subgroup operations (flash_coop swaps values between lanes).
fn coop16_available(adapter: &wgpu::Adapter) -> bool {
    let info = adapter.get_info();
    // coop_tiles.wgsl loads fragments through vec4<f16> pointers, which
    // MSL cannot pass where it expects pointers to halves; Apple GPUs
    // offer 8x8 matrices only anyway
    coop_config(adapter, 16)
        && adapter.features().contains(wgpu::Features::SUBGROUP)
        && info.backend != wgpu::Backend::Metal
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
}

/// Whether the adapter runs matmul_coop.wgsl on 8x8 fragments (coop8.wgsl):
/// an Apple GPU through Metal, whose simdgroups are 32 threads wide (wgpu
/// reports Metal's subgroup sizes as 4..64 whatever the GPU, so the vendor
/// is what tells).
fn coop8_available(adapter: &wgpu::Adapter) -> bool {
    let info = adapter.get_info();
    coop_config(adapter, 8)
        && info.backend == wgpu::Backend::Metal
        && info.name.starts_with("Apple")
}

/// Whether the adapter shares the host's memory and lets tensor buffers be
/// mapped (`MAPPABLE_PRIMARY_BUFFERS`): an integrated GPU (Apple silicon,
/// laptop GPUs) or a software one (lavapipe). There uploads fill new
/// buffers in place and reads map them, with no staging copy; on a discrete
/// GPU mappable buffers would live in host memory, out of the GPU's reach
/// at full speed.
fn unified_memory(adapter: &wgpu::Adapter) -> bool {
    let info = adapter.get_info();
    adapter
        .features()
        .contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS)
        && matches!(
            info.device_type,
            wgpu::DeviceType::IntegratedGpu | wgpu::DeviceType::Cpu
        )
}

/// Whether the quantized decode GEMVs take integer dot products of x
/// rounded to 8 bits (qgemv_i8.wgsl) rather than f32 products: on GPUs
/// through Vulkan, whose drivers run a packed 4x8-bit dot product as one
/// instruction (dp4a on NVIDIA, AMD's dot4 and Intel's DP4A) where wgpu
/// turns on SPIR-V's DotProduct capability. Metal has no such instruction
/// (naga writes it out as shifts and multiplies), nor do CPU adapters.
fn integer_dots(adapter: &wgpu::Adapter) -> bool {
    let info = adapter.get_info();
    info.backend == wgpu::Backend::Vulkan
        && matches!(
            info.device_type,
            wgpu::DeviceType::DiscreteGpu | wgpu::DeviceType::IntegratedGpu
        )
}
