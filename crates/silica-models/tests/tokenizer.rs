//! Tokenizers and chat templates.
//!
//! Always run: a SentencePiece-style tokenizer built from a tiny hand-made
//! vocabulary, the chat templates (against the golden ChatML prompt written
//! by `scripts/reference_smollm2.py`), and construction errors on malformed
//! metadata.
//!
//! With the SmolLM2-135M-Instruct GGUF file (`SILICA_TEST_GGUF`, else the
//! built-in default decoder, fetched into the cache on first use):
//! the tokenizer built from its metadata against the golden ids and texts of
//! `tests/golden/smollm2_tokenizer.json` and `tests/golden/smollm2.json`.

use std::path::PathBuf;

use serde_json::Value;
use silica_models::Error;
use silica_models::chat::{ChatTemplate, Message};
use silica_models::gguf::{GgufFile, MetaValue};
use silica_models::tokenizer::{TokenStream, Tokenizer};

// ---------------------------------------------------------------------------
// helpers

fn golden(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The model file: `SILICA_TEST_GGUF` if set, else the built-in default
/// decoder (fetched into the cache on first use). Always `Some`; the
/// `Option` keeps the call sites simple.
fn model_file(_test: &str) -> Option<GgufFile> {
    let path = match std::env::var_os("SILICA_TEST_GGUF") {
        Some(path) => PathBuf::from(path),
        None => {
            silica_models::resolve::resolve_decoder(None).expect("the default decoder resolves")
        }
    };
    Some(GgufFile::open(path).expect("the model file opens"))
}

fn strings(items: &[&str]) -> MetaValue {
    MetaValue::Array(
        items
            .iter()
            .map(|s| MetaValue::String(s.to_string()))
            .collect(),
    )
}

/// Metadata as a list of keys and values, looked up like a GGUF file's.
struct Meta(Vec<(String, MetaValue)>);

impl Meta {
    fn set(&mut self, key: &str, value: MetaValue) -> &mut Self {
        self.0.retain(|(k, _)| k != key);
        self.0.push((key.to_string(), value));
        self
    }

    fn remove(&mut self, key: &str) -> &mut Self {
        self.0.retain(|(k, _)| k != key);
        self
    }

    fn build(&self) -> silica_models::Result<Tokenizer> {
        Tokenizer::from_gguf_metadata(&|key| {
            self.0
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        })
    }
}

/// A tiny byte-level (gpt2) vocabulary: "hello" merges to one token.
fn tiny_gpt2() -> Meta {
    let tokens = [
        "<|endoftext|>",
        "h",
        "e",
        "l",
        "o",
        "he",
        "ll",
        "hell",
        "hello",
        "Ġ",
        "Ġhello",
    ];
    let types = [3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1];
    let merges = ["h e", "l l", "he ll", "hell o", "Ġ hello"];
    Meta(vec![
        (
            "tokenizer.ggml.model".into(),
            MetaValue::String("gpt2".into()),
        ),
        (
            "tokenizer.ggml.pre".into(),
            MetaValue::String("smollm".into()),
        ),
        ("tokenizer.ggml.tokens".into(), strings(&tokens)),
        (
            "tokenizer.ggml.token_type".into(),
            MetaValue::Array(types.iter().map(|&t| MetaValue::I32(t)).collect()),
        ),
        ("tokenizer.ggml.merges".into(), strings(&merges)),
        ("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(0)),
        ("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(0)),
    ])
}

/// A tiny SentencePiece-style (llama) vocabulary: control tokens, the 256
/// byte tokens, characters and pieces with scores (no merges: they are
/// derived from the scores).
fn tiny_llama() -> (Meta, Vec<String>) {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0f32, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    // Pieces, best merge first (higher score = merged earlier).
    let pieces = [
        ("▁", -1000.0),
        ("h", -1000.0),
        ("e", -1000.0),
        ("l", -1000.0),
        ("o", -1000.0),
        ("w", -1000.0),
        ("r", -1000.0),
        ("d", -1000.0),
        ("he", -1.0),
        ("ll", -2.0),
        ("llo", -3.0),
        ("hello", -4.0),
        ("▁hello", -5.0),
        ("or", -6.0),
        ("ld", -7.0),
        ("▁w", -8.0),
        ("▁wor", -9.0),
        ("▁world", -10.0),
    ];
    for (p, s) in pieces {
        tokens.push(p.into());
        types.push(1);
        scores.push(s);
    }
    let token_refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let meta = Meta(vec![
        (
            "tokenizer.ggml.model".into(),
            MetaValue::String("llama".into()),
        ),
        ("tokenizer.ggml.tokens".into(), strings(&token_refs)),
        (
            "tokenizer.ggml.token_type".into(),
            MetaValue::Array(types.iter().map(|&t| MetaValue::I32(t)).collect()),
        ),
        (
            "tokenizer.ggml.scores".into(),
            MetaValue::Array(scores.iter().map(|&s| MetaValue::F32(s)).collect()),
        ),
        ("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(2)),
        ("tokenizer.ggml.unknown_token_id".into(), MetaValue::U32(0)),
    ]);
    (meta, tokens)
}

fn tokenizer_error(meta: &Meta) -> String {
    match meta.build() {
        Ok(_) => panic!("expected an error"),
        Err(e @ Error::Tokenizer(_)) => e.to_string(),
        Err(other) => panic!("expected Error::Tokenizer, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// without the model file

#[test]
fn sentencepiece_tiny_vocabulary() {
    let (meta, tokens) = tiny_llama();
    let tok = meta.build().unwrap();
    let id = |t: &str| tokens.iter().position(|x| x == t).unwrap() as u32;
    assert_eq!(tok.vocab_size(), tokens.len());
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(1), Some(2)));
    assert!(
        tok.add_bos(),
        "a llama vocabulary adds BOS unless the file says otherwise"
    );
    assert!(tok.is_eos(2) && !tok.is_eos(1));

    // merges from the scores; a space prefix; "▁" for spaces
    let ids = tok.encode("hello world", false).unwrap();
    assert_eq!(ids, [id("▁hello"), id("▁world")]);
    assert_eq!(tok.decode(&ids).unwrap(), "hello world");
    assert_eq!(tok.encode("hello", true).unwrap(), [1, id("▁hello")]);
    assert_eq!(tok.encode("", false).unwrap(), Vec::<u32>::new());

    // byte fallback for characters outside the vocabulary
    let ids = tok.encode("hé", false).unwrap();
    assert_eq!(ids, [id("▁"), id("h"), id("<0xC3>"), id("<0xA9>")]);
    assert_eq!(tok.decode(&ids).unwrap(), "hé");

    // control tokens are matched whole in the text
    let ids = tok.encode("hello</s>", false).unwrap();
    assert_eq!(ids, [id("▁hello"), 2]);
    assert_eq!(tok.decode(&ids).unwrap(), "hello</s>");

    // the stream holds back the first byte of "é" and keeps the spaces
    let mut stream = TokenStream::new(&tok);
    let mut out = String::new();
    let mut pieces = Vec::new();
    for id in [
        id("▁hello"),
        id("▁"),
        id("h"),
        id("<0xC3>"),
        id("<0xA9>"),
        id("▁world"),
    ] {
        let piece = stream.push(id).unwrap();
        pieces.push(piece.clone());
        out.push_str(&piece.unwrap_or_default());
    }
    assert_eq!(pieces[3], None, "an incomplete character is held back");
    assert_eq!(pieces[4].as_deref(), Some("é"));
    assert_eq!(stream.finish().unwrap(), None);
    assert_eq!(out, "hello hé world");

    // without add_space_prefix no "▁" is prepended
    let (mut meta, _) = tiny_llama();
    meta.set("tokenizer.ggml.add_space_prefix", MetaValue::Bool(false));
    meta.set("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));
    let tok = meta.build().unwrap();
    let ids = tok.encode("hello world", true).unwrap();
    assert_eq!(ids, [id("hello"), id("▁world")]);
    assert_eq!(tok.decode(&ids).unwrap(), "hello world");
}

#[test]
fn byte_level_tiny_vocabulary() {
    let tok = tiny_gpt2().build().unwrap();
    assert_eq!(tok.encode("hello hello", false).unwrap(), [8, 10]);
    assert_eq!(
        tok.encode("hello<|endoftext|>", true).unwrap(),
        [8, 0],
        "no BOS for gpt2"
    );
    assert_eq!(tok.decode(&[8, 10, 0]).unwrap(), "hello hello<|endoftext|>");
    assert_eq!(tok.id_to_token(10).as_deref(), Some("Ġhello"));
    assert!(tok.is_eos(0));
    let err = tok.decode(&[11]).unwrap_err().to_string();
    assert!(err.contains("11"), "{err}");

    // every pre-tokenizer silica knows builds (their split regexes compile)
    // and splits "hello hello" at the space; an unknown one falls back to GPT-2's
    for pre in [
        "gpt2",
        "default",
        "llama-bpe",
        "llama3",
        "qwen2",
        "tekken",
        "gpt-4o",
        "starcoder",
        "something-new",
    ] {
        let mut m = tiny_gpt2();
        m.set("tokenizer.ggml.pre", MetaValue::String(pre.into()));
        let tok = m.build().unwrap();
        assert_eq!(
            tok.encode("hello hello", false).unwrap(),
            [8, 10],
            "pre = {pre}"
        );
        let llama3 = pre.starts_with("llama");
        assert_eq!(tok.add_bos(), llama3, "pre = {pre}");
    }
    // Llama 3 vocabularies add BOS unless the file says otherwise
    let mut m = tiny_gpt2();
    m.set("tokenizer.ggml.pre", MetaValue::String("llama-bpe".into()));
    let tok = m.build().unwrap();
    assert_eq!(tok.encode("hello", true).unwrap(), [0, 8]);
    m.set("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));
    assert_eq!(m.build().unwrap().encode("hello", true).unwrap(), [8]);
}

#[test]
fn chat_templates() {
    // SmolLM2's template as its GGUF file stores it
    let smollm = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    let t = ChatTemplate::detect(Some(smollm)).unwrap();
    assert_eq!(
        t,
        ChatTemplate::ChatMl {
            default_system: Some(
                "You are a helpful AI assistant named SmolLM, trained by Hugging Face".into()
            )
        }
    );
    // the golden prompt P2 of scripts/reference_smollm2.py (apply_chat_template)
    let g = golden("smollm2.json");
    let p2 = &g["prompts"][1];
    assert_eq!(p2["name"], "P2");
    let expected = p2["text"].as_str().unwrap();
    let messages = [Message::user("What is the capital of France?")];
    assert_eq!(t.render(&messages, true), expected);
    // a system message replaces the default one
    assert_eq!(
        t.render(&[Message::system("Be brief."), Message::user("Hi")], false),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
    assert_eq!(t.render(&[], true), "<|im_start|>assistant\n");

    // ChatML with the newline escaped in the literal, and without a default system prompt
    let qwen = r"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}";
    assert_eq!(
        ChatTemplate::detect(Some(qwen)),
        Some(ChatTemplate::ChatMl {
            default_system: Some("You are a helpful assistant.".into())
        })
    );
    let plain = r"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    let t = ChatTemplate::detect(Some(plain)).unwrap();
    assert_eq!(
        t,
        ChatTemplate::ChatMl {
            default_system: None
        }
    );
    assert_eq!(
        t.render(&[Message::user("Hi"), Message::assistant("Hello!")], true),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>assistant\n"
    );
    let system_from_message =
        r"{{ '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}";
    assert_eq!(
        ChatTemplate::detect(Some(system_from_message)),
        Some(ChatTemplate::ChatMl {
            default_system: None
        })
    );

    // Llama 3 (Meta's Llama-3-8B-Instruct template)
    let llama3 = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
    let t = ChatTemplate::detect(Some(llama3)).unwrap();
    assert_eq!(t, ChatTemplate::Llama3);
    assert_eq!(
        t.render(
            &[Message::system("Be brief."), Message::user("  Hi \n")],
            true
        ),
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );

    // Llama 2 (Meta's Llama-2-7b-chat template)
    let llama2 = "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";
    let t = ChatTemplate::detect(Some(llama2)).unwrap();
    assert_eq!(t, ChatTemplate::Llama2);
    assert_eq!(
        t.render(
            &[
                Message::system("Be brief."),
                Message::user("Hi"),
                Message::assistant("Hello!"),
                Message::user("Bye")
            ],
            true
        ),
        "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]"
    );
    assert_eq!(
        t.render(&[Message::user(" Hi ")], true),
        "<s>[INST] Hi [/INST]"
    );

    // unknown or absent templates
    assert_eq!(ChatTemplate::detect(None), None);
    assert_eq!(ChatTemplate::detect(Some("{{ messages }}")), None);
    assert_eq!(
        ChatTemplate::detect(Some("[INST] {{ m }} [/INST]")),
        None,
        "Mistral-style [INST] is not Llama 2"
    );
}

#[test]
fn construction_errors_name_the_problem() {
    // missing tokens
    let mut m = tiny_gpt2();
    m.remove("tokenizer.ggml.tokens");
    let e = tokenizer_error(&m);
    assert!(
        e.contains("missing") && e.contains("tokenizer.ggml.tokens"),
        "{e}"
    );

    // missing model
    let mut m = tiny_gpt2();
    m.remove("tokenizer.ggml.model");
    let e = tokenizer_error(&m);
    assert!(e.contains("tokenizer.ggml.model"), "{e}");

    // merges: no separator, unknown token, missing
    let mut m = tiny_gpt2();
    m.set("tokenizer.ggml.merges", strings(&["h e", "ll"]));
    let e = tokenizer_error(&m);
    assert!(
        e.contains("tokenizer.ggml.merges[1]") && e.contains("\"ll\""),
        "{e}"
    );
    let mut m = tiny_gpt2();
    m.set("tokenizer.ggml.merges", strings(&["h e", "he x"]));
    let e = tokenizer_error(&m);
    assert!(
        e.contains("tokenizer.ggml.merges[1]") && e.contains("'x'"),
        "{e}"
    );
    let mut m = tiny_gpt2();
    m.remove("tokenizer.ggml.merges");
    let e = tokenizer_error(&m);
    assert!(e.contains("tokenizer.ggml.merges"), "{e}");

    // special ids past the vocabulary
    let mut m = tiny_gpt2();
    m.set("tokenizer.ggml.eos_token_id", MetaValue::U32(11));
    let e = tokenizer_error(&m);
    assert!(
        e.contains("tokenizer.ggml.eos_token_id") && e.contains("11"),
        "{e}"
    );
    let mut m = tiny_gpt2();
    m.set("tokenizer.ggml.bos_token_id", MetaValue::U64(u64::MAX));
    let e = tokenizer_error(&m);
    assert!(e.contains("tokenizer.ggml.bos_token_id"), "{e}");
    let mut m = tiny_gpt2();
    m.set("tokenizer.ggml.eos_token_id", MetaValue::I32(-1));
    let e = tokenizer_error(&m);
    assert!(
        e.contains("tokenizer.ggml.eos_token_id") && e.contains("i32"),
        "{e}"
    );

    // wrong types and lengths
    let mut m = tiny_gpt2();
    m.set("tokenizer.ggml.tokens", MetaValue::String("hello".into()));
    let e = tokenizer_error(&m);
    assert!(
        e.contains("tokenizer.ggml.tokens") && e.contains("array"),
        "{e}"
    );
    let mut m = tiny_gpt2();
    m.set(
        "tokenizer.ggml.tokens",
        MetaValue::Array(vec![MetaValue::String("a".into()), MetaValue::U8(1)]),
    );
    let e = tokenizer_error(&m);
    assert!(e.contains("tokenizer.ggml.tokens[1]"), "{e}");
    let mut m = tiny_gpt2();
    m.set("tokenizer.ggml.tokens", MetaValue::Array(vec![]));
    let e = tokenizer_error(&m);
    assert!(
        e.contains("tokenizer.ggml.tokens") && e.contains("empty"),
        "{e}"
    );
    let mut m = tiny_gpt2();
    m.set(
        "tokenizer.ggml.token_type",
        MetaValue::Array(vec![MetaValue::I32(1)]),
    );
    let e = tokenizer_error(&m);
    assert!(
        e.contains("tokenizer.ggml.token_type") && e.contains("entries"),
        "{e}"
    );
    let mut m = tiny_gpt2();
    m.set("tokenizer.ggml.add_bos_token", MetaValue::U8(1));
    let e = tokenizer_error(&m);
    assert!(e.contains("tokenizer.ggml.add_bos_token"), "{e}");

    // unsupported tokenizer models
    let mut m = tiny_gpt2();
    m.set("tokenizer.ggml.model", MetaValue::String("bert".into()));
    let e = tokenizer_error(&m);
    assert!(e.contains("unsupported") && e.contains("'bert'"), "{e}");

    // a llama vocabulary needs merges or scores
    let (mut m, _) = tiny_llama();
    m.remove("tokenizer.ggml.scores");
    let e = tokenizer_error(&m);
    assert!(e.contains("tokenizer.ggml.scores"), "{e}");
}

#[test]
fn tokenizer_json_file() {
    // a tokenizer.json written by the `tokenizers` crate from the tiny gpt2 vocabulary
    let tok = tiny_gpt2().build().unwrap();
    let dir = std::env::temp_dir().join(format!("silica-tokenizer-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    tok.inner().save(&path, false).unwrap();
    let from_json = Tokenizer::from_file(&path).unwrap();
    assert_eq!(
        from_json.encode("hello hello<|endoftext|>", true).unwrap(),
        [8, 10, 0]
    );
    assert_eq!(from_json.decode(&[8, 10]).unwrap(), "hello hello");
    assert_eq!(from_json.eos_id(), Some(0));
    let missing = Tokenizer::from_file(&dir.join("nope.json"))
        .unwrap_err()
        .to_string();
    assert!(missing.contains("nope.json"), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------
// with the model file (SILICA_TEST_GGUF)

#[test]
fn smollm2_tokenizer_matches_golden() {
    let Some(file) = model_file("smollm2_tokenizer_matches_golden") else {
        return;
    };
    let tok = Tokenizer::from_gguf(&file).unwrap();
    // the lookup-function constructor builds the same tokenizer
    let tok2 = Tokenizer::from_gguf_metadata(&|k| file.get(k).cloned()).unwrap();
    let g = golden("smollm2_tokenizer.json");
    assert_eq!(tok.vocab_size() as u64, g["vocab_size"].as_u64().unwrap());
    assert_eq!(tok.bos_id().map(u64::from), g["bos_token_id"].as_u64());
    assert_eq!(tok.eos_id().map(u64::from), g["eos_token_id"].as_u64());
    assert!(!tok.add_bos());
    assert!(tok.is_eos(2) && tok.is_eos(0) && !tok.is_eos(1));
    assert_eq!(tok.id_to_token(1).as_deref(), Some("<|im_start|>"));

    let mut failures = Vec::new();
    for case in g["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids_of(&case["ids"]);
        let got = tok.encode(text, false).unwrap();
        if got != want {
            failures.push(format!("{text:?}: got {got:?}, want {want:?}"));
            continue;
        }
        assert_eq!(tok2.encode(text, false).unwrap(), want);
        // add_bos_token is false: nothing is added
        assert_eq!(tok.encode(text, true).unwrap(), want);
        let back = tok.decode(&got).unwrap();
        if back != text {
            failures.push(format!("{text:?}: decodes to {back:?}"));
        }
    }
    for case in g["decode_cases"].as_array().unwrap() {
        let ids = ids_of(&case["ids"]);
        let want = case["text"].as_str().unwrap();
        let got = tok.decode(&ids).unwrap();
        if got != want {
            failures.push(format!("decode {ids:?}: got {got:?}, want {want:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_prompts_match_golden() {
    let Some(file) = model_file("smollm2_prompts_match_golden") else {
        return;
    };
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let g = golden("smollm2.json");
    let prompts = g["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), 3);
    for p in prompts {
        let text = p["text"].as_str().unwrap();
        assert_eq!(
            tok.encode(text, true).unwrap(),
            ids_of(&p["ids"]),
            "prompt {}",
            p["name"]
        );
        // the greedy continuation streams to its decoded text
        let new_ids = ids_of(&p["greedy"]["ids"]);
        let mut stream = tok.stream();
        let mut out = String::new();
        for &id in &new_ids {
            if let Some(piece) = stream.push(id).unwrap() {
                out.push_str(&piece);
            }
        }
        if let Some(rest) = stream.finish().unwrap() {
            out.push_str(&rest);
        }
        assert_eq!(
            out,
            p["greedy"]["text"].as_str().unwrap(),
            "prompt {}",
            p["name"]
        );
    }

    // the chat template from the file renders the chat prompts (P2, P3),
    // which encode to their ids
    let source = file.get("tokenizer.chat_template").and_then(|v| v.as_str());
    let template = ChatTemplate::detect(source).expect("SmolLM2's template is ChatML");
    for p in prompts.iter().filter(|p| p["chat"].as_bool() == Some(true)) {
        let user = p["messages"][0]["content"].as_str().unwrap();
        let rendered = template.render(&[Message::user(user)], true);
        assert_eq!(rendered, p["text"].as_str().unwrap());
        assert_eq!(tok.encode(&rendered, false).unwrap(), ids_of(&p["ids"]));
    }
}

#[test]
fn smollm2_stream_holds_back_split_characters() {
    let Some(file) = model_file("smollm2_stream_holds_back_split_characters") else {
        return;
    };
    let tok = Tokenizer::from_gguf(&file).unwrap();
    // "🙂" is two byte-level tokens: the first holds 3 of its 4 bytes
    let smile = tok.encode("🙂", false).unwrap();
    assert!(smile.len() >= 2, "{smile:?}");
    let text = "naïve café 日本語 🙂 done";
    let ids = tok.encode(text, false).unwrap();
    let mut stream = TokenStream::new(&tok);
    let mut out = String::new();
    let mut held = 0;
    for &id in &ids {
        match stream.push(id).unwrap() {
            Some(piece) => {
                assert!(!piece.contains('\u{FFFD}'), "{piece:?}");
                out.push_str(&piece);
            }
            None => held += 1,
        }
    }
    assert!(stream.finish().unwrap().is_none());
    assert_eq!(out, text);
    assert!(held >= 3, "split characters were held back ({held} tokens)");

    // the first half of "🙂" alone: nothing until finish, which gives U+FFFD
    let mut stream = tok.stream();
    assert_eq!(stream.push(smile[0]).unwrap(), None);
    let mut rest = String::new();
    for &id in &smile[1..] {
        rest.push_str(&stream.push(id).unwrap().unwrap_or_default());
    }
    assert_eq!(rest, "🙂");
    let mut stream = tok.stream();
    assert_eq!(stream.push(smile[0]).unwrap(), None);
    assert_eq!(stream.finish().unwrap().as_deref(), Some("\u{FFFD}"));
}
