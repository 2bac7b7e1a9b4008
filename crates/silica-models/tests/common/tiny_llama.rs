//! The tiny random-weight Llama-family models the tests write as GGUF
//! files, for tests that need a whole model but not a download. Every one
//! has a SentencePiece-style vocabulary (`<unk>`, `<s>`, `</s>`, the 256
//! byte tokens, `▁`, then `▁a`, `a`, `▁b`, `b`, ...) and is small enough
//! that loading it and filling its whole context take milliseconds.
//!
//! [`Tiny`] describes the shape; its weights come in two kinds:
//!
//! * [`Tiny::write`]: f32 uniform noise, with a separate output projection
//!   whose end-of-sequence row is zero while the other rows are large, so
//!   the most likely token is never `</s>`. [`Tiny::new`] is the shape the
//!   tests of the context and of bad input use.
//! * [`Tiny::write_quantized`]: matrices in Q8_0 and Q4_0 (as real files
//!   hold them), norms f32, the output projection tied to the embedding.
//!   The embedding rows of the special tokens, the byte tokens and `▁` are
//!   zero, so their logits are exactly 0 while the other tokens' logits
//!   spread on both sides of it: greedy decoding never picks
//!   end-of-sequence or a raw byte, and runs for as many tokens as asked, in
//!   plain letters. [`Tiny::quantized`] is the shape of [`Model`], the model
//!   of the soak and concurrency tests.
//!
//! Either way greedy generation runs until `max_tokens` or the context is
//! full, which is what the tests that use these models count on.
//!
//! Shared by the tests of silica-models and (through `#[path]`) of
//! silica-cli.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use silica::{DType, Device, QTensor, QuantFormat, Tensor};
use silica_models::gguf::{GgmlType, GgufFile, GgufWriter, MetaValue};
use silica_models::llama::Llama;
use silica_models::resolve::resolve_decoder;
use silica_models::tokenizer::Tokenizer;

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

/// Tokens `0..SPECIAL` are the special tokens, the byte tokens and `▁`.
const SPECIAL: usize = 260;

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

    /// A 2-layer model 64 wide (four heads, two KV heads), 128
    /// feed-forward units, 512 tokens and a context of 1,280 positions, for
    /// [`Tiny::write_quantized`] (every row a whole number of blocks).
    pub fn quantized() -> Tiny {
        Tiny {
            architecture: "llama",
            d_model: 64,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            ffn_dim: 128,
            vocab_size: 512,
            context_length: 1280,
            seed: 1,
        }
    }

    fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
    }

    /// Every tensor's name, row-major shape and the spread of its values
    /// (0: all ones, for the norms) in the f32 model.
    fn tensors(&self) -> Vec<(String, Vec<usize>, f32)> {
        let (d, ffn) = (self.d_model, self.ffn_dim);
        let kvd = self.n_kv_heads * self.head_dim();
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

    /// Bytes of the f32 weights [`Tiny::write`] writes.
    pub fn weight_bytes(&self) -> u64 {
        let elems: usize = self
            .tensors()
            .iter()
            .map(|(_, s, _)| s.iter().product::<usize>())
            .sum();
        elems as u64 * 4
    }

    /// A writer holding the model's hyper-parameters and vocabulary.
    fn writer(&self) -> GgufWriter {
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
            (format!("{a}.vocab_size"), u(self.vocab_size)),
            (format!("{a}.context_length"), u(self.context_length)),
            (format!("{a}.embedding_length"), u(self.d_model)),
            (format!("{a}.block_count"), u(self.n_layers)),
            (format!("{a}.feed_forward_length"), u(self.ffn_dim)),
            (format!("{a}.rope.dimension_count"), u(self.head_dim())),
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
        w
    }

    /// Writes the model with f32 weights to `path`.
    pub fn write(&self, path: &Path) {
        let mut w = self.writer();
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

    /// Writes the model with quantized matrices to `path` (`d_model` and
    /// `ffn_dim` must be multiples of 32, the quantization block).
    pub fn write_quantized(&self, path: &Path) {
        let (d, ffn, vocab) = (self.d_model, self.ffn_dim, self.vocab_size);
        let hd = self.head_dim();
        let mut w = self.writer();
        let mut s = u64::from(self.seed) * 1000;
        let mut next = || {
            s += 1;
            s
        };
        // the embedding, with the special rows zeroed
        let embd = normal(vocab, d, 1.0, next());
        let keep: Vec<f32> = (0..vocab)
            .map(|i| if i < SPECIAL { 0.0 } else { 1.0 })
            .collect();
        let keep = Tensor::from_vec(keep, &[vocab, 1], &Device::cpu()).unwrap();
        add_quantized(
            &mut w,
            "token_embd.weight",
            &embd.mul(&keep).unwrap(),
            QuantFormat::Q8_0,
        );
        let lin = 1.0 / (d as f32).sqrt();
        let norm = |seed: u64| {
            Tensor::randn(&[d], DType::F32, seed, &Device::cpu())
                .unwrap()
                .mul_scalar(0.1)
                .unwrap()
                .add_scalar(1.0)
                .unwrap()
        };
        for i in 0..self.n_layers {
            let name = |n: &str| format!("blk.{i}.{n}");
            add_f32(&mut w, &name("attn_norm.weight"), &norm(next()));
            for (n, rows) in [
                ("attn_q.weight", self.n_heads * hd),
                ("attn_k.weight", self.n_kv_heads * hd),
                ("attn_v.weight", self.n_kv_heads * hd),
            ] {
                add_quantized(
                    &mut w,
                    &name(n),
                    &normal(rows, d, lin, next()),
                    QuantFormat::Q8_0,
                );
            }
            let wo = normal(d, self.n_heads * hd, lin, next());
            add_quantized(&mut w, &name("attn_output.weight"), &wo, QuantFormat::Q8_0);
            add_f32(&mut w, &name("ffn_norm.weight"), &norm(next()));
            let gate = normal(ffn, d, lin, next());
            add_quantized(&mut w, &name("ffn_gate.weight"), &gate, QuantFormat::Q4_0);
            let up = normal(ffn, d, lin, next());
            add_quantized(&mut w, &name("ffn_up.weight"), &up, QuantFormat::Q4_0);
            let down = normal(d, ffn, 1.0 / (ffn as f32).sqrt(), next());
            add_quantized(&mut w, &name("ffn_down.weight"), &down, QuantFormat::Q4_0);
        }
        add_f32(&mut w, "output_norm.weight", &norm(next()));
        w.write_to_path(path).unwrap();
    }
}

/// The `n`-th string of the bijective base-26 numbering: a..z, aa..zz, ...
pub fn letters(mut n: usize) -> String {
    let mut s = Vec::new();
    loop {
        s.push(b'a' + (n % 26) as u8);
        if n < 26 {
            break;
        }
        n = n / 26 - 1;
    }
    s.reverse();
    String::from_utf8(s).expect("ASCII letters")
}

/// The tokenizer metadata of a `vocab_size`-token vocabulary (at least
/// [`SPECIAL`]).
fn vocabulary(vocab_size: usize) -> Vec<(String, MetaValue)> {
    const NORMAL: i32 = 1;
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3]; // unknown, control, control
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    types.resize(tokens.len(), 6); // byte
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

/// Normal samples times `std`, `[rows, cols]` f32 on the CPU.
fn normal(rows: usize, cols: usize, std: f32, seed: u64) -> Tensor {
    Tensor::randn(&[rows, cols], DType::F32, seed, &Device::cpu())
        .unwrap()
        .mul_scalar(std)
        .unwrap()
}

fn add_quantized(w: &mut GgufWriter, name: &str, t: &Tensor, format: QuantFormat) {
    let ty = match format {
        QuantFormat::Q8_0 => GgmlType::Q8_0,
        QuantFormat::Q4_0 => GgmlType::Q4_0,
        other => panic!("the tiny models use Q8_0 and Q4_0, not {other:?}"),
    };
    let bytes = QTensor::quantize(t, format).unwrap().to_bytes().unwrap();
    w.add_tensor(name, t.shape(), ty, bytes).unwrap();
}

fn add_f32(w: &mut GgufWriter, name: &str, t: &Tensor) {
    let v: Vec<f32> = t.to_vec().unwrap();
    let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    w.add_tensor(name, t.shape(), GgmlType::F32, bytes).unwrap();
}

/// A GGUF file in its own temporary directory, removed on drop.
pub struct TinyModelFile {
    dir: PathBuf,
    pub path: PathBuf,
}

impl TinyModelFile {
    /// Writes `tiny` with quantized matrices ([`Tiny::write_quantized`])
    /// into a new temporary directory named after `tag`.
    pub fn write_quantized(tag: &str, tiny: &Tiny) -> TinyModelFile {
        let dir = std::env::temp_dir().join(format!("silica-tiny-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tiny-llama.gguf");
        tiny.write_quantized(&path);
        TinyModelFile { dir, path }
    }
}

impl Drop for TinyModelFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Which model a test runs: the tiny quantized one ([`Tiny::quantized`],
/// the default), or the default decoder (SmolLM2-135M-Instruct) with
/// `SILICA_SOAK_MODEL=default`.
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
            _ => Model::Tiny(TinyModelFile::write_quantized(tag, &Tiny::quantized())),
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
