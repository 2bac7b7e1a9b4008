//! Uploads and read-backs on every GPU as it opens by default: through the
//! buffers' own mappings on unified-memory adapters (lavapipe among them),
//! through staging copies elsewhere. `transfers_staged.rs` runs the same
//! checks with the staging copies forced.

mod common;

#[test]
fn round_trips_through_the_default_path() {
    for dev in common::gpu_devices() {
        let silica::Device::Gpu(g) = &dev else {
            unreachable!()
        };
        let unified = matches!(g.info().device_type.as_str(), "IntegratedGpu" | "Cpu");
        eprintln!("{}: buffers mapped: {}", g.info().name, g.maps_buffers());
        if unified && g.info().backend != silica::BackendKind::Gl {
            assert!(
                g.maps_buffers(),
                "{}: a unified-memory adapter copies through staging buffers",
                g.info().name
            );
        }
        common::check_round_trips(&dev);
    }
}
