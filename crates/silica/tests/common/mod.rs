//! Helpers shared by the integration tests.
#![allow(dead_code)]

use silica::Device;

/// Every GPU adapter present (software ones included), opened. With
/// `SILICA_REQUIRE_GPU=1` an empty list is a test failure, not a skip.
pub fn gpu_devices() -> Vec<Device> {
    let infos = silica::adapters();
    let require = std::env::var("SILICA_REQUIRE_GPU").is_ok_and(|v| v == "1");
    if infos.is_empty() {
        assert!(
            !require,
            "SILICA_REQUIRE_GPU=1 but wgpu found no adapter (install mesa-vulkan-drivers for lavapipe)"
        );
        eprintln!("no GPU adapter: GPU cases skipped (set SILICA_REQUIRE_GPU=1 to fail instead)");
        return Vec::new();
    }
    infos
        .iter()
        .enumerate()
        .map(|(i, info)| {
            let dev = Device::gpu(i).unwrap_or_else(|e| panic!("opening {}: {e}", info.name));
            eprintln!(
                "GPU adapter gpu:{i}: {} ({}, {})",
                info.name,
                info.backend.as_str(),
                info.device_type
            );
            dev
        })
        .collect()
}

/// The first GPU adapter, or `None` (a failure under `SILICA_REQUIRE_GPU=1`).
pub fn first_gpu() -> Option<Device> {
    gpu_devices().into_iter().next()
}

/// Uploads and read-backs of every float dtype on `dev`, checked element by
/// element: sizes below and above the mapped-upload threshold (64 KiB),
/// views starting at odd elements (reads whose first byte is not on a
/// word or a mapping boundary), results of kernels read without a
/// synchronization, and an upload into a cached buffer that held other
/// values.
pub fn check_round_trips(dev: &Device) {
    use silica::{DType, Tensor};
    for dtype in DType::FLOATS {
        for n in [1usize, 3, 1000, 40_001, 300_001] {
            let values: Vec<f32> = (0..n).map(|i| ((i % 1000) as f32) * 0.25 - 60.0).collect();
            let t = Tensor::from_slice(&values, &[n], &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let want: Vec<f32> = t.to_dtype(DType::F32).unwrap().to_vec().unwrap();
            let g = t.to_device(dev).unwrap();
            let back: Vec<f32> = g.to_dtype(DType::F32).unwrap().to_vec().unwrap();
            assert_eq!(back, want, "{dtype} x {n}: round trip");
            let same = g.to_device(&Device::Cpu).unwrap();
            assert_eq!(same.dtype(), dtype);
            for start in [1usize, 3, 5] {
                if start >= n {
                    continue;
                }
                let len = (n - start).min(777);
                let view = g
                    .narrow(0, start, len)
                    .unwrap()
                    .to_device(&Device::Cpu)
                    .unwrap();
                let got: Vec<f32> = view.to_dtype(DType::F32).unwrap().to_vec().unwrap();
                assert_eq!(
                    got,
                    want[start..start + len],
                    "{dtype} x {n}: view at {start}"
                );
            }
            // a kernel's result, read with the work still queued
            let doubled = g.add(&g).unwrap().to_device(&Device::Cpu).unwrap();
            let got: Vec<f32> = doubled.to_dtype(DType::F32).unwrap().to_vec().unwrap();
            let twice: Vec<f32> = want.iter().map(|v| v * 2.0).collect();
            assert_eq!(got, twice, "{dtype} x {n}: sum");
            // the buffer goes back to the cache; the next upload of the same
            // size takes it
            drop(g);
            let ones = Tensor::ones(&[n], dtype, dev).unwrap();
            let got: Vec<f32> = ones.to_dtype(DType::F32).unwrap().to_vec().unwrap();
            assert!(
                got.iter().all(|&v| v == 1.0),
                "{dtype} x {n}: upload into a cached buffer"
            );
        }
    }
}
