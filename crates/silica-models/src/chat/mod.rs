//! Chat prompts: a model's own chat template rendered with a Jinja engine,
//! and the few known templates kept for files that carry none.
//!
//! [`ModelTemplate::from_gguf`] picks what a GGUF file gets: its
//! `tokenizer.chat_template` rendered as Hugging Face's
//! `apply_chat_template` renders it ([`JinjaTemplate`], on minijinja), else
//! a known template that fits the file ([`ChatTemplate::fallback_for`]:
//! ChatML, Llama 2, Llama 3).
//!
//! A rendered prompt holds the special tokens as text (`<|im_start|>`, and
//! BOS where the template writes `{{ bos_token }}`); [`encode_prompt`]
//! turns it into ids that start with exactly one BOS when the tokenizer
//! adds one.

mod jinja;
mod known;

pub use jinja::JinjaTemplate;
pub use known::ChatTemplate;

use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    pub content: String,
}

impl Message {
    /// A message with any role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A `system` message.
    pub fn system(content: impl Into<String>) -> Message {
        Message::new("system", content)
    }

    /// A `user` message.
    pub fn user(content: impl Into<String>) -> Message {
        Message::new("user", content)
    }

    /// An `assistant` message.
    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new("assistant", content)
    }
}

/// The chat template a model file gets.
#[derive(Clone, Debug)]
pub enum ModelTemplate {
    /// The file's own `tokenizer.chat_template` (boxed: a compiled template
    /// is large).
    Gguf(Box<JinjaTemplate>),
    /// A known template, for a file without one.
    Fallback(ChatTemplate),
}

/// The special tokens a template sees, as Hugging Face passes them
/// (`bos_token`, ...), and the GGUF keys of their ids.
const SPECIAL_TOKENS: &[(&str, &str)] = &[
    ("bos_token", "tokenizer.ggml.bos_token_id"),
    ("eos_token", "tokenizer.ggml.eos_token_id"),
    ("unk_token", "tokenizer.ggml.unknown_token_id"),
    ("pad_token", "tokenizer.ggml.padding_token_id"),
    // llama.cpp's spelling
    ("sep_token", "tokenizer.ggml.seperator_token_id"),
    ("cls_token", "tokenizer.ggml.cls_token_id"),
    ("mask_token", "tokenizer.ggml.mask_token_id"),
];

impl ModelTemplate {
    /// The template of a GGUF file: its `tokenizer.chat_template`, with the
    /// vocabulary's special tokens (`bos_token`, `eos_token`, and
    /// `unk_token`, `pad_token`, ... where the file names them); else, for a
    /// file without one (or with an empty one), the known template that fits
    /// it ([`ChatTemplate::fallback_for`]); `Ok(None)` when none does.
    ///
    /// A template that does not parse, or a `tokenizer.chat_template` that
    /// is not a string, is an error naming the file and the problem.
    pub fn from_gguf(file: &GgufFile) -> Result<Option<ModelTemplate>> {
        const KEY: &str = "tokenizer.chat_template";
        let source = match file.get(KEY) {
            Some(_) => file.get_str(KEY)?,
            None => "",
        };
        if source.trim().is_empty() {
            return Ok(ChatTemplate::fallback_for(file).map(ModelTemplate::Fallback));
        }
        let token = |key: &str| -> Option<String> {
            let id = usize::try_from(file.get(key)?.as_u64()?).ok()?;
            let tokens = file.get("tokenizer.ggml.tokens")?.as_array()?;
            tokens.get(id)?.as_str().map(str::to_string)
        };
        let mut template = JinjaTemplate::parse(
            source,
            &token(SPECIAL_TOKENS[0].1).unwrap_or_default(),
            &token(SPECIAL_TOKENS[1].1).unwrap_or_default(),
        )
        .map_err(|problem| Error::Unsupported {
            path: file.path().to_path_buf(),
            what: format!("{KEY}: {problem}"),
        })?;
        for &(name, key) in &SPECIAL_TOKENS[2..] {
            if let Some(text) = token(key) {
                template = template.with_token(name, &text);
            }
        }
        Ok(Some(ModelTemplate::Gguf(Box::new(template))))
    }

    /// What the status line calls it: `gguf` for the file's own template,
    /// `chatml (fallback)` (`llama2`, `llama3`) for a known one.
    pub fn name(&self) -> String {
        match self {
            ModelTemplate::Gguf(_) => "gguf".to_string(),
            ModelTemplate::Fallback(t) => format!("{} (fallback)", t.name()),
        }
    }

    /// Whether this is a known template standing in for a missing one.
    pub fn is_fallback(&self) -> bool {
        matches!(self, ModelTemplate::Fallback(_))
    }

    /// The prompt text for `messages`; with `add_generation_prompt`, the
    /// start of the assistant's turn follows. A template that rejects the
    /// messages (`raise_exception`) is an [`Error::InvalidInput`] carrying
    /// the template's message.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        match self {
            ModelTemplate::Gguf(t) => t.render(messages, add_generation_prompt),
            ModelTemplate::Fallback(t) => Ok(t.render(messages, add_generation_prompt)),
        }
    }

    /// The prompt's ids: [`render`](Self::render), then [`encode_prompt`].
    pub fn encode(
        &self,
        tokenizer: &Tokenizer,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>> {
        encode_prompt(tokenizer, &self.render(messages, add_generation_prompt)?)
    }
}

/// The ids of a rendered chat prompt, which holds its special tokens as
/// text (they encode to their ids), BOS included where the template writes
/// it. When the tokenizer adds BOS (`tokenizer.ggml.add_bos_token`), the
/// prompt starts with exactly one: a BOS the text starts with is dropped
/// before the tokenizer's is put in front (as llama.cpp does). When it does
/// not, the text is encoded as it is (as Hugging Face's
/// `apply_chat_template` does). EOS is never added.
pub fn encode_prompt(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    let bos = tokenizer.bos_id().filter(|_| tokenizer.add_bos());
    let Some(bos) = bos else {
        return tokenizer.encode(text, false);
    };
    let rest = tokenizer
        .id_to_token(bos)
        .and_then(|b| text.strip_prefix(b.as_str()))
        .unwrap_or(text);
    let mut ids = vec![bos];
    ids.extend(tokenizer.encode(rest, false)?);
    Ok(ids)
}
