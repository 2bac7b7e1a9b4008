//! What every GPU kernel launch needs: the wgpu device and queue, the one
//! pending command encoder that ops record into, the pipeline cache, and
//! the device-lost and error state.

use hashbrown::{Equivalent, HashMap};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::memory::{GpuBuffer, MemoryPool, tensor_entries};
use crate::{DeviceInfo, Error, Result};

/// Threads per workgroup of the one-dimensional kernels.
pub(crate) const WG: u32 = 256;

/// Most dispatches in one submitted batch (the profiling query set holds
/// two timestamps for each).
const DISPATCH_BUDGET: u32 = 1024;

/// Dispatches recorded before the pending encoder is submitted without
/// waiting, unless `SILICA_SUBMIT_EVERY` says otherwise: small enough that
/// the GPU starts on a long sequence of ops while the host still records
/// the rest, large enough that the cost of a submission stays small beside
/// the work it carries. Each batch also costs the GPU about 20 µs at its
/// start and end (an H100 decoding 1B Q4_0: 951 µs of GPU time a token in
/// one batch, 1,073 in six). Decode submits each step whole, its pick
/// included, before it waits for the token before it, so the GPU always
/// holds a step's work and a batch can be as long as a step. There
/// (twentieth session), 1B Q4_0 decoded at 920-974 tok/s with 32, 949-989
/// with 64, 995-1024 with 128, 990-1028 with 256 and 987-1001 with 1,024;
/// SmolLM2-135M Q4_1 (about 155 dispatches a step) at 880-923, 930-931,
/// 943-977, 968-981 and 971-1006; the small-op stream at 193,000-212,000
/// adds/s with 32 and 246,000-256,000 with 128.
const SUBMIT_EVERY: u32 = 256;

/// A WGSL module: `common.wgsl` followed by the family's file.
pub(crate) struct Kernel {
    pub name: &'static str,
    pub source: &'static str,
    /// Number of read-only storage inputs (bindings 1..=inputs); the
    /// outputs are the read-write bindings after them, the uniform params
    /// binding 0.
    pub inputs: usize,
    /// Number of read-write storage bindings: 1, or more for a kernel that
    /// also updates a buffer in place (the KV cache of `attention_step`).
    pub outputs: usize,
    /// Built without wgpu's runtime bounds checks and loop bounding: only
    /// for kernels whose every memory access is guarded by the launcher's
    /// own size checks (each index below the sizes it was given, the views
    /// inside their buffers) and whose loops all end.
    pub trusted: bool,
    /// The parameters may travel as immediates where they fit. The
    /// 128x128-tile matmul kernels read theirs from the uniform buffer: on
    /// an H100 the f32 one ran 18% slower with immediates (4096³: 5.05
    /// against 4.27 ms) and the f16 ones 3% slower, while the 64x64 one
    /// and the small kernels run faster with them (the 64x64 one 4-6%).
    pub immediates: bool,
}

/// Uploads from which unified memory writes new buffers in place: smaller
/// ones take a cached buffer of their size where there is one.
const MAPPED_UPLOAD_MIN: usize = 1 << 16;

/// A read-back under way (see [`Context::read_start`]).
pub(crate) struct PendingBytes {
    staging: wgpu::Buffer,
    rx: std::sync::mpsc::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
    /// The submission holding the copy (None: nothing was pending, which
    /// cannot happen since the copy itself is recorded)
    index: Option<wgpu::SubmissionIndex>,
}

/// A kernel, its override constants (as bits) and whether its parameters
/// are immediates.
#[derive(PartialEq, Eq)]
struct PipelineKey {
    name: &'static str,
    constants: Vec<(&'static str, u64)>,
    immediates: bool,
}

/// A [`PipelineKey`] as a dispatch has it, looked up without building one
/// (a dispatch finds its pipeline in the cache all but the first time).
struct PipelineQuery<'a> {
    name: &'static str,
    constants: &'a [(&'static str, f64)],
    immediates: bool,
}

/// The one hash of a [`PipelineKey`] and of its [`PipelineQuery`].
fn hash_pipeline<H: Hasher>(
    state: &mut H,
    name: &str,
    constants: impl ExactSizeIterator<Item = (&'static str, u64)>,
    immediates: bool,
) {
    name.hash(state);
    state.write_usize(constants.len());
    for c in constants {
        c.hash(state);
    }
    immediates.hash(state);
}

impl Hash for PipelineKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        hash_pipeline(
            state,
            self.name,
            self.constants.iter().copied(),
            self.immediates,
        );
    }
}

impl Hash for PipelineQuery<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let bits = self.constants.iter().map(|&(k, v)| (k, v.to_bits()));
        hash_pipeline(state, self.name, bits, self.immediates);
    }
}

impl Equivalent<PipelineKey> for PipelineQuery<'_> {
    fn equivalent(&self, key: &PipelineKey) -> bool {
        self.name == key.name
            && self.immediates == key.immediates
            && self.constants.len() == key.constants.len()
            && self
                .constants
                .iter()
                .zip(&key.constants)
                .all(|(&(k, v), &(kk, bits))| k == kk && v.to_bits() == bits)
    }
}

/// Immediate data asked of the device at most: the largest parameter block
/// of any kernel. Where the adapter offers less (lavapipe: 128 bytes), the
/// kernels whose parameters do not fit read them from a uniform buffer.
const IMMEDIATE_BYTES: u32 = 256;

/// How every kernel declares its parameters (binding 0 of its group).
const UNIFORM_PARAMS: &str = "@group(0) @binding(0) var<uniform> p:";

/// A kernel's WGSL as the device builds it: with `immediates`, the
/// parameters are read from immediate data (push constants) instead of a
/// uniform buffer, so that recording a dispatch writes them into the
/// command stream and the bind group holds only the tensors' buffers.
///
/// With `subgroups`, kernels that reduce through a tree in workgroup memory
/// take its subgroup form instead (see `SUBGROUP_FORMS`).
pub(crate) fn kernel_source(
    kernel: &Kernel,
    immediates: bool,
    subgroups: bool,
) -> std::borrow::Cow<'static, str> {
    let mut source = std::borrow::Cow::Borrowed(kernel.source);
    if immediates {
        source = source
            .replacen(UNIFORM_PARAMS, "var<immediate> p:", 1)
            .into();
    }
    if subgroups {
        for (tree, subgroup) in SUBGROUP_FORMS {
            if source.contains(tree) {
                source = source.replacen(tree, subgroup, 1).into();
            }
        }
    }
    source
}

/// Reductions through workgroup memory and their subgroup forms: rows
/// (softmax, norms, attention), the GEMV kernels' lane sets and the
/// decode attention's scores.
const SUBGROUP_FORMS: [(&str, &str); 3] = [
    (include_str!("rows.wgsl"), include_str!("rows_sg.wgsl")),
    (include_str!("lanes.wgsl"), include_str!("lanes_sg.wgsl")),
    (include_str!("scores.wgsl"), include_str!("scores_sg.wgsl")),
];

/// The subgroup width of the adapter where kernels reduce through subgroup
/// operations (rows_sg.wgsl, lanes_sg.wgsl, scores_sg.wgsl), 0 where they
/// keep their trees in workgroup memory: the adapter has subgroup
/// operations and its subgroups all have one width of 4 or more (Metal
/// reports 4..64 whatever the GPU: Apple GPUs, 32 wide, are told by name).
/// `SILICA_NO_SUBGROUPS=1` keeps the trees.
fn subgroup_width(adapter: &wgpu::Adapter) -> u32 {
    if std::env::var("SILICA_NO_SUBGROUPS").is_ok_and(|v| v == "1")
        || !adapter.features().contains(wgpu::Features::SUBGROUP)
    {
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

/// Bytes of one kernel's parameter slot in a slab (the largest uniform
/// offset alignment wgpu allows); a slab holds a slot per dispatch of a batch.
const SLOT_BYTES: u64 = 256;

/// Work recorded but not yet submitted.
struct Pending {
    /// The open compute pass that consecutive dispatches share; dropped
    /// (ended) before a copy is recorded and before submitting.
    pass: Option<wgpu::ComputePass<'static>>,
    encoder: Option<wgpu::CommandEncoder>,
    /// The uniform buffer that this batch's kernel parameters go into, one
    /// slot per dispatch. It stays mapped while slots are written and is
    /// unmapped just before the batch is submitted.
    slab: Option<wgpu::Buffer>,
    /// Filled slabs of this batch, to unmap at submit.
    full_slabs: Vec<wgpu::Buffer>,
    /// Next free byte of `slab`.
    slot: u64,
    dispatches: u32,
    /// Profiling mode: the kernel and grid of each timed dispatch of this
    /// batch; entry `i` owns queries `2i` (start) and `2i + 1` (end) of
    /// `Context::queries`.
    timed: Vec<(&'static str, [u32; 3])>,
}

/// The profile's name for the time of whole batches (per-batch timing).
pub(crate) const BATCH: &str = "(batches)";

/// How profiling mode puts timestamps around a dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timing {
    /// No timestamp queries: profiling records nothing.
    None,
    /// `TIMESTAMP_QUERY_INSIDE_PASSES`: timestamps written inside the
    /// shared compute pass, before and after the dispatch.
    InsidePass,
    /// `TIMESTAMP_QUERY` only: the dispatch gets a compute pass of its own
    /// that writes timestamps at its beginning and end.
    PerPass,
}

/// GPU time of one kernel in profiling mode (see
/// [`GpuDevice::set_profiling`](crate::GpuDevice::set_profiling)).
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// The kernel's name (its WGSL module), e.g. `qgemv`.
    pub name: String,
    /// The workgroup grid of the dispatches, in the breakdown by grid;
    /// `None` in the report by name, which sums every grid.
    pub grid: Option<[u32; 3]>,
    /// Dispatches timed.
    pub dispatches: u64,
    /// GPU seconds between the timestamps around each dispatch, summed.
    pub seconds: f64,
}

/// Read-only inputs, read-write outputs, parameters as immediates: what
/// sets a kernel's bind group and pipeline layouts apart.
type LayoutKey = (u32, u32, bool);

/// Shader modules by (kernel name, parameters as immediates).
type ModuleMap = HashMap<(&'static str, bool), wgpu::ShaderModule>;

/// Builds a kernel's shader module: naga parses and validates its WGSL.
fn create_module(
    device: &wgpu::Device,
    kernel: &Kernel,
    immediates: bool,
    subgroups: bool,
) -> wgpu::ShaderModule {
    let desc = wgpu::ShaderModuleDescriptor {
        label: Some(kernel.name),
        source: wgpu::ShaderSource::Wgsl(kernel_source(kernel, immediates, subgroups)),
    };
    if kernel.trusted {
        // SAFETY: `trusted` kernels guard every access themselves (see
        // Kernel::trusted); the parity suite runs each on edge shapes and
        // strided views.
        unsafe { device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
    } else {
        device.create_shader_module(desc)
    }
}

/// Dispatch count and GPU seconds of one (kernel, grid).
type ProfileMap = BTreeMap<(&'static str, [u32; 3]), (u64, f64)>;

pub(crate) struct Context {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub pool: Arc<MemoryPool>,
    name: String,
    /// 16x16x16 f16 cooperative matrices with f32 accumulation, subgroups
    /// of exactly 32: the kernels on coop16.wgsl can run.
    coop16: bool,
    /// Reductions through subgroup operations, of this width (see
    /// `subgroup_width`); 0: through workgroup memory.
    subgroup_width: u32,
    /// 8x8x8 f16 cooperative matrices with f32 accumulation on an Apple GPU
    /// (simdgroups of 32): matmul_coop.wgsl on coop8.wgsl can run.
    coop8: bool,
    /// Test hook: the matmul kernel to use whatever the shape.
    pub forced_matmul: Mutex<Option<&'static str>>,
    /// Decode GEMVs of Q8_0, Q4_0, Q4_1 and Q4_K weights may round x to 8 bits
    /// and take integer dot products (qgemv_i8.wgsl): see `integer_dots`
    /// and `GpuDevice::int8_activations`.
    pub integer_gemv: AtomicBool,
    max_groups: u32,
    workgroup_memory: u32,
    /// Dispatches per submitted batch (see SUBMIT_EVERY).
    submit_every: u32,
    /// Bytes of immediate data the device has: kernels whose parameters fit
    /// read them from there (see `kernel_source`); 0 where the adapter has
    /// none or `SILICA_NO_IMMEDIATES=1`.
    immediate_bytes: u32,
    /// Shader modules by kernel and immediates; shared with the thread that
    /// parses them at device open (see [`Context::parse_in_background`]).
    modules: Arc<Mutex<ModuleMap>>,
    pipelines: Mutex<HashMap<PipelineKey, wgpu::ComputePipeline>>,
    layouts: Mutex<HashMap<LayoutKey, (wgpu::BindGroupLayout, wgpu::PipelineLayout)>>,
    pending: Mutex<Pending>,
    lost: Arc<Mutex<Option<String>>>,
    error: Arc<Mutex<Option<String>>>,
    /// Profiling mode is on (only ever set where `timing` is not `None`).
    profiling: AtomicBool,
    timing: Timing,
    /// Test hook: time with a compute pass per dispatch even where
    /// timestamps inside passes are available.
    per_pass: AtomicBool,
    /// Profiling mode times whole batches instead of dispatches.
    per_batch: AtomicBool,
    /// The profiling query set: two timestamps per dispatch of a batch.
    queries: OnceLock<wgpu::QuerySet>,
    profile: Mutex<ProfileMap>,
}

/// Whether the adapter offers `m`x`m`x`m` cooperative matrices of f16
/// operands with f32 accumulators, and the features their kernels need.
/// `SILICA_NO_COOP=1` turns every cooperative-matrix kernel off.
fn coop_config(adapter: &wgpu::Adapter, m: u32) -> bool {
    use wgpu::CooperativeScalarType as T;
    if std::env::var("SILICA_NO_COOP").is_ok_and(|v| v == "1") {
        return false;
    }
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
/// at full speed. `SILICA_NO_MAPPED=1` turns it off.
fn unified_memory(adapter: &wgpu::Adapter) -> bool {
    if std::env::var("SILICA_NO_MAPPED").is_ok_and(|v| v == "1") {
        return false;
    }
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
/// `SILICA_INTEGER_GEMV=1` or `=0` decides instead.
fn integer_dots(adapter: &wgpu::Adapter) -> bool {
    match std::env::var("SILICA_INTEGER_GEMV").as_deref() {
        Ok("1") => return true,
        Ok("0") => return false,
        _ => {}
    }
    let info = adapter.get_info();
    info.backend == wgpu::Backend::Vulkan
        && matches!(
            info.device_type,
            wgpu::DeviceType::DiscreteGpu | wgpu::DeviceType::IntegratedGpu
        )
}

thread_local! {
    /// Set while this thread runs [`kernels_only`]: dispatches build their
    /// pipelines and record nothing.
    static KERNELS_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is in [`kernels_only`].
fn building_only() -> bool {
    KERNELS_ONLY.with(|k| k.get())
}

/// Runs `f` with this thread's GPU work reduced to building the pipelines
/// it would use: dispatches, uploads, copies and clears record nothing (so
/// tensors made meanwhile hold undefined values), and read-backs fail.
/// Other threads' work goes on as usual. Buffers are still allocated from
/// the pool.
pub(crate) fn kernels_only<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            KERNELS_ONLY.with(|k| k.set(self.0));
        }
    }
    let _restore = Restore(KERNELS_ONLY.with(|k| k.replace(true)));
    f()
}

/// Locks a mutex whose data stays valid even if a holder panicked.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Context {
    pub fn new(adapter: &wgpu::Adapter, info: &DeviceInfo) -> Result<Self> {
        let mut wanted = wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        let coop16 = coop16_available(adapter);
        let coop8 = !coop16 && coop8_available(adapter);
        if coop16 || coop8 {
            wanted |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        let mappable = unified_memory(adapter);
        let subgroup_width = subgroup_width(adapter);
        if mappable {
            wanted |= wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
        }
        let mut limits = adapter.limits();
        let immediate_bytes = if adapter.features().contains(wgpu::Features::IMMEDIATES)
            && !std::env::var("SILICA_NO_IMMEDIATES").is_ok_and(|v| v == "1")
        {
            limits.max_immediate_size.min(IMMEDIATE_BYTES)
        } else {
            0
        };
        if immediate_bytes > 0 {
            wanted |= wgpu::Features::IMMEDIATES;
        }
        limits.max_immediate_size = immediate_bytes;
        let desc = wgpu::DeviceDescriptor {
            label: Some("silica"),
            required_features: adapter.features() & wanted,
            required_limits: limits,
            memory_hints: wgpu::MemoryHints::Performance,
            // SAFETY: the one experimental feature asked for is cooperative
            // matrices, used only by the cooperative-matrix kernels, whose
            // shader test validates them with naga and
            // whose results the parity suite compares with the CPU on every
            // adapter that runs them.
            experimental_features: if coop16 || coop8 {
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            ..Default::default()
        };
        let (device, queue) =
            pollster::block_on(adapter.request_device(&desc)).map_err(|e| Error::Gpu {
                device: info.name.clone(),
                msg: format!("could not open the device: {e}"),
            })?;
        let lost = Arc::new(Mutex::new(None));
        let error = Arc::new(Mutex::new(None));
        {
            let lost = lost.clone();
            device.set_device_lost_callback(move |reason, msg| {
                *lock(&lost) = Some(format!("{reason:?}: {msg}"));
            });
            let error = error.clone();
            device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                lock(&error).get_or_insert_with(|| e.to_string());
            }));
        }
        let features = device.features();
        let timing = if !features.contains(wgpu::Features::TIMESTAMP_QUERY) {
            Timing::None
        } else if features.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES) {
            Timing::InsidePass
        } else {
            Timing::PerPass
        };
        let limits = device.limits();
        let pool = Arc::new(MemoryPool::new(
            device.clone(),
            info.name.clone(),
            limits
                .max_storage_buffer_binding_size
                .min(limits.max_buffer_size),
            mappable,
        ));
        Ok(Self {
            device,
            queue,
            pool,
            name: info.name.clone(),
            coop16,
            coop8,
            subgroup_width,
            forced_matmul: Mutex::new(None),
            integer_gemv: AtomicBool::new(integer_dots(adapter)),
            max_groups: limits.max_compute_workgroups_per_dimension,
            workgroup_memory: limits.max_compute_workgroup_storage_size,
            submit_every: std::env::var("SILICA_SUBMIT_EVERY")
                .ok()
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(SUBMIT_EVERY)
                .clamp(1, DISPATCH_BUDGET),
            immediate_bytes,
            modules: Arc::new(Mutex::new(HashMap::new())),
            pipelines: Mutex::new(HashMap::new()),
            layouts: Mutex::new(HashMap::new()),
            pending: Mutex::new(Pending {
                pass: None,
                encoder: None,
                slab: None,
                full_slabs: Vec::new(),
                slot: 0,
                dispatches: 0,
                timed: Vec::new(),
            }),
            lost,
            error,
            profiling: AtomicBool::new(false),
            timing,
            per_pass: AtomicBool::new(false),
            per_batch: AtomicBool::new(false),
            queries: OnceLock::new(),
            profile: Mutex::new(BTreeMap::new()),
        })
    }

    /// Destroys the wgpu device, as a driver reset would (test hook).
    pub fn destroy(&self) {
        self.device.destroy();
        lock(&self.lost).get_or_insert_with(|| "destroyed".to_string());
    }

    pub fn lost_reason(&self) -> Option<String> {
        lock(&self.lost).clone()
    }

    pub fn check_alive(&self) -> Result<()> {
        match self.lost_reason() {
            Some(reason) => Err(Error::DeviceLost {
                device: self.name.clone(),
                reason,
            }),
            None => Ok(()),
        }
    }

    /// Fails in [`kernels_only`], where tensors hold no values to read.
    fn check_readable(&self) -> Result<()> {
        if building_only() {
            return Err(Error::InvalidArgument {
                op: "read",
                msg: format!(
                    "a tensor on {} was read while only its kernels were being built",
                    self.name
                ),
            });
        }
        Ok(())
    }

    /// Turns a wgpu error reported since the last check into an `Error`.
    fn take_error(&self) -> Result<()> {
        self.check_alive()?;
        match lock(&self.error).take() {
            Some(msg) => Err(Error::Gpu {
                device: self.name.clone(),
                msg,
            }),
            None => Ok(()),
        }
    }

    fn gpu_err(&self, msg: impl std::fmt::Display) -> Error {
        match self.lost_reason() {
            Some(reason) => Error::DeviceLost {
                device: self.name.clone(),
                reason,
            },
            None => Error::Gpu {
                device: self.name.clone(),
                msg: msg.to_string(),
            },
        }
    }

    /// Runs `f` on the pending encoder (outside any compute pass), creating
    /// the encoder if needed.
    fn record<R>(&self, f: impl FnOnce(&mut wgpu::CommandEncoder) -> R) -> R {
        let mut p = lock(&self.pending);
        // copies cannot be recorded inside a compute pass: end it
        p.pass = None;
        let enc = p.encoder.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("silica ops"),
                })
        });
        f(enc)
    }

    /// Submits the pending encoder (without waiting for it). In profiling
    /// mode, a batch with timed dispatches also resolves their timestamps,
    /// and this waits for the batch to finish and adds the times to the
    /// profile.
    pub fn flush(&self) -> Option<wgpu::SubmissionIndex> {
        let mut guard = lock(&self.pending);
        let p = &mut *guard;
        p.pass = None;
        for slab in p.full_slabs.drain(..).chain(p.slab.take()) {
            slab.unmap();
        }
        p.slot = 0;
        p.dispatches = 0;
        let timed = std::mem::take(&mut p.timed);
        if timed.first().is_some_and(|t| t.0 == BATCH) {
            // per-batch timing: the end mark, after all of the batch's work
            if let Some(enc) = p.encoder.as_mut() {
                self.mark_in(enc, 1);
            }
        }
        if let Some(mut enc) = p.encoder.take() {
            let readback =
                (!timed.is_empty()).then(|| self.resolve_timestamps(&mut enc, timed.len()));
            let index = self.queue.submit([enc.finish()]);
            drop(guard);
            if let Some(buf) = readback {
                self.collect_timestamps(&buf, &timed);
            }
            return Some(index);
        }
        None
    }

    /// Profiling mode is possible: the device has timestamp queries.
    pub fn can_profile(&self) -> bool {
        self.timing != Timing::None
    }

    /// Turns profiling mode on or off; returns whether it is now on (never
    /// where the device has no timestamp queries).
    pub fn set_profiling(&self, on: bool) -> bool {
        let on = on && self.can_profile();
        self.profiling.store(on, Ordering::Relaxed);
        on
    }

    pub fn profiling(&self) -> bool {
        self.profiling.load(Ordering::Relaxed)
    }

    /// Test hook: time each dispatch with a compute pass of its own even
    /// where timestamps inside passes are available.
    pub fn set_profile_per_pass(&self, on: bool) {
        self.per_pass.store(on, Ordering::Relaxed);
    }

    /// Profiling mode times each submitted batch as a whole (see
    /// `GpuDevice::set_profile_batches`).
    pub fn set_profile_batches(&self, on: bool) {
        self.per_batch.store(on, Ordering::Relaxed);
    }

    pub fn reset_profile(&self) {
        lock(&self.profile).clear();
    }

    /// The profile so far: by kernel name, or by kernel name and grid;
    /// the most GPU time first.
    pub fn profile_report(&self, by_grid: bool) -> Vec<KernelTime> {
        let map = lock(&self.profile);
        let mut out: Vec<KernelTime> = Vec::new();
        for (&(name, grid), &(dispatches, seconds)) in map.iter() {
            // the map is sorted by name: a name's grids are adjacent
            match out.last_mut() {
                Some(last) if !by_grid && last.name == name => {
                    last.dispatches += dispatches;
                    last.seconds += seconds;
                }
                _ => out.push(KernelTime {
                    name: name.to_string(),
                    grid: by_grid.then_some(grid),
                    dispatches,
                    seconds,
                }),
            }
        }
        out.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        out
    }

    fn query_set(&self) -> &wgpu::QuerySet {
        self.queries.get_or_init(|| {
            self.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("silica profile"),
                ty: wgpu::QueryType::Timestamp,
                count: 2 * DISPATCH_BUDGET,
            })
        })
    }

    /// Records the resolution of the first `pairs` timestamp pairs into a
    /// buffer to map: returns that buffer.
    fn resolve_timestamps(&self, enc: &mut wgpu::CommandEncoder, pairs: usize) -> wgpu::Buffer {
        let size = 16 * pairs as u64;
        let resolved = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("silica profile"),
            size,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let readback = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("silica profile read-back"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        enc.resolve_query_set(self.query_set(), 0..2 * pairs as u32, &resolved, 0);
        enc.copy_buffer_to_buffer(&resolved, 0, &readback, 0, size);
        readback
    }

    /// Waits for the submitted batch and adds its dispatch times to the
    /// profile. A failure (a lost device) drops this batch's times: the
    /// next op reports the error.
    fn collect_timestamps(&self, readback: &wgpu::Buffer, timed: &[(&'static str, [u32; 3])]) {
        let (tx, rx) = std::sync::mpsc::channel();
        readback.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        if self
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .is_err()
            || !matches!(rx.recv(), Ok(Ok(())))
        {
            return;
        }
        let Ok(view) = readback.slice(..).get_mapped_range() else {
            return;
        };
        let ticks: &[u64] = bytemuck::cast_slice(&view);
        let period_s = f64::from(self.queue.get_timestamp_period()) * 1e-9;
        let mut map = lock(&self.profile);
        for (&key, t) in timed.iter().zip(ticks.chunks_exact(2)) {
            let e = map.entry(key).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += t[1].saturating_sub(t[0]) as f64 * period_s;
        }
        drop(map);
        drop(view);
        readback.unmap();
    }

    /// Submits pending work and waits for the device to finish it.
    pub fn synchronize(&self) -> Result<()> {
        self.check_alive()?;
        self.flush();
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| self.gpu_err(e))?;
        self.take_error()
    }

    /// A new buffer holding `data`, zero padded to whole words. On unified
    /// memory a large one is written in place through its mapping when the
    /// pool has to make a buffer for it; otherwise the bytes go through a
    /// staging buffer.
    pub fn upload(&self, data: &[u8]) -> Result<GpuBuffer> {
        let padded = data.len().next_multiple_of(4);
        if building_only() {
            return self.pool.alloc(padded as u64);
        }
        let (buf, mapped) = if padded >= MAPPED_UPLOAD_MIN {
            self.pool.alloc_for_upload(padded as u64)?
        } else {
            (self.pool.alloc(padded as u64)?, false)
        };
        if !mapped {
            self.write(&buf, data)?;
            return Ok(buf);
        }
        let filled = buf
            .raw()
            .slice(..padded as u64)
            .get_mapped_range_mut()
            .map(|mut view| {
                view.slice(..data.len()).copy_from_slice(data);
                view.slice(data.len()..).fill(0);
            });
        // unmapped whatever happened: the buffer goes back to the pool
        // on an error, and a mapped buffer cannot be bound
        buf.raw().unmap();
        filled.map_err(|e| self.gpu_err(e))?;
        Ok(buf)
    }

    /// Records a copy of `data` into the start of `dst`.
    pub fn write(&self, dst: &GpuBuffer, data: &[u8]) -> Result<()> {
        self.write_at(dst, 0, data)
    }

    /// Records a copy of `data` into `dst` from byte `at` (a multiple of 4) on.
    pub fn write_at(&self, dst: &GpuBuffer, at: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() || building_only() {
            return Ok(());
        }
        let padded = (data.len() as u64).next_multiple_of(4);
        // mappable, so that wgpu maps it as it is: a buffer that cannot be
        // mapped gets a staging buffer of its own inside wgpu, and a copy
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("silica upload"),
            size: padded,
            usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        });
        {
            let mut view = staging
                .get_mapped_range_mut(..)
                .map_err(|e| self.gpu_err(e))?;
            view.slice(..data.len()).copy_from_slice(data);
        }
        staging.unmap();
        self.record(|enc| enc.copy_buffer_to_buffer(&staging, 0, dst.raw(), at, padded));
        Ok(())
    }

    /// Starts a clock on the GPU's own timeline (timestamp queries), or
    /// `None` where the adapter has none. Work recorded before
    /// [`Context::timer_stop`] is what it measures, including any idle time
    /// between kernels, as CUDA events around a loop do.
    pub fn timer_start(&self) -> Result<Option<wgpu::QuerySet>> {
        self.check_alive()?;
        if !self
            .device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY)
        {
            return Ok(None);
        }
        let set = self.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("silica timer"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        });
        self.mark(&set, 0);
        Ok(Some(set))
    }

    /// Stops a clock from [`Context::timer_start`]: waits for the work and
    /// returns the GPU seconds between the two marks.
    pub fn timer_stop(&self, set: wgpu::QuerySet) -> Result<f64> {
        self.mark(&set, 1);
        let resolved = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("silica timer"),
            size: 16,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        self.record(|enc| enc.resolve_query_set(&set, 0..2, &resolved, 0));
        let bytes = self.read(&resolved, 0, 16)?;
        let ticks: &[u64] = bytemuck::cast_slice(&bytes);
        let period_ns = f64::from(self.queue.get_timestamp_period());
        Ok(ticks[1].saturating_sub(ticks[0]) as f64 * period_ns * 1e-9)
    }

    /// Records into `enc` an empty compute pass that writes timestamp
    /// `index` of the profiling query set at its end.
    fn mark_in(&self, enc: &mut wgpu::CommandEncoder, index: u32) {
        drop(enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("silica timestamp"),
            timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                query_set: self.query_set(),
                beginning_of_pass_write_index: None,
                end_of_pass_write_index: Some(index),
            }),
        }));
    }

    /// Records an empty compute pass that writes timestamp `index` of `set`
    /// at its end, that is once the work recorded before it has run.
    fn mark(&self, set: &wgpu::QuerySet, index: u32) {
        self.record(|enc| {
            drop(enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("silica timestamp"),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: set,
                    beginning_of_pass_write_index: None,
                    end_of_pass_write_index: Some(index),
                }),
            }));
        });
    }

    /// Records zeroing of a whole buffer.
    pub fn clear(&self, buf: &GpuBuffer) {
        if !building_only() {
            self.record(|enc| enc.clear_buffer(buf.raw(), 0, None));
        }
    }

    /// Reads `size` bytes at `offset` (both multiples of 4), waiting for all pending work.
    pub fn read(&self, src: &wgpu::Buffer, offset: u64, size: u64) -> Result<Vec<u8>> {
        self.read_with(src, offset, size, <[u8]>::to_vec)
    }

    /// [`Context::read`] passing the bytes to `f` where they lie: the
    /// buffer's own mapping where it is mappable (unified memory), else a
    /// staging buffer's.
    pub fn read_with<R>(
        &self,
        src: &wgpu::Buffer,
        offset: u64,
        size: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        if src.usage().contains(wgpu::BufferUsages::MAP_READ) {
            return self.read_mapped(src, offset, size, f);
        }
        let pending = self.read_start(src, offset, size)?;
        self.read_finish_with(pending, f)
    }

    /// Reads `size` bytes at `offset` of a mappable buffer (unified memory;
    /// `offset` a multiple of 4) once the work before is done, passing them
    /// to `f` straight from the buffer's mapping: no copy on the GPU, none
    /// into a staging buffer.
    fn read_mapped<R>(
        &self,
        src: &wgpu::Buffer,
        offset: u64,
        size: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        self.check_alive()?;
        self.check_readable()?;
        self.flush();
        // nothing is submitted while the buffer is mapped: work recorded by
        // other threads meanwhile waits in the pending encoder
        let _hold = lock(&self.pending);
        let start = offset & !(wgpu::MAP_ALIGNMENT - 1);
        let end = (offset + size).next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        let slice = src.slice(start..end);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        // every submission: another thread may have submitted work on this
        // buffer between the flush and the lock
        let skip = (offset - start) as usize;
        let read = self.wait_mapped(None, &rx).and_then(|()| {
            let view = slice.get_mapped_range().map_err(|e| self.gpu_err(e))?;
            Ok(f(&view[skip..skip + size as usize]))
        });
        // unmapped on an error too: the tensor's buffer stays in use
        src.unmap();
        read
    }

    /// Starts reading `size` bytes at `offset` (both multiples of 4): the
    /// copy is submitted with all pending work, and work recorded after it
    /// does not delay [`Context::read_finish_with`].
    pub fn read_start(&self, src: &wgpu::Buffer, offset: u64, size: u64) -> Result<PendingBytes> {
        self.check_alive()?;
        self.check_readable()?;
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("silica read-back"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.record(|enc| enc.copy_buffer_to_buffer(src, offset, &staging, 0, size));
        let index = self.flush();
        let (tx, rx) = std::sync::mpsc::channel();
        staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        Ok(PendingBytes { staging, rx, index })
    }

    /// Waits for a read started by [`Context::read_start`] (only for the
    /// submission that holds its copy) and passes the bytes to `f` straight
    /// from the staging buffer's mapping.
    pub fn read_finish_with<R>(
        &self,
        pending: PendingBytes,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        let PendingBytes { staging, rx, index } = pending;
        self.wait_mapped(index, &rx)?;
        let r = {
            let view = staging
                .slice(..)
                .get_mapped_range()
                .map_err(|e| self.gpu_err(e))?;
            f(&view)
        };
        staging.unmap();
        Ok(r)
    }

    /// Waits for submission `index` (every submission if `None`), after
    /// which the mapping whose outcome `rx` receives is done. The outcome
    /// is waited for too: another thread's poll may be the one that runs
    /// the mapping's callback, a moment after this poll returns.
    fn wait_mapped(
        &self,
        index: Option<wgpu::SubmissionIndex>,
        rx: &std::sync::mpsc::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
    ) -> Result<()> {
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: index,
                timeout: None,
            })
            .map_err(|e| self.gpu_err(e))?;
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(self.gpu_err(format!("read-back failed: {e}"))),
            Err(_) => return Err(self.gpu_err("read-back was never completed")),
        }
        self.take_error()
    }

    /// Workgroup counts for `groups` workgroups, split over x and y when
    /// one dimension is not enough. Kernels rebuild the linear index as
    /// `wid.y * num_workgroups.x + wid.x`.
    pub fn grid(&self, groups: u32) -> [u32; 3] {
        if groups <= self.max_groups {
            [groups.max(1), 1, 1]
        } else {
            let x = self.max_groups;
            [x, groups.div_ceil(x), 1]
        }
    }

    /// Workgroups for one thread per item, `WG` threads per workgroup.
    pub fn grid_for_threads(&self, threads: usize) -> Result<[u32; 3]> {
        let groups =
            u32::try_from(threads.div_ceil(WG as usize)).map_err(|_| Error::NotSupported {
                op: "dispatch",
                reason: format!("{threads} threads exceed one dispatch"),
            })?;
        Ok(self.grid(groups))
    }

    pub fn coop16(&self) -> bool {
        self.coop16
    }

    /// Parses the modules of `kernels` on a thread of their own, so that
    /// the first dispatches of a process (a model's first token, while the
    /// weights were loading) find them ready: parsing and validating the
    /// WGSL of a prefill's kernels took about 30 ms of the first token on
    /// an H100's host. A kernel the process reaches before the thread does
    /// is parsed where it is needed, as without the thread. Modules that
    /// fail to build are left out (the dispatch then reports the error).
    pub fn parse_in_background(&self, kernels: Vec<&'static Kernel>) {
        let device = self.device.clone();
        let modules = self.modules.clone();
        let immediates = self.immediate_bytes > 0;
        let subgroups = self.subgroup_width > 0;
        let spawned = std::thread::Builder::new()
            .name("silica-wgsl".into())
            .spawn(move || {
                for kernel in kernels {
                    let key = (kernel.name, immediates && kernel.immediates);
                    if lock(&modules).contains_key(&key) {
                        continue;
                    }
                    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
                    let module = create_module(&device, kernel, key.1, subgroups);
                    if pollster::block_on(scope.pop()).is_none() {
                        lock(&modules).entry(key).or_insert(module);
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::debug!("no thread to parse kernels ahead: {e}");
        }
    }

    pub fn coop8(&self) -> bool {
        self.coop8
    }

    /// The subgroup width that the kernels' subgroup forms run with, 0
    /// where they keep their workgroup-memory trees (see `subgroup_width`).
    pub(crate) fn subgroup_width(&self) -> u32 {
        self.subgroup_width
    }

    /// Bytes of workgroup memory a kernel may use.
    pub fn workgroup_memory(&self) -> u32 {
        self.workgroup_memory
    }

    pub fn max_groups(&self) -> u32 {
        self.max_groups
    }

    /// The layouts of a kernel with `inputs` inputs, its parameters in
    /// immediates or at binding 0.
    fn layout(
        &self,
        kernel: &Kernel,
        immediates: bool,
    ) -> (wgpu::BindGroupLayout, wgpu::PipelineLayout) {
        let (inputs, outputs) = (kernel.inputs as u32, kernel.outputs as u32);
        let mut layouts = lock(&self.layouts);
        layouts
            .entry((inputs, outputs, immediates))
            .or_insert_with(|| {
                let storage = |binding: u32, read_only: bool| wgpu::BindGroupLayoutEntry {
                    binding,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage { read_only },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                };
                let mut entries = Vec::new();
                if !immediates {
                    entries.push(wgpu::BindGroupLayoutEntry {
                        binding: 0,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: wgpu::BufferBindingType::Uniform,
                            has_dynamic_offset: false,
                            min_binding_size: None,
                        },
                        count: None,
                    });
                }
                entries.extend((1..=inputs).map(|b| storage(b, true)));
                entries.extend((inputs + 1..=inputs + outputs).map(|b| storage(b, false)));
                let bgl = self
                    .device
                    .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                        label: Some("silica kernel bindings"),
                        entries: &entries,
                    });
                let pl = self
                    .device
                    .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                        label: Some("silica kernel layout"),
                        bind_group_layouts: &[Some(&bgl)],
                        immediate_size: if immediates { self.immediate_bytes } else { 0 },
                    });
                (bgl, pl)
            })
            .clone()
    }

    fn pipeline(
        &self,
        kernel: &Kernel,
        constants: &[(&'static str, f64)],
        immediates: bool,
    ) -> Result<wgpu::ComputePipeline> {
        let query = PipelineQuery {
            name: kernel.name,
            constants,
            immediates,
        };
        if let Some(p) = lock(&self.pipelines).get(&query) {
            return Ok(p.clone());
        }
        let key = PipelineKey {
            name: kernel.name,
            constants: constants.iter().map(|&(k, v)| (k, v.to_bits())).collect(),
            immediates,
        };
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let started = std::time::Instant::now();
        let module = lock(&self.modules)
            .entry((kernel.name, immediates))
            .or_insert_with(|| {
                create_module(&self.device, kernel, immediates, self.subgroup_width > 0)
            })
            .clone();
        let module_time = started.elapsed();
        let (_, layout) = self.layout(kernel, immediates);
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(kernel.name),
                layout: Some(&layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(self.gpu_err(format!("kernel {} failed to build: {e}", kernel.name)));
        }
        tracing::debug!(
            target: "silica::pipelines",
            kernel = kernel.name,
            module_ms = module_time.as_secs_f64() * 1e3,
            total_ms = started.elapsed().as_secs_f64() * 1e3,
            "built a pipeline (module: WGSL parsed and validated, or found; the rest: translation and the driver)"
        );
        lock(&self.pipelines).insert(key, pipeline.clone());
        Ok(pipeline)
    }

    /// The open compute pass that dispatches share, opened (and the
    /// encoder created) if needed.
    fn shared_pass<'a>(&self, p: &'a mut Pending) -> &'a mut wgpu::ComputePass<'static> {
        if p.pass.is_none() {
            let enc = p.encoder.get_or_insert_with(|| {
                self.device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("silica ops"),
                    })
            });
            let pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("silica kernels"),
                timestamp_writes: None,
            });
            p.pass = Some(pass.forget_lifetime());
        }
        // invariant: the pass was opened just above if there was none
        p.pass.as_mut().expect("an open compute pass")
    }

    /// Records a dispatch between two timestamps (profiling mode).
    fn record_timed(
        &self,
        p: &mut Pending,
        name: &'static str,
        pipeline: &wgpu::ComputePipeline,
        bind_group: &wgpu::BindGroup,
        immediates: Option<&[u8]>,
        groups: [u32; 3],
    ) {
        // a batch holds fewer than DISPATCH_BUDGET dispatches, so its
        // timestamp pairs fit in the query set
        debug_assert!(p.timed.len() < DISPATCH_BUDGET as usize);
        let start = 2 * p.timed.len() as u32;
        p.timed.push((name, groups));
        let set = self.query_set();
        if self.timing == Timing::InsidePass && !self.per_pass.load(Ordering::Relaxed) {
            let pass = self.shared_pass(p);
            pass.write_timestamp(set, start);
            encode(pass, pipeline, bind_group, immediates, groups);
            pass.write_timestamp(set, start + 1);
        } else {
            p.pass = None;
            let enc = p.encoder.get_or_insert_with(|| {
                self.device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("silica ops"),
                    })
            });
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(name),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: set,
                    beginning_of_pass_write_index: Some(start),
                    end_of_pass_write_index: Some(start + 1),
                }),
            });
            encode(&mut pass, pipeline, bind_group, immediates, groups);
        }
    }

    /// Records one kernel launch: `params` (as immediates, or in a uniform
    /// buffer at binding 0), `inputs` at bindings 1.., `output` after them.
    pub fn dispatch(
        &self,
        kernel: &Kernel,
        constants: &[(&'static str, f64)],
        params: &[u8],
        inputs: &[&GpuBuffer],
        output: &GpuBuffer,
        groups: [u32; 3],
    ) -> Result<()> {
        self.dispatch_outputs(kernel, constants, params, inputs, &[output], groups)
    }

    /// [`Context::dispatch`] of a kernel with several read-write bindings,
    /// `outputs` in their order after the inputs. No buffer may appear
    /// twice among `inputs` and `outputs`.
    pub fn dispatch_outputs(
        &self,
        kernel: &Kernel,
        constants: &[(&'static str, f64)],
        params: &[u8],
        inputs: &[&GpuBuffer],
        outputs: &[&GpuBuffer],
        groups: [u32; 3],
    ) -> Result<()> {
        debug_assert_eq!(inputs.len(), kernel.inputs);
        debug_assert_eq!(outputs.len(), kernel.outputs);
        self.check_alive()?;
        let immediates = kernel.immediates && params.len() as u32 <= self.immediate_bytes;
        let pipeline = self.pipeline(kernel, constants, immediates)?;
        if building_only() {
            return Ok(());
        }
        let (bgl, _) = self.layout(kernel, immediates);
        let mut guard = lock(&self.pending);
        let p = &mut *guard;
        debug_assert!(params.len() <= 256 && params.len().is_multiple_of(4));
        let (bind_group, immediates) = if immediates {
            // bindings 1..: the tensors; the parameters travel as immediates
            let group = self.pool.bind_group(&bgl, kernel.name, inputs, outputs);
            (group, Some(params))
        } else {
            (
                self.uniform_bind_group(p, kernel, &bgl, params, inputs, outputs)?,
                None,
            )
        };
        // profiling mode: the one cost when off is this load
        if self.profiling.load(Ordering::Relaxed) && self.per_batch.load(Ordering::Relaxed) {
            if p.timed.is_empty() {
                // the batch's first dispatch: its start mark
                p.timed.push((BATCH, [0, 0, 0]));
                p.pass = None;
                let enc = p.encoder.get_or_insert_with(|| {
                    self.device
                        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                            label: Some("silica ops"),
                        })
                });
                self.mark_in(enc, 0);
            }
            let pass = self.shared_pass(p);
            encode(pass, &pipeline, &bind_group, immediates, groups);
        } else if self.profiling.load(Ordering::Relaxed) {
            self.record_timed(p, kernel.name, &pipeline, &bind_group, immediates, groups);
        } else {
            let pass = self.shared_pass(p);
            encode(pass, &pipeline, &bind_group, immediates, groups);
        }
        p.dispatches += 1;
        let submit = p.dispatches >= self.submit_every;
        drop(guard);
        if submit {
            self.flush();
        }
        Ok(())
    }

    /// The bind group of a dispatch whose parameters go in a uniform
    /// buffer: a slot of this batch's parameter slab at binding 0, the
    /// tensors after it.
    fn uniform_bind_group(
        &self,
        p: &mut Pending,
        kernel: &Kernel,
        bgl: &wgpu::BindGroupLayout,
        params: &[u8],
        inputs: &[&GpuBuffer],
        outputs: &[&GpuBuffer],
    ) -> Result<wgpu::BindGroup> {
        // a parameter slot: params are at most 256 bytes, the largest
        // uniform offset alignment wgpu allows
        let slab_bytes = SLOT_BYTES * self.submit_every as u64;
        if p.slab.is_none() || p.slot + SLOT_BYTES > slab_bytes {
            if let Some(full) = p.slab.take() {
                p.full_slabs.push(full);
            }
            p.slab = Some(self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("silica params"),
                size: slab_bytes,
                usage: wgpu::BufferUsages::UNIFORM,
                mapped_at_creation: true,
            }));
            p.slot = 0;
        }
        // invariant: a slab was put in place just above
        let slab = p.slab.as_ref().expect("a parameter slab");
        let offset = p.slot;
        p.slot += SLOT_BYTES;
        slab.slice(offset..offset + params.len() as u64)
            .get_mapped_range_mut()
            .map_err(|e| self.gpu_err(e))?
            .copy_from_slice(params);
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: slab,
                offset,
                size: wgpu::BufferSize::new(params.len() as u64),
            }),
        }];
        entries.extend(tensor_entries(inputs.iter().chain(outputs).copied()));
        Ok(self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(kernel.name),
            layout: bgl,
            entries: &entries,
        }))
    }
}

/// Records one dispatch into a compute pass.
fn encode(
    pass: &mut wgpu::ComputePass<'_>,
    pipeline: &wgpu::ComputePipeline,
    bind_group: &wgpu::BindGroup,
    immediates: Option<&[u8]>,
    groups: [u32; 3],
) {
    pass.set_pipeline(pipeline);
    pass.set_bind_group(0, bind_group, &[]);
    if let Some(data) = immediates {
        pass.set_immediates(0, data);
    }
    pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
}
