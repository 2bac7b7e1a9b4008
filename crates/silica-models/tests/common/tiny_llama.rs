//! A tiny random-weight Llama-family GGUF written by tests: f32 weights, a
//! SentencePiece-style vocabulary (`<unk>`, `<s>`, `</s>`, the 256 byte
//! tokens, `▁`, then `▁a`, `a`, `▁b`, `b`, ...) and a short context, so that
//! loading it and filling its whole context take milliseconds.
//!
//! The end-of-sequence row of the output projection is zero and the other
//! rows are large, so the most likely tokens are never `</s>` and greedy
//! generation runs until `max_tokens` or the context is full.
//!
//! Shared by the tests of silica-models and (through `#[path]`) of
//! silica-cli.
#![allow(dead_code)]

use std::path::Path;

use silica_models::gguf::{GgmlType, GgufWriter, MetaValue};

#[path = "letters.rs"]
mod letters;
use letters::letters;

/// The shape and metadata of a tiny model.
#[derive(Clone, Debug)]
pub struct Tiny {
    pub architecture: &'static str,
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub ffn_dim: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub seed: u32,
}

impl Tiny {
    /// A 2-layer model 128 wide (two heads of 64, one KV head) with 320
    /// tokens and a context of `context_length` positions: 1.6 MB of f32.
    pub fn new(context_length: usize) -> Tiny {
        Tiny {
            architecture: "llama",
            d_model: 128,
            n_layers: 2,
            n_heads: 2,
            n_kv_heads: 1,
            ffn_dim: 256,
            vocab_size: 320,
            context_length,
            seed: 1,
        }
    }

    /// Every tensor's name, row-major shape and the spread of its values
    /// (0: all ones, for the norms).
    fn tensors(&self) -> Vec<(String, Vec<usize>, f32)> {
        let (d, ffn) = (self.d_model, self.ffn_dim);
        let hd = d / self.n_heads;
        let kvd = self.n_kv_heads * hd;
        let mut t = vec![(
            "token_embd.weight".to_string(),
            vec![self.vocab_size, d],
            1.0,
        )];
        for i in 0..self.n_layers {
            let layer: [(&str, Vec<usize>, f32); 9] = [
                ("attn_norm.weight", vec![d], 0.0),
                ("attn_q.weight", vec![d, d], 0.1),
                ("attn_k.weight", vec![kvd, d], 0.1),
                ("attn_v.weight", vec![kvd, d], 0.1),
                ("attn_output.weight", vec![d, d], 0.1),
                ("ffn_norm.weight", vec![d], 0.0),
                ("ffn_gate.weight", vec![ffn, d], 0.1),
                ("ffn_up.weight", vec![ffn, d], 0.1),
                ("ffn_down.weight", vec![d, ffn], 0.1),
            ];
            t.extend(
                layer
                    .into_iter()
                    .map(|(n, s, a)| (format!("blk.{i}.{n}"), s, a)),
            );
        }
        t.push(("output_norm.weight".to_string(), vec![d], 0.0));
        t.push(("output.weight".to_string(), vec![self.vocab_size, d], 0.5));
        t
    }

    /// Bytes of f32 weights.
    pub fn weight_bytes(&self) -> u64 {
        let elems: usize = self
            .tensors()
            .iter()
            .map(|(_, s, _)| s.iter().product::<usize>())
            .sum();
        elems as u64 * 4
    }

    /// Writes the model to `path`.
    pub fn write(&self, path: &Path) {
        let hd = self.d_model / self.n_heads;
        let a = self.architecture;
        let u = |v: usize| MetaValue::U32(v as u32);
        let mut w = GgufWriter::new();
        let meta = [
            (
                "general.architecture".to_string(),
                MetaValue::String(a.into()),
            ),
            (
                "general.name".into(),
                MetaValue::String("tiny test model".into()),
            ),
            (format!("{a}.context_length"), u(self.context_length)),
            (format!("{a}.embedding_length"), u(self.d_model)),
            (format!("{a}.block_count"), u(self.n_layers)),
            (format!("{a}.feed_forward_length"), u(self.ffn_dim)),
            (format!("{a}.rope.dimension_count"), u(hd)),
            (format!("{a}.attention.head_count"), u(self.n_heads)),
            (format!("{a}.attention.head_count_kv"), u(self.n_kv_heads)),
            (format!("{a}.rope.freq_base"), MetaValue::F32(10_000.0)),
            (
                format!("{a}.attention.layer_norm_rms_epsilon"),
                MetaValue::F32(1e-5),
            ),
        ];
        for (k, v) in meta.into_iter().chain(vocabulary(self.vocab_size)) {
            w.metadata(k, v).unwrap();
        }
        let mut state = self.seed.wrapping_mul(2_654_435_761).max(1);
        for (name, shape, spread) in self.tensors() {
            let n: usize = shape.iter().product();
            let mut values: Vec<f32> = (0..n)
                .map(|_| {
                    if spread == 0.0 {
                        return 1.0;
                    }
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    (state as f32 / u32::MAX as f32 * 2.0 - 1.0) * spread
                })
                .collect();
            if name == "output.weight" {
                // the row of `</s>` (id 2): its logit is always 0
                values[2 * self.d_model..3 * self.d_model].fill(0.0);
            }
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            w.add_tensor(name, &shape, GgmlType::F32, bytes).unwrap();
        }
        w.write_to_path(path).unwrap();
    }
}

/// The tokenizer metadata of a `vocab_size`-token vocabulary (at least 260).
fn vocabulary(vocab_size: usize) -> Vec<(String, MetaValue)> {
    const NORMAL: i32 = 1;
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    types.resize(tokens.len(), 6);
    tokens.push("▁".into());
    let mut n = 0;
    while tokens.len() < vocab_size {
        tokens.push(format!("▁{}", letters(n)));
        tokens.push(letters(n));
        n += 1;
    }
    tokens.truncate(vocab_size);
    types.resize(vocab_size, NORMAL);
    let scores = (0..vocab_size).map(|id| {
        MetaValue::F32(if types[id] == NORMAL {
            -(id as f32)
        } else {
            0.0
        })
    });
    let string = |s: &str| MetaValue::String(s.into());
    vec![
        ("tokenizer.ggml.model".into(), string("llama")),
        (
            "tokenizer.ggml.tokens".into(),
            MetaValue::Array(tokens.into_iter().map(MetaValue::String).collect()),
        ),
        (
            "tokenizer.ggml.scores".into(),
            MetaValue::Array(scores.collect()),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            MetaValue::Array(types.into_iter().map(MetaValue::I32).collect()),
        ),
        ("tokenizer.ggml.unknown_token_id".into(), MetaValue::U32(0)),
        ("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(2)),
        ("tokenizer.ggml.add_bos_token".into(), MetaValue::Bool(true)),
        (
            "tokenizer.ggml.add_eos_token".into(),
            MetaValue::Bool(false),
        ),
    ]
}
