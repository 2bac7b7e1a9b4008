//! Tokenizers: built from a GGUF file's metadata or read from a
//! `tokenizer.json`, on top of the `tokenizers` crate.
//!
//! This module holds the wrapper the models use ([`Tokenizer`], with its
//! special token ids) and the streaming decoder ([`TokenStream`]). `gguf.rs`
//! rebuilds a Hugging Face tokenizer from the `tokenizer.ggml.*` metadata of
//! a GGUF file; it lives apart because it follows llama.cpp's and
//! transformers' conversion rules, which the wrapper does not depend on.
//!
//! Special tokens are never added by the `tokenizers` post-processor for a
//! GGUF tokenizer: [`Tokenizer::encode`] prepends BOS itself when the file
//! asks for it (`tokenizer.ggml.add_bos_token`).

use std::path::Path;

use crate::gguf::{GgufFile, MetaValue};
use crate::{Error, Result};

mod gguf;

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
        gguf::from_metadata(get)
    }

    /// Builds the tokenizer of an open GGUF file (without copying its
    /// vocabulary out of the file's metadata first).
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        gguf::build(&|key| file.get(key))
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
