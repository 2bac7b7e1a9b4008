//! Kernels, their WGSL as a device builds it, and the caches of shader
//! modules, layouts and pipelines.

use hashbrown::{Equivalent, HashMap};
use std::hash::{Hash, Hasher};

use super::{Context, KernelNeeds, lock};
use crate::Result;

/// A WGSL module (`common.wgsl`, the fragments it uses, then its own file)
/// and how it is bound and built.
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
    /// The parameters may travel as immediates where they fit. Most
    /// kernels gain from it; the 128x128-tile matmul kernels run slower
    /// with it on NVIDIA's driver, so they keep the uniform buffer
    /// (docs/tuning.md, "Immediates").
    pub immediates: bool,
    /// What the kernel needs of the device: a device without it never
    /// builds the kernel, and its launcher picks another.
    pub needs: KernelNeeds,
}

/// A kernel, its override constants (as bits) and whether its parameters
/// are immediates.
#[derive(PartialEq, Eq)]
pub(super) struct PipelineKey {
    pub name: &'static str,
    pub constants: Vec<(&'static str, u64)>,
    pub immediates: bool,
}

/// A built pipeline, and whether a dispatch (or a build for one to come)
/// asked for it: the kernel lists of [`super::ahead`] keep those only.
pub(super) struct Built {
    pub pipeline: wgpu::ComputePipeline,
    pub used: std::sync::atomic::AtomicBool,
    /// Builds on the device before this one (the lists keep this order).
    pub order: u64,
}

/// A [`PipelineKey`] as a dispatch has it, looked up without building one
/// (a dispatch finds its pipeline in the cache all but the first time).
pub(super) struct PipelineQuery<'a> {
    name: &'static str,
    constants: &'a [(&'static str, f64)],
    immediates: bool,
}

/// The one hash of a [`PipelineKey`] and of its [`PipelineQuery`].
pub(super) fn hash_pipeline<H: Hasher>(
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

impl<'a> PipelineQuery<'a> {
    pub fn new(name: &'static str, constants: &'a [(&'static str, f64)], immediates: bool) -> Self {
        Self {
            name,
            constants,
            immediates,
        }
    }

    /// The key this query finds.
    pub fn key(&self) -> PipelineKey {
        PipelineKey {
            name: self.name,
            constants: self
                .constants
                .iter()
                .map(|&(k, v)| (k, v.to_bits()))
                .collect(),
            immediates: self.immediates,
        }
    }

    /// Whether both ask for the same pipeline.
    pub fn same(&self, other: &PipelineQuery) -> bool {
        self.equivalent(&other.key())
    }
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

/// How every kernel declares its parameters (binding 0 of its group).
pub(super) const UNIFORM_PARAMS: &str = "@group(0) @binding(0) var<uniform> p:";

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
pub(super) const SUBGROUP_FORMS: [(&str, &str); 3] = [
    (
        include_str!("../kernels/shared/rows.wgsl"),
        include_str!("../kernels/shared/rows_sg.wgsl"),
    ),
    (
        include_str!("../kernels/shared/lanes.wgsl"),
        include_str!("../kernels/shared/lanes_sg.wgsl"),
    ),
    (
        include_str!("../kernels/shared/scores.wgsl"),
        include_str!("../kernels/shared/scores_sg.wgsl"),
    ),
];

/// Read-only inputs, read-write outputs, parameters as immediates: what
/// sets a kernel's bind group and pipeline layouts apart.
pub(super) type LayoutKey = (u32, u32, bool);

/// Shader modules by (kernel name, parameters as immediates).
pub(super) type ModuleMap = HashMap<(&'static str, bool), wgpu::ShaderModule>;

/// Builds a kernel's shader module: naga parses and validates its WGSL.
pub(super) fn create_module(
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

impl Context {
    /// Parses the modules of `kernels` on a thread of their own, so that
    /// the first dispatches of a process (a model's first token, while the
    /// weights were loading) find them ready instead of parsing and
    /// validating WGSL on the first token's path (docs/tuning.md, "Kernels
    /// parsed at device open"). A kernel the process reaches before the thread does
    /// is parsed where it is needed, as without the thread. Modules that
    /// fail to build are left out (the dispatch then reports the error).
    pub fn parse_in_background(&self, kernels: Vec<&'static Kernel>) {
        let device = self.device.clone();
        let modules = self.modules.clone();
        let immediates = self.features.immediate_bytes > 0;
        let subgroups = self.features.subgroup_width > 0;
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

    /// The layouts of a kernel with `inputs` inputs, its parameters in
    /// immediates or at binding 0.
    pub(super) fn layout(
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
                        immediate_size: if immediates {
                            self.features.immediate_bytes
                        } else {
                            0
                        },
                    });
                (bgl, pl)
            })
            .clone()
    }

    pub(super) fn pipeline(
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
        if let Some(p) = self.built(&query, true) {
            return Ok(p);
        }
        // a kernel listed to build ahead is taken off the list, or waited
        // for while the builder thread has it in hand
        self.ahead.claim(&query);
        self.build_pipeline(kernel, constants, immediates, true)
    }

    /// The pipeline of `query` if it is built, marked as used if `use_it`.
    fn built(&self, query: &PipelineQuery, use_it: bool) -> Option<wgpu::ComputePipeline> {
        use std::sync::atomic::Ordering::Relaxed;
        let pipelines = lock(&self.pipelines);
        let b = pipelines.get(query)?;
        if use_it && !b.used.load(Relaxed) {
            b.used.store(true, Relaxed);
        }
        Some(b.pipeline.clone())
    }

    /// Builds the pipeline (unless another thread did meanwhile), marked as
    /// used if `used`.
    pub(super) fn build_pipeline(
        &self,
        kernel: &Kernel,
        constants: &[(&'static str, f64)],
        immediates: bool,
        used: bool,
    ) -> Result<wgpu::ComputePipeline> {
        let query = PipelineQuery {
            name: kernel.name,
            constants,
            immediates,
        };
        if let Some(p) = self.built(&query, used) {
            return Ok(p);
        }
        let key = query.key();
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let started = std::time::Instant::now();
        let module = lock(&self.modules)
            .entry((kernel.name, immediates))
            .or_insert_with(|| {
                create_module(
                    &self.device,
                    kernel,
                    immediates,
                    self.features.subgroup_width > 0,
                )
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
                cache: self.disk_cache.as_ref().map(|c| &c.cache),
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(self.gpu_err(format!("kernel {} failed to build: {e}", kernel.name)));
        }
        if let Some(c) = &self.disk_cache {
            c.touch();
        }
        let order = {
            use std::sync::atomic::Ordering::Relaxed;
            let order = self.builds.0.fetch_add(1, Relaxed);
            let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.builds.1.fetch_add(nanos, Relaxed);
            order
        };
        tracing::debug!(
            target: "silica::pipelines",
            kernel = kernel.name,
            module_ms = module_time.as_secs_f64() * 1e3,
            total_ms = started.elapsed().as_secs_f64() * 1e3,
            "built a pipeline (module: WGSL parsed and validated, or found; the rest: translation and the driver)"
        );
        let mut pipelines = lock(&self.pipelines);
        let b = pipelines.entry(key).or_insert(Built {
            pipeline,
            used: std::sync::atomic::AtomicBool::new(used),
            order,
        });
        if used {
            b.used.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(b.pipeline.clone())
    }
}
