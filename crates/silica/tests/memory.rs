//! The GPU caching allocator on the first GPU adapter: its counters, buffer
//! reuse, `empty_cache`, the memory limit (out of memory is an error and the
//! device stays usable), and tensors too large for one binding.
//!
//! The counters, the cache and the limit belong to the device, which every
//! test of this binary shares, so the tests take one lock and run one at a time.

mod common;

use std::sync::{Mutex, MutexGuard};

use silica::{DType, Device, Error, MemoryStats, Tensor};

static DEVICE_STATE: Mutex<()> = Mutex::new(());

fn lock_device_state() -> MutexGuard<'static, ()> {
    DEVICE_STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes the memory limit when dropped, even if the test panics.
struct NoLimitOnDrop(Device);

impl Drop for NoLimitOnDrop {
    fn drop(&mut self) {
        self.0.set_memory_limit(None);
    }
}

/// The counters after all submitted work finished, with their invariants checked.
fn stats(dev: &Device) -> MemoryStats {
    dev.synchronize().unwrap();
    let s = dev.memory_stats();
    assert!(s.reserved >= s.allocated, "reserved < allocated: {s:?}");
    assert!(s.peak_allocated >= s.allocated, "peak < allocated: {s:?}");
    if s.live_buffers == 0 {
        assert_eq!(
            s.allocated, 0,
            "bytes allocated without live buffers: {s:?}"
        );
    }
    if s.cached_buffers == 0 {
        assert_eq!(
            s.reserved, s.allocated,
            "cache bytes without cached buffers: {s:?}"
        );
    }
    s
}

const MIB: u64 = 1 << 20;

#[test]
fn counters_return_to_baseline_and_cached_buffers_are_reused() {
    let _serial = lock_device_state();
    let Some(dev) = common::first_gpu() else {
        return;
    };
    let cpu = Device::cpu();
    dev.empty_cache();
    let base = stats(&dev);
    assert_eq!(base.cached_buffers, 0, "empty_cache left buffers: {base:?}");
    assert_eq!(base.reserved, base.allocated);
    assert_eq!(base.limit, None);

    // ---- a chain of ops: intermediates are freed when they drop -----------
    {
        let a = Tensor::randn(&[64, 48], DType::F32, 1, &dev).unwrap();
        let b = Tensor::randn(&[48, 32], DType::F32, 2, &dev).unwrap();
        let s = stats(&dev);
        assert_eq!(s.live_buffers, base.live_buffers + 2, "{s:?}");
        assert!(
            s.allocated >= base.allocated + (64 * 48 + 48 * 32) * 4,
            "two inputs are not counted: {s:?}"
        );
        let out = a
            .matmul(&b)
            .unwrap()
            .relu()
            .unwrap()
            .softmax(-1)
            .unwrap()
            .t()
            .unwrap()
            .sum(-1, false)
            .unwrap();
        let s = stats(&dev);
        // a, b and the result are live; the intermediates already dropped
        assert_eq!(s.live_buffers, base.live_buffers + 3, "{s:?}");
        assert!(
            s.cached_buffers >= 3,
            "intermediates were not cached: {s:?}"
        );
        let got: Vec<f32> = out.to_vec().unwrap();
        let want: Vec<f32> = a
            .to_device(&cpu)
            .unwrap()
            .matmul(&b.to_device(&cpu).unwrap())
            .unwrap()
            .relu()
            .unwrap()
            .softmax(-1)
            .unwrap()
            .t()
            .unwrap()
            .sum(-1, false)
            .unwrap()
            .to_vec()
            .unwrap();
        assert_eq!(got.len(), 32);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
        }
    }
    let after = stats(&dev);
    assert_eq!(after.allocated, base.allocated, "bytes leaked: {after:?}");
    assert_eq!(
        after.live_buffers, base.live_buffers,
        "buffers leaked: {after:?}"
    );
    assert!(
        after.cached_buffers > 0,
        "freed buffers were not cached: {after:?}"
    );
    assert!(after.reserved > after.allocated, "{after:?}");

    // ---- the peak follows a big tensor --------------------------------------
    dev.reset_peak_memory();
    let s0 = stats(&dev);
    assert_eq!(s0.peak_allocated, s0.allocated, "reset_peak_memory: {s0:?}");
    let big = Tensor::zeros(&[1 << 20], DType::F32, &dev).unwrap(); // 4 MiB
    let s1 = stats(&dev);
    assert!(s1.allocated >= s0.allocated + 4 * MIB, "{s1:?}");
    assert!(s1.peak_allocated >= s0.allocated + 4 * MIB, "{s1:?}");
    assert_eq!(s1.live_buffers, s0.live_buffers + 1);
    drop(big);
    let s2 = stats(&dev);
    assert_eq!(s2.allocated, s0.allocated);
    assert_eq!(
        s2.peak_allocated, s1.peak_allocated,
        "the peak must survive the drop"
    );
    dev.reset_peak_memory();
    assert_eq!(stats(&dev).peak_allocated, s0.allocated);

    // ---- a second identical allocation reuses the cached buffer ------------
    dev.empty_cache();
    let n = 3 * (1 << 18) + 5; // an odd size, ~3 MiB
    let bytes = n as u64 * 4;
    let c0 = stats(&dev);
    let first = Tensor::ones(&[n], DType::F32, &dev).unwrap();
    let c1 = stats(&dev);
    let class = c1.reserved - c0.reserved;
    assert!(
        class >= bytes && class <= bytes + bytes / 8 + 256,
        "a {bytes}-byte tensor reserved {class} bytes: {c1:?}"
    );
    assert_eq!(c1.allocated, c0.allocated + class);
    assert_eq!(c1.live_buffers, c0.live_buffers + 1);
    drop(first);
    let c2 = stats(&dev);
    assert_eq!(c2.allocated, c0.allocated);
    assert_eq!(
        c2.reserved, c1.reserved,
        "a dropped buffer must stay reserved"
    );
    assert_eq!(c2.cached_buffers, c0.cached_buffers + 1);
    let second = Tensor::zeros(&[n], DType::F32, &dev).unwrap();
    let c3 = stats(&dev);
    assert_eq!(c3.reserved, c1.reserved, "the cached buffer was not reused");
    assert_eq!(c3.cached_buffers, c0.cached_buffers);
    assert_eq!(c3.allocated, c1.allocated);
    // the reused buffer held ones: zeros must really be zero
    let tail: Vec<f32> = second.narrow(0, n - 7, 7).unwrap().to_vec().unwrap();
    assert_eq!(tail, vec![0.0; 7], "stale data in a reused buffer");
    assert!(second.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
    drop(second);
    // a slightly smaller tensor of the same size class reuses it too
    let third = Tensor::full(2.5, &[n - 3], DType::F32, &dev).unwrap();
    assert_eq!(stats(&dev).reserved, c1.reserved);
    let v: Vec<f32> = third.to_vec().unwrap();
    assert_eq!(v.len(), n - 3);
    assert!(v.iter().all(|&x| x == 2.5));
    drop(third);

    // ---- empty_cache gives every cached buffer back ------------------------
    assert!(stats(&dev).cached_buffers > 0);
    dev.empty_cache();
    let e = stats(&dev);
    assert_eq!(e.cached_buffers, 0, "{e:?}");
    assert_eq!(e.reserved, e.allocated, "{e:?}");
    assert_eq!(e.allocated, base.allocated);
    assert_eq!(e.live_buffers, base.live_buffers);
}

#[test]
fn views_allocate_nothing() {
    let _serial = lock_device_state();
    let Some(dev) = common::first_gpu() else {
        return;
    };
    let cpu = Device::cpu();
    let values: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let a = Tensor::from_slice(&values, &[4, 6], &dev).unwrap();
    let a_cpu = Tensor::from_slice(&values, &[4, 6], &cpu).unwrap();
    let s0 = stats(&dev);
    let views = [
        a.t().unwrap(),
        a.narrow(1, 2, 3).unwrap(),
        a.narrow(0, 1, 2).unwrap(),
        a.unsqueeze(1).unwrap(),
        a.reshape(&[2, 12]).unwrap(),
        a.reshape(&[2, 2, 6]).unwrap().permute(&[2, 0, 1]).unwrap(),
        a.narrow(0, 1, 1).unwrap().squeeze(0).unwrap(),
        a.unsqueeze(0).unwrap().broadcast_to(&[3, 4, 6]).unwrap(),
    ];
    let s1 = stats(&dev);
    assert_eq!(s1.live_buffers, s0.live_buffers, "a view allocated: {s1:?}");
    assert_eq!(s1.allocated, s0.allocated, "a view allocated: {s1:?}");
    let views_cpu = [
        a_cpu.t().unwrap(),
        a_cpu.narrow(1, 2, 3).unwrap(),
        a_cpu.narrow(0, 1, 2).unwrap(),
        a_cpu.unsqueeze(1).unwrap(),
        a_cpu.reshape(&[2, 12]).unwrap(),
        a_cpu
            .reshape(&[2, 2, 6])
            .unwrap()
            .permute(&[2, 0, 1])
            .unwrap(),
        a_cpu.narrow(0, 1, 1).unwrap().squeeze(0).unwrap(),
        a_cpu
            .unsqueeze(0)
            .unwrap()
            .broadcast_to(&[3, 4, 6])
            .unwrap(),
    ];
    for (v, w) in views.iter().zip(&views_cpu) {
        assert_eq!(v.shape(), w.shape());
        assert_eq!(
            v.to_vec::<f32>().unwrap(),
            w.to_vec::<f32>().unwrap(),
            "GPU view {v:?}"
        );
    }
    drop(views);
    // a reshape that needs a copy allocates exactly one buffer
    let before = stats(&dev);
    let flat = a.t().unwrap().reshape(&[24]).unwrap();
    let s2 = stats(&dev);
    assert_eq!(s2.live_buffers, before.live_buffers + 1, "{s2:?}");
    assert_eq!(
        flat.to_vec::<f32>().unwrap(),
        a_cpu
            .t()
            .unwrap()
            .reshape(&[24])
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    );
    drop(flat);
    assert_eq!(stats(&dev).live_buffers, before.live_buffers);
}

fn expect_oom(
    result: silica::Result<Tensor>,
    what: &str,
    limit: u64,
    allocated: u64,
    min_requested: u64,
) {
    match result {
        Err(e @ Error::OutOfMemory { .. }) => {
            let msg = e.to_string();
            let Error::OutOfMemory {
                requested,
                allocated: at,
                limit: l,
                ..
            } = e
            else {
                unreachable!()
            };
            assert!(
                requested >= min_requested,
                "{what}: requested {requested} < {min_requested}"
            );
            assert!(
                requested + allocated > limit,
                "{what}: the request {requested} fitted the limit {limit}"
            );
            assert_eq!(at, allocated, "{what}: allocated bytes in the error");
            assert_eq!(l, Some(limit), "{what}: limit in the error");
            assert!(msg.contains("bytes"), "{what}: {msg}");
            assert!(msg.contains(&requested.to_string()), "{what}: {msg}");
            assert!(msg.contains(&limit.to_string()), "{what}: {msg}");
        }
        other => panic!("{what}: expected OutOfMemory, got {other:?}"),
    }
}

#[test]
fn memory_limit_gives_out_of_memory_and_the_device_recovers() {
    let _serial = lock_device_state();
    let Some(dev) = common::first_gpu() else {
        return;
    };
    let _reset = NoLimitOnDrop(dev.clone());
    dev.empty_cache();
    let s0 = stats(&dev);
    let limit = s0.reserved + MIB;
    dev.set_memory_limit(Some(limit));
    assert_eq!(stats(&dev).limit, Some(limit));

    // within the limit everything works
    let x = Tensor::arange(0.0, 256.0, 1.0, DType::F32, &dev).unwrap();
    let y = x.add(&x).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap()[255], 510.0);
    let s1 = stats(&dev);
    assert!(s1.reserved <= limit, "{s1:?}");

    // beyond it: an error, whichever way the allocation is reached
    let n = 1usize << 20; // 4 MiB of f32
    let big = 4 * n as u64;
    expect_oom(
        Tensor::zeros(&[n], DType::F32, &dev),
        "zeros",
        limit,
        s1.allocated,
        big,
    );
    expect_oom(
        Tensor::from_vec(vec![1.0f32; n], &[n], &dev),
        "from_vec",
        limit,
        s1.allocated,
        big,
    );
    let wide = x.narrow(0, 0, 1).unwrap().broadcast_to(&[n]).unwrap();
    expect_oom(wide.contiguous(), "contiguous", limit, s1.allocated, big);
    expect_oom(wide.add_scalar(1.0), "add_scalar", limit, s1.allocated, big);
    let s2 = stats(&dev);
    assert_eq!(
        s2.allocated, s1.allocated,
        "a failed allocation leaked: {s2:?}"
    );
    assert_eq!(s2.live_buffers, s1.live_buffers, "{s2:?}");
    assert!(s2.reserved <= limit, "{s2:?}");

    // the device is still usable
    let z = y.mul(&x).unwrap().sum(0, false).unwrap();
    let want: f32 = (0..256).map(|i| 2.0 * (i * i) as f32).sum();
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![want]);

    // cached buffers are given back before the limit refuses an allocation
    drop(z);
    let filler_len = 768 * 1024 / 4; // 768 KiB of f32
    let filler = Tensor::zeros(&[filler_len], DType::F32, &dev).unwrap();
    drop(filler);
    let s3 = stats(&dev);
    assert!(s3.cached_buffers > 0);
    // another size class: it fits the limit only once the cached 768 KiB are freed
    let fits = Tensor::zeros(&[filler_len + 1000], DType::F32, &dev);
    assert!(
        fits.is_ok(),
        "an allocation that fits once the cache is freed failed: {:?} ({s3:?})",
        fits.err()
    );
    drop(fits);
    let s4 = stats(&dev);
    assert!(s4.reserved <= limit, "{s4:?}");

    // without the limit the big allocation succeeds
    dev.set_memory_limit(None);
    assert_eq!(stats(&dev).limit, None);
    let ok = Tensor::zeros(&[n], DType::F32, &dev).unwrap();
    assert_eq!(
        ok.narrow(0, n - 2, 2).unwrap().to_vec::<f32>().unwrap(),
        vec![0.0, 0.0]
    );
    drop(ok);
    drop((x, y, wide));
    let end = stats(&dev);
    assert_eq!(end.allocated, s0.allocated);
    assert_eq!(end.live_buffers, s0.live_buffers);
}

/// Asserts that `result` is a too-large (or out-of-memory) error for a buffer
/// of at least `bytes` bytes.
fn expect_too_large(result: silica::Result<Tensor>, what: &str, bytes: u64, max_binding: u64) {
    match result {
        Err(e @ Error::TooLarge { .. }) => {
            let msg = e.to_string();
            let Error::TooLarge { bytes: b, max, .. } = e else {
                unreachable!()
            };
            assert!(
                b >= bytes,
                "{what}: error reports {b} bytes, wanted >= {bytes}"
            );
            assert!(b > max, "{what}: {b} bytes do not exceed the maximum {max}");
            assert!(max <= max_binding, "{what}: maximum {max} > {max_binding}");
            assert!(
                msg.contains(&b.to_string()) && msg.contains("bytes"),
                "{msg}"
            );
        }
        Err(e @ Error::OutOfMemory { .. }) => {
            assert!(e.to_string().contains("bytes"), "{e}");
        }
        other => panic!("{what}: expected TooLarge or OutOfMemory, got {other:?}"),
    }
}

#[test]
fn oversize_tensors_are_errors_not_panics() {
    let _serial = lock_device_state();
    let Some(dev) = common::first_gpu() else {
        return;
    };
    let max = dev.info().max_storage_binding;
    let s0 = stats(&dev);
    eprintln!("max storage binding: {max} bytes");

    // one element past the largest binding
    let n = usize::try_from(max / 4 + 1).unwrap();
    expect_too_large(
        Tensor::zeros(&[n], DType::F32, &dev),
        "zeros(max/4 + 1)",
        max + 4,
        max,
    );
    let n2 = usize::try_from(max + 1).unwrap();
    expect_too_large(
        Tensor::zeros(&[n2], DType::F32, &dev),
        "zeros(max + 1)",
        4 * (max + 1),
        max,
    );
    // an op whose output is too large
    let one = Tensor::ones(&[1], DType::F32, &dev).unwrap();
    let wide = one.broadcast_to(&[n]).unwrap();
    expect_too_large(wide.contiguous(), "contiguous", max + 4, max);
    expect_too_large(wide.mul_scalar(2.0), "mul_scalar", max + 4, max);
    // 16-bit elements: the byte count decides, not the element count
    let half_n = usize::try_from(max / 2 + 1).unwrap();
    expect_too_large(
        Tensor::zeros(&[half_n], DType::F16, &dev),
        "zeros f16",
        max + 2,
        max,
    );

    // nothing leaked and the device still works
    let s1 = stats(&dev);
    assert_eq!(
        s1.live_buffers,
        s0.live_buffers + 1,
        "only `one` is live: {s1:?}"
    );
    assert!(
        s1.allocated > s0.allocated && s1.allocated - s0.allocated <= 256,
        "{s1:?}"
    );
    let two: Vec<f32> = one.add(&one).unwrap().to_vec().unwrap();
    assert_eq!(two, vec![2.0]);
    drop((one, wide));
    let s2 = stats(&dev);
    assert_eq!(s2.allocated, s0.allocated, "{s2:?}");
    assert_eq!(s2.live_buffers, s0.live_buffers, "{s2:?}");

    // exactly the largest binding is allowed (where that is affordable)
    if max <= 256 * MIB {
        let edge = Tensor::zeros(&[(max / 4) as usize], DType::F32, &dev).unwrap();
        let last: Vec<f32> = edge
            .narrow(0, (max / 4) as usize - 3, 3)
            .unwrap()
            .to_vec()
            .unwrap();
        assert_eq!(last, vec![0.0; 3]);
        drop(edge);
        dev.empty_cache();
    }
}

/// Bind groups are cached by the pool's buffers (not by tensors): once
/// tensors drop, their buffers come back under new tensors in other roles,
/// and the cached groups must bind each in its new place. `sub` tells its
/// operands apart, so a group found for the wrong order would show.
#[test]
fn cached_bind_groups_follow_reused_buffers() {
    let _serial = lock_device_state();
    let Some(dev) = common::first_gpu() else {
        return;
    };
    let n = 4096;
    let upload = |v: f32| Tensor::from_vec(vec![v; n], &[n], &dev).unwrap();
    let expect = |t: &Tensor, want: f32, what: &str| {
        let got: Vec<f32> = t.to_vec().unwrap();
        assert!(got.iter().all(|&x| x == want), "{what}: {:?}", &got[..4]);
    };
    for round in 0..3 {
        let (a, b) = (upload(5.0), upload(2.0));
        expect(&a.sub(&b).unwrap(), 3.0, "a - b");
        expect(&b.sub(&a).unwrap(), -3.0, "b - a");
        drop((a, b));
        // the same buffers, handed out again in an order of the pool's
        let (c, d) = (upload(1.0), upload(7.0));
        expect(&d.sub(&c).unwrap(), 6.0, "d - c");
        expect(&c.sub(&d).unwrap(), -6.0, "c - d");
        expect(&c.sub(&c).unwrap(), 0.0, "c - c");
        drop((c, d));
        if round == 1 {
            // new buffers from here on
            dev.empty_cache();
        }
    }
}

/// A long quantized product whose decoded f16 weights do not fit under the
/// limit (on a GPU with cooperative matrices, where products of 256 rows
/// decode their weights first) takes the quantized tiles instead of
/// failing, and gives what it gives without the limit.
#[test]
fn a_decoded_product_that_does_not_fit_takes_the_quantized_tiles() {
    let _serial = lock_device_state();
    let Some(dev) = common::first_gpu() else {
        return;
    };
    let _reset = NoLimitOnDrop(dev.clone());
    // 144 tiles of 128x128: neither path splits K (no partial products)
    let (m, n, k) = (384, 6144, 1024);
    let w = silica::QTensor::random(silica::QuantFormat::Q4_0, &[n, k], 7, &dev).unwrap();
    let x = Tensor::randn(&[m, k], DType::F16, 8, &dev).unwrap();
    let product = || -> Vec<f32> {
        let y = x.matmul_q(&w).unwrap();
        y.to_dtype(DType::F32).unwrap().to_vec().unwrap()
    };
    let free = product();
    dev.empty_cache();
    // room for the 4.5 MiB output and an f32 copy of it (where the kernel
    // writes f32), not for the output and the 12 MiB of f16 weights
    let limit = stats(&dev).reserved + 15 * MIB;
    dev.set_memory_limit(Some(limit));
    let tight = product();
    dev.set_memory_limit(None);
    // against the CPU's product of the decoded weights
    let cpu = Device::cpu();
    let wd = w.dequantize(DType::F32).unwrap().to_device(&cpu).unwrap();
    let xc = x.to_dtype(DType::F32).unwrap().to_device(&cpu).unwrap();
    let want: Vec<f32> = xc.matmul(&wd.t().unwrap()).unwrap().to_vec().unwrap();
    let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
    for (name, got) in [("without a limit", &free), ("under the limit", &tight)] {
        let err = got
            .iter()
            .zip(&want)
            .fold(0f32, |a, (g, w)| a.max((g - w).abs()));
        assert!(err <= 1e-2 * scale, "{name}: error {err} of {scale}");
    }
}

/// Every GPU adapter with f16 kernels opened anew with `keep_decoded` at
/// 16 rows, with its name.
fn keeping_devices() -> Vec<(Device, String)> {
    let opts = silica::GpuOptions {
        keep_decoded: 16,
        ..silica::GpuOptions::from_env()
    };
    (0..common::gpu_devices().len())
        .filter_map(|i| {
            let dev = Device::gpu_with_options(i, &opts).unwrap();
            let Device::Gpu(g) = &dev else { unreachable!() };
            let name = g.info().name.clone();
            if !g.features().f16 {
                eprintln!("{name}: no f16 kernels, nothing kept");
                return None;
            }
            Some((dev, name))
        })
        .collect()
}

/// With `keep_decoded` at 16 rows, a quantized product of 16 rows of f16 x
/// decodes its weights into an f16 copy once and keeps it with them: the
/// copy stays allocated between products (the second product allocates
/// nothing more) and goes back to the pool with the weights; products of 8
/// rows and products recorded while kernels are only built keep nothing;
/// the results equal the CPU's.
#[test]
fn kept_decoded_weights_live_as_long_as_the_weights() {
    let _serial = lock_device_state();
    for (dev, name) in keeping_devices() {
        let (m, n, k) = (16, 256, 512);
        let w = silica::QTensor::random(silica::QuantFormat::Q4_0, &[n, k], 3, &dev).unwrap();
        let x = Tensor::randn(&[m, k], DType::F16, 4, &dev).unwrap();
        let x8 = x.narrow(0, 0, 8).unwrap().contiguous().unwrap();
        let product = |x: &Tensor| -> Vec<f32> {
            let y = x.matmul_q(&w).unwrap();
            y.to_dtype(DType::F32).unwrap().to_vec().unwrap()
        };
        let base = stats(&dev).allocated;
        product(&x8);
        assert_eq!(stats(&dev).allocated, base, "{name}: 8 rows keep nothing");
        dev.build_kernels_only(|| x.matmul_q(&w).map(drop)).unwrap();
        assert_eq!(
            stats(&dev).allocated,
            base,
            "{name}: a product only built keeps nothing"
        );
        let first = product(&x);
        let copy = (n * k * 2) as u64;
        assert_eq!(
            stats(&dev).allocated,
            base + copy,
            "{name}: the f16 copy is kept"
        );
        let second = product(&x);
        assert_eq!(stats(&dev).allocated, base + copy, "{name}: and reused");
        assert_eq!(first, second, "{name}");
        let cpu = Device::cpu();
        let wd = w.dequantize(DType::F32).unwrap().to_device(&cpu).unwrap();
        let xc = x.to_dtype(DType::F32).unwrap().to_device(&cpu).unwrap();
        let want: Vec<f32> = xc.matmul(&wd.t().unwrap()).unwrap().to_vec().unwrap();
        let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        let err = first
            .iter()
            .zip(&want)
            .fold(0f32, |a, (g, w)| a.max((g - w).abs()));
        assert!(err <= 1e-2 * scale, "{name}: error {err} of {scale}");
        let words = w.size_in_bytes() as u64;
        drop(w);
        let left = stats(&dev).allocated;
        // the words' buffer is at least their bytes (a size class)
        assert!(
            left <= base - words,
            "{name}: {left} bytes left of {base} without the words ({words}) and their copy"
        );
    }
}

/// Kept f16 copies give way when memory runs short: an allocation that
/// fits only without them lets them go and succeeds, and no copy is kept
/// after (the products are right either way).
#[test]
fn kept_decoded_weights_give_way_when_memory_runs_short() {
    let _serial = lock_device_state();
    for (dev, name) in keeping_devices() {
        let _reset = NoLimitOnDrop(dev.clone());
        let (m, n, k) = (16, 512, 1024);
        let w = silica::QTensor::random(silica::QuantFormat::Q4_0, &[n, k], 5, &dev).unwrap();
        let x = Tensor::randn(&[m, k], DType::F16, 6, &dev).unwrap();
        let product = || -> Vec<f32> {
            let y = x.matmul_q(&w).unwrap();
            y.to_dtype(DType::F32).unwrap().to_vec().unwrap()
        };
        let kept = product();
        let copy = (n * k * 2) as u64;
        dev.empty_cache();
        let s = stats(&dev);
        // room for half the copy beside what is allocated now
        dev.set_memory_limit(Some(s.allocated + copy / 2));
        let big = Tensor::zeros(&[(copy / 4) as usize], DType::F32, &dev);
        assert!(big.is_ok(), "{name}: {:?}", big.err());
        // as many bytes as the copy: it fits only where the copy went
        assert_eq!(
            stats(&dev).allocated,
            s.allocated,
            "{name}: the copy gave way to the new tensor"
        );
        drop(big);
        dev.set_memory_limit(None);
        let before = stats(&dev).allocated;
        let again = product();
        assert_eq!(
            stats(&dev).allocated,
            before,
            "{name}: a copy was kept again"
        );
        let err = kept
            .iter()
            .zip(&again)
            .fold(0f32, |a, (p, q)| a.max((p - q).abs()));
        let scale = kept.iter().fold(0f32, |a, v| a.max(v.abs()));
        assert!(err <= 1e-2 * scale, "{name}: error {err} of {scale}");
    }
}
