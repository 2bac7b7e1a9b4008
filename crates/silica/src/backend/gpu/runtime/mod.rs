//! What every GPU kernel launch needs, in parts: the device's features
//! (`features`), kernels and their pipeline cache (`pipelines`), the
//! batch that dispatches are recorded into and its submission
//! (`submission`), uploads and read-backs (`transfers`) and timestamp
//! profiling (`profiling`). [`Context`] ties them to one wgpu device, with
//! its device-lost and error state.

mod ahead;
mod disk_cache;
mod features;
mod pipelines;
mod profiling;
mod submission;
mod transfers;

use hashbrown::HashMap;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::config::GpuOptions;
use crate::memory::MemoryPool;
use crate::{DeviceInfo, Error, Result};

pub use features::{GpuFeatures, KernelNeeds};
pub(crate) use pipelines::Kernel;
#[cfg(test)]
pub(crate) use pipelines::kernel_source;
pub use profiling::KernelTime;
pub(crate) use submission::{building_only, kernels_only};
pub(crate) use transfers::PendingBytes;

use disk_cache::DiskCache;
use pipelines::{Built, LayoutKey, ModuleMap, PipelineKey};
use profiling::{ProfileMap, Timing};
use submission::Pending;

/// Threads per workgroup of the one-dimensional kernels.
pub(crate) const WG: u32 = 256;

pub(crate) struct Context {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub pool: Arc<MemoryPool>,
    name: String,
    /// What the device runs with, fixed at open.
    features: GpuFeatures,
    /// Test hook: the matmul kernel to use whatever the shape.
    pub forced_matmul: Mutex<Option<&'static str>>,
    /// Decode GEMVs of Q8_0, Q4_0, Q4_1 and Q4_K weights may round x to 8 bits
    /// and take integer dot products (qgemv_i8.wgsl): see
    /// `GpuDevice::int8_activations`.
    pub integer_gemv: AtomicBool,
    max_groups: u32,
    workgroup_memory: u32,
    /// Shader modules by kernel and immediates; shared with the thread that
    /// parses them at device open (see [`Context::parse_in_background`]).
    modules: Arc<Mutex<ModuleMap>>,
    pipelines: Mutex<HashMap<PipelineKey, Built>>,
    /// Kernels a previous process used, built ahead on a thread.
    ahead: ahead::Ahead,
    /// The adapter, its driver and silica's version (disk_cache::cache_key).
    adapter_key: String,
    /// Where kernel lists are kept: `None` with the pipeline cache off.
    lists_dir: Option<std::path::PathBuf>,
    /// The driver's compiled pipelines, saved between processes.
    disk_cache: Option<DiskCache>,
    /// Pipelines built so far, and the nanoseconds spent building them
    /// (WGSL parsing included where it happened on the building thread).
    builds: (std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU64),
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

/// Locks a mutex whose data stays valid even if a holder panicked.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Context {
    pub fn new(adapter: &wgpu::Adapter, info: &DeviceInfo, opts: &GpuOptions) -> Result<Self> {
        let features = GpuFeatures::probe(adapter, opts);
        let mut wanted = wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP
            | wgpu::Features::SUBGROUP_BARRIER
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        let coop = features.coop16 || features.coop8;
        if coop {
            wanted |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        if features.mapped_buffers {
            wanted |= wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
        }
        if features.immediate_bytes > 0 {
            wanted |= wgpu::Features::IMMEDIATES;
        }
        if opts.pipeline_cache {
            wanted |= wgpu::Features::PIPELINE_CACHE;
        }
        let mut limits = adapter.limits();
        limits.max_immediate_size = features.immediate_bytes;
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
            experimental_features: if coop {
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
        let enabled = device.features();
        let timing = if !enabled.contains(wgpu::Features::TIMESTAMP_QUERY) {
            Timing::None
        } else if enabled.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES) {
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
            features.mapped_buffers,
        ));
        let lists_dir = opts
            .pipeline_cache
            .then(|| crate::config::cache_dir().join("pipelines"));
        let disk_cache = match &lists_dir {
            Some(dir) => DiskCache::open(&device, &adapter.get_info(), dir),
            None => None,
        };
        Ok(Self {
            device,
            queue,
            pool,
            name: info.name.clone(),
            forced_matmul: Mutex::new(None),
            integer_gemv: AtomicBool::new(opts.integer_gemv.unwrap_or(features.integer_dots)),
            max_groups: limits.max_compute_workgroups_per_dimension,
            workgroup_memory: limits.max_compute_workgroup_storage_size,
            modules: Arc::new(Mutex::new(HashMap::new())),
            pipelines: Mutex::new(HashMap::new()),
            ahead: Default::default(),
            adapter_key: disk_cache::cache_key(&adapter.get_info()),
            lists_dir,
            disk_cache,
            builds: Default::default(),
            layouts: Mutex::new(HashMap::new()),
            pending: Mutex::new(Pending {
                pass: None,
                encoder: None,
                slab: None,
                full_slabs: Vec::new(),
                slot: 0,
                dispatches: 0,
                timed: Vec::new(),
                limit: features.first_batch,
                submitted: 0,
            }),
            lost,
            error,
            profiling: AtomicBool::new(false),
            timing,
            per_pass: AtomicBool::new(false),
            per_batch: AtomicBool::new(false),
            queries: OnceLock::new(),
            profile: Mutex::new(BTreeMap::new()),
            features,
        })
    }

    /// Queues the kernels the list of `tag` names (see [`ahead`]) for a
    /// builder thread, those of `kernels` only; from now on the pipelines
    /// used are listed under `tag` at each save. True if the caller is to
    /// start the thread (it runs [`Context::build_ahead`], then
    /// [`Context::finish_ahead`]).
    pub fn queue_ahead(&self, tag: &str, kernels: &[&'static Kernel]) -> bool {
        let Some(dir) = &self.lists_dir else {
            return false;
        };
        let path = ahead::list_path(dir, &self.adapter_key, tag);
        let entries = ahead::read_list(&path, &self.adapter_key, kernels);
        tracing::debug!(
            target: "silica::pipelines",
            path = %path.display(),
            kernels = entries.len(),
            "kernels to build ahead"
        );
        self.ahead.start(entries, path)
    }

    /// Drops the kernels queued to build ahead (no thread to build them).
    pub fn abandon_ahead(&self) {
        self.ahead.abandon();
    }

    /// The builder thread is done.
    pub fn finish_ahead(&self) {
        self.ahead.finish();
    }

    /// Waits until the builder thread is done.
    pub fn wait_ahead(&self) {
        self.ahead.wait();
    }

    /// Writes the list of the pipelines used, if a tag was given.
    fn save_kernel_list(&self) {
        let Some(path) = self.ahead.list() else {
            return;
        };
        use std::sync::atomic::Ordering::Relaxed;
        let pipelines = lock(&self.pipelines);
        // custom kernels are registered by the program as it runs, so a
        // later process could not build them from the list
        let mut used: Vec<_> = pipelines
            .iter()
            .filter(|(k, b)| {
                b.used.load(Relaxed)
                    && !k
                        .name
                        .starts_with(crate::backend::gpu::custom::CUSTOM_PREFIX)
            })
            .collect();
        // in the order they were built: a prompt's kernels first
        used.sort_by_key(|(_, b)| b.order);
        let used = used
            .into_iter()
            .map(|(k, _)| (k.name, &k.constants[..], k.immediates));
        if let Err(e) = ahead::write_list(&path, &self.adapter_key, used) {
            tracing::warn!("kernel list {} not saved: {e}", path.display());
        }
    }

    /// Saves the driver's compiled pipelines if any were built since the
    /// last save, and the list of kernels used where a tag was given (the
    /// kernels still queued to build ahead are dropped first): the cache
    /// file written, or `None`.
    pub fn save_pipeline_cache(&self) -> Option<std::path::PathBuf> {
        self.ahead.stop();
        self.save_kernel_list();
        let cache = self.disk_cache.as_ref()?;
        match cache.save() {
            Ok(true) => Some(cache.path().to_path_buf()),
            Ok(false) => None,
            Err(e) => {
                tracing::warn!("pipeline cache {} not saved: {e}", cache.path().display());
                None
            }
        }
    }

    /// Pipelines built so far and the time spent building them.
    pub fn pipeline_builds(&self) -> (u64, std::time::Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.builds.0.load(Relaxed),
            std::time::Duration::from_nanos(self.builds.1.load(Relaxed)),
        )
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

    /// What the device runs with.
    pub fn features(&self) -> &GpuFeatures {
        &self.features
    }

    pub fn coop16(&self) -> bool {
        self.features.coop16
    }

    pub fn coop8(&self) -> bool {
        self.features.coop8
    }

    /// The subgroup width that the kernels' subgroup forms run with, 0
    /// where they keep their workgroup-memory trees (see `subgroup_width`).
    pub(crate) fn subgroup_width(&self) -> u32 {
        self.features.subgroup_width
    }

    /// Bytes of workgroup memory a kernel may use.
    pub fn workgroup_memory(&self) -> u32 {
        self.workgroup_memory
    }

    pub fn max_groups(&self) -> u32 {
        self.max_groups
    }
}
