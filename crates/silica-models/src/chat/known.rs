//! The chat templates silica renders without a Jinja engine: ChatML,
//! Llama 2 and Llama 3. They are the fallback for a GGUF file without a
//! `tokenizer.chat_template` (older conversions), recognised from its
//! vocabulary and name ([`ChatTemplate::fallback_for`]), or from a
//! template's source ([`ChatTemplate::detect`]).
//!
//! Each [`ChatTemplate::render`] writes exactly what the model's Jinja
//! template writes for plain `{role, content}` messages, including the
//! special tokens as text (`<|im_start|>`).

use crate::gguf::GgufFile;

use super::Message;

/// A chat template silica knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChatTemplate {
    /// `<|im_start|>role\ncontent<|im_end|>\n` (SmolLM, Qwen, ...). When
    /// `default_system` is set and the first message is not a system one, a
    /// system message with that text goes first (SmolLM2: "You are a helpful
    /// AI assistant named SmolLM, trained by Hugging Face").
    ChatMl { default_system: Option<String> },
    /// Llama 2 chat: `<s>[INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] answer </s>`.
    Llama2,
    /// Llama 3 instruct: `<|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>`.
    /// (Llama 3.1's template also writes a system header with dates and
    /// tool instructions; that is not reproduced.)
    Llama3,
}

impl ChatTemplate {
    /// Recognises a template from its Jinja source: Llama 3 by
    /// `<|start_header_id|>`, ChatML by `<|im_start|>` (with the default
    /// system prompt when the template writes one), Llama 2 by `[INST]`
    /// together with `<<SYS>>` (Mistral's `[INST]` templates differ from
    /// Llama 2's in spacing and BOS placement and are not recognised).
    pub fn detect(template_source: Option<&str>) -> Option<ChatTemplate> {
        let src = template_source?;
        if src.contains("<|start_header_id|>") {
            Some(ChatTemplate::Llama3)
        } else if src.contains("<|im_start|>") {
            Some(ChatTemplate::ChatMl {
                default_system: chatml_default_system(src),
            })
        } else if src.contains("[INST]") && src.contains("<<SYS>>") {
            Some(ChatTemplate::Llama2)
        } else {
            None
        }
    }

    /// The template chosen for a GGUF file that has no
    /// `tokenizer.chat_template`, from what the file says about itself:
    /// Llama 3 when the vocabulary has `<|start_header_id|>` and
    /// `<|eot_id|>`, ChatML when it has `<|im_start|>` and `<|im_end|>`
    /// (without a default system prompt), Llama 2 when the model's name or
    /// file name says Llama 2 chat (`llama-2-7b-chat.Q4_0.gguf`, whose
    /// conversions often carry no template). `None` for anything else.
    pub fn fallback_for(file: &GgufFile) -> Option<ChatTemplate> {
        let tokens = file
            .get("tokenizer.ggml.tokens")
            .and_then(|v| v.as_array())
            .unwrap_or_default();
        let has = |token: &str| tokens.iter().any(|t| t.as_str() == Some(token));
        if has("<|start_header_id|>") && has("<|eot_id|>") {
            return Some(ChatTemplate::Llama3);
        }
        if has("<|im_start|>") && has("<|im_end|>") {
            return Some(ChatTemplate::ChatMl {
                default_system: None,
            });
        }
        // the names, lower-case, with `-`, `_` and `.` read as spaces
        let mut names: Vec<String> = ["general.name", "general.basename", "general.finetune"]
            .iter()
            .filter_map(|key| file.get(key).and_then(|v| v.as_str()))
            .map(str::to_string)
            .collect();
        if let Some(stem) = file.path().file_name() {
            names.push(stem.to_string_lossy().into_owned());
        }
        let names = names.join(" ").to_lowercase().replace(['-', '_', '.'], " ");
        let llama2 = ["llama 2", "llama v2", "llama2"]
            .iter()
            .any(|n| names.contains(n));
        (llama2 && names.contains("chat")).then_some(ChatTemplate::Llama2)
    }

    /// The template's short name: `chatml`, `llama2` or `llama3`.
    pub fn name(&self) -> &'static str {
        match self {
            ChatTemplate::ChatMl { .. } => "chatml",
            ChatTemplate::Llama2 => "llama2",
            ChatTemplate::Llama3 => "llama3",
        }
    }

    /// The prompt text for `messages`; with `add_generation_prompt`, the
    /// start of the assistant's turn follows (Llama 2 has none).
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> String {
        match self {
            ChatTemplate::ChatMl { default_system } => {
                render_chatml(default_system.as_deref(), messages, add_generation_prompt)
            }
            ChatTemplate::Llama2 => render_llama2(messages),
            ChatTemplate::Llama3 => render_llama3(messages, add_generation_prompt),
        }
    }
}

/// `{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}`
/// `{{ '<|im_start|>system\n<default><|im_end|>\n' }}{% endif %}`
/// `{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}`
/// `{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}`
fn render_chatml(
    default_system: Option<&str>,
    messages: &[Message],
    add_generation_prompt: bool,
) -> String {
    let mut out = String::new();
    for (i, m) in messages.iter().enumerate() {
        if i == 0
            && m.role != "system"
            && let Some(system) = default_system
        {
            out.push_str("<|im_start|>system\n");
            out.push_str(system);
            out.push_str("<|im_end|>\n");
        }
        out.push_str("<|im_start|>");
        out.push_str(&m.role);
        out.push('\n');
        out.push_str(&m.content);
        out.push_str("<|im_end|>\n");
    }
    if add_generation_prompt {
        out.push_str("<|im_start|>assistant\n");
    }
    out
}

/// Meta's Llama 3 instruct template:
/// `{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}`
/// `{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}`
/// `{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}`
fn render_llama3(messages: &[Message], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    for (i, m) in messages.iter().enumerate() {
        if i == 0 {
            out.push_str("<|begin_of_text|>");
        }
        out.push_str("<|start_header_id|>");
        out.push_str(&m.role);
        out.push_str("<|end_header_id|>\n\n");
        out.push_str(py_strip(&m.content));
        out.push_str("<|eot_id|>");
    }
    if add_generation_prompt {
        out.push_str("<|start_header_id|>assistant<|end_header_id|>\n\n");
    }
    out
}

/// Meta's Llama 2 chat template: a leading system message goes, wrapped in
/// `<<SYS>>`, into the first user turn; each user turn is
/// `<s>[INST] {content.strip()} [/INST]`, each assistant turn
/// ` {content.strip()} </s>`. (The template raises an error when roles do
/// not alternate; here other roles are left out.)
fn render_llama2(messages: &[Message]) -> String {
    let (system, rest) = match messages.split_first() {
        Some((first, rest)) if first.role == "system" => (Some(first.content.as_str()), rest),
        _ => (None, messages),
    };
    let mut out = String::new();
    for (i, m) in rest.iter().enumerate() {
        let content = match system {
            Some(system) if i == 0 => format!("<<SYS>>\n{system}\n<</SYS>>\n\n{}", m.content),
            _ => m.content.clone(),
        };
        match m.role.as_str() {
            "user" => {
                out.push_str("<s>[INST] ");
                out.push_str(py_strip(&content));
                out.push_str(" [/INST]");
            }
            "assistant" => {
                out.push(' ');
                out.push_str(py_strip(&content));
                out.push_str(" </s>");
            }
            _ => {}
        }
    }
    out
}

/// Python's `str.strip()` (Jinja's `trim`): Unicode whitespace plus the
/// separators U+001C..U+001F.
fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// The default system prompt a ChatML template writes as a string literal,
/// `'<|im_start|>system\n...<|im_end|>'`, if it has one.
fn chatml_default_system(src: &str) -> Option<String> {
    const OPEN: &str = "<|im_start|>system";
    let mut from = 0;
    while let Some(found) = src[from..].find(OPEN) {
        let start = from + found;
        from = start + OPEN.len();
        // The quote that opens the literal: the nearest one before it.
        let Some(quote) = src[..start].chars().rev().find(|&c| c == '\'' || c == '"') else {
            continue;
        };
        let after = &src[from..];
        let body = if let Some(b) = after.strip_prefix('\n') {
            b
        } else if let Some(b) = after.strip_prefix("\\n") {
            b
        } else {
            continue;
        };
        let Some(end) = body.find("<|im_end|>") else {
            continue;
        };
        let raw = &body[..end];
        // Only a plain literal: no closing quote (which would mean the text
        // is built from variables) and no Jinja markup.
        if raw.is_empty() || has_unescaped(raw, quote) || raw.contains("{{") || raw.contains("{%") {
            continue;
        }
        return Some(unescape_jinja(raw));
    }
    None
}

/// Whether `s` contains `quote` not preceded by a backslash.
fn has_unescaped(s: &str, quote: char) -> bool {
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == quote {
            return true;
        }
    }
    false
}

/// The text of a Jinja string literal's body: `\n`, `\t`, `\r`, `\\`,
/// `\'`, `\"` unescaped.
fn unescape_jinja(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some(other @ ('\\' | '\'' | '"')) => out.push(other),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}
