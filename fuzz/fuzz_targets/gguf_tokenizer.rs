//! Tokenizer construction from GGUF metadata (`tokenizer.ggml.*`: model,
//! pre-tokenizer, tokens, types, scores, merges, special ids), then encoding
//! and decoding: texts with special tokens and bytes the vocabulary may lack,
//! arbitrary ids and ids past the vocabulary.

#![no_main]

use libfuzzer_sys::fuzz_target;
use silica_models::gguf::GgufFile;
use silica_models::tokenizer::Tokenizer;

const TEXTS: &[&str] = &[
    "Hello world! It's 2026, isn't it?  12345 x  1",
    "<|im_start|>user\nhé ünïcödé 日本語 🦀<|im_end|>\n",
    " \t\r\n  ",
    "<s></s><unk>▁▁a",
];

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec(), "fuzz.gguf") else {
        return;
    };
    let Ok(tok) = Tokenizer::from_gguf(&file) else {
        return;
    };
    // the copying constructor reads the same keys
    let copy = Tokenizer::from_gguf_metadata(&|k| file.get(k).cloned())
        .expect("both constructors accept the same metadata");
    let n = tok.vocab_size();
    assert_eq!(copy.vocab_size(), n);
    assert!(n > 0);
    for id in [tok.bos_id(), tok.eos_id()].into_iter().flatten() {
        assert!((id as usize) < n);
    }
    for &id in tok.eos_ids() {
        assert!((id as usize) < n);
        assert!(tok.is_eos(id));
    }

    // a text made of the vocabulary's own first tokens
    let joined: String = (0..n.min(16) as u32)
        .filter_map(|id| tok.id_to_token(id))
        .collect();
    for text in TEXTS.iter().copied().chain([joined.as_str()]) {
        for add_special in [false, true] {
            if let Ok(ids) = tok.encode(text, add_special) {
                let _ = tok.decode(&ids);
            }
        }
    }

    // every id of a small vocabulary, one at a time and streamed
    let ids: Vec<u32> = (0..n.min(64) as u32).collect();
    let _ = tok.decode(&ids);
    let mut stream = tok.stream();
    for &id in &ids {
        let _ = stream.push(id);
    }
    let _ = stream.finish();

    // ids past the vocabulary are errors, never panics
    for bad in [n as u32, n as u32 + 1, u32::MAX] {
        assert!(tok.decode(&[bad]).is_err());
        assert!(tok.decode(&[0, bad]).is_err());
        let mut stream = tok.stream();
        let _ = stream.push(0);
        assert!(stream.push(bad).is_err());
    }
});
