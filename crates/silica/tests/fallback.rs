//! The CPU fallback (ARCHITECTURE.md) on the first GPU adapter: an op whose
//! kernel is missing runs on the CPU, is counted in the fallback report, keeps
//! its result on the GPU, and is an error in strict mode; check mode re-runs
//! native ops on the CPU without changing their results.
//!
//! Strict mode, check mode and disabled kernels are state of the (shared)
//! device, so the steps run in sequence in one test; the only other test (a
//! documented library bug, ignored) takes the same lock.

mod common;

use std::sync::{Arc, Mutex, MutexGuard};

use silica::{DType, Device, Error, FallbackCount, GpuDevice, Op, Tensor, UnaryOp};

/// Serializes the tests of this binary: they change per-device modes.
static DEVICE_STATE: Mutex<()> = Mutex::new(());

fn lock_device_state() -> MutexGuard<'static, ()> {
    DEVICE_STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The lock of [`lock_device_state`] and the first GPU adapter, as a device
/// and as its GPU handle; `None` where there is no GPU (`common` panics
/// instead when `SILICA_REQUIRE_GPU` is set).
fn locked_gpu() -> Option<(MutexGuard<'static, ()>, Device, Arc<GpuDevice>)> {
    let serial = lock_device_state();
    let dev = common::first_gpu()?;
    let Device::Gpu(g) = &dev else {
        panic!("first_gpu returned a non-GPU device: {dev}");
    };
    let g = g.clone();
    Some((serial, dev, g))
}

fn count(report: &[FallbackCount], op: &str) -> Option<u64> {
    report.iter().find(|f| f.op == op).map(|f| f.count)
}

/// Asserts that two f32 vectors agree bit for bit (NaN included).
fn assert_same_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{what}: element {i} is {g}, the CPU gives {w}"
        );
    }
}

#[test]
fn cpu_fallback_strict_and_check_modes() {
    let Some((_serial, dev, g)) = locked_gpu() else {
        return;
    };
    let cpu = Device::cpu();
    // make sure no earlier state leaks in (the device starts with the env flags)
    g.set_strict(false);
    g.set_check(false);

    let values: Vec<f32> = (0..37).map(|i| i as f32 * 0.25 - 4.0).collect();
    let x = Tensor::from_slice(&values, &[37], &dev).unwrap();
    let x_cpu = Tensor::from_slice(&values, &[37], &cpu).unwrap();

    // ---- before: exp has a kernel and never falls back ------------------
    let exp = Op::Unary(UnaryOp::Exp);
    assert!(g.supports(&exp, &[DType::F32]), "exp/f32 should be native");
    let native_exp: Vec<f32> = x.exp().unwrap().to_vec().unwrap();
    assert_eq!(count(&g.fallback_report(), "exp/f32"), None);
    let cpu_exp: Vec<f32> = x_cpu.exp().unwrap().to_vec().unwrap();
    for (i, (a, b)) in native_exp.iter().zip(&cpu_exp).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 + 1e-4 * b.abs(),
            "native exp differs at {i}: {a} vs {b}"
        );
    }

    // ---- a disabled kernel falls back to the CPU --------------------------
    g.disable_kernel_for_testing("exp");
    assert!(
        !g.supports(&exp, &[DType::F32]),
        "a disabled kernel must not be reported as supported"
    );
    assert!(
        g.supports(&Op::Unary(UnaryOp::Sqrt), &[DType::F32]),
        "disabling exp must not disable sqrt"
    );

    let y = x.exp().unwrap();
    assert!(y.device().same(&dev), "fallback result left the GPU: {y:?}");
    assert!(y.device().is_gpu());
    assert_eq!(y.shape(), &[37]);
    assert_eq!(y.dtype(), DType::F32);
    assert!(y.is_contiguous());
    // the CPU kernel ran: the values are the CPU's, bit for bit
    assert_same_bits(&y.to_vec::<f32>().unwrap(), &cpu_exp, "fallback exp");
    let report = g.fallback_report();
    assert_eq!(
        count(&report, "exp/f32"),
        Some(1),
        "report after one fallback: {report:?}"
    );

    // the result is a normal GPU tensor: a native op consumes it
    let z = y.add(&x).unwrap();
    let want: Vec<f32> = cpu_exp.iter().zip(&values).map(|(a, b)| a + b).collect();
    assert_same_bits(
        &z.to_vec::<f32>().unwrap(),
        &want,
        "native add of a fallback result",
    );

    let _ = x.exp().unwrap();
    let report = g.fallback_report();
    assert_eq!(
        count(&report, "exp/f32"),
        Some(2),
        "report after two fallbacks: {report:?}"
    );

    // native ops are not counted
    let s = x.abs().unwrap().sqrt().unwrap();
    let s_cpu: Vec<f32> = x_cpu.abs().unwrap().sqrt().unwrap().to_vec().unwrap();
    let s_gpu: Vec<f32> = s.to_vec().unwrap();
    for (a, b) in s_gpu.iter().zip(&s_cpu) {
        assert!((a - b).abs() <= 1e-6 + 1e-5 * b.abs(), "sqrt {a} vs {b}");
    }
    let report = g.fallback_report();
    assert!(
        report.iter().all(|f| f.op.starts_with("exp/")),
        "only exp may have fallen back: {report:?}"
    );
    assert_eq!(count(&report, "sqrt/f32"), None);

    // a strided view and another dtype fall back too, counted per dtype
    let m_values: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 3.0).collect();
    let m = Tensor::from_slice(&m_values, &[3, 4], &dev)
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap();
    let m_cpu = Tensor::from_slice(&m_values, &[3, 4], &cpu)
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap();
    let mt = m.t().unwrap();
    assert!(!mt.is_contiguous());
    let e16 = mt.exp().unwrap();
    assert!(e16.device().same(&dev));
    assert_eq!(e16.shape(), &[4, 3]);
    assert_eq!(e16.dtype(), DType::F16);
    let want16: Vec<half::f16> = m_cpu.t().unwrap().exp().unwrap().to_vec().unwrap();
    let got16: Vec<half::f16> = e16.to_vec().unwrap();
    assert_eq!(
        got16.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want16.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        "f16 fallback of a transposed view"
    );
    let report = g.fallback_report();
    assert_eq!(count(&report, "exp/f16"), Some(1), "{report:?}");
    assert_eq!(count(&report, "exp/f32"), Some(2), "{report:?}");

    // ---- strict mode: the fallback is an error ----------------------------
    g.set_strict(true);
    match x.exp() {
        Err(e @ Error::FallbackForbidden { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("exp"), "message does not name the op: {msg}");
            assert!(
                msg.contains("f32"),
                "message does not name the dtype: {msg}"
            );
            let Error::FallbackForbidden { op, dtype, .. } = e else {
                unreachable!()
            };
            assert_eq!(op, "exp");
            assert_eq!(dtype, DType::F32);
        }
        other => panic!("strict mode: expected FallbackForbidden, got {other:?}"),
    }
    // a forbidden fallback is not counted
    assert_eq!(count(&g.fallback_report(), "exp/f32"), Some(2));
    // native ops still work in strict mode
    let s2: Vec<f32> = x.abs().unwrap().sqrt().unwrap().to_vec().unwrap();
    assert_eq!(s2, s_gpu, "native sqrt under strict mode");
    g.set_strict(false);
    // and the fallback works again once strict mode is off
    assert_same_bits(
        &x.exp().unwrap().to_vec::<f32>().unwrap(),
        &cpu_exp,
        "fallback after strict mode",
    );
    assert_eq!(count(&g.fallback_report(), "exp/f32"), Some(3));

    // ---- check mode: native ops are compared with the CPU -----------------
    // (contiguous operands only: strided ones hit the bug that
    // `check_mode_with_strided_operands` below documents)
    g.set_check(true);
    let a = Tensor::randn(&[17, 33], DType::F32, 1, &dev).unwrap();
    let b = Tensor::randn(&[33, 9], DType::F32, 2, &dev).unwrap();
    let c = Tensor::randn(&[17, 9], DType::F32, 3, &dev).unwrap();
    let a_cpu = a.to_device(&cpu).unwrap();
    let b_cpu = b.to_device(&cpu).unwrap();
    let c_cpu = c.to_device(&cpu).unwrap();

    let prod = a.matmul(&b).expect("matmul under check mode");
    let shifted = prod.add(&c).expect("add under check mode");
    let probs = shifted.softmax(-1).expect("softmax under check mode");
    let sums = probs.sum(-1, false).expect("sum under check mode");
    let sums: Vec<f32> = sums.to_vec().unwrap();
    assert_eq!(sums.len(), 17);
    assert!(
        sums.iter().all(|s| (s - 1.0).abs() < 1e-4),
        "softmax rows must sum to 1: {sums:?}"
    );
    let want: Vec<f32> = a_cpu
        .matmul(&b_cpu)
        .unwrap()
        .add(&c_cpu)
        .unwrap()
        .softmax(-1)
        .unwrap()
        .to_vec()
        .unwrap();
    let got: Vec<f32> = probs.to_vec().unwrap();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 + 1e-3 * w.abs(),
            "softmax {i}: {g} vs {w}"
        );
    }
    let scaled: Vec<f32> = a.mul_scalar(0.5).unwrap().to_vec().unwrap();
    let scaled_cpu: Vec<f32> = a_cpu.mul_scalar(0.5).unwrap().to_vec().unwrap();
    assert_eq!(scaled, scaled_cpu, "mul_scalar under check mode");
    // a fallback under check mode still works (and is still counted)
    assert_same_bits(
        &x.exp().unwrap().to_vec::<f32>().unwrap(),
        &cpu_exp,
        "fallback under check mode",
    );
    assert_eq!(count(&g.fallback_report(), "exp/f32"), Some(4));
    g.set_check(false);

    // nothing but exp ever fell back
    let report = g.fallback_report();
    assert!(
        report.iter().all(|f| f.op.starts_with("exp/")),
        "unexpected fallbacks: {report:?}"
    );
    dev.synchronize().unwrap();
}

/// Check mode with a strided (non-contiguous) GPU operand. Regression test:
/// the check re-runs the op on host copies of the inputs, and the host copy
/// of a strided GPU view used to run `contiguous()` on the GPU, which was
/// itself checked, recursing until the stack overflowed. Host copies now
/// read the storage range back and gather on the host.
#[test]
fn check_mode_with_strided_operands() {
    let Some((_serial, dev, g)) = locked_gpu() else {
        return;
    };
    let cpu = Device::cpu();
    g.set_strict(false);
    g.set_check(true);
    let run = || -> silica::Result<()> {
        let a = Tensor::randn(&[5, 7], DType::F32, 11, &dev)?;
        let bias = Tensor::randn(&[7], DType::F32, 12, &dev)?;
        let a_cpu = a.to_device(&cpu)?;
        let bias_cpu = bias.to_device(&cpu)?;
        // a transposed view read back
        let at: Vec<f32> = a.t()?.to_vec()?;
        assert_eq!(at, a_cpu.t()?.to_vec::<f32>()?);
        // a broadcast operand
        let sum: Vec<f32> = a.add(&bias)?.to_vec()?;
        assert_eq!(sum, a_cpu.add(&bias_cpu)?.to_vec::<f32>()?);
        // a transposed operand of a matmul
        let gram: Vec<f32> = a.t()?.matmul(&a)?.to_vec()?;
        let want: Vec<f32> = a_cpu.t()?.matmul(&a_cpu)?.to_vec()?;
        for (x, y) in gram.iter().zip(&want) {
            assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "{x} vs {y}");
        }
        Ok(())
    };
    let result = run();
    g.set_check(false);
    result.unwrap();
}

/// A decode step of `cached_attention` is one kernel on a GPU (not rope,
/// a cache copy and attention): `attention_step_sg` where the adapter's
/// subgroups hold a head's 8 lanes (16-bit heads of 64), `attention_step`
/// otherwise. Check mode compares it with the CPU's
/// composition of those ops, attention and cache row alike. So is a step
/// with Gemma 3's head size of 256, a sliding window that hides the first
/// keys and soft-capped scores.
#[test]
fn cached_attention_step_is_one_checked_kernel() {
    let Some((_serial, dev, g)) = locked_gpu() else {
        return;
    };
    one_checked_step(&dev, &g, 64, 5, silica::CachedAttentionOpts::scaled(0.125));
    let gemma = silica::CachedAttentionOpts {
        scale: 0.0625,
        window: Some(4),
        softcap: Some(1.0),
    };
    one_checked_step(&dev, &g, 256, 10, gemma);
}

/// One decode step at `start` of a cache of `start + 3` rows, on `dev`
/// and on the CPU (see `cached_attention_step_is_one_checked_kernel`).
fn one_checked_step(
    dev: &Device,
    g: &GpuDevice,
    hd: usize,
    start: usize,
    opts: silica::CachedAttentionOpts,
) {
    let cpu = Device::cpu();
    let (h, kvh) = (4, 2);
    let qkv = Tensor::randn(&[1, h + 2 * kvh, hd], DType::F16, 51, dev).unwrap();
    let cache0 = Tensor::randn(&[start + 3, 2 * kvh, hd], DType::F16, 52, dev).unwrap();
    let angles: Vec<f32> = (0..hd / 2).map(|i| 0.3 + i as f32 * 0.01).collect();
    let a = Tensor::from_vec(angles, &[1, hd / 2], &cpu).unwrap();
    let (cos, sin) = (a.cos().unwrap(), a.sin().unwrap());
    let step = |d: &Device, check: bool| -> silica::Result<(Tensor, Tensor)> {
        let mut cache = cache0.to_device(d)?.copy()?;
        let tables = (
            &cos.to_device(d)?,
            &sin.to_device(d)?,
            silica::RopeStyle::Half,
        );
        let qkv = qkv.to_device(d)?;
        g.set_check(check);
        let out = qkv.cached_attention_with(&mut cache, start, tables, h, opts);
        g.set_check(false);
        Ok((out?, cache))
    };
    let host = |(out, cache): (Tensor, Tensor)| -> (Vec<f32>, Vec<f32>) {
        let f = |t: Tensor| t.to_dtype(DType::F32).unwrap().to_vec().unwrap();
        (f(out), f(cache))
    };
    let want = host(step(&cpu, false).unwrap());

    let before = step(dev, false).unwrap(); // kernels built outside the profile
    dev.synchronize().unwrap();
    dev.reset_profile();
    assert!(dev.set_profiling(true), "{dev}: profiling did not start");
    let got = step(dev, false).unwrap();
    dev.synchronize().unwrap();
    dev.set_profiling(false);
    let report = dev.profile_report();
    // the copies are the test's own (the cache and the tables uploaded)
    let kernels: Vec<(&str, u64)> = report
        .iter()
        .filter(|k| !k.name.starts_with("copy"))
        .map(|k| (k.name.as_str(), k.dispatches))
        .collect();
    assert!(
        kernels == [("attention_step_sg", 1)] || kernels == [("attention_step", 1)],
        "{report:?}"
    );
    let got = host(got);
    assert_eq!(host(before), got, "two runs of the same step differ");

    let checked = host(step(dev, true).expect("cached_attention under check mode"));
    for (what, g, c, w) in [
        ("attention", &got.0, &checked.0, &want.0),
        ("cache", &got.1, &checked.1, &want.1),
    ] {
        assert_eq!(g, c, "{what}: check mode changed the result");
        for (i, (x, y)) in g.iter().zip(w).enumerate() {
            assert!(
                (x - y).abs() <= 2e-3 + 4e-3 * y.abs(),
                "{what} {i}: {x} vs CPU {y}"
            );
        }
    }
    // rows other than the new position are untouched
    let row = 2 * kvh * hd;
    assert_eq!(got.1[..start * row], want.1[..start * row]);
    assert_eq!(got.1[(start + 1) * row..], want.1[(start + 1) * row..]);
}

/// A batched decode step of three sequences in one pooled cache is one
/// kernel on a GPU whose subgroups hold a 16-bit head of 64 (lavapipe's 8
/// lanes do), not a kernel per sequence.
#[test]
fn batched_attention_step_is_one_kernel() {
    let Some((_serial, dev, _g)) = locked_gpu() else {
        return;
    };
    let (h, kvh, hd, slot) = (4, 2, 64, 16);
    let starts = [0usize, 5, 11];
    let qkv = Tensor::randn(&[3, h + 2 * kvh, hd], DType::F16, 53, &dev).unwrap();
    let mut pool = Tensor::randn(&[3 * slot, 2 * kvh, hd], DType::F16, 54, &dev).unwrap();
    let angles: Vec<f32> = (0..3 * hd / 2).map(|i| 0.1 + i as f32 * 0.01).collect();
    let a = Tensor::from_vec(angles, &[3, hd / 2], &dev).unwrap();
    let (cos, sin) = (a.cos().unwrap(), a.sin().unwrap());
    let seqs: Vec<silica::CacheSeq> = starts
        .iter()
        .enumerate()
        .map(|(i, &start)| silica::CacheSeq {
            len: 1,
            base: i * slot,
            start,
        })
        .collect();
    let table = silica::CacheSeqs::new(&seqs, None, &dev).unwrap();
    let opts = silica::CachedAttentionOpts::scaled(0.125);
    let tables = (&cos, &sin, silica::RopeStyle::Half);
    let step = |pool: &mut Tensor| qkv.cached_attention_batch(pool, &table, tables, h, opts);
    step(&mut pool).unwrap(); // kernels built outside the profile
    dev.synchronize().unwrap();
    dev.reset_profile();
    assert!(dev.set_profiling(true), "{dev}: profiling did not start");
    step(&mut pool).unwrap();
    dev.synchronize().unwrap();
    dev.set_profiling(false);
    let report = dev.profile_report();
    let kernels: Vec<(&str, u64)> = report
        .iter()
        .map(|k| (k.name.as_str(), k.dispatches))
        .collect();
    assert_eq!(kernels, [("attention_step_sg_batch", 1)], "{report:?}");
}
