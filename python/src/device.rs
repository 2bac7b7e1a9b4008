//! `silica.Device`: a device by name (`"cpu"`, `"gpu"`, `"gpu:0"`,
//! `"vulkan"`, part of an adapter's name), with the memory API PyTorch
//! users know (`memory_allocated`, `memory_reserved`,
//! `max_memory_allocated`, `empty_cache`, ...).
//!
//! A `Device` names an adapter; it is opened on first use, and a GPU
//! opened once is shared by every `Device` naming it (silica's registry).
//! When that device is lost, the next use opens it anew. A `Device` taken
//! from a tensor (`t.device`) is that tensor's device itself.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use silica::{DeviceInfo, Selector};

use crate::errors::{Res, detach};

/// Which device a `Device` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Cpu,
    /// The ranked adapter index (`gpu:N`).
    Gpu(usize),
}

/// A device of silica: the CPU or one GPU adapter.
#[pyclass(name = "Device", module = "silica", frozen, eq, hash)]
pub struct PyDevice {
    pub kind: Kind,
    /// The device itself, where known: a tensor's device, or one opened
    /// apart from the registry (tests). Otherwise the registry's.
    pub pinned: Option<silica::Device>,
}

impl PartialEq for PyDevice {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
    }
}

impl std::hash::Hash for PyDevice {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.kind.hash(state);
    }
}

/// The device `silica.set_default_device` chose, if any.
static DEFAULT: Mutex<Option<Kind>> = Mutex::new(None);

impl PyDevice {
    pub fn from_kind(kind: Kind) -> Self {
        Self { kind, pinned: None }
    }

    /// The `Device` of an opened silica device (a tensor's).
    pub fn of(dev: &silica::Device) -> Self {
        let kind = match dev {
            silica::Device::Cpu => Kind::Cpu,
            silica::Device::Gpu(g) => Kind::Gpu(g.info().index.unwrap_or(0)),
        };
        Self {
            kind,
            pinned: Some(dev.clone()),
        }
    }

    /// What a selector string names, without opening anything.
    pub fn parse(spec: &str) -> Res<Kind> {
        let sel = Selector::parse(spec)?;
        if sel == Selector::Cpu {
            return Ok(Kind::Cpu);
        }
        Ok(match sel.resolve(&silica::adapters(), spec)? {
            None => Kind::Cpu,
            Some(i) => Kind::Gpu(i),
        })
    }

    /// The opened device (opening it on first use).
    pub fn open(&self) -> Res<silica::Device> {
        if let Some(d) = &self.pinned {
            return Ok(d.clone());
        }
        Ok(match self.kind {
            Kind::Cpu => silica::Device::Cpu,
            Kind::Gpu(i) => silica::Device::gpu(i)?,
        })
    }

    fn info_struct(&self) -> DeviceInfo {
        match (&self.pinned, self.kind) {
            (Some(d), _) => d.info(),
            (None, Kind::Cpu) => silica::Device::Cpu.info(),
            (None, Kind::Gpu(i)) => silica::adapters()
                .into_iter()
                .nth(i)
                .unwrap_or_else(|| silica::Device::Cpu.info()),
        }
    }

    /// `cpu` or `gpu:N`.
    pub fn selector(&self) -> String {
        match self.kind {
            Kind::Cpu => "cpu".into(),
            Kind::Gpu(i) => format!("gpu:{i}"),
        }
    }
}

/// The device `SILICA_DEVICE` names, else the best hardware GPU, else
/// the CPU (what `silica::Device::best` picks), unless
/// `set_default_device` chose one.
pub fn default_kind() -> Res<Kind> {
    if let Some(k) = *DEFAULT.lock().unwrap_or_else(|e| e.into_inner()) {
        return Ok(k);
    }
    Ok(match silica::config::device_selector() {
        Some(s) => PyDevice::parse(&s)?,
        None => match silica::default_gpu_index() {
            Some(i) => Kind::Gpu(i),
            None => Kind::Cpu,
        },
    })
}

/// A device argument: a `Device`, a selector string, or `None` for the
/// default device; opened.
pub fn resolve(py: Python<'_>, obj: Option<&Bound<'_, PyAny>>) -> PyResult<silica::Device> {
    let dev = match obj {
        Some(o) if !o.is_none() => device_arg(o)?,
        _ => PyDevice::from_kind(detach(py, default_kind)?),
    };
    detach(py, || dev.open())
}

/// A `Device` from a `Device` or a selector string (not opened).
pub fn device_arg(obj: &Bound<'_, PyAny>) -> PyResult<PyDevice> {
    if let Ok(d) = obj.cast::<PyDevice>() {
        let d = d.get();
        return Ok(PyDevice {
            kind: d.kind,
            pinned: d.pinned.clone(),
        });
    }
    if let Ok(s) = obj.cast::<PyString>() {
        let s = s.to_cow()?.into_owned();
        let kind = detach(obj.py(), || PyDevice::parse(&s))?;
        return Ok(PyDevice::from_kind(kind));
    }
    Err(pyo3::exceptions::PyTypeError::new_err(format!(
        "expected a silica.Device or a device name such as \"cpu\" or \"gpu:0\", not {}",
        obj.get_type().name()?
    )))
}

#[pymethods]
impl PyDevice {
    /// `Device("cpu")`, `Device("gpu")` (the best adapter), `Device("gpu:1")`,
    /// `Device("vulkan")`, `Device("llvmpipe")` (part of a name).
    #[new]
    fn new(spec: &Bound<'_, PyAny>) -> PyResult<Self> {
        device_arg(spec)
    }

    /// `"cpu"` or `"gpu"`.
    #[getter]
    fn r#type(&self) -> &'static str {
        match self.kind {
            Kind::Cpu => "cpu",
            Kind::Gpu(_) => "gpu",
        }
    }

    /// The adapter index of a GPU (`gpu:N`); `None` for the CPU.
    #[getter]
    fn index(&self) -> Option<usize> {
        match self.kind {
            Kind::Cpu => None,
            Kind::Gpu(i) => Some(i),
        }
    }

    /// The adapter's name (`"host CPU (N threads)"` for the CPU).
    #[getter]
    fn name(&self) -> String {
        self.info_struct().name
    }

    /// The graphics API: `"vulkan"`, `"metal"`, `"dx12"`, `"gl"` or `"cpu"`.
    #[getter]
    fn backend(&self) -> &'static str {
        self.info_struct().backend.as_str()
    }

    /// What the device is and can do, as `silica devices` prints it.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let i = self.info_struct();
        let d = PyDict::new(py);
        d.set_item("index", i.index)?;
        d.set_item("name", i.name)?;
        d.set_item("backend", i.backend.as_str())?;
        d.set_item("device_type", i.device_type)?;
        d.set_item("driver", i.driver)?;
        d.set_item("f16", i.f16)?;
        d.set_item("subgroups", i.subgroups)?;
        d.set_item("subgroup_size", i.subgroup_size)?;
        d.set_item("cooperative_matrix", i.cooperative_matrix)?;
        d.set_item("timestamps", i.timestamps)?;
        d.set_item("max_storage_binding", i.max_storage_binding)?;
        d.set_item("max_buffer", i.max_buffer)?;
        d.set_item("memory_bytes", i.memory_bytes)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!("Device('{}')", self.selector())
    }

    fn __str__(&self) -> String {
        match self.kind {
            Kind::Cpu => "cpu".into(),
            Kind::Gpu(i) => {
                let info = self.info_struct();
                format!("gpu:{i} ({}, {})", info.name, info.backend.as_str())
            }
        }
    }

    /// Bytes held by live tensors (`torch.cuda.memory_allocated`).
    fn memory_allocated(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.stats(py)?.allocated)
    }

    /// Bytes of device memory silica holds, cached blocks included
    /// (`torch.cuda.memory_reserved`).
    fn memory_reserved(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.stats(py)?.reserved)
    }

    /// The peak of `memory_allocated` since the device opened or the last
    /// `reset_peak_memory_stats`.
    fn max_memory_allocated(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.stats(py)?.peak_allocated)
    }

    /// Every counter: `allocated`, `reserved`, `peak_allocated`,
    /// `live_buffers`, `cached_buffers`, `limit`.
    fn memory_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.stats(py)?;
        let d = PyDict::new(py);
        d.set_item("allocated", s.allocated)?;
        d.set_item("reserved", s.reserved)?;
        d.set_item("peak_allocated", s.peak_allocated)?;
        d.set_item("live_buffers", s.live_buffers)?;
        d.set_item("cached_buffers", s.cached_buffers)?;
        d.set_item("limit", s.limit)?;
        Ok(d)
    }

    /// Resets the peak counter to the current allocation.
    fn reset_peak_memory_stats(&self, py: Python<'_>) -> PyResult<()> {
        detach(py, || {
            self.open()?.reset_peak_memory();
            Ok(())
        })
    }

    /// Frees cached blocks that no tensor uses (`torch.cuda.empty_cache`).
    fn empty_cache(&self, py: Python<'_>) -> PyResult<()> {
        detach(py, || {
            self.open()?.empty_cache();
            Ok(())
        })
    }

    /// Caps the bytes this device may hold; `None` removes the cap.
    /// Allocations past it raise `MemoryError`.
    #[pyo3(signature = (limit))]
    fn set_memory_limit(&self, py: Python<'_>, limit: Option<u64>) -> PyResult<()> {
        detach(py, || {
            self.open()?.set_memory_limit(limit);
            Ok(())
        })
    }

    /// Waits until all work submitted to the device has finished.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        detach(py, || Ok(self.open()?.synchronize()?))
    }

    /// Ops that ran on the CPU because this GPU has no kernel for them:
    /// `{"op/dtype": count}` (always empty for the CPU).
    fn fallback_report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let report = detach(py, || {
            Ok(match self.open()? {
                silica::Device::Gpu(g) => g.fallback_report(),
                silica::Device::Cpu => Vec::new(),
            })
        })?;
        let d = PyDict::new(py);
        for f in report {
            d.set_item(f.op, f.count)?;
        }
        Ok(d)
    }

    /// Strict mode: an op without a GPU kernel raises instead of running on
    /// the CPU (`SILICA_STRICT=1` sets it at open). No effect on the CPU.
    fn set_strict(&self, py: Python<'_>, on: bool) -> PyResult<()> {
        detach(py, || {
            if let silica::Device::Gpu(g) = self.open()? {
                g.set_strict(on);
            }
            Ok(())
        })
    }

    /// Check mode: every GPU op is run again on the CPU and compared
    /// (`SILICA_CHECK=1` sets it at open). No effect on the CPU.
    fn set_check(&self, py: Python<'_>, on: bool) -> PyResult<()> {
        detach(py, || {
            if let silica::Device::Gpu(g) = self.open()? {
                g.set_check(on);
            }
            Ok(())
        })
    }

    /// Test hook: this GPU acts as if it had no kernel for the op `name`
    /// (`"exp"`, `"matmul"`, ...), which then falls back to the CPU.
    fn _disable_kernel_for_testing(&self, py: Python<'_>, name: String) -> PyResult<()> {
        detach(py, || {
            if let silica::Device::Gpu(g) = self.open()? {
                // the hook keeps names for the life of the process; tests
                // disable a handful
                g.disable_kernel_for_testing(Box::leak(name.into_boxed_str()));
            }
            Ok(())
        })
    }

    /// Test hook: destroys the GPU device as a driver reset would; every
    /// later op on its tensors raises `DeviceLostError`.
    fn _destroy_for_testing(&self, py: Python<'_>) -> PyResult<()> {
        detach(py, || {
            if let silica::Device::Gpu(g) = self.open()? {
                g.destroy_for_testing();
            }
            Ok(())
        })
    }
}

impl PyDevice {
    fn stats(&self, py: Python<'_>) -> PyResult<silica::MemoryStats> {
        detach(py, || Ok(self.open()?.memory_stats()))
    }
}

/// The CPU and every GPU adapter, ranked best first (software adapters
/// such as lavapipe last). Nothing is opened.
#[pyfunction]
pub fn devices(py: Python<'_>) -> PyResult<Vec<PyDevice>> {
    let n = py.detach(silica::device_count);
    let mut v = vec![PyDevice::from_kind(Kind::Cpu)];
    v.extend((0..n).map(|i| PyDevice::from_kind(Kind::Gpu(i))));
    Ok(v)
}

/// The number of GPU adapters (software ones included).
#[pyfunction]
pub fn device_count(py: Python<'_>) -> usize {
    py.detach(silica::device_count)
}

/// Saves the compiled GPU pipelines of the devices this process opened,
/// so that the next process finds its kernels built (the package calls it
/// at exit): the files written.
#[pyfunction]
pub fn save_pipeline_caches(py: Python<'_>) -> Vec<String> {
    py.detach(silica::save_pipeline_caches)
        .into_iter()
        .map(|p| p.display().to_string())
        .collect()
}

/// The device used where none is given: the one `set_default_device`
/// chose, else `SILICA_DEVICE`, else the best hardware GPU, else the CPU.
#[pyfunction]
pub fn default_device(py: Python<'_>) -> PyResult<PyDevice> {
    Ok(PyDevice::from_kind(detach(py, default_kind)?))
}

/// Sets the device used where none is given (`None`: back to
/// `SILICA_DEVICE` / the best GPU).
#[pyfunction]
#[pyo3(signature = (device))]
pub fn set_default_device(device: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let kind = match device {
        Some(d) if !d.is_none() => Some(device_arg(d)?.kind),
        _ => None,
    };
    *DEFAULT.lock().unwrap_or_else(|e| e.into_inner()) = kind;
    Ok(())
}

/// Test hook: the GPU adapter `index` opened as a device of its own, with
/// its own memory pool, that `Device("gpu:N")` does not return.
#[pyfunction]
pub fn _open_private_gpu(py: Python<'_>, index: usize) -> PyResult<PyDevice> {
    let dev = detach(py, || {
        Ok(silica::Device::gpu_with_options(
            index,
            &silica::GpuOptions::from_env(),
        )?)
    })?;
    Ok(PyDevice::of(&dev))
}
