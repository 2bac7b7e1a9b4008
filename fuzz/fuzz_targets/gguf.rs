//! GGUF parsing: header, metadata, tensor infos and data ranges, then every
//! accessor a model loader uses (typed metadata lookups, tensor bytes,
//! dequantization) and the Llama config read from the metadata.

#![no_main]

use libfuzzer_sys::fuzz_target;
use silica_models::gguf::GgufFile;
use silica_models::llama::LlamaConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec(), "fuzz.gguf") else {
        return;
    };
    let len = data.len() as u64;
    assert!(file.data_offset() <= len.next_multiple_of(file.alignment()));
    for (key, value) in file.metadata() {
        // keys are unique: the lookup finds this very value (compared by
        // address, as a NaN is not equal to itself)
        assert!(file.get(key).is_some_and(|v| std::ptr::eq(v, value)));
        let _ = file.get_u64(key);
        let _ = file.get_f64(key);
        let _ = file.get_str(key);
    }
    for info in file.tensors() {
        // the parser checked the range: the bytes are all there
        let bytes = file.tensor_bytes(info);
        assert_eq!(bytes.len() as u64, info.size);
        assert!(info.offset + info.size <= len);
        assert_eq!(file.tensor_info(&info.name), Some(info));
        let _ = info.shape();
        if let Ok((shape, values)) = file.dequantize(&info.name) {
            assert_eq!(shape.iter().product::<usize>(), values.len());
        }
    }
    if let Ok(config) = LlamaConfig::from_gguf(&file) {
        // the head size may differ from d_model / n_heads (Qwen3), but it
        // is one the attention kernels take
        assert!(config.head_dim > 0 && config.head_dim % 2 == 0 && config.head_dim <= 256);
        assert_eq!(config.n_heads % config.n_kv_heads, 0);
        // Phi-3's rotated part of a head is a whole number of pairs within it
        if let Some(p) = &config.phi3 {
            assert!(p.rope_dim > 0 && p.rope_dim % 2 == 0 && p.rope_dim <= config.head_dim);
        }
    }
});
