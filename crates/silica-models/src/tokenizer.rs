//! Tokenizers: built from a GGUF file's metadata or read from a
//! `tokenizer.json`, on top of the `tokenizers` crate.
//!
//! A GGUF file carries no `tokenizer.json`, only llama.cpp's description of
//! one (`tokenizer.ggml.*`). [`Tokenizer::from_gguf_metadata`] rebuilds the
//! Hugging Face tokenizer it stands for, the way transformers' GGUF converter
//! does (`transformers/integrations/gguf/gguf_tokenizer_mapping.py`), with the
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
//!
//! Special tokens are never added by the `tokenizers` post-processor for a
//! GGUF tokenizer: [`Tokenizer::encode`] prepends BOS itself when the file
//! asks for it (`tokenizer.ggml.add_bos_token`).

use std::collections::{HashMap, HashSet};
use std::path::Path;

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

use crate::gguf::{GgufFile, MetaValue};
use crate::{Error, Result};

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Texts of tokens that end a generation (llama.cpp's end-of-generation set)
/// when the vocabulary has them as control or user-defined tokens.
const END_OF_GENERATION: &[&str] = &[
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<|return|>",
    "<|call|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
];

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

fn err(msg: impl Into<String>) -> Error {
    Error::Tokenizer(msg.into())
}

/// A text tokenizer with its special token ids.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    vocab_size: usize,
    bos: Option<u32>,
    eos: Option<u32>,
    /// `encode(.., true)` prepends BOS (GGUF: `tokenizer.ggml.add_bos_token`).
    add_bos: bool,
    /// `encode(.., true)` appends EOS (GGUF: `tokenizer.ggml.add_eos_token`).
    add_eos: bool,
    /// Ids that end a generation: EOS, EOT, EOM and the vocabulary's
    /// end-of-turn tokens (`<|im_end|>`, `<|eot_id|>`, ...).
    eos_ids: Vec<u32>,
    /// The `tokenizers` post-processor adds the special tokens (tokenizer.json).
    post_processor_adds_special: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .field("eos_ids", &self.eos_ids)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes, from its metadata
    /// (`get` returns the value under a key, e.g.
    /// `|k| file.get(k).cloned()`). Every missing or malformed key is an
    /// [`Error::Tokenizer`] naming it.
    pub fn from_gguf_metadata(get: &dyn Fn(&str) -> Option<MetaValue>) -> Result<Tokenizer> {
        let values: Vec<(&str, MetaValue)> = KEYS
            .iter()
            .filter_map(|&k| get(k).map(|v| (k, v)))
            .collect();
        build_from_gguf(&|key| values.iter().find(|(k, _)| *k == key).map(|(_, v)| v))
    }

    /// Builds the tokenizer of an open GGUF file (without copying its
    /// vocabulary out of the file's metadata first).
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        build_from_gguf(&|key| file.get(key))
    }

    /// Reads a Hugging Face `tokenizer.json`. The special tokens are added by
    /// its post-processor. BOS/EOS come from a `tokenizer_config.json` beside
    /// it when there is one (`bos_token`, `eos_token`, `add_bos_token`),
    /// otherwise from the usual token names.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| err(format!("{}: {e}", path.display())))?;
        let config = path
            .parent()
            .map(|dir| dir.join("tokenizer_config.json"))
            .filter(|p| p.is_file())
            .map(|p| read_json(&p))
            .transpose()?;
        let token_field = |name: &str| -> Option<String> {
            let v = config.as_ref()?.get(name)?;
            v.as_str()
                .or_else(|| v.get("content").and_then(|c| c.as_str()))
                .map(str::to_string)
        };
        let find = |names: &[&str]| names.iter().find_map(|n| inner.token_to_id(n));
        let bos = match token_field("bos_token") {
            Some(t) => inner.token_to_id(&t),
            None => find(&["<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"]),
        };
        let eos = match token_field("eos_token") {
            Some(t) => inner.token_to_id(&t),
            None => find(&[
                "</s>",
                "<|end_of_text|>",
                "<eos>",
                "<|endoftext|>",
                "<|im_end|>",
                "<|eot_id|>",
            ]),
        };
        let add_bos = config
            .as_ref()
            .and_then(|c| c.get("add_bos_token"))
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        let mut eos_ids: Vec<u32> = eos.into_iter().collect();
        for name in END_OF_GENERATION {
            if let Some(id) = inner.token_to_id(name)
                && !eos_ids.contains(&id)
            {
                eos_ids.push(id);
            }
        }
        let post_processor_adds_special = inner.get_post_processor().is_some();
        Ok(Tokenizer {
            vocab_size: inner.get_vocab_size(true),
            inner,
            bos,
            eos,
            add_bos,
            add_eos: false,
            eos_ids,
            post_processor_adds_special,
        })
    }

    /// The ids of `text`. With `add_special`, BOS is prepended when the
    /// model wants it (and EOS appended when it wants that); special tokens
    /// written in the text (`<|im_start|>`) always encode to their ids.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, add_special && self.post_processor_adds_special)
            .map_err(|e| err(format!("encoding failed: {e}")))?;
        let ids = encoding.get_ids();
        if !add_special || self.post_processor_adds_special {
            return Ok(ids.to_vec());
        }
        let mut out = Vec::with_capacity(ids.len() + 2);
        if self.add_bos
            && let Some(bos) = self.bos
        {
            out.push(bos);
        }
        out.extend_from_slice(ids);
        if self.add_eos
            && let Some(eos) = self.eos
        {
            out.push(eos);
        }
        Ok(out)
    }

    /// The text of `ids`; special tokens are written out (`<|im_end|>`).
    /// Ids past the vocabulary are an error.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(err(format!(
                "cannot decode id {bad}: the vocabulary has {} tokens",
                self.vocab_size
            )));
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| err(format!("decoding failed: {e}")))
    }

    /// The number of token ids.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The beginning-of-sequence id, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence id, if the model has one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Whether `encode(.., true)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `id` ends a generation: EOS, or an end-of-turn token such as
    /// `<|im_end|>` or `<|eot_id|>`.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }

    /// All ids that end a generation (see [`Tokenizer::is_eos`]).
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// The token's text as the vocabulary spells it (byte-level tokens in
    /// GPT-2's byte alphabet, `Ġ` for a space).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a token spelled as in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// A [`TokenStream`] over this tokenizer.
    pub fn stream(&self) -> TokenStream<'_> {
        TokenStream::new(self)
    }
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| err(format!("{}: {e}", path.display())))
}

// ---------------------------------------------------------------------------
// GGUF metadata

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

fn build_from_gguf<'a>(get: &dyn Fn(&str) -> Option<&'a MetaValue>) -> Result<Tokenizer> {
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

// ---------------------------------------------------------------------------
// Streaming

/// Turns generated ids into text as they come, emitting only complete UTF-8:
/// a character whose bytes are split over several tokens is held back until
/// its last token arrives.
///
/// Each step decodes a short window (the previous token(s) plus the new
/// ones) and emits what the new ids added, so decoders that treat the first
/// token specially (a SentencePiece leading space) give the same text as
/// decoding everything at once.
pub struct TokenStream<'a> {
    tokenizer: &'a Tokenizer,
    ids: Vec<u32>,
    /// Start of the window decoded for context.
    prefix: usize,
    /// End of what has been emitted.
    read: usize,
}

impl<'a> TokenStream<'a> {
    /// An empty stream.
    pub fn new(tokenizer: &'a Tokenizer) -> TokenStream<'a> {
        TokenStream {
            tokenizer,
            ids: Vec::new(),
            prefix: 0,
            read: 0,
        }
    }

    /// Adds one id; returns the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        self.step(false)
    }

    /// Emits whatever is held back (an incomplete character comes out as
    /// U+FFFD).
    pub fn finish(&mut self) -> Result<Option<String>> {
        self.step(true)
    }

    /// All ids pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    fn step(&mut self, flush: bool) -> Result<Option<String>> {
        if self.read == self.ids.len() {
            return Ok(None);
        }
        let before = self.tokenizer.decode(&self.ids[self.prefix..self.read])?;
        let now = self.tokenizer.decode(&self.ids[self.prefix..])?;
        let complete = !now.ends_with('\u{FFFD}');
        if !(flush || complete) {
            return Ok(None);
        }
        // The window's text normally extends what was emitted; when a
        // decoder rewrites it (it should not), emit the whole new text.
        let new = match now.strip_prefix(before.as_str()) {
            Some(rest) => rest.to_string(),
            None => now.clone(),
        };
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok((!new.is_empty()).then_some(new))
    }
}
