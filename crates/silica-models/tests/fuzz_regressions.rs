//! Inputs the fuzz targets of `fuzz/` (`scripts/fuzz.sh`) found crashing a
//! parser, each kept as a test of the error that replaced the crash.

use silica::{DType, Device};
use silica_models::Error;
use silica_models::gguf::MetaValue;
use silica_models::safetensors::SafetensorsFile;
use silica_models::tokenizer::Tokenizer;

/// A safetensors file with one JSON header and the given data.
fn safetensors(header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

fn format_error(bytes: Vec<u8>) -> String {
    match SafetensorsFile::from_bytes(bytes, "fuzz.safetensors") {
        Err(e @ Error::Format { .. }) => e.to_string(),
        Err(other) => panic!("expected a format error, got {other:?}"),
        Ok(file) => panic!("expected a format error, got {file:?}"),
    }
}

/// safetensors, found within seconds: a zero-sized tensor passes the
/// `safetensors` crate's checks whatever its other dimensions (their product
/// with the 0 is 0), and loading it multiplied those dimensions into strides
/// and overflowed (a panic with overflow checks on, wrapped strides without).
#[test]
fn zero_sized_tensor_with_overflowing_dimensions() {
    // the fuzzer's input, byte for byte
    let found = safetensors(
        r#"{"a":{"dtype":"F32","shape":[0,1099511627776,1099511627776],"data_offsets":[0,0]}}"#,
        b"",
    );
    let msg = format_error(found);
    assert!(msg.contains("tensor `a`"), "{msg}");
    assert!(msg.contains("overflow"), "{msg}");

    // the zero anywhere, other dtypes
    for shape in [
        "[4611686018427387904,4,0]",
        "[65536,0,65536,65536,65536]",
        "[18446744073709551615,2,0]",
    ] {
        let header = format!(r#"{{"b":{{"dtype":"F16","shape":{shape},"data_offsets":[0,0]}}}}"#);
        let msg = format_error(safetensors(&header, b""));
        assert!(msg.contains("overflow"), "{shape}: {msg}");
    }
}

/// Zero-sized tensors whose dimensions multiply without overflow still load.
#[test]
fn zero_sized_tensors_still_load() {
    let header = concat!(
        r#"{"a":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},"#,
        r#""b":{"dtype":"BF16","shape":[3,0,1048576],"data_offsets":[0,0]}}"#
    );
    let file = SafetensorsFile::from_bytes(safetensors(header, b""), "zero.safetensors").unwrap();
    let cpu = Device::cpu();
    let a = file.load("a", &cpu, DType::F32).unwrap();
    assert_eq!(a.shape(), &[0, 4]);
    assert_eq!(a.numel(), 0);
    let b = file.load("b", &cpu, DType::F16).unwrap();
    assert_eq!(b.shape(), &[3, 0, 1_048_576]);
    assert_eq!(b.numel(), 0);
}

/// The f32 scores (as bits) of the gguf_tokenizer input that crashed: NaNs
/// among numbers, found after 36 s of fuzzing.
const NAN_SCORES: [u32; 72] = [
    0x00000000, 0x7fc00000, 0x40000000, 0x7fc00000, 0x40800000, 0x7fc00000, 0x40c00000, 0x7fc00000,
    0x3f800000, 0x7fc00000, 0x40400000, 0x7fc00000, 0x40a00000, 0x7fc00000, 0x00000000, 0x7fc00000,
    0x40000000, 0x7fc00000, 0x6d697c00, 0x646e655f, 0x00013e7c, 0x00000000, 0x01610000, 0x00000000,
    0x62000000, 0x00000001, 0x00000000, 0x00000163, 0x00000000, 0x00016400, 0x00000000, 0x01650000,
    0x00000000, 0x68000000, 0x00000001, 0x00000000, 0x0000016c, 0x00000000, 0x00016f00, 0x00000000,
    0x01720000, 0x00000000, 0x73000000, 0x00000001, 0x00000000, 0x00000174, 0x00000000, 0x00017700,
    0x40c00000, 0x7fc00000, 0x3f800000, 0x7fc00000, 0x40400000, 0x7fc00000, 0x40a00000, 0x7fc00000,
    0x00000000, 0x7fc00000, 0x40000000, 0x7fc00000, 0x40800000, 0x7fc00000, 0x40c00000, 0x7fc00000,
    0x3f800000, 0x7fc00000, 0x40400000, 0x7fc00000, 0x40a00000, 0x7fc00000, 0x00000000, 0x7fc00000,
];

/// A `llama` tokenizer's vocabulary: a..h and every pair of them (each pair
/// is a merge of two tokens).
fn pair_vocabulary() -> Vec<String> {
    let letters = || "abcdefgh".chars();
    let pairs = letters().flat_map(|x| letters().map(move |y| format!("{x}{y}")));
    letters().map(String::from).chain(pairs).collect()
}

fn llama_tokenizer(tokens: &[String], scores: Vec<MetaValue>) -> silica_models::Result<Tokenizer> {
    let strings = tokens
        .iter()
        .map(|t| MetaValue::String(t.clone()))
        .collect();
    let meta = [
        ("tokenizer.ggml.model", MetaValue::String("llama".into())),
        ("tokenizer.ggml.tokens", MetaValue::Array(strings)),
        ("tokenizer.ggml.scores", MetaValue::Array(scores)),
    ];
    Tokenizer::from_gguf_metadata(&|k| meta.iter().find(|m| m.0 == k).map(|m| m.1.clone()))
}

/// gguf_tokenizer: a SentencePiece vocabulary without merges has them
/// derived from the token scores, sorted best first; with NaN scores the
/// comparison was not a total order and the sort panicked ("user-provided
/// comparison function does not correctly implement a total order"). NaN now
/// ranks below every number.
#[test]
fn nan_token_scores() {
    let tokens = pair_vocabulary();
    let scores = NAN_SCORES
        .iter()
        .map(|&b| MetaValue::F32(f32::from_bits(b)))
        .collect();
    let tok = llama_tokenizer(&tokens, scores).unwrap();
    let ids = tok.encode("abcdefghhhgg", false).unwrap();
    assert!(!ids.is_empty());
    assert_eq!(tok.decode(&ids).unwrap(), "abcdefghhhgg");

    // a NaN merge comes after every scored one: "ab" (score 1) is merged,
    // "ba" (NaN) is not, so "aba" is "ab" + "a" (the vocabulary has no
    // "▁" for the space prefix, nor byte tokens: it is dropped)
    let mut scores = vec![MetaValue::F32(0.0); tokens.len()];
    let at = |t: &str| tokens.iter().position(|x| x == t).unwrap();
    scores[at("ab")] = MetaValue::F32(1.0);
    scores[at("ba")] = MetaValue::F32(f32::NAN);
    let tok = llama_tokenizer(&tokens, scores).unwrap();
    let pieces: Vec<String> = tok
        .encode("aba", false)
        .unwrap()
        .iter()
        .map(|&id| tok.id_to_token(id).unwrap())
        .collect();
    assert_eq!(pieces, ["ab", "a"]);
}
