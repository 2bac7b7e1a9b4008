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
