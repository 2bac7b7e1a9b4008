//! Profiling mode: per-kernel GPU times from timestamp queries, on every
//! GPU adapter present (both ways of placing the timestamps where the
//! adapter has timestamps inside passes), and nothing on the CPU.

mod common;

use silica::{DType, Device, KernelTime, Result, Tensor};

/// Three adds, two matmuls and one softmax, then a wait.
/// `w` is [48, 160]: the matmuls are [64, 48] x [48, 160] and
/// [64, 160] x [160, 48], whose grids differ.
fn run_ops(dev: &Device, a: &Tensor, b: &Tensor, w: &[Tensor; 2]) -> Result<()> {
    let mut x = a.clone();
    for _ in 0..3 {
        x = x.add(b)?;
    }
    let y = x.matmul(&w[0])?;
    let z = y.matmul(&w[1])?;
    let _ = z.softmax(-1)?;
    dev.synchronize()
}

fn find<'a>(report: &'a [KernelTime], prefix: &str) -> &'a KernelTime {
    let hits: Vec<&KernelTime> = report
        .iter()
        .filter(|k| k.name.starts_with(prefix))
        .collect();
    assert_eq!(hits.len(), 1, "one {prefix}* kernel expected in {report:?}");
    hits[0]
}

fn check_profile(dev: &Device, a: &Tensor, b: &Tensor, w: &[Tensor; 2], how: &str) {
    dev.reset_profile();
    assert!(
        dev.set_profiling(true),
        "{dev} ({how}): profiling did not start"
    );
    assert!(dev.profiling());
    run_ops(dev, a, b, w).unwrap();
    let report = dev.profile_report();
    eprintln!("{dev} ({how}): {report:?}");
    let total: u64 = report.iter().map(|k| k.dispatches).sum();
    assert_eq!(
        total, 6,
        "{dev} ({how}): 6 dispatches expected in {report:?}"
    );
    // `binary` or `binary_vec`; `matmul`, `matmul_big`, `matmul_coop` or
    // `matmul_coop_vec`
    assert_eq!(find(&report, "binary").dispatches, 3, "{report:?}");
    assert_eq!(find(&report, "matmul").dispatches, 2, "{report:?}");
    assert_eq!(find(&report, "softmax").dispatches, 1, "{report:?}");
    for k in &report {
        assert!(k.grid.is_none());
        assert!(
            k.seconds > 0.0 && k.seconds < 10.0,
            "{dev} ({how}): {} took {} s",
            k.name,
            k.seconds
        );
    }
    // most time first
    assert!(report.windows(2).all(|p| p[0].seconds >= p[1].seconds));

    // by grid: the two matmuls have different grids (160 and 48 columns);
    // the same totals
    let by_grid = dev.profile_report_by_grid();
    let matmuls: Vec<&KernelTime> = by_grid
        .iter()
        .filter(|k| k.name.starts_with("matmul"))
        .collect();
    assert_eq!(matmuls.len(), 2, "{by_grid:?}");
    assert!(
        matmuls
            .iter()
            .all(|k| k.dispatches == 1 && k.grid.is_some())
    );
    assert_eq!(by_grid.iter().map(|k| k.dispatches).sum::<u64>(), 6);
    let secs = |r: &[KernelTime]| r.iter().map(|k| k.seconds).sum::<f64>();
    assert!((secs(&by_grid) - secs(&report)).abs() <= 1e-9 * secs(&report).max(1.0));

    // times add up over runs
    run_ops(dev, a, b, w).unwrap();
    assert_eq!(find(&dev.profile_report(), "binary").dispatches, 6);

    dev.reset_profile();
    assert!(
        dev.profile_report().is_empty(),
        "reset left {:?}",
        dev.profile_report()
    );

    assert!(!dev.set_profiling(false));
    assert!(!dev.profiling());
    run_ops(dev, a, b, w).unwrap();
    assert!(
        dev.profile_report().is_empty(),
        "{dev} ({how}): recorded with profiling off: {:?}",
        dev.profile_report()
    );
}

#[test]
fn profile_on_every_gpu() {
    for dev in common::gpu_devices() {
        let Device::Gpu(gpu) = &dev else {
            unreachable!()
        };
        let a = Tensor::randn(&[64, 48], DType::F32, 1, &dev).unwrap();
        let b = Tensor::randn(&[64, 48], DType::F32, 2, &dev).unwrap();
        let w = [
            Tensor::randn(&[48, 160], DType::F32, 3, &dev).unwrap(),
            Tensor::randn(&[160, 48], DType::F32, 4, &dev).unwrap(),
        ];
        dev.synchronize().unwrap();
        if !dev.info().timestamps {
            eprintln!("{dev}: no timestamp queries: profiling must stay off");
            assert!(!gpu.can_profile());
            assert!(
                !dev.set_profiling(true),
                "{dev}: profiling without timestamps"
            );
            assert!(!dev.profiling());
            run_ops(&dev, &a, &b, &w).unwrap();
            assert!(dev.profile_report().is_empty());
            continue;
        }
        assert!(gpu.can_profile());
        check_profile(&dev, &a, &b, &w, "default timestamps");
        // the compute-pass-per-dispatch path of devices without timestamps
        // inside passes
        gpu.profile_per_pass_for_testing(true);
        check_profile(&dev, &a, &b, &w, "a pass per dispatch");
        gpu.profile_per_pass_for_testing(false);
        // per batch: one entry, the six kernels in one batch (the wait
        // submits them together), no longer than the sum of its kernels'
        // own intervals plus the gaps, so only bounded loosely
        gpu.set_profile_batches(true);
        dev.reset_profile();
        assert!(dev.set_profiling(true));
        run_ops(&dev, &a, &b, &w).unwrap();
        let report = dev.profile_report();
        assert_eq!(report.len(), 1, "{dev} (batches): {report:?}");
        assert_eq!(report[0].name, "(batches)");
        assert!(report[0].dispatches >= 1, "{report:?}");
        assert!(
            report[0].seconds > 0.0 && report[0].seconds < 10.0,
            "{report:?}"
        );
        dev.set_profiling(false);
        gpu.set_profile_batches(false);
        dev.reset_profile();
        // results are the same with profiling on
        let run = || {
            a.add(&b)
                .unwrap()
                .matmul(&w[0])
                .unwrap()
                .to_vec::<f32>()
                .unwrap()
        };
        let plain = run();
        assert!(dev.set_profiling(true));
        let profiled = run();
        assert!(!dev.set_profiling(false));
        assert_eq!(plain, profiled);
        dev.reset_profile();
    }
}

#[test]
fn cpu_has_no_profile() {
    let dev = Device::cpu();
    assert!(!dev.set_profiling(true), "the CPU has no GPU timestamps");
    assert!(!dev.profiling());
    let a = Tensor::randn(&[8, 8], DType::F32, 1, &dev).unwrap();
    a.matmul(&a).unwrap().softmax(-1).unwrap();
    assert!(dev.profile_report().is_empty());
    assert!(dev.profile_report_by_grid().is_empty());
    dev.reset_profile();
}
