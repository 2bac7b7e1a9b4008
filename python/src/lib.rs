//! The `silica` Python package's native module, `silica._silica`: devices
//! and their memory, tensors with NumPy interop and the op set, the models
//! (sentence embeddings, text generation) and the probe workflow
//! (activation capture, linear probes). `silica/__init__.py` re-exports it
//! and adds function forms of the tensor methods.

mod convert;
mod device;
mod dtype;
mod embedder;
mod errors;
mod generator;
mod index;
mod operands;
mod ops;
mod probe;
mod tensor;

use pyo3::prelude::*;

#[pymodule]
fn _silica(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // the `silica` tool's allocator: glibc's maps a CPU prompt's large
    // intermediates afresh for each op (docs/tuning.md, "CPU memory reuse")
    silica_alloc::keep_freed_pages();
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DeviceLostError", py.get_type::<errors::DeviceLostError>())?;
    m.add_class::<device::PyDevice>()?;
    m.add_class::<tensor::PyTensor>()?;
    m.add_class::<embedder::PyEmbedder>()?;
    m.add_class::<generator::PyGenerator>()?;
    m.add_class::<generator::PyStream>()?;
    m.add_class::<probe::PyProbe>()?;
    m.add_function(wrap_pyfunction!(probe::capture_activations_fn, m)?)?;
    m.add_function(wrap_pyfunction!(probe::train_probe, m)?)?;
    m.add_function(wrap_pyfunction!(device::devices, m)?)?;
    m.add_function(wrap_pyfunction!(device::device_count, m)?)?;
    m.add_function(wrap_pyfunction!(device::save_pipeline_caches, m)?)?;
    m.add_function(wrap_pyfunction!(device::default_device, m)?)?;
    m.add_function(wrap_pyfunction!(device::set_default_device, m)?)?;
    m.add_function(wrap_pyfunction!(device::_open_private_gpu, m)?)?;
    m.add_function(wrap_pyfunction!(ops::tensor, m)?)?;
    m.add_function(wrap_pyfunction!(ops::full, m)?)?;
    m.add_function(wrap_pyfunction!(ops::zeros, m)?)?;
    m.add_function(wrap_pyfunction!(ops::ones, m)?)?;
    m.add_function(wrap_pyfunction!(ops::arange, m)?)?;
    m.add_function(wrap_pyfunction!(ops::randn, m)?)?;
    m.add_function(wrap_pyfunction!(ops::rand, m)?)?;
    m.add_function(wrap_pyfunction!(ops::cat, m)?)?;
    m.add_function(wrap_pyfunction!(ops::stack, m)?)?;
    m.add_function(wrap_pyfunction!(ops::where_, m)?)?;
    m.add_function(wrap_pyfunction!(ops::rope_tables, m)?)?;
    Ok(())
}
