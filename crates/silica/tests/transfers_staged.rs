//! Uploads and read-backs through staging copies (`SILICA_NO_MAPPED=1`),
//! the path of discrete GPUs, on every adapter present: on a machine whose
//! only GPU is lavapipe this is the one run of that path. Environment
//! variables are process-wide, so this is the only test of this binary.

mod common;

#[test]
fn round_trips_through_staging_buffers() {
    // SAFETY: this binary runs no other test, and no device is open yet.
    unsafe { std::env::set_var("SILICA_NO_MAPPED", "1") };
    for dev in common::gpu_devices() {
        let silica::Device::Gpu(g) = &dev else {
            unreachable!()
        };
        assert!(
            !g.maps_buffers(),
            "{}: SILICA_NO_MAPPED=1 ignored",
            g.info().name
        );
        common::check_round_trips(&dev);
    }
}
