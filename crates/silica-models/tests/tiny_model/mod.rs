//! A tiny Llama-shaped decoder with random weights, written as a GGUF file
//! into a temporary directory, for tests that need a whole model but not a
//! download: 2 layers, d_model 64, 4 heads (2 KV heads), 128 feed-forward
//! units, a 512-token SentencePiece-style vocabulary and a context of
//! 1,280 tokens. Matrices are Q8_0 and Q4_0 (as real files hold them),
//! norms f32, the output projection tied to the embedding.
//!
//! The embedding rows of the special tokens (`<unk>`, `<s>`, `</s>`), the
//! 256 byte tokens and `▁` are zero, so their logits are exactly 0 while
//! the other 252 tokens' logits spread on both sides of it: greedy decoding
//! never picks end-of-sequence or a raw byte, and a generation runs for as
//! many tokens as asked, in plain letters.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use silica::{DType, Device, QTensor, QuantFormat, Tensor};
use silica_models::gguf::{GgmlType, GgufFile, GgufWriter, MetaValue};
use silica_models::llama::Llama;
use silica_models::resolve::resolve_decoder;
use silica_models::tokenizer::Tokenizer;

#[path = "../common/letters.rs"]
mod letters;
use letters::letters;

pub const D_MODEL: usize = 64;
pub const LAYERS: usize = 2;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const FFN: usize = 128;
pub const VOCAB: usize = 512;
pub const CONTEXT: usize = 1280;
/// Tokens 0..SPECIAL (special, byte and `▁` tokens) have zero embeddings.
const SPECIAL: usize = 260;

/// A GGUF file in its own temporary directory, removed on drop.
pub struct TinyModelFile {
    dir: PathBuf,
    pub path: PathBuf,
}

impl Drop for TinyModelFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tokenizer_metadata(w: &mut GgufWriter) {
    // <unk> <s> </s>, 256 byte tokens, ▁, then ▁a a ▁b b ...
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![2i32, 3, 3]; // unknown, control, control
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    types.resize(tokens.len(), 6); // byte
    tokens.push("▁".into());
    let mut n = 0;
    while tokens.len() < VOCAB {
        tokens.push(format!("▁{}", letters(n)));
        tokens.push(letters(n));
        n += 1;
    }
    tokens.truncate(VOCAB);
    types.resize(VOCAB, 1); // normal
    let scores: Vec<MetaValue> = (0..VOCAB)
        .map(|id| MetaValue::F32(if types[id] == 1 { -(id as f32) } else { 0.0 }))
        .collect();
    let entries = [
        ("tokenizer.ggml.model", MetaValue::String("llama".into())),
        (
            "tokenizer.ggml.tokens",
            MetaValue::Array(tokens.into_iter().map(MetaValue::String).collect()),
        ),
        ("tokenizer.ggml.scores", MetaValue::Array(scores)),
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
    for (k, v) in entries {
        w.metadata(k, v).unwrap();
    }
}

/// Normal samples times `std`, `[rows, cols]` f32 on the CPU.
fn normal(rows: usize, cols: usize, std: f32, seed: u64) -> Tensor {
    Tensor::randn(&[rows, cols], DType::F32, seed, &Device::cpu())
        .unwrap()
        .mul_scalar(std)
        .unwrap()
}

fn add_quantized(w: &mut GgufWriter, name: &str, t: &Tensor, format: QuantFormat) {
    let (ty, q) = match format {
        QuantFormat::Q8_0 => (GgmlType::Q8_0, QuantFormat::Q8_0),
        _ => (GgmlType::Q4_0, QuantFormat::Q4_0),
    };
    let bytes = QTensor::quantize(t, q).unwrap().to_bytes().unwrap();
    w.add_tensor(name, t.shape(), ty, bytes).unwrap();
}

fn add_f32(w: &mut GgufWriter, name: &str, t: &Tensor) {
    let v: Vec<f32> = t.to_vec().unwrap();
    let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    w.add_tensor(name, t.shape(), GgmlType::F32, bytes).unwrap();
}

/// Writes the tiny model (weights drawn from `seed`) into a new temporary
/// directory named after `tag`.
pub fn write(tag: &str, seed: u64) -> TinyModelFile {
    let dir = std::env::temp_dir().join(format!("silica-tiny-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny-llama.gguf");
    let hd = D_MODEL / HEADS;
    let mut w = GgufWriter::new();
    let u = |v: usize| MetaValue::U32(v as u32);
    let meta = [
        ("general.architecture", MetaValue::String("llama".into())),
        (
            "general.name",
            MetaValue::String("tiny random llama".into()),
        ),
        ("llama.vocab_size", u(VOCAB)),
        ("llama.context_length", u(CONTEXT)),
        ("llama.embedding_length", u(D_MODEL)),
        ("llama.block_count", u(LAYERS)),
        ("llama.feed_forward_length", u(FFN)),
        ("llama.rope.dimension_count", u(hd)),
        ("llama.attention.head_count", u(HEADS)),
        ("llama.attention.head_count_kv", u(KV_HEADS)),
        ("llama.rope.freq_base", MetaValue::F32(10_000.0)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-5),
        ),
    ];
    for (k, v) in meta {
        w.metadata(k, v).unwrap();
    }
    tokenizer_metadata(&mut w);

    let mut s = seed * 1000;
    let mut next = || {
        s += 1;
        s
    };
    // the embedding, with the special rows zeroed
    let embd = normal(VOCAB, D_MODEL, 1.0, next());
    let keep: Vec<f32> = (0..VOCAB)
        .map(|i| if i < SPECIAL { 0.0 } else { 1.0 })
        .collect();
    let keep = Tensor::from_vec(keep, &[VOCAB, 1], &Device::cpu()).unwrap();
    add_quantized(
        &mut w,
        "token_embd.weight",
        &embd.mul(&keep).unwrap(),
        QuantFormat::Q8_0,
    );
    let lin = 1.0 / (D_MODEL as f32).sqrt();
    let norm = |seed: u64| {
        Tensor::randn(&[D_MODEL], DType::F32, seed, &Device::cpu())
            .unwrap()
            .mul_scalar(0.1)
            .unwrap()
            .add_scalar(1.0)
            .unwrap()
    };
    for i in 0..LAYERS {
        let name = |n: &str| format!("blk.{i}.{n}");
        add_f32(&mut w, &name("attn_norm.weight"), &norm(next()));
        for (n, rows) in [
            ("attn_q.weight", HEADS * hd),
            ("attn_k.weight", KV_HEADS * hd),
            ("attn_v.weight", KV_HEADS * hd),
        ] {
            add_quantized(
                &mut w,
                &name(n),
                &normal(rows, D_MODEL, lin, next()),
                QuantFormat::Q8_0,
            );
        }
        let wo = normal(D_MODEL, HEADS * hd, lin, next());
        add_quantized(&mut w, &name("attn_output.weight"), &wo, QuantFormat::Q8_0);
        add_f32(&mut w, &name("ffn_norm.weight"), &norm(next()));
        let gate = normal(FFN, D_MODEL, lin, next());
        add_quantized(&mut w, &name("ffn_gate.weight"), &gate, QuantFormat::Q4_0);
        let up = normal(FFN, D_MODEL, lin, next());
        add_quantized(&mut w, &name("ffn_up.weight"), &up, QuantFormat::Q4_0);
        let down = normal(D_MODEL, FFN, 1.0 / (FFN as f32).sqrt(), next());
        add_quantized(&mut w, &name("ffn_down.weight"), &down, QuantFormat::Q4_0);
    }
    add_f32(&mut w, "output_norm.weight", &norm(next()));
    w.write_to_path(&path).unwrap();
    TinyModelFile { dir, path }
}

/// Which model a test runs: the tiny random one (the default), or the
/// default decoder (SmolLM2-135M-Instruct) with `SILICA_SOAK_MODEL=default`.
pub enum Model {
    Tiny(TinyModelFile),
    Default(PathBuf),
}

impl Model {
    pub fn from_env(tag: &str) -> Model {
        match std::env::var("SILICA_SOAK_MODEL").as_deref() {
            Ok("default") => {
                Model::Default(resolve_decoder(None).expect("the default decoder resolves"))
            }
            Ok(other) if !other.is_empty() && other != "tiny" => {
                panic!("SILICA_SOAK_MODEL is `default` or `tiny`, not {other:?}")
            }
            _ => Model::Tiny(write(tag, 1)),
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            Model::Tiny(f) => &f.path,
            Model::Default(p) => p,
        }
    }

    pub fn is_tiny(&self) -> bool {
        matches!(self, Model::Tiny(_))
    }

    pub fn name(&self) -> &'static str {
        match self {
            Model::Tiny(_) => "tiny random Llama",
            Model::Default(_) => "SmolLM2-135M-Instruct Q4_1",
        }
    }

    /// The model on `dev` (f32 activations) and its tokenizer.
    pub fn load(&self, dev: &Device) -> (Llama, Tokenizer) {
        let gguf = GgufFile::open(self.path()).unwrap();
        let model = Llama::load(&gguf, dev, DType::F32).unwrap();
        let tokenizer = Tokenizer::from_gguf(&gguf).unwrap();
        (model, tokenizer)
    }
}

/// The CPU and every GPU adapter (a failure, not a skip, when
/// `SILICA_REQUIRE_GPU=1` and there is none).
pub fn devices() -> Vec<Device> {
    let mut out = vec![Device::cpu()];
    let n = silica::adapters().len();
    if n == 0 {
        assert!(
            std::env::var("SILICA_REQUIRE_GPU").as_deref() != Ok("1"),
            "SILICA_REQUIRE_GPU=1 but no GPU adapter"
        );
        eprintln!("no GPU adapter: CPU only");
    }
    out.extend((0..n).map(|i| Device::gpu(i).expect("the adapter opens")));
    out
}
