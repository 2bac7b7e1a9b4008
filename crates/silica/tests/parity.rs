//! The parity harness: every op × dtype × layout on every GPU adapter
//! present, compared with the CPU backend (which evaluates elementwise
//! functions and accumulations in f64). Layouts: contiguous, transposed,
//! sliced with an offset, broadcast, empty, size 1, odd sizes, and sizes
//! that do not divide the kernels' tiles.

mod common;

use silica::{DType, Device, QFuse, QTensor, QuantFormat, Result, Tensor};

/// |gpu - cpu| <= atol + rtol * |cpu|; NaN must match NaN.
#[derive(Clone, Copy, Debug)]
struct Tol {
    atol: f64,
    rtol: f64,
}

fn tol(dtype: DType) -> Tol {
    match dtype {
        DType::F32 => Tol {
            atol: 1e-5,
            rtol: 1e-4,
        },
        // one unit in the last place of the 16-bit result may flip
        DType::F16 => Tol {
            atol: 1e-3,
            rtol: 2e-3,
        },
        DType::BF16 => Tol {
            atol: 1e-2,
            rtol: 1.6e-2,
        },
        DType::U32 | DType::I64 => Tol {
            atol: 0.0,
            rtol: 0.0,
        },
    }
}

/// Looser bounds for sums of many rounded terms.
fn accumulating(dtype: DType) -> Tol {
    let t = tol(dtype);
    Tol {
        atol: t.atol * 20.0,
        rtol: t.rtol * 4.0,
    }
}

/// A quantized product with `rows` rows of x: from 64 rows of f16 (from 16
/// with a weight of 4 M values or more), a GPU with tensor cores rounds the
/// decoded weights to f16 (the weights a model dequantized to f16 at load
/// holds) where the CPU decodes them exactly; SwiGLU multiplies two such
/// products. Measured on an H100: up to a third over `accumulating`'s
/// bound (0.034 at an output of 0.72, where it allows 0.026); on an H200,
/// 17 rows by K = 2,048: 0.025 at an output of 0.18 (0.021 allowed).
fn quantized(dtype: DType, rows: usize) -> Tol {
    let t = accumulating(dtype);
    if dtype == DType::F16 && rows >= 16 {
        Tol {
            atol: t.atol * 3.0,
            rtol: t.rtol * 3.0,
        }
    } else {
        t
    }
}

type Build = Box<dyn Fn(&Device) -> Result<Tensor>>;

struct Case {
    name: String,
    run: Build,
    tol: Tol,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Contiguous,
    Transposed,
    Offset,
    Broadcast,
    /// Stored with the two dimensions before the last swapped: a
    /// `[B, H, T, D]` tensor seen as `[B, T, H, D]` (attention inputs).
    Permuted,
}

const KINDS: [Kind; 4] = [
    Kind::Contiguous,
    Kind::Transposed,
    Kind::Offset,
    Kind::Broadcast,
];

/// A tensor of `shape` seen through a view of kind `kind`; the same values
/// on every device (seeded on the host).
fn input(kind: Kind, shape: &[usize], dtype: DType, seed: u64, dev: &Device) -> Result<Tensor> {
    let r = shape.len();
    let base = |s: &[usize]| -> Result<Tensor> {
        if dtype.is_float() {
            Tensor::randn(s, dtype, seed, dev)
        } else {
            let n: usize = s.iter().product();
            Tensor::arange(0.0, n as f64, 1.0, DType::F32, &Device::cpu())?
                .mul_scalar(7.0)?
                .to_dtype(dtype)?
                .reshape(s)?
                .to_device(dev)
        }
    };
    match kind {
        Kind::Contiguous => base(shape),
        Kind::Transposed if r >= 2 => {
            let mut s = shape.to_vec();
            s.swap(r - 2, r - 1);
            base(&s)?.transpose(-2, -1)
        }
        Kind::Offset if r >= 1 => {
            let mut s: Vec<usize> = shape.iter().map(|d| d + 2).collect();
            s[0] += 1;
            let mut t = base(&s)?;
            for (d, &n) in shape.iter().enumerate() {
                t = t.narrow(d as isize, 1, n)?;
            }
            Ok(t)
        }
        Kind::Permuted if r >= 3 => {
            let mut s = shape.to_vec();
            s.swap(r - 3, r - 2);
            base(&s)?.transpose(-3, -2)
        }
        Kind::Broadcast if r >= 1 => {
            let mut s = shape.to_vec();
            s[0] = 1;
            base(&s)?.broadcast_to(shape)
        }
        _ => base(shape),
    }
}

fn case(
    cases: &mut Vec<Case>,
    name: String,
    tol: Tol,
    run: impl Fn(&Device) -> Result<Tensor> + 'static,
) {
    cases.push(Case {
        name,
        run: Box::new(run),
        tol,
    });
}

const SHAPES: [&[usize]; 6] = [
    &[1],
    &[1, 7, 13],
    &[65, 67],
    &[3, 300],
    &[0, 5],
    &[2, 3, 4, 5],
];

fn unary_cases(cases: &mut Vec<Case>) {
    for op in silica::UnaryOp::ALL {
        for dtype in DType::FLOATS {
            for kind in KINDS {
                for shape in SHAPES {
                    let name = format!("{} {dtype} {kind:?} {shape:?}", op.name());
                    case(cases, name, tol(dtype), move |d| {
                        input(kind, shape, dtype, 1, d)?.unary(op)
                    });
                }
            }
        }
    }
}

fn binary_cases(cases: &mut Vec<Case>) {
    let pairs: [(&[usize], &[usize]); 6] = [
        (&[1, 7, 13], &[1, 7, 13]),
        (&[7, 13], &[13]),
        (&[7, 13], &[7, 1]),
        (&[3, 1, 5], &[1, 4, 1]),
        (&[65, 67], &[65, 67]),
        (&[0, 3], &[1, 3]),
    ];
    for op in silica::BinaryOp::ALL {
        for dtype in DType::FLOATS {
            for kind in KINDS {
                for (sa, sb) in pairs {
                    let name = format!("{} {dtype} {kind:?} {sa:?} {sb:?}", op.name());
                    case(cases, name, tol(dtype), move |d| {
                        let a = input(kind, sa, dtype, 2, d)?;
                        let b = input(Kind::Contiguous, sb, dtype, 3, d)?;
                        // positive bases keep pow real-valued
                        let a = if op == silica::BinaryOp::Pow {
                            a.abs()?
                        } else {
                            a
                        };
                        a.binary(&b, op)
                    });
                }
                for shape in SHAPES {
                    let name = format!("{} {dtype} {kind:?} {shape:?}", op.scalar_name());
                    case(cases, name, tol(dtype), move |d| {
                        input(kind, shape, dtype, 4, d)?
                            .abs()?
                            .binary_scalar(1.5, op)
                    });
                }
            }
        }
    }
    // rows of whole vec4 words: the two halves of a stacked product's
    // output (rows 96 apart), and a row broadcast down the rows
    for op in silica::BinaryOp::ALL {
        for dtype in DType::FLOATS {
            let name = format!("{} {dtype} halves of [6, 96]", op.name());
            case(cases, name, tol(dtype), move |d| {
                let y = input(Kind::Contiguous, &[6, 96], dtype, 10, d)?.abs()?;
                y.narrow(1, 0, 48)?.binary(&y.narrow(1, 48, 48)?, op)
            });
            let name = format!("{} {dtype} [6, 48] [48]", op.name());
            case(cases, name, tol(dtype), move |d| {
                let a = input(Kind::Contiguous, &[6, 48], dtype, 11, d)?.abs()?;
                a.binary(&input(Kind::Contiguous, &[48], dtype, 12, d)?, op)
            });
        }
    }
    for op in silica::CmpOp::ALL {
        for dtype in DType::FLOATS {
            for kind in KINDS {
                let name = format!("{} {dtype} {kind:?}", op.name());
                case(cases, name, tol(DType::U32), move |d| {
                    let a = input(kind, &[7, 13], dtype, 5, d)?;
                    // half of b equals a, so equality is exercised
                    let b = Tensor::cat(
                        &[&a.narrow(0, 0, 4)?, &input(kind, &[3, 13], dtype, 6, d)?],
                        0,
                    )?;
                    a.compare(&b, op)
                });
            }
        }
    }
    for dtype in DType::ALL {
        for cond in [DType::U32, DType::F32, DType::I64, DType::BF16] {
            for kind in KINDS {
                let name = format!("where cond {cond} {dtype} {kind:?}");
                case(cases, name, tol(dtype), move |d| {
                    let c = input(kind, &[5, 9], DType::F32, 7, d)?
                        .gt(&Tensor::zeros(&[1], DType::F32, d)?)?
                        .to_dtype(cond)?;
                    let a = input(Kind::Contiguous, &[5, 9], dtype, 8, d)?;
                    let b = input(Kind::Contiguous, &[9], dtype, 9, d)?;
                    c.where_cond(&a, &b)
                });
            }
        }
    }
}

/// Sums and means accumulate rounding; the other reductions pick a value.
fn reduce_tol(op: silica::ReduceOp, dtype: DType) -> Tol {
    if matches!(op, silica::ReduceOp::Sum | silica::ReduceOp::Mean) {
        accumulating(dtype)
    } else {
        tol(dtype)
    }
}

fn reduce_cases(cases: &mut Vec<Case>) {
    let shapes: [(&[usize], isize); 6] = [
        (&[3, 300], -1),
        (&[3, 300], 0),
        (&[1, 7, 13], 1),
        (&[65, 67], -1),
        (&[2, 3, 4, 5], 2),
        (&[1], 0),
    ];
    for op in silica::ReduceOp::ALL {
        for dtype in DType::FLOATS {
            for kind in KINDS {
                for (shape, dim) in shapes {
                    for keep in [false, true] {
                        let name = format!(
                            "{} {dtype} {kind:?} {shape:?} dim {dim} keepdim {keep}",
                            op.name()
                        );
                        let t = reduce_tol(op, dtype);
                        // broadcast rows are all equal: argmax ties go to the first
                        case(cases, name, t, move |d| {
                            input(kind, shape, dtype, 10, d)?.reduce(op, dim, keep)
                        });
                    }
                }
            }
        }
        // rows long enough for the GPU's two passes (chunks of 4,096, the
        // last one partial), contiguous and strided (a reduction over dim 0)
        let long: [(&[usize], isize); 3] =
            [(&[2, 20_000], -1), (&[1, 40_961], -1), (&[16_390, 3], 0)];
        for dtype in DType::FLOATS {
            for kind in KINDS {
                for (shape, dim) in long {
                    let name = format!(
                        "{} {dtype} {kind:?} {shape:?} dim {dim} (long rows)",
                        op.name()
                    );
                    let t = reduce_tol(op, dtype);
                    case(cases, name, t, move |d| {
                        input(kind, shape, dtype, 11, d)?.reduce(op, dim, false)
                    });
                }
            }
        }
        let name = format!("{} over an empty dimension", op.name());
        if matches!(op, silica::ReduceOp::Sum | silica::ReduceOp::Mean) {
            case(cases, name, tol(DType::F32), move |d| {
                Tensor::zeros(&[4, 0], DType::F32, d)?.reduce(op, -1, false)
            });
        }
    }
    for log in [false, true] {
        for dtype in DType::FLOATS {
            for kind in KINDS {
                for (shape, dim) in [
                    (&[5, 300][..], -1isize),
                    (&[1, 7, 13], -1),
                    (&[1, 7, 13], 1),
                    (&[4, 6], 0),
                    (&[65, 67], -1),
                    (&[3, 8200], -1),
                    (&[2, 3, 1024], -1),
                ] {
                    let name = format!("softmax log={log} {dtype} {kind:?} {shape:?} dim {dim}");
                    case(cases, name, tol(dtype), move |d| {
                        let x = input(kind, shape, dtype, 11, d)?;
                        if log {
                            x.log_softmax(dim)
                        } else {
                            x.softmax(dim)
                        }
                    });
                }
            }
        }
    }
}

fn matmul_cases(cases: &mut Vec<Case>) {
    let shapes: [(&[usize], &[usize]); 14] = [
        (&[65, 33], &[33, 67]),
        // f16 narrow products (a transposed b): 9 rows, K ending 8 into a
        // step, N past the last 64 columns; 32 rows, K in 9 parts, the
        // last 8 deep
        (&[9, 136], &[136, 130]),
        (&[32, 2056], &[2056, 72]),
        // f16 on tensor cores under 64 rows, K in 4 parts; and K in 2
        // parts below a leading dimension of 1
        (&[20, 1024], &[1024, 264]),
        (&[1, 300, 512], &[512, 72]),
        // f16 on tensor cores with fewer than 64 columns (LoRA projections)
        (&[130, 72], &[72, 40]),
        (&[130, 72], &[72, 8]),
        (&[1, 7], &[7, 13]),
        (&[130, 70], &[70, 3]),
        (&[2, 1, 5, 7], &[3, 7, 9]),
        (&[4, 17], &[17]),
        (&[17], &[17, 6]),
        (&[3, 0], &[0, 4]),
        (&[2, 8, 16], &[2, 16, 64]),
    ];
    for dtype in DType::FLOATS {
        for ka in KINDS {
            for kb in [Kind::Contiguous, Kind::Transposed, Kind::Offset] {
                for (sa, sb) in shapes {
                    let name = format!("matmul {dtype} {ka:?}x{kb:?} {sa:?} {sb:?}");
                    case(cases, name, accumulating(dtype), move |d| {
                        input(ka, sa, dtype, 12, d)?.matmul(&input(kb, sb, dtype, 13, d)?)
                    });
                }
            }
        }
    }
}

/// `Tensor::linear` (bias folded into the product on the CPU, matmul and
/// add elsewhere): x of 3 and 2 dimensions and views of it, w as stored and
/// transposed, K = 0.
fn linear_cases(cases: &mut Vec<Case>) {
    let shapes: [(&[usize], usize); 3] = [(&[2, 5, 16], 7), (&[9, 33], 65), (&[4, 0], 3)];
    for dtype in DType::FLOATS {
        for kx in [Kind::Contiguous, Kind::Transposed, Kind::Offset] {
            for kw in [Kind::Contiguous, Kind::Transposed] {
                for (xs, n) in shapes {
                    let k = *xs.last().unwrap_or(&0);
                    let name = format!("linear {dtype} {kx:?} {kw:?} {xs:?} x [{n}, {k}]");
                    case(cases, name, accumulating(dtype), move |d| {
                        let w = input(kw, &[n, k], dtype, 14, d)?;
                        let b = input(Kind::Contiguous, &[n], dtype, 15, d)?;
                        input(kx, xs, dtype, 16, d)?.linear(&w, &b)
                    });
                }
            }
        }
    }
}

/// Each matmul kernel forced on shapes that cross its tile edges, with
/// layouts that take its vector loading paths (contiguous rows whose starts
/// are multiples of 8 elements, a transposed weight, a row-major b) and its
/// element-wise ones (offsets, transposed a).
fn forced_matmul_cases(cases: &mut Vec<Case>) {
    let shapes: [(&[usize], &[usize]); 11] = [
        (&[129, 64], &[64, 136]),
        // 128x256 tiles crossed by the edges on both sides
        (&[2, 136, 48], &[2, 48, 272]),
        // 128x128 tiles crossed by the edges on both sides, K a multiple
        // of 16 (whole steps of 16 for the cooperative-matrix kernels)
        (&[2, 100, 80], &[2, 80, 200]),
        (&[70, 96], &[96, 66]),
        // long rows: the GEMV kernel with 64 and 128 threads per column
        (&[3, 4100], &[4100, 6]),
        (&[2, 4104], &[4104, 6]),
        (&[2, 3, 72], &[72, 10]),
        (&[130, 72], &[72, 131]),
        (&[2, 70, 40], &[2, 40, 136]),
        (&[5, 48], &[48, 24]),
        (&[33, 36], &[36, 20]),
    ];
    for kernel in MATMUL_KERNELS {
        for dtype in DType::FLOATS {
            for ka in [Kind::Contiguous, Kind::Transposed, Kind::Offset] {
                for kb in [Kind::Contiguous, Kind::Transposed, Kind::Offset] {
                    for (sa, sb) in shapes {
                        let m = sa[sa.len() - 2];
                        if kernel == "gemv" && m > 8 {
                            continue;
                        }
                        let name = format!("matmul[{kernel}] {dtype} {ka:?}x{kb:?} {sa:?} {sb:?}");
                        case(cases, name, accumulating(dtype), move |d| {
                            let (a, b) =
                                (input(ka, sa, dtype, 12, d)?, input(kb, sb, dtype, 13, d)?);
                            forced_matmul(d, kernel, &a, &b)
                        });
                    }
                }
            }
        }
    }
    // f16 outputs past the largest half (about 5% of these, |y| ~ 32,768)
    // become infinities of their sign on every kernel, as on the CPU: the
    // cooperative-matrix kernels pack outputs with the hardware's
    // conversion, the others with common.wgsl's integer one
    for kernel in MATMUL_KERNELS {
        // (the narrow kernel takes a transposed b of up to 32 rows)
        let (m, kb) = match kernel {
            "gemv" => (8, Kind::Contiguous),
            "matmul_narrow" => (32, Kind::Transposed),
            _ => (130, Kind::Contiguous),
        };
        let name = format!("matmul[{kernel}] f16 overflow [{m}, 64] [64, 136]");
        case(cases, name, accumulating(DType::F16), move |d| {
            let a = input(Kind::Contiguous, &[m, 64], DType::F16, 14, d)?.mul_scalar(64.0)?;
            let b = input(kb, &[64, 136], DType::F16, 15, d)?.mul_scalar(64.0)?;
            let y = forced_matmul(d, kernel, &a, &b)?;
            // on the CPU (the reference): 1-20% of the outputs infinite, so
            // that the case tests both sides
            if d.is_cpu() {
                let infinite = y.to_f64_vec()?.iter().filter(|v| v.is_infinite()).count();
                if !(y.numel() / 100..y.numel() / 5).contains(&infinite) {
                    return Err(silica::Error::InvalidArgument {
                        op: "overflow case",
                        msg: format!("{infinite} of {} outputs infinite on the CPU", y.numel()),
                    });
                }
            }
            Ok(y)
        });
    }
}

/// The matmul kernels that the forced cases run one by one.
const MATMUL_KERNELS: [&str; 8] = [
    "matmul",
    "matmul_big",
    "matmul_coop",
    "matmul_coop_sg4",
    "matmul_coop_vec",
    "matmul_coop_wide",
    "matmul_narrow",
    "gemv",
];

/// `a @ b` with `kernel` forced where `d` is a GPU (where the kernel takes
/// the layout; otherwise the launcher's own choice).
fn forced_matmul(d: &Device, kernel: &'static str, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if let Device::Gpu(g) = d {
        g.force_matmul_kernel_for_testing(Some(kernel));
    }
    let r = a.matmul(b);
    if let Device::Gpu(g) = d {
        g.force_matmul_kernel_for_testing(None);
    }
    r
}

/// `x @ wᵀ` with quantized `w`, every block format: the GEMV kernel (up to
/// 8 rows of x; 18 in chunks of 6) and the tiled one, on sizes that do not fill their tiles,
/// with x contiguous, offset (copied by the op) and transposed; `w` random
/// blocks, the same bytes on every device.
fn qmatmul_cases(cases: &mut Vec<Case>) {
    // (rows of x, n, k)
    let shapes: [(&[usize], usize, usize); 10] = [
        (&[1, 256], 7, 256),
        // over 2,048 columns: 4 weight rows per GEMV lane set, not 2
        (&[1, 256], 2050, 256),
        (&[2, 512], 66, 512),
        (&[5, 768], 34, 768),
        (&[8, 256], 130, 256),
        (&[2, 9, 256], 18, 256),
        (&[70, 512], 67, 512),
        // two tiles of 128 each way (the cooperative-matrix kernel)
        (&[130, 512], 200, 512),
        // few rows, deep: the cooperative-matrix kernel (where the
        // adapter has it) splits K in 8
        (&[24, 2048], 70, 2048),
        // long rows: the GEMV kernel with 64 and 128 threads per row
        (&[1, 8192], 6, 8192),
    ];
    for format in QuantFormat::ALL {
        for dtype in DType::FLOATS {
            for kind in [Kind::Contiguous, Kind::Offset, Kind::Transposed] {
                for (xs, n, k) in shapes {
                    if !matches!(kind, Kind::Contiguous) && xs.len() > 2 {
                        continue;
                    }
                    let name = format!("matmul_q {format} {dtype} {kind:?} {xs:?} x [{n}, {k}]");
                    let rows = xs[..xs.len() - 1].iter().product();
                    case(cases, name, quantized(dtype, rows), move |d| {
                        let w = QTensor::random(format, &[n, k], 30, d)?;
                        input(kind, xs, dtype, 31, d)?.matmul_q(&w)
                    });
                }
            }
        }
    }
}

/// `x @ wᵀ` for 17 and 40 rows of f16 x and a weight of 4 M values or
/// more: on a GPU with cooperative matrices, the tiled kernel split along
/// K in 8, on rows and columns that do not fill its tiles (the GEMV chunks
/// elsewhere).
fn qmatmul_narrow_cases(cases: &mut Vec<Case>) {
    for format in [
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q8_0,
        QuantFormat::Q4_K,
        QuantFormat::Q6_K,
    ] {
        // small ones too (the GEMV chunks and the 128-row tiles at odd
        // shapes)
        let k_quant = format.block_elems() == 256;
        let small = if k_quant {
            [(16, 72, 256), (33, 130, 768), (63, 200, 512)]
        } else {
            [(16, 72, 96), (33, 130, 576), (63, 200, 320)]
        };
        // and for the 32-value formats: the narrow kernel's one fragment
        // with a part of K that ends inside a step of 128 (17 rows take
        // its two), and 63 rows on the 128-row tiles
        let more: &[(usize, usize, usize)] = if k_quant {
            &[]
        } else {
            &[(16, 2100, 2016), (63, 2050, 2048)]
        };
        let wide = [(40, 2050, 2048), (17, 2100, 2048)];
        for (m, n, k) in wide.into_iter().chain(small).chain(more.iter().copied()) {
            let name = format!("matmul_q narrow {format} f16 [{m}, {k}] x [{n}, {k}]");
            case(cases, name, quantized(DType::F16, m), move |d| {
                let w = QTensor::random(format, &[n, k], 32, d)?;
                input(Kind::Contiguous, &[m, k], DType::F16, 33, d)?.matmul_q(&w)
            });
        }
    }
}

/// `x @ wᵀ` for 260 and 300 rows of f16 x: on a GPU with cooperative
/// matrices, the weights decoded into f16 first and multiplied on the f16
/// kernels (the quantized tiles elsewhere).
fn qmatmul_decoded_cases(cases: &mut Vec<Case>) {
    for format in QuantFormat::ALL {
        for kind in [Kind::Contiguous, Kind::Offset] {
            for (m, n, k) in [(260, 130, 512), (300, 257, 256)] {
                let name =
                    format!("matmul_q decoded {format} f16 {kind:?} [{m}, {k}] x [{n}, {k}]");
                case(cases, name, quantized(DType::F16, m), move |d| {
                    let w = QTensor::random(format, &[n, k], 34, d)?;
                    input(kind, &[m, k], DType::F16, 35, d)?.matmul_q(&w)
                });
            }
        }
    }
}

/// `residual + x @ wᵀ` in f16 on the products past the GEMV kernels that
/// add the residual as they sum their parts: qmatmul_narrow.wgsl (one and
/// two fragments, K up to 8,192), the quantized tiles split along K (a K-quant), and a
/// prompt's weights decoded for the f16 tiles split along K; the residual
/// contiguous, a transposed view, or contiguous from an odd element.
fn qmatmul_residual_cases(cases: &mut Vec<Case>) {
    // (format, rows of x, output columns, k, the residual: 0 contiguous,
    // 1 transposed, 2 from element 1 of its buffer)
    let shapes = [
        (QuantFormat::Q4_0, 16, 2048, 2048, 0),
        (QuantFormat::Q4_0, 30, 2056, 2048, 2),
        (QuantFormat::Q4_K, 16, 2048, 2048, 1),
        (QuantFormat::Q8_0, 256, 520, 1024, 2),
        // deeper than the 128-row tiles go: K in 32 and 16 parts
        (QuantFormat::Q4_0, 16, 2048, 8192, 0),
        (QuantFormat::Q4_1, 32, 1024, 4096, 1),
    ];
    for (format, m, n, k, layout) in shapes {
        let name =
            format!("matmul_q_fused residual {format} f16 layout {layout} [{m}, {k}] -> {n}");
        case(cases, name, quantized(DType::F16, m), move |d| {
            let w = QTensor::random(format, &[n, k], 46, d)?;
            let x = input(Kind::Contiguous, &[m, k], DType::F16, 47, d)?;
            let r = match layout {
                0 => input(Kind::Contiguous, &[m, n], DType::F16, 48, d)?,
                1 => input(Kind::Transposed, &[m, n], DType::F16, 48, d)?,
                _ => Tensor::randn(&[m * n + 1], DType::F16, 48, d)?
                    .narrow(0, 1, m * n)?
                    .reshape(&[m, n])?,
            };
            let fuse = QFuse {
                residual: Some(&r),
                ..QFuse::default()
            };
            x.matmul_q_fused(&w, fuse)
        });
    }
}

/// `x @ wᵀ + residual` with float weights (`Tensor::linear_add`): up to 32
/// rows (the narrow kernel on adapters with cooperative matrices), a
/// prompt's 256 rows on few tiles (split along K, the residual added by
/// the parts' sum) and a shape that takes neither; the residual
/// contiguous, from an odd element of its buffer, or a transposed view.
fn linear_add_cases(cases: &mut Vec<Case>) {
    // (rows of x, output columns, k, the residual: 0 contiguous, 1
    // transposed, 2 from element 1 of its buffer)
    let shapes = [
        (16, 2048, 2048, 0),
        (30, 520, 1024, 2),
        (256, 512, 1024, 0),
        (256, 520, 1024, 2),
        (130, 136, 64, 1),
    ];
    for dtype in DType::FLOATS {
        for (m, n, k, layout) in shapes {
            let name = format!("linear_add {dtype} layout {layout} [{m}, {k}] -> {n}");
            case(cases, name, quantized(dtype, m), move |d| {
                let x = input(Kind::Contiguous, &[m, k], dtype, 61, d)?;
                let w = input(Kind::Contiguous, &[n, k], dtype, 62, d)?;
                let r = match layout {
                    0 => input(Kind::Contiguous, &[m, n], dtype, 63, d)?,
                    1 => input(Kind::Transposed, &[m, n], dtype, 63, d)?,
                    _ => Tensor::randn(&[m * n + 1], dtype, 63, d)?
                        .narrow(0, 1, m * n)?
                        .reshape(&[m, n])?,
                };
                x.linear_add(&w, &r)
            });
        }
    }
}

/// `residual + swiglu(rms_norm(x) @ wᵀ)` with every subset of the three
/// fusions: one kernel on a GPU for up to 64 rows of x (in chunks of up
/// to 8), separate ops beyond; column counts odd and even (16-bit results of odd
/// width go through an f32 buffer), a residual that is a transposed view.
fn qmatmul_fused_cases(cases: &mut Vec<Case>) {
    // (rows of x, output columns, k)
    let shapes = [
        (1, 34, 256),
        (2, 33, 512),
        (3, 66, 256),
        (6, 10, 256),
        (12, 18, 256),
        // three chunks of 7, 7 and 5 rows
        (19, 34, 256),
        // a prefill: f16 activations enter the product in f16
        (70, 34, 256),
    ];
    for format in [
        QuantFormat::Q4_0,
        QuantFormat::Q8_0,
        QuantFormat::Q4_K,
        QuantFormat::Q6_K,
    ] {
        for dtype in DType::FLOATS {
            // bit 8: the gate is GeGLU's
            for bits in (1..8u32).chain([11, 15]) {
                let (norm, gated, residual) = (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0);
                let geglu = bits & 8 != 0;
                let swiglu = gated && !geglu;
                for (m, n, k) in shapes {
                    let name = format!(
                        "matmul_q_fused {format} {dtype} norm={norm} swiglu={swiglu} geglu={geglu} residual={residual} [{m}, {k}] -> {n}"
                    );
                    case(cases, name, quantized(dtype, m), move |d| {
                        let rows = if gated { 2 * n } else { n };
                        let w = QTensor::random(format, &[rows, k], 40, d)?;
                        let x = input(Kind::Contiguous, &[m, k], dtype, 41, d)?;
                        let g = input(Kind::Offset, &[k], dtype, 42, d)?;
                        let r = input(Kind::Transposed, &[m, n], dtype, 43, d)?;
                        let fuse = QFuse {
                            rms_norm: norm.then_some((&g, 1e-5)),
                            swiglu,
                            geglu,
                            residual: residual.then_some(&r),
                            low_rank: None,
                            low_rank_a: None,
                        };
                        x.matmul_q_fused(&w, fuse)
                    });
                }
            }
        }
    }
    // with a low-rank update added before the SwiGLU, in four of the
    // combinations: u from project_low_rank, or (inside) computed by the
    // product from a, as LoRA runs it
    for format in [QuantFormat::Q4_0, QuantFormat::Q4_K] {
        for dtype in DType::FLOATS {
            for bits in [0u32, 1, 3, 5, 8, 9, 11, 13] {
                let (norm, swiglu, residual) = (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0);
                let inside = bits & 8 != 0;
                for (m, n, k) in shapes {
                    let name = format!(
                        "matmul_q_fused+low_rank {format} {dtype} norm={norm} swiglu={swiglu} residual={residual} inside={inside} [{m}, {k}] -> {n}"
                    );
                    case(cases, name, quantized(dtype, m), move |d| {
                        let rows = if swiglu { 2 * n } else { n };
                        let w = QTensor::random(format, &[rows, k], 40, d)?;
                        let x = input(Kind::Contiguous, &[m, k], dtype, 41, d)?;
                        let g = input(Kind::Offset, &[k], dtype, 42, d)?;
                        let r = input(Kind::Transposed, &[m, n], dtype, 43, d)?;
                        let a = input(Kind::Contiguous, &[5, k], dtype, 44, d)?.mul_scalar(0.1)?;
                        let b = input(Kind::Transposed, &[5, rows], dtype, 45, d)?;
                        let u = x.project_low_rank(&a, norm.then_some(1e-5))?;
                        let fuse = QFuse {
                            rms_norm: norm.then_some((&g, 1e-5)),
                            swiglu,
                            geglu: false,
                            residual: residual.then_some(&r),
                            low_rank: (!inside).then_some((&u, &b)),
                            low_rank_a: inside.then_some((&a, &b)),
                        };
                        x.matmul_q_fused(&w, fuse)
                    });
                }
            }
        }
    }
    // adapters of rank 40 computed by the product: t = 6 threads a sum
    // (not a power of two), more runs of `a` than a thread loads early
    // (K = 768 in f32), two rounds of sums with 16 rows (chunks of 8)
    for dtype in DType::FLOATS {
        for norm in [false, true] {
            for (m, n, k) in [(1, 34, 768), (3, 18, 512), (16, 18, 768)] {
                let name = format!(
                    "matmul_q_fused+low_rank rank 40 {dtype} norm={norm} [{m}, {k}] -> {n}"
                );
                case(cases, name, quantized(dtype, m), move |d| {
                    let w = QTensor::random(QuantFormat::Q4_0, &[n, k], 48, d)?;
                    let x = input(Kind::Contiguous, &[m, k], dtype, 49, d)?;
                    let g = input(Kind::Offset, &[k], dtype, 50, d)?;
                    let a = input(Kind::Contiguous, &[40, k], dtype, 51, d)?.mul_scalar(0.1)?;
                    let b = input(Kind::Contiguous, &[40, n], dtype, 52, d)?;
                    let fuse = QFuse {
                        rms_norm: norm.then_some((&g, 1e-5)),
                        low_rank_a: Some((&a, &b)),
                        ..QFuse::default()
                    };
                    x.matmul_q_fused(&w, fuse)
                });
            }
        }
    }
    for dtype in DType::FLOATS {
        for norm in [false, true] {
            // K = 4,352: more than one round of 8 words a thread; 70: a row
            // that ends inside a thread's words
            for (m, r, k) in [
                (1, 16, 576),
                (3, 5, 64),
                (12, 8, 256),
                (1, 48, 4352),
                (2, 3, 70),
            ] {
                let name = format!("project_low_rank {dtype} norm={norm} [{m}, {k}] -> {r}");
                case(cases, name, quantized(dtype, m), move |d| {
                    let x = input(Kind::Contiguous, &[m, k], dtype, 46, d)?;
                    let a = input(Kind::Transposed, &[r, k], dtype, 47, d)?;
                    x.project_low_rank(&a, norm.then_some(1e-5))
                });
            }
        }
    }
}

fn data_movement_cases(cases: &mut Vec<Case>) {
    for from in DType::ALL {
        for to in DType::ALL {
            for kind in [Kind::Contiguous, Kind::Transposed, Kind::Offset] {
                let name = format!("to_dtype {from}->{to} {kind:?}");
                case(cases, name, tol(to), move |d| {
                    let x = input(kind, &[7, 13], from, 14, d)?;
                    // keep float values in the range every dtype holds
                    let x = if from.is_float() {
                        x.mul_scalar(100.0)?
                    } else {
                        x
                    };
                    x.to_dtype(to)
                });
            }
        }
    }
    for dtype in DType::ALL {
        for kind in KINDS {
            for shape in SHAPES {
                let name = format!("contiguous {dtype} {kind:?} {shape:?}");
                case(cases, name, tol(dtype), move |d| {
                    input(kind, shape, dtype, 15, d)?.copy()
                });
            }
            for (axis, sizes) in [
                (0isize, [3usize, 1, 4]),
                (1, [1, 3, 2]),
                (-1, [5, 3, 1]),
                (-1, [0, 3, 2]),
            ] {
                let name = format!("cat {dtype} {kind:?} axis {axis} {sizes:?}");
                case(cases, name, tol(dtype), move |d| {
                    let parts: Vec<Tensor> = sizes
                        .iter()
                        .enumerate()
                        .map(|(i, &n)| {
                            let mut shape = vec![3, 5, 7];
                            let ax = if axis < 0 { 2 } else { axis as usize };
                            shape[ax] = n;
                            input(kind, &shape, dtype, 16 + i as u64, d)
                        })
                        .collect::<Result<_>>()?;
                    let refs: Vec<&Tensor> = parts.iter().collect();
                    Tensor::cat(&refs, axis)
                });
            }
            for idx_dtype in [DType::U32, DType::I64] {
                for axis in [0isize, 1, -1] {
                    let name = format!("index_select {dtype} {kind:?} axis {axis} idx {idx_dtype}");
                    case(cases, name, tol(dtype), move |d| {
                        let src = input(kind, &[6, 5, 7], dtype, 20, d)?;
                        let idx = Tensor::from_slice(&[4i64, 0, 4, 2, 1], &[5], d)?
                            .to_dtype(idx_dtype)?;
                        src.index_select(axis, &idx)
                    });
                }
            }
        }
    }
}

fn all_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    unary_cases(&mut cases);
    binary_cases(&mut cases);
    reduce_cases(&mut cases);
    matmul_cases(&mut cases);
    linear_cases(&mut cases);
    forced_matmul_cases(&mut cases);
    qmatmul_cases(&mut cases);
    qmatmul_narrow_cases(&mut cases);
    linear_add_cases(&mut cases);
    qmatmul_decoded_cases(&mut cases);
    qmatmul_fused_cases(&mut cases);
    qmatmul_residual_cases(&mut cases);
    data_movement_cases(&mut cases);
    nn_cases(&mut cases);
    cached_attention_cases(&mut cases);
    windowed_attention_cases(&mut cases);
    batched_attention_cases(&mut cases);
    head_norm_cases(&mut cases);
    cases
}

/// Qwen3's head norms of a packed QKV tensor: one kernel for f32 and f16
/// (heads of even size), the composed ops for bf16 and odd heads; strided
/// inputs are made contiguous first.
fn head_norm_cases(cases: &mut Vec<Case>) {
    // (positions, query heads, key heads, value heads, head size, input kind)
    let shapes = [
        (1usize, 4usize, 2usize, 2usize, 64usize, Kind::Contiguous),
        (5, 8, 2, 2, 128, Kind::Contiguous),
        (3, 2, 1, 1, 6, Kind::Contiguous),
        (2, 2, 2, 2, 7, Kind::Contiguous),
        (4, 4, 2, 2, 32, Kind::Offset),
        (1, 2, 1, 0, 256, Kind::Contiguous),
    ];
    for dtype in DType::FLOATS {
        for (t, h, kvh, vh, hd, kind) in shapes {
            let name = format!("head_norm {dtype} t{t} h{h}/{kvh}/{vh} d{hd} {kind:?}");
            case(cases, name, accumulating(dtype), move |d| {
                let x = input(kind, &[t, h + kvh + vh, hd], dtype, 61, d)?;
                let qw = input(Kind::Contiguous, &[hd], dtype, 62, d)?;
                let kw = input(Kind::Contiguous, &[hd], dtype, 63, d)?;
                x.head_norm(&qw, &kw, h, kvh, 1e-6)
            });
        }
    }
}

/// Angle tables `[t, half]` for rotary embeddings (f32, as the op requires).
fn rope_tables(t: usize, half: usize, dev: &Device) -> Result<(Tensor, Tensor)> {
    let angles: Vec<f32> = (0..t * half)
        .map(|i| (i / half) as f32 * 10_000f32.powf(-((i % half) as f32) / half as f32))
        .collect();
    let a = Tensor::from_vec(angles, &[t, half], &Device::cpu())?;
    Ok((a.cos()?.to_device(dev)?, a.sin()?.to_device(dev)?))
}

fn nn_cases(cases: &mut Vec<Case>) {
    // rows that start 8 elements into rows of 1040: whole vec4 words for
    // every dtype, but not contiguous
    for dtype in DType::FLOATS {
        let rows = move |d: &Device| -> Result<Tensor> {
            Tensor::randn(&[3, 1040], dtype, 31, d)?.narrow(-1, 8, 1024)
        };
        let param = move |seed: u64, d: &Device| Tensor::randn(&[1024], dtype, seed, d);
        for log in [false, true] {
            let name = format!("softmax log={log} {dtype} sliced aligned rows");
            case(cases, name, tol(dtype), move |d| {
                let x = rows(d)?;
                if log {
                    x.log_softmax(-1)
                } else {
                    x.softmax(-1)
                }
            });
        }
        let name = format!("rms_norm {dtype} sliced aligned rows");
        case(cases, name, accumulating(dtype), move |d| {
            rows(d)?.rms_norm(&param(32, d)?, 1e-5)
        });
        let name = format!("layer_norm {dtype} sliced aligned rows");
        case(cases, name, accumulating(dtype), move |d| {
            rows(d)?.layer_norm(&param(32, d)?, &param(33, d)?, 1e-12)
        });
    }
    use silica::{AttentionOpts, RopeStyle};
    // in-place writes: word-aligned runs go through a copy kernel, 16-bit
    // runs at odd offsets through the host; a shared storage is copied first
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::U32, DType::I64] {
        for (rows, width, start, n) in
            [(5usize, 3usize, 1usize, 2usize), (6, 4, 2, 3), (4, 3, 0, 4)]
        {
            for kind in [Kind::Contiguous, Kind::Transposed, Kind::Offset] {
                let name =
                    format!("slice_assign {dtype} {kind:?} [{rows}, {width}] at {start} <- {n}");
                case(cases, name, tol(dtype), move |d| {
                    let base = input(Kind::Contiguous, &[rows, width], dtype, 18, d)?;
                    let mut dst = base.copy()?;
                    dst.slice_assign(start, &input(kind, &[n, width], dtype, 19, d)?)?;
                    let mut shared = base.clone();
                    shared.slice_assign(0, &dst.narrow(0, 0, 1)?)?;
                    // `base` must be unchanged by the write through its clone
                    Tensor::cat(&[&dst, &shared, &base], 0)
                });
            }
        }
    }
    for dtype in DType::FLOATS {
        for kind in KINDS {
            for shape in [
                &[1usize, 7, 13][..],
                &[65, 67],
                &[3, 300],
                &[2, 576],
                &[4, 1],
                &[3, 8200],
                &[2, 3, 1024],
            ] {
                let n = *shape.last().unwrap_or(&1);
                let name = format!("rms_norm {dtype} {kind:?} {shape:?}");
                case(cases, name, accumulating(dtype), move |d| {
                    let w = input(Kind::Contiguous, &[n], dtype, 11, d)?;
                    input(kind, shape, dtype, 10, d)?.rms_norm(&w, 1e-5)
                });
                // one kernel where the rows and the residual are whole
                // words (every kind but the transposed one, at 300 and 576
                // and past), composed otherwise
                let name = format!("rms_norm_add {dtype} {kind:?} {shape:?}");
                case(cases, name, accumulating(dtype), move |d| {
                    let w = input(Kind::Contiguous, &[n], dtype, 11, d)?;
                    let r = input(Kind::Contiguous, shape, dtype, 16, d)?;
                    input(kind, shape, dtype, 10, d)?.rms_norm_add(&w, 1e-5, &r)
                });
                let name = format!("layer_norm {dtype} {kind:?} {shape:?}");
                case(cases, name, accumulating(dtype), move |d| {
                    let w = input(Kind::Contiguous, &[n], dtype, 12, d)?;
                    let b = input(Kind::Contiguous, &[n], dtype, 13, d)?;
                    input(kind, shape, dtype, 10, d)?.layer_norm(&w, &b, 1e-12)
                });
            }
            // [T, H, D] and [B, T, H, D]
            for shape in [&[5usize, 3, 8][..], &[1, 9, 64], &[2, 7, 2, 6]] {
                for style in [RopeStyle::Adjacent, RopeStyle::Half] {
                    let name = format!("rope {style:?} {dtype} {kind:?} {shape:?}");
                    case(cases, name, tol(dtype), move |d| {
                        let r = shape.len();
                        // tables for more positions, of which the op reads rows 2..
                        let t = shape[r - 3];
                        let (cos, sin) = rope_tables(t + 2, shape[r - 1] / 2, d)?;
                        let (cos, sin) = (cos.narrow(0, 2, t)?, sin.narrow(0, 2, t)?);
                        input(kind, shape, dtype, 14, d)?.rope(&cos, &sin, style)
                    });
                    // the first heads rotated, the rest copied (packed QKV)
                    let name = format!("rope_heads {style:?} {dtype} {kind:?} {shape:?}");
                    case(cases, name, tol(dtype), move |d| {
                        let r = shape.len();
                        let t = shape[r - 3];
                        let (cos, sin) = rope_tables(t, shape[r - 1] / 2, d)?;
                        let x = input(kind, shape, dtype, 15, d)?;
                        x.rope_heads(&cos, &sin, style, shape[r - 2] / 2 + 1)
                    });
                }
            }
        }
        // (batch, tq, tk, heads, kv heads, head size, causal, mask)
        type Shape = (usize, usize, usize, usize, usize, usize, bool, bool);
        // up to 4 queries: split-K decoding (keys in chunks of 256); more:
        // the flash kernel (blocks of 32 queries, key tiles of 16 or 32), or
        // for f16 on cooperative matrices (16+ queries, 32+ keys, head sizes
        // that are multiples of 16, views that start rows on 16 bytes: the
        // contiguous and permuted kinds) blocks of 64 queries, key tiles of
        // 32, the last ones moved back; head sizes over 128: the row kernel
        let shapes: [Shape; 23] = [
            (0, 1, 1, 1, 1, 2, false, false),
            (0, 7, 7, 4, 2, 8, true, false),
            (0, 1, 130, 9, 3, 64, true, false),
            (0, 5, 70, 2, 2, 130, true, false),
            (0, 3, 3, 2, 1, 256, false, false),
            (2, 6, 6, 4, 4, 32, false, true),
            (2, 65, 65, 2, 1, 16, true, true),
            (1, 2, 9, 6, 2, 128, true, false),
            (3, 1, 1, 2, 2, 4, false, true),
            (1, 5, 5, 2, 2, 128, true, false),
            (1, 37, 37, 4, 2, 64, true, false),
            (2, 40, 75, 2, 2, 128, true, true),
            (1, 33, 50, 3, 1, 80, false, true),
            (0, 20, 20, 2, 2, 6, true, false),
            (1, 1, 1, 4, 4, 128, true, false),
            (1, 1, 4099, 4, 2, 128, true, true),
            (2, 3, 600, 4, 4, 64, true, false),
            (0, 4, 513, 8, 2, 80, false, true),
            (2, 4, 4, 2, 1, 96, true, true),
            (1, 100, 100, 4, 2, 64, true, false),
            (2, 70, 130, 2, 1, 128, true, true),
            (0, 64, 64, 2, 2, 32, false, false),
            (2, 80, 80, 2, 2, 64, true, true),
        ];
        // and one case of sharp scores (scale 3 instead of 1/sqrt(d)): rows
        // whose later key tiles outscore their first ones by far, so that
        // the cooperative kernel must rescale its accumulators
        let sharp = (1, 200, 200, 2, 1, 64, true, false);
        let all = shapes.iter().map(|s| (*s, false)).chain([(sharp, true)]);
        for ((b, tq, tk, h, kvh, hd, causal, masked), sharp) in all {
            let kinds = [
                Kind::Contiguous,
                Kind::Transposed,
                Kind::Offset,
                Kind::Permuted,
            ];
            for kind in kinds {
                let name = format!(
                    "attention {dtype} {kind:?} b{b} tq{tq} tk{tk} h{h}/{kvh} d{hd} causal {causal} mask {masked}{}",
                    if sharp { " sharp" } else { "" }
                );
                case(cases, name, accumulating(dtype), move |d| {
                    let lead = |t: usize, heads: usize| -> Vec<usize> {
                        if b == 0 {
                            vec![t, heads, hd]
                        } else {
                            vec![b, t, heads, hd]
                        }
                    };
                    let q = input(kind, &lead(tq, h), dtype, 15, d)?;
                    let k = input(kind, &lead(tk, kvh), dtype, 16, d)?;
                    // v strided in two kinds, of q's kind in the others
                    let vkind = match kind {
                        Kind::Contiguous | Kind::Permuted => kind,
                        _ => Kind::Offset,
                    };
                    let v = input(vkind, &lead(tk, kvh), dtype, 17, d)?;
                    // a padding mask: the first and the last key of every
                    // other batch row hidden (so that with a causal mask the
                    // first query of those rows sees no key: NaN)
                    let mask = if masked {
                        let bb = b.max(1);
                        let m: Vec<f32> = (0..bb * tk)
                            .map(|i| {
                                if (i % tk == tk - 1 || i % tk == 0) && (i / tk) % 2 == 1 {
                                    f32::NEG_INFINITY
                                } else {
                                    0.0
                                }
                            })
                            .collect();
                        Some(
                            Tensor::from_vec(m, &[bb, 1, 1, tk], &Device::cpu())?
                                .to_dtype(dtype)?
                                .to_device(d)?,
                        )
                    } else {
                        None
                    };
                    let opts = AttentionOpts {
                        scale: if sharp { 3.0 } else { 1.0 / (hd as f32).sqrt() },
                        causal,
                    };
                    q.attention(&k, &v, mask.as_ref(), opts)
                });
            }
        }
    }
}

/// `cached_attention`: on a GPU a single new position with a head size that
/// is a multiple of 8 (up to 128) and contiguous operands runs as one
/// kernel, anything else as rope, slice_assign and attention. The kernel
/// is the subgroup one where a head's 16-byte chunks fit a subgroup and
/// number a power of two (on lavapipe, 8 lanes wide: f32 heads of 8, 16,
/// 32, 16-bit heads of 16, 32, 64), otherwise the split one (two kernels
/// once the keys span several chunks of 256). Past 512 keys the subgroup
/// kernel splits the keys too (chunks of 512 or more), and a merge pass
/// follows. Each case returns the attention and
/// the whole cache after the step, side by side, so that the rows written
/// (and those that must stay as they were) are compared too.
fn cached_attention_cases(cases: &mut Vec<Case>) {
    use silica::RopeStyle::{Adjacent, Half};
    // (new positions, start, capacity, query heads, KV heads, head size,
    // style, the cache a strided view, the cache shared with a clone)
    type Step = (
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        silica::RopeStyle,
        bool,
        bool,
    );
    let steps: [Step; 15] = [
        (1, 0, 4, 2, 1, 8, Half, false, false),
        (1, 100, 128, 8, 2, 64, Half, false, false),
        (1, 700, 800, 4, 2, 64, Half, false, false),
        (1, 255, 256, 4, 1, 32, Half, false, false),
        (1, 7, 9, 4, 2, 64, Adjacent, false, false),
        (1, 255, 300, 2, 2, 128, Half, false, false),
        (1, 256, 300, 2, 1, 64, Adjacent, false, false),
        (1, 300, 301, 3, 1, 32, Half, false, true),
        (1, 9, 12, 2, 2, 16, Adjacent, true, false),
        (1, 5, 8, 2, 1, 6, Half, false, false),
        (1, 3, 6, 2, 1, 144, Adjacent, false, false),
        (3, 4, 10, 4, 2, 16, Adjacent, false, false),
        (2, 255, 260, 2, 1, 32, Half, false, false),
        // long caches: the subgroup kernel in 9 and 10 chunks a head
        (1, 4500, 4600, 4, 2, 64, Half, false, false),
        (1, 5119, 5120, 2, 2, 32, Adjacent, false, false),
    ];
    for dtype in DType::FLOATS {
        for (t, start, cap, h, kvh, hd, style, strided, shared) in steps {
            let name = format!(
                "cached_attention {dtype} t{t} at {start} of {cap} h{h}/{kvh} d{hd} {style:?} strided {strided} shared {shared}"
            );
            case(cases, name, accumulating(dtype), move |d| {
                let qkv = Tensor::randn(&[t, h + 2 * kvh, hd], dtype, 41, d)?;
                let kind = if strided {
                    Kind::Offset
                } else {
                    Kind::Contiguous
                };
                let mut cache = input(kind, &[cap, 2 * kvh, hd], dtype, 42, d)?;
                let before = cache.clone();
                let (cos, sin) = rope_tables(start + t, hd / 2, d)?;
                let (cos, sin) = (cos.narrow(0, start, t)?, sin.narrow(0, start, t)?);
                let scale = 1.0 / (hd as f32).sqrt();
                let out = qkv.cached_attention(&mut cache, start, (&cos, &sin, style), h, scale)?;
                let mut parts = vec![
                    out.reshape(&[t * h * hd])?,
                    cache.reshape(&[cap * 2 * kvh * hd])?,
                ];
                if shared {
                    // the clone taken before the step must not see it
                    parts.push(before.reshape(&[cap * 2 * kvh * hd])?);
                }
                let refs: Vec<&Tensor> = parts.iter().collect();
                Tensor::cat(&refs, 0)
            });
        }
    }
}

/// `cached_attention_with` a sliding window and soft-capped scores
/// (Gemma's): a single new position stays one kernel on a GPU, which reads
/// only the window's rows of the cache; several positions compose with a
/// mask. Head sizes up to 256 (Gemma 3's) run on the step kernels, split
/// into chunks past 256 keys.
fn windowed_attention_cases(cases: &mut Vec<Case>) {
    use silica::RopeStyle::{Adjacent, Half};
    // (new positions, start, capacity, query heads, KV heads, head size,
    // style, window, soft cap)
    type Step = (
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        silica::RopeStyle,
        Option<usize>,
        Option<f32>,
    );
    let steps: [Step; 8] = [
        (1, 20, 32, 2, 1, 64, Half, Some(8), None),
        (1, 600, 700, 4, 1, 256, Half, Some(512), None),
        (1, 30, 40, 4, 2, 32, Adjacent, None, Some(0.5)),
        (1, 300, 400, 2, 1, 128, Half, Some(100), Some(1.0)),
        (1, 900, 1000, 2, 1, 256, Half, None, None),
        (1, 5, 8, 2, 1, 16, Half, Some(64), Some(2.0)),
        (3, 10, 16, 2, 1, 16, Half, Some(4), Some(2.0)),
        (2, 5, 8, 2, 1, 16, Adjacent, Some(4), None),
    ];
    for dtype in DType::FLOATS {
        for (t, start, cap, h, kvh, hd, style, window, softcap) in steps {
            let name = format!(
                "cached_attention_with {dtype} t{t} at {start} of {cap} h{h}/{kvh} d{hd} {style:?} window {window:?} softcap {softcap:?}"
            );
            case(cases, name, accumulating(dtype), move |d| {
                let qkv = Tensor::randn(&[t, h + 2 * kvh, hd], dtype, 43, d)?;
                let mut cache = Tensor::randn(&[cap, 2 * kvh, hd], dtype, 44, d)?;
                let (cos, sin) = rope_tables(start + t, hd / 2, d)?;
                let (cos, sin) = (cos.narrow(0, start, t)?, sin.narrow(0, start, t)?);
                let opts = silica::CachedAttentionOpts {
                    scale: 1.0 / (hd as f32).sqrt(),
                    window,
                    softcap,
                };
                let out =
                    qkv.cached_attention_with(&mut cache, start, (&cos, &sin, style), h, opts)?;
                Tensor::cat(
                    &[
                        &out.reshape(&[t * h * hd])?,
                        &cache.reshape(&[cap * 2 * kvh * hd])?,
                    ],
                    0,
                )
            });
        }
    }
}

/// `cached_attention_batch`: sequences whose caches are runs of rows of
/// one pooled tensor, each at its own position. One new position each is
/// one kernel on a GPU where the subgroup step kernel runs (16-bit heads
/// of 64 on lavapipe), with chunks of keys past 512; a step with a
/// prompt's rows composes each sequence. The output and the whole pool are
/// compared, so a sequence that wrote outside its rows would show.
fn batched_attention_cases(cases: &mut Vec<Case>) {
    use silica::RopeStyle::{Adjacent, Half};
    // (sequences as (new rows, start), rows a slot, head size, style, window)
    type Batch = (
        &'static [(usize, usize)],
        usize,
        usize,
        silica::RopeStyle,
        Option<usize>,
    );
    let batches: [Batch; 5] = [
        (&[(1, 0), (1, 5), (1, 17)], 32, 64, Half, None),
        (
            &[(1, 3), (1, 30), (1, 9), (1, 0)],
            40,
            32,
            Adjacent,
            Some(8),
        ),
        (&[(1, 600), (1, 20)], 700, 64, Half, None),
        (&[(3, 4), (1, 7)], 16, 64, Half, None),
        (&[(1, 12), (2, 10)], 16, 16, Adjacent, Some(4)),
    ];
    for dtype in DType::FLOATS {
        for (seqs, slot, hd, style, window) in batches {
            let name = format!(
                "cached_attention_batch {dtype} {seqs:?} slots of {slot} d{hd} {style:?} window {window:?}"
            );
            case(cases, name, accumulating(dtype), move |d| {
                let (h, kvh) = (4, 2);
                let rows: usize = seqs.iter().map(|s| s.0).sum();
                let qkv = Tensor::randn(&[rows, h + 2 * kvh, hd], dtype, 47, d)?;
                let pool_rows = slot * seqs.len();
                let mut pool = Tensor::randn(&[pool_rows, 2 * kvh, hd], dtype, 48, d)?;
                let longest = seqs.iter().map(|s| s.0 + s.1).max().unwrap_or(1);
                let (cos, sin) = rope_tables(longest, hd / 2, d)?;
                // each row's angles: its sequence's positions
                let mut positions = Vec::new();
                let mut list = Vec::new();
                for (i, &(len, start)) in seqs.iter().enumerate() {
                    positions.extend((start..start + len).map(|p| p as u32));
                    list.push(silica::CacheSeq {
                        len,
                        base: i * slot,
                        start,
                    });
                }
                let at = Tensor::from_vec(positions, &[rows], d)?;
                let (cos, sin) = (cos.index_select(0, &at)?, sin.index_select(0, &at)?);
                let table = silica::CacheSeqs::new(&list, window, d)?;
                let opts = silica::CachedAttentionOpts {
                    scale: 1.0 / (hd as f32).sqrt(),
                    window,
                    softcap: None,
                };
                let out =
                    qkv.cached_attention_batch(&mut pool, &table, (&cos, &sin, style), h, opts)?;
                Tensor::cat(
                    &[
                        &out.reshape(&[rows * h * hd])?,
                        &pool.reshape(&[pool_rows * 2 * kvh * hd])?,
                    ],
                    0,
                )
            });
        }
    }
}

/// Compares one device's result with the CPU's; a message on mismatch.
fn compare(c: &Case, want: &Tensor, got: &Tensor) -> std::result::Result<(), String> {
    if want.shape() != got.shape() || want.dtype() != got.dtype() {
        return Err(format!(
            "shape/dtype {:?} {} vs CPU {:?} {}",
            got.shape(),
            got.dtype(),
            want.shape(),
            want.dtype()
        ));
    }
    let w = want.to_f64_vec().map_err(|e| e.to_string())?;
    let g = got.to_f64_vec().map_err(|e| e.to_string())?;
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = (a.is_nan() && b.is_nan())
            || a == b
            || (a - b).abs() <= c.tol.atol + c.tol.rtol * b.abs();
        if !ok {
            return Err(format!(
                "element {i}: got {a}, CPU {b} (tolerance {:?})",
                c.tol
            ));
        }
    }
    Ok(())
}

#[test]
fn every_op_matches_the_cpu_on_every_gpu() {
    // the CPU is the reference here: its exact path, not the 8-bit
    // activations its Q4_0/Q4_1/Q8_0 products use by default (their error,
    // up to Σ|w|·amax(x)/254 per output, exceeds these tolerances)
    silica::set_cpu_int8_activations(false);
    let devices = common::gpu_devices();
    // and the GPUs' exact decode products (tests/quant.rs checks their
    // 8-bit ones, the default through Vulkan, against the same bound)
    for dev in &devices {
        if let Device::Gpu(g) = dev {
            g.set_int8_activations(false);
        }
    }
    let mut cases = all_cases();
    // SILICA_PARITY_FILTER=attention: only the cases whose name contains it
    if let Ok(f) = std::env::var("SILICA_PARITY_FILTER") {
        cases.retain(|c| c.name.contains(f.as_str()));
    }
    // the CPU side of every case must run (and is the reference)
    let reference: Vec<Tensor> = cases
        .iter()
        .map(|c| (c.run)(&Device::cpu()).unwrap_or_else(|e| panic!("{} on the CPU: {e}", c.name)))
        .collect();
    let mut failures = Vec::new();
    for dev in &devices {
        let mut ran = 0;
        for (c, want) in cases.iter().zip(&reference) {
            match (c.run)(dev) {
                Ok(got) => {
                    if let Err(msg) = compare(c, want, &got) {
                        failures.push(format!("{dev}: {}: {msg}", c.name));
                    }
                }
                Err(e) => failures.push(format!("{dev}: {}: {e}", c.name)),
            }
            ran += 1;
        }
        if let Device::Gpu(g) = dev {
            let fallbacks = g.fallback_report();
            eprintln!("{dev}: {ran} GPU parity cases run; CPU fallbacks: {fallbacks:?}");
        }
    }
    for f in failures.iter().take(40) {
        eprintln!("FAIL {f}");
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed",
        failures.len(),
        cases.len() * devices.len()
    );
}
