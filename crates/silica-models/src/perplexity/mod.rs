//! Perplexity of a decoder over a text, and how far its next-token
//! distributions are from saved ones: what llama.cpp's `llama-perplexity`
//! computes, with and without `--kl-divergence`.
//!
//! # Windows
//!
//! The text is tokenized once, with BOS first when the model adds one.
//! [`Windows`] cuts the tokens into windows of `ctx` tokens, each evaluated
//! from an empty KV cache, its first token replaced by BOS (when the model
//! has one), as llama.cpp does:
//!
//! * [`Windows::chunks`] (llama.cpp's default): consecutive windows that do
//!   not overlap; the logits of rows `ctx/2 .. ctx-1` are scored (each
//!   predicts the next token of the window), so the first half of each
//!   window is context only and `ctx - 1 - ctx/2` tokens are scored per
//!   window. This is the computation behind llama.cpp's figures, so the
//!   perplexities can be compared with its.
//! * [`Windows::strided`] (`--stride S`): windows start every `S` tokens
//!   and the last `S` tokens of each are scored, so every token after the
//!   first window is scored exactly once, each with at least `ctx - S - 1`
//!   tokens of context (what Hugging Face's perplexity guide calls a
//!   sliding window).
//!
//! Scores are computed on the host in f64 from the f32 logits: a row's
//! negative log-likelihood is `log Σ exp(logit) − logit[next]`, and the
//! perplexity `exp(mean)`, reported with llama.cpp's uncertainty
//! (`PPL × the standard error of the mean`).
//!
//! # Comparing with saved logits
//!
//! A run writes the log-probabilities of every scored position to a file
//! ([`LogitsWriter`]); a later run of another path, dtype, device or
//! quantization over the same tokens compares its own with them
//! ([`LogitsReader`], [`KlStats`]): the KL divergence `KL(base ‖ this)`
//! per position (mean with its uncertainty, percentiles), top-1 agreement,
//! the change of the correct token's probability `Δp = p − p_base`, and
//! both perplexities with the log of their ratio, in the layout of
//! llama.cpp's report ([`KlSummary::report`]).
//!
//! # The logits file
//!
//! Little-endian throughout. A header:
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `SILICALP` |
//! | 4 | format version, 1 |
//! | 4 | vocabulary size `V` |
//! | 4 | window length `ctx` |
//! | 4 | `first`: the row of the first scored logit in each window |
//! | 4 | `step`: tokens between the starts of consecutive windows |
//! | 4 | number of windows `W` |
//! | 8 | number of tokens of the whole text (BOS included) |
//! | 32 | SHA-256 of those token ids, each as 4 bytes ([`token_hash`]) |
//! | 4 | `span` (f32): the range of log-probabilities the codes cover |
//! | 4 | length `L` of the description, at most 65,536 |
//! | L | description (UTF-8): the model, device and path that wrote the file |
//!
//! then `W × (ctx − 1 − first)` records, window after window, one per
//! scored position, of `12 + 2V` bytes:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | the most likely token (u32) |
//! | 4 | its log-probability `top` (f32) |
//! | 4 | the log-probability of the actual next token (f32, exact) |
//! | 2V | one u16 code per token |
//!
//! A code `c ≥ 1` stands for the log-probability
//! `top − span + (c − 1) · span / 65534`: codes cover `[top − span, top]`
//! in steps of `span / 65534` (3.7e-4 for the default span of 24), so each
//! is within 1.8e-4 of the true value and the most likely token's code is
//! exactly 65535. Code 0 marks a token less likely than `e^−span` times the
//! most likely one, taken as probability 0. Reading renormalizes the
//! decoded probabilities to sum to 1, so KL divergences are never negative
//! and a path compared with its own file gives about 1e-8. This is
//! llama.cpp's scheme (16-bit log-probabilities over a fixed range below
//! the maximum), with a wider range (24 nats instead of 16), the exact
//! log-probability of the correct token (llama.cpp decodes it from its
//! code, which is the floor for a token below the range) and the argmax
//! (which equal codes would leave ambiguous) kept beside the codes, and a
//! header that says which tokens the file belongs to: a
//! comparison over another text, tokenizer or vocabulary is refused.
//!
//! [`LogitsFormat::LlamaCpp`] reads and writes llama.cpp's own file (that
//! of `llama-perplexity --kl-divergence-base`) instead, so that either
//! program's run can be compared with the other's saved logits over the
//! same tokens; it holds the windows' token ids, which are compared with
//! this text's, and its rows are compared as llama.cpp compares them
//! ([`LlamaCppRow::compare`]).
//!
//! A file takes about `2V` bytes per scored position: 96 KiB for a
//! 49,152-token vocabulary, 24 MiB per 512-token window. It is written as
//! `BASE.partial` and renamed when complete.
//!
//! Every problem with a file (not this format, another version, a
//! truncated or overlong file, inconsistent header fields) is an
//! [`Error`] naming the file and what was wrong, never a panic.

mod codec;
mod file;
mod llama_cpp;
mod stats;
mod windows;

use std::time::{Duration, Instant};

use rayon::prelude::*;

pub use codec::{LogProbCodec, RowComparison, SavedRow};
pub use file::{BaseRow, LogitsFormat, LogitsHeader, LogitsReader, LogitsWriter};
pub use llama_cpp::LlamaCppRow;
pub use stats::{Estimate, KlStats, KlSummary, Spread};
pub use windows::{RowScore, Sums, Windows, score_row, token_hash, tokenize};

use crate::llama::Llama;
use crate::{Error, Result};

/// The default window length, llama.cpp's.
pub const DEFAULT_CTX: usize = 512;

/// The default range of log-probabilities below the most likely token that
/// a saved file keeps (nats).
pub const DEFAULT_SPAN: f32 = 24.0;

/// What a run does besides computing the perplexity.
pub enum Mode<'a> {
    /// Only the perplexity.
    Perplexity,
    /// Also writes every scored position's log-probabilities.
    Save(&'a mut LogitsWriter),
    /// Also compares them with a saved file's.
    Compare(&'a mut LogitsReader),
}

/// Where a run stands after a window.
pub struct Progress<'a> {
    /// Windows done (1-based index of the one just done).
    pub done: usize,
    pub windows: usize,
    /// Time of the window just done.
    pub elapsed: Duration,
    /// The negative log-likelihoods so far.
    pub nll: &'a Sums,
    /// The comparison so far (in [`Mode::Compare`]).
    pub kl: Option<&'a KlStats>,
}

/// What a run found.
#[derive(Clone, Debug, Default)]
pub struct Evaluation {
    pub nll: Sums,
    /// In [`Mode::Compare`].
    pub kl: Option<KlStats>,
}

/// How a window's scored positions are computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pass {
    /// The whole window in one forward, as a prompt is processed.
    #[default]
    Prompt,
    /// The positions before the first scored one as a prompt, then each
    /// scored position as a decode step of one token, as generation
    /// computes them (a device's decode products may differ from its
    /// prompt products, e.g. in how they round activations).
    Decode,
}

/// Evaluates `model` on each of `windows` over `tokens` (each from an empty
/// cache, its first token replaced by `bos`), scores the positions the
/// windows score and, by `mode`, saves or compares their log-probabilities;
/// `progress` is called after each window. In [`Mode::Compare`], the
/// file's tokens and vocabulary are checked first.
pub fn evaluate(
    model: &Llama,
    tokens: &[u32],
    windows: &Windows,
    bos: Option<u32>,
    mode: Mode<'_>,
    progress: impl FnMut(&Progress<'_>),
) -> Result<Evaluation> {
    evaluate_by(model, tokens, windows, bos, Pass::Prompt, mode, progress)
}

/// The scored rows' logits `[scored, vocab]` of window `ids`.
fn window_logits(
    model: &Llama,
    ids: &[u32],
    first: usize,
    scored: usize,
    pass: Pass,
) -> Result<Vec<f32>> {
    let mut cache = model.new_cache();
    match pass {
        Pass::Prompt => Ok(model
            .forward(ids, &mut cache, false)?
            .narrow(0, first, scored)?
            .to_vec::<f32>()?),
        Pass::Decode => {
            if first > 0 {
                model.forward(&ids[..first], &mut cache, true)?;
            }
            let mut rows = Vec::with_capacity(scored * model.config.vocab_size);
            for id in &ids[first..first + scored] {
                let row = model.forward(std::slice::from_ref(id), &mut cache, true)?;
                rows.extend(row.to_vec::<f32>()?);
            }
            Ok(rows)
        }
    }
}

/// [`evaluate`], with the scored positions computed by `pass`.
pub fn evaluate_by(
    model: &Llama,
    tokens: &[u32],
    windows: &Windows,
    bos: Option<u32>,
    pass: Pass,
    mut mode: Mode<'_>,
    mut progress: impl FnMut(&Progress<'_>),
) -> Result<Evaluation> {
    let vocab = model.config.vocab_size;
    if !windows.valid_for(tokens.len()) {
        return Err(Error::InvalidInput(format!(
            "{} windows of {} tokens every {} do not fit a text of {} tokens",
            windows.count,
            windows.ctx,
            windows.step,
            tokens.len()
        )));
    }
    if windows.ctx > model.config.context_length {
        return Err(Error::InvalidInput(format!(
            "windows of {} tokens exceed the model's context of {}",
            windows.ctx, model.config.context_length
        )));
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(Error::InvalidInput(format!(
            "token id {bad} is outside the model's vocabulary of {vocab}"
        )));
    }
    match &mode {
        Mode::Perplexity => {}
        Mode::Save(w) => {
            let h = w.header();
            if h.windows.ctx != windows.ctx
                || h.windows.step != windows.step
                || h.windows.first != windows.first
                || h.windows.count != windows.count
                || h.vocab_size != vocab
            {
                return Err(Error::InvalidInput(
                    "the logits file's header does not describe this run".into(),
                ));
            }
        }
        Mode::Compare(r) => {
            r.check_vocab(vocab)?;
            r.check_tokens(tokens)?;
            let h = r.header().windows;
            if (h.ctx, h.step, h.first) != (windows.ctx, windows.step, windows.first)
                || windows.count > h.count
            {
                return Err(Error::InvalidInput(format!(
                    "{}: saved with windows of {} tokens every {} scored from row {} ({} windows); this run has {} every {} from row {} ({} windows)",
                    r.path().display(),
                    h.ctx,
                    h.step,
                    h.first,
                    h.count,
                    windows.ctx,
                    windows.step,
                    windows.first,
                    windows.count
                )));
            }
        }
    }
    let scored = windows.scored();
    let mut eval = Evaluation {
        nll: Sums::default(),
        kl: matches!(mode, Mode::Compare(_)).then(KlStats::default),
    };
    let mut base_rows: Vec<BaseRow> = Vec::new();
    for i in 0..windows.count {
        let start = Instant::now();
        let ids = windows.window(tokens, i, bos);
        let targets = windows.targets(tokens, i);
        let logits = window_logits(model, &ids, windows.first, scored, pass)?;
        if logits.len() != scored * vocab {
            return Err(Error::InvalidInput(format!(
                "window {}: {} logits where {scored} rows of {vocab} were expected",
                i + 1,
                logits.len()
            )));
        }
        let rows = logits.par_chunks_exact(vocab).zip(targets.par_iter());
        let at = |j: usize, e: Error| match e {
            Error::InvalidInput(msg) => Error::InvalidInput(format!(
                "window {}, position {}: {msg}",
                i + 1,
                windows.first + j
            )),
            e => e,
        };
        match &mut mode {
            Mode::Perplexity => {
                let scores: Vec<Result<RowScore>> =
                    rows.map(|(row, &t)| score_row(row, t)).collect();
                for (j, s) in scores.into_iter().enumerate() {
                    eval.nll.push(s.map_err(|e| at(j, e))?.nll);
                }
            }
            Mode::Save(w) => {
                let writer: &LogitsWriter = w;
                let encoded: Vec<Result<(BaseRow, RowScore)>> =
                    rows.map(|(row, &t)| writer.encode(row, t)).collect();
                for (j, r) in encoded.into_iter().enumerate() {
                    let (row, score) = r.map_err(|e| at(j, e))?;
                    w.write_row(&row)?;
                    eval.nll.push(score.nll);
                }
            }
            Mode::Compare(r) => {
                base_rows.resize_with(scored, BaseRow::default);
                for row in base_rows.iter_mut() {
                    r.read_row(row)?;
                }
                let reader: &LogitsReader = r;
                let compared: Vec<Result<RowComparison>> = rows
                    .zip(base_rows.par_iter())
                    .map(|((row, &t), base)| reader.compare(row, t, base))
                    .collect();
                let kl = eval.kl.get_or_insert_with(KlStats::default);
                for (j, c) in compared.into_iter().enumerate() {
                    let c = c.map_err(|e| at(j, e))?;
                    eval.nll.push(c.nll);
                    kl.push(&c);
                }
            }
        }
        progress(&Progress {
            done: i + 1,
            windows: windows.count,
            elapsed: start.elapsed(),
            nll: &eval.nll,
            kl: eval.kl.as_ref(),
        });
    }
    Ok(eval)
}
