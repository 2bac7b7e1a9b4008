//! Models for silica: file formats (GGUF, safetensors), tokenizers, and
//! transformer models (Llama-family decoders, BERT-family sentence encoders).

pub mod bert;
pub mod capture;
pub mod chat;
mod error;
mod file_bytes;
pub mod generate;
pub mod gguf;
pub mod kquant;
pub mod llama;
pub mod lora;
pub mod perplexity;
pub mod probe;
pub mod quant;
pub mod resolve;
pub mod safetensors;
pub mod sampling;
pub mod tokenizer;

pub use error::{Error, Result};
