//! Dequantization of GGML block formats (placeholder: being written).
