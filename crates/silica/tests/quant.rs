//! Quantized weights (`QTensor`, `Tensor::matmul_q`) against the
//! dequantize-then-f32 reference: on the CPU and on every GPU adapter, for
//! every block format, the product with the blocks decoded in the kernel
//! must match `x @ dequantize(w)ᵀ` computed by the plain f32 matmul; plus
//! the constructors' checks and the reference quantizers' round trips.

mod common;

use std::sync::{Mutex, MutexGuard};

use silica::{DType, Device, Error, QFuse, QTensor, QuantFormat, RopeStyle, Tensor};

/// Held by the tests whose CPU expectations depend on
/// `silica::cpu_int8_activations` while one of them switches it.
static INT8_SWITCH: Mutex<()> = Mutex::new(());

fn int8_switch() -> MutexGuard<'static, ()> {
    INT8_SWITCH.lock().unwrap_or_else(|e| e.into_inner())
}

fn devices() -> Vec<Device> {
    let mut d = vec![Device::cpu()];
    d.extend(common::gpu_devices());
    d
}

/// max |a - b| / max |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
    let worst = a.iter().zip(b).fold(0f64, |m, (&x, &y)| {
        m.max((f64::from(x) - f64::from(y)).abs())
    });
    worst / scale.max(f64::MIN_POSITIVE)
}

/// Formats whose GPU decode product quantizes x to 8 bits with 8-bit
/// activations on (`GpuDevice::int8_activations`).
fn gpu_int8_activations(format: QuantFormat) -> bool {
    matches!(
        format,
        QuantFormat::Q4_0
            | QuantFormat::Q4_1
            | QuantFormat::Q8_0
            | QuantFormat::Q4_K
            | QuantFormat::Q5_K
            | QuantFormat::Q6_K
    )
}

/// Whether `g` takes a product of `m` rows of x with `weight_rows` rows of
/// w through the GEMV kernels, whose activations are rounded to 8 bits with
/// `int8_activations` on: up to 8 rows, and up to its `gemv_rows` in chunks
/// of 8 while there are two chunks or chunks times weight rows stay within
/// 32,768.
fn takes_gemv(g: &silica::GpuDevice, m: usize, weight_rows: usize) -> bool {
    let chunks = m.div_ceil(8);
    m <= 8
        || (m <= g.features().gemv_rows as usize
            && (chunks <= 2 || chunks * weight_rows <= 1 << 15))
}

/// Formats whose CPU product quantizes x to 8 bits (as llama.cpp does).
fn int8_activations(format: QuantFormat) -> bool {
    matches!(
        format,
        QuantFormat::Q4_0
            | QuantFormat::Q4_1
            | QuantFormat::Q5_0
            | QuantFormat::Q5_1
            | QuantFormat::Q8_0
            | QuantFormat::Q4_K
            | QuantFormat::Q5_K
            | QuantFormat::Q6_K
    )
}

/// For `x` [m, k] and `w` [n, k]: the largest error that rounding x to 8
/// bits per block of 32 can cause in each output of `x @ wᵀ`.
fn rounding_bound(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    for r in 0..m {
        for j in 0..n {
            let mut bound = 0f64;
            for b in 0..k / 32 {
                let xb = &x[r * k + 32 * b..r * k + 32 * b + 32];
                let amax = xb.iter().fold(0f64, |a, &v| a.max(f64::from(v).abs()));
                let wsum: f64 = w[j * k + 32 * b..j * k + 32 * b + 32]
                    .iter()
                    .map(|&v| f64::from(v).abs())
                    .sum();
                bound += amax / 254.0 * wsum;
            }
            out[r * n + j] = bound as f32;
        }
    }
    out
}

/// `h` rounded as the CPU's integer products round x: per block of 32,
/// `d = amax / 127`, `q = round(h / d)`, value `q · d`.
fn rounded_to_8_bits(h: &[f64]) -> Vec<f64> {
    h.chunks(32)
        .flat_map(|b| {
            let d = f64::from(b.iter().fold(0f64, |a, v| a.max(v.abs())) as f32 / 127.0);
            b.iter().map(move |&v| {
                if d > 0.0 {
                    (v / d).round_ties_even() * d
                } else {
                    0.0
                }
            })
        })
        .collect()
}

/// As [`rel_err`], for the part of each error beyond `slack`.
fn rel_err_beyond(a: &[f32], b: &[f32], slack: &[f32]) -> f64 {
    let scale = b.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
    let worst = a.iter().zip(b).zip(slack).fold(0f64, |m, ((&x, &y), &s)| {
        m.max((f64::from(x) - f64::from(y)).abs() - f64::from(s))
    });
    worst / scale.max(f64::MIN_POSITIVE)
}

/// `rel_err_beyond` of `x @ wdᵀ` (`got` against `want`, x [m, k] and the
/// dequantized w [n, k] on the CPU), beyond the 8-bit rounding bound where
/// the product `rounds` x.
fn err_beyond_rounding(rounds: bool, got: &[f32], want: &[f32], x: &Tensor, wd: &Tensor) -> f64 {
    let (m, k, n) = (x.shape()[0], x.shape()[1], wd.shape()[0]);
    let slack = if rounds {
        let (xv, wv): (Vec<f32>, Vec<f32>) = (x.to_vec().unwrap(), wd.to_vec().unwrap());
        rounding_bound(&xv, &wv, m, n, k)
    } else {
        vec![0.0; m * n]
    };
    rel_err_beyond(got, want, &slack)
}

#[test]
fn matmul_q_matches_the_dequantized_reference() {
    let _switch = int8_switch();
    let initial = silica::cpu_isa();
    // the CPU on every instruction set it has (SILICA_CPU_ISA's paths)
    let runs = devices().into_iter().flat_map(|dev| {
        let isas = match dev {
            Device::Cpu => silica::cpu_isa_available(),
            Device::Gpu(_) => vec![initial],
        };
        isas.into_iter().map(move |isa| (dev.clone(), isa))
    });
    for (dev, isa) in runs {
        silica::set_cpu_isa(isa).unwrap();
        for format in QuantFormat::ALL {
            for (m, n, k) in [
                (1, 9, 256),
                (3, 40, 512),
                (8, 17, 256),
                (9, 33, 768),
                (23, 40, 512),
                (67, 70, 256),
                // whole 16-row tiles, which a prompt's Q4_K product kept in
                // rows packs as it goes on AVX-512 VNNI without AMX
                (17, 64, 512),
                (9, 32, 4096),
            ] {
                let w = QTensor::random(format, &[n, k], 5, &dev).unwrap();
                let x = Tensor::randn(&[m, k], DType::F32, 6, &dev).unwrap();
                let got: Vec<f32> = x.matmul_q(&w).unwrap().to_vec().unwrap();
                // the reference: blocks decoded on the host, f32 matmul on the CPU
                let wd = w
                    .dequantize(DType::F32)
                    .unwrap()
                    .to_device(&Device::cpu())
                    .unwrap();
                let xc = x.to_device(&Device::cpu()).unwrap();
                let want: Vec<f32> = xc.matmul(&wd.t().unwrap()).unwrap().to_vec().unwrap();
                // the CPU multiplies these formats with x rounded to 8 bits
                // per block of 32 (scale amax / 127): each output may then
                // be off by up to Σ |w| · amax / 254 over the blocks
                // (the same on a GPU with 8-bit activations, for the rows
                // that take the GEMV kernels)
                let rounds = match &dev {
                    Device::Cpu => silica::cpu_int8_activations() && int8_activations(format),
                    Device::Gpu(g) => {
                        g.int8_activations() && takes_gemv(g, m, n) && gpu_int8_activations(format)
                    }
                };
                let err = err_beyond_rounding(rounds, &got, &want, &xc, &wd);
                assert!(
                    err <= 1e-5,
                    "{dev} ({isa}) {format} [{m}, {k}] x [{n}, {k}]: relative error {err:e}"
                );
            }
        }
    }
    silica::set_cpu_isa(initial).unwrap();
}

/// Matrices of whole 16-row tiles, which the CPU stores in tiles of 16
/// rows where its path has their kernel (AVX-512 VNNI): loaded once, then
/// multiplied on every instruction set the processor has (the rows read
/// back out of the tiles where the path changed since the load), looked
/// up, and written back as the blocks they were made from.
#[test]
fn tiled_cpu_weights_behave_as_the_blocks() {
    let _switch = int8_switch();
    let initial = silica::cpu_isa();
    let cpu = Device::cpu();
    let (n, k) = (48, 512);
    for format in QuantFormat::ALL {
        let w = QTensor::random(format, &[n, k], 3, &cpu).unwrap();
        let blocks = w.to_bytes().unwrap();
        let again = QTensor::from_bytes(format, &[n, k], &blocks, &cpu).unwrap();
        assert!(
            again.to_bytes().unwrap() == blocks,
            "{format}: blocks changed"
        );
        let wd = w.dequantize(DType::F32).unwrap();
        let ids = Tensor::from_slice(&[47u32, 0, 16, 31], &[4], &cpu).unwrap();
        let got: Vec<f32> = w.embedding(&ids, DType::F32).unwrap().to_vec().unwrap();
        let want: Vec<f32> = wd.index_select(0, &ids).unwrap().to_vec().unwrap();
        assert_eq!(got, want, "{format}: rows looked up");
        for isa in silica::cpu_isa_available() {
            silica::set_cpu_isa(isa).unwrap();
            for m in [1, 5, 9] {
                let x = Tensor::randn(&[m, k], DType::F32, 6, &cpu).unwrap();
                let got: Vec<f32> = x.matmul_q(&w).unwrap().to_vec().unwrap();
                let want: Vec<f32> = x.matmul(&wd.t().unwrap()).unwrap().to_vec().unwrap();
                let rounds = silica::cpu_int8_activations() && int8_activations(format);
                let err = err_beyond_rounding(rounds, &got, &want, &x, &wd);
                assert!(
                    err <= 1e-5,
                    "{format} on {isa}, {m} rows: relative error {err:e}"
                );
            }
        }
        silica::set_cpu_isa(initial).unwrap();
    }
}

/// `silica::set_cpu_int8_activations`: off, the CPU's Q4_0/Q4_1/Q8_0 and
/// K-quant products are the exact f32 ones; on, within the 8-bit rounding
/// bound.
#[test]
fn cpu_int8_activations_switch() {
    let _switch = int8_switch();
    let cpu = Device::cpu();
    let before = silica::cpu_int8_activations();
    for format in [
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q8_0,
        QuantFormat::Q4_K,
        QuantFormat::Q6_K,
    ] {
        for (m, n, k) in [(1, 70, 512), (9, 33, 768)] {
            let w = QTensor::random(format, &[n, k], 11, &cpu).unwrap();
            let x = Tensor::randn(&[m, k], DType::F32, 12, &cpu).unwrap();
            let wd = w.dequantize(DType::F32).unwrap();
            let want: Vec<f32> = x.matmul(&wd.t().unwrap()).unwrap().to_vec().unwrap();
            let product = |on: bool| -> Vec<f32> {
                silica::set_cpu_int8_activations(on);
                assert_eq!(silica::cpu_int8_activations(), on);
                x.matmul_q(&w).unwrap().to_vec().unwrap()
            };
            let (exact, int8) = (product(false), product(true));
            let err = rel_err(&exact, &want);
            assert!(
                err <= 1e-5,
                "{format} [{m}, {k}] off: relative error {err:e}"
            );
            let (xv, wv) = (x.to_vec().unwrap(), wd.to_vec().unwrap());
            let err = rel_err_beyond(&int8, &want, &rounding_bound(&xv, &wv, m, n, k));
            assert!(
                err <= 1e-5,
                "{format} [{m}, {k}] on: relative error {err:e}"
            );
        }
    }
    silica::set_cpu_int8_activations(before);
}

/// `GpuDevice::set_int8_activations`: on every GPU adapter, decode's
/// Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K products with x rounded to 8 bits (qgemv_i8) within the
/// rounding bound of the exact product, over widths with rows that start
/// 2 bytes past a word (an odd number of 18- or 34-byte blocks), both
/// sizes of the kernel's buffer for x (K up to 4,096 and past it) and
/// every activation dtype; off, the exact kernel. The same for 2, 3, 5 and
/// 8 rows of x (a server's step of several sequences), with rows that the
/// buffer holds whole and rows that it takes a slice at a time, and for 9
/// and 23 rows in chunks of at most 8.
#[test]
fn gpu_int8_activations_stay_within_the_rounding_bound() {
    let _switch = int8_switch();
    for dev in common::gpu_devices() {
        let Device::Gpu(g) = &dev else { continue };
        let before = g.int8_activations();
        for format in [
            QuantFormat::Q4_0,
            QuantFormat::Q4_1,
            QuantFormat::Q8_0,
            QuantFormat::Q4_K,
            QuantFormat::Q5_K,
            QuantFormat::Q6_K,
        ] {
            // Q6_K's blocks (210 bytes) start 2 bytes past a word in every
            // other row at K = 256, 768 and 4,352; x is rounded four threads
            // a block up to K = 2,048, one thread a block past it. Q4_0,
            // Q4_1 and Q8_0 keep two units of each row in flight up to 192
            // workgroups (6,144 rows, 32 a workgroup) and one past them:
            // 6,200 rows take the second path.
            let shapes: &[(usize, usize)] = if format.block_elems() == 256 {
                &[(9, 256), (70, 768), (5, 3072), (3, 4352), (2050, 256)]
            } else {
                &[
                    (9, 288),
                    (70, 512),
                    (5, 3072),
                    (3, 4128),
                    (2050, 64),
                    (6200, 64),
                ]
            };
            // several rows of x: whole in x's buffer, and a slice at a
            // time (K = 4,128 and 4,352 at 5 rows and more; the last slice
            // shorter than the others); past 8 rows, in chunks (9: 5 and 4
            // rows, 23: 8, 8 and 7)
            let rows: &[(usize, &[usize])] = &[
                (1, &[]),
                (2, &[0, 1]),
                (3, &[1, 3]),
                (5, &[2, 3]),
                (8, &[0, 3]),
                (9, &[1]),
                (23, &[0, 3]),
            ];
            let cases = rows.iter().flat_map(|&(m, picks)| {
                let some: Vec<(usize, usize)> = match m {
                    1 => shapes.to_vec(),
                    _ => picks.iter().map(|&i| shapes[i]).collect(),
                };
                some.into_iter().map(move |(n, k)| (m, n, k))
            });
            for (m, n, k) in cases {
                let w = QTensor::random(format, &[n, k], 21, &dev).unwrap();
                let wd = w
                    .dequantize(DType::F32)
                    .unwrap()
                    .to_device(&Device::cpu())
                    .unwrap();
                for dtype in [DType::F32, DType::F16, DType::BF16] {
                    let x = Tensor::randn(&[m, k], dtype, 22, &dev).unwrap();
                    let xc = x
                        .to_dtype(DType::F32)
                        .unwrap()
                        .to_device(&Device::cpu())
                        .unwrap();
                    let want: Vec<f32> = xc.matmul(&wd.t().unwrap()).unwrap().to_vec().unwrap();
                    let product = |on: bool| -> Vec<f32> {
                        g.set_int8_activations(on);
                        let y = x.matmul_q(&w).unwrap().to_dtype(DType::F32).unwrap();
                        y.to_vec().unwrap()
                    };
                    // the output's own rounding to a 16-bit dtype on top
                    let out_tol = match dtype {
                        DType::F16 => 1e-3,
                        DType::BF16 => 8e-3,
                        _ => 1e-5,
                    };
                    let exact = product(false);
                    let err = rel_err(&exact, &want);
                    assert!(
                        err <= out_tol,
                        "{dev} {format} {dtype} [{m}, {k}] x [{n}, {k}] off: relative error {err:e}"
                    );
                    let int8 = product(true);
                    let (xv, wv) = (xc.to_vec().unwrap(), wd.to_vec().unwrap());
                    let bound = rounding_bound(&xv, &wv, m, n, k);
                    let err = rel_err_beyond(&int8, &want, &bound);
                    assert!(
                        err <= out_tol,
                        "{dev} {format} {dtype} [{m}, {k}] x [{n}, {k}] on: relative error {err:e}"
                    );
                    // the rounding is really there (random x has no block
                    // that 8 bits hold exactly)
                    assert_ne!(
                        int8, exact,
                        "{dev} {format} [{m}, {k}]: no 8-bit rounding seen"
                    );
                }
            }
        }
        g.set_int8_activations(before);
    }
}

#[test]
fn matmul_q_keeps_the_activation_dtype_and_batch_shape() {
    let _switch = int8_switch();
    for dev in devices() {
        let w = QTensor::random(QuantFormat::Q4_K, &[6, 256], 1, &dev).unwrap();
        for dtype in DType::FLOATS {
            let x = Tensor::randn(&[2, 3, 256], dtype, 2, &dev).unwrap();
            let y = x.matmul_q(&w).unwrap();
            assert_eq!(
                (y.shape(), y.dtype()),
                (&[2usize, 3, 6][..], dtype),
                "{dev}"
            );
            let (xf, wd) = (
                x.to_dtype(DType::F32).unwrap(),
                w.dequantize(DType::F32).unwrap(),
            );
            let want = xf.matmul(&wd.t().unwrap()).unwrap();
            let got: Vec<f32> = y.to_dtype(DType::F32).unwrap().to_vec().unwrap();
            let want: Vec<f32> = want.to_vec().unwrap();
            // the CPU rounds x to 8 bits for Q4_K (see the reference
            // test), a GPU with 8-bit activations its 6 rows
            let rounds = match &dev {
                Device::Cpu => silica::cpu_int8_activations(),
                Device::Gpu(g) => g.int8_activations(),
            };
            let slack = if rounds {
                let (xv, wv) = (xf.to_vec().unwrap(), wd.to_vec().unwrap());
                rounding_bound(&xv, &wv, 6, 6, 256)
            } else {
                vec![0.0; 36]
            };
            let bound = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
            let err = rel_err_beyond(&got, &want, &slack);
            assert!(err <= bound, "{dev} {dtype}: {err:e}");
        }
    }
}

#[test]
fn quantizers_round_trip_within_the_format_error() {
    // ggml's reference quantizers on N(0, 1): the worst error of one value
    // is half a quantization step of its block
    let dev = Device::cpu();
    let t = Tensor::randn(&[16, 512], DType::F32, 3, &dev).unwrap();
    let values: Vec<f32> = t.to_vec().unwrap();
    for (format, steps) in [
        (QuantFormat::Q8_0, 254.0f32),
        (QuantFormat::Q4_0, 15.0),
        (QuantFormat::Q4_1, 15.0),
    ] {
        let q = QTensor::quantize(&t, format).unwrap();
        assert_eq!(q.size_in_bytes(), 16 * 512 / 32 * format.block_bytes());
        let back: Vec<f32> = q.dequantize(DType::F32).unwrap().to_vec().unwrap();
        for (block, (a, b)) in values.chunks(32).zip(back.chunks(32)).enumerate() {
            let amax = a.iter().fold(0f32, |m, v| m.max(v.abs()));
            let range = if format == QuantFormat::Q4_1 {
                a.iter().fold(f32::MIN, |m, &v| m.max(v))
                    - a.iter().fold(f32::MAX, |m, &v| m.min(v))
            } else {
                2.0 * amax
            };
            let step = range / steps;
            for (x, y) in a.iter().zip(b) {
                // Q4_0's scale maps the largest value to -8, so one side
                // of the range is a step wider
                assert!(
                    (x - y).abs() <= step * 1.01 + 1e-6,
                    "{format} block {block}: {x} came back as {y} (step {step})"
                );
            }
        }
    }
}

#[test]
fn blocks_survive_transfers_and_concatenation() {
    let cpu = Device::cpu();
    for dev in devices() {
        let a = QTensor::random(QuantFormat::Q6_K, &[3, 512], 7, &cpu).unwrap();
        let b = QTensor::random(QuantFormat::Q6_K, &[2, 512], 8, &cpu).unwrap();
        let (da, db) = (a.to_device(&dev).unwrap(), b.to_device(&dev).unwrap());
        let cat = QTensor::cat_rows(&[&da, &db]).unwrap();
        assert_eq!(cat.shape(), [5, 512]);
        let mut bytes = a.to_bytes().unwrap();
        bytes.extend(b.to_bytes().unwrap());
        assert_eq!(cat.to_bytes().unwrap(), bytes, "{dev}");
    }
}

#[test]
fn embedding_rows_match_the_dequantized_table() {
    for dev in devices() {
        for format in QuantFormat::ALL {
            let w = QTensor::random(format, &[11, 512], 9, &dev).unwrap();
            let table = w.dequantize(DType::F32).unwrap();
            let ids = Tensor::from_slice(&[3u32, 0, 10, 3], &[4], &dev).unwrap();
            for dtype in DType::FLOATS {
                let got = w.embedding(&ids, dtype).unwrap();
                assert_eq!((got.shape(), got.dtype()), (&[4usize, 512][..], dtype));
                let want = table
                    .index_select(0, &ids)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let (got, want): (Vec<f32>, Vec<f32>) = (
                    got.to_dtype(DType::F32).unwrap().to_vec().unwrap(),
                    want.to_dtype(DType::F32).unwrap().to_vec().unwrap(),
                );
                assert_eq!(got, want, "{dev} {format} {dtype}");
            }
        }
        // an id past the table: an error on the CPU, zeros on a GPU
        let w = QTensor::random(QuantFormat::Q8_0, &[2, 32], 1, &dev).unwrap();
        let ids = Tensor::from_slice(&[2u32], &[1], &dev).unwrap();
        match (&dev, w.embedding(&ids, DType::F32)) {
            (Device::Cpu, r) => assert!(matches!(r, Err(Error::IndexOutOfRange { .. }))),
            (_, r) => assert_eq!(r.unwrap().to_vec::<f32>().unwrap(), vec![0.0; 32]),
        }
    }
}

#[test]
fn bad_input_is_an_error() {
    let dev = Device::cpu();
    let f = QuantFormat::Q4_0;
    // rows of partial blocks, wrong byte count, wrong rank
    assert!(matches!(
        QTensor::from_bytes(f, &[2, 40], &[0; 90], &dev),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        QTensor::from_bytes(f, &[2, 64], &[0; 71], &dev),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        QTensor::from_bytes(f, &[64], &[0; 36], &dev),
        Err(Error::InvalidArgument { .. })
    ));
    // sizes whose byte count overflows
    assert!(QTensor::from_bytes(f, &[usize::MAX / 2, 64], &[], &dev).is_err());
    // no quantizer for the K-quants
    let t = Tensor::zeros(&[2, 256], DType::F32, &dev).unwrap();
    assert!(QTensor::quantize(&t, QuantFormat::Q4_K).is_err());
    // mismatched inner dimension
    let w = QTensor::random(f, &[4, 64], 1, &dev).unwrap();
    let x = Tensor::zeros(&[2, 32], DType::F32, &dev).unwrap();
    assert!(matches!(x.matmul_q(&w), Err(Error::ShapeMismatch { .. })));
    // integer activations
    let xi = Tensor::zeros(&[2, 64], DType::U32, &dev).unwrap();
    assert!(matches!(
        xi.matmul_q(&w),
        Err(Error::UnsupportedDType { .. })
    ));
    // concatenating different formats
    let w2 = QTensor::random(QuantFormat::Q8_0, &[4, 64], 1, &dev).unwrap();
    assert!(QTensor::cat_rows(&[&w, &w2]).is_err());
    if let Some(gpu) = common::first_gpu() {
        let wg = w.to_device(&gpu).unwrap();
        let xz = Tensor::zeros(&[2, 64], DType::F32, &dev).unwrap();
        assert!(matches!(
            xz.matmul_q(&wg),
            Err(Error::DeviceMismatch { .. })
        ));
    }
}

/// The gate of a fused product in `fused_products_match_their_definition`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Gate {
    None,
    Silu,
    Gelu,
}

/// The fused product against its definition written with the dequantized
/// weight and plain f32 ops (RMSNorm by hand, matmul, SwiGLU, add), on
/// every device: one kernel on a GPU for up to its GEMV rows (64 by
/// default; past 8 in chunks of up to 8). K = 4,352 takes qgemv_i8's other way of rounding x (one thread a
/// block, past 128 blocks) with the norm fused; with 8 rows (3 in the K
/// formats, K = 5,888) x's buffer takes a slice of each row at a time.
#[test]
fn fused_products_match_their_definition() {
    let _switch = int8_switch();
    let n = 24;
    let cpu = Device::cpu();
    // each GPU twice: the exact GEMV and the one with 8-bit activations
    let mut runs: Vec<(Device, bool)> = vec![(cpu.clone(), false)];
    for dev in common::gpu_devices() {
        runs.push((dev.clone(), false));
        runs.push((dev, true));
    }
    for (dev, gpu_int8) in runs {
        let before = match &dev {
            Device::Gpu(g) => {
                let before = g.int8_activations();
                g.set_int8_activations(gpu_int8);
                before
            }
            Device::Cpu => false,
        };
        for format in [
            QuantFormat::Q4_0,
            QuantFormat::Q4_1,
            QuantFormat::Q8_0,
            QuantFormat::Q4_K,
            QuantFormat::Q5_K,
            QuantFormat::Q6_K,
        ] {
            // a slice at a time on a device with 32 KiB of workgroup
            // memory, where the K formats' slices of 8 rows do not fit
            let sliced = if format.block_elems() == 256 {
                (3, 5888)
            } else {
                (8, 4352)
            };
            // (rows, k, gate: none, SwiGLU or GeGLU)
            let cases = [
                (1, 256, Gate::Silu),
                (9, 256, Gate::Silu),
                (1, 4352, Gate::Silu),
                (1, 256, Gate::Gelu),
                (9, 256, Gate::Gelu),
                (1, 256, Gate::None),
                (2, 256, Gate::Silu),
                (2, 256, Gate::None),
                (3, 256, Gate::Gelu),
                (3, 512, Gate::None),
                (5, 256, Gate::Silu),
                (5, 256, Gate::None),
                (8, 256, Gate::Silu),
                (8, 256, Gate::Gelu),
                (8, 768, Gate::None),
                (17, 256, Gate::None),
                (23, 512, Gate::Silu),
                (sliced.0, sliced.1, Gate::Silu),
                (sliced.0, sliced.1, Gate::None),
            ];
            for (rows, k, gate) in cases {
                let gelu = gate == Gate::Gelu;
                let gated = gate != Gate::None;
                let w_rows = if gated { 2 * n } else { n };
                let w = QTensor::random(format, &[w_rows, k], 5, &dev).unwrap();
                let wd: Vec<f32> = w.dequantize(DType::F32).unwrap().to_vec().unwrap();
                let x = Tensor::randn(&[rows, k], DType::F32, 6, &dev).unwrap();
                let g = Tensor::randn(&[k], DType::F32, 7, &dev).unwrap();
                let r = Tensor::randn(&[rows, n], DType::F32, 8, &dev).unwrap();
                // a LoRA update of rank 40 that some cases add (the product
                // computes u itself where rank × K ≤ 32,768: in one round
                // of its workgroup, or in two with 8 rows in a chunk; K =
                // 4,352 runs project_low_rank first)
                let lora = matches!(
                    (rows, k),
                    (1, 256) | (1, 4352) | (3, 512) | (8, 768) | (23, 512)
                );
                let rank = 40;
                let la = Tensor::randn(&[rank, k], DType::F32, 9, &dev)
                    .unwrap()
                    .mul_scalar(0.5)
                    .unwrap();
                let lb = Tensor::randn(&[rank, w_rows], DType::F32, 10, &dev)
                    .unwrap()
                    .mul_scalar(0.5)
                    .unwrap();
                let fuse = QFuse {
                    rms_norm: Some((&g, 1e-5)),
                    swiglu: gate == Gate::Silu,
                    geglu: gelu,
                    residual: Some(&r),
                    low_rank: None,
                    low_rank_a: lora.then_some((&la, &lb)),
                };
                let got: Vec<f32> = x.matmul_q_fused(&w, fuse).unwrap().to_vec().unwrap();
                let (xs, gs, rs): (Vec<f32>, Vec<f32>, Vec<f32>) = (
                    x.to_vec().unwrap(),
                    g.to_vec().unwrap(),
                    r.to_vec().unwrap(),
                );
                let (las, lbs): (Vec<f32>, Vec<f32>) = (la.to_vec().unwrap(), lb.to_vec().unwrap());
                let mut want = vec![0f32; rows * n];
                for i in 0..rows {
                    let row = &xs[i * k..(i + 1) * k];
                    let ms = row.iter().map(|v| (v * v) as f64).sum::<f64>() / k as f64;
                    let inv = 1.0 / (ms + 1e-5).sqrt();
                    let h: Vec<f64> = row
                        .iter()
                        .zip(&gs)
                        .map(|(&v, &s)| v as f64 * inv * s as f64)
                        .collect();
                    // the CPU rounds the normed rows to 8 bits for these
                    // formats, a GPU those of its GEMV kernels with 8-bit
                    // activations on
                    let rounds = match &dev {
                        Device::Cpu => silica::cpu_int8_activations() && int8_activations(format),
                        Device::Gpu(g) => {
                            gpu_int8 && takes_gemv(g, rows, w_rows) && gpu_int8_activations(format)
                        }
                    };
                    // u = rms_norm(x)·aᵀ, the norm without its weight (a
                    // caller folds that into a), before any rounding
                    let u: Vec<f64> = (0..if lora { rank } else { 0 })
                        .map(|q| {
                            row.iter()
                                .zip(&las[q * k..(q + 1) * k])
                                .map(|(&a, &b)| a as f64 * inv * b as f64)
                                .sum()
                        })
                        .collect();
                    let h = if rounds { rounded_to_8_bits(&h) } else { h };
                    let dot = |j: usize| -> f64 {
                        let update: f64 = u
                            .iter()
                            .enumerate()
                            .map(|(q, uq)| uq * lbs[q * w_rows + j] as f64)
                            .sum();
                        h.iter()
                            .zip(&wd[j * k..(j + 1) * k])
                            .map(|(a, &b)| a * b as f64)
                            .sum::<f64>()
                            + update
                    };
                    for j in 0..n {
                        if !gated {
                            want[i * n + j] = (dot(j) + rs[i * n + j] as f64) as f32;
                            continue;
                        }
                        let (gate, up) = (dot(j), dot(n + j));
                        let act = if gelu {
                            let c = (2.0 / std::f64::consts::PI).sqrt();
                            0.5 * gate * (1.0 + (c * (gate + 0.044715 * gate.powi(3))).tanh())
                        } else {
                            gate / (1.0 + (-gate).exp())
                        };
                        want[i * n + j] = (act * up + rs[i * n + j] as f64) as f32;
                    }
                }
                // x's values near a tie between two 8-bit steps may round
                // either way (the GPU rounds in f32, before the norm's
                // 1 / rms, the reference in f64 after it): more rows, more
                // such values, each a step of one value of x
                let tol = if rows > 1 { 1e-3 } else { 1e-4 };
                let err = rel_err(&got, &want);
                assert!(
                    err < tol,
                    "{dev} {format} rows {rows} k {k} {gate:?} lora {lora} (GPU int8 {gpu_int8}): relative error {err}"
                );
            }
        }
        if let Device::Gpu(g) = &dev {
            g.set_int8_activations(before);
        }
    }
    // bad input: odd row count with swiglu, wrong norm weight, wrong residual
    let w = QTensor::random(QuantFormat::Q8_0, &[5, 64], 1, &cpu).unwrap();
    let x = Tensor::zeros(&[1, 64], DType::F32, &cpu).unwrap();
    let swiglu = QFuse {
        swiglu: true,
        ..QFuse::default()
    };
    assert!(matches!(
        x.matmul_q_fused(&w, swiglu),
        Err(Error::InvalidArgument { .. })
    ));
    let g = Tensor::zeros(&[32], DType::F32, &cpu).unwrap();
    let norm = QFuse {
        rms_norm: Some((&g, 1e-5)),
        ..QFuse::default()
    };
    assert!(matches!(
        x.matmul_q_fused(&w, norm),
        Err(Error::InvalidArgument { .. })
    ));
    let r = Tensor::zeros(&[1, 4], DType::F32, &cpu).unwrap();
    let add = QFuse {
        residual: Some(&r),
        ..QFuse::default()
    };
    assert!(matches!(
        x.matmul_q_fused(&w, add),
        Err(Error::InvalidArgument { .. })
    ));
    // a low-rank update computed by the product: a of another K, b of
    // other rows, u and a both given; and a good one, which is the update
    // through u from project_low_rank
    let a = Tensor::randn(&[2, 64], DType::F32, 9, &cpu).unwrap();
    let b = Tensor::randn(&[2, 5], DType::F32, 10, &cpu).unwrap();
    let short_a = Tensor::zeros(&[2, 32], DType::F32, &cpu).unwrap();
    let narrow_b = Tensor::zeros(&[2, 3], DType::F32, &cpu).unwrap();
    let u = x.project_low_rank(&a, None).unwrap();
    for (la, lb, with_u) in [
        (&short_a, &b, false),
        (&a, &narrow_b, false),
        (&a, &b, true),
    ] {
        let fuse = QFuse {
            low_rank: with_u.then_some((&u, &b)),
            low_rank_a: Some((la, lb)),
            ..QFuse::default()
        };
        assert!(matches!(
            x.matmul_q_fused(&w, fuse),
            Err(Error::InvalidArgument { .. })
        ));
    }
    let x = Tensor::randn(&[3, 64], DType::F32, 11, &cpu).unwrap();
    let g = Tensor::randn(&[64], DType::F32, 12, &cpu).unwrap();
    let inside = QFuse {
        rms_norm: Some((&g, 1e-5)),
        low_rank_a: Some((&a, &b)),
        ..QFuse::default()
    };
    let u = x.project_low_rank(&a, Some(1e-5)).unwrap();
    let outside = QFuse {
        rms_norm: Some((&g, 1e-5)),
        low_rank: Some((&u, &b)),
        ..QFuse::default()
    };
    let got: Vec<f32> = x.matmul_q_fused(&w, inside).unwrap().to_vec().unwrap();
    let want: Vec<f32> = x.matmul_q_fused(&w, outside).unwrap().to_vec().unwrap();
    assert!(rel_err(&got, &want) < 1e-6, "{got:?} against {want:?}");
}

/// `rope_heads` rotates the first heads as `rope` does and copies the rest.
#[test]
fn rope_heads_rotates_the_first_heads_only() {
    for dev in devices() {
        let (t, h, d) = (3, 5, 8);
        let x = Tensor::randn(&[t, h, d], DType::F32, 9, &dev).unwrap();
        let angles = Tensor::randn(&[t, d / 2], DType::F32, 10, &dev).unwrap();
        let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
        let got = x.rope_heads(&cos, &sin, RopeStyle::Adjacent, 2).unwrap();
        let full = x.rope(&cos, &sin, RopeStyle::Adjacent).unwrap();
        let part = |t: &Tensor, from: usize, len: usize| -> Vec<f32> {
            t.narrow(1, from, len).unwrap().to_vec().unwrap()
        };
        assert_eq!(part(&got, 0, 2), part(&full, 0, 2), "{dev}");
        assert_eq!(part(&got, 2, 3), part(&x, 2, 3), "{dev}");
        assert_ne!(part(&full, 2, 3), part(&x, 2, 3), "{dev}");
    }
}
