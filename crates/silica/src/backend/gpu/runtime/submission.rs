//! Recording dispatches into the one pending batch (a command encoder
//! and its open compute pass) and submitting it.

use std::sync::atomic::Ordering;

use super::pipelines::Kernel;
use super::profiling::BATCH;
use super::{Context, lock};
use crate::Result;
use crate::memory::{GpuBuffer, tensor_entries};

/// Bytes of one kernel's parameter slot in a slab (the largest uniform
/// offset alignment wgpu allows); a slab holds a slot per dispatch of a batch.
pub(super) const SLOT_BYTES: u64 = 256;

/// Work recorded but not yet submitted.
pub(super) struct Pending {
    /// The open compute pass that consecutive dispatches share; dropped
    /// (ended) before a copy is recorded and before submitting.
    pub(super) pass: Option<wgpu::ComputePass<'static>>,
    pub(super) encoder: Option<wgpu::CommandEncoder>,
    /// The uniform buffer that this batch's kernel parameters go into, one
    /// slot per dispatch. It stays mapped while slots are written and is
    /// unmapped just before the batch is submitted.
    pub(super) slab: Option<wgpu::Buffer>,
    /// Filled slabs of this batch, to unmap at submit.
    pub(super) full_slabs: Vec<wgpu::Buffer>,
    /// Next free byte of `slab`.
    pub(super) slot: u64,
    pub(super) dispatches: u32,
    /// Profiling mode: the kernel and grid of each timed dispatch of this
    /// batch; entry `i` owns queries `2i` (start) and `2i + 1` (end) of
    /// `Context::queries`.
    pub(super) timed: Vec<(&'static str, [u32; 3])>,
    /// Dispatches at which this batch is submitted: `first_batch` after
    /// the GPU was found idle, doubled at each submission up to
    /// `submit_every`.
    pub(super) limit: u32,
    /// Batches submitted so far (a read-back notes the count at its copy,
    /// to tell whether anything was submitted after it).
    pub(super) submitted: u64,
}

thread_local! {
    /// Set while this thread runs [`kernels_only`]: dispatches build their
    /// pipelines and record nothing.
    static KERNELS_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is in [`kernels_only`].
pub(crate) fn building_only() -> bool {
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

/// Records one dispatch into a compute pass.
pub(super) fn encode(
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

impl Context {
    /// Runs `f` on the pending encoder (outside any compute pass), creating
    /// the encoder if needed.
    pub(super) fn record<R>(&self, f: impl FnOnce(&mut wgpu::CommandEncoder) -> R) -> R {
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
        if p.encoder.is_some() {
            p.submitted += 1;
            p.limit = p.limit.saturating_mul(2).min(self.features.submit_every);
        }
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

    /// Submits pending work and waits for the device to finish it.
    pub fn synchronize(&self) -> Result<()> {
        self.check_alive()?;
        self.flush();
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| self.gpu_err(e))?;
        self.gpu_idle(None);
        self.take_error()
    }

    /// After a wait for everything up to submission number `upto` (every
    /// submission if `None`): where nothing was submitted after it, the
    /// GPU has nothing left to run, and the next batch is cut short so
    /// that it starts while the host records the rest.
    pub(super) fn gpu_idle(&self, upto: Option<u64>) {
        let mut p = lock(&self.pending);
        if upto.is_none_or(|n| n == p.submitted) {
            p.limit = self.features.first_batch;
        }
    }

    /// The number of batches submitted so far.
    pub fn submitted(&self) -> u64 {
        lock(&self.pending).submitted
    }

    /// The open compute pass that dispatches share, opened (and the
    /// encoder created) if needed.
    pub(super) fn shared_pass<'a>(&self, p: &'a mut Pending) -> &'a mut wgpu::ComputePass<'static> {
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
        let immediates = kernel.immediates && params.len() as u32 <= self.features.immediate_bytes;
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
        let submit = p.dispatches >= p.limit;
        drop(guard);
        if submit {
            self.flush();
        }
        Ok(())
    }

    /// The bind group of a dispatch whose parameters go in a uniform
    /// buffer: a slot of this batch's parameter slab at binding 0, the
    /// tensors after it.
    pub(super) fn uniform_bind_group(
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
        let slab_bytes = SLOT_BYTES * self.features.submit_every as u64;
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
