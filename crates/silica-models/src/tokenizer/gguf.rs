//! A tokenizer from a GGUF file's metadata.
//!
//! A GGUF file carries no `tokenizer.json`, only llama.cpp's description of
//! one (`tokenizer.ggml.*`). [`build`] rebuilds the Hugging Face tokenizer
//! it stands for, the way transformers' GGUF converter does
//! (`transformers/integrations/gguf/gguf_tokenizer_mapping.py`), with the
//! pre-tokenizer llama.cpp uses for the file's `tokenizer.ggml.pre`:
//!
//! * `tokenizer.ggml.model = "gpt2"`: byte-level BPE from the vocabulary and
//!   the merges. Tokens the file spells outside the byte-level alphabet are
//!   respelled into it, control tokens (type 3) become special added tokens
//!   and user-defined ones (type 4) plain added tokens, so that
//!   `<|im_start|>` encodes to its one id.
//! * `tokenizer.ggml.model = "llama"`: SentencePiece-style BPE with byte
//!   fallback; the merges come from the file or, like transformers does, from
//!   the token scores.

use std::collections::{HashMap, HashSet};

use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::{END_OF_GENERATION, Tokenizer, err};
use crate::gguf::MetaValue;
use crate::{Error, Result};

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// The split regex of Llama 3 (and of the pre-tokenizers llama.cpp maps to it).
const LLAMA3_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// The split regex of Qwen 2.
const QWEN2_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// The split regex of Mistral's Tekken.
const TEKKEN_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// The split regex of GPT-4o (and Llama 4).
const GPT4O_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// `tokenizer.ggml.pre` values whose text is split with the Llama 3 regex;
/// llama.cpp also skips the merges for a word that is a whole token for
/// these (`ignore_merges`, as in Llama 3's `tokenizer.json`).
const LLAMA3_PRE: &[&str] = &[
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
];

/// The metadata keys a GGUF tokenizer is built from.
const KEYS: &[&str] = &[
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_space_prefix",
];

/// The tokenizer described by the values under [`KEYS`] that `get` finds.
pub(super) fn from_metadata(get: &dyn Fn(&str) -> Option<MetaValue>) -> Result<Tokenizer> {
    let values: Vec<(&str, MetaValue)> = KEYS
        .iter()
        .filter_map(|&k| get(k).map(|v| (k, v)))
        .collect();
    build(&|key| values.iter().find(|(k, _)| *k == key).map(|(_, v)| v))
}

/// Typed access to the `tokenizer.ggml.*` values.
struct Meta<'a, 'g> {
    get: &'g dyn Fn(&str) -> Option<&'a MetaValue>,
}

impl<'a> Meta<'a, '_> {
    fn value(&self, key: &str) -> Option<&'a MetaValue> {
        (self.get)(key)
    }

    fn require(&self, key: &str) -> Result<&'a MetaValue> {
        self.value(key)
            .ok_or_else(|| err(format!("missing metadata key {key}")))
    }

    fn wrong(key: &str, v: &MetaValue, want: &str) -> Error {
        err(format!(
            "metadata key {key} is {}, expected {want}",
            v.type_name()
        ))
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.value(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, v, "a string")),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.value(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, v, "a bool")),
        }
    }

    /// A token id, checked against the vocabulary size.
    fn token_id(&self, key: &str, n_vocab: usize) -> Result<Option<u32>> {
        let Some(v) = self.value(key) else {
            return Ok(None);
        };
        let id = v
            .as_u64()
            .ok_or_else(|| Self::wrong(key, v, "a non-negative integer"))?;
        if id >= n_vocab as u64 {
            return Err(err(format!(
                "metadata key {key} is {id}, past the vocabulary of {n_vocab} tokens"
            )));
        }
        Ok(Some(id as u32))
    }

    fn array(&self, key: &str) -> Result<Option<&'a [MetaValue]>> {
        match self.value(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, v, "an array")),
        }
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<&'a str>>> {
        let Some(items) = self.array(key)? else {
            return Ok(None);
        };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str().ok_or_else(|| {
                    err(format!(
                        "{key}[{i}] is {}, expected a string",
                        v.type_name()
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// A number array that must have `len` entries.
    fn numbers(&self, key: &str, len: usize) -> Result<Option<Vec<f64>>> {
        let Some(items) = self.array(key)? else {
            return Ok(None);
        };
        if items.len() != len {
            return Err(err(format!(
                "{key} has {} entries, tokenizer.ggml.tokens has {len}",
                items.len()
            )));
        }
        items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_f64().ok_or_else(|| {
                    err(format!(
                        "{key}[{i}] is {}, expected a number",
                        v.type_name()
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// The tokenizer described by the `tokenizer.ggml.*` values `get` returns.
pub(super) fn build<'a>(get: &dyn Fn(&str) -> Option<&'a MetaValue>) -> Result<Tokenizer> {
    let meta = Meta { get };
    let model_key = "tokenizer.ggml.model";
    let model = meta
        .str(model_key)?
        .ok_or_else(|| err(format!("missing metadata key {model_key}")))?;
    let tokens_key = "tokenizer.ggml.tokens";
    meta.require(tokens_key)?;
    let tokens = meta.strings(tokens_key)?.unwrap_or_default();
    if tokens.is_empty() {
        return Err(err(format!("{tokens_key} is empty")));
    }
    let n = tokens.len();
    if n > u32::MAX as usize {
        return Err(err(format!("{tokens_key} has {n} entries, too many")));
    }
    let token_types: Option<Vec<i64>> = meta
        .numbers("tokenizer.ggml.token_type", n)?
        .map(|v| v.into_iter().map(|t| t as i64).collect());
    let pre = meta.str("tokenizer.ggml.pre")?;
    let bos = meta.token_id("tokenizer.ggml.bos_token_id", n)?;
    let eos = meta.token_id("tokenizer.ggml.eos_token_id", n)?;
    let unk = meta.token_id("tokenizer.ggml.unknown_token_id", n)?;
    let eot = meta.token_id("tokenizer.ggml.eot_token_id", n)?;
    let eom = meta.token_id("tokenizer.ggml.eom_token_id", n)?;
    let add_eos = meta.bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let add_bos_meta = meta.bool("tokenizer.ggml.add_bos_token")?;

    let (inner, add_bos_default) = match model {
        "gpt2" => {
            let merges = meta.strings("tokenizer.ggml.merges")?.ok_or_else(|| {
                err("missing metadata key tokenizer.ggml.merges (needed by a gpt2 tokenizer)")
            })?;
            let inner = byte_level_bpe(&tokens, token_types.as_deref(), &merges, pre)?;
            (inner, pre.is_some_and(|p| LLAMA3_PRE.contains(&p)))
        }
        "llama" => {
            let merges = meta.strings("tokenizer.ggml.merges")?;
            let scores = meta.numbers("tokenizer.ggml.scores", n)?;
            let add_space_prefix = meta
                .bool("tokenizer.ggml.add_space_prefix")?
                .unwrap_or(true);
            let inner = sentencepiece_bpe(
                &tokens,
                token_types.as_deref(),
                merges.as_deref(),
                scores.as_deref(),
                unk.map(|id| tokens[id as usize]),
                add_space_prefix,
            )?;
            (inner, true)
        }
        other => {
            return Err(err(format!(
                "unsupported tokenizer model '{other}' ({model_key}); silica supports 'gpt2' (byte-level BPE) and 'llama' (SentencePiece BPE)"
            )));
        }
    };

    // End of generation: EOS, EOT, EOM and the usual end-of-turn tokens.
    let mut eos_ids: Vec<u32> = [eos, eot, eom].into_iter().flatten().collect();
    for (id, token) in tokens.iter().enumerate() {
        let special = token_types
            .as_ref()
            .is_none_or(|t| t[id] == TOKEN_TYPE_CONTROL || t[id] == TOKEN_TYPE_USER_DEFINED);
        if special && END_OF_GENERATION.contains(token) && !eos_ids.contains(&(id as u32)) {
            eos_ids.push(id as u32);
        }
    }

    Ok(Tokenizer {
        inner,
        vocab_size: n,
        bos,
        eos,
        add_bos: add_bos_meta.unwrap_or(add_bos_default) && bos.is_some(),
        add_eos: add_eos && eos.is_some(),
        eos_ids,
        post_processor_adds_special: false,
    })
}

/// GPT-2's map from bytes to the printable characters byte-level BPE
/// vocabularies are spelled in.
fn bytes_to_unicode() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        map[b as usize] = if printable {
            char::from(b)
        } else {
            extra += 1;
            char::from_u32(255 + extra).unwrap_or('\0')
        };
    }
    map
}

/// Splits each merge "a b" into its pair, checking that both parts and
/// their concatenation are in the vocabulary.
fn parse_merges(merges: &[&str], vocab: &Vocab) -> Result<Vec<(String, String)>> {
    merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let bad = |why: &str| err(format!("tokenizer.ggml.merges[{i}] = {m:?}: {why}"));
            let (a, b) = m
                .split_once(' ')
                .ok_or_else(|| bad("expected two tokens separated by one space"))?;
            if a.is_empty() || b.is_empty() || b.contains(' ') {
                return Err(bad("expected two tokens separated by one space"));
            }
            for part in [a, b] {
                if !vocab.contains_key(part) {
                    return Err(bad(&format!("'{part}' is not in the vocabulary")));
                }
            }
            let merged = format!("{a}{b}");
            if !vocab.contains_key(&merged) {
                return Err(bad(&format!("'{merged}' is not in the vocabulary")));
            }
            Ok((a.to_string(), b.to_string()))
        })
        .collect()
}

fn byte_level_bpe(
    tokens: &[&str],
    token_types: Option<&[i64]>,
    merges: &[&str],
    pre: Option<&str>,
) -> Result<tokenizers::Tokenizer> {
    // Tokens spelled outside the byte alphabet (e.g. added tokens a converter
    // wrote as raw text) are respelled into it, as transformers does.
    let spelling = bytes_to_unicode();
    let alphabet: HashSet<char> = spelling.iter().copied().collect();
    let in_alphabet = |t: &str| t.chars().all(|c| alphabet.contains(&c));
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(id, &t)| {
            let spelled = if in_alphabet(t) {
                t.to_string()
            } else {
                t.bytes().map(|b| spelling[b as usize]).collect()
            };
            (spelled, id as u32)
        })
        .collect();
    let merges = parse_merges(merges, &vocab)?;

    let pre = pre.unwrap_or("default");
    let ignore_merges = LLAMA3_PRE.contains(&pre);
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| err(format!("cannot build the BPE model: {e}")))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(byte_level_pre_tokenizer(pre)?));
    inner.with_decoder(Some(ByteLevel::new(false, true, true)));

    // Control tokens: special added tokens (a byte-level control token
    // spelled outside the alphabet is a converter's mislabel, skipped like
    // transformers does). User-defined tokens: plain added tokens.
    if let Some(types) = token_types {
        let control: Vec<AddedToken> = tokens
            .iter()
            .zip(types)
            .filter(|&(t, &ty)| ty == TOKEN_TYPE_CONTROL && in_alphabet(t))
            .map(|(&t, _)| AddedToken::from(t, true).normalized(false))
            .collect();
        inner.add_special_tokens(&control);
        let user: Vec<AddedToken> = tokens
            .iter()
            .zip(types)
            .filter(|&(t, &ty)| ty == TOKEN_TYPE_USER_DEFINED && in_alphabet(t))
            .map(|(&t, _)| AddedToken::from(t, false).normalized(false))
            .collect();
        inner.add_tokens(&user);
    }
    Ok(inner)
}

/// The pre-tokenizer for a byte-level vocabulary's `tokenizer.ggml.pre`.
fn byte_level_pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper> {
    let split = match pre {
        // Each digit apart, then GPT-2's split: SmolLM's tokenizer.json and
        // llama.cpp's "smollm"/"starcoder"/"refact" pre-tokenizers.
        // (transformers' GGUF converter leaves out the Digits step; it
        // differs on e.g. "x  1": a run of spaces before a digit.)
        "smollm" | "starcoder" | "refact" => {
            return Ok(PreTokenizerSequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, true, true).into(),
            ])
            .into());
        }
        // GPT-2's own split, done by ByteLevel.
        "default" | "gpt2" | "gpt-2" => return Ok(ByteLevel::new(false, true, true).into()),
        p if LLAMA3_PRE.contains(&p) || matches!(p, "dbrx" | "smaug-bpe" | "jina-v5-nano") => {
            LLAMA3_SPLIT
        }
        "qwen2" | "deepseek-r1-qwen" | "megrez" | "kormo" | "f2llmv2" => QWEN2_SPLIT,
        "tekken" => TEKKEN_SPLIT,
        "gpt-4o" | "llama4" | "kanana2" | "minimax-m2" => GPT4O_SPLIT,
        other => {
            // transformers falls back to GPT-2's split for any other value.
            tracing::warn!(
                "tokenizer.ggml.pre = '{other}' is not known to silica; using GPT-2's pre-tokenizer"
            );
            return Ok(ByteLevel::new(false, true, true).into());
        }
    };
    let split = Split::new(
        SplitPattern::Regex(split.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| err(format!("bad split regex for '{pre}': {e}")))?;
    Ok(PreTokenizerSequence::new(vec![
        split.into(),
        ByteLevel::new(false, true, false).into(),
    ])
    .into())
}

/// Merges implied by a SentencePiece vocabulary and its scores, as
/// transformers' `generate_merges` derives them: every split of every token
/// into two tokens of the vocabulary, best score first (then the longer left
/// part, then the longer right part; ties keep vocabulary order).
fn merges_from_scores(tokens: &[&str], scores: &[f64]) -> Vec<(String, String)> {
    // token -> id (the last id of a duplicated token, like a Python dict)
    let vocab: HashMap<&str, usize> = tokens.iter().enumerate().map(|(i, &t)| (t, i)).collect();
    // token -> score, in order of first appearance (last score wins). A NaN
    // score ranks below every number and -0 counts as 0, so that the scores
    // are totally ordered (sorting by a comparison that is not a total order
    // panics).
    let mut order: Vec<&str> = Vec::with_capacity(tokens.len());
    let mut score_of: HashMap<&str, f64> = HashMap::with_capacity(tokens.len());
    for (&t, &s) in tokens.iter().zip(scores) {
        let s = if s.is_nan() {
            f64::NEG_INFINITY
        } else {
            s + 0.0
        };
        if score_of.insert(t, s).is_none() {
            order.push(t);
        }
    }
    let mut merges: Vec<(&str, &str, f64)> = Vec::new();
    for token in order {
        let score = score_of[token];
        let mut local: Vec<(&str, &str, f64)> = token
            .char_indices()
            .skip(1)
            .map(|(at, _)| token.split_at(at))
            .filter(|(l, r)| vocab.contains_key(l) && vocab.contains_key(r))
            .map(|(l, r)| (l, r, score))
            .collect();
        local.sort_by_key(|&(l, r, _)| (vocab[l], vocab[r]));
        merges.extend(local);
    }
    let key = |m: &(&str, &str, f64)| (m.2, m.0.chars().count(), m.1.chars().count());
    // Stable sort, descending.
    merges.sort_by(|a, b| {
        let (ka, kb) = (key(a), key(b));
        kb.0.total_cmp(&ka.0)
            .then(kb.1.cmp(&ka.1))
            .then(kb.2.cmp(&ka.2))
    });
    merges
        .into_iter()
        .map(|(l, r, _)| (l.to_string(), r.to_string()))
        .collect()
}

fn sentencepiece_bpe(
    tokens: &[&str],
    token_types: Option<&[i64]>,
    merges: Option<&[&str]>,
    scores: Option<&[f64]>,
    unk: Option<&str>,
    add_space_prefix: bool,
) -> Result<tokenizers::Tokenizer> {
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(id, &t)| (t.to_string(), id as u32))
        .collect();
    let merges = match (merges, scores) {
        (Some(m), _) => parse_merges(m, &vocab)?,
        (None, Some(s)) => merges_from_scores(tokens, s),
        (None, None) => {
            return Err(err(
                "missing metadata key tokenizer.ggml.scores (a llama tokenizer without tokenizer.ggml.merges needs it)",
            ));
        }
    };
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk.to_string());
    }
    let bpe = builder
        .build()
        .map_err(|e| err(format!("cannot build the BPE model: {e}")))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    // "▁" for spaces; with add_space_prefix one is prepended to the text
    // (to its first piece, not after special tokens, like transformers'
    // LlamaTokenizer with legacy=False).
    let scheme = if add_space_prefix {
        PrependScheme::First
    } else {
        PrependScheme::Never
    };
    inner.with_pre_tokenizer(Some(Metaspace::new('▁', scheme, false)));
    let replace =
        Replace::new("▁", " ").map_err(|e| err(format!("cannot build the decoder: {e}")))?;
    let mut decoders: Vec<DecoderWrapper> = vec![
        replace.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    inner.with_decoder(Some(DecoderSequence::new(decoders)));

    if let Some(types) = token_types {
        let control: Vec<AddedToken> = tokens
            .iter()
            .zip(types)
            .filter(|&(_, &ty)| ty == TOKEN_TYPE_CONTROL)
            .map(|(&t, _)| AddedToken::from(t, true).normalized(false))
            .collect();
        inner.add_special_tokens(&control);
        let user: Vec<AddedToken> = tokens
            .iter()
            .zip(types)
            .filter(|&(_, &ty)| ty == TOKEN_TYPE_USER_DEFINED)
            .map(|(&t, _)| AddedToken::from(t, false).normalized(false))
            .collect();
        inner.add_tokens(&user);
    }
    Ok(inner)
}
