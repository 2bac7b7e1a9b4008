//! Tokenizers (placeholder: being written).
