//! `SILICA_DEVICE` decides what `Device::best` returns. Environment variables
//! are process-wide, so this is the only test of this binary.

use silica::{Device, Error};

/// Restores `SILICA_DEVICE` to its value at the start, even on a panic.
struct RestoreEnv(Option<std::ffi::OsString>);

impl Drop for RestoreEnv {
    fn drop(&mut self) {
        // SAFETY: this binary runs no other test, so no other thread reads the environment.
        unsafe {
            match self.0.take() {
                Some(v) => std::env::set_var("SILICA_DEVICE", v),
                None => std::env::remove_var("SILICA_DEVICE"),
            }
        }
    }
}

fn set(value: &str) {
    // SAFETY: this binary runs no other test, so no other thread reads the environment.
    unsafe { std::env::set_var("SILICA_DEVICE", value) };
}

#[test]
fn silica_device_selects_the_device_of_best() {
    let _restore = RestoreEnv(std::env::var_os("SILICA_DEVICE"));
    let adapters = silica::adapters();

    set("cpu");
    let d = Device::best().unwrap();
    assert!(d.is_cpu(), "SILICA_DEVICE=cpu gave {d}");
    set("  CPU ");
    assert!(Device::best().unwrap().is_cpu());

    let past = adapters.len() + 998; // 999 unless there are adapters
    for selector in ["gpu:999".to_string(), format!("gpu:{past}")] {
        set(&selector);
        match Device::best() {
            Err(e @ Error::NoDevice { .. }) => {
                let msg = e.to_string();
                let Error::NoDevice { selector: s, .. } = e else {
                    unreachable!()
                };
                assert_eq!(s, selector);
                assert!(msg.contains(&selector), "{msg}");
                if adapters.is_empty() {
                    assert!(msg.contains("no GPU adapter"), "{msg}");
                } else {
                    assert!(msg.contains("adapters found"), "{msg}");
                }
            }
            other => panic!("SILICA_DEVICE={selector}: expected NoDevice, got {other:?}"),
        }
    }

    set("gpu:not-a-number");
    assert!(matches!(Device::best(), Err(Error::NoDevice { .. })));

    // a selector naming an adapter picks it, software adapters included
    // (which best() never picks on its own)
    if let Some(first) = adapters.first() {
        set("gpu:0");
        let d = Device::best().unwrap();
        assert!(d.is_gpu());
        assert_eq!(d.info().name, first.name);
        assert_eq!(d.info().index, Some(0));
    }

    // an empty value is the same as unset: the best hardware GPU, else the CPU
    set("   ");
    let blank = Device::best().unwrap();
    // SAFETY: as above, no other thread reads the environment.
    unsafe { std::env::remove_var("SILICA_DEVICE") };
    let unset = Device::best().unwrap();
    assert!(blank.same(&unset), "blank gave {blank}, unset gave {unset}");
    match silica::default_gpu_index() {
        Some(i) => {
            assert!(unset.is_gpu());
            assert_eq!(unset.info().index, Some(i));
            assert_ne!(
                unset.info().device_type,
                "Cpu",
                "best() picked a software adapter"
            );
        }
        None => assert!(unset.is_cpu(), "no hardware GPU, yet best() gave {unset}"),
    }
}
