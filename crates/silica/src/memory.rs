//! The GPU caching allocator and its counters, and the counters of the
//! host's tensors.
//!
//! Buffers are rounded up to size classes (at most 1/8 waste above 256
//! bytes) and kept in per-class free lists when their tensors drop, so a
//! steady workload stops allocating after its first iteration, as PyTorch's
//! CUDA caching allocator does. Host tensors are plain vectors that the
//! system allocator hands out and takes back: they are counted (exact
//! bytes, nothing cached) and held to the CPU device's limit.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{Error, Result};

/// Memory counters of a device, in bytes (like `torch.cuda.memory_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes held by live tensors (rounded to size classes).
    pub allocated: u64,
    /// Bytes of device buffers silica holds: allocated plus cached.
    pub reserved: u64,
    /// The largest `allocated` since the device opened or `reset_peak_memory`.
    pub peak_allocated: u64,
    /// Buffers held by live tensors.
    pub live_buffers: u64,
    /// Free buffers kept for reuse.
    pub cached_buffers: u64,
    /// The cap set with `Device::set_memory_limit`.
    pub limit: Option<u64>,
}

#[derive(Default)]
struct PoolState {
    free: BTreeMap<u64, Vec<(wgpu::Buffer, u64)>>,
    /// The serial number of the next buffer created.
    next_id: u64,
    stats: MemoryStats,
}

/// Hands out device buffers and takes them back.
pub(crate) struct MemoryPool {
    device: wgpu::Device,
    device_name: String,
    max_binding: u64,
    /// Usage of every buffer: TENSOR_USAGE, plus mapping for reads and
    /// writes on unified-memory adapters (see [`MemoryPool::mappable`]).
    usage: wgpu::BufferUsages,
    state: Mutex<PoolState>,
    /// Bind groups of whole buffers, by the buffers they bind (see
    /// [`MemoryPool::bind_group`]). A bind group keeps its buffers alive, so
    /// the cache is emptied whenever the pool lets buffers go.
    bind_groups: Mutex<hashbrown::HashMap<GroupKey, wgpu::BindGroup>>,
    /// The buffers' kept tensors (see [`GpuBuffer::keep_derived`]).
    kept: Mutex<Vec<std::sync::Weak<DerivedSlot>>>,
    /// Set once memory ran short with tensors kept: none are kept after.
    kept_released: std::sync::atomic::AtomicBool,
}

fn lock_slot(slot: &DerivedSlot) -> MutexGuard<'_, Vec<(DerivedKey, crate::Tensor)>> {
    slot.lock().unwrap_or_else(|e| e.into_inner())
}

/// Buffers a cached bind group holds at most: wgpu's default limit of
/// storage buffers in a shader stage, which no kernel exceeds.
const MAX_BOUND: usize = 8;

/// A cached bind group's key: the serial numbers of its buffers, inputs
/// first, and how many are inputs. The numbers are held inline, so a
/// lookup hashes and compares a few words without following a pointer.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct GroupKey {
    inputs: u8,
    count: u8,
    ids: [u64; MAX_BOUND],
}

/// Bind group entries of whole tensor buffers at bindings 1.., in order
/// (binding 0 is the parameter block's, where a kernel has one).
pub(crate) fn tensor_entries<'a>(
    buffers: impl Iterator<Item = &'a GpuBuffer>,
) -> Vec<wgpu::BindGroupEntry<'a>> {
    buffers
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupEntry {
            binding: i as u32 + 1,
            resource: b.raw().as_entire_binding(),
        })
        .collect()
}

/// Bind groups kept at most; past it the cache starts again empty. A decoded
/// token of a Llama model binds a few hundred distinct buffer lists.
const BIND_GROUPS_KEPT: usize = 4096;

/// Buffer usage of every tensor buffer.
pub(crate) const TENSOR_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// The size class of a request: multiples of 256 bytes up to 2 KiB, then
/// eight steps per power of two.
pub(crate) fn size_class(bytes: u64) -> u64 {
    let b = bytes.max(4);
    if b <= 2048 {
        return b.div_ceil(256) * 256;
    }
    let step = b.next_power_of_two() / 16;
    b.div_ceil(step) * step
}

/// A device buffer owned by a tensor storage; it returns to the pool on drop.
pub struct GpuBuffer {
    buffer: Option<wgpu::Buffer>,
    /// The buffer's serial number in its pool, kept while it waits in a
    /// free list, so a bind group of it is found again after reuse.
    id: u64,
    class: u64,
    pool: Arc<MemoryPool>,
    /// Tensors computed from this buffer's contents and kept while it
    /// lives, by a key their maker chooses (a quantized weight's decoded
    /// f16 copy, see `qmatmul::kept_decoded`); they go back to the pool
    /// with it.
    derived: std::sync::OnceLock<Arc<DerivedSlot>>,
}

/// The tensors kept with a buffer, shared with its pool's list so that the
/// pool can let them go when memory runs short.
type DerivedSlot = Mutex<Vec<(DerivedKey, crate::Tensor)>>;

/// What a derived tensor was computed from: the maker's kind of
/// derivation, and the element offset, length and format of the part of
/// the buffer it reads.
pub(crate) type DerivedKey = [u64; 4];

impl GpuBuffer {
    pub(crate) fn raw(&self) -> &wgpu::Buffer {
        // invariant: `buffer` is only taken in `drop`
        self.buffer.as_ref().expect("GpuBuffer used after drop")
    }

    /// The tensor kept under `key` (see [`GpuBuffer::keep_derived`]).
    pub(crate) fn derived(&self, key: DerivedKey) -> Option<crate::Tensor> {
        let kept = lock_slot(self.derived.get()?);
        kept.iter().find(|(k, _)| *k == key).map(|(_, t)| t.clone())
    }

    /// Keeps `t`, computed from this buffer's contents, under `key` for as
    /// long as the buffer lives, or until the pool runs short of memory
    /// (see [`MemoryPool::keeps_derived`]). Its contents must not change
    /// meanwhile (weights).
    pub(crate) fn keep_derived(&self, key: DerivedKey, t: crate::Tensor) {
        let mut first = false;
        let slot = self.derived.get_or_init(|| {
            first = true;
            Arc::new(Mutex::new(Vec::new()))
        });
        {
            let mut kept = lock_slot(slot);
            kept.retain(|(k, _)| *k != key);
            kept.push((key, t));
        }
        if first {
            let mut list = self.pool.kept.lock().unwrap_or_else(|e| e.into_inner());
            list.retain(|w| w.strong_count() > 0);
            list.push(Arc::downgrade(slot));
        }
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        if let Some(b) = self.buffer.take() {
            self.pool.release(b, self.id, self.class);
        }
    }
}

impl MemoryPool {
    /// `mappable`: the device has `MAPPABLE_PRIMARY_BUFFERS` and shares the
    /// host's memory, so tensor buffers are made mappable and uploads and
    /// read-backs go through them without a staging copy.
    pub fn new(
        device: wgpu::Device,
        device_name: String,
        max_binding: u64,
        mappable: bool,
    ) -> Self {
        let usage = if mappable {
            TENSOR_USAGE | wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::MAP_WRITE
        } else {
            TENSOR_USAGE
        };
        Self {
            device,
            device_name,
            max_binding,
            usage,
            state: Mutex::new(PoolState::default()),
            bind_groups: Mutex::new(hashbrown::HashMap::new()),
            kept: Mutex::new(Vec::new()),
            kept_released: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A bind group of `inputs` then `outputs`, whole, at bindings 1.. of
    /// `layout` (binding 0 is the parameter block's, which a kernel reading
    /// its parameters from immediates does not have; every caller passes
    /// the layout that belongs to the lists' lengths, so the group is found
    /// again by the buffers and the number of inputs). Kernels
    /// that read their parameters from immediates bind nothing else, and a
    /// model run again and again binds the same buffers, so the group is
    /// made once and then found here.
    pub(crate) fn bind_group(
        &self,
        layout: &wgpu::BindGroupLayout,
        label: &str,
        inputs: &[&GpuBuffer],
        outputs: &[&GpuBuffer],
    ) -> wgpu::BindGroup {
        let count = inputs.len() + outputs.len();
        let create = || {
            self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(label),
                layout,
                entries: &tensor_entries(inputs.iter().chain(outputs).copied()),
            })
        };
        if count > MAX_BOUND {
            // no kernel binds this many; made afresh rather than cached
            return create();
        }
        let mut key = GroupKey {
            inputs: inputs.len() as u8,
            count: count as u8,
            ids: [0; MAX_BOUND],
        };
        for (slot, b) in key.ids.iter_mut().zip(inputs.iter().chain(outputs)) {
            *slot = b.id;
        }
        let mut cache = self.bind_groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = cache.get(&key) {
            return g.clone();
        }
        let group = create();
        if cache.len() >= BIND_GROUPS_KEPT {
            cache.clear();
        }
        cache.insert(key, group.clone());
        group
    }

    fn forget_bind_groups(&self) {
        self.bind_groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // The state is plain counters and lists, valid after any panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn stats(&self) -> MemoryStats {
        self.lock().stats
    }

    pub fn set_limit(&self, limit: Option<u64>) {
        self.lock().stats.limit = limit;
    }

    pub fn reset_peak(&self) {
        let mut s = self.lock();
        s.stats.peak_allocated = s.stats.allocated;
    }

    pub fn empty_cache(&self) {
        self.drop_cached(&mut self.lock());
    }

    fn drop_cached(&self, s: &mut PoolState) {
        // cached bind groups hold the buffers too
        self.forget_bind_groups();
        for (class, bufs) in std::mem::take(&mut s.free) {
            s.stats.reserved -= class * bufs.len() as u64;
            s.stats.cached_buffers -= bufs.len() as u64;
            // Dropped, not destroyed: work still pending may use them;
            // wgpu frees each once the device is done with it.
            drop(bufs);
        }
    }

    fn release(&self, buffer: wgpu::Buffer, id: u64, class: u64) {
        let mut s = self.lock();
        s.stats.allocated -= class;
        s.stats.live_buffers -= 1;
        s.stats.cached_buffers += 1;
        s.free.entry(class).or_default().push((buffer, id));
    }

    fn oom(&self, requested: u64, s: &PoolState) -> Error {
        Error::OutOfMemory {
            device: self.device_name.clone(),
            requested,
            allocated: s.stats.allocated,
            limit: s.stats.limit,
        }
    }

    /// The largest buffer a kernel can bind, in bytes.
    pub fn max_binding(&self) -> u64 {
        self.max_binding
    }

    /// Whether tensor buffers can be mapped by the host (unified memory).
    pub fn mappable(&self) -> bool {
        self.usage.contains(wgpu::BufferUsages::MAP_WRITE)
    }

    /// A buffer of at least `bytes` bytes (contents undefined).
    pub fn alloc(self: &Arc<Self>, bytes: u64) -> Result<GpuBuffer> {
        Ok(self.alloc_as(bytes, false)?.0)
    }

    /// A buffer of at least `bytes` bytes to upload into, and whether it is
    /// mapped for writing: a cached buffer where one fits (the GPU may still
    /// be using it, so it is written through a copy), else, where
    /// [`MemoryPool::mappable`], a new one mapped for the caller to fill and
    /// unmap.
    pub fn alloc_for_upload(self: &Arc<Self>, bytes: u64) -> Result<(GpuBuffer, bool)> {
        self.alloc_as(bytes, self.mappable())
    }

    /// Whether tensors may still be kept with buffers: not once memory ran
    /// short while some were (they are let go then, and none kept after,
    /// so that they cannot crowd out the work).
    pub(crate) fn keeps_derived(&self) -> bool {
        !self
            .kept_released
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Lets go of every kept tensor (see [`MemoryPool::keeps_derived`]);
    /// whether there was any.
    fn release_kept(&self) -> bool {
        let slots = std::mem::take(&mut *self.kept.lock().unwrap_or_else(|e| e.into_inner()));
        let mut tensors = Vec::new();
        for slot in slots.iter().filter_map(std::sync::Weak::upgrade) {
            tensors.extend(lock_slot(&slot).drain(..).map(|(_, t)| t));
        }
        if tensors.is_empty() {
            return false;
        }
        self.kept_released
            .store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(
            "{}: memory ran short, so the {} decoded weight copies kept (SILICA_KEEP_DECODED) were let go and none will be kept",
            self.device_name,
            tensors.len()
        );
        // their buffers return to the free lists here, outside every lock
        drop(tensors);
        true
    }

    /// `mapped`: a buffer created for it is created mapped; the flag says
    /// whether that happened. Out of memory with tensors kept lets them go
    /// and tries again.
    fn alloc_as(self: &Arc<Self>, bytes: u64, mapped: bool) -> Result<(GpuBuffer, bool)> {
        match self.alloc_once(bytes, mapped) {
            Err(Error::OutOfMemory { .. }) if self.release_kept() => self.alloc_once(bytes, mapped),
            done => done,
        }
    }

    fn alloc_once(self: &Arc<Self>, bytes: u64, mapped: bool) -> Result<(GpuBuffer, bool)> {
        let bytes = bytes.max(4).next_multiple_of(4);
        if bytes > self.max_binding {
            return Err(Error::TooLarge {
                device: self.device_name.clone(),
                bytes,
                max: self.max_binding,
            });
        }
        let class = size_class(bytes).min(self.max_binding);
        let mut s = self.lock();
        let reused = s.free.get_mut(&class).and_then(|v| v.pop());
        let created = reused.is_none();
        let (buffer, id) = match reused {
            Some(b) => {
                s.stats.cached_buffers -= 1;
                b
            }
            None => {
                if let Some(limit) = s.stats.limit
                    && s.stats.reserved + class > limit
                {
                    self.drop_cached(&mut s);
                    if s.stats.reserved + class > limit {
                        return Err(self.oom(bytes, &s));
                    }
                }
                let b = match self.create(class, mapped) {
                    Some(b) => b,
                    None => {
                        // the driver is out of memory: free the cache and try once more
                        self.drop_cached(&mut s);
                        self.create(class, mapped)
                            .ok_or_else(|| self.oom(bytes, &s))?
                    }
                };
                s.stats.reserved += class;
                s.next_id += 1;
                (b, s.next_id)
            }
        };
        s.stats.allocated += class;
        s.stats.live_buffers += 1;
        s.stats.peak_allocated = s.stats.peak_allocated.max(s.stats.allocated);
        let buf = GpuBuffer {
            buffer: Some(buffer),
            id,
            class,
            pool: self.clone(),
            derived: std::sync::OnceLock::new(),
        };
        Ok((buf, mapped && created))
    }

    /// Creates a buffer, catching out-of-memory and validation errors in an
    /// error scope instead of wgpu's default (panicking) handler.
    fn create(&self, size: u64, mapped: bool) -> Option<wgpu::Buffer> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let inner = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("silica tensor"),
            size,
            usage: self.usage,
            mapped_at_creation: mapped,
        });
        let invalid = pollster::block_on(inner.pop()).is_some();
        let oom = pollster::block_on(scope.pop()).is_some();
        (!invalid && !oom).then_some(buffer)
    }
}

#[cfg(test)]
mod tests {
    use super::size_class;

    #[test]
    fn size_classes_bound_the_waste() {
        assert_eq!(size_class(1), 256);
        assert_eq!(size_class(2048), 2048);
        for b in [2049u64, 3000, 4097, 1 << 20, (1 << 20) + 1, 123_456_789] {
            let c = size_class(b);
            assert!(c >= b && c - b <= b / 8 + 1, "{b} -> {c}");
        }
    }
}

/// The CPU device's counters: every host tensor's storage holds a
/// [`HostBlock`] for its bytes.
static HOST: Mutex<MemoryStats> = Mutex::new(MemoryStats {
    allocated: 0,
    reserved: 0,
    peak_allocated: 0,
    live_buffers: 0,
    cached_buffers: 0,
    limit: None,
});

fn host() -> MutexGuard<'static, MemoryStats> {
    // the counters stay consistent even if a holder panicked
    HOST.lock().unwrap_or_else(|e| e.into_inner())
}

fn host_oom(requested: u64, s: &MemoryStats) -> Error {
    Error::OutOfMemory {
        device: "cpu".into(),
        requested,
        allocated: s.allocated,
        limit: s.limit,
    }
}

pub(crate) fn host_stats() -> MemoryStats {
    *host()
}

pub(crate) fn host_set_limit(limit: Option<u64>) {
    host().limit = limit;
}

pub(crate) fn host_reset_peak() {
    let mut s = host();
    s.peak_allocated = s.allocated;
}

/// Whether `bytes` more would fit the CPU device's limit (checked before a
/// kernel computes a result of that size).
pub(crate) fn host_check(bytes: u64) -> Result<()> {
    let s = host();
    match s.limit {
        Some(limit) if s.allocated.saturating_add(bytes) > limit => Err(host_oom(bytes, &s)),
        _ => Ok(()),
    }
}

/// The bytes of one host tensor's storage, counted while it lives.
#[derive(Debug)]
pub(crate) struct HostBlock {
    bytes: u64,
}

impl HostBlock {
    /// Counts `bytes` more, or fails if they exceed the limit.
    pub(crate) fn take(bytes: u64) -> Result<HostBlock> {
        let mut s = host();
        let allocated = s.allocated.saturating_add(bytes);
        if s.limit.is_some_and(|limit| allocated > limit) {
            return Err(host_oom(bytes, &s));
        }
        s.allocated = allocated;
        s.reserved = allocated;
        s.peak_allocated = s.peak_allocated.max(allocated);
        s.live_buffers += 1;
        Ok(HostBlock { bytes })
    }
}

impl Drop for HostBlock {
    fn drop(&mut self) {
        let mut s = host();
        s.allocated -= self.bytes;
        s.reserved = s.allocated;
        s.live_buffers -= 1;
    }
}
