//! [`BertConfig`]: the hyper-parameters of a BERT-family encoder, read from
//! a Hugging Face `config.json`; and the JSON helpers the sentence-encoder
//! files share with it.

use std::path::Path;

use serde::Deserialize;

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
        Self::from_json(&read_text(path)?, path)
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
pub(super) fn json_error(path: &Path, text: &str, e: &serde_json::Error) -> Error {
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

/// The text of a file, an [`Error::Io`] naming it when unreadable.
pub(super) fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}
