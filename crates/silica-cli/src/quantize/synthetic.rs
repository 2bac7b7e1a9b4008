//! `silica quantize --synthetic NAME`: a Llama-shaped model with random
//! weights (N(0, 0.02), norms 1) and a made-up SentencePiece vocabulary, to
//! measure decode speed at a real model's shape without downloading it. Its
//! text is gibberish. The `tiny-*` shapes are small models of each
//! supported architecture variant (Llama 3.1's frequency factors, YaRN,
//! Qwen3's head norms and head size, Gemma 2's and Gemma 3's sliding
//! windows, soft-caps and extra norms, Phi-3's stacked tensors, LongRoPE
//! and partial rotation) with larger weights, whose logits
//! `scripts/arch_golden.py` records with llama.cpp for the tests.
//!
//! Each tensor is drawn from its own seeded generator and quantized a slice
//! of rows at a time, so the f32 model never exists in memory as a whole.

use std::path::Path;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal};
use silica_models::gguf::{GgmlType, GgufWriter, MetaValue};

use super::{Progress, Stats, Target, convert_rows};
use crate::CliError;

/// Standard deviation of the random weights of the real shapes.
const WEIGHT_STD: f32 = 0.02;

/// Standard deviation of the `tiny-*` shapes' weights: large enough that
/// attention is far from uniform, so that the rotary angles show in the
/// logits.
const TINY_STD: f32 = 0.25;

/// The shape of a Llama-family decoder.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    name: &'static str,
    /// `general.architecture`: `llama`, `qwen3`, `gemma2`, `gemma3` or
    /// `phi3`.
    arch: &'static str,
    /// The head size where it is not `d_model / n_heads` (0: that).
    head_dim: usize,
    d_model: usize,
    n_layers: usize,
    n_heads: usize,
    n_kv_heads: usize,
    ffn_dim: usize,
    vocab_size: usize,
    context_length: usize,
    rope_theta: f32,
    rms_eps: f32,
    /// The output projection is the token embedding (no `output.weight`).
    tied: bool,
    weight_std: f32,
    /// A `rope_freqs.weight` of Llama 3.1's frequency factors (scale 8,
    /// low 1, high 4, over 8,192 positions).
    rope_freqs: bool,
    /// YaRN scaling: (factor, original context).
    yarn: Option<(f32, u32)>,
    /// Gemma's keys (for `gemma2` and `gemma3`).
    gemma: Option<GemmaShape>,
    /// Phi-3's keys and tensors (for `phi3`).
    phi3: Option<PhiShape>,
}

/// What a Gemma shape adds. Its norm weights are drawn around 1 (the
/// other shapes' are 1), so that a norm applied in the wrong place shows.
#[derive(Clone, Copy, Debug)]
struct GemmaShape {
    /// `attention.sliding_window`.
    sliding_window: u32,
    /// `attention.sliding_window_pattern` (0: not written, the
    /// architecture's default).
    pattern: u32,
    /// `attn_logit_softcapping` and `final_logit_softcapping` (Gemma 2).
    softcaps: Option<(f32, f32)>,
}

/// What a Phi-3 shape adds. Its Q, K and V weights are one tensor
/// (`attn_qkv`) and so are its gate and up weights (`ffn_up`, twice the
/// rows, the gate's first), as llama.cpp's converter writes them.
#[derive(Clone, Copy, Debug)]
struct PhiShape {
    /// `rope.dimension_count`: how many of a head's dimensions rotate (0:
    /// all of them).
    rope_dim: usize,
    /// `rope.scaling.original_context_length`.
    original_context: u32,
    /// LongRoPE: `rope_factors_long.weight` and `rope_factors_short.weight`
    /// (made-up factors, see [`Shape::longrope_factors`]) and
    /// `rope.scaling.attn_factor`.
    longrope: bool,
    /// `rope.scaling.attn_factor` (0: the converter's `√(1 + ln s / ln
    /// original)` for a context `s` times the original).
    attn_factor: f32,
    /// `attention.sliding_window` (the converter writes 0 for none).
    sliding_window: u32,
}

impl Shape {
    /// A real model's shape: Llama, no scaling.
    const fn real(
        name: &'static str,
        [d_model, n_layers, n_heads, n_kv_heads, ffn_dim]: [usize; 5],
        vocab_size: usize,
        context_length: usize,
        rope_theta: f32,
        tied: bool,
    ) -> Shape {
        Shape {
            name,
            arch: "llama",
            head_dim: 0,
            d_model,
            n_layers,
            n_heads,
            n_kv_heads,
            ffn_dim,
            vocab_size,
            context_length,
            rope_theta,
            rms_eps: 1e-5,
            tied,
            weight_std: WEIGHT_STD,
            rope_freqs: false,
            yarn: None,
            gemma: None,
            phi3: None,
        }
    }

    /// A tiny model of `arch`: 2 layers, 64 wide, 4 heads over 2 KV heads.
    const fn tiny(name: &'static str, arch: &'static str, head_dim: usize) -> Shape {
        Shape {
            name,
            arch,
            head_dim,
            d_model: 64,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            ffn_dim: 128,
            vocab_size: 512,
            context_length: 4096,
            rope_theta: 500_000.0,
            rms_eps: 1e-5,
            tied: false,
            weight_std: TINY_STD,
            rope_freqs: false,
            yarn: None,
            gemma: None,
            phi3: None,
        }
    }
}

/// The shapes `--synthetic` knows: real models' (from their
/// `config.json`), then the tiny ones of the architecture tests.
const SHAPES: [Shape; 16] = [
    Shape::real(
        "smollm2-135m",
        [576, 30, 9, 3, 1536],
        49152,
        8192,
        1e5,
        true,
    ),
    // Llama 3.2 1B and 3B, Llama 3.1 8B
    Shape::real(
        "llama-1b",
        [2048, 16, 32, 8, 8192],
        128_256,
        131_072,
        5e5,
        true,
    ),
    Shape::real(
        "llama-3b",
        [3072, 28, 24, 8, 8192],
        128_256,
        131_072,
        5e5,
        true,
    ),
    // Qwen3 0.6B: heads of 128 on a width of 1,024 split 16 ways, head norms
    Shape {
        arch: "qwen3",
        head_dim: 128,
        ..Shape::real(
            "qwen3-0.6b",
            [1024, 28, 16, 8, 3072],
            151_936,
            40_960,
            1e6,
            true,
        )
    },
    Shape::real(
        "llama-8b",
        [4096, 32, 32, 8, 14336],
        128_256,
        131_072,
        5e5,
        false,
    ),
    // Phi-3-mini-4k: 32 heads of 96, as many KV heads, a window of 2,047
    // that llama.cpp ignores
    Shape {
        arch: "phi3",
        phi3: Some(PhiShape {
            rope_dim: 0,
            original_context: 4096,
            longrope: false,
            attn_factor: 0.0,
            sliding_window: 2047,
        }),
        ..Shape::real(
            "phi3-mini",
            [3072, 32, 32, 32, 8192],
            32_064,
            4096,
            1e4,
            false,
        )
    },
    // Phi-4-mini: 24 heads of 128 over 8 KV heads, 96 dimensions of each
    // rotating, LongRoPE from 4,096 to 131,072 positions, tied output
    Shape {
        arch: "phi3",
        phi3: Some(PhiShape {
            rope_dim: 96,
            original_context: 4096,
            longrope: true,
            attn_factor: 0.0,
            sliding_window: 0,
        }),
        ..Shape::real(
            "phi4-mini",
            [3072, 32, 24, 8, 8192],
            200_064,
            131_072,
            1e4,
            true,
        )
    },
    Shape {
        rope_freqs: true,
        ..Shape::tiny("tiny-llama3", "llama", 0)
    },
    Shape {
        yarn: Some((4.0, 256)),
        rope_theta: 10_000.0,
        ..Shape::tiny("tiny-yarn", "llama", 0)
    },
    // Qwen3: heads of 32 on a width of 64 split four ways, and head norms
    Shape::tiny("tiny-qwen3", "qwen3", 32),
    // Gemma 3 270M: 18 layers of 640, 4 heads of 256 over one KV head, 5
    // of every 6 layers local with a window of 512
    Shape {
        arch: "gemma3",
        head_dim: 256,
        rms_eps: 1e-6,
        gemma: Some(GemmaShape {
            sliding_window: 512,
            pattern: 6,
            softcaps: None,
        }),
        ..Shape::real(
            "gemma3-270m",
            [640, 18, 4, 1, 2048],
            262_144,
            32_768,
            1e6,
            true,
        )
    },
    // Gemma 2 2B: 26 layers of 2,304, 8 heads of 256 over 4 KV heads,
    // every other layer local with a window of 4,096, both soft-caps
    Shape {
        arch: "gemma2",
        head_dim: 256,
        rms_eps: 1e-6,
        gemma: Some(GemmaShape {
            sliding_window: 4096,
            pattern: 0,
            softcaps: Some((50.0, 30.0)),
        }),
        ..Shape::real(
            "gemma2-2b",
            [2304, 26, 8, 4, 9216],
            256_000,
            8192,
            1e4,
            true,
        )
    },
    // Gemma 3: layers 0 and 1 local (a window of 8, base 10,000), layer 2
    // global; heads of 256 as in the real models, head norms, post-norms,
    // GeGLU, tied output
    Shape {
        n_layers: 3,
        rope_theta: 1e6,
        rms_eps: 1e-6,
        tied: true,
        gemma: Some(GemmaShape {
            sliding_window: 8,
            pattern: 3,
            softcaps: None,
        }),
        ..Shape::tiny("tiny-gemma3", "gemma3", 256)
    },
    // Gemma 2: layer 0 local, layer 1 global (the default pattern), both
    // soft-caps small enough to bend these weights' scores and logits
    Shape {
        rope_theta: 10_000.0,
        rms_eps: 1e-6,
        tied: true,
        gemma: Some(GemmaShape {
            sliding_window: 8,
            pattern: 0,
            softcaps: Some((4.0, 5.0)),
        }),
        ..Shape::tiny("tiny-gemma2", "gemma2", 32)
    },
    // Phi-3.5-mini: as many KV heads as heads, LongRoPE's long factors (a
    // context of 4,096 over an original 32) and its attention factor, a
    // window that llama.cpp ignores (shorter than the test's tokens)
    Shape {
        n_kv_heads: 4,
        rope_theta: 10_000.0,
        phi3: Some(PhiShape {
            rope_dim: 0,
            original_context: 32,
            longrope: true,
            attn_factor: 0.0,
            sliding_window: 16,
        }),
        ..Shape::tiny("tiny-phi3", "phi3", 0)
    },
    // Phi-4-mini: 12 of each head's 16 dimensions rotating, the short
    // factors (the context is the original one) with an attention factor
    // of its own, tied output
    Shape {
        rope_theta: 10_000.0,
        context_length: 256,
        tied: true,
        phi3: Some(PhiShape {
            rope_dim: 12,
            original_context: 256,
            longrope: true,
            attn_factor: 1.25,
            sliding_window: 0,
        }),
        ..Shape::tiny("tiny-phi4", "phi3", 0)
    },
];

impl Shape {
    /// The shape called `name` (ignoring case).
    pub fn by_name(name: &str) -> Result<Shape, CliError> {
        let lower = name.to_ascii_lowercase();
        SHAPES
            .iter()
            .find(|s| s.name == lower)
            .copied()
            .ok_or_else(|| {
                let names: Vec<&str> = SHAPES.iter().map(|s| s.name).collect();
                CliError::msg(format!(
                    "unknown --synthetic model {name:?} (one of {})",
                    names.join(", ")
                ))
            })
    }

    fn head_dim(&self) -> usize {
        if self.head_dim > 0 {
            self.head_dim
        } else {
            self.d_model / self.n_heads
        }
    }

    /// The control tokens at the end of the vocabulary: Phi-3's end of
    /// text and end of turn.
    fn special_tokens(&self) -> &'static [&'static str] {
        if self.phi3.is_some() {
            &["<|endoftext|>", "<|end|>"]
        } else {
            &[]
        }
    }

    /// How many of a head's dimensions rotate.
    fn rope_dim(&self) -> usize {
        match self.phi3 {
            Some(p) if p.rope_dim > 0 => p.rope_dim,
            _ => self.head_dim(),
        }
    }

    /// Made-up LongRoPE divisors of the rotary frequencies, one per rotated
    /// pair, rising from 1 at the fastest frequency: to the context's
    /// stretch `s` (the long ones) or to 1.5 (the short ones), as the
    /// released models' rise to tens and to about 2.
    fn longrope_factors(&self, long: bool) -> Vec<f32> {
        let n = self.rope_dim() / 2;
        let top = match self.phi3 {
            Some(p) if long => self.context_length as f32 / p.original_context as f32,
            _ => 1.5,
        };
        (0..n)
            .map(|i| 1.0 + (top - 1.0) * i as f32 / (n - 1).max(1) as f32)
            .collect()
    }

    /// Llama 3.1's rotary frequency factors for this head size (how its
    /// converter computes `rope_freqs`): 1 for short wavelengths, the
    /// scale for long ones, a smooth mix between.
    fn llama3_factors(&self) -> Vec<f32> {
        let (scale, low, high, old_context) = (8.0f64, 1.0f64, 4.0f64, 8192.0f64);
        let hd = self.head_dim();
        (0..hd / 2)
            .map(|i| {
                let freq = f64::from(self.rope_theta).powf(-(2.0 * i as f64) / hd as f64);
                let wavelength = 2.0 * std::f64::consts::PI / freq;
                let factor = if wavelength < old_context / high {
                    1.0
                } else if wavelength > old_context / low {
                    scale
                } else {
                    let smooth = (old_context / wavelength - low) / (high - low);
                    1.0 / ((1.0 - smooth) / scale + smooth)
                };
                factor as f32
            })
            .collect()
    }

    /// Every tensor's GGUF name and row-major shape, in file order.
    fn tensors(&self) -> Vec<(String, Vec<usize>)> {
        let (d, hd, ffn) = (self.d_model, self.head_dim(), self.ffn_dim);
        let (qd, kvd) = (self.n_heads * hd, self.n_kv_heads * hd);
        let mut t = vec![("token_embd.weight".to_string(), vec![self.vocab_size, d])];
        for i in 0..self.n_layers {
            let mut layer: Vec<(&str, Vec<usize>)> = vec![
                ("attn_norm.weight", vec![d]),
                ("attn_q.weight", vec![qd, d]),
                ("attn_k.weight", vec![kvd, d]),
                ("attn_v.weight", vec![kvd, d]),
                ("attn_output.weight", vec![d, qd]),
                ("ffn_norm.weight", vec![d]),
                ("ffn_gate.weight", vec![ffn, d]),
                ("ffn_up.weight", vec![ffn, d]),
                ("ffn_down.weight", vec![d, ffn]),
            ];
            if matches!(self.arch, "qwen3" | "gemma3") {
                layer.insert(2, ("attn_q_norm.weight", vec![hd]));
                layer.insert(4, ("attn_k_norm.weight", vec![hd]));
            }
            if self.gemma.is_some() {
                let at = layer.len() - 4;
                layer.insert(at, ("post_attention_norm.weight", vec![d]));
                layer.push(("post_ffw_norm.weight", vec![d]));
            }
            if self.phi3.is_some() {
                layer = vec![
                    ("attn_norm.weight", vec![d]),
                    ("attn_qkv.weight", vec![qd + 2 * kvd, d]),
                    ("attn_output.weight", vec![d, qd]),
                    ("ffn_norm.weight", vec![d]),
                    ("ffn_up.weight", vec![2 * ffn, d]),
                    ("ffn_down.weight", vec![d, ffn]),
                ];
            }
            t.extend(layer.into_iter().map(|(n, s)| (format!("blk.{i}.{n}"), s)));
        }
        if self.rope_freqs {
            t.push(("rope_freqs.weight".to_string(), vec![hd / 2]));
        }
        if self.phi3.is_some_and(|p| p.longrope) {
            for name in ["rope_factors_long.weight", "rope_factors_short.weight"] {
                t.push((name.to_string(), vec![self.rope_dim() / 2]));
            }
        }
        t.push(("output_norm.weight".to_string(), vec![d]));
        if !self.tied {
            t.push(("output.weight".to_string(), vec![self.vocab_size, d]));
        }
        t
    }

    /// The model's `general.*` and `<arch>.*` metadata.
    fn metadata(&self) -> Vec<(String, MetaValue)> {
        let u32_of = |v: usize| MetaValue::U32(v as u32);
        let mut entries = vec![
            ("general.architecture", MetaValue::String(self.arch.into())),
            (
                "general.name",
                MetaValue::String(format!("synthetic {} (random weights)", self.name)),
            ),
            ("vocab_size", u32_of(self.vocab_size)),
            ("context_length", u32_of(self.context_length)),
            ("embedding_length", u32_of(self.d_model)),
            ("block_count", u32_of(self.n_layers)),
            ("feed_forward_length", u32_of(self.ffn_dim)),
            ("rope.dimension_count", u32_of(self.rope_dim())),
            ("attention.head_count", u32_of(self.n_heads)),
            ("attention.head_count_kv", u32_of(self.n_kv_heads)),
            ("rope.freq_base", MetaValue::F32(self.rope_theta)),
            (
                "attention.layer_norm_rms_epsilon",
                MetaValue::F32(self.rms_eps),
            ),
        ];
        if self.head_dim > 0 {
            entries.push(("attention.key_length", u32_of(self.head_dim)));
            entries.push(("attention.value_length", u32_of(self.head_dim)));
        }
        if let Some(g) = self.gemma {
            entries.push(("attention.sliding_window", MetaValue::U32(g.sliding_window)));
            if g.pattern > 0 {
                entries.push((
                    "attention.sliding_window_pattern",
                    MetaValue::U32(g.pattern),
                ));
            }
            if let Some((attn, last)) = g.softcaps {
                entries.push(("attn_logit_softcapping", MetaValue::F32(attn)));
                entries.push(("final_logit_softcapping", MetaValue::F32(last)));
            }
        }
        if let Some(p) = self.phi3 {
            entries.push((
                "rope.scaling.original_context_length",
                MetaValue::U32(p.original_context),
            ));
            entries.push(("attention.sliding_window", MetaValue::U32(p.sliding_window)));
            if p.longrope {
                let attn_factor = if p.attn_factor > 0.0 {
                    p.attn_factor
                } else {
                    let original = f64::from(p.original_context);
                    let s = self.context_length as f64 / original;
                    (1.0 + s.ln() / original.ln()).sqrt() as f32
                };
                entries.push(("rope.scaling.attn_factor", MetaValue::F32(attn_factor)));
            }
        }
        if let Some((factor, original)) = self.yarn {
            entries.push(("rope.scaling.type", MetaValue::String("yarn".into())));
            entries.push(("rope.scaling.factor", MetaValue::F32(factor)));
            entries.push((
                "rope.scaling.original_context_length",
                MetaValue::U32(original),
            ));
        }
        entries
            .into_iter()
            .map(|(k, v)| {
                let key = if k.starts_with("general.") {
                    k.to_string()
                } else {
                    format!("{}.{k}", self.arch)
                };
                (key, v)
            })
            .collect()
    }
}

/// llama.cpp's token types.
const TOKEN_NORMAL: i32 = 1;
const TOKEN_UNKNOWN: i32 = 2;
const TOKEN_CONTROL: i32 = 3;
const TOKEN_BYTE: i32 = 6;

/// The `n`-th string of the bijective base-26 numbering: a..z, aa..zz,
/// aaa...
fn letters(mut n: usize) -> String {
    let mut s = Vec::new();
    loop {
        s.push(b'a' + (n % 26) as u8);
        if n < 26 {
            break;
        }
        n = n / 26 - 1;
    }
    s.reverse();
    String::from_utf8_lossy(&s).into_owned()
}

/// A SentencePiece-style (`tokenizer.ggml.model = "llama"`) vocabulary of
/// `vocab_size` tokens (at least 260): `<unk>`, `<s>`, `</s>`, the 256 byte
/// tokens `<0x00>`..`<0xFF>`, `▁`, then `▁a`, `a`, `▁b`, `b`, ... `▁aa`,
/// `aa`, ... with scores falling with the id, so BPE merges letters into
/// the longest pieces; the last ids are the control tokens `specials`
/// (llama.cpp looks Phi-3's `<|endoftext|>` up in a file it takes for one).
fn tokenizer_metadata(vocab_size: usize, specials: &[&str]) -> Vec<(String, MetaValue)> {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL];
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    types.resize(tokens.len(), TOKEN_BYTE);
    tokens.push("▁".into());
    let mut n = 0;
    while tokens.len() < vocab_size {
        let piece = letters(n);
        tokens.push(format!("▁{piece}"));
        tokens.push(piece);
        n += 1;
    }
    tokens.truncate(vocab_size - specials.len());
    tokens.extend(specials.iter().map(|t| t.to_string()));
    types.resize(vocab_size - specials.len(), TOKEN_NORMAL);
    types.resize(vocab_size, TOKEN_CONTROL);
    let scores = (0..vocab_size).map(|id| match types[id] {
        TOKEN_NORMAL => MetaValue::F32(-(id as f32)),
        _ => MetaValue::F32(0.0),
    });
    let entries = [
        ("tokenizer.ggml.model", MetaValue::String("llama".into())),
        (
            "tokenizer.ggml.tokens",
            MetaValue::Array(tokens.into_iter().map(MetaValue::String).collect()),
        ),
        ("tokenizer.ggml.scores", MetaValue::Array(scores.collect())),
        (
            "tokenizer.ggml.token_type",
            MetaValue::Array(types.into_iter().map(MetaValue::I32).collect()),
        ),
        ("tokenizer.ggml.unknown_token_id", MetaValue::U32(0)),
        ("tokenizer.ggml.bos_token_id", MetaValue::U32(1)),
        ("tokenizer.ggml.eos_token_id", MetaValue::U32(2)),
        ("tokenizer.ggml.add_bos_token", MetaValue::Bool(true)),
        ("tokenizer.ggml.add_eos_token", MetaValue::Bool(false)),
    ];
    entries
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

/// Writes the random model of `shape` with weight type `target` to `output`.
pub fn write(shape: Shape, target: Target, seed: u64, output: &Path) -> Result<Stats, CliError> {
    let mut w = GgufWriter::new();
    for (k, v) in shape
        .metadata()
        .into_iter()
        .chain(tokenizer_metadata(shape.vocab_size, shape.special_tokens()))
    {
        w.metadata(k, v)?;
    }
    target.set_metadata(&mut w)?;
    let tensors: Vec<(String, Vec<usize>, GgmlType)> = shape
        .tensors()
        .into_iter()
        .map(|(name, dims)| {
            let ty = target.tensor_type(&name, &dims);
            (name, dims, ty)
        })
        .collect();
    for (name, dims, ty) in &tensors {
        w.declare_tensor(name.as_str(), dims, *ty)?;
    }
    let numel = |dims: &[usize]| dims.iter().product::<usize>();
    let total = tensors.iter().map(|(_, d, _)| numel(d) as u64).sum();
    let mut progress = Progress::new(total);
    let normal = Normal::new(0.0f32, shape.weight_std)
        .map_err(|e| CliError::msg(format!("the weight distribution: {e}")))?;
    let mut out = w.create(output)?;
    eprintln!(
        "silica: writing a random {} ({} tensors) as {}",
        shape.name,
        tensors.len(),
        target.ty
    );
    for (index, (name, dims, ty)) in tensors.iter().enumerate() {
        progress.tensor(name, GgmlType::F32, *ty);
        let row_len = dims.last().copied().unwrap_or(1);
        let rows = numel(dims) / row_len;
        let is_norm = dims.len() == 1;
        out.write_tensor_with(name, |sink| {
            // One generator per slice of rows: a slice's values depend only
            // on the seed, the tensor's index and its first row, so that
            // slices are made in parallel.
            let produce = |first: usize, n: usize| {
                let len = n * row_len;
                let mut rng = StdRng::seed_from_u64(
                    seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                        ^ (first as u64).wrapping_mul(0xD1B5_4A32_D192_ED03),
                );
                Ok(if name == "rope_freqs.weight" {
                    shape.llama3_factors()
                } else if name == "rope_factors_long.weight" {
                    shape.longrope_factors(true)
                } else if name == "rope_factors_short.weight" {
                    shape.longrope_factors(false)
                } else if is_norm && shape.gemma.is_some() {
                    normal
                        .sample_iter(&mut rng)
                        .take(len)
                        .map(|v| 1.0 + v)
                        .collect()
                } else if is_norm {
                    vec![1.0; len]
                } else {
                    normal.sample_iter(&mut rng).take(len).collect()
                })
            };
            convert_rows(sink, *ty, rows, row_len, produce, &mut progress)
        })?;
    }
    out.finish()?;
    progress.done();
    Ok(Stats {
        tensors: tensors.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letters_count_in_bijective_base_26() {
        let first: Vec<String> = [0, 1, 25, 26, 27, 701, 702].map(letters).into();
        assert_eq!(first, ["a", "b", "z", "aa", "ab", "zz", "aaa"]);
    }

    #[test]
    fn the_vocabulary_has_the_asked_size_and_unique_tokens() {
        for n in [260, 49152, 128_256] {
            let meta = tokenizer_metadata(n, &["<|endoftext|>", "<|end|>"]);
            let tokens = meta[1].1.as_array().unwrap();
            assert_eq!(tokens.len(), n);
            let unique: std::collections::HashSet<&str> =
                tokens.iter().map(|t| t.as_str().unwrap()).collect();
            assert_eq!(unique.len(), n);
        }
    }

    #[test]
    fn shapes_divide_into_heads() {
        for s in SHAPES {
            assert_eq!(s.n_heads % s.n_kv_heads, 0, "{}", s.name);
            if s.weight_std == WEIGHT_STD && s.head_dim == 0 {
                assert_eq!(s.d_model % s.n_heads, 0, "{}", s.name);
                // Phi-3's heads are 96 wide
                assert!(matches!(s.head_dim(), 64 | 96 | 128), "{}", s.name);
            }
        }
    }

    #[test]
    fn llama3_factors_run_from_one_to_the_scale() {
        let s = Shape::by_name("tiny-llama3").unwrap();
        let f = s.llama3_factors();
        assert_eq!(f.len(), 8);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[7], 8.0);
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "{f:?}");
    }

    #[test]
    fn phi_shapes_stack_their_projections_and_rotate_part_of_a_head() {
        let s = Shape::by_name("tiny-phi4").unwrap();
        let tensors = s.tensors();
        let shape_of = |name: &str| {
            tensors
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, shape)| shape.clone())
        };
        // 4 query heads and 2 KV heads of 16; gate and up of 128 each
        assert_eq!(shape_of("blk.0.attn_qkv.weight"), Some(vec![128, 64]));
        assert_eq!(shape_of("blk.1.ffn_up.weight"), Some(vec![256, 64]));
        assert_eq!(shape_of("blk.0.attn_q.weight"), None);
        assert_eq!(shape_of("output.weight"), None);
        assert_eq!(shape_of("rope_factors_short.weight"), Some(vec![6]));
        let short = s.longrope_factors(false);
        let want = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5];
        assert!(
            short.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6),
            "{short:?}"
        );
        // the context is the original one: the long factors do nothing
        assert_eq!(s.longrope_factors(true), [1.0; 6]);
        let long = Shape::by_name("tiny-phi3").unwrap().longrope_factors(true);
        assert_eq!((long[0], long[7]), (1.0, 128.0));
    }
}
