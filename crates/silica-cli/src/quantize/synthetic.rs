//! `silica quantize --synthetic NAME`: a Llama-shaped model with random
//! weights (N(0, 0.02), norms 1) and a made-up SentencePiece vocabulary, to
//! measure decode speed at a real model's shape without downloading it. Its
//! text is gibberish.
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

/// Standard deviation of the random weights.
const WEIGHT_STD: f32 = 0.02;

/// The shape of a Llama-family decoder.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    name: &'static str,
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
}

/// The shapes `--synthetic` knows, from the models' `config.json`.
const SHAPES: [Shape; 4] = [
    Shape {
        name: "smollm2-135m",
        d_model: 576,
        n_layers: 30,
        n_heads: 9,
        n_kv_heads: 3,
        ffn_dim: 1536,
        vocab_size: 49152,
        context_length: 8192,
        rope_theta: 100_000.0,
        rms_eps: 1e-5,
        tied: true,
    },
    Shape {
        name: "llama-1b", // Llama 3.2 1B
        d_model: 2048,
        n_layers: 16,
        n_heads: 32,
        n_kv_heads: 8,
        ffn_dim: 8192,
        vocab_size: 128_256,
        context_length: 131_072,
        rope_theta: 500_000.0,
        rms_eps: 1e-5,
        tied: true,
    },
    Shape {
        name: "llama-3b", // Llama 3.2 3B
        d_model: 3072,
        n_layers: 28,
        n_heads: 24,
        n_kv_heads: 8,
        ffn_dim: 8192,
        vocab_size: 128_256,
        context_length: 131_072,
        rope_theta: 500_000.0,
        rms_eps: 1e-5,
        tied: true,
    },
    Shape {
        name: "llama-8b", // Llama 3.1 8B
        d_model: 4096,
        n_layers: 32,
        n_heads: 32,
        n_kv_heads: 8,
        ffn_dim: 14336,
        vocab_size: 128_256,
        context_length: 131_072,
        rope_theta: 500_000.0,
        rms_eps: 1e-5,
        tied: false,
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
        self.d_model / self.n_heads
    }

    /// Every tensor's GGUF name and row-major shape, in file order.
    fn tensors(&self) -> Vec<(String, Vec<usize>)> {
        let (d, hd, ffn) = (self.d_model, self.head_dim(), self.ffn_dim);
        let (qd, kvd) = (self.n_heads * hd, self.n_kv_heads * hd);
        let mut t = vec![("token_embd.weight".to_string(), vec![self.vocab_size, d])];
        for i in 0..self.n_layers {
            let layer: [(&str, Vec<usize>); 9] = [
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
            t.extend(layer.into_iter().map(|(n, s)| (format!("blk.{i}.{n}"), s)));
        }
        t.push(("output_norm.weight".to_string(), vec![d]));
        if !self.tied {
            t.push(("output.weight".to_string(), vec![self.vocab_size, d]));
        }
        t
    }

    /// The model's `general.*` and `llama.*` metadata.
    fn metadata(&self) -> Vec<(String, MetaValue)> {
        let u32_of = |v: usize| MetaValue::U32(v as u32);
        let entries = [
            ("general.architecture", MetaValue::String("llama".into())),
            (
                "general.name",
                MetaValue::String(format!("synthetic {} (random weights)", self.name)),
            ),
            ("llama.vocab_size", u32_of(self.vocab_size)),
            ("llama.context_length", u32_of(self.context_length)),
            ("llama.embedding_length", u32_of(self.d_model)),
            ("llama.block_count", u32_of(self.n_layers)),
            ("llama.feed_forward_length", u32_of(self.ffn_dim)),
            ("llama.rope.dimension_count", u32_of(self.head_dim())),
            ("llama.attention.head_count", u32_of(self.n_heads)),
            ("llama.attention.head_count_kv", u32_of(self.n_kv_heads)),
            ("llama.rope.freq_base", MetaValue::F32(self.rope_theta)),
            (
                "llama.attention.layer_norm_rms_epsilon",
                MetaValue::F32(self.rms_eps),
            ),
        ];
        entries
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
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
/// the longest pieces.
fn tokenizer_metadata(vocab_size: usize) -> Vec<(String, MetaValue)> {
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
    tokens.truncate(vocab_size);
    types.resize(vocab_size, TOKEN_NORMAL);
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
        .chain(tokenizer_metadata(shape.vocab_size))
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
    let normal = Normal::new(0.0f32, WEIGHT_STD)
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
                Ok(if is_norm {
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
            let meta = tokenizer_metadata(n);
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
            assert_eq!(s.d_model % s.n_heads, 0, "{}", s.name);
            assert_eq!(s.n_heads % s.n_kv_heads, 0, "{}", s.name);
            assert!(matches!(s.head_dim(), 64 | 128), "{}", s.name);
        }
    }
}
