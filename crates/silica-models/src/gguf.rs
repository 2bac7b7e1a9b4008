//! GGUF files (placeholder: being written).
