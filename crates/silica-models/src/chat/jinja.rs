//! A model's own chat template (`tokenizer.chat_template`): Jinja, rendered
//! with minijinja the way Hugging Face's `apply_chat_template` renders it
//! with Jinja2.
//!
//! What the template sees, as in transformers: blocks trimmed
//! (`trim_blocks`, `lstrip_blocks`), `messages` (maps of `role` and
//! `content`), `add_generation_prompt`, `tools` and `documents` (none), the
//! special tokens (`bos_token`, `eos_token`, ...), `raise_exception(msg)`,
//! `strftime_now(format)` and a `tojson` filter that writes what Python's
//! `json.dumps` writes (`ensure_ascii=False`; `indent`, `separators`,
//! `sort_keys`). Python's string and dict methods (`.strip()`,
//! `.startswith()`, `.items()`, ...) come from minijinja-contrib's
//! `pycompat`. transformers' `{% generation %}` blocks (which only mark the
//! assistant's text for training masks) render their content.
//!
//! Where minijinja prints a value differently from Python, the text
//! differs: `{{ true }}` is `true` (Python: `True`), `{{ none }}` is
//! `none`, a list or dict prints as JSON-like text rather than Python's
//! `repr`. Templates print strings, so the ones tested do not meet this.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, ErrorKind};

use super::Message;
use crate::{Error, Result};

/// The name the template is kept under in its environment.
const NAME: &str = "chat_template";

/// A compiled Hugging Face-style chat template.
#[derive(Clone)]
pub struct JinjaTemplate {
    env: Environment<'static>,
    /// The special tokens the template sees: `bos_token`, `eos_token`, ...
    tokens: Vec<(String, String)>,
}

impl fmt::Debug for JinjaTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JinjaTemplate")
            .field("tokens", &self.tokens)
            .finish_non_exhaustive()
    }
}

impl JinjaTemplate {
    /// Compiles `source` with the BOS and EOS token texts the template sees
    /// as `bos_token` and `eos_token`. A template that does not parse is an
    /// [`Error::InvalidInput`] naming the problem and its line.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<JinjaTemplate> {
        Self::parse(source, bos_token, eos_token)
            .map_err(|problem| Error::InvalidInput(format!("chat template: {problem}")))
    }

    /// [`new`](Self::new), the problem as text.
    pub(super) fn parse(
        source: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> std::result::Result<JinjaTemplate, String> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| describe(&e))?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now(None));
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, generation_blocks_as_ifs(source))
            .map_err(|e| describe(&e))?;
        Ok(JinjaTemplate {
            env,
            tokens: vec![
                ("bos_token".into(), bos_token.into()),
                ("eos_token".into(), eos_token.into()),
            ],
        })
    }

    /// Another special token the template sees as `name` (`unk_token`,
    /// `pad_token`, ...); a name given twice keeps the last text.
    pub fn with_token(mut self, name: &str, text: &str) -> JinjaTemplate {
        self.tokens.retain(|(n, _)| n != name);
        self.tokens.push((name.to_string(), text.to_string()));
        self
    }

    /// `strftime_now` answers with this day (at midnight) instead of the
    /// current time (UTC), for reproducible prompts. An impossible date is
    /// an [`Error::InvalidInput`].
    pub fn with_date(mut self, year: i32, month: u32, day: u32) -> Result<JinjaTemplate> {
        if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
            return Err(Error::InvalidInput(format!(
                "no such date: {year:04}-{month:02}-{day:02}"
            )));
        }
        let seconds = days_from_civil(year, month, day) * 86_400;
        self.env
            .add_function("strftime_now", strftime_now(Some(seconds)));
        Ok(self)
    }

    /// The special token texts the template sees, by name.
    pub fn tokens(&self) -> &[(String, String)] {
        &self.tokens
    }

    /// The prompt text for `messages`; `add_generation_prompt` is passed to
    /// the template, which then writes the start of the assistant's turn.
    ///
    /// A template that rejects the messages with `raise_exception` is an
    /// [`Error::InvalidInput`] carrying its message; any other failure
    /// names the problem and the template's line.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| Error::InvalidInput(format!("chat template: {}", describe(&e))))?;
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                Value::from_pairs([
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ])
            })
            .collect();
        let mut context: Vec<(String, Value)> = vec![
            ("messages".into(), Value::from(messages)),
            ("tools".into(), Value::from(())),
            ("documents".into(), Value::from(())),
            (
                "add_generation_prompt".into(),
                Value::from(add_generation_prompt),
            ),
        ];
        for (name, text) in &self.tokens {
            context.push((name.clone(), Value::from(text.as_str())));
        }
        template
            .render(Value::from_pairs(context))
            .map_err(|e| match raised(&e) {
                Some(message) => Error::InvalidInput(format!(
                    "the chat template rejects these messages: {message}"
                )),
                None => Error::InvalidInput(format!("chat template: {}", describe(&e))),
            })
    }
}

/// A minijinja error as one line: kind, detail and line, then its causes.
fn describe(e: &minijinja::Error) -> String {
    let mut out = e.kind().to_string();
    if let Some(detail) = e.detail() {
        out.push_str(": ");
        out.push_str(detail);
    }
    if let Some(line) = e.line() {
        out.push_str(&format!(" (line {line})"));
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        out.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    out
}

/// The message of the `raise_exception` call that ended a render, if one did.
fn raised(e: &minijinja::Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(cause) = source {
        if let Some(r) = cause.downcast_ref::<Raised>() {
            return Some(r.0.clone());
        }
        source = cause.source();
    }
    None
}

/// The error `raise_exception` attaches to its minijinja error.
#[derive(Debug)]
struct Raised(String);

impl fmt::Display for Raised {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// transformers' `raise_exception(message)`: ends the render with the
/// template's message.
fn raise_exception(message: Value) -> std::result::Result<Value, minijinja::Error> {
    let message = message.to_string();
    Err(
        minijinja::Error::new(ErrorKind::InvalidOperation, message.clone())
            .with_source(Raised(message)),
    )
}

/// transformers' `{% generation %}...{% endgeneration %}` (it marks the
/// assistant's text for `return_assistant_tokens_mask`) as
/// `{% if true %}...{% endif %}`, which renders the same text with the same
/// whitespace handling.
fn generation_blocks_as_ifs(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        let (before, tag) = rest.split_at(at);
        out.push_str(before);
        let body = &tag[2..];
        let marker = body.len() - body.trim_start_matches(['-', '+']).len();
        let (marker, inner) = body.split_at(marker.min(1));
        let word_start = inner.len() - inner.trim_start().len();
        let word = &inner[word_start..];
        let replaced = [("endgeneration", "endif"), ("generation", "if true")]
            .into_iter()
            .find(|(name, _)| {
                word.strip_prefix(name).is_some_and(|after| {
                    after.starts_with(|c: char| {
                        c.is_whitespace() || c == '-' || c == '+' || c == '%'
                    })
                })
            });
        match replaced {
            Some((name, with)) => {
                out.push_str("{%");
                out.push_str(marker);
                out.push_str(&inner[..word_start]);
                out.push_str(with);
                rest = &word[name.len()..];
            }
            None => {
                out.push_str("{%");
                rest = body;
            }
        }
    }
    out.push_str(rest);
    out
}

// ---------------------------------------------------------------------------
// tojson

/// transformers' `tojson`: Python's `json.dumps(value, ensure_ascii=False,
/// indent=None, separators=None, sort_keys=False)`, each settable by name.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.is_integer() => {
            let n = v.as_i64().unwrap_or(0).clamp(0, 64);
            Some(" ".repeat(n as usize))
        }
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => return Err(bad_json_arg("indent is neither a number nor a string")),
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                ),
                _ => return Err(bad_json_arg("separators is not a pair of strings")),
            }
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let json = Json {
        ascii: ensure_ascii.unwrap_or(false),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    json.write(&mut out, value, 0)?;
    Ok(Value::from(out))
}

fn bad_json_arg(msg: &str) -> minijinja::Error {
    minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {msg}"))
}

/// How `json.dumps` was asked to write.
struct Json {
    ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl Json {
    fn write(
        &self,
        out: &mut String,
        v: &Value,
        level: usize,
    ) -> std::result::Result<(), minijinja::Error> {
        match v.kind() {
            ValueKind::Undefined => return Err(bad_json_arg("the value is undefined")),
            ValueKind::Invalid => return Err(bad_json_arg(&format!("invalid value {v}"))),
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
            ValueKind::Number => out.push_str(&py_float_repr(f64::try_from(v.clone())?)),
            ValueKind::String => self.string(out, v.as_str().unwrap_or_default()),
            ValueKind::Bytes => self.string(
                out,
                &String::from_utf8_lossy(v.as_bytes().unwrap_or_default()),
            ),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container(out, '[', ']', items.len(), level, |out, i| {
                    self.write(out, &items[i], level + 1)
                })?;
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for key in v.try_iter()? {
                    let value = v.get_item(&key)?;
                    let key = match key.kind() {
                        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
                        ValueKind::None => "null".to_string(),
                        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).into(),
                        ValueKind::Number if !key.is_integer() => {
                            py_float_repr(f64::try_from(key.clone())?)
                        }
                        ValueKind::Number => key.to_string(),
                        _ => return Err(bad_json_arg(&format!("a key is not a string: {key}"))),
                    };
                    entries.push((key, value));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container(out, '{', '}', entries.len(), level, |out, i| {
                    self.string(out, &entries[i].0);
                    out.push_str(&self.key_sep);
                    self.write(out, &entries[i].1, level + 1)
                })?;
            }
            // plain objects (and kinds added later) as their text
            _ => self.string(out, &v.to_string()),
        }
        Ok(())
    }

    /// `[a, b]` or `{...}`, with Python's indentation when asked for.
    fn container(
        &self,
        out: &mut String,
        open: char,
        close: char,
        n: usize,
        level: usize,
        mut item: impl FnMut(&mut String, usize) -> std::result::Result<(), minijinja::Error>,
    ) -> std::result::Result<(), minijinja::Error> {
        out.push(open);
        if n == 0 {
            out.push(close);
            return Ok(());
        }
        let newline = |out: &mut String, level: usize| {
            if let Some(indent) = &self.indent {
                out.push('\n');
                for _ in 0..level {
                    out.push_str(indent);
                }
            }
        };
        for i in 0..n {
            if i > 0 {
                out.push_str(&self.item_sep);
            }
            newline(out, level + 1);
            item(out, i)?;
        }
        newline(out, level);
        out.push(close);
        Ok(())
    }

    /// A JSON string as Python writes it: `\"`, `\\`, `\n`, `\r`, `\t`,
    /// `\b`, `\f`, other control characters as `\u00XX`; with
    /// `ensure_ascii`, everything outside ` `..`~` as `\uXXXX` (surrogate
    /// pairs beyond the BMP).
    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ascii && !(' '..='~').contains(&c)) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python's `repr(float)`: the shortest digits that read back, in fixed
/// notation for exponents from -4 to 15 (`0.0001`, `1.0`, `1e+16`,
/// `1e-05`), `NaN` and `Infinity` as `json.dumps` writes them.
fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` is the shortest round-trip form: `-1.2345e-5`
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if x < 0.0 { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let body = if exp < 0 {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        } else if exp + 1 >= n {
            format!("{digits}{}.0", "0".repeat((exp + 1 - n) as usize))
        } else {
            let (int, frac) = digits.split_at((exp + 1) as usize);
            format!("{int}.{frac}")
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{exp_sign}{:02}", exp.abs())
    }
}

// ---------------------------------------------------------------------------
// strftime_now

/// transformers' `strftime_now(format)`: the current time (UTC here), or
/// the fixed `seconds` since 1970, formatted.
fn strftime_now(
    fixed: Option<i64>,
) -> impl Fn(String) -> std::result::Result<String, minijinja::Error> + Send + Sync + 'static {
    move |format: String| {
        let seconds = fixed.unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0)
        });
        Ok(strftime(&format, seconds))
    }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// C's `strftime` for a UTC time: `%a %A %b %B %d %e %H %I %j %m %M %p %S
/// %y %Y %Z %z %F %T %D %%`, with glibc's `%-d` (no padding) on the
/// numbers; other sequences are kept as written.
pub(super) fn strftime(format: &str, seconds: i64) -> String {
    let days = seconds.div_euclid(86_400);
    let secs = seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.next_if_eq(&'-').is_some();
        let num = |n: i64, width: usize| {
            if unpadded {
                n.to_string()
            } else {
                format!("{n:0width$}")
            }
        };
        let Some(spec) = chars.next() else {
            out.push('%');
            if unpadded {
                out.push('-');
            }
            break;
        };
        let month_name = MONTHS[(month - 1) as usize];
        let text = match spec {
            'a' => WEEKDAYS[weekday][..3].to_string(),
            'A' => WEEKDAYS[weekday].to_string(),
            'b' | 'h' => month_name[..3].to_string(),
            'B' => month_name.to_string(),
            'd' => num(day as i64, 2),
            'e' if unpadded => day.to_string(),
            'e' => format!("{day:>2}"),
            'H' => num(hour, 2),
            'I' => num(hour12, 2),
            'j' => num(yday, 3),
            'm' => num(month as i64, 2),
            'M' => num(minute, 2),
            'p' => (if hour < 12 { "AM" } else { "PM" }).to_string(),
            'S' => num(second, 2),
            'y' => num((year as i64).rem_euclid(100), 2),
            'Y' => year.to_string(),
            'Z' => "UTC".to_string(),
            'z' => "+0000".to_string(),
            'F' => format!("{year:04}-{month:02}-{day:02}"),
            'T' => format!("{hour:02}:{minute:02}:{second:02}"),
            'D' => format!("{month:02}/{day:02}/{:02}", (year as i64).rem_euclid(100)),
            '%' => "%".to_string(),
            other => format!("%{}{other}", if unpadded { "-" } else { "" }),
        };
        out.push_str(&text);
    }
    out
}

/// The (year, month, day) of a day number (days since 1970-01-01), from
/// Howard Hinnant's `civil_from_days`.
fn civil_from_days(days: i64) -> (i32, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = (yoe + era * 400 + i64::from(month <= 2)) as i32;
    (year, month, day)
}

/// The day number (days since 1970-01-01) of a date.
fn days_from_civil(year: i32, month: u32, day: u32) -> i64 {
    let y = i64::from(year) - i64::from(month <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        for (y, m, d) in [(1970, 1, 1), (2000, 2, 29), (2024, 7, 26), (1969, 12, 31)] {
            assert_eq!(civil_from_days(days_from_civil(y, m, d)), (y, m, d));
        }
        // 2024-07-26 was a Friday, the 208th day of a leap year
        let t = days_from_civil(2024, 7, 26) * 86_400 + 13 * 3600 + 5 * 60 + 9;
        assert_eq!(
            strftime(
                "%d %b %Y|%A %a|%B|%j|%H:%M:%S %I%p|%y %m %-d %e|%F %T|%%|%Q",
                t
            ),
            "26 Jul 2024|Friday Fri|July|208|13:05:09 01PM|24 07 26 26|2024-07-26 13:05:09|%|%Q"
        );
    }

    #[test]
    fn python_float_repr() {
        for (x, want) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (1.5e300, "1.5e+300"),
            (0.1 + 0.2, "0.30000000000000004"),
            (100.0, "100.0"),
        ] {
            assert_eq!(py_float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn generation_blocks() {
        assert_eq!(
            generation_blocks_as_ifs(
                "a{%- generation %}b{% endgeneration -%}c{% if x %}{% generations %}"
            ),
            "a{%- if true %}b{% endif -%}c{% if x %}{% generations %}"
        );
    }
}
