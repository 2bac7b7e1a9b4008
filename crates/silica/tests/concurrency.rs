//! Devices and tensors shared between threads: `Device`, `Tensor` and
//! `QTensor` are `Send + Sync` (checked at compile time), and eight threads
//! running seeded mixed-op workloads on one device at once (shared weights
//! included) get results identical, bit for bit, to the same workloads run
//! one after the other; on the CPU and on every GPU adapter.
//!
//! `SILICA_STRESS_STEPS` sets the steps per thread (default 50, about 30
//! ops and 12 read-backs each).

mod common;

use std::sync::{Barrier, Mutex, MutexGuard};
use std::time::Instant;

use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use silica::{AttentionOpts, DType, Device, QTensor, QuantFormat, RopeStyle, Tensor};

/// Compile-time check: these types can be shared between threads.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Device>();
    send_sync::<Tensor>();
    send_sync::<QTensor>();
    send_sync::<silica::MemoryStats>();
    send_sync::<silica::Error>();
};

const THREADS: usize = 8;

/// The GPU memory counters are per device and shared by every test of this
/// binary: tests that compare them take this lock.
static DEVICE_STATE: Mutex<()> = Mutex::new(());

fn lock_device_state() -> MutexGuard<'static, ()> {
    DEVICE_STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn steps() -> usize {
    std::env::var("SILICA_STRESS_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50)
}

/// The raw bytes of a tensor's elements, whatever its dtype.
fn bytes(t: &Tensor) -> Vec<u8> {
    match t.dtype() {
        DType::F32 => bytemuck::cast_slice(&t.to_vec::<f32>().unwrap()).to_vec(),
        DType::F16 => bytemuck::cast_slice(&t.to_vec::<f16>().unwrap()).to_vec(),
        DType::BF16 => bytemuck::cast_slice(&t.to_vec::<bf16>().unwrap()).to_vec(),
        DType::U32 => bytemuck::cast_slice(&t.to_vec::<u32>().unwrap()).to_vec(),
        DType::I64 => bytemuck::cast_slice(&t.to_vec::<i64>().unwrap()).to_vec(),
    }
}

/// Tensors every thread reads at once.
struct Shared {
    /// `[64, 48]` f32
    w: Tensor,
    /// `[40, 64]` Q8_0
    q: QTensor,
    /// `[48]` f32 ones
    norm: Tensor,
}

impl Shared {
    fn new(dev: &Device) -> Shared {
        let cpu = Device::cpu();
        let wq = Tensor::randn(&[40, 64], DType::F32, 1000, &cpu).unwrap();
        Shared {
            w: Tensor::randn(&[64, 48], DType::F32, 1001, dev).unwrap(),
            q: QTensor::quantize(&wq, QuantFormat::Q8_0)
                .unwrap()
                .to_device(dev)
                .unwrap(),
            norm: Tensor::ones(&[48], DType::F32, dev).unwrap(),
        }
    }
}

/// A seeded mix of ops (matmul, quantized matmul, broadcasting, reductions,
/// softmax, norms, rope, attention, casts, views and copies, cat,
/// index_select, in-place writes, transfers to the CPU and back); returns
/// the bytes of every result read back, in order.
fn workload(dev: &Device, shared: &Shared, seed: u64, steps: usize) -> Vec<Vec<u8>> {
    let cpu = Device::cpu();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut cache = Tensor::zeros(&[16, 2, 8], DType::F32, dev).unwrap();
    for step in 0..steps {
        let s = seed * 1000 + step as u64;
        let dtype = DType::FLOATS[rng.random_range(0..3)];
        let m = [1, 3, 7, 17][rng.random_range(0..4)];
        let x = Tensor::randn(&[m, 64], dtype, s, dev).unwrap();
        let w = shared.w.to_dtype(dtype).unwrap();
        let y = x.matmul(&w).unwrap(); // [m, 48]
        let bias = Tensor::randn(&[48], dtype, s + 1, dev).unwrap();
        let z = y.add(&bias).unwrap().gelu_tanh().unwrap();
        out.push(bytes(&z));
        out.push(bytes(&z.softmax(-1).unwrap()));
        out.push(bytes(&z.sum(-1, false).unwrap()));
        out.push(bytes(&z.max(0, true).unwrap()));
        out.push(bytes(&z.argmax(-1, false).unwrap()));
        let n = z
            .to_dtype(DType::F32)
            .unwrap()
            .rms_norm(&shared.norm, 1e-5)
            .unwrap();
        out.push(bytes(&n));
        // a transposed view, a narrowed one, cat and a gather
        let t = Tensor::cat(&[&z.t().unwrap(), &y.t().unwrap()], 1)
            .unwrap()
            .narrow(0, 5, 31)
            .unwrap()
            .contiguous()
            .unwrap();
        let ids: Vec<u32> = (0..9).map(|_| rng.random_range(0..31)).collect();
        let ids = Tensor::from_slice(&ids, &[9], dev).unwrap();
        out.push(bytes(&t.index_select(0, &ids).unwrap()));
        // the shared quantized weight
        out.push(bytes(&x.matmul_q(&shared.q).unwrap()));
        // rope and causal attention over [T, heads, D]
        let tq = [1, 4, 9][rng.random_range(0..3)];
        let qkv = Tensor::randn(&[3, tq, 2, 8], DType::F32, s + 2, dev).unwrap();
        let (q, k, v) = (
            qkv.narrow(0, 0, 1).unwrap().squeeze(0).unwrap(),
            qkv.narrow(0, 1, 1).unwrap().squeeze(0).unwrap(),
            qkv.narrow(0, 2, 1).unwrap().squeeze(0).unwrap(),
        );
        let ang = Tensor::rand(&[tq, 4], DType::F32, s + 3, dev).unwrap();
        let (cos, sin) = (ang.cos().unwrap(), ang.sin().unwrap());
        let q = q.rope(&cos, &sin, RopeStyle::Adjacent).unwrap();
        let k = k.rope(&cos, &sin, RopeStyle::Adjacent).unwrap();
        let att = q.attention(&k, &v, None, AttentionOpts::causal(8)).unwrap();
        out.push(bytes(&att));
        // an in-place write into a buffer this thread keeps
        let at = rng.random_range(0..16 - tq + 1);
        cache.slice_assign(at, &k).unwrap();
        // integers: arange, a strided copy, a cast to float
        let ints = Tensor::arange(0.0, 60.0, 1.0, DType::I64, dev)
            .unwrap()
            .reshape(&[6, 10])
            .unwrap()
            .t()
            .unwrap()
            .contiguous()
            .unwrap();
        out.push(bytes(&ints.to_dtype(DType::F32).unwrap()));
        // a product large enough for the CPU kernel to split over rayon's threads
        let a = Tensor::randn(&[64, 256], dtype, s + 4, dev).unwrap();
        let b = Tensor::randn(&[96, 256], dtype, s + 5, dev).unwrap();
        out.push(bytes(&a.matmul(&b.t().unwrap()).unwrap()));
        // to the CPU and back
        let back = z.to_device(&cpu).unwrap().to_device(dev).unwrap();
        out.push(bytes(&back.mul(&z).unwrap()));
    }
    out.push(bytes(&cache));
    out
}

/// Runs the eight workloads one after the other, then at once on eight
/// threads, and compares.
fn stress(dev: &Device) {
    let steps = steps();
    let shared = Shared::new(dev);
    let t0 = Instant::now();
    let serial: Vec<Vec<Vec<u8>>> = (0..THREADS as u64)
        .map(|seed| workload(dev, &shared, seed, steps))
        .collect();
    let serial_time = t0.elapsed();
    let start = Barrier::new(THREADS);
    let t1 = Instant::now();
    let concurrent: Vec<Vec<Vec<u8>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS as u64)
            .map(|seed| {
                let (dev, shared, start) = (dev.clone(), &shared, &start);
                scope.spawn(move || {
                    start.wait();
                    workload(&dev, shared, seed, steps)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a worker thread panicked"))
            .collect()
    });
    let concurrent_time = t1.elapsed();
    let mut results = 0;
    for (seed, (a, b)) in serial.iter().zip(&concurrent).enumerate() {
        assert_eq!(a.len(), b.len(), "{dev} thread {seed}: result counts");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(!x.is_empty(), "{dev} thread {seed} result {i} is empty");
            assert!(
                x == y,
                "{dev} thread {seed}: result {i} differs from the serial run"
            );
        }
        results += a.len();
    }
    eprintln!(
        "{dev}: {THREADS} threads x {steps} steps, {results} results identical to the serial run \
         (serial {:.2} s, concurrent {:.2} s)",
        serial_time.as_secs_f64(),
        concurrent_time.as_secs_f64()
    );
}

#[test]
fn eight_threads_on_the_cpu_match_the_serial_run() {
    // the CPU's counters are process-wide: the other tests here compare them
    let _serial = lock_device_state();
    stress(&Device::cpu());
}

#[test]
fn eight_threads_on_each_gpu_match_the_serial_run() {
    let _serial = lock_device_state();
    for dev in common::gpu_devices() {
        dev.synchronize().unwrap();
        let before = dev.memory_stats();
        stress(&dev);
        dev.synchronize().unwrap();
        let after = dev.memory_stats();
        assert_eq!(after.allocated, before.allocated, "{dev}: {after:?}");
        assert_eq!(after.live_buffers, before.live_buffers, "{dev}: {after:?}");
    }
}

/// Tensors made on one thread are read, cloned and dropped on others while
/// their maker keeps computing with them.
#[test]
fn tensors_cross_threads_while_in_use() {
    let _serial = lock_device_state();
    let mut devices = vec![Device::cpu()];
    devices.extend(common::gpu_devices());
    for dev in devices {
        dev.synchronize().unwrap();
        let before = dev.memory_stats();
        let a = Tensor::randn(&[33, 65], DType::F32, 5, &dev).unwrap();
        let want = bytes(&a.exp().unwrap().sum(-1, false).unwrap());
        let (tx, rx) = std::sync::mpsc::channel::<Tensor>();
        std::thread::scope(|scope| {
            let consumer = scope.spawn(move || {
                let mut sums = Vec::new();
                for t in rx {
                    sums.push(bytes(&t.exp().unwrap().sum(-1, false).unwrap()));
                    // `t` (a view of `a`'s storage) drops here, on this thread
                }
                sums
            });
            for _ in 0..20 {
                tx.send(a.clone()).unwrap();
                // the maker keeps using the same storage meanwhile
                assert_eq!(bytes(&a.exp().unwrap().sum(-1, false).unwrap()), want);
            }
            drop(tx);
            let sums = consumer.join().expect("the consumer panicked");
            assert_eq!(sums.len(), 20);
            assert!(sums.iter().all(|s| *s == want), "{dev}: a result differs");
        });
        drop(a);
        dev.synchronize().unwrap();
        let after = dev.memory_stats();
        assert_eq!(after.allocated, before.allocated, "{dev}: {after:?}");
        assert_eq!(after.live_buffers, before.live_buffers, "{dev}: {after:?}");
    }
}

/// `Device::build_kernels_only` on one thread records nothing (a tensor it
/// writes into keeps its values, and what it computes cannot be read back)
/// while another thread's workload on the same device gives the same
/// results as alone.
#[test]
fn building_kernels_on_a_thread_records_nothing() {
    let _serial = lock_device_state();
    for dev in common::gpu_devices() {
        dev.synchronize().unwrap();
        let before = dev.memory_stats();
        let shared = Shared::new(&dev);
        let alone = workload(&dev, &shared, 7, 2);
        let mut kept = Tensor::from_slice(&[1.5f32; 4 * 256], &[4, 256], &dev).unwrap();
        let together = std::thread::scope(|scope| {
            let worker = scope.spawn(|| workload(&dev, &shared, 7, 2));
            dev.build_kernels_only(|| -> silica::Result<()> {
                for step in 0..3u64 {
                    let a = Tensor::randn(&[64, 256], DType::F16, step, &dev)?;
                    let up = Tensor::from_slice(&[2.0f32; 256], &[1, 256], &dev)?;
                    let y = a.to_dtype(DType::F32)?.softmax(-1)?.add(&up)?;
                    kept.slice_assign(1, &y.narrow(0, 0, 2)?)?;
                    match y.to_vec::<f32>() {
                        Ok(_) => panic!("{dev}: a kernels-only result was read"),
                        Err(e) => {
                            let msg = e.to_string();
                            assert!(msg.contains("kernels were being built"), "{msg}");
                        }
                    }
                    assert!(up.to_vec::<f32>().is_err(), "an upload was read");
                }
                Ok(())
            })
            .unwrap();
            worker.join().expect("the worker panicked")
        });
        assert!(alone == together, "{dev}: the workload's results changed");
        let v: Vec<f32> = kept.to_vec().unwrap();
        assert!(
            v.iter().all(|&x| x == 1.5),
            "{dev}: a kernels-only copy ran"
        );
        drop((kept, shared));
        dev.synchronize().unwrap();
        let after = dev.memory_stats();
        assert_eq!(after.allocated, before.allocated, "{dev}: {after:?}");
    }
}
