//! The `Tensor` type: constructors, views and transfers.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use crate::backend::gpu::{GpuDevice, PendingDownload};
use crate::dispatch::run;
use crate::layout::{Layout, normalize_dim};
use crate::storage::{CpuStorage, Storage};
use crate::{DType, Device, Element, Error, Op, Result};

/// An n-dimensional array on a [`Device`].
///
/// A tensor is a view (a [`Layout`]) of a shared storage. Views such as
/// [`Tensor::t`], [`Tensor::narrow`] and [`Tensor::broadcast_to`] copy nothing;
/// ops produce new contiguous tensors. Cloning a tensor is cheap and shares
/// the storage. Tensors are `Send + Sync`.
///
/// ```
/// use silica::{DType, Device, Tensor};
/// let dev = Device::cpu();
/// let a = Tensor::randn(&[4, 3], DType::F32, 7, &dev)?;
/// let b = a.matmul(&a.t()?)?.softmax(-1)?;
/// assert_eq!(b.shape(), &[4, 4]);
/// let rows: Vec<f32> = b.sum(-1, false)?.to_vec()?;
/// assert!(rows.iter().all(|s| (s - 1.0).abs() < 1e-5));
/// # Ok::<(), silica::Error>(())
/// ```
#[derive(Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    layout: Layout,
    dtype: DType,
    device: Device,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor({:?}, {}, {})",
            self.shape(),
            self.dtype,
            self.device
        )
    }
}

impl Tensor {
    pub(crate) fn from_parts(
        storage: Storage,
        shape: &[usize],
        dtype: DType,
        device: Device,
    ) -> Self {
        Self {
            storage: Arc::new(storage),
            layout: Layout::contiguous(shape),
            dtype,
            device,
        }
    }

    /// The same storage through `layout`, which the caller keeps inside it.
    pub(crate) fn view(&self, layout: Layout) -> Tensor {
        Tensor {
            storage: self.storage.clone(),
            layout,
            dtype: self.dtype,
            device: self.device.clone(),
        }
    }

    pub(crate) fn storage(&self) -> &Storage {
        &self.storage
    }

    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn device(&self) -> &Device {
        &self.device
    }
    pub fn rank(&self) -> usize {
        self.layout.rank()
    }
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }
    /// Size of dimension `dim` (negative counts from the end).
    pub fn dim(&self, dim: isize) -> Result<usize> {
        Ok(self.shape()[normalize_dim("dim", dim, self.shape())?])
    }
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    pub(crate) fn same_device(&self, other: &Tensor, op: &'static str) -> Result<()> {
        if self.device.same(&other.device) {
            Ok(())
        } else {
            Err(Error::DeviceMismatch {
                op,
                lhs: self.device.to_string(),
                rhs: other.device.to_string(),
            })
        }
    }

    // ----- constructors -------------------------------------------------

    /// A tensor holding `data` (row-major) with `shape`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], device: &Device) -> Result<Tensor> {
        let expected = checked_numel("from_slice", shape)?;
        if expected != data.len() {
            return Err(Error::ElementCount {
                op: "from_slice",
                shape: shape.to_vec(),
                expected,
                got: data.len(),
            });
        }
        if let Device::Gpu(g) = device {
            // straight from the slice, with no host copy first
            let buf = g.upload_bytes(bytemuck::cast_slice(data))?;
            return Ok(Tensor::from_parts(
                Storage::Gpu(buf),
                shape,
                T::DTYPE,
                device.clone(),
            ));
        }
        Tensor::from_cpu(CpuStorage::from_slice(data), shape, device)
    }

    /// Like [`Tensor::from_slice`], taking ownership of the vector.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize], device: &Device) -> Result<Tensor> {
        let expected = checked_numel("from_vec", shape)?;
        if expected != data.len() {
            return Err(Error::ElementCount {
                op: "from_vec",
                shape: shape.to_vec(),
                expected,
                got: data.len(),
            });
        }
        Tensor::from_cpu(CpuStorage::from_vec(data), shape, device)
    }

    pub(crate) fn from_cpu(data: CpuStorage, shape: &[usize], device: &Device) -> Result<Tensor> {
        let dtype = data.dtype();
        let storage = match device {
            Device::Cpu => Storage::host(data)?,
            Device::Gpu(g) => Storage::Gpu(g.upload(&data)?),
        };
        Ok(Tensor::from_parts(storage, shape, dtype, device.clone()))
    }

    /// A tensor filled with `value` (converted to `dtype`).
    pub fn full(value: f64, shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        let n = checked_numel("full", shape)?;
        if device.is_cpu() {
            // refuse before asking the host for memory beyond the limit
            crate::memory::host_check((n * dtype.size_in_bytes()) as u64)?;
        }
        if let (Device::Gpu(g), true) = (device, value == 0.0) {
            let buf = g.zeros(n * dtype.size_in_bytes())?;
            return Ok(Tensor::from_parts(
                Storage::Gpu(buf),
                shape,
                dtype,
                device.clone(),
            ));
        }
        Tensor::from_cpu(CpuStorage::full(value, n, dtype), shape, device)
    }

    pub fn zeros(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(0.0, shape, dtype, device)
    }

    pub fn ones(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(1.0, shape, dtype, device)
    }

    /// `start, start + step, ..` below `end`, as a 1-D tensor.
    pub fn arange(
        start: f64,
        end: f64,
        step: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            return Err(Error::InvalidArgument {
                op: "arange",
                msg: format!(
                    "start {start}, end {end} and step {step} must be finite, step non-zero"
                ),
            });
        }
        let n = ((end - start) / step).ceil().max(0.0) as usize;
        let values: Vec<f64> = (0..n).map(|i| start + step * i as f64).collect();
        Tensor::from_cpu(CpuStorage::from_f64(&values, dtype), &[n], device)
    }

    /// Standard normal samples from a seeded generator: the same seed gives
    /// the same values on every device.
    pub fn randn(shape: &[usize], dtype: DType, seed: u64, device: &Device) -> Result<Tensor> {
        let n = checked_numel("randn", shape)?;
        if device.is_cpu() {
            // refuse before asking the host for memory beyond the limit
            crate::memory::host_check((n * dtype.size_in_bytes()) as u64)?;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let values: Vec<f64> = (0..n)
            .map(|_| rng.sample::<f64, _>(StandardNormal))
            .collect();
        Tensor::from_cpu(CpuStorage::from_f64(&values, dtype), shape, device)
    }

    /// Uniform samples in `[0, 1)` from a seeded generator.
    pub fn rand(shape: &[usize], dtype: DType, seed: u64, device: &Device) -> Result<Tensor> {
        let n = checked_numel("rand", shape)?;
        if device.is_cpu() {
            // refuse before asking the host for memory beyond the limit
            crate::memory::host_check((n * dtype.size_in_bytes()) as u64)?;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let values: Vec<f64> = (0..n).map(|_| rng.random::<f64>()).collect();
        Tensor::from_cpu(CpuStorage::from_f64(&values, dtype), shape, device)
    }

    // ----- transfers ------------------------------------------------------

    /// The elements in row-major order. `T` must match the dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch {
                op: "to_vec",
                lhs: self.dtype,
                rhs: T::DTYPE,
            });
        }
        let host = self.to_host()?;
        host.into_vec::<T>().ok_or(Error::DTypeMismatch {
            op: "to_vec",
            lhs: self.dtype,
            rhs: T::DTYPE,
        })
    }

    /// On the CPU, the storage this tensor views, without a copy: element
    /// `i` of the tensor is at `layout().offset() + Σ iₖ·strides()[k]`.
    /// `None` on a GPU or when `T` is not the dtype. The storage never
    /// changes under a tensor that shares it ([`Tensor::slice_assign`]
    /// copies first), so the slice stays valid while any clone lives.
    pub fn host_storage<T: Element>(&self) -> Option<&[T]> {
        match self.storage.as_ref() {
            Storage::Cpu(c, _) => c.as_slice::<T>(),
            Storage::Gpu(_) => None,
        }
    }

    /// Starts reading the elements back without waiting: on a GPU the copy
    /// is submitted with the work queued so far, and work queued after this
    /// call (the next decoding step, say) does not delay
    /// [`PendingRead::to_vec`]. On the CPU the elements are copied at once.
    pub fn read_later(&self) -> Result<PendingRead> {
        let state = match (self.storage.as_ref(), &self.device) {
            (Storage::Cpu(c, _), _) => ReadState::Host(c.gather(&self.layout)),
            (Storage::Gpu(b), Device::Gpu(g)) => {
                let start = self.layout.offset();
                let span = self.layout.storage_extent().saturating_sub(start);
                let local = Layout::new(self.shape().to_vec(), self.layout.strides().to_vec(), 0);
                ReadState::Gpu(
                    g.clone(),
                    g.download_start(b, start, span, self.dtype)?,
                    local,
                )
            }
            // invariant: GPU storage is only ever created on a GPU device
            (Storage::Gpu(_), Device::Cpu) => unreachable!("GPU storage on the CPU device"),
        };
        Ok(PendingRead {
            state,
            dtype: self.dtype,
        })
    }

    /// The elements in row-major order as `f64` (any dtype).
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        Ok(self.to_host()?.to_f64())
    }

    /// A contiguous host copy of the elements of this view. A GPU view is
    /// read back as the storage range it spans and gathered on the host, so
    /// no GPU op runs (check mode compares ops through this path).
    pub(crate) fn to_host(&self) -> Result<CpuStorage> {
        match (self.storage.as_ref(), &self.device) {
            (Storage::Cpu(c, _), _) => Ok(c.gather(&self.layout)),
            (Storage::Gpu(b), Device::Gpu(g)) => {
                let start = self.layout.offset();
                let span = self.layout.storage_extent().saturating_sub(start);
                let range = g.download(b, start, span, self.dtype)?;
                if self.layout.is_contiguous() {
                    // the range read is the tensor's elements, in order
                    return Ok(range);
                }
                let local = Layout::new(self.shape().to_vec(), self.layout.strides().to_vec(), 0);
                Ok(range.gather(&local))
            }
            // invariant: GPU storage is only ever created on a GPU device
            (Storage::Gpu(_), Device::Cpu) => unreachable!("GPU storage on the CPU device"),
        }
    }

    /// A copy on `device` (the same tensor when it is already there).
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if self.device.same(device) {
            return Ok(self.clone());
        }
        let host = self.to_host()?;
        Tensor::from_cpu(host, self.shape(), device)
    }

    /// Converts the elements to `dtype` (rounding to nearest even for f16/bf16).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype {
            return Ok(self.clone());
        }
        run(Op::Cast, &[self], self.shape().to_vec(), dtype)
    }

    /// A contiguous tensor with the same elements (the same tensor when it
    /// already is contiguous).
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        run(Op::Copy, &[self], self.shape().to_vec(), self.dtype)
    }

    /// Overwrites `self[start..start + src.dim(0)]` (along dimension 0) with
    /// `src`, in place: the way to append to a preallocated buffer such as a
    /// KV cache without copying what is already there.
    ///
    /// Other tensors never see the change: if the storage is shared with
    /// another tensor (a clone or a view), `self` first gets its own copy.
    /// `src` must have `self`'s dtype, device and trailing dimensions.
    ///
    /// ```
    /// use silica::{Device, Tensor};
    /// let dev = Device::cpu();
    /// let mut cache = Tensor::zeros(&[4, 2], silica::DType::F32, &dev)?;
    /// cache.slice_assign(1, &Tensor::from_slice(&[1.0f32, 2.0], &[1, 2], &dev)?)?;
    /// assert_eq!(cache.to_vec::<f32>()?, [0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0]);
    /// # Ok::<(), silica::Error>(())
    /// ```
    pub fn slice_assign(&mut self, start: usize, src: &Tensor) -> Result<()> {
        let op = "slice_assign";
        self.same_device(src, op)?;
        if src.dtype != self.dtype {
            return Err(Error::DTypeMismatch {
                op,
                lhs: self.dtype,
                rhs: src.dtype,
            });
        }
        let fits = self.rank() >= 1
            && src.rank() == self.rank()
            && src.shape()[1..] == self.shape()[1..]
            && start
                .checked_add(src.shape()[0])
                .is_some_and(|end| end <= self.shape()[0]);
        if !fits {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "cannot write {:?} at row {start} of {:?}",
                    src.shape(),
                    self.shape()
                ),
            });
        }
        self.make_own()?;
        let row: usize = self.shape()[1..].iter().product();
        let offset = self.layout.offset() + start * row;
        let device = self.device.clone();
        // invariant: made unique just above
        let storage = Arc::get_mut(&mut self.storage).expect("a storage of its own");
        match (storage, &device) {
            (Storage::Cpu(c, _), _) => {
                c.write_at(offset, &src.to_host()?);
                Ok(())
            }
            (Storage::Gpu(b), Device::Gpu(g)) => g.write_into(b, offset, src),
            // invariant: GPU storage is only ever created on a GPU device
            (Storage::Gpu(_), Device::Cpu) => unreachable!("GPU storage on the CPU device"),
        }
    }

    /// Gives `self` contiguous storage that no other tensor shares (a copy
    /// when it is a view or shared), so that it can be updated in place.
    pub(crate) fn make_own(&mut self) -> Result<()> {
        if !self.is_contiguous() || Arc::get_mut(&mut self.storage).is_none() {
            *self = self.copy()?;
        }
        Ok(())
    }

    /// A contiguous copy, even when the tensor already is contiguous.
    pub fn copy(&self) -> Result<Tensor> {
        run(Op::Copy, &[self], self.shape().to_vec(), self.dtype)
    }

    // ----- views ------------------------------------------------------------

    /// Swaps two dimensions (a view).
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        let a = normalize_dim("transpose", d0, self.shape())?;
        let b = normalize_dim("transpose", d1, self.shape())?;
        Ok(self.view(self.layout.transpose(a, b)))
    }

    /// Swaps the last two dimensions (a view); for a matrix, its transpose.
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() < 2 {
            return Err(Error::InvalidArgument {
                op: "t",
                msg: format!("needs rank 2 or more, got shape {:?}", self.shape()),
            });
        }
        self.transpose(-2, -1)
    }

    /// Reorders the dimensions (a view): result dimension `i` is `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        let mut seen = vec![false; self.rank()];
        let valid = perm.len() == self.rank()
            && perm
                .iter()
                .all(|&p| p < seen.len() && !std::mem::replace(&mut seen[p], true));
        if !valid {
            return Err(Error::InvalidArgument {
                op: "permute",
                msg: format!(
                    "{perm:?} is not a permutation of the dimensions of {:?}",
                    self.shape()
                ),
            });
        }
        Ok(self.view(self.layout.permute(perm)))
    }

    /// Entries `start..start + len` of dimension `dim` (a view).
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Tensor> {
        let d = normalize_dim("narrow", dim, self.shape())?;
        let size = self.shape()[d];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::InvalidArgument {
                op: "narrow",
                msg: format!(
                    "range {start}..{} is outside dimension {d} of shape {:?}",
                    start.saturating_add(len),
                    self.shape()
                ),
            });
        }
        Ok(self.view(self.layout.narrow(d, start, len)))
    }

    /// Numpy-style broadcast to `shape` (a view with zero strides).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        let ok = shape.len() >= self.rank()
            && self
                .shape()
                .iter()
                .rev()
                .zip(shape.iter().rev())
                .all(|(&a, &b)| a == b || a == 1);
        if !ok {
            return Err(Error::ShapeMismatch {
                op: "broadcast_to",
                lhs: self.shape().to_vec(),
                rhs: shape.to_vec(),
                hint: "each dimension must match or be 1".into(),
            });
        }
        crate::layout::check_shape("broadcast_to", shape)?;
        if shape == self.shape() {
            return Ok(self.clone());
        }
        Ok(self.view(self.layout.broadcast_to(shape)))
    }

    /// Inserts a size-1 dimension at `dim` (`-rank-1..=rank`).
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        let rank = self.rank() as isize;
        let d = if dim < 0 { dim + rank + 1 } else { dim };
        if d < 0 || d > rank {
            return Err(Error::DimOutOfRange {
                op: "unsqueeze",
                dim,
                shape: self.shape().to_vec(),
            });
        }
        Ok(self.view(self.layout.unsqueeze(d as usize)))
    }

    /// Removes dimension `dim`, which must have size 1.
    pub fn squeeze(&self, dim: isize) -> Result<Tensor> {
        let d = normalize_dim("squeeze", dim, self.shape())?;
        if self.shape()[d] != 1 {
            return Err(Error::InvalidArgument {
                op: "squeeze",
                msg: format!("dimension {d} of shape {:?} is not 1", self.shape()),
            });
        }
        Ok(self.view(self.layout.squeeze(d)))
    }

    /// The same elements with another shape: a view when the strides allow
    /// it, else a contiguous copy.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let n = checked_numel("reshape", shape)?;
        if n != self.numel() {
            return Err(Error::ShapeMismatch {
                op: "reshape",
                lhs: self.shape().to_vec(),
                rhs: shape.to_vec(),
                hint: format!("{} elements cannot take shape {shape:?}", self.numel()),
            });
        }
        match self.layout.reshape(shape) {
            Some(l) => Ok(self.view(l)),
            None => {
                let c = self.contiguous()?;
                Ok(c.view(Layout::new(
                    shape.to_vec(),
                    crate::layout::contiguous_strides(shape),
                    c.layout.offset(),
                )))
            }
        }
    }
}

/// The element count of `shape`, or an error when it overflows.
fn checked_numel(op: &'static str, shape: &[usize]) -> Result<usize> {
    crate::layout::check_shape(op, shape)
}

/// A read-back started by [`Tensor::read_later`].
pub struct PendingRead {
    state: ReadState,
    dtype: DType,
}

enum ReadState {
    Host(CpuStorage),
    /// the device, the range under way, the view's layout within the range
    Gpu(Arc<GpuDevice>, PendingDownload, Layout),
}

impl PendingRead {
    /// Waits for the elements (row-major). `T` must match the dtype.
    pub fn to_vec<T: Element>(self) -> Result<Vec<T>> {
        let mismatch = Error::DTypeMismatch {
            op: "to_vec",
            lhs: self.dtype,
            rhs: T::DTYPE,
        };
        if T::DTYPE != self.dtype {
            return Err(mismatch);
        }
        let host = match self.state {
            ReadState::Host(c) => c,
            ReadState::Gpu(g, pending, local) => g.download_finish(pending)?.gather(&local),
        };
        host.into_vec::<T>().ok_or(mismatch)
    }
}
