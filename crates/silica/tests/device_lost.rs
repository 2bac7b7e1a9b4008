//! A lost GPU device turns every later op into `Error::DeviceLost`, never
//! a panic or an abort, and a fresh device can be opened afterwards.
//! (Its own test binary: it destroys the shared device.)

mod common;

use silica::{DType, Device, Error, Tensor};

#[test]
fn lost_device_gives_errors_and_a_fresh_device_works() {
    let Some(dev) = common::first_gpu() else {
        return;
    };
    let Device::Gpu(g) = &dev else { unreachable!() };
    let index = g.info().index.expect("GPU devices have an index");
    let x = Tensor::randn(&[64, 64], DType::F32, 1, &dev).unwrap();
    let pending = x.matmul(&x).unwrap(); // recorded, not yet read back
    g.destroy_for_testing();
    assert!(g.is_lost());
    for result in [
        pending.to_vec::<f32>().map(|_| ()),
        x.exp().map(|_| ()),
        dev.synchronize(),
    ] {
        match result {
            Err(Error::DeviceLost { device, .. }) => assert!(device.contains(&g.info().name)),
            other => panic!("expected DeviceLost, got {other:?}"),
        }
    }
    assert!(matches!(
        Tensor::zeros(&[4], DType::F32, &dev),
        Err(Error::DeviceLost { .. })
    ));
    drop((x, pending));
    // the same index opens a new, working device
    let fresh = Device::gpu(index).unwrap();
    assert!(!fresh.same(&dev));
    let y = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &fresh).unwrap();
    assert_eq!(
        y.sqr().unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 4.0, 9.0]
    );
}
