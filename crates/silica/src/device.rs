//! Devices: discovery, ranking and selection.
//!
//! A [`Device`] is either the CPU or one wgpu adapter opened as a GPU device.
//! GPU adapters are enumerated once per process and ranked: Metal, Vulkan and
//! DX12 before GL, discrete before integrated before others. CPU-type adapters
//! (software rasterizers such as Mesa's lavapipe) are listed and can be chosen
//! by name or index, but [`Device::best`] never picks one: the native CPU
//! backend is faster. OpenGL adapters are looked for only when asked for
//! (`SILICA_DEVICE=gl`, `WGPU_BACKEND=gl`): they lack what the kernels
//! need, and probing Mesa's GL driver without a display prints errors.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use crate::backend::gpu::{GpuDevice, KernelTime};
use crate::memory::MemoryStats;
use crate::{Error, GpuOptions, Result};

/// Where tensors live and ops run. Cheap to clone; clones share the device.
///
/// ```
/// let dev = silica::Device::best()?; // SILICA_DEVICE, else the best GPU, else the CPU
/// println!("running on {dev}");
/// # Ok::<(), silica::Error>(())
/// ```
#[derive(Clone)]
pub enum Device {
    /// The host CPU (multi-threaded with rayon).
    Cpu,
    /// A GPU (or software) adapter driven through wgpu.
    Gpu(Arc<GpuDevice>),
}

/// The graphics API behind a GPU device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    Metal,
    Vulkan,
    Dx12,
    Gl,
    Cpu,
}

impl BackendKind {
    fn from_wgpu(b: wgpu::Backend) -> Self {
        match b {
            wgpu::Backend::Metal => BackendKind::Metal,
            wgpu::Backend::Vulkan => BackendKind::Vulkan,
            wgpu::Backend::Dx12 => BackendKind::Dx12,
            _ => BackendKind::Gl,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Metal => "metal",
            BackendKind::Vulkan => "vulkan",
            BackendKind::Dx12 => "dx12",
            BackendKind::Gl => "gl",
            BackendKind::Cpu => "cpu",
        }
    }
}

/// What a device is and what it can do; `silica devices` prints these.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Position in the ranked adapter list (`gpu:N`); `None` for the CPU.
    pub index: Option<usize>,
    pub name: String,
    pub backend: BackendKind,
    /// `DiscreteGpu`, `IntegratedGpu`, `VirtualGpu`, `Cpu` or `Other`.
    pub device_type: String,
    pub driver: String,
    pub f16: bool,
    pub subgroups: bool,
    pub subgroup_size: (u32, u32),
    pub cooperative_matrix: Vec<String>,
    pub timestamps: bool,
    pub max_storage_binding: u64,
    pub max_buffer: u64,
    pub workgroup_storage: u32,
    pub max_invocations: u32,
    /// System memory for the CPU; `None` for GPUs (wgpu does not report it).
    pub memory_bytes: Option<u64>,
}

pub(crate) struct AdapterEntry {
    pub adapter: wgpu::Adapter,
    pub info: DeviceInfo,
}

struct Registry {
    adapters: Vec<AdapterEntry>,
    opened: Mutex<HashMap<usize, Arc<GpuDevice>>>,
}

/// Saves the compiled pipelines of every GPU device this process opened
/// through [`Device::gpu`] or a selector, so that the next process finds
/// its kernels built: the files written. Tools call it before they exit
/// (and a server once it has warmed up); a failure is a warning.
pub fn save_pipeline_caches() -> Vec<std::path::PathBuf> {
    let Some(reg) = REGISTRY.get() else {
        return Vec::new();
    };
    let opened: Vec<Arc<GpuDevice>> = (reg.opened.lock().unwrap_or_else(|e| e.into_inner()))
        .values()
        .cloned()
        .collect();
    opened
        .iter()
        .filter_map(|g| g.save_pipeline_cache())
        .collect()
}

static REGISTRY: OnceLock<Registry> = OnceLock::new();

fn registry() -> &'static Registry {
    REGISTRY.get_or_init(|| {
        let mut backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all());
        if !crate::config::probe_gl() {
            backends.remove(wgpu::Backends::GL);
        }
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        desc.backends.remove(wgpu::Backends::BROWSER_WEBGPU);
        desc.backends &= backends;
        let instance = wgpu::Instance::new(desc);
        let adapters = pollster::block_on(instance.enumerate_adapters(backends));
        let mut entries: Vec<AdapterEntry> = adapters
            .into_iter()
            .map(|adapter| {
                let info = describe(&adapter);
                AdapterEntry { adapter, info }
            })
            .collect();
        entries.sort_by_key(|e| rank(&e.info));
        for (i, e) in entries.iter_mut().enumerate() {
            e.info.index = Some(i);
        }
        Registry {
            adapters: entries,
            opened: Mutex::new(HashMap::new()),
        }
    })
}

/// Lower is better: backend class first, then adapter type.
fn rank(info: &DeviceInfo) -> (u8, u8) {
    let backend = match info.backend {
        BackendKind::Metal | BackendKind::Vulkan | BackendKind::Dx12 => 0,
        _ => 1,
    };
    let ty = match info.device_type.as_str() {
        "DiscreteGpu" => 0,
        "IntegratedGpu" => 1,
        "VirtualGpu" => 2,
        "Other" => 3,
        _ => 4, // Cpu: software rasterizers
    };
    (backend, ty)
}

fn describe(adapter: &wgpu::Adapter) -> DeviceInfo {
    let info = adapter.get_info();
    let features = adapter.features();
    let limits = adapter.limits();
    let coop = if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
        adapter
            .cooperative_matrix_properties()
            .iter()
            .map(|p| {
                format!(
                    "{}x{}x{} {:?}->{:?}",
                    p.m_size, p.n_size, p.k_size, p.ab_type, p.cr_type
                )
            })
            .collect()
    } else {
        Vec::new()
    };
    DeviceInfo {
        index: None,
        name: info.name.clone(),
        backend: BackendKind::from_wgpu(info.backend),
        device_type: format!("{:?}", info.device_type),
        driver: format!("{} {}", info.driver, info.driver_info)
            .trim()
            .to_string(),
        f16: features.contains(wgpu::Features::SHADER_F16),
        subgroups: features.contains(wgpu::Features::SUBGROUP),
        subgroup_size: (info.subgroup_min_size, info.subgroup_max_size),
        cooperative_matrix: coop,
        timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
        max_storage_binding: limits.max_storage_buffer_binding_size,
        max_buffer: limits.max_buffer_size,
        workgroup_storage: limits.max_compute_workgroup_storage_size,
        max_invocations: limits.max_compute_invocations_per_workgroup,
        memory_bytes: None,
    }
}

fn cpu_info() -> DeviceInfo {
    let threads = rayon::current_num_threads();
    DeviceInfo {
        index: None,
        name: format!("host CPU ({threads} threads)"),
        backend: BackendKind::Cpu,
        device_type: "Cpu".into(),
        driver: "native".into(),
        f16: true,
        subgroups: false,
        subgroup_size: (0, 0),
        cooperative_matrix: Vec::new(),
        timestamps: false,
        max_storage_binding: u64::MAX,
        max_buffer: u64::MAX,
        workgroup_storage: 0,
        max_invocations: 0,
        memory_bytes: system_memory(),
    }
}

fn system_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Every GPU adapter wgpu found, ranked best first (software adapters last).
pub fn adapters() -> Vec<DeviceInfo> {
    registry().adapters.iter().map(|e| e.info.clone()).collect()
}

/// The number of GPU adapters (software ones included), like `torch.cuda.device_count`.
pub fn device_count() -> usize {
    registry().adapters.len()
}

/// Whether an adapter of this backend exists (`BackendKind::Cpu` is always available).
pub fn is_available(backend: BackendKind) -> bool {
    backend == BackendKind::Cpu
        || registry()
            .adapters
            .iter()
            .any(|e| e.info.backend == backend)
}

/// Index of the adapter `Device::best` would pick when `SILICA_DEVICE` is unset.
pub fn default_gpu_index() -> Option<usize> {
    registry()
        .adapters
        .iter()
        .position(|e| e.info.device_type != "Cpu")
}

/// A parsed `SILICA_DEVICE` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selector {
    Cpu,
    /// `gpu`: the best hardware adapter, a software one if nothing else exists.
    AnyGpu,
    /// `gpu:N`: the N-th adapter of the ranked list.
    Index(usize),
    /// `metal`, `vulkan`, `dx12`, `gl`: the best adapter of that backend.
    Backend(BackendKind),
    /// Anything else: the first adapter whose name contains it (case-insensitive).
    Name(String),
}

impl Selector {
    /// Parses `cpu | gpu | gpu:N | metal | vulkan | dx12 | gl | <name substring>`.
    pub fn parse(s: &str) -> Result<Selector> {
        let t = s.trim();
        let lower = t.to_ascii_lowercase();
        let err = |reason: &str| Error::NoDevice {
            selector: s.to_string(),
            reason: reason.to_string(),
        };
        Ok(match lower.as_str() {
            "" => return Err(err("empty device name")),
            "cpu" => Selector::Cpu,
            "gpu" | "cuda" => Selector::AnyGpu,
            "metal" => Selector::Backend(BackendKind::Metal),
            "vulkan" => Selector::Backend(BackendKind::Vulkan),
            "dx12" => Selector::Backend(BackendKind::Dx12),
            "gl" | "gles" | "opengl" => Selector::Backend(BackendKind::Gl),
            _ => {
                match lower.strip_prefix("gpu:") {
                    Some(n) => Selector::Index(n.parse().map_err(|_| {
                        err("expected gpu:N with N a number (see `silica devices`)")
                    })?),
                    None => Selector::Name(lower),
                }
            }
        })
    }

    /// The ranked adapter index this selector picks among `infos`; `None` for the CPU.
    pub fn resolve(&self, infos: &[DeviceInfo], text: &str) -> Result<Option<usize>> {
        let err = |reason: String| Error::NoDevice {
            selector: text.to_string(),
            reason,
        };
        let listing = || {
            if infos.is_empty() {
                "no GPU adapter was found".to_string()
            } else {
                let names: Vec<String> = infos
                    .iter()
                    .enumerate()
                    .map(|(i, a)| format!("gpu:{i} {} ({})", a.name, a.backend.as_str()))
                    .collect();
                format!("adapters found: {}", names.join(", "))
            }
        };
        match self {
            Selector::Cpu => Ok(None),
            Selector::AnyGpu => {
                if infos.is_empty() {
                    Err(err(listing()))
                } else {
                    // a real GPU if there is one, else the first (software) adapter
                    Ok(Some(
                        infos
                            .iter()
                            .position(|a| a.device_type != "Cpu")
                            .unwrap_or(0),
                    ))
                }
            }
            Selector::Index(i) => {
                if *i < infos.len() {
                    Ok(Some(*i))
                } else {
                    Err(err(listing()))
                }
            }
            Selector::Backend(b) => infos
                .iter()
                .position(|a| a.backend == *b)
                .map(Some)
                .ok_or_else(|| {
                    let mut reason = listing();
                    if *b == BackendKind::Gl {
                        reason.push_str(
                            "; OpenGL adapters are only looked for when SILICA_DEVICE=gl \
                             or WGPU_BACKEND=gl is set at startup",
                        );
                    }
                    err(reason)
                }),
            Selector::Name(n) => infos
                .iter()
                .position(|a| a.name.to_ascii_lowercase().contains(n.as_str()))
                .map(Some)
                .ok_or_else(|| err(listing())),
        }
    }
}

impl Device {
    /// The CPU device.
    pub fn cpu() -> Device {
        Device::Cpu
    }

    /// The device named by `SILICA_DEVICE` if set, else the best GPU
    /// (never a software adapter), else the CPU.
    pub fn best() -> Result<Device> {
        Device::open_selected(None, Device::gpu)
    }

    /// The device `selector` names ([`Device::select`]), or without one the
    /// device [`Device::best`] picks, with a GPU opened anew under
    /// `options` ([`Device::gpu_with_options`]): for a tool whose own
    /// settings differ from the environment's (`silica serve
    /// --keep-decoded`).
    pub fn select_with_options(selector: Option<&str>, options: &GpuOptions) -> Result<Device> {
        Device::open_selected(selector, |i| Device::gpu_with_options(i, options))
    }

    /// The device a selector string names (the syntax of `SILICA_DEVICE`:
    /// `cpu`, `gpu`, `gpu:N`, `metal`, `vulkan`, `dx12`, `gl`, or part of an
    /// adapter's name).
    pub fn select(selector: &str) -> Result<Device> {
        Device::open_selected(Some(selector), Device::gpu)
    }

    /// The device `selector` names, else the one `SILICA_DEVICE` names,
    /// else the best GPU, else the CPU, a GPU opened by `open` from its
    /// adapter index.
    fn open_selected(
        selector: Option<&str>,
        open: impl FnOnce(usize) -> Result<Device>,
    ) -> Result<Device> {
        let sel = match selector {
            Some(s) => Some(s.to_string()),
            None => crate::config::device_selector(),
        };
        let index = match sel {
            Some(s) => match Selector::parse(&s)? {
                // no need to wake up every GPU driver
                Selector::Cpu => None,
                parsed => parsed.resolve(&adapters(), &s)?,
            },
            None => default_gpu_index(),
        };
        match index {
            Some(i) => open(i),
            None => Ok(Device::Cpu),
        }
    }

    /// The GPU adapter at `index` of the ranked list (see [`adapters`]).
    /// Opening the same index twice gives the same device.
    pub fn gpu(index: usize) -> Result<Device> {
        let reg = registry();
        let entry = reg.adapters.get(index).ok_or_else(|| Error::NoDevice {
            selector: format!("gpu:{index}"),
            reason: format!("{} GPU adapters found", reg.adapters.len()),
        })?;
        // Poisoning can only come from a panic while the map was held; the map
        // itself stays consistent, so keep using it.
        let mut opened = reg.opened.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(dev) = opened.get(&index)
            && !dev.is_lost()
        {
            return Ok(Device::Gpu(dev.clone()));
        }
        let dev = Arc::new(GpuDevice::open(
            &entry.adapter,
            entry.info.clone(),
            &GpuOptions::from_env(),
        )?);
        opened.insert(index, dev.clone());
        Ok(Device::Gpu(dev))
    }

    /// The GPU adapter at `index` opened anew with `options` instead of
    /// the environment's settings: a device of its own, with its own memory
    /// pool and pipelines, that [`Device::gpu`] does not return. For
    /// comparing configurations in one process (tests, benchmarks).
    ///
    /// ```no_run
    /// use silica::{Device, GpuOptions};
    /// let opts = GpuOptions { cooperative_matrix: false, ..GpuOptions::default() };
    /// let dev = Device::gpu_with_options(0, &opts)?;
    /// # Ok::<(), silica::Error>(())
    /// ```
    pub fn gpu_with_options(index: usize, options: &GpuOptions) -> Result<Device> {
        let reg = registry();
        let entry = reg.adapters.get(index).ok_or_else(|| Error::NoDevice {
            selector: format!("gpu:{index}"),
            reason: format!("{} GPU adapters found", reg.adapters.len()),
        })?;
        let dev = GpuDevice::open(&entry.adapter, entry.info.clone(), options)?;
        Ok(Device::Gpu(Arc::new(dev)))
    }

    /// Name and capabilities.
    pub fn info(&self) -> DeviceInfo {
        match self {
            Device::Cpu => cpu_info(),
            Device::Gpu(g) => g.info().clone(),
        }
    }

    /// A short name: `cpu`, or `gpu:N (adapter name, backend)`.
    pub fn name(&self) -> String {
        self.to_string()
    }

    pub fn is_cpu(&self) -> bool {
        matches!(self, Device::Cpu)
    }

    pub fn is_gpu(&self) -> bool {
        matches!(self, Device::Gpu(_))
    }

    /// Builds the GPU kernels (pipelines) that `f` would use, on this
    /// thread, without running it for real: `f`'s dispatches, uploads,
    /// copies and clears record nothing, so the tensors it makes hold
    /// undefined values, and reading one back is an error. Buffers are
    /// allocated as usual; other threads' work is unaffected. Run on a
    /// second thread, it takes the building of kernels off the path of the
    /// work to come: `silica generate` builds the decode step's kernels
    /// this way while the prompt runs. On the CPU, `f` is not called.
    pub fn build_kernels_only<E>(
        &self,
        f: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        match self {
            Device::Cpu => Ok(()),
            Device::Gpu(g) => g.build_kernels_only(f),
        }
    }

    /// Starts building, on a thread of its own, the kernels that an earlier
    /// process used on this device under the same `tag` (say a model file
    /// and its dtype), so that they are ready when this process needs them,
    /// then makes the process's first read-back (slower than the next
    /// ones): call it before loading the model, whose load then hides both.
    /// From now on the kernels this process uses are listed under `tag`
    /// when the pipeline cache is saved ([`save_pipeline_caches`]). The
    /// lists live beside the pipeline cache and follow its switch
    /// (`SILICA_NO_PIPELINE_CACHE=1`); a list written by another adapter,
    /// driver or silica version is ignored with a warning. Nothing happens
    /// on the CPU.
    pub fn build_kernels_ahead(&self, tag: &str) {
        if let Device::Gpu(g) = self {
            g.build_kernels_ahead(tag);
        }
    }

    /// Waits until the thread of [`Device::build_kernels_ahead`] is done:
    /// the kernels built, and the process's first read-back from the
    /// device made, which costs about 20 ms more than later ones (a server
    /// calls it before it says it is ready, so that neither competes with
    /// the requests).
    pub fn wait_kernels_ahead(&self) {
        if let Device::Gpu(g) = self {
            g.wait_kernels_ahead();
        }
    }

    /// Saves this device's compiled pipelines for the next process (see
    /// [`GpuDevice::save_pipeline_cache`]); nothing on the CPU.
    pub fn save_pipeline_cache(&self) -> Option<std::path::PathBuf> {
        match self {
            Device::Cpu => None,
            Device::Gpu(g) => g.save_pipeline_cache(),
        }
    }

    /// Kernels built on this device so far and the time spent building
    /// them (see [`GpuDevice::pipeline_builds`]); none on the CPU.
    pub fn pipeline_builds(&self) -> (u64, std::time::Duration) {
        match self {
            Device::Cpu => (0, std::time::Duration::ZERO),
            Device::Gpu(g) => g.pipeline_builds(),
        }
    }

    /// True when both handles are the same device.
    pub fn same(&self, other: &Device) -> bool {
        match (self, other) {
            (Device::Cpu, Device::Cpu) => true,
            (Device::Gpu(a), Device::Gpu(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Memory counters (allocated, reserved, peak, buffers), like
    /// `torch.cuda.memory_stats`. The CPU counts the bytes of its tensors
    /// (process-wide; nothing is cached, so reserved equals allocated).
    pub fn memory_stats(&self) -> MemoryStats {
        match self {
            Device::Cpu => crate::memory::host_stats(),
            Device::Gpu(g) => g.memory().stats(),
        }
    }

    /// Frees cached blocks that no tensor uses (like `torch.cuda.empty_cache`).
    pub fn empty_cache(&self) {
        if let Device::Gpu(g) = self {
            g.memory().empty_cache();
        }
    }

    /// Caps the bytes this device may reserve; `None` removes the cap.
    /// Allocations beyond it fail with [`Error::OutOfMemory`].
    pub fn set_memory_limit(&self, limit: Option<u64>) {
        match self {
            Device::Cpu => crate::memory::host_set_limit(limit),
            Device::Gpu(g) => g.memory().set_limit(limit),
        }
    }

    /// Resets the peak counter to the current allocation.
    pub fn reset_peak_memory(&self) {
        match self {
            Device::Cpu => crate::memory::host_reset_peak(),
            Device::Gpu(g) => g.memory().reset_peak(),
        }
    }

    /// Turns per-kernel GPU profiling on or off (see
    /// [`GpuDevice::set_profiling`]); returns whether it is now on. The CPU
    /// and GPUs without timestamp queries return `false` and record nothing.
    pub fn set_profiling(&self, on: bool) -> bool {
        match self {
            Device::Cpu => false,
            Device::Gpu(g) => g.set_profiling(on),
        }
    }

    /// Whether profiling mode is on.
    pub fn profiling(&self) -> bool {
        match self {
            Device::Cpu => false,
            Device::Gpu(g) => g.profiling(),
        }
    }

    /// GPU time per kernel name (see [`GpuDevice::profile_report`]); empty
    /// on the CPU.
    pub fn profile_report(&self) -> Vec<KernelTime> {
        match self {
            Device::Cpu => Vec::new(),
            Device::Gpu(g) => g.profile_report(),
        }
    }

    /// GPU time per kernel name and workgroup grid (see
    /// [`GpuDevice::profile_report_by_grid`]); empty on the CPU.
    pub fn profile_report_by_grid(&self) -> Vec<KernelTime> {
        match self {
            Device::Cpu => Vec::new(),
            Device::Gpu(g) => g.profile_report_by_grid(),
        }
    }

    /// Clears the profile.
    pub fn reset_profile(&self) {
        if let Device::Gpu(g) = self {
            g.reset_profile();
        }
    }

    /// Waits until all work submitted to the device has finished.
    pub fn synchronize(&self) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            Device::Gpu(g) => g.synchronize(),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Gpu(g) => {
                let i = g.info();
                write!(
                    f,
                    "gpu:{} ({}, {})",
                    i.index.unwrap_or(0),
                    i.name,
                    i.backend.as_str()
                )
            }
        }
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(name: &str, backend: BackendKind, ty: &str) -> DeviceInfo {
        let mut i = cpu_info();
        i.name = name.into();
        i.backend = backend;
        i.device_type = ty.into();
        i
    }

    #[test]
    fn selector_parsing() {
        assert_eq!(Selector::parse("cpu").unwrap(), Selector::Cpu);
        assert_eq!(Selector::parse(" GPU ").unwrap(), Selector::AnyGpu);
        assert_eq!(Selector::parse("gpu:2").unwrap(), Selector::Index(2));
        assert_eq!(
            Selector::parse("Vulkan").unwrap(),
            Selector::Backend(BackendKind::Vulkan)
        );
        assert_eq!(
            Selector::parse("H100").unwrap(),
            Selector::Name("h100".into())
        );
        assert!(Selector::parse("gpu:x").is_err());
        assert!(Selector::parse("").is_err());
    }

    #[test]
    fn selector_resolution() {
        let infos = vec![
            fake("NVIDIA H100", BackendKind::Vulkan, "DiscreteGpu"),
            fake("llvmpipe (LLVM 15)", BackendKind::Vulkan, "Cpu"),
            fake("NVIDIA H100", BackendKind::Gl, "DiscreteGpu"),
        ];
        let r = |s: &str| Selector::parse(s).unwrap().resolve(&infos, s);
        assert_eq!(r("cpu").unwrap(), None);
        assert_eq!(r("gpu").unwrap(), Some(0));
        assert_eq!(r("gpu:1").unwrap(), Some(1));
        assert_eq!(r("gl").unwrap(), Some(2));
        assert_eq!(r("llvmpipe").unwrap(), Some(1));
        let e = r("metal").unwrap_err().to_string();
        assert!(e.contains("no device matches \"metal\""), "{e}");
        assert!(e.contains("gpu:0 NVIDIA H100 (vulkan)"), "{e}");
        assert!(r("gpu:7").is_err());
        assert!(r("radeon").is_err());
        assert!(Selector::AnyGpu.resolve(&[], "gpu").is_err());
    }

    #[test]
    fn ranking_puts_software_and_gl_last() {
        let mut v = [
            fake("llvmpipe", BackendKind::Vulkan, "Cpu"),
            fake("gl", BackendKind::Gl, "DiscreteGpu"),
            fake("igpu", BackendKind::Vulkan, "IntegratedGpu"),
            fake("dgpu", BackendKind::Vulkan, "DiscreteGpu"),
        ];
        v.sort_by_key(rank);
        let names: Vec<&str> = v.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["dgpu", "igpu", "llvmpipe", "gl"]);
    }
}
