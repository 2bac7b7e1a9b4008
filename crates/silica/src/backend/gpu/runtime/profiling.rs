//! Timestamp profiling: each dispatch (or each batch) timed on the GPU's
//! own timeline, and the clock around a loop that `GpuDevice::gpu_time`
//! reads.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use super::submission::{Pending, encode};
use super::{Context, lock};
use crate::Result;

/// Most dispatches in one submitted batch: the profiling query set holds
/// two timestamps for each.
const DISPATCH_BUDGET: u32 = crate::config::MAX_SUBMIT_EVERY;

/// The profile's name for the time of whole batches (per-batch timing).
pub(crate) const BATCH: &str = "(batches)";

/// How profiling mode puts timestamps around a dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Timing {
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

/// Dispatch count and GPU seconds of one (kernel, grid).
pub(super) type ProfileMap = BTreeMap<(&'static str, [u32; 3]), (u64, f64)>;

impl Context {
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

    pub(super) fn query_set(&self) -> &wgpu::QuerySet {
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
    pub(super) fn resolve_timestamps(
        &self,
        enc: &mut wgpu::CommandEncoder,
        pairs: usize,
    ) -> wgpu::Buffer {
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
    pub(super) fn collect_timestamps(
        &self,
        readback: &wgpu::Buffer,
        timed: &[(&'static str, [u32; 3])],
    ) {
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
    pub(super) fn mark_in(&self, enc: &mut wgpu::CommandEncoder, index: u32) {
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
    pub(super) fn mark(&self, set: &wgpu::QuerySet, index: u32) {
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

    /// Records a dispatch between two timestamps (profiling mode).
    pub(super) fn record_timed(
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
}
