//! The generation loop: prefill the prompt in one batch, then decode one
//! token at a time, streaming text as it forms.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use crate::llama::Llama;
use crate::sampling::{Sampler, draw_rows, penalize_rows};
use crate::tokenizer::{TokenStream, Tokenizer};
use crate::{Error, Result};

/// What a generation did and how fast.
#[derive(Clone, Debug, Default)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_time: Duration,
    /// Of the prefill: until the prompt's forward pass was recorded (on a
    /// GPU the host's part: kernels found or built, buffers allocated,
    /// dispatches recorded; the logits are not waited for).
    pub prefill_record_time: Duration,
    pub decode_time: Duration,
    /// Why it stopped: `eos`, `stop string`, `max tokens` or `context full`.
    pub stop_reason: &'static str,
    pub tokens: Vec<u32>,
}

impl GenerationStats {
    /// Tokens per second of the decode phase (after the first generated token).
    pub fn decode_tokens_per_second(&self) -> f64 {
        let n = self.generated_tokens.saturating_sub(1);
        if n == 0 || self.decode_time.is_zero() {
            return 0.0;
        }
        n as f64 / self.decode_time.as_secs_f64()
    }
}

/// Checks that a prompt of `tokens` tokens leaves room in a context of
/// `context` positions for at least one generated token (what [`generate`]
/// checks first; callers may check before loading the weights).
pub fn check_prompt(tokens: usize, context: usize) -> Result<()> {
    if tokens == 0 {
        return Err(Error::InvalidInput("the prompt is empty".into()));
    }
    if tokens >= context {
        return Err(Error::InvalidInput(format!(
            "the prompt has {tokens} tokens; the model's context holds {context}"
        )));
    }
    Ok(())
}

/// The next token, picked from logits `[1, vocab]` (f32, on the model's
/// device). Greedy decoding takes the argmax on the device, and a draw at a
/// temperature runs there too, as do the penalties on a GPU
/// ([`crate::sampling::Sampler::device_pick_on`],
/// [`crate::sampling::penalize_rows`], [`crate::sampling::draw_rows`]), so that
/// 4 bytes come back instead of the vocabulary's logits, and the token
/// stays there too: the next step can be queued on it before it is read.
enum Pick {
    Ready(u32),
    /// the token `[1]` on the device, and its read-back under way
    Device(silica::Tensor, Box<silica::PendingRead>),
}

impl Pick {
    /// The pick of the `counter`-th generated token (0 for the first).
    /// `in_flight`: the token picked on the device before this one and not
    /// in `history` yet, which the penalties count too.
    fn new(
        sampler: &mut Sampler,
        logits: &silica::Tensor,
        history: &[u32],
        counter: usize,
        in_flight: Option<&silica::Tensor>,
    ) -> Result<Pick> {
        if let Some((row, penalty)) = sampler.device_pick_on(counter as u64, logits.device()) {
            let penalized;
            let logits = match penalty {
                Some(p) => {
                    let flight = in_flight.map(|t| (t, &[(0u32, 0u32)][..]));
                    let row = logits.reshape(&[1, logits.numel()])?;
                    penalized = penalize_rows(&row, &[history], flight, &[p])?;
                    &penalized
                }
                None => logits,
            };
            let id = draw_rows(logits, &[row])?.reshape(&[1])?;
            let read = id.read_later()?;
            return Ok(Pick::Device(id, Box::new(read)));
        }
        Ok(Pick::Ready(
            sampler.sample(&logits.to_vec::<f32>()?, history),
        ))
    }

    /// The token, waiting for its read-back.
    fn wait(self) -> Result<u32> {
        match self {
            Pick::Ready(id) => Ok(id),
            Pick::Device(_, read) => read
                .to_vec::<u32>()?
                .first()
                .copied()
                .ok_or_else(|| Error::InvalidInput("no logits to pick from".into())),
        }
    }
}

/// Generates up to `max_tokens` after `prompt` (token ids), calling
/// `on_text` with each piece of decoded text. Stops at an end-of-sequence
/// token, at one of `stop` strings (not printed), when the context is full,
/// or when `on_text` returns `ControlFlow::Break` (stop reason
/// "cancelled": a closed stream, a client gone).
pub fn generate(
    model: &Llama,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    sampler: &mut Sampler,
    max_tokens: usize,
    stop: &[String],
    mut on_text: impl FnMut(&str) -> ControlFlow<()>,
) -> Result<GenerationStats> {
    let context = model.config.context_length;
    check_prompt(prompt.len(), context)?;
    let mut cache = model.new_cache();
    let mut stats = GenerationStats {
        prompt_tokens: prompt.len(),
        stop_reason: "max tokens",
        ..Default::default()
    };
    let mut history = prompt.to_vec();
    let mut stream = TokenStream::new(tokenizer);
    let mut text = String::new();
    let t0 = Instant::now();
    // on a GPU a second thread builds the decode step's kernels while this
    // one records the prompt's (a few ms each even with a warm driver
    // cache, a noticeable share of a short generation when the first step
    // builds them itself; docs/tuning.md, "Decode kernels built ahead");
    // not under a memory limit, since it allocates a small cache and
    // activations of its own
    let device = model.device();
    let build = device.is_gpu() && device.memory_stats().limit.is_none();
    let mut pick = std::thread::scope(|s| {
        let builder = build.then(|| s.spawn(|| model.build_decode_kernels(prompt.len())));
        let logits = model.forward(prompt, &mut cache, true)?;
        stats.prefill_record_time = t0.elapsed();
        let pick = Pick::new(sampler, &logits, &history, 0, None);
        if let Some(Ok(Err(e))) = builder.map(|b| b.join()) {
            // the first step builds whatever is missing
            tracing::debug!("building the decode kernels ahead failed: {e}");
        }
        pick
    })?;
    // on a GPU, a token picked on the device feeds the next step before it
    // is read back, so the device is not left idle while the host reads it,
    // decodes its text and records the step after (the step queued after
    // the last token, when generation stops there, is thrown away). The
    // step's own pick is queued with it, which submits the whole step
    // before the host waits: the device then always holds a step's work.
    let ahead_ok = model.device().is_gpu();
    let mut first = true;
    let mut t1 = Instant::now();
    while stats.generated_tokens < max_tokens {
        let ahead = match &pick {
            Pick::Device(id, _)
                if ahead_ok
                    && !first
                    && stats.generated_tokens + 1 < max_tokens
                    && cache.len() < context =>
            {
                let logits = model.forward_ids(id, &mut cache, true)?;
                Some(Pick::new(
                    sampler,
                    &logits,
                    &history,
                    stats.generated_tokens + 1,
                    Some(id),
                )?)
            }
            _ => None,
        };
        let next = pick.wait()?;
        if first {
            // the prefill ends with its token on the host
            stats.prefill_time = t0.elapsed();
            t1 = Instant::now();
            first = false;
        }
        if tokenizer.is_eos(next) {
            stats.stop_reason = "eos";
            break;
        }
        history.push(next);
        stats.tokens.push(next);
        stats.generated_tokens += 1;
        if let Some(piece) = stream.push(next)? {
            text.push_str(&piece);
            if let Some(cut) = stop.iter().filter_map(|s| text.find(s.as_str())).min() {
                // print what came before the stop string, then end
                let printed = text.len() - piece.len();
                stats.stop_reason = "stop string";
                if cut > printed && on_text(&text[printed..cut]).is_break() {
                    stats.stop_reason = "cancelled";
                }
                break;
            }
            if on_text(&piece).is_break() {
                stats.stop_reason = "cancelled";
                break;
            }
        }
        if stats.generated_tokens == max_tokens {
            break;
        }
        if ahead.is_none() && cache.len() + 1 > context {
            stats.stop_reason = "context full";
            break;
        }
        pick = match ahead {
            Some(pick) => pick,
            None => {
                let logits = model.forward(&[next], &mut cache, true)?;
                Pick::new(sampler, &logits, &history, stats.generated_tokens, None)?
            }
        };
    }
    if !matches!(stats.stop_reason, "stop string" | "cancelled")
        && let Some(rest) = stream.finish()?
        && on_text(&rest).is_break()
    {
        stats.stop_reason = "cancelled";
    }
    stats.decode_time = t1.elapsed();
    Ok(stats)
}
