//! Uploads into device buffers and read-backs from them: through host
//! mappings on unified memory, else through staging buffers.

use super::submission::building_only;
use super::{Context, lock};
use crate::Result;
use crate::memory::GpuBuffer;

/// Uploads from which unified memory writes new buffers in place: smaller
/// ones take a cached buffer of their size where there is one.
pub(super) const MAPPED_UPLOAD_MIN: usize = 1 << 16;

/// A read-back under way (see [`Context::read_start`]).
pub(crate) struct PendingBytes {
    staging: wgpu::Buffer,
    rx: std::sync::mpsc::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
    /// The submission holding the copy (None: nothing was pending, which
    /// cannot happen since the copy itself is recorded)
    index: Option<wgpu::SubmissionIndex>,
    /// Batches submitted by then, the copy's included.
    submitted: u64,
}

impl Context {
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
    pub(super) fn read_mapped<R>(
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
        let mut hold = lock(&self.pending);
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
            // everything submitted is done: the GPU is idle
            hold.limit = self.features.first_batch;
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
        let submitted = self.submitted();
        let (tx, rx) = std::sync::mpsc::channel();
        staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        Ok(PendingBytes {
            staging,
            rx,
            index,
            submitted,
        })
    }

    /// Waits for a read started by [`Context::read_start`] (only for the
    /// submission that holds its copy) and passes the bytes to `f` straight
    /// from the staging buffer's mapping.
    pub fn read_finish_with<R>(
        &self,
        pending: PendingBytes,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        let PendingBytes {
            staging,
            rx,
            index,
            submitted,
        } = pending;
        self.wait_mapped(index, &rx)?;
        self.gpu_idle(Some(submitted));
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
    pub(super) fn wait_mapped(
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
}
