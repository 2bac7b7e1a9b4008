//! The GPU backend: [`GpuDevice`] (one opened wgpu adapter: its runtime,
//! fallback counters and modes, and the op dispatch onto kernels), in parts:
//! `runtime/` (features, pipelines, submission, transfers, profiling),
//! `kernels/` (the WGSL kernels and their launchers) and `custom` (the GPU
//! side of custom ops).

pub(crate) mod custom;
mod kernels;
#[cfg(test)]
mod pipeline_stats;
mod runtime;
#[cfg(test)]
mod shader_tests;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::GpuOptions;
pub use crate::memory::GpuBuffer;
use crate::memory::MemoryPool;
use crate::storage::{CpuStorage, Storage};
use crate::{DType, DeviceInfo, Error, Op, Result, Tensor};
pub use custom::GpuCall;
pub(crate) use kernels::qmatmul;
use kernels::{copy, elementwise, matmul, nn, reduce};
pub(crate) use runtime::{Context, Kernel, building_only};
pub use runtime::{GpuFeatures, KernelNeeds, KernelTime};

/// A read-back of a range of elements under way.
pub(crate) struct PendingDownload {
    bytes: Option<runtime::PendingBytes>,
    skip: usize,
    len: usize,
    dtype: DType,
}

/// Every kernel, those of a transformer's forward first (the order in which
/// they are parsed ahead at device open).
fn every_kernel() -> Vec<&'static Kernel> {
    vec![
        &qmatmul::QGEMV,
        &qmatmul::QGEMV_I8,
        &nn::ATTENTION_STEP,
        &nn::ATTENTION_STEP_SG,
        &nn::ATTENTION_STEP_SG_BATCH,
        &reduce::NORM_VEC,
        &nn::ROPE,
        &elementwise::BINARY,
        &elementwise::BINARY_VEC,
        &copy::COPY,
        &copy::COPY_VEC,
        &qmatmul::QROWS,
        &reduce::REDUCE,
        &elementwise::UNARY,
        &matmul::GEMV,
        &qmatmul::QMATMUL_COOP,
        &qmatmul::QMATMUL_NARROW,
        &qmatmul::SPLIT_SUM,
        &qmatmul::QMATMUL,
        &nn::FLASH_COOP,
        &nn::ATTENTION_COMBINE,
        &nn::DECODE_ATTENTION,
        &matmul::MATMUL_COOP_VEC,
        &matmul::MATMUL_NARROW,
        &matmul::MATMUL_COOP_WIDE,
        &matmul::MATMUL_BIG,
        &matmul::MATMUL,
        &matmul::MATMUL_COOP,
        &matmul::MATMUL_COOP8,
        &reduce::SOFTMAX,
        &reduce::SOFTMAX_VEC,
        &nn::NORM,
        &nn::ATTENTION,
        &nn::FLASH_ATTENTION_32,
        &nn::FLASH_ATTENTION_16,
        &copy::CAT,
        &copy::INDEX_SELECT,
        &elementwise::WHERE,
    ]
}

/// An opened wgpu adapter: the device, its queue, its memory pool, its
/// pipeline cache and its fallback counters.
pub struct GpuDevice {
    ctx: Context,
    info: DeviceInfo,
    strict: AtomicBool,
    check: AtomicBool,
    fallbacks: Mutex<BTreeMap<String, u64>>,
    disabled: Mutex<HashSet<&'static str>>,
}

/// One line of the fallback report: an op that ran on the CPU instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FallbackCount {
    /// `op/dtype`, for example `matmul/bf16`.
    pub op: String,
    pub count: u64,
}

impl GpuDevice {
    pub(crate) fn open(
        adapter: &wgpu::Adapter,
        info: DeviceInfo,
        opts: &GpuOptions,
    ) -> Result<Self> {
        let ctx = Context::new(adapter, &info, opts)?;
        // the kernels of a transformer's forward first; those the adapter
        // cannot build are left out
        let kernels = every_kernel()
            .into_iter()
            .filter(|k| ctx.features().runs(k.needs))
            .collect();
        ctx.parse_in_background(kernels);
        let dev = Self {
            ctx,
            info,
            strict: AtomicBool::new(opts.strict),
            check: AtomicBool::new(opts.check),
            fallbacks: Mutex::new(BTreeMap::new()),
            disabled: Mutex::new(HashSet::new()),
        };
        if opts.profile && !dev.set_profiling(true) {
            tracing::warn!(
                "SILICA_PROFILE: {} has no timestamp queries, nothing will be profiled",
                dev.info.name
            );
        }
        Ok(dev)
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Whether a quantized product of `m` rows of f16 x (fewer than 64)
    /// with `weight_rows` rows of `k` values takes a tensor-core kernel on
    /// this device (see `qmatmul::narrow_coop` and
    /// `qmatmul::decodes_first`).
    pub(crate) fn narrow_coop(
        &self,
        format: crate::QuantFormat,
        m: usize,
        weight_rows: usize,
        k: usize,
    ) -> bool {
        kernels::qmatmul::narrow_coop(&self.ctx, format, m, weight_rows, k)
            || kernels::qmatmul::decodes_first(&self.ctx, m, weight_rows, k)
    }

    /// What this device runs with: the adapter's features less those its
    /// [`GpuOptions`] turned off.
    pub fn features(&self) -> &GpuFeatures {
        self.ctx.features()
    }

    /// Whether tensor buffers are mapped by the host for uploads and
    /// read-backs, with no staging copy: on unified-memory adapters
    /// (integrated and software GPUs) unless `SILICA_NO_MAPPED=1`.
    pub fn maps_buffers(&self) -> bool {
        self.ctx.pool.mappable()
    }

    pub(crate) fn memory(&self) -> &Arc<MemoryPool> {
        &self.ctx.pool
    }

    pub fn is_lost(&self) -> bool {
        self.ctx.lost_reason().is_some()
    }

    pub(crate) fn check_alive(&self) -> Result<()> {
        self.ctx.check_alive()
    }

    pub fn synchronize(&self) -> Result<()> {
        self.ctx.synchronize()
    }

    /// Saves the driver's compiled pipelines to the cache folder if any
    /// were built since the last save (Vulkan; see
    /// [`GpuOptions::pipeline_cache`](crate::GpuOptions::pipeline_cache)):
    /// the file written, or `None`. A failure to write is a warning, never
    /// an error.
    pub fn save_pipeline_cache(&self) -> Option<std::path::PathBuf> {
        self.ctx.save_pipeline_cache()
    }

    /// Kernels (pipelines) built on this device so far, by any thread, and
    /// the time spent building them: WGSL parsing where it was not done
    /// ahead, translation and the driver's compilation (or its cache).
    pub fn pipeline_builds(&self) -> (u64, std::time::Duration) {
        self.ctx.pipeline_builds()
    }

    /// Batches of recorded work submitted to the GPU so far. A wait that
    /// leaves the GPU idle (a read-back with nothing submitted after it, a
    /// synchronization) makes the next batch short (`first_batch`
    /// dispatches), and each batch after it twice as long, up to
    /// `submit_every` ([`GpuOptions`](crate::GpuOptions)).
    pub fn batches_submitted(&self) -> u64 {
        self.ctx.submitted()
    }

    /// See [`crate::Device::build_kernels_ahead`].
    pub fn build_kernels_ahead(self: &Arc<Self>, tag: &str) {
        let kernels: Vec<&'static Kernel> = every_kernel()
            .into_iter()
            .filter(|k| self.ctx.features().runs(k.needs))
            .collect();
        if !self.ctx.queue_ahead(tag, &kernels) {
            return;
        }
        let dev = self.clone();
        let spawned = std::thread::Builder::new()
            .name("silica-ahead".into())
            .spawn(move || {
                dev.ctx.build_ahead();
                dev.first_read_back();
                dev.ctx.finish_ahead();
            });
        if let Err(e) = spawned {
            tracing::debug!("no thread to build kernels ahead: {e}");
            self.ctx.abandon_ahead();
        }
    }

    /// A process's first read-back from the device takes about 20 ms more
    /// than the next ones (H200: a 4-byte read 19–24 ms, then 0.2–0.5 ms),
    /// so the thread that builds kernels ahead makes one while the model
    /// loads, instead of the first prompt (docs/tuning.md, "Kernels built
    /// ahead").
    fn first_read_back(self: &Arc<Self>) {
        let device = crate::Device::Gpu(self.clone());
        let read = Tensor::zeros(&[4], DType::F32, &device).and_then(|t| t.to_vec::<f32>());
        if let Err(e) = read {
            tracing::debug!("the first read-back ahead failed: {e}");
        }
    }

    /// See [`crate::Device::wait_kernels_ahead`].
    pub fn wait_kernels_ahead(&self) {
        self.ctx.wait_ahead();
    }

    /// See [`crate::Device::build_kernels_only`].
    pub fn build_kernels_only<R>(&self, f: impl FnOnce() -> R) -> R {
        runtime::kernels_only(f)
    }

    /// Runs `f`, which records GPU work, between two timestamps on the
    /// device's own timeline and waits for it: `Some(seconds)` of GPU time
    /// (idle gaps between kernels included, as with CUDA events around a
    /// loop), `None` where the adapter has no timestamp queries.
    pub fn gpu_time<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<(R, Option<f64>)> {
        self.synchronize()?;
        let timer = self.ctx.timer_start()?;
        let r = f()?;
        let secs = match timer {
            Some(t) => Some(self.ctx.timer_stop(t)?),
            None => {
                self.synchronize()?;
                None
            }
        };
        Ok((r, secs))
    }

    /// Profiling mode: every kernel dispatch is timed on the GPU's own
    /// timeline (timestamp queries written before and after it, inside the
    /// shared compute pass where the device has
    /// `TIMESTAMP_QUERY_INSIDE_PASSES`, else in a compute pass of its own)
    /// and summed per kernel in [`GpuDevice::profile_report`]. Returns
    /// whether profiling is now on: `false` when turned off, and where the
    /// device has no timestamp queries (then nothing is recorded). Starts
    /// on with `SILICA_PROFILE=1`.
    ///
    /// A diagnostic mode: each submitted batch is waited for and its
    /// timestamps read back synchronously, so work runs slower than without
    /// it. Off, it costs one relaxed atomic load per dispatch.
    pub fn set_profiling(&self, on: bool) -> bool {
        self.ctx.set_profiling(on)
    }

    /// Whether profiling mode is on.
    pub fn profiling(&self) -> bool {
        self.ctx.profiling()
    }

    /// Whether the device has the timestamp queries profiling needs.
    pub fn can_profile(&self) -> bool {
        self.ctx.can_profile()
    }

    /// GPU time per kernel name since the last [`GpuDevice::reset_profile`],
    /// the most time first. Covers work submitted so far: call
    /// [`GpuDevice::synchronize`] first to include everything recorded.
    pub fn profile_report(&self) -> Vec<KernelTime> {
        self.ctx.profile_report(false)
    }

    /// As [`GpuDevice::profile_report`], one line per kernel name and
    /// workgroup grid (which tells apart, say, the projections of a layer
    /// that all run `qgemv`).
    pub fn profile_report_by_grid(&self) -> Vec<KernelTime> {
        self.ctx.profile_report(true)
    }

    /// Clears the profile (profiling mode stays as it is).
    pub fn reset_profile(&self) {
        self.ctx.reset_profile();
    }

    /// In profiling mode, time each submitted batch of dispatches as a
    /// whole instead of each dispatch: the report then has one entry,
    /// `(batches)`, the GPU time from the start of each batch's first
    /// kernel to the end of its last, gaps between kernels included. Marks
    /// around every kernel cost GPU time of their own, so their sum
    /// overstates how long a stream of small kernels keeps the GPU busy;
    /// this is the figure to set beside the wall-clock time.
    pub fn set_profile_batches(&self, on: bool) {
        self.ctx.set_profile_batches(on);
    }

    /// Test hook: in profiling mode, time each dispatch with a compute pass
    /// of its own even where timestamps inside passes are available.
    #[doc(hidden)]
    pub fn profile_per_pass_for_testing(&self, on: bool) {
        self.ctx.set_profile_per_pass(on);
    }

    /// Strict mode: a missing kernel is an error instead of a CPU fallback.
    /// Starts as `SILICA_STRICT`.
    pub fn set_strict(&self, on: bool) {
        self.strict.store(on, Ordering::Relaxed);
    }

    /// Check mode: every GPU op is re-run on the CPU and compared. Starts as `SILICA_CHECK`.
    pub fn set_check(&self, on: bool) {
        self.check.store(on, Ordering::Relaxed);
    }

    /// Whether the GEMV kernels' products with Q4_0, Q4_1, Q8_0, Q4_K, Q5_K
    /// and Q6_K weights (decode, and up to `GpuFeatures::gemv_rows` rows
    /// of activations where those take them: short prompts, a server's
    /// steps) round the activations to 8 bits per block of 32 and multiply with packed
    /// integer dot products, as llama.cpp's GPU backends do; the exact f32
    /// kernel otherwise. Each output may then differ from the exact
    /// product by up to `Σ |w| · amax(x) / 254` over the blocks of 32, the
    /// bound of [`crate::cpu_int8_activations`]. On by default on GPUs
    /// through Vulkan (whose drivers run a packed dot product as one
    /// instruction), off elsewhere; `SILICA_INTEGER_GEMV=1` or `0` decides
    /// at device open. Check mode (`SILICA_CHECK`) takes the exact kernel
    /// whatever this says.
    pub fn int8_activations(&self) -> bool {
        self.ctx.integer_gemv.load(Ordering::Relaxed)
    }

    /// Turns [`GpuDevice::int8_activations`] on or off for this device.
    pub fn set_int8_activations(&self, on: bool) {
        self.ctx.integer_gemv.store(on, Ordering::Relaxed);
    }

    pub(crate) fn check_mode(&self) -> bool {
        self.check.load(Ordering::Relaxed)
    }

    /// Ops that ran on the CPU because this device had no kernel, with counts.
    pub fn fallback_report(&self) -> Vec<FallbackCount> {
        let map = self.fallbacks.lock().unwrap_or_else(|e| e.into_inner());
        map.iter()
            .map(|(op, &count)| FallbackCount {
                op: op.clone(),
                count,
            })
            .collect()
    }

    /// Test hook: pretend this device has no kernel for the op named `name`
    /// (as in [`Op::name`]), so that it falls back to the CPU.
    #[doc(hidden)]
    pub fn disable_kernel_for_testing(&self, name: &'static str) {
        self.disabled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name);
    }

    /// Whether [`GpuDevice::disable_kernel_for_testing`] named this op.
    pub(crate) fn is_disabled(&self, name: &str) -> bool {
        self.disabled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
    }

    /// Test hook: run every matmul with the kernel named `name` (`matmul`,
    /// `matmul_big`, `matmul_coop`, `matmul_coop_sg4`, `matmul_coop_vec`,
    /// `matmul_coop_wide`, `matmul_narrow`, `gemv`) whatever its shape, so that the parity
    /// suite covers each on small inputs; `None` restores the choice by
    /// shape. `matmul_coop`
    /// applies only where the adapter has cooperative matrices and to f16
    /// operands; `matmul_coop_sg4` is the same kernel with the 4 subgroups
    /// of its Apple form, on 16x16 fragments; `matmul_coop_vec` (and
    /// `matmul_coop_wide`, its 128x256 tiles) also only to the layouts it
    /// reads 8 halves at a time; `matmul_narrow` to f16 products of up to
    /// 32 rows whose b is a weight `[n, k]` transposed.
    #[doc(hidden)]
    pub fn force_matmul_kernel_for_testing(&self, name: Option<&'static str>) {
        *self
            .ctx
            .forced_matmul
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = name;
    }

    /// Test hook: destroys the underlying wgpu device, as a driver reset
    /// would. Every later op on it returns [`Error::DeviceLost`];
    /// `Device::gpu` then opens a fresh device.
    #[doc(hidden)]
    pub fn destroy_for_testing(&self) {
        self.ctx.destroy();
    }

    /// Counts a CPU fallback of the op named `op` and warns the first time;
    /// an error in strict mode.
    pub(crate) fn record_fallback(&self, op: &'static str, dtype: DType) -> Result<()> {
        if self.strict.load(Ordering::Relaxed) {
            return Err(Error::FallbackForbidden {
                op,
                dtype,
                device: self.info.name.clone(),
            });
        }
        let key = format!("{op}/{dtype}");
        let mut map = self.fallbacks.lock().unwrap_or_else(|e| e.into_inner());
        let count = map.entry(key).or_insert(0);
        if *count == 0 {
            tracing::warn!(
                "{op} ({dtype}) has no kernel on {}: running it on the CPU (SILICA_STRICT=1 makes this an error)",
                self.info.name
            );
        }
        *count += 1;
        Ok(())
    }

    /// Whether a GPU kernel exists for `op` with inputs of these dtypes.
    pub(crate) fn has_kernel(&self, op: &Op, inputs: &[&Tensor]) -> bool {
        let dtypes: Vec<DType> = inputs.iter().map(|t| t.dtype()).collect();
        self.supports(op, &dtypes)
    }

    /// Whether a GPU kernel exists for `op` with inputs of these dtypes
    /// (what `silica devices --ops` prints).
    pub fn supports(&self, op: &Op, dtypes: &[DType]) -> bool {
        if self.is_disabled(op.name()) {
            return false;
        }
        match op {
            // bitwise kernels: any dtype
            Op::Copy | Op::Cat { .. } | Op::IndexSelect { .. } | Op::Cast | Op::Where => true,
            // float activations, the blocks as words
            Op::QMatmul { .. } => dtypes.first().is_some_and(|d| d.is_float()),
            Op::QRows { .. } => true,
            _ => dtypes.iter().all(|d| d.is_float()),
        }
    }

    pub(crate) fn execute(
        &self,
        op: &Op,
        inputs: &[&Tensor],
        out_shape: &[usize],
        out_dtype: DType,
    ) -> Result<Storage> {
        let n: usize = out_shape.iter().product();
        let out = self
            .ctx
            .pool
            .alloc((n * out_dtype.size_in_bytes()) as u64)?;
        if n == 0 {
            return Ok(Storage::Gpu(out));
        }
        let c = &self.ctx;
        match *op {
            Op::Unary(u) => elementwise::unary(c, u as u32, inputs[0], &out, out_dtype)?,
            Op::BinaryScalar(b, s) => {
                elementwise::binary(c, b as u32, inputs[0], None, s, &out, out_dtype)?
            }
            Op::Binary(b) => elementwise::binary(
                c,
                b as u32,
                inputs[0],
                Some(inputs[1]),
                0.0,
                &out,
                out_dtype,
            )?,
            Op::Compare(cmp) => {
                let code = elementwise::CMP_BASE + cmp as u32;
                elementwise::binary(c, code, inputs[0], Some(inputs[1]), 0.0, &out, out_dtype)?
            }
            Op::Where => elementwise::where_cond(c, inputs, &out)?,
            Op::Cast => {
                if inputs[0].dtype().is_float() || out_dtype.is_float() {
                    elementwise::unary(c, elementwise::OP_CAST, inputs[0], &out, out_dtype)?
                } else {
                    copy::copy(c, inputs[0], &out, out_dtype)?
                }
            }
            Op::Copy => copy::copy(c, inputs[0], &out, out_dtype)?,
            Op::Cat { axis } => copy::cat(c, inputs, axis, out_shape, &out)?,
            Op::IndexSelect { axis } => {
                copy::index_select(c, inputs[0], inputs[1], axis, out_shape, &out)?
            }
            Op::Reduce(r) => reduce::reduce(c, r, inputs[0], &out, out_dtype)?,
            Op::Softmax { log } => reduce::softmax(c, log, inputs[0], &out, out_dtype)?,
            Op::Matmul => matmul::matmul(c, inputs[0], inputs[1], out_shape, &out, out_dtype)?,
            Op::QRows { format, k } => {
                qmatmul::qrows(c, format, inputs[0], inputs[1], k, &out, out_dtype)?
            }
            Op::QMatmul { format } => {
                // check mode compares with the CPU's exact products
                let int8 = self.int8_activations() && !self.check_mode();
                let plain = crate::QFusion::NONE;
                qmatmul::qmatmul(c, format, plain, int8, inputs, out_shape, &out, out_dtype)?
            }
            Op::RmsNorm { eps } => nn::norm(c, inputs[0], inputs[1], None, eps, &out, out_dtype)?,
            Op::LayerNorm { eps } => nn::norm(
                c,
                inputs[0],
                inputs[1],
                Some(inputs[2]),
                eps,
                &out,
                out_dtype,
            )?,
            Op::Rope { style, rotated } => nn::rope(c, inputs, style, rotated, &out, out_dtype)?,
            Op::Attention { scale, causal } => {
                nn::attention(c, inputs, scale, causal, &out, out_dtype)?
            }
        }
        Ok(Storage::Gpu(out))
    }

    /// Writes the elements of `src` (a tensor on this device, same dtype) in
    /// row-major order into `dst` from element `offset` on.
    pub(crate) fn write_into(&self, dst: &GpuBuffer, offset: usize, src: &Tensor) -> Result<()> {
        self.ctx.check_alive()?;
        if src.numel() == 0 {
            return Ok(());
        }
        if copy::can_copy_into(src.dtype(), offset, src.numel()) {
            return copy::copy_into(&self.ctx, src, dst, offset);
        }
        // a 16-bit run that shares a word with its neighbours: read-modify-write
        // on the host (rare: KV rows have even widths)
        let es = src.dtype().size_in_bytes();
        let first = offset * es / 4 * 4 / es;
        let n = (offset + src.numel() - first).next_multiple_of(2);
        let mut host = self.download(dst, first, n, src.dtype())?;
        host.write_at(offset - first, &src.to_host()?);
        self.ctx.write_at(dst, (first * es) as u64, host.as_bytes())
    }

    /// Copies host elements into a new device buffer.
    pub(crate) fn upload(&self, data: &CpuStorage) -> Result<GpuBuffer> {
        self.ctx.check_alive()?;
        self.ctx.upload(data.as_bytes())
    }

    /// Copies raw bytes (quantized blocks) into a new device buffer, zero
    /// padded to whole words.
    pub(crate) fn upload_bytes(&self, bytes: &[u8]) -> Result<GpuBuffer> {
        self.ctx.check_alive()?;
        self.ctx.upload(bytes)
    }

    /// A buffer of `bytes` zero bytes.
    pub(crate) fn zeros(&self, bytes: usize) -> Result<GpuBuffer> {
        self.ctx.check_alive()?;
        let buf = self.ctx.pool.alloc(bytes as u64)?;
        self.ctx.clear(&buf);
        Ok(buf)
    }

    /// Reads `n` contiguous elements starting at element `offset`.
    pub(crate) fn download(
        &self,
        buf: &GpuBuffer,
        offset: usize,
        n: usize,
        dtype: DType,
    ) -> Result<CpuStorage> {
        if n == 0 {
            return Ok(CpuStorage::from_bytes(dtype, &[]));
        }
        // reads start and end on 4-byte boundaries
        let es = dtype.size_in_bytes() as u64;
        let start = offset as u64 * es;
        let aligned = start & !3;
        let skip = (start - aligned) as usize;
        let len = n * es as usize;
        let size = (skip + len).next_multiple_of(4) as u64;
        self.ctx.read_with(buf.raw(), aligned, size, |bytes| {
            CpuStorage::from_bytes(dtype, &bytes[skip..skip + len])
        })
    }

    /// Starts reading `n` contiguous elements from element `offset` on;
    /// work recorded afterwards does not delay [`GpuDevice::download_finish`].
    pub(crate) fn download_start(
        &self,
        buf: &GpuBuffer,
        offset: usize,
        n: usize,
        dtype: DType,
    ) -> Result<PendingDownload> {
        let es = dtype.size_in_bytes() as u64;
        let start = offset as u64 * es;
        let end = start + n as u64 * es;
        if n == 0 {
            return Ok(PendingDownload {
                bytes: None,
                skip: 0,
                len: 0,
                dtype,
            });
        }
        // copies must start and end on 4-byte boundaries
        let aligned = start & !3;
        let bytes = self
            .ctx
            .read_start(buf.raw(), aligned, end.next_multiple_of(4) - aligned)?;
        Ok(PendingDownload {
            bytes: Some(bytes),
            skip: (start - aligned) as usize,
            len: (end - start) as usize,
            dtype,
        })
    }

    pub(crate) fn download_finish(&self, pending: PendingDownload) -> Result<CpuStorage> {
        let Some(bytes) = pending.bytes else {
            return Ok(CpuStorage::from_bytes(pending.dtype, &[]));
        };
        let (skip, len, dtype) = (pending.skip, pending.len, pending.dtype);
        self.ctx.read_finish_with(bytes, |b| {
            CpuStorage::from_bytes(dtype, &b[skip..skip + len])
        })
    }
}
