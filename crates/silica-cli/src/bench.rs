//! `silica bench`: the kernels transformers spend their time in, on fixed
//! shapes (the projections of 135M, 1B and 7B Llama models at decode and at
//! a 512-token prefill, square matmuls, rows of norms and softmax,
//! attention, and `x @ wᵀ` with quantized weights at 1B/7B decode and 1B
//! prefill), plus the dispatch cost of small ops and a device-to-device
//! copy as the bandwidth yardstick.
//!
//! The decode products (one row of x) cycle through 256 MiB of copies of
//! their weight, one copy a call, so that their GB/s are those of weights
//! read from memory as in a decode step, not from the GPU's cache.
//!
//! Times are per call, averaged over enough calls to fill about
//! `--seconds` in one command stream, after 0.4 s of warm-up (at most
//! `--seconds`: a GPU that idled runs at its idle clock at first). On a GPU with
//! timestamp queries the figure is GPU time between a timestamp before the
//! loop and one after it (as PyTorch's CUDA events around the same loop);
//! the wall-clock time with the device synchronized is shown beside it. `--json` writes one object per case, which
//! `benchmarks/torch_kernels.py` reads to run the same shapes through
//! PyTorch and print both side by side.

use std::fmt::Write as _;
use std::time::Instant;

use silica::{AttentionOpts, DType, Device, QFuse, QTensor, QuantFormat, RopeStyle, Tensor};

use crate::{CliError, emit};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// cpu, gpu, gpu:N, ... [default: SILICA_DEVICE, else the best GPU, else the CPU]
    #[arg(long, value_name = "SEL")]
    device: Option<String>,
    /// Element type of the operands: f32, f16 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Only the cases whose name contains this text.
    #[arg(long, value_name = "TEXT")]
    filter: Option<String>,
    /// Time spent measuring each case, in seconds.
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true, value_parser = parse_seconds)]
    seconds: f64,
    /// Also the large cases (8192³ matmul, 4096² rows): slow on a CPU.
    #[arg(long)]
    large: bool,
    /// One JSON object per case instead of a table.
    #[arg(long)]
    json: bool,
    /// Every matmul on a GPU through this kernel, where it applies (for
    /// kernel work): matmul, matmul_big, matmul_coop, matmul_coop_sg4,
    /// matmul_coop_vec, matmul_coop_wide, matmul_narrow or gemv.
    #[arg(long, value_name = "KERNEL", value_parser = parse_matmul_kernel)]
    matmul_kernel: Option<&'static str>,
    /// MiB of weight copies that the decode products cycle through, so
    /// that each call reads its weight from memory [default: 256].
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    cold_mib: Option<u64>,
}

/// The matmul kernels `--matmul-kernel` takes.
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

fn parse_matmul_kernel(s: &str) -> Result<&'static str, String> {
    MATMUL_KERNELS
        .iter()
        .find(|k| **k == s)
        .copied()
        .ok_or_else(|| format!("one of {}", MATMUL_KERNELS.join(", ")))
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err("expected a number of seconds above 0".to_string()),
    }
}

/// What a case computes, with the dimensions the peer script needs.
#[derive(Clone, Debug)]
enum Kind {
    /// `x [m, k] @ w [n, k]ᵀ`, the weight stored row-major as in checkpoints.
    /// With `cold`, see [`COLD_BYTES`].
    Linear {
        m: usize,
        n: usize,
        k: usize,
        cold: bool,
    },
    /// `x [m, k] @ w [n, k]ᵀ` with `w` quantized (blocks decoded in the
    /// kernel); its GB/s count the quantized bytes. With `cold`, see
    /// [`COLD_BYTES`].
    QLinear {
        format: QuantFormat,
        m: usize,
        n: usize,
        k: usize,
        cold: bool,
    },
    /// `layers` products `x ← x @ w_iᵀ` in a row, one vector x and square
    /// quantized weights [n, n], each its own matrix: the weights are read
    /// cold (more bytes than a GPU's cache) and each product waits for the
    /// one before, as in decode. Times are per product.
    QChain {
        format: QuantFormat,
        n: usize,
        layers: usize,
    },
    /// A LoRA adapter's product `x @ wᵀ + (x @ aᵀ) @ bᵀ` over a quantized
    /// weight `w [n, k]`, `a [rank, k]`, `b [n, rank]` (the adapter's scale
    /// folded into `b`): the low-rank projection, then the product with the
    /// update added in its kernel where the device fuses it (decode).
    Lora {
        format: QuantFormat,
        m: usize,
        n: usize,
        k: usize,
        rank: usize,
        cold: bool,
    },
    /// `a [m, k] @ b [k, n]`.
    Matmul {
        m: usize,
        n: usize,
        k: usize,
    },
    Softmax {
        rows: usize,
        n: usize,
    },
    RmsNorm {
        rows: usize,
        n: usize,
    },
    LayerNorm {
        rows: usize,
        n: usize,
    },
    Add {
        rows: usize,
        n: usize,
    },
    SwiGlu {
        rows: usize,
        n: usize,
    },
    Rope {
        t: usize,
        h: usize,
        d: usize,
    },
    /// `q [tq, h, d]` over `k, v [tk, kvh, d]`.
    Attention {
        tq: usize,
        tk: usize,
        h: usize,
        kvh: usize,
        d: usize,
        causal: bool,
    },
    /// A contiguous copy of `n` elements (reads and writes them once).
    Copy {
        n: usize,
    },
}

struct Case {
    name: String,
    kind: Kind,
}

fn cases(large: bool, cpu: bool) -> Vec<Case> {
    let mut v = Vec::new();
    let mut push = |name: String, kind: Kind| v.push(Case { name, kind });
    // (model, d_model, ffn) of Llama-shaped models (SmolLM2-135M, Llama 3.2 1B, Llama 2 7B) and
    // of all-MiniLM-L6-v2, whose products have the same three shapes
    for (model, d, ffn) in [
        ("135m", 576, 1536),
        ("1b", 2048, 8192),
        ("7b", 4096, 11008),
        ("minilm", 384, 1536),
    ] {
        for m in [1, 512] {
            if m == 512 && cpu && model == "7b" {
                continue;
            }
            let phase = if m == 1 { "decode" } else { "prefill512" };
            for (proj, n, k) in [("qkv/o", d, d), ("up", ffn, d), ("down", d, ffn)] {
                push(
                    format!("linear {model} {phase} {proj} {m}x{n}x{k}"),
                    Kind::Linear {
                        m,
                        n,
                        k,
                        cold: m == 1,
                    },
                );
            }
        }
    }
    // quantized weights at 135M, 1B and 7B decode, and 1B and Llama 3 8B prefill
    for format in [
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q5_0,
        QuantFormat::Q8_0,
        QuantFormat::Q4_K,
        QuantFormat::Q5_K,
        QuantFormat::Q6_K,
    ] {
        for (model, d, ffn, vocab, ms) in [
            ("135m", 576, 1536, 49152, &[1][..]),
            ("1b", 2048, 8192, 128_256, &[1, 512][..]),
            ("7b", 4096, 11008, 32000, &[1][..]),
            ("8b", 4096, 14336, 128_256, &[512][..]),
        ] {
            for &m in ms {
                let phase = if m == 1 { "decode" } else { "prefill512" };
                // the LM head at decode (SmolLM2's and Llama 3.2 1B's is
                // their tied embedding): the largest product of a token
                let head = (m == 1).then_some(("head", vocab, d));
                let projs = [("qkv/o", d, d), ("up", ffn, d), ("down", d, ffn)];
                for (proj, n, k) in projs.into_iter().chain(head) {
                    if k % format.block_elems() != 0 {
                        continue; // K-quant blocks of 256 do not tile 576
                    }
                    push(
                        format!("qlinear {format} {model} {phase} {proj} {m}x{n}x{k}"),
                        Kind::QLinear {
                            format,
                            m,
                            n,
                            k,
                            cold: m == 1,
                        },
                    );
                }
            }
        }
    }
    // a server's steps of many sequences and short prompts: 2 to 128 rows
    // of x on SmolLM2's and Llama 3.2 1B's products, weights read from
    // memory as in a model's step
    for (format, model, d, ffn) in [
        (QuantFormat::Q4_1, "135m", 576, 1536),
        (QuantFormat::Q4_0, "1b", 2048, 8192),
    ] {
        for m in [2, 4, 8, 16, 32, 64, 128] {
            for (proj, n, k) in [("qkv/o", d, d), ("up", ffn, d), ("down", d, ffn)] {
                push(
                    format!("qlinear {format} {model} rows{m} {proj} {m}x{n}x{k}"),
                    Kind::QLinear {
                        format,
                        m,
                        n,
                        k,
                        cold: true,
                    },
                );
            }
        }
    }
    // LoRA products at SmolLM2's and Llama 3.2 1B's attention projection
    for (model, d) in [("135m", 576), ("1b", 2048)] {
        for m in [1, 512] {
            let phase = if m == 1 { "decode" } else { "prefill512" };
            for rank in [8, 16, 64] {
                let format = QuantFormat::Q4_0;
                push(
                    format!("lora {format} {model} {phase} qkv/o {m}x{d}x{d} r{rank}"),
                    Kind::Lora {
                        format,
                        m,
                        n: d,
                        k: d,
                        rank,
                        cold: m == 1,
                    },
                );
            }
        }
    }
    // softmax and RMSNorm rows at the same models' widths
    for (model, d) in [("135m", 576), ("1b", 2048)] {
        for r in [1, 512] {
            push(
                format!("softmax {model} {r}x{d}"),
                Kind::Softmax { rows: r, n: d },
            );
            push(
                format!("rms_norm {model} {r}x{d}"),
                Kind::RmsNorm { rows: r, n: d },
            );
        }
    }
    if !cpu {
        for format in [QuantFormat::Q4_0, QuantFormat::Q8_0] {
            let (n, layers) = (2048, 64);
            push(
                format!("qlinear {format} 1b decode chain of {layers} 1x{n}x{n}"),
                Kind::QChain { format, n, layers },
            );
        }
    }
    let mut squares = vec![1024];
    if !cpu || large {
        squares.push(4096);
    }
    if large {
        squares.push(8192);
    }
    for s in squares {
        push(format!("matmul {s}^3"), Kind::Matmul { m: s, n: s, k: s });
        // the same product against a weight stored [N, K], as a checkpoint stores it
        push(
            format!("linear {s}^3"),
            Kind::Linear {
                m: s,
                n: s,
                k: s,
                cold: false,
            },
        );
    }
    let mut rows = vec![1, 512];
    if !cpu || large {
        rows.push(4096);
    }
    for r in rows {
        let n = 4096;
        push(format!("softmax {r}x{n}"), Kind::Softmax { rows: r, n });
        push(format!("rms_norm {r}x{n}"), Kind::RmsNorm { rows: r, n });
        push(
            format!("layer_norm {r}x{n}"),
            Kind::LayerNorm { rows: r, n },
        );
        push(format!("add {r}x{n}"), Kind::Add { rows: r, n });
        push(format!("swiglu {r}x{n}"), Kind::SwiGlu { rows: r, n });
    }
    push(
        "rope 512x32x128".into(),
        Kind::Rope {
            t: 512,
            h: 32,
            d: 128,
        },
    );
    let prefill = if cpu && !large { 512 } else { 2048 };
    push(
        format!("attention prefill {prefill} causal h32 d128"),
        Kind::Attention {
            tq: prefill,
            tk: prefill,
            h: 32,
            kvh: 32,
            d: 128,
            causal: true,
        },
    );
    push(
        "attention decode over 4096 h32 d128".into(),
        Kind::Attention {
            tq: 1,
            tk: 4096,
            h: 32,
            kvh: 32,
            d: 128,
            causal: true,
        },
    );
    // a 1B Llama decode step at a short context (grouped queries)
    push(
        "attention decode over 256 h32/8 d64".into(),
        Kind::Attention {
            tq: 1,
            tk: 256,
            h: 32,
            kvh: 8,
            d: 64,
            causal: true,
        },
    );
    // SmolLM2's decode step deep in a long prompt
    push(
        "attention decode over 1024 h9/3 d64".into(),
        Kind::Attention {
            tq: 1,
            tk: 1024,
            h: 9,
            kvh: 3,
            d: 64,
            causal: true,
        },
    );
    let n = if cpu { 1 << 24 } else { 1 << 27 };
    push(format!("copy {n}"), Kind::Copy { n });
    v
}

/// Bytes of weights that a `cold` product cycles through, one copy per
/// call, so that each call reads its weight from memory rather than from
/// the last-level cache, as a decode step does (it reads every weight once
/// per token). A product that reused one weight would be timed from the
/// cache wherever the weight fits it; 256 MiB is several times the largest
/// GPU caches (docs/tuning.md, "Bench warm-up and cold weights").
const COLD_BYTES: usize = 256 << 20;

/// How many copies of a weight of `bytes` a case cycles through, `total`
/// bytes of them when `cold`.
fn copies(cold: bool, bytes: usize, total: usize) -> usize {
    if cold {
        total.div_ceil(bytes.max(1)).max(1)
    } else {
        1
    }
}

/// A case's copies of its weight, handed out in turn (see [`COLD_BYTES`]).
struct Cycle<T> {
    items: Vec<T>,
    next: std::cell::Cell<usize>,
}

impl<T> Cycle<T> {
    /// `items` must not be empty.
    fn new(items: Vec<T>) -> Self {
        Cycle {
            items,
            next: std::cell::Cell::new(0),
        }
    }

    fn next(&self) -> &T {
        let i = self.next.get();
        self.next.set((i + 1) % self.items.len());
        &self.items[i]
    }
}

/// The inputs of a case and the function that runs it once.
type Runner = Box<dyn Fn() -> silica::Result<Tensor>>;

fn build(
    kind: &Kind,
    dtype: DType,
    dev: &Device,
    cold_bytes: usize,
) -> silica::Result<(Runner, f64, f64)> {
    let rnd = |shape: &[usize], seed: u64| Tensor::randn(shape, dtype, seed, dev);
    let es = dtype.size_in_bytes() as f64;
    Ok(match *kind {
        Kind::Matmul { m, n, k } => {
            let (a, b) = (rnd(&[m, k], 1)?, rnd(&[k, n], 2)?);
            let flops = 2.0 * (m * n * k) as f64;
            let bytes = es * (m * k + k * n + m * n) as f64;
            (Box::new(move || a.matmul(&b)), flops, bytes)
        }
        Kind::Linear { m, n, k, cold } => {
            let a = rnd(&[m, k], 1)?;
            let w = rnd(&[n, k], 2)?;
            let ws = (0..copies(cold, n * k * dtype.size_in_bytes(), cold_bytes))
                .map(|i| if i == 0 { Ok(w.clone()) } else { w.copy() }?.t())
                .collect::<silica::Result<Vec<_>>>()?;
            let flops = 2.0 * (m * n * k) as f64;
            let bytes = es * (m * k + k * n + m * n) as f64;
            let ws = Cycle::new(ws);
            (Box::new(move || a.matmul(ws.next())), flops, bytes)
        }
        Kind::QLinear {
            format,
            m,
            n,
            k,
            cold,
        } => {
            let x = rnd(&[m, k], 1)?;
            let ws = quantized_copies(format, n, k, cold, cold_bytes, dev)?;
            let size = ws[0].size_in_bytes();
            let flops = 2.0 * (m * n * k) as f64;
            let bytes = size as f64 + es * (m * k + m * n) as f64;
            let ws = Cycle::new(ws);
            (Box::new(move || x.matmul_q(ws.next())), flops, bytes)
        }
        Kind::Lora {
            format,
            m,
            n,
            k,
            rank,
            cold,
        } => {
            let x = rnd(&[m, k], 1)?;
            let ws = quantized_copies(format, n, k, cold, cold_bytes, dev)?;
            let a = rnd(&[rank, k], 3)?;
            let b = rnd(&[rank, n], 4)?.mul_scalar(0.5)?;
            let size = ws[0].size_in_bytes();
            let flops = 2.0 * (m * n * k + m * rank * (k + n)) as f64;
            let bytes = size as f64 + es * (m * k + m * n + rank * (k + n)) as f64;
            let ws = Cycle::new(ws);
            // as a model applies an adapter: u = x·aᵀ inside the product
            let run = move || {
                x.matmul_q_fused(
                    ws.next(),
                    QFuse {
                        low_rank_a: Some((&a, &b)),
                        ..QFuse::default()
                    },
                )
            };
            (Box::new(run), flops, bytes)
        }
        Kind::QChain { format, n, layers } => {
            let x = rnd(&[1, n], 1)?;
            let ws = (0..layers)
                .map(|i| QTensor::random(format, &[n, n], 2 + i as u64, dev))
                .collect::<silica::Result<Vec<_>>>()?;
            let bytes: f64 = ws.iter().map(|w| w.size_in_bytes() as f64).sum();
            let run = move || {
                let mut y = x.clone();
                for w in &ws {
                    y = y.matmul_q(w)?;
                }
                Ok(y)
            };
            let flops = 2.0 * (n * n * layers) as f64;
            (Box::new(run), flops, bytes)
        }
        Kind::Softmax { rows, n } => {
            let x = rnd(&[rows, n], 1)?;
            (
                Box::new(move || x.softmax(-1)),
                0.0,
                2.0 * es * (rows * n) as f64,
            )
        }
        Kind::RmsNorm { rows, n } => {
            let (x, w) = (rnd(&[rows, n], 1)?, rnd(&[n], 2)?);
            (
                Box::new(move || x.rms_norm(&w, 1e-6)),
                0.0,
                2.0 * es * (rows * n) as f64,
            )
        }
        Kind::LayerNorm { rows, n } => {
            let (x, w, b) = (rnd(&[rows, n], 1)?, rnd(&[n], 2)?, rnd(&[n], 3)?);
            let run = move || x.layer_norm(&w, &b, 1e-5);
            (Box::new(run), 0.0, 2.0 * es * (rows * n) as f64)
        }
        Kind::Add { rows, n } => {
            let (x, y) = (rnd(&[rows, n], 1)?, rnd(&[rows, n], 2)?);
            (
                Box::new(move || x.add(&y)),
                0.0,
                3.0 * es * (rows * n) as f64,
            )
        }
        Kind::SwiGlu { rows, n } => {
            let (g, u) = (rnd(&[rows, n], 1)?, rnd(&[rows, n], 2)?);
            (
                Box::new(move || g.swiglu(&u)),
                0.0,
                3.0 * es * (rows * n) as f64,
            )
        }
        Kind::Rope { t, h, d } => {
            let x = rnd(&[t, h, d], 1)?;
            let angles = Tensor::rand(&[t, d / 2], DType::F32, 2, dev)?;
            let (cos, sin) = (angles.cos()?, angles.sin()?);
            let run = move || x.rope(&cos, &sin, RopeStyle::Half);
            (Box::new(run), 0.0, 2.0 * es * (t * h * d) as f64)
        }
        Kind::Attention {
            tq,
            tk,
            h,
            kvh,
            d,
            causal,
        } => {
            let q = rnd(&[tq, h, d], 1)?;
            let (k, v) = (rnd(&[tk, kvh, d], 2)?, rnd(&[tk, kvh, d], 3)?);
            let opts = AttentionOpts {
                scale: 1.0 / (d as f32).sqrt(),
                causal,
            };
            // q·k and p·v over the visible keys
            let pairs = if causal && tq == tk {
                (tq * (tq + 1) / 2) as f64
            } else {
                (tq * tk) as f64
            };
            let flops = 4.0 * pairs * (h * d) as f64;
            let bytes = es * (2 * tq * h * d + 2 * tk * kvh * d) as f64;
            (
                Box::new(move || q.attention(&k, &v, None, opts)),
                flops,
                bytes,
            )
        }
        Kind::Copy { n } => {
            let x = rnd(&[n], 1)?;
            (Box::new(move || x.copy()), 0.0, 2.0 * es * n as f64)
        }
    })
}

/// A random quantized weight `[n, k]`, and when `cold` as many copies of it
/// as [`copies`] asks for.
fn quantized_copies(
    format: QuantFormat,
    n: usize,
    k: usize,
    cold: bool,
    cold_bytes: usize,
    dev: &Device,
) -> silica::Result<Vec<QTensor>> {
    let w = QTensor::random(format, &[n, k], 2, dev)?;
    let copies = copies(cold, w.size_in_bytes(), cold_bytes);
    let mut ws = vec![w];
    if copies > 1 {
        let host = ws[0].to_bytes()?;
        for _ in 1..copies {
            ws.push(QTensor::from_bytes(format, &[n, k], &host, dev)?);
        }
    }
    Ok(ws)
}

/// Per-call times of `f`: warm-up (see [`WARM_UP_S`]), then as many calls as fit in `budget`
/// in one command stream. Wall-clock seconds per call, and on a GPU with
/// timestamp queries the GPU-timeline seconds per call of the same loop.
struct Timing {
    wall: f64,
    gpu: Option<f64>,
    iters: usize,
}

impl Timing {
    /// The figure reported: the GPU clock where there is one.
    fn secs(&self) -> f64 {
        self.gpu.unwrap_or(self.wall)
    }
}

/// Seconds of calls before a case is timed (at most its budget). A GPU that
/// idled while the host made the case's operands runs at its idle clock for
/// the first few hundred milliseconds of work (docs/tuning.md, "Bench
/// warm-up and cold weights").
const WARM_UP_S: f64 = 0.4;

fn time(f: &Runner, dev: &Device, budget: f64) -> silica::Result<Timing> {
    let warm = Instant::now();
    let mut calls = 0;
    while calls < 2 || warm.elapsed().as_secs_f64() < budget.min(WARM_UP_S) {
        drop(f()?);
        // one call at a time, so that the host's clock follows the device's
        dev.synchronize()?;
        calls += 1;
    }
    let start = Instant::now();
    drop(f()?);
    dev.synchronize()?;
    let once = start.elapsed().as_secs_f64();
    let iters = ((budget / once.max(1e-7)) as usize).clamp(1, 10_000);
    let run = || -> silica::Result<()> {
        for _ in 0..iters {
            drop(f()?);
        }
        Ok(())
    };
    let start = Instant::now();
    let gpu = match dev {
        Device::Gpu(g) => g.gpu_time(run)?.1,
        Device::Cpu => {
            run()?;
            None
        }
    };
    dev.synchronize()?;
    let n = iters as f64;
    Ok(Timing {
        wall: start.elapsed().as_secs_f64() / n,
        gpu: gpu.map(|s| s / n),
        iters,
    })
}

/// Small-op figures: sustained adds per second (wall clock), the latency of
/// one add followed by a read-back, and on a GPU with timestamps the GPU
/// timeline per add of 1,000 chained adds and of 1,000 independent ones.
struct SmallOps {
    ops_per_s: f64,
    /// Host time to record one add of the chain (best round), the waits
    /// for the device excluded as far as submission allows.
    host_per_op: f64,
    latency: f64,
    gpu_chained: Option<f64>,
    gpu_independent: Option<f64>,
}

/// Small ops: a chain of 1,000 adds on 1,024 elements (sustained ops per
/// second), and one add followed by a read-back (latency). The GPU
/// timeline of a chain holds the kernels, the barriers between them and
/// any wait for the host; with `SILICA_SUBMIT_EVERY=1024` the whole chain
/// is recorded before it is submitted, so no host wait remains.
fn small_ops(dev: &Device, dtype: DType) -> silica::Result<SmallOps> {
    let x = Tensor::randn(&[1024], dtype, 1, dev)?;
    let one = Tensor::ones(&[1024], dtype, dev)?;
    let chain = || -> silica::Result<Tensor> {
        let mut y = x.clone();
        for _ in 0..1000 {
            y = y.add(&one)?;
        }
        Ok(y)
    };
    drop(chain()?);
    dev.synchronize()?;
    let start = Instant::now();
    let rounds = 5;
    let mut host_per_op = f64::INFINITY;
    for _ in 0..rounds {
        let t = Instant::now();
        drop(chain()?);
        host_per_op = host_per_op.min(t.elapsed().as_secs_f64() / 1000.0);
    }
    dev.synchronize()?;
    let ops_per_s = (rounds * 1000) as f64 / start.elapsed().as_secs_f64();
    let mut best = f64::INFINITY;
    for _ in 0..20 {
        let start = Instant::now();
        let v: Vec<f32> = x
            .add(&one)?
            .to_dtype(DType::F32)?
            .narrow(0, 0, 1)?
            .to_vec()?;
        best = best.min(start.elapsed().as_secs_f64());
        std::hint::black_box(v);
    }
    let (mut gpu_chained, mut gpu_independent) = (None, None);
    if let Device::Gpu(g) = dev {
        gpu_chained = g.gpu_time(|| chain().map(drop))?.1.map(|s| s / 1000.0);
        let independent = || -> silica::Result<()> {
            for _ in 0..1000 {
                drop(x.add(&one)?);
            }
            Ok(())
        };
        gpu_independent = g.gpu_time(independent)?.1.map(|s| s / 1000.0);
    }
    Ok(SmallOps {
        ops_per_s,
        host_per_op,
        latency: best,
        gpu_chained,
        gpu_independent,
    })
}

/// Bytes moved by each transfer of [`transfers`].
const TRANSFER_BYTES: usize = 64 << 20;

/// Host-to-device and device-to-host copies of 64 MiB (wall clock): the
/// best of 5 uploads into new buffers (`Tensor::from_slice` then a wait for
/// the device) and of 15 read-backs (`to_vec`, three of each upload).
/// Returns seconds per upload and per read-back.
fn transfers(dev: &Device) -> Result<(f64, f64), CliError> {
    let n = TRANSFER_BYTES / 4;
    let host: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let (mut up, mut down) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..5 {
        let start = Instant::now();
        let t = Tensor::from_slice(&host, &[n], dev)?;
        dev.synchronize()?;
        up = up.min(start.elapsed().as_secs_f64());
        for _ in 0..3 {
            let start = Instant::now();
            let back: Vec<f32> = t.to_vec()?;
            down = down.min(start.elapsed().as_secs_f64());
            if back != host {
                return Err(CliError::msg(
                    "bench: the read-back differs from the upload".into(),
                ));
            }
        }
        drop(t);
        dev.empty_cache();
    }
    Ok((up, down))
}

fn kind_json(kind: &Kind) -> String {
    // Debug of the kind is `Name { field: value, .. }`: turn it into JSON
    let text = format!("{kind:?}");
    let (name, rest) = text.split_once(' ').unwrap_or((&text, ""));
    let fields = rest.trim_matches(|c| c == '{' || c == '}' || c == ' ');
    let mut out = format!("{{\"op\": \"{name}\"");
    for f in fields.split(", ").filter(|f| !f.is_empty()) {
        if let Some((k, v)) = f.split_once(": ") {
            if v.parse::<f64>().is_ok() || v == "true" || v == "false" {
                let _ = write!(out, ", \"{k}\": {v}");
            } else {
                let _ = write!(out, ", \"{k}\": \"{v}\"");
            }
        }
    }
    out.push('}');
    out
}

pub fn run(args: &BenchArgs) -> Result<(), CliError> {
    let dtype = crate::generate::parse_dtype(&args.dtype)?;
    let dev = crate::open_device(args.device.as_deref())?;
    let cpu = matches!(dev, Device::Cpu);
    if let (Device::Gpu(g), Some(name)) = (&dev, args.matmul_kernel) {
        g.force_matmul_kernel_for_testing(Some(name));
    }
    let cold_bytes = args.cold_mib.map_or(COLD_BYTES, |mib| (mib as usize) << 20);
    if !args.json {
        emit(&format!(
            "silica bench on {dev} ({dtype}); time per call: {}\n\n{:<48} {:>11} {:>11} {:>10} {:>10}\n",
            if cpu {
                "wall-clock"
            } else {
                "GPU timestamps around the loop (wall-clock with the device synchronized beside it)"
            },
            "case",
            "time",
            "wall",
            "GFLOP/s",
            "GB/s"
        ))?;
    }
    for case in cases(args.large, cpu) {
        if args
            .filter
            .as_ref()
            .is_some_and(|f| !case.name.contains(f.as_str()))
        {
            continue;
        }
        let (runner, flops, bytes) = build(&case.kind, dtype, &dev, cold_bytes)?;
        let mut t = time(&runner, &dev, args.seconds)?;
        drop(runner);
        // a chain's figures are per product
        if let Kind::QChain { layers, .. } = case.kind {
            t.wall /= layers as f64;
            t.gpu = t.gpu.map(|g| g / layers as f64);
        }
        let (flops, bytes) = match case.kind {
            Kind::QChain { layers, .. } => (flops / layers as f64, bytes / layers as f64),
            _ => (flops, bytes),
        };
        let secs = t.secs();
        let gflops = flops / secs / 1e9;
        let gbs = bytes / secs / 1e9;
        let line = if args.json {
            let gpu = t.gpu.map_or("null".to_string(), |g| format!("{g:e}"));
            format!(
                "{{\"name\": \"{}\", \"kind\": {}, \"dtype\": \"{dtype}\", \"device\": \"{dev}\", \"seconds\": {secs:e}, \"wall_seconds\": {:e}, \"gpu_seconds\": {gpu}, \"iters\": {}, \"gflops\": {gflops:.3}, \"gbs\": {gbs:.3}}}\n",
                case.name,
                kind_json(&case.kind),
                t.wall,
                t.iters
            )
        } else {
            let show = |v: f64| {
                if v > 0.0 {
                    format!("{v:.1}")
                } else {
                    "-".into()
                }
            };
            format!(
                "{:<48} {:>9.1}us {:>9.1}us {:>10} {:>10}\n",
                case.name,
                secs * 1e6,
                t.wall * 1e6,
                show(gflops),
                show(gbs)
            )
        };
        emit(&line)?;
        dev.empty_cache();
    }
    if args
        .filter
        .as_ref()
        .is_none_or(|f| "small ops".contains(f.as_str()))
    {
        let SmallOps {
            ops_per_s: ops,
            host_per_op,
            latency,
            gpu_chained,
            gpu_independent,
        } = small_ops(&dev, dtype)?;
        let json_num = |v: Option<f64>| v.map_or("null".to_string(), |v| format!("{v:e}"));
        let line = if args.json {
            format!(
                "{{\"name\": \"small ops\", \"kind\": {{\"op\": \"SmallOps\"}}, \"dtype\": \"{dtype}\", \"device\": \"{dev}\", \"ops_per_s\": {ops:.0}, \"host_per_op_s\": {host_per_op:e}, \"latency_s\": {latency:e}, \"gpu_chained_s\": {}, \"gpu_independent_s\": {}}}\n",
                json_num(gpu_chained),
                json_num(gpu_independent)
            )
        } else {
            let gpu = match (gpu_chained, gpu_independent) {
                (Some(c), Some(i)) => format!(
                    "; GPU timeline per add {:.2}us chained, {:.2}us independent",
                    c * 1e6,
                    i * 1e6
                ),
                _ => String::new(),
            };
            format!(
                "\nsmall ops: {ops:.0} adds/s sustained (1,000 chained adds of 1,024 elements), {:.2}us of host time to record each; one add + read-back {:.1}us{gpu}\n",
                host_per_op * 1e6,
                latency * 1e6
            )
        };
        emit(&line)?;
    }
    if args
        .filter
        .as_ref()
        .is_none_or(|f| "transfers".contains(f.as_str()))
    {
        let (up, down) = transfers(&dev)?;
        let gbs = |s: f64| TRANSFER_BYTES as f64 / s / 1e9;
        let line = if args.json {
            format!(
                "{{\"name\": \"transfers\", \"kind\": {{\"op\": \"Transfers\"}}, \"device\": \"{dev}\", \"bytes\": {TRANSFER_BYTES}, \"upload_s\": {up:e}, \"read_back_s\": {down:e}}}\n"
            )
        } else {
            format!(
                "transfers of 64 MiB: upload {:.1} ms ({:.1} GB/s), read-back {:.1} ms ({:.1} GB/s)\n",
                up * 1e3,
                gbs(up),
                down * 1e3,
                gbs(down)
            )
        };
        emit(&line)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every quantized case can be built: its rows are whole blocks (the
    /// K-quants' 256 do not divide SmolLM2's 576), and each format keeps
    /// cases at every model size whose rows it tiles.
    #[test]
    fn quantized_cases_have_whole_blocks() {
        for (large, cpu) in [(false, false), (true, false), (false, true)] {
            let mut per_format = std::collections::HashMap::new();
            let mut many_rows = 0;
            for c in cases(large, cpu) {
                if let Kind::QLinear { format, k, .. } = c.kind {
                    assert_eq!(k % format.block_elems(), 0, "{}", c.name);
                    // the many-rows cases are of two formats only
                    if c.name.contains(" rows") {
                        many_rows += 1;
                        continue;
                    }
                    *per_format.entry(format.to_string()).or_insert(0) += 1;
                }
            }
            assert_eq!(many_rows, 42);
            assert_eq!(per_format.len(), 7, "{per_format:?}");
            // of 135M's four products only down (rows of 1536) tiles into 256s
            assert_eq!(per_format["q4_0"], per_format["q4_k"] + 3, "{per_format:?}");
        }
    }
}
