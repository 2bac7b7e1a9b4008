//! `config.json` parsing for BERT-family encoders (BERT and DistilBERT
//! field names, defaults, validation).

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use silica_models::bert::BertConfig;

fuzz_target!(|data: &[u8]| {
    // the file reader rejects invalid UTF-8 before parsing
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = BertConfig::from_json(text, Path::new("config.json")) {
        assert!(config.head_dim() > 0);
        assert_eq!(
            config.head_dim() * config.num_attention_heads,
            config.hidden_size
        );
    }
});
