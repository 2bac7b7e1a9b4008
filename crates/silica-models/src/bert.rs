//! BERT-family encoders (BERT, MiniLM, DistilBERT) and sentence embeddings
//! as sentence-transformers computes them.
//!
//! * [`BertConfig`]: a Hugging Face `config.json` (BERT's field names or
//!   DistilBERT's `dim`/`n_layers`/`n_heads`/`hidden_dim`).
//! * [`Bert`]: the encoder itself, from a `model.safetensors`, on any device in
//!   F32, F16 or BF16: `forward(input_ids [B,T], attention_mask [B,T],
//!   token_type_ids) -> [B,T,H]`.
//! * [`SentenceEncoder`]: a sentence-transformers folder (the encoder, its
//!   `tokenizer.json`, `modules.json`, `1_Pooling/config.json`,
//!   `sentence_bert_config.json`): tokenizes, batches with padding, pools
//!   (mean, CLS, max) and L2-normalises.
//!
//! ```no_run
//! use silica::{DType, Device};
//! use silica_models::bert::{SentenceEncoder, cosine};
//! let dir = silica_models::encoder_resolve::resolve_encoder(None)?;
//! let enc = SentenceEncoder::load(&dir, &Device::best()?, DType::F32)?;
//! let v = enc.embed(&["The weather is lovely today.", "It's so sunny outside!"])?;
//! println!("{:.4}", cosine(&v[0], &v[1])); // 0.6660
//! # Ok::<(), silica_models::Error>(())
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;
use silica::{AttentionOpts, DType, Device, Tensor};
use tokenizers::{Tokenizer as HfTokenizer, TruncationParams};

use crate::safetensors::SafetensorsFile;
use crate::{Error, Result};

/// Which family's weight names a checkpoint uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// BERT, MiniLM, RoBERTa-style names (`encoder.layer.N.attention.self.query`).
    Bert,
    /// DistilBERT names (`transformer.layer.N.attention.q_lin`); no token types.
    DistilBert,
}

/// The feed-forward activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `gelu`: the exact GELU, with erf.
    GeluErf,
    /// `gelu_new` / `gelu_pytorch_tanh`: the tanh approximation.
    GeluTanh,
}

/// The hyper-parameters of a BERT-family encoder. Missing fields take the
/// defaults of transformers' `BertConfig` (or `DistilBertConfig`).
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: Activation,
    pub max_position_embeddings: usize,
    /// 0 when the model has no token-type (segment) embeddings.
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
    pub pad_token_id: u32,
}

/// `config.json` as written by transformers for BERT and DistilBERT.
#[derive(Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    dim: Option<usize>,
    num_hidden_layers: Option<usize>,
    n_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    n_heads: Option<usize>,
    intermediate_size: Option<usize>,
    hidden_dim: Option<usize>,
    hidden_act: Option<String>,
    activation: Option<String>,
    max_position_embeddings: Option<usize>,
    type_vocab_size: Option<usize>,
    layer_norm_eps: Option<f64>,
    pad_token_id: Option<u32>,
    position_embedding_type: Option<String>,
}

impl BertConfig {
    /// Reads a `config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<BertConfig> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&text, path)
    }

    /// Parses the text of a `config.json`; `path` is for error messages.
    pub fn from_json(text: &str, path: &Path) -> Result<BertConfig> {
        let raw: RawConfig = serde_json::from_str(text).map_err(|e| json_error(path, text, &e))?;
        let distil = raw.model_type.as_deref() == Some("distilbert")
            || raw.dim.is_some()
            || raw.n_layers.is_some()
            || raw.n_heads.is_some();
        let unsupported = |what: String| Error::Unsupported {
            path: path.to_path_buf(),
            what,
        };
        let act = raw
            .hidden_act
            .or(raw.activation)
            .unwrap_or_else(|| "gelu".into());
        let hidden_act = match act.as_str() {
            "gelu" => Activation::GeluErf,
            "gelu_new" | "gelu_pytorch_tanh" => Activation::GeluTanh,
            other => {
                return Err(unsupported(format!(
                    "hidden_act `{other}` (supported: gelu, gelu_new, gelu_pytorch_tanh)"
                )));
            }
        };
        if let Some(p) = raw.position_embedding_type.as_deref()
            && p != "absolute"
        {
            return Err(unsupported(format!(
                "position_embedding_type `{p}` (only absolute)"
            )));
        }
        let config = BertConfig {
            architecture: if distil {
                Architecture::DistilBert
            } else {
                Architecture::Bert
            },
            vocab_size: raw.vocab_size.unwrap_or(30522),
            hidden_size: raw.hidden_size.or(raw.dim).unwrap_or(768),
            num_hidden_layers: raw.num_hidden_layers.or(raw.n_layers).unwrap_or(if distil {
                6
            } else {
                12
            }),
            num_attention_heads: raw.num_attention_heads.or(raw.n_heads).unwrap_or(12),
            intermediate_size: raw.intermediate_size.or(raw.hidden_dim).unwrap_or(3072),
            hidden_act,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(512),
            type_vocab_size: if distil {
                0
            } else {
                raw.type_vocab_size.unwrap_or(2)
            },
            layer_norm_eps: raw.layer_norm_eps.unwrap_or(1e-12),
            pad_token_id: raw.pad_token_id.unwrap_or(0),
        };
        config.validate(path)?;
        Ok(config)
    }

    fn validate(&self, path: &Path) -> Result<()> {
        let bad = |msg: String| Error::Format {
            path: path.to_path_buf(),
            offset: 0,
            msg,
        };
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(bad(format!("{name} is 0")));
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(bad(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            )));
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps >= 0.0) {
            return Err(bad(format!("layer_norm_eps {}", self.layer_norm_eps)));
        }
        Ok(())
    }

    /// The size of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }
}

/// A serde_json error as [`Error::Format`] with the byte offset of the problem.
fn json_error(path: &Path, text: &str, e: &serde_json::Error) -> Error {
    let mut offset = 0usize;
    if e.line() > 0 {
        for (i, l) in text.split('\n').enumerate() {
            if i + 1 == e.line() {
                offset += e.column().saturating_sub(1).min(l.len());
                break;
            }
            offset += l.len() + 1;
        }
    }
    Error::Format {
        path: path.to_path_buf(),
        offset: offset as u64,
        msg: format!("invalid JSON: {e}"),
    }
}

/// A dense layer: `x @ w.T + b` with `w` of shape `[out, in]`.
struct Linear {
    w: Tensor,
    b: Tensor,
}

impl Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.matmul(&self.w.t()?)?.add(&self.b)?)
    }
}

/// LayerNorm over the last dimension (one fused op, computed in f32
/// whatever the model dtype).
struct LayerNorm {
    w: Tensor,
    b: Tensor,
    eps: f32,
}

impl LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.layer_norm(&self.w, &self.b, self.eps)?)
    }
}

struct Layer {
    /// Query, key and value fused into one `[3H, H]` product; the query rows
    /// are pre-scaled by `1/sqrt(head_dim)`.
    qkv: Linear,
    attn_out: Linear,
    attn_ln: LayerNorm,
    intermediate: Linear,
    output: Linear,
    out_ln: LayerNorm,
}

/// A BERT-family encoder on one device.
pub struct Bert {
    config: BertConfig,
    device: Device,
    dtype: DType,
    word: Tensor,
    position: Tensor,
    token_type: Option<Tensor>,
    emb_ln: LayerNorm,
    layers: Vec<Layer>,
}

impl std::fmt::Debug for Bert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bert")
            .field("config", &self.config)
            .field("device", &self.device)
            .field("dtype", &self.dtype)
            .finish_non_exhaustive()
    }
}

/// Weight names of one architecture.
struct Names {
    word: &'static str,
    position: &'static str,
    token_type: &'static str,
    emb_ln: &'static str,
    layer: &'static str,
    q: &'static str,
    k: &'static str,
    v: &'static str,
    attn_out: &'static str,
    attn_ln: &'static str,
    intermediate: &'static str,
    output: &'static str,
    out_ln: &'static str,
}

const BERT_NAMES: Names = Names {
    word: "embeddings.word_embeddings.weight",
    position: "embeddings.position_embeddings.weight",
    token_type: "embeddings.token_type_embeddings.weight",
    emb_ln: "embeddings.LayerNorm",
    layer: "encoder.layer",
    q: "attention.self.query",
    k: "attention.self.key",
    v: "attention.self.value",
    attn_out: "attention.output.dense",
    attn_ln: "attention.output.LayerNorm",
    intermediate: "intermediate.dense",
    output: "output.dense",
    out_ln: "output.LayerNorm",
};

const DISTILBERT_NAMES: Names = Names {
    word: "embeddings.word_embeddings.weight",
    position: "embeddings.position_embeddings.weight",
    token_type: "",
    emb_ln: "embeddings.LayerNorm",
    layer: "transformer.layer",
    q: "attention.q_lin",
    k: "attention.k_lin",
    v: "attention.v_lin",
    attn_out: "attention.out_lin",
    attn_ln: "sa_layer_norm",
    intermediate: "ffn.lin1",
    output: "ffn.lin2",
    out_ln: "output_layer_norm",
};

/// Reads weights with shape checks.
struct Loader<'a> {
    st: &'a SafetensorsFile,
    device: &'a Device,
    dtype: DType,
}

impl Loader<'_> {
    fn tensor(&self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.st.load_shaped(name, shape, self.device, dtype)
    }

    fn linear(&self, prefix: &str, out: usize, inp: usize) -> Result<Linear> {
        Ok(Linear {
            w: self.tensor(&format!("{prefix}.weight"), &[out, inp], self.dtype)?,
            b: self.tensor(&format!("{prefix}.bias"), &[out], self.dtype)?,
        })
    }

    /// `prefix.weight`/`prefix.bias`, or the older `gamma`/`beta`.
    fn layer_norm(&self, prefix: &str, size: usize, eps: f64) -> Result<LayerNorm> {
        let (w, b) = if self.st.contains(&format!("{prefix}.weight")) {
            ("weight", "bias")
        } else if self.st.contains(&format!("{prefix}.gamma")) {
            ("gamma", "beta")
        } else {
            ("weight", "bias")
        };
        Ok(LayerNorm {
            w: self.tensor(&format!("{prefix}.{w}"), &[size], self.dtype)?,
            b: self.tensor(&format!("{prefix}.{b}"), &[size], self.dtype)?,
            eps: eps as f32,
        })
    }
}

impl Bert {
    /// Loads `config.json` and `model.safetensors` from the folder `dir`.
    pub fn load(dir: impl AsRef<Path>, device: &Device, dtype: DType) -> Result<Bert> {
        let dir = dir.as_ref();
        let config = BertConfig::from_file(dir.join("config.json"))?;
        let st = SafetensorsFile::open(dir.join("model.safetensors"))?;
        Bert::from_safetensors(config, &st, device, dtype)
    }

    /// Builds the encoder from the weights of `st` (names with or without a
    /// `bert.`/`model.`/`distilbert.` prefix) in `dtype` (F32, F16 or BF16).
    pub fn from_safetensors(
        config: BertConfig,
        st: &SafetensorsFile,
        device: &Device,
        dtype: DType,
    ) -> Result<Bert> {
        if !dtype.is_float() {
            return Err(Error::InvalidInput(format!(
                "a BERT model runs in f32, f16 or bf16, not {dtype}"
            )));
        }
        let names = match config.architecture {
            Architecture::Bert => &BERT_NAMES,
            Architecture::DistilBert => &DISTILBERT_NAMES,
        };
        let ld = Loader { st, device, dtype };
        let h = config.hidden_size;
        let eps = config.layer_norm_eps;
        let word = ld.tensor(names.word, &[config.vocab_size, h], dtype)?;
        let position = ld.tensor(names.position, &[config.max_position_embeddings, h], dtype)?;
        let token_type = if config.type_vocab_size > 0 {
            Some(ld.tensor(names.token_type, &[config.type_vocab_size, h], dtype)?)
        } else {
            None
        };
        let emb_ln = ld.layer_norm(names.emb_ln, h, eps)?;
        let scale = 1.0 / (config.head_dim() as f32).sqrt();
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("{}.{i}", names.layer);
            let q = ld.linear(&format!("{p}.{}", names.q), h, h)?;
            let k = ld.linear(&format!("{p}.{}", names.k), h, h)?;
            let v = ld.linear(&format!("{p}.{}", names.v), h, h)?;
            let qkv = Linear {
                w: Tensor::cat(&[&q.w.mul_scalar(scale)?, &k.w, &v.w], 0)?,
                b: Tensor::cat(&[&q.b.mul_scalar(scale)?, &k.b, &v.b], 0)?,
            };
            layers.push(Layer {
                qkv,
                attn_out: ld.linear(&format!("{p}.{}", names.attn_out), h, h)?,
                attn_ln: ld.layer_norm(&format!("{p}.{}", names.attn_ln), h, eps)?,
                intermediate: ld.linear(
                    &format!("{p}.{}", names.intermediate),
                    config.intermediate_size,
                    h,
                )?,
                output: ld.linear(
                    &format!("{p}.{}", names.output),
                    h,
                    config.intermediate_size,
                )?,
                out_ln: ld.layer_norm(&format!("{p}.{}", names.out_ln), h, eps)?,
            });
        }
        Ok(Bert {
            config,
            device: device.clone(),
            dtype,
            word,
            position,
            token_type,
            emb_ln,
            layers,
        })
    }

    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The last hidden states `[B, T, H]` (in the model dtype).
    ///
    /// `input_ids`: `[B, T]`, U32 or I64. `attention_mask`: `[B, T]`, any
    /// dtype, 1 for real tokens and 0 for padding. `token_type_ids`: `[B, T]`
    /// U32 or I64, or `None` for all zeros (ignored by models without token
    /// types).
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        token_type_ids: Option<&Tensor>,
    ) -> Result<Tensor> {
        let cfg = &self.config;
        let &[b, t] = input_ids.shape() else {
            return Err(Error::InvalidInput(format!(
                "input_ids must have shape [batch, tokens], not {:?}",
                input_ids.shape()
            )));
        };
        if b == 0 || t == 0 {
            return Err(Error::InvalidInput(format!(
                "empty input of shape {:?}",
                input_ids.shape()
            )));
        }
        if t > cfg.max_position_embeddings {
            return Err(Error::InvalidInput(format!(
                "{t} tokens is more than the model's {} positions",
                cfg.max_position_embeddings
            )));
        }
        for (what, shape) in [
            ("attention_mask", Some(attention_mask.shape())),
            ("token_type_ids", token_type_ids.map(Tensor::shape)),
        ] {
            if let Some(shape) = shape
                && shape != [b, t]
            {
                return Err(Error::InvalidInput(format!(
                    "{what} has shape {shape:?}, input_ids {:?}",
                    [b, t]
                )));
            }
        }
        let h = cfg.hidden_size;
        let n = b * t;

        // Embeddings: word + position + token type, then LayerNorm.
        let words = self.word.index_select(0, &input_ids.reshape(&[n])?)?;
        let mut x = words
            .reshape(&[b, t, h])?
            .add(&self.position.narrow(0, 0, t)?)?;
        if let Some(table) = &self.token_type {
            x = match token_type_ids {
                Some(tt) => x.add(
                    &table
                        .index_select(0, &tt.reshape(&[n])?)?
                        .reshape(&[b, t, h])?,
                )?,
                None => x.add(&table.narrow(0, 0, 1)?)?,
            };
        }
        let mut x = self.emb_ln.forward(&x.reshape(&[n, h])?)?;

        // The padding mask as an additive bias on the attention scores.
        let big = if self.dtype == DType::F16 {
            3.0e4
        } else {
            1.0e9
        };
        let bias = attention_mask
            .to_dtype(self.dtype)?
            .sub_scalar(1.0)?
            .mul_scalar(big)?
            .reshape(&[b, 1, 1, t])?;

        for layer in &self.layers {
            x = self.layer_forward(layer, &x, &bias, b, t)?;
        }
        Ok(x.reshape(&[b, t, h])?)
    }

    fn layer_forward(
        &self,
        layer: &Layer,
        x: &Tensor,
        bias: &Tensor,
        b: usize,
        t: usize,
    ) -> Result<Tensor> {
        let cfg = &self.config;
        let (h, nh, hd) = (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim());
        // [n, 3H] -> [B, T, 3, heads, head_dim]; q, k, v are views [B, T, heads, head_dim]
        let qkv = layer.qkv.forward(x)?.reshape(&[b, t, 3, nh, hd])?;
        let q = qkv.narrow(2, 0, 1)?.squeeze(2)?;
        let k = qkv.narrow(2, 1, 1)?.squeeze(2)?;
        let v = qkv.narrow(2, 2, 1)?.squeeze(2)?;
        // the query rows of the weights are pre-scaled: scale 1
        let opts = AttentionOpts {
            scale: 1.0,
            causal: false,
        };
        let ctx = q
            .attention(&k, &v, Some(bias), opts)?
            .reshape(&[b * t, h])?;
        let x = layer
            .attn_ln
            .forward(&layer.attn_out.forward(&ctx)?.add(x)?)?;
        let inter = layer.intermediate.forward(&x)?;
        let inter = match cfg.hidden_act {
            Activation::GeluErf => inter.gelu_erf()?,
            Activation::GeluTanh => inter.gelu_tanh()?,
        };
        layer
            .out_ln
            .forward(&layer.output.forward(&inter)?.add(&x)?)
    }
}

/// How token vectors become one sentence vector (`1_Pooling/config.json`).
/// With several modes on, the results are concatenated in this order, as
/// sentence-transformers does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pooling {
    pub cls: bool,
    pub max: bool,
    pub mean: bool,
    pub mean_sqrt_len: bool,
}

impl Default for Pooling {
    /// Mean pooling.
    fn default() -> Self {
        Pooling {
            cls: false,
            max: false,
            mean: true,
            mean_sqrt_len: false,
        }
    }
}

#[derive(Deserialize)]
struct RawPooling {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
    pooling_mode: Option<String>,
}

impl Pooling {
    /// Reads a sentence-transformers pooling `config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Pooling> {
        let path = path.as_ref();
        let text = read_text(path)?;
        let raw: RawPooling =
            serde_json::from_str(&text).map_err(|e| json_error(path, &text, &e))?;
        let unsupported = |what: &str| Error::Unsupported {
            path: path.to_path_buf(),
            what: format!("{what} pooling (supported: mean, cls, max, mean_sqrt_len_tokens)"),
        };
        let mut p = Pooling {
            cls: raw.pooling_mode_cls_token,
            max: raw.pooling_mode_max_tokens,
            mean: raw.pooling_mode_mean_tokens,
            mean_sqrt_len: raw.pooling_mode_mean_sqrt_len_tokens,
        };
        if let Some(mode) = raw.pooling_mode.as_deref() {
            match mode {
                "cls" => p.cls = true,
                "max" => p.max = true,
                "mean" => p.mean = true,
                "mean_sqrt_len_tokens" => p.mean_sqrt_len = true,
                other => return Err(unsupported(other)),
            }
        }
        if raw.pooling_mode_weightedmean_tokens {
            return Err(unsupported("weightedmean"));
        }
        if raw.pooling_mode_lasttoken {
            return Err(unsupported("lasttoken"));
        }
        if !(p.cls || p.max || p.mean || p.mean_sqrt_len) {
            return Err(Error::Format {
                path: path.to_path_buf(),
                offset: 0,
                msg: "no pooling mode is on".into(),
            });
        }
        Ok(p)
    }

    /// How many vectors the pooled result concatenates.
    pub fn modes(&self) -> usize {
        [self.cls, self.max, self.mean, self.mean_sqrt_len]
            .iter()
            .filter(|&&m| m)
            .count()
    }
}

#[derive(Deserialize)]
struct ModuleEntry {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct SbertConfig {
    max_seq_length: Option<usize>,
    #[serde(default)]
    do_lower_case: bool,
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The default number of sentences per forward pass.
pub const DEFAULT_BATCH_SIZE: usize = 32;

/// A sentence-transformers model: tokenizer, encoder, pooling and (if
/// `modules.json` lists it) L2 normalisation.
pub struct SentenceEncoder {
    dir: PathBuf,
    model: Bert,
    tokenizer: HfTokenizer,
    pooling: Pooling,
    normalize: bool,
    lowercase: bool,
    max_seq_length: usize,
    pad_id: u32,
    batch_size: usize,
}

impl std::fmt::Debug for SentenceEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentenceEncoder")
            .field("dir", &self.dir)
            .field("model", &self.model)
            .field("pooling", &self.pooling)
            .field("normalize", &self.normalize)
            .field("max_seq_length", &self.max_seq_length)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

impl SentenceEncoder {
    /// Loads a sentence-transformers folder (see [`crate::encoder_resolve`]):
    /// `config.json`, `model.safetensors`, `tokenizer.json`, and when present
    /// `modules.json`, the pooling config and `sentence_bert_config.json`.
    pub fn load(dir: impl AsRef<Path>, device: &Device, dtype: DType) -> Result<SentenceEncoder> {
        let dir = dir.as_ref().to_path_buf();
        let model = Bert::load(&dir, device, dtype)?;

        // modules.json: Transformer, Pooling, Normalize (anything else, such
        // as a Dense projection, would change the vectors: refuse it).
        let mut pooling_dir = Some(dir.join("1_Pooling"));
        let mut normalize = false;
        let modules_path = dir.join("modules.json");
        if modules_path.is_file() {
            let text = read_text(&modules_path)?;
            let modules: Vec<ModuleEntry> =
                serde_json::from_str(&text).map_err(|e| json_error(&modules_path, &text, &e))?;
            pooling_dir = None;
            for m in &modules {
                let kind = m.kind.rsplit('.').next().unwrap_or_default();
                match kind {
                    "Transformer" => {}
                    "Pooling" => pooling_dir = Some(dir.join(&m.path)),
                    "Normalize" => normalize = true,
                    other => {
                        return Err(Error::Unsupported {
                            path: modules_path.clone(),
                            what: format!("sentence-transformers module {other}"),
                        });
                    }
                }
            }
        }
        let pooling = match pooling_dir.map(|d| d.join("config.json")) {
            Some(p) if p.is_file() => Pooling::from_file(&p)?,
            _ => Pooling::default(),
        };

        let sbert_path = dir.join("sentence_bert_config.json");
        let (max_seq_length, lowercase) = if sbert_path.is_file() {
            let text = read_text(&sbert_path)?;
            let c: SbertConfig =
                serde_json::from_str(&text).map_err(|e| json_error(&sbert_path, &text, &e))?;
            (c.max_seq_length, c.do_lower_case)
        } else {
            (None, false)
        };
        let positions = model.config().max_position_embeddings;
        let max_seq_length = max_seq_length.unwrap_or(positions).min(positions);

        let tok_path = dir.join("tokenizer.json");
        let mut tokenizer = HfTokenizer::from_file(&tok_path)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", tok_path.display())))?;
        let pad_id = tokenizer
            .get_padding()
            .map_or(model.config().pad_token_id, |p| p.pad_id);
        // tokenizer.json may carry its own padding and truncation (128 for
        // all-MiniLM-L6-v2); sentence-transformers overrides both: padding
        // to the longest of the batch, truncation at max_seq_length.
        tokenizer.with_padding(None); // batches are padded by embed_ids
        let mut encoder = SentenceEncoder {
            dir,
            model,
            tokenizer,
            pooling,
            normalize,
            lowercase,
            max_seq_length,
            pad_id,
            batch_size: DEFAULT_BATCH_SIZE,
        };
        encoder.set_max_seq_length(max_seq_length)?;
        Ok(encoder)
    }

    /// Sets how many sentences go through the model at once (at least 1).
    pub fn with_batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size.max(1);
        self
    }

    /// Changes the truncation length (in tokens, special tokens included).
    pub fn set_max_seq_length(&mut self, max_seq_length: usize) -> Result<()> {
        let positions = self.model.config().max_position_embeddings;
        let specials = self.tokenizer.get_post_processor().map_or(0, |p| {
            use tokenizers::PostProcessor;
            p.added_tokens(false)
        });
        if max_seq_length <= specials || max_seq_length > positions {
            return Err(Error::InvalidInput(format!(
                "max_seq_length {max_seq_length} must be in {}..={positions}",
                specials + 1
            )));
        }
        self.tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_seq_length,
                ..TruncationParams::default()
            }))
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        self.max_seq_length = max_seq_length;
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn model(&self) -> &Bert {
        &self.model
    }

    pub fn device(&self) -> &Device {
        self.model.device()
    }

    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Whether embeddings are scaled to unit length.
    pub fn normalizes(&self) -> bool {
        self.normalize
    }

    pub fn max_seq_length(&self) -> usize {
        self.max_seq_length
    }

    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The length of the embeddings.
    pub fn dim(&self) -> usize {
        self.model.config().hidden_size * self.pooling.modes()
    }

    /// The token ids the model sees for `sentence`: special tokens added,
    /// truncated at [`SentenceEncoder::max_seq_length`].
    pub fn tokenize(&self, sentence: &str) -> Result<Vec<u32>> {
        let lowered;
        let text = if self.lowercase {
            lowered = sentence.to_lowercase();
            lowered.as_str()
        } else {
            sentence
        };
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// One embedding per sentence, in order.
    pub fn embed(&self, sentences: &[&str]) -> Result<Vec<Vec<f32>>> {
        self.embed_with_progress(sentences, |_, _| {})
    }

    /// Like [`SentenceEncoder::embed`], calling `progress(done, total)` after
    /// each batch. Sentences are sorted by length so that each batch pads
    /// little; the result is in the order of `sentences`.
    pub fn embed_with_progress(
        &self,
        sentences: &[&str],
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Vec<Vec<f32>>> {
        let ids: Vec<Vec<u32>> = sentences
            .iter()
            .map(|s| self.tokenize(s))
            .collect::<Result<_>>()?;
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(ids[i].len()));
        let mut out = vec![Vec::new(); ids.len()];
        let mut done = 0;
        for chunk in order.chunks(self.batch_size) {
            let batch: Vec<&[u32]> = chunk.iter().map(|&i| ids[i].as_slice()).collect();
            for (&i, v) in chunk.iter().zip(self.embed_ids(&batch)?) {
                out[i] = v;
            }
            done += chunk.len();
            progress(done, ids.len());
        }
        Ok(out)
    }

    /// Embeddings of already tokenized sentences, as one padded batch.
    pub fn embed_ids(&self, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let cfg = self.model.config();
        let (b, t) = (
            batch.len(),
            batch.iter().map(|s| s.len()).max().unwrap_or(0).max(1),
        );
        if t > cfg.max_position_embeddings {
            return Err(Error::InvalidInput(format!(
                "{t} tokens is more than the model's {} positions",
                cfg.max_position_embeddings
            )));
        }
        let mut ids = vec![self.pad_id; b * t];
        let mut mask = vec![0f32; b * t];
        for (row, s) in batch.iter().enumerate() {
            if let Some(&bad) = s.iter().find(|&&id| id as usize >= cfg.vocab_size) {
                return Err(Error::InvalidInput(format!(
                    "token id {bad} is outside the vocabulary of {} entries",
                    cfg.vocab_size
                )));
            }
            ids[row * t..row * t + s.len()].copy_from_slice(s);
            mask[row * t..row * t + s.len()].fill(1.0);
        }
        let dev = self.model.device();
        let ids = Tensor::from_vec(ids, &[b, t], dev)?;
        let mask = Tensor::from_vec(mask, &[b, t], dev)?;
        let hidden = self.model.forward(&ids, &mask, None)?;
        let pooled = self.pool(&hidden, &mask)?;
        let dim = pooled.shape()[1];
        let flat: Vec<f32> = pooled.to_vec()?;
        Ok(flat.chunks(dim).map(<[f32]>::to_vec).collect())
    }

    /// `[B, T, H]` hidden states and a `[B, T]` f32 mask to `[B, D]` in f32.
    fn pool(&self, hidden: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let h = hidden.to_dtype(DType::F32)?;
        let m = mask.unsqueeze(-1)?; // [B, T, 1]
        let mut parts = Vec::new();
        if self.pooling.cls {
            parts.push(h.narrow(1, 0, 1)?.squeeze(1)?);
        }
        if self.pooling.max {
            // padding positions become -1e9, as in sentence-transformers
            let masked = h.mul(&m)?.add(&m.sub_scalar(1.0)?.mul_scalar(1.0e9)?)?;
            parts.push(masked.max(1, false)?);
        }
        if self.pooling.mean || self.pooling.mean_sqrt_len {
            let sum = h.mul(&m)?.sum(1, false)?; // [B, H]
            let count = m.sum(1, false)?.maximum_scalar(1.0e-9)?; // [B, 1]
            if self.pooling.mean {
                parts.push(sum.div(&count)?);
            }
            if self.pooling.mean_sqrt_len {
                parts.push(sum.div(&count.sqrt()?)?);
            }
        }
        let refs: Vec<&Tensor> = parts.iter().collect();
        let pooled = if refs.len() == 1 {
            parts[0].clone()
        } else {
            Tensor::cat(&refs, -1)?
        };
        if !self.normalize {
            return Ok(pooled);
        }
        // torch.nn.functional.normalize: x / max(||x||, 1e-12)
        let norm = pooled
            .sqr()?
            .sum(-1, true)?
            .sqrt()?
            .maximum_scalar(1.0e-12)?;
        Ok(pooled.div(&norm)?)
    }
}

/// The cosine similarity of two vectors (0 when either is zero).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    (dot / (na.sqrt() * nb.sqrt())) as f32
}
