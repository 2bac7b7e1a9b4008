//! [`SentenceEncoder`]: a sentence-transformers folder around a [`Bert`]:
//! tokenization, length-sorted padded batches, pooling ([`Pooling`]) and L2
//! normalisation; and [`cosine`] to compare the vectors.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use silica::{DType, Device, Tensor};
use tokenizers::{Tokenizer as HfTokenizer, TruncationParams};

use super::Bert;
use super::config::{json_error, read_text};
use crate::{Error, Result};

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
    /// Loads a sentence-transformers folder (see [`crate::resolve::resolve_encoder`]):
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
