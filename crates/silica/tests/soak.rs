//! Memory soak: a seeded random loop that builds tensors of random shapes
//! (awkward sizes, empty ones, transposed, narrowed, broadcast and permuted
//! views) and dtypes (f32, f16, bf16, u32, i64), runs ops on them
//! (elementwise, broadcasting, comparisons and `where`, reductions,
//! softmax, matmul, norms, casts, copies, cat, index_select, in-place
//! writes, transfers) on the CPU and on every GPU adapter, checks every
//! result against a host reference, and drops everything. Each device gets three passes: a warm-up, the very
//! same pass again (same seed), and a pass from a new seed. After each:
//!
//! - the device's `allocated` bytes and live buffers (the GPU allocator's,
//!   or the CPU's count of host tensors) equal their starting values and
//!   the reserved bytes stay bounded; on a GPU the repeated pass reserves
//!   nothing new (the cache serves it), and `empty_cache` returns the
//!   reserved bytes to the start;
//! - the process's resident memory (VmRSS) grew by less than
//!   [`RSS_BOUND`] over the repeated pass. The warm-up pass builds every
//!   kernel the loop uses (a software Vulkan driver holds tens of MiB of
//!   compiled code) and meets every buffer size class, which is why the
//!   figure is taken over the repeat.
//!
//! Length: `SILICA_SOAK_ITERS` iterations per pass (default 3,000 on the
//! CPU, 1,000 on a GPU), or `SILICA_SOAK_SECS` seconds per device instead
//! (a third of them for the warm-up, whose iteration count the other two
//! passes use). `SILICA_SOAK_TRACE=N` prints the figures every N
//! iterations. Devices are soaked one after the other in one test,
//! because resident memory is a process-wide figure.

mod common;

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use silica::{BinaryOp, DType, Device, MemoryStats, ReduceOp, Tensor, UnaryOp};

const MIB: u64 = 1 << 20;

/// Allowed growth of resident memory over the repeated pass. The loop's largest tensors are under 1 MiB and
/// nothing outlives an iteration, so a leak of even a few bytes per
/// tensor (the loop makes tens of thousands) would show; the bound leaves
/// room for the allocator's (glibc malloc's) free lists and for rayon's
/// and the Vulkan driver's per-thread arenas settling, which move RSS by a
/// few MiB in either direction without any leak.
const RSS_BOUND: u64 = 16 * MIB;

/// The reserved bytes (live plus cached buffers) may not exceed this: the
/// loop's live tensors take at most a few MiB at once, and a cache that
/// reuses its buffers settles near that.
const RESERVED_BOUND: u64 = 64 * MIB;

/// Resident memory is a process-wide figure and the GPU counters are per
/// device: the tests of this binary take this lock and run one at a time.
static PROCESS_STATE: Mutex<()> = Mutex::new(());

fn lock_process_state() -> MutexGuard<'static, ()> {
    PROCESS_STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Resident set size of this process, from /proc (Linux); `None` elsewhere.
fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// How long to soak each device.
enum Budget {
    Iters(usize),
    Secs(f64),
}

fn budget(default_iters: usize) -> Budget {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    if let Some(s) = env("SILICA_SOAK_SECS") {
        Budget::Secs(s.trim().parse().expect("SILICA_SOAK_SECS is a number"))
    } else if let Some(n) = env("SILICA_SOAK_ITERS") {
        Budget::Iters(n.trim().parse().expect("SILICA_SOAK_ITERS is a number"))
    } else {
        Budget::Iters(default_iters)
    }
}

// ---------------------------------------------------------------------------
// random inputs
// ---------------------------------------------------------------------------

/// Sizes with odd remainders for every kernel's tiling, and 1.
const SIZES: [usize; 14] = [1, 1, 2, 3, 5, 7, 8, 16, 31, 33, 64, 100, 127, 257];

fn random_shape(rng: &mut StdRng, max_rank: usize, allow_empty: bool) -> Vec<usize> {
    let rank = rng.random_range(0..=max_rank);
    let mut shape: Vec<usize> = (0..rank)
        .map(|_| SIZES[rng.random_range(0..SIZES.len())])
        .collect();
    // keep tensors under ~64k elements
    while shape.iter().product::<usize>() > 65_536 {
        let i = rng.random_range(0..shape.len());
        shape[i] = shape[i].div_ceil(4);
    }
    if allow_empty && rank > 0 && rng.random_bool(0.05) {
        let i = rng.random_range(0..rank);
        shape[i] = 0;
    }
    shape
}

/// A fresh tensor of `shape` holding random values of `dtype`: normal
/// samples for floats, integers in a range every dtype holds exactly.
fn base(rng: &mut StdRng, shape: &[usize], dtype: DType, dev: &Device) -> Tensor {
    let n: usize = shape.iter().product();
    match dtype {
        DType::U32 => {
            let v: Vec<u32> = (0..n).map(|_| rng.random_range(0..2000)).collect();
            Tensor::from_vec(v, shape, dev).unwrap()
        }
        DType::I64 => {
            let v: Vec<i64> = (0..n).map(|_| rng.random_range(-1000..1000)).collect();
            Tensor::from_vec(v, shape, dev).unwrap()
        }
        _ => Tensor::randn(shape, dtype, rng.random(), dev).unwrap(),
    }
}

/// A tensor of `shape` that is, at random, contiguous or a view: the
/// transpose of a tensor, a narrowed slice, a broadcast, or a permutation.
fn input(rng: &mut StdRng, shape: &[usize], dtype: DType, dev: &Device) -> Tensor {
    let rank = shape.len();
    match rng.random_range(0..5) {
        1 if rank >= 2 => {
            let mut s = shape.to_vec();
            s.swap(rank - 2, rank - 1);
            base(rng, &s, dtype, dev).t().unwrap()
        }
        2 if rank >= 1 => {
            let d = rng.random_range(0..rank);
            let extra = rng.random_range(1..4);
            let mut s = shape.to_vec();
            s[d] += extra;
            let start = rng.random_range(0..=extra);
            base(rng, &s, dtype, dev)
                .narrow(d as isize, start, shape[d])
                .unwrap()
        }
        3 if rank >= 1 => {
            let d = rng.random_range(0..rank);
            let mut s = shape.to_vec();
            s[d] = 1;
            base(rng, &s, dtype, dev).broadcast_to(shape).unwrap()
        }
        4 if rank >= 2 => {
            // built permuted, then permuted back: strides in another order
            let mut perm: Vec<usize> = (0..rank).collect();
            perm.reverse();
            let s: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            base(rng, &s, dtype, dev).permute(&perm).unwrap()
        }
        _ => base(rng, shape, dtype, dev),
    }
}

fn float(rng: &mut StdRng) -> DType {
    DType::FLOATS[rng.random_range(0..3)]
}

// ---------------------------------------------------------------------------
// checks
// ---------------------------------------------------------------------------

/// The elements of a view, row-major, read on the host.
fn host(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

/// Relative tolerance of one rounding of the result in `dtype`, with room
/// for the kernels' f32 arithmetic.
fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        DType::U32 | DType::I64 => 0.0,
    }
}

/// |got - want| <= tol * (1 + scale) elementwise, where `scale` is the size
/// of the terms that made `want` (|want| for elementwise ops, the sum of
/// absolute terms for sums and products). NaNs must match.
fn check(what: &str, got: &Tensor, want: &[f64], scale: Option<&[f64]>, tol: f64) {
    let g = host(got);
    assert_eq!(g.len(), want.len(), "{what}: element count");
    for (i, (&g, &w)) in g.iter().zip(want).enumerate() {
        if g.is_nan() || w.is_nan() {
            assert!(g.is_nan() && w.is_nan(), "{what}[{i}]: {g} vs {w}");
            continue;
        }
        if g == w {
            continue;
        }
        let s = scale.map_or(w.abs(), |s| s[i]);
        assert!(
            (g - w).abs() <= tol * (1.0 + s),
            "{what}[{i}]: got {g}, want {w} (tolerance {tol} x (1 + {s}))"
        );
    }
}

// ---------------------------------------------------------------------------
// one iteration
// ---------------------------------------------------------------------------

const UNARY: [UnaryOp; 9] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Exp,
    UnaryOp::Sqr,
    UnaryOp::Tanh,
    UnaryOp::Relu,
    UnaryOp::Sigmoid,
    UnaryOp::Silu,
    UnaryOp::Sin,
];
const BINARY: [BinaryOp; 6] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Maximum,
    BinaryOp::Minimum,
    BinaryOp::SiluMul,
];

/// Runs one random op on `dev` and checks it; returns how many tensors the
/// iteration made (inputs, intermediates and results).
fn iteration(rng: &mut StdRng, dev: &Device) -> usize {
    let cpu = Device::cpu();
    match rng.random_range(0..13) {
        0 => {
            let dtype = float(rng);
            let shape = random_shape(rng, 4, true);
            let x = input(rng, &shape, dtype, dev);
            let op = UNARY[rng.random_range(0..UNARY.len())];
            let y = x.unary(op).unwrap();
            assert_eq!(y.shape(), &shape[..]);
            let want: Vec<f64> = host(&x).into_iter().map(|v| op.apply(v)).collect();
            check(
                &format!("{op:?} {dtype} {shape:?}"),
                &y,
                &want,
                None,
                tol(dtype),
            );
            2
        }
        1 => {
            // numpy broadcasting: some dimensions 1, maybe fewer of them
            let dtype = float(rng);
            let shape = random_shape(rng, 4, true);
            let mut other: Vec<usize> = shape
                .iter()
                .map(|&d| if rng.random_bool(0.4) { 1 } else { d })
                .collect();
            let drop_lead = rng.random_range(0..=other.len());
            other.drain(..drop_lead);
            let (a, b) = if rng.random_bool(0.5) {
                (shape.clone(), other)
            } else {
                (other, shape.clone())
            };
            let x = input(rng, &a, dtype, dev);
            let y = input(rng, &b, dtype, dev);
            let op = BINARY[rng.random_range(0..BINARY.len())];
            let z = x.binary(&y, op).unwrap();
            assert_eq!(z.shape(), &shape[..], "{a:?} {op:?} {b:?}");
            let xs = host(&x.broadcast_to(&shape).unwrap());
            let ys = host(&y.broadcast_to(&shape).unwrap());
            let want: Vec<f64> = xs.iter().zip(&ys).map(|(&p, &q)| op.apply(p, q)).collect();
            // silu(a) * b: the rounding of a and of the product
            let scale: Vec<f64> = xs
                .iter()
                .zip(&ys)
                .zip(&want)
                .map(|((&p, &q), &w)| w.abs().max((p * q).abs()))
                .collect();
            check(
                &format!("{op:?} {dtype} {a:?} {b:?}"),
                &z,
                &want,
                Some(&scale),
                tol(dtype),
            );
            3
        }
        2 => {
            let dtype = float(rng);
            let mut shape = random_shape(rng, 3, true);
            if shape.is_empty() {
                shape.push(5);
            }
            let x = input(rng, &shape, dtype, dev);
            let d = rng.random_range(0..shape.len());
            let keep = rng.random_bool(0.5);
            let op = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min]
                [rng.random_range(0..4)];
            let what = format!("{op:?} {dtype} {shape:?} dim {d}");
            let r = x.reduce(op, d as isize, keep);
            if shape[d] == 0 && matches!(op, ReduceOp::Max | ReduceOp::Min) {
                assert!(r.is_err(), "{what}: reducing an empty dimension");
                return 1;
            }
            let r = r.unwrap();
            let mut out_shape = shape.clone();
            if keep {
                out_shape[d] = 1;
            } else {
                out_shape.remove(d);
            }
            assert_eq!(r.shape(), &out_shape[..], "{what}");
            // the reduced dimension moved last, on the host
            let mut perm: Vec<usize> = (0..shape.len()).filter(|&i| i != d).collect();
            perm.push(d);
            let vals = host(&x.permute(&perm).unwrap());
            let len = shape[d];
            // one output per row, also when the rows are empty
            let rows: usize = out_shape.iter().product();
            let mut want = Vec::with_capacity(rows);
            let mut scale = Vec::with_capacity(rows);
            for i in 0..rows {
                let row = &vals[i * len..(i + 1) * len];
                let abs: f64 = row.iter().map(|v| v.abs()).sum();
                let v = match op {
                    ReduceOp::Sum => row.iter().sum(),
                    ReduceOp::Mean => row.iter().sum::<f64>() / len as f64,
                    ReduceOp::Max => row.iter().copied().fold(f64::MIN, f64::max),
                    _ => row.iter().copied().fold(f64::MAX, f64::min),
                };
                want.push(v);
                scale.push(match op {
                    ReduceOp::Sum => abs,
                    ReduceOp::Mean => abs / len.max(1) as f64,
                    _ => v.abs(),
                });
            }
            check(&what, &r, &want, Some(&scale), tol(dtype) * 4.0);
            2
        }
        3 => {
            let dtype = float(rng);
            let mut shape = random_shape(rng, 3, false);
            if shape.is_empty() {
                shape.push(7);
            }
            let x = input(rng, &shape, dtype, dev);
            let log = rng.random_bool(0.3);
            let y = if log {
                x.log_softmax(-1).unwrap()
            } else {
                x.softmax(-1).unwrap()
            };
            let n = *shape.last().unwrap();
            let vals = host(&x);
            let mut want = Vec::with_capacity(vals.len());
            for row in vals.chunks(n) {
                let m = row.iter().copied().fold(f64::MIN, f64::max);
                let sum: f64 = row.iter().map(|v| (v - m).exp()).sum();
                want.extend(row.iter().map(|v| {
                    if log {
                        v - m - sum.ln()
                    } else {
                        (v - m).exp() / sum
                    }
                }));
            }
            let what = format!("softmax(log {log}) {dtype} {shape:?}");
            check(&what, &y, &want, None, tol(dtype) * 4.0);
            2
        }
        4 | 5 => {
            // [batch?, m, k] @ [batch?, k, n], either side a view
            let dtype = float(rng);
            let pick = |rng: &mut StdRng| SIZES[rng.random_range(0..SIZES.len())];
            let (m, k, n) = (pick(rng), pick(rng), pick(rng));
            let batch = [0, 0, 1, 3][rng.random_range(0..4)];
            let (mut a, mut b) = (vec![m, k], vec![k, n]);
            if batch > 0 {
                a.insert(0, batch);
                if rng.random_bool(0.5) {
                    b.insert(0, batch);
                }
            }
            let x = input(rng, &a, dtype, dev);
            let y = input(rng, &b, dtype, dev);
            let z = x.matmul(&y).unwrap();
            let bs = batch.max(1);
            let mut out = vec![m, n];
            if batch > 0 {
                out.insert(0, batch);
            }
            assert_eq!(z.shape(), &out[..]);
            let (xs, ys) = (host(&x), host(&y));
            let y_batched = b.len() == 3;
            let mut want = vec![0.0; bs * m * n];
            let mut scale = vec![0.0; bs * m * n];
            for bi in 0..bs {
                let xo = bi * m * k;
                let yo = if y_batched { bi * k * n } else { 0 };
                for i in 0..m {
                    for j in 0..n {
                        let (mut s, mut a) = (0.0, 0.0);
                        for p in 0..k {
                            let t = xs[xo + i * k + p] * ys[yo + p * n + j];
                            s += t;
                            a += t.abs();
                        }
                        want[(bi * m + i) * n + j] = s;
                        scale[(bi * m + i) * n + j] = a;
                    }
                }
            }
            let what = format!("matmul {dtype} {a:?} @ {b:?}");
            check(&what, &z, &want, Some(&scale), tol(dtype) * 4.0);
            3
        }
        6 => {
            // contiguous copies of views, any dtype: exact
            let dtype = DType::ALL[rng.random_range(0..5)];
            let shape = random_shape(rng, 4, true);
            let x = input(rng, &shape, dtype, dev);
            let y = x.copy().unwrap();
            assert!(y.is_contiguous());
            check(&format!("copy {dtype} {shape:?}"), &y, &host(&x), None, 0.0);
            // a reshape of the copy, and of a narrowed view
            let flat = y.reshape(&[y.numel()]).unwrap();
            check("reshape", &flat, &host(&x), None, 0.0);
            2
        }
        7 => {
            // casts between every pair of float dtypes, and integers to floats
            let from = DType::ALL[rng.random_range(0..5)];
            let to = float(rng);
            let shape = random_shape(rng, 3, true);
            let x = input(rng, &shape, from, dev);
            let y = x.to_dtype(to).unwrap();
            assert_eq!(y.dtype(), to);
            let want = host(&x);
            // one rounding to `to`
            check(
                &format!("cast {from}->{to} {shape:?}"),
                &y,
                &want,
                None,
                tol(to),
            );
            2
        }
        8 => {
            // to another device and back: the same bytes
            let dtype = DType::ALL[rng.random_range(0..5)];
            let shape = random_shape(rng, 4, true);
            let x = input(rng, &shape, dtype, dev);
            let there = x.to_device(&cpu).unwrap();
            let back = there.to_device(dev).unwrap();
            assert!(back.device().same(dev));
            check(
                &format!("transfer {dtype} {shape:?}"),
                &back,
                &host(&x),
                None,
                0.0,
            );
            3
        }
        9 => {
            // cat along a random dimension, then index_select of its rows
            let dtype = DType::ALL[rng.random_range(0..5)];
            let mut shape = random_shape(rng, 3, true);
            if shape.is_empty() {
                shape.push(3);
            }
            let d = rng.random_range(0..shape.len());
            let parts: Vec<Tensor> = (0..rng.random_range(1..4))
                .map(|_| {
                    let mut s = shape.clone();
                    s[d] = SIZES[rng.random_range(0..6)];
                    input(rng, &s, dtype, dev)
                })
                .collect();
            let refs: Vec<&Tensor> = parts.iter().collect();
            let c = Tensor::cat(&refs, d as isize).unwrap();
            let mut at = 0;
            for p in &parts {
                let len = p.shape()[d];
                let piece = c.narrow(d as isize, at, len).unwrap();
                check(&format!("cat {dtype} dim {d}"), &piece, &host(p), None, 0.0);
                at += len;
            }
            assert_eq!(at, c.shape()[d]);
            let total = c.shape()[d];
            let ids: Vec<u32> = (0..rng.random_range(1..9))
                .map(|_| rng.random_range(0..total as u32))
                .collect();
            // the ids as u32 or i64, sometimes a view at an offset
            let idx = if rng.random_bool(0.5) {
                Tensor::from_slice(&ids, &[ids.len()], dev).unwrap()
            } else {
                let mut wide: Vec<i64> = vec![0, 0];
                wide.extend(ids.iter().map(|&i| i as i64));
                Tensor::from_vec(wide, &[ids.len() + 2], dev)
                    .unwrap()
                    .narrow(0, 2, ids.len())
                    .unwrap()
            };
            let g = c.index_select(d as isize, &idx).unwrap();
            for (j, &id) in ids.iter().enumerate() {
                let want = host(&c.narrow(d as isize, id as usize, 1).unwrap());
                let got = g.narrow(d as isize, j, 1).unwrap();
                check("index_select", &got, &want, None, 0.0);
            }
            parts.len() + 3
        }
        10 => {
            // RMSNorm of the last dimension
            let dtype = float(rng);
            let mut shape = random_shape(rng, 3, false);
            if shape.is_empty() {
                shape.push(33);
            }
            let n = *shape.last().unwrap();
            let x = input(rng, &shape, dtype, dev);
            let w = input(rng, &[n], dtype, dev);
            let y = x.rms_norm(&w, 1e-5).unwrap();
            let (xs, ws) = (host(&x), host(&w));
            let mut want = Vec::with_capacity(xs.len());
            let mut scale = Vec::with_capacity(xs.len());
            for row in xs.chunks(n) {
                let ms: f64 = row.iter().map(|v| v * v).sum::<f64>() / n as f64;
                let r = 1.0 / (ms + 1e-5).sqrt();
                for (v, wv) in row.iter().zip(&ws) {
                    want.push(v * r * wv);
                    scale.push((v * r * wv).abs());
                }
            }
            let what = format!("rms_norm {dtype} {shape:?}");
            check(&what, &y, &want, Some(&scale), tol(dtype) * 4.0);
            3
        }
        12 => {
            // a comparison mask selecting between two broadcast operands
            let dtype = float(rng);
            let shape = random_shape(rng, 3, true);
            let x = input(rng, &shape, dtype, dev);
            let y = input(rng, &shape, dtype, dev);
            let mask = x.gt(&y).unwrap();
            assert_eq!(mask.dtype(), DType::U32);
            let z = mask.where_cond(&y, &x).unwrap();
            let (xs, ys) = (host(&x), host(&y));
            let want_mask: Vec<f64> = xs
                .iter()
                .zip(&ys)
                .map(|(a, b)| if a > b { 1.0 } else { 0.0 })
                .collect();
            check(
                &format!("gt {dtype} {shape:?}"),
                &mask,
                &want_mask,
                None,
                0.0,
            );
            let want: Vec<f64> = xs.iter().zip(&ys).map(|(a, b)| a.min(*b)).collect();
            check(&format!("where {dtype} {shape:?}"), &z, &want, None, 0.0);
            4
        }
        _ => {
            // rows written in place into a buffer
            let dtype = DType::ALL[rng.random_range(0..5)];
            let rows = SIZES[rng.random_range(2..SIZES.len())];
            let width = SIZES[rng.random_range(0..8)];
            let mut buf = Tensor::zeros(&[rows, width], dtype, dev).unwrap();
            let take = rng.random_range(1..=rows);
            let at = rng.random_range(0..=rows - take);
            let src = input(rng, &[take, width], dtype, dev);
            buf.slice_assign(at, &src).unwrap();
            let got = buf.narrow(0, at, take).unwrap();
            check(
                &format!("slice_assign {dtype}"),
                &got,
                &host(&src),
                None,
                0.0,
            );
            if at > 0 {
                let before = buf.narrow(0, 0, at).unwrap();
                assert!(
                    host(&before).iter().all(|&v| v == 0.0),
                    "slice_assign wrote before {at}"
                );
            }
            2
        }
    }
}

// ---------------------------------------------------------------------------
// the soak
// ---------------------------------------------------------------------------

/// The device's counters after all submitted work finished.
fn stats(dev: &Device) -> MemoryStats {
    dev.synchronize().unwrap();
    dev.memory_stats()
}

fn mib(b: u64) -> f64 {
    b as f64 / MIB as f64
}

/// What one pass of the loop did and left behind.
struct Pass {
    iters: usize,
    tensors: usize,
    secs: f64,
    rss: u64,
    stats: MemoryStats,
    max_reserved: u64,
}

/// Runs the loop from `seed`: `iters` iterations, or for `secs` seconds
/// when `iters` is `None`.
fn pass(dev: &Device, seed: u64, iters: Option<usize>, secs: f64, trace: usize) -> Pass {
    let mut rng = StdRng::seed_from_u64(seed);
    let limit = Duration::from_secs_f64(secs);
    let t0 = Instant::now();
    let (mut n, mut tensors) = (0usize, 0usize);
    let mut max_reserved = 0;
    while iters.map_or(t0.elapsed() < limit, |m| n < m) {
        tensors += iteration(&mut rng, dev);
        n += 1;
        if n % 25 == 0 {
            max_reserved = max_reserved.max(dev.memory_stats().reserved);
        }
        if trace > 0 && n % trace == 0 {
            let s = stats(dev);
            eprintln!(
                "{dev}: iteration {n}: RSS {:.1} MiB, reserved {:.2} MiB in {} cached buffers",
                mib(rss_bytes().unwrap_or(0)),
                mib(s.reserved),
                s.cached_buffers
            );
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let stats = stats(dev);
    Pass {
        iters: n,
        tensors,
        secs,
        rss: rss_bytes().unwrap_or(0),
        max_reserved: max_reserved.max(stats.reserved),
        stats,
    }
}

/// Soaks `dev`: a warm-up pass, then the very same pass again (same seed,
/// so the same shapes, dtypes and ops: every kernel is built and every
/// size class met in the first), then a pass from another seed. After the
/// repeat, nothing may have grown: not the reserved bytes (the cache
/// serves every request) and not the resident memory (within
/// [`RSS_BOUND`]). After the third pass the counters are checked again,
/// with the reserved bytes bounded instead of equal.
fn soak(dev: &Device, default_iters: usize, seed: u64) {
    let trace: usize = std::env::var("SILICA_SOAK_TRACE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let (iters, secs) = match budget(default_iters) {
        Budget::Iters(n) => (Some(n), 0.0),
        Budget::Secs(s) => (None, s / 3.0),
    };
    dev.empty_cache();
    let start = stats(dev);
    let rss_start = rss_bytes().unwrap_or(0);
    let warm = pass(dev, seed, iters, secs, trace);
    let repeat = pass(dev, seed, Some(warm.iters), 0.0, trace);
    let other = pass(dev, seed + 1, iters.or(Some(warm.iters)), 0.0, trace);
    for (name, p) in [
        ("warm-up", &warm),
        ("repeat", &repeat),
        ("new seed", &other),
    ] {
        eprintln!(
            "{dev}: {name} pass: {} iterations, {} tensors, {:.1} s; RSS {:.1} MiB \
             (start {:.1}); allocated {} B, live buffers {}, reserved {:.2} MiB \
             (largest {:.2}) in {} cached buffers, peak allocated {:.2} MiB",
            p.iters,
            p.tensors,
            p.secs,
            mib(p.rss),
            mib(rss_start),
            p.stats.allocated,
            p.stats.live_buffers,
            mib(p.stats.reserved),
            mib(p.max_reserved),
            p.stats.cached_buffers,
            mib(p.stats.peak_allocated),
        );
    }
    eprintln!("{dev}: counters at the start {start:?}");

    for (name, p) in [
        ("warm-up", &warm),
        ("repeat", &repeat),
        ("new seed", &other),
    ] {
        // every tensor dropped: nothing allocated, no buffer live
        let s = &p.stats;
        assert_eq!(
            s.allocated, start.allocated,
            "{dev} {name}: bytes leaked: {s:?}"
        );
        assert_eq!(
            s.live_buffers, start.live_buffers,
            "{dev} {name}: buffers leaked: {s:?}"
        );
        assert!(
            p.max_reserved <= start.reserved + RESERVED_BOUND,
            "{dev} {name}: the cache grew to {} bytes",
            p.max_reserved
        );
    }
    // the loop really allocated (on the CPU too: its tensors are counted)
    assert!(
        warm.stats.peak_allocated > start.allocated,
        "{dev}: the loop allocated nothing: {:?}",
        warm.stats
    );
    if dev.is_gpu() {
        // the repeat was served from the cache: not one more buffer (the
        // CPU keeps no cache: its reserved bytes are its allocated ones)
        assert_eq!(
            repeat.max_reserved, warm.stats.reserved,
            "{dev}: the repeated pass reserved new memory"
        );
        assert_eq!(
            repeat.stats.cached_buffers, warm.stats.cached_buffers,
            "{dev}"
        );
        assert!(warm.stats.cached_buffers > 0, "{dev}: {:?}", warm.stats);
    }
    dev.empty_cache();
    let emptied = stats(dev);
    assert_eq!(emptied.reserved, start.reserved, "{dev}: {emptied:?}");
    assert_eq!(emptied.cached_buffers, 0, "{dev}: {emptied:?}");
    if rss_bytes().is_some() {
        assert!(
            repeat.rss <= warm.rss + RSS_BOUND,
            "{dev}: resident memory grew by {:.1} MiB while repeating {} iterations",
            mib(repeat.rss - warm.rss),
            repeat.iters
        );
    }
}

#[test]
fn tensors_of_random_shapes_and_dtypes_leave_no_memory_behind() {
    let _serial = lock_process_state();
    soak(&Device::cpu(), 3000, 7);
    for dev in common::gpu_devices() {
        soak(&dev, 1000, 8);
    }
}

/// Regression: the GPU norm kernels read their weight and bias from the
/// start of the buffer, so a weight that was a narrowed view (one row of a
/// stacked parameter) gave the wrong rows' values. Found by the soak above.
#[test]
fn norm_parameters_may_be_views_at_an_offset() {
    let _serial = lock_process_state();
    let mut devices = vec![Device::cpu()];
    devices.extend(common::gpu_devices());
    for dev in devices {
        let x = Tensor::randn(&[3, 16], DType::F32, 1, &dev).unwrap();
        let params = Tensor::randn(&[3, 16], DType::F32, 2, &dev).unwrap();
        let (w, b) = (
            params.narrow(0, 1, 1).unwrap(),
            params.narrow(0, 2, 1).unwrap(),
        );
        let (w, b) = (w.squeeze(0).unwrap(), b.squeeze(0).unwrap());
        assert!(w.is_contiguous() && w.layout().offset() == 16);
        let (wc, bc) = (w.copy().unwrap(), b.copy().unwrap());
        let got = x.rms_norm(&w, 1e-5).unwrap();
        let want = x.rms_norm(&wc, 1e-5).unwrap();
        check(&format!("{dev} rms_norm"), &got, &host(&want), None, 0.0);
        let got = x.layer_norm(&w, &b, 1e-5).unwrap();
        let want = x.layer_norm(&wc, &bc, 1e-5).unwrap();
        check(&format!("{dev} layer_norm"), &got, &host(&want), None, 0.0);
    }
}
