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
//! let dir = silica_models::resolve::resolve_encoder(None)?;
//! let enc = SentenceEncoder::load(&dir, &Device::best()?, DType::F32)?;
//! let v = enc.embed(&["The weather is lovely today.", "It's so sunny outside!"])?;
//! println!("{:.4}", cosine(&v[0], &v[1])); // 0.6660
//! # Ok::<(), silica_models::Error>(())
//! ```
//!
//! The three concerns live in their own files: `config.rs` (reading
//! `config.json`), `model.rs` (the encoder's weights and forward pass) and
//! `sentence.rs` (the sentence-transformers wrapper), so that the wrapper's
//! tokenizer and pooling code can change without touching the model.

mod config;
mod model;
mod sentence;

pub use config::{Activation, Architecture, BertConfig};
pub use model::Bert;
pub use sentence::{DEFAULT_BATCH_SIZE, Pooling, SentenceEncoder, cosine};
