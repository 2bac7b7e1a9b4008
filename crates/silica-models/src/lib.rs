//! Models for silica: file formats (GGUF, safetensors), tokenizers, and
//! transformer models (Llama-family decoders; BERT-family encoders to come).

mod error;
pub mod gguf;
pub mod quant;
pub mod resolve;
pub mod sampling;
pub mod tokenizer;

pub use error::{Error, Result};
