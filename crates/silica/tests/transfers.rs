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

/// Recorded work goes to the GPU in batches that start short after a wait
/// that left the GPU idle and double up to `submit_every`; a read-back
/// with work submitted after it leaves the batches as they were.
#[test]
fn batches_start_short_after_the_gpu_went_idle() {
    let n = common::gpu_devices().len();
    for i in 0..n {
        let opts = silica::GpuOptions {
            submit_every: 16,
            first_batch: 4,
            ..silica::GpuOptions::default()
        };
        let dev = silica::Device::gpu_with_options(i, &opts).unwrap();
        let silica::Device::Gpu(g) = &dev else {
            unreachable!()
        };
        let name = g.info().name.clone();
        let one = silica::Tensor::from_vec(vec![1.0f32; 64], &[64], &dev).unwrap();
        let mut x = silica::Tensor::from_vec(vec![0.0f32; 64], &[64], &dev).unwrap();
        dev.synchronize().unwrap();
        // each add is one dispatch: batches of 4, 8, 16 and 16 go at 4,
        // 12, 28 and 44 adds
        let start = g.batches_submitted();
        for _ in 0..50 {
            x = x.add(&one).unwrap();
        }
        assert_eq!(
            g.batches_submitted() - start,
            4,
            "{name}: batches of 50 adds"
        );
        // the read submits the other 6 and waits for everything
        assert_eq!(x.to_vec::<f32>().unwrap(), vec![50.0; 64], "{name}");
        let start = g.batches_submitted();
        for _ in 0..5 {
            x = x.add(&one).unwrap();
        }
        assert_eq!(
            g.batches_submitted() - start,
            1,
            "{name}: the GPU was idle after the read: 4 adds make a batch"
        );
        // a read started, more work submitted, then the read finished:
        // the GPU may still be busy, so the batches stay long
        let pending = x.read_later().unwrap();
        for _ in 0..20 {
            x = x.add(&one).unwrap();
        }
        let got: Vec<f32> = pending.to_vec().unwrap();
        assert_eq!(got, vec![55.0; 64], "{name}");
        // 4 adds are pending; 12 more fill the batch of 16 (after a cut,
        // batches of 4 and 8 would have gone)
        let start = g.batches_submitted();
        for _ in 0..15 {
            x = x.add(&one).unwrap();
        }
        assert_eq!(
            g.batches_submitted() - start,
            1,
            "{name}: a read with work after it cut the batches short"
        );
        assert_eq!(x.to_vec::<f32>().unwrap(), vec![90.0; 64], "{name}");
    }
}
