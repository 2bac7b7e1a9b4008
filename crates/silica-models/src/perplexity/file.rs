//! The logits file (see the [`perplexity`](super) module documentation
//! for its layout): its header, written by [`LogitsWriter`] and read and
//! checked by [`LogitsReader`], in silica's format or llama.cpp's.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::DEFAULT_SPAN;
use super::codec::{LogProbCodec, RowComparison, SavedRow};
use super::llama_cpp::{LLAMA_CPP_MAGIC, LLAMA_CPP_SPAN, LlamaCppRow};
use super::windows::{RowScore, Windows, token_hash};
use crate::{Error, Result};

const MAGIC: &[u8; 8] = b"SILICALP";
const VERSION: u32 = 1;
const MAX_DESCRIPTION: usize = 1 << 16;
/// Bytes of a record before its codes: top id, top log-prob, target log-prob.
const RECORD_HEAD: usize = 12;

/// A saved position, in either file format.
#[derive(Clone, Debug, PartialEq)]
pub enum BaseRow {
    Silica(SavedRow),
    LlamaCpp(LlamaCppRow),
}

impl Default for BaseRow {
    fn default() -> Self {
        BaseRow::Silica(SavedRow::default())
    }
}

/// The layout of a logits file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsFormat {
    /// silica's (see the [`perplexity`](super) module documentation).
    Silica,
    /// llama.cpp's, of `llama-perplexity --kl-divergence-base`: `_logits_`,
    /// the window length (u32), the vocabulary size and the number of
    /// windows (i32), the token ids of all windows (i32), then per scored
    /// position two f32 (`scale`, `min_log_prob`) and a u16 per token,
    /// padded to an even count ([`LlamaCppRow`]). Its windows are always
    /// [`Windows::chunks`].
    LlamaCpp,
}

/// The header of a logits file.
#[derive(Clone, Debug, PartialEq)]
pub struct LogitsHeader {
    pub format: LogitsFormat,
    pub vocab_size: usize,
    pub windows: Windows,
    /// Tokens of the whole text.
    pub token_count: u64,
    /// [`token_hash`] of them.
    pub token_hash: [u8; 32],
    /// The range of log-probabilities the codes cover.
    pub span: f32,
    /// Which model, device and path wrote the file.
    pub description: String,
    /// The token ids a llama.cpp file holds (empty for silica's).
    tokens: Vec<u32>,
}

impl LogitsHeader {
    /// The header of a run of `windows` over `tokens`.
    pub fn new(
        tokens: &[u32],
        windows: Windows,
        vocab_size: usize,
        description: &str,
    ) -> LogitsHeader {
        LogitsHeader {
            vocab_size,
            windows,
            token_count: tokens.len() as u64,
            token_hash: token_hash(tokens),
            span: DEFAULT_SPAN,
            description: description.to_string(),
            format: LogitsFormat::Silica,
            tokens: Vec::new(),
        }
    }

    /// The header of a file in llama.cpp's format for a run of `windows`
    /// (llama.cpp's own, [`Windows::chunks`]) over `tokens`, which
    /// `llama-perplexity --kl-divergence --kl-divergence-base FILE` reads.
    pub fn llama_cpp(tokens: &[u32], windows: Windows, vocab_size: usize) -> Result<LogitsHeader> {
        if windows.step != windows.ctx || windows.first != windows.ctx / 2 {
            return Err(Error::InvalidInput(
                "llama.cpp's logits files hold its own windows only (no --stride)".into(),
            ));
        }
        let used = &tokens[..windows.tokens_used().min(tokens.len())];
        if used.len() != windows.tokens_used() || i32::try_from(vocab_size).is_err() {
            return Err(Error::InvalidInput(
                "the run does not fit a llama.cpp logits file".into(),
            ));
        }
        if let Some(&bad) = used.iter().find(|&&t| i32::try_from(t).is_err()) {
            return Err(Error::InvalidInput(format!(
                "token id {bad} does not fit a llama.cpp logits file"
            )));
        }
        Ok(LogitsHeader {
            format: LogitsFormat::LlamaCpp,
            vocab_size,
            windows,
            token_count: used.len() as u64,
            token_hash: token_hash(used),
            span: LLAMA_CPP_SPAN,
            description: "a llama.cpp logits file".into(),
            tokens: used.to_vec(),
        })
    }

    fn to_bytes(&self) -> Vec<u8> {
        if self.format == LogitsFormat::LlamaCpp {
            let mut b = Vec::with_capacity(20 + 4 * self.tokens.len());
            b.extend_from_slice(LLAMA_CPP_MAGIC);
            b.extend_from_slice(&(self.windows.ctx as u32).to_le_bytes());
            b.extend_from_slice(&(self.vocab_size as i32).to_le_bytes());
            b.extend_from_slice(&(self.windows.count as i32).to_le_bytes());
            for &t in &self.tokens {
                b.extend_from_slice(&t.to_le_bytes());
            }
            return b;
        }
        let mut b = Vec::with_capacity(80 + self.description.len());
        b.extend_from_slice(MAGIC);
        let w = &self.windows;
        for v in [
            VERSION,
            self.vocab_size as u32,
            w.ctx as u32,
            w.first as u32,
            w.step as u32,
            w.count as u32,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.token_count.to_le_bytes());
        b.extend_from_slice(&self.token_hash);
        b.extend_from_slice(&self.span.to_le_bytes());
        b.extend_from_slice(&(self.description.len() as u32).to_le_bytes());
        b.extend_from_slice(self.description.as_bytes());
        b
    }

    /// Bytes of one record.
    pub fn record_bytes(&self) -> u64 {
        let v = self.vocab_size as u64;
        match self.format {
            LogitsFormat::Silica => RECORD_HEAD as u64 + 2 * v,
            LogitsFormat::LlamaCpp => 2 * (2 * v.div_ceil(2) + 4),
        }
    }

    /// Bytes of the header itself.
    fn header_bytes(&self) -> u64 {
        match self.format {
            LogitsFormat::Silica => 80 + self.description.len() as u64,
            LogitsFormat::LlamaCpp => 20 + 4 * self.token_count,
        }
    }

    /// Bytes of the whole file (`u64::MAX` if that overflows, which only
    /// a corrupt header can ask for).
    pub fn file_bytes(&self) -> u64 {
        let w = &self.windows;
        (w.count as u128 * w.scored() as u128 * u128::from(self.record_bytes())
            + u128::from(self.header_bytes()))
        .try_into()
        .unwrap_or(u64::MAX)
    }
}

/// Writes a logits file, a record per scored position, to `BASE.partial`;
/// [`LogitsWriter::finish`] renames it to `BASE` once every record is in.
pub struct LogitsWriter {
    path: PathBuf,
    partial: PathBuf,
    out: Option<BufWriter<File>>,
    header: LogitsHeader,
    codec: LogProbCodec,
    written: usize,
}

impl LogitsWriter {
    pub fn create(path: &Path, header: LogitsHeader) -> Result<LogitsWriter> {
        if header.description.len() > MAX_DESCRIPTION {
            return Err(Error::InvalidInput(format!(
                "a description of {} bytes (at most {MAX_DESCRIPTION})",
                header.description.len()
            )));
        }
        let fits = |v: usize| u32::try_from(v).is_ok();
        let w = &header.windows;
        if !(fits(header.vocab_size) && fits(w.ctx) && fits(w.step) && fits(w.count)) {
            return Err(Error::InvalidInput(
                "the run is too large for the logits file's 32-bit fields".into(),
            ));
        }
        let codec = LogProbCodec::new(header.span)?;
        let mut partial = path.as_os_str().to_owned();
        partial.push(".partial");
        let partial = PathBuf::from(partial);
        let io = |source| Error::Io {
            path: partial.clone(),
            source,
        };
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&partial).map_err(io)?);
        out.write_all(&header.to_bytes()).map_err(io)?;
        Ok(LogitsWriter {
            path: path.to_path_buf(),
            partial,
            out: Some(out),
            header,
            codec,
            written: 0,
        })
    }

    pub fn header(&self) -> &LogitsHeader {
        &self.header
    }

    pub fn codec(&self) -> &LogProbCodec {
        &self.codec
    }

    /// Scores a row of logits against `target` and encodes it in the
    /// file's format.
    pub fn encode(&self, logits: &[f32], target: u32) -> Result<(BaseRow, RowScore)> {
        Ok(match self.header.format {
            LogitsFormat::Silica => {
                let (row, score) = self.codec.encode(logits, target)?;
                (BaseRow::Silica(row), score)
            }
            LogitsFormat::LlamaCpp => {
                let (row, score) = LlamaCppRow::encode(logits, target)?;
                (BaseRow::LlamaCpp(row), score)
            }
        })
    }

    /// Appends the record of the next scored position.
    pub fn write_row(&mut self, row: &BaseRow) -> Result<()> {
        let codes = match row {
            BaseRow::Silica(r) => &r.codes,
            BaseRow::LlamaCpp(r) => &r.codes,
        };
        let format_ok = matches!(
            (row, self.header.format),
            (BaseRow::Silica(_), LogitsFormat::Silica)
                | (BaseRow::LlamaCpp(_), LogitsFormat::LlamaCpp)
        );
        if codes.len() != self.header.vocab_size || !format_ok {
            return Err(Error::InvalidInput(format!(
                "a row of {} codes for a {:?} file of a vocabulary of {}",
                codes.len(),
                self.header.format,
                self.header.vocab_size
            )));
        }
        if self.written >= self.header.windows.positions() {
            return Err(Error::InvalidInput(format!(
                "{}: all {} records are already written",
                self.path.display(),
                self.written
            )));
        }
        let io = |source| Error::Io {
            path: self.partial.clone(),
            source,
        };
        let Some(out) = self.out.as_mut() else {
            return Err(Error::InvalidInput("the logits file is closed".into()));
        };
        let mut b = Vec::with_capacity(self.header.record_bytes() as usize);
        match row {
            BaseRow::Silica(r) => {
                b.extend_from_slice(&r.top.to_le_bytes());
                b.extend_from_slice(&r.top_log_prob.to_le_bytes());
                b.extend_from_slice(&r.target_log_prob.to_le_bytes());
            }
            BaseRow::LlamaCpp(r) => {
                b.extend_from_slice(&r.scale.to_le_bytes());
                b.extend_from_slice(&r.min_log_prob.to_le_bytes());
            }
        }
        for &c in codes {
            b.extend_from_slice(&c.to_le_bytes());
        }
        // llama.cpp pads the codes to an even count
        b.resize(self.header.record_bytes() as usize, 0);
        out.write_all(&b).map_err(io)?;
        self.written += 1;
        Ok(())
    }

    /// Flushes the file and gives it its name; an error when records are
    /// missing. Returns the path and the file's size in bytes.
    pub fn finish(mut self) -> Result<(PathBuf, u64)> {
        let want = self.header.windows.positions();
        if self.written != want {
            return Err(Error::InvalidInput(format!(
                "{}: {} of {want} records written",
                self.path.display(),
                self.written
            )));
        }
        let io = |path: &Path, source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(out) = self.out.take() {
            let file = out
                .into_inner()
                .map_err(|e| io(&self.partial, e.into_error()))?;
            file.sync_all().map_err(|e| io(&self.partial, e))?;
        }
        std::fs::rename(&self.partial, &self.path).map_err(|e| io(&self.path, e))?;
        Ok((self.path.clone(), self.header.file_bytes()))
    }
}

impl Drop for LogitsWriter {
    /// An unfinished file is removed.
    fn drop(&mut self) {
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

/// Reads a logits file record by record, after checking its header and
/// its length.
pub struct LogitsReader {
    path: PathBuf,
    input: BufReader<File>,
    header: LogitsHeader,
    codec: LogProbCodec,
    read: usize,
    buf: Vec<u8>,
}

impl LogitsReader {
    pub fn open(path: &Path) -> Result<LogitsReader> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut input = BufReader::with_capacity(1 << 20, file);
        let bad = |offset: u64, msg: String| Error::Format {
            path: path.to_path_buf(),
            offset,
            msg,
        };
        let mut fixed = [0u8; 80];
        let n = read_up_to(&mut input, &mut fixed).map_err(io)?;
        if n >= 8 && &fixed[..8] == LLAMA_CPP_MAGIC {
            return Self::open_llama_cpp(path, len, input);
        }
        if n < 8 || &fixed[..8] != MAGIC {
            return Err(bad(
                0,
                "not a logits file of `silica perplexity --save-logits` or llama.cpp's `--kl-divergence-base` (no `SILICALP` or `_logits_` at the start)"
                    .into(),
            ));
        }
        if n < fixed.len() {
            return Err(bad(
                n as u64,
                format!(
                    "truncated: the file ends inside its header ({len} bytes, the header has at least 80)"
                ),
            ));
        }
        let u32_at = |o: usize| u32::from_le_bytes(fixed[o..o + 4].try_into().unwrap());
        let version = u32_at(8);
        if version != VERSION {
            return Err(bad(
                8,
                format!("format version {version} (this silica reads version {VERSION})"),
            ));
        }
        let vocab_size = u32_at(12) as usize;
        let windows = Windows {
            ctx: u32_at(16) as usize,
            first: u32_at(20) as usize,
            step: u32_at(24) as usize,
            count: u32_at(28) as usize,
        };
        let token_count = u64::from_le_bytes(fixed[32..40].try_into().unwrap());
        let token_hash: [u8; 32] = fixed[40..72].try_into().unwrap();
        let span = f32::from_le_bytes(fixed[72..76].try_into().unwrap());
        let desc_len = u32_at(76) as usize;
        if vocab_size == 0 {
            return Err(bad(12, "a vocabulary of 0 tokens".into()));
        }
        let n_tokens = usize::try_from(token_count).unwrap_or(usize::MAX);
        if !windows.valid_for(n_tokens) {
            return Err(bad(
                16,
                format!(
                    "inconsistent windows: {} of {} tokens every {} tokens scored from row {}, over a text of {token_count} tokens",
                    windows.count, windows.ctx, windows.step, windows.first
                ),
            ));
        }
        let codec =
            LogProbCodec::new(span).map_err(|_| bad(72, format!("a span of {span} nats")))?;
        if desc_len > MAX_DESCRIPTION {
            return Err(bad(
                76,
                format!("a description of {desc_len} bytes (at most {MAX_DESCRIPTION})"),
            ));
        }
        let mut desc = vec![0u8; desc_len];
        let got = read_up_to(&mut input, &mut desc).map_err(io)?;
        if got < desc_len {
            return Err(bad(
                80 + got as u64,
                format!("truncated: the file ends inside its header ({len} bytes)"),
            ));
        }
        let description = String::from_utf8(desc).map_err(|e| {
            bad(
                80 + e.utf8_error().valid_up_to() as u64,
                "a description that is not UTF-8".into(),
            )
        })?;
        let header = LogitsHeader {
            format: LogitsFormat::Silica,
            vocab_size,
            windows,
            token_count,
            token_hash,
            span,
            description,
            tokens: Vec::new(),
        };
        check_length(path, len, &header)?;
        Ok(LogitsReader {
            path: path.to_path_buf(),
            input,
            buf: vec![0; header.record_bytes() as usize],
            header,
            codec,
            read: 0,
        })
    }

    /// Opens a file of llama.cpp's format (after its magic).
    fn open_llama_cpp(path: &Path, len: u64, mut input: BufReader<File>) -> Result<LogitsReader> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let bad = |offset: u64, msg: String| Error::Format {
            path: path.to_path_buf(),
            offset,
            msg: format!("llama.cpp logits file: {msg}"),
        };
        if len < 20 {
            return Err(bad(
                len,
                format!(
                    "truncated: the file ends inside its header ({len} bytes, llama.cpp's has at least 20)"
                ),
            ));
        }
        input.seek(SeekFrom::Start(8)).map_err(io)?;
        let mut fixed = [0u8; 12];
        input.read_exact(&mut fixed).map_err(io)?;
        let ctx = u32::from_le_bytes(fixed[0..4].try_into().unwrap()) as usize;
        let vocab = i32::from_le_bytes(fixed[4..8].try_into().unwrap());
        let count = i32::from_le_bytes(fixed[8..12].try_into().unwrap());
        if vocab <= 0 {
            return Err(bad(12, format!("a vocabulary of {vocab} tokens")));
        }
        if count <= 0 || ctx < 3 {
            return Err(bad(
                8,
                format!("inconsistent windows: {count} of {ctx} tokens"),
            ));
        }
        let n_tokens = ctx as u64 * count as u64;
        if 20 + 4 * n_tokens > len {
            return Err(bad(
                len,
                format!(
                    "truncated: {len} bytes, fewer than the {} of its {n_tokens} token ids",
                    20 + 4 * n_tokens
                ),
            ));
        }
        let mut raw = vec![0u8; 4 * n_tokens as usize];
        input.read_exact(&mut raw).map_err(io)?;
        let mut tokens = Vec::with_capacity(n_tokens as usize);
        for (i, b) in raw.chunks_exact(4).enumerate() {
            let t = i32::from_le_bytes(b.try_into().unwrap());
            if t < 0 || t >= vocab {
                return Err(bad(
                    20 + 4 * i as u64,
                    format!("token id {t} outside the vocabulary of {vocab}"),
                ));
            }
            tokens.push(t as u32);
        }
        let header = LogitsHeader {
            format: LogitsFormat::LlamaCpp,
            vocab_size: vocab as usize,
            windows: Windows {
                ctx,
                step: ctx,
                first: ctx / 2,
                count: count as usize,
            },
            token_count: n_tokens,
            token_hash: token_hash(&tokens),
            span: LLAMA_CPP_SPAN,
            description: format!("a llama.cpp logits file ({count} windows of {ctx} tokens)"),
            tokens,
        };
        check_length(path, len, &header)?;
        Ok(LogitsReader {
            path: path.to_path_buf(),
            input,
            buf: vec![0; header.record_bytes() as usize],
            header,
            codec: LogProbCodec::new(DEFAULT_SPAN)?,
            read: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn header(&self) -> &LogitsHeader {
        &self.header
    }

    pub fn codec(&self) -> &LogProbCodec {
        &self.codec
    }

    /// An error unless the file was saved from exactly these tokens.
    /// A llama.cpp file holds the token ids of its windows, which must
    /// begin `tokens`.
    pub fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let h = &self.header;
        if h.format == LogitsFormat::LlamaCpp {
            let n = h.tokens.len();
            let first_difference = (0..n).find(|&i| tokens.get(i) != Some(&h.tokens[i]));
            if let Some(i) = first_difference {
                return Err(Error::InvalidInput(format!(
                    "{}: saved from another text or tokenizer: its {n} token ids differ from this text's ({} tokens) at token {i}",
                    self.path.display(),
                    tokens.len()
                )));
            }
            return Ok(());
        }
        if h.token_count != tokens.len() as u64 || h.token_hash != token_hash(tokens) {
            return Err(Error::InvalidInput(format!(
                "{}: saved from another text or tokenizer: {} tokens with hash {} there, {} tokens with hash {} here",
                self.path.display(),
                h.token_count,
                hex8(&h.token_hash),
                tokens.len(),
                hex8(&token_hash(tokens))
            )));
        }
        Ok(())
    }

    /// An error unless the file's vocabulary has `vocab_size` tokens.
    pub fn check_vocab(&self, vocab_size: usize) -> Result<()> {
        if self.header.vocab_size != vocab_size {
            return Err(Error::InvalidInput(format!(
                "{}: saved with a vocabulary of {} tokens, the model has {vocab_size}",
                self.path.display(),
                self.header.vocab_size
            )));
        }
        Ok(())
    }

    /// Compares a row of logits with a saved row of this file.
    pub fn compare(&self, logits: &[f32], target: u32, base: &BaseRow) -> Result<RowComparison> {
        match base {
            BaseRow::Silica(row) => self.codec.compare(logits, target, row),
            BaseRow::LlamaCpp(row) => row.compare(logits, target),
        }
    }

    /// Reads the next record into `row`.
    pub fn read_row(&mut self, row: &mut BaseRow) -> Result<()> {
        let rb = self.buf.len() as u64;
        let offset = self.header.header_bytes() + self.read as u64 * rb;
        if self.read >= self.header.windows.positions() {
            return Err(Error::Format {
                path: self.path.clone(),
                offset,
                msg: format!("no record after the {} the header announces", self.read),
            });
        }
        self.input.read_exact(&mut self.buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Error::Format {
                    path: self.path.clone(),
                    offset,
                    msg: format!(
                        "truncated while it was read: record {} is incomplete",
                        self.read
                    ),
                }
            } else {
                Error::Io {
                    path: self.path.clone(),
                    source: e,
                }
            }
        })?;
        let b = &self.buf;
        let f32_at = |o: usize| f32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        if self.header.format == LogitsFormat::LlamaCpp {
            let (scale, min_log_prob) = (f32_at(0), f32_at(4));
            if !(scale.is_finite()
                && scale >= 0.0
                && min_log_prob.is_finite()
                && min_log_prob <= 0.0)
            {
                return Err(Error::Format {
                    path: self.path.clone(),
                    offset,
                    msg: format!(
                        "record {}: scale {scale} and minimum log-probability {min_log_prob}",
                        self.read
                    ),
                });
            }
            if !matches!(row, BaseRow::LlamaCpp(_)) {
                *row = BaseRow::LlamaCpp(LlamaCppRow::default());
            }
            let BaseRow::LlamaCpp(row) = row else {
                unreachable!("set just above")
            };
            row.scale = scale;
            row.min_log_prob = min_log_prob;
            row.codes.clear();
            row.codes.extend(
                b[8..8 + 2 * self.header.vocab_size]
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]])),
            );
            self.read += 1;
            return Ok(());
        }
        if !matches!(row, BaseRow::Silica(_)) {
            *row = BaseRow::default();
        }
        let BaseRow::Silica(row) = row else {
            unreachable!("set just above")
        };
        let top = u32::from_le_bytes(b[0..4].try_into().unwrap());
        if top as usize >= self.header.vocab_size {
            return Err(Error::Format {
                path: self.path.clone(),
                offset,
                msg: format!(
                    "record {}: most likely token {top} outside the vocabulary of {}",
                    self.read, self.header.vocab_size
                ),
            });
        }
        row.top = top;
        row.top_log_prob = f32_at(4);
        row.target_log_prob = f32_at(8);
        let log_prob_ok = |lp: f32| lp.is_finite() && lp <= 0.0;
        if !(log_prob_ok(row.top_log_prob) && log_prob_ok(row.target_log_prob)) {
            return Err(Error::Format {
                path: self.path.clone(),
                offset: offset + 4,
                msg: format!(
                    "record {}: log-probabilities {} and {} (finite, at most 0 expected)",
                    self.read, row.top_log_prob, row.target_log_prob
                ),
            });
        }
        row.codes.clear();
        row.codes.extend(
            b[RECORD_HEAD..]
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]])),
        );
        if row.codes[top as usize] == 0 {
            return Err(Error::Format {
                path: self.path.clone(),
                offset,
                msg: format!("record {}: the most likely token has code 0", self.read),
            });
        }
        self.read += 1;
        Ok(())
    }
}

/// An error unless the file is exactly as long as its header says.
fn check_length(path: &Path, len: u64, header: &LogitsHeader) -> Result<()> {
    let bad = |offset: u64, msg: String| Error::Format {
        path: path.to_path_buf(),
        offset,
        msg,
    };
    let want = header.file_bytes();
    let w = &header.windows;
    if len < want {
        let rb = header.record_bytes();
        let complete = len.saturating_sub(header.header_bytes()) / rb;
        return Err(bad(
            len,
            format!(
                "truncated: {len} bytes where the header announces {want} ({} windows × {} positions of {rb} bytes); {complete} complete records",
                w.count,
                w.scored()
            ),
        ));
    }
    if len > want {
        return Err(bad(
            want,
            format!(
                "{} bytes after the last record (the header announces {want} bytes)",
                len - want
            ),
        ));
    }
    Ok(())
}

fn hex8(h: &[u8; 32]) -> String {
    h[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads until `buf` is full or the input ends; the bytes read.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
