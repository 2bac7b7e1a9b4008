//! Which tokens a run evaluates and how a row of logits is scored: the
//! windows cut from the text, the text's tokens and their hash, the
//! negative log-likelihood of a row and the running sums of a perplexity.

use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// Which tokens each evaluation window holds and which of its logits are
/// scored (see the [`perplexity`](super) module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    /// Tokens per window.
    pub ctx: usize,
    /// Tokens between the starts of consecutive windows.
    pub step: usize,
    /// Rows `first .. ctx - 1` of a window's logits are scored; row `j`
    /// predicts the window's token `j + 1`.
    pub first: usize,
    /// Number of windows.
    pub count: usize,
}

impl Windows {
    /// llama.cpp's windows: `n_tokens / ctx` consecutive windows of `ctx`
    /// tokens (at most `max`), each scored over its second half.
    pub fn chunks(n_tokens: usize, ctx: usize, max: Option<usize>) -> Result<Windows> {
        check_ctx(ctx)?;
        Self::limited(
            Windows {
                ctx,
                step: ctx,
                first: ctx / 2,
                count: n_tokens / ctx,
            },
            n_tokens,
            max,
        )
    }

    /// Overlapping windows of `ctx` tokens starting every `stride` tokens
    /// (at most `max`), each scored over its last `stride` tokens.
    pub fn strided(
        n_tokens: usize,
        ctx: usize,
        stride: usize,
        max: Option<usize>,
    ) -> Result<Windows> {
        check_ctx(ctx)?;
        if stride == 0 || stride >= ctx {
            return Err(Error::InvalidInput(format!(
                "the stride must be from 1 to the window length less one ({}), not {stride}",
                ctx - 1
            )));
        }
        let count = if n_tokens >= ctx {
            (n_tokens - ctx) / stride + 1
        } else {
            0
        };
        Self::limited(
            Windows {
                ctx,
                step: stride,
                first: ctx - 1 - stride,
                count,
            },
            n_tokens,
            max,
        )
    }

    fn limited(mut w: Windows, n_tokens: usize, max: Option<usize>) -> Result<Windows> {
        if w.count == 0 {
            return Err(Error::InvalidInput(format!(
                "the text has {n_tokens} token{}, fewer than one window of {}",
                if n_tokens == 1 { "" } else { "s" },
                w.ctx
            )));
        }
        match max {
            Some(0) => {
                return Err(Error::InvalidInput(
                    "the number of windows must be at least 1".into(),
                ));
            }
            Some(m) => w.count = w.count.min(m),
            None => {}
        }
        Ok(w)
    }

    /// Scored positions per window.
    pub fn scored(&self) -> usize {
        self.ctx - 1 - self.first
    }

    /// Scored positions in all windows.
    pub fn positions(&self) -> usize {
        self.count * self.scored()
    }

    /// Tokens the windows reach into: the end of the last one.
    pub fn tokens_used(&self) -> usize {
        (self.count - 1) * self.step + self.ctx
    }

    /// Whether the windows fit in `n_tokens` tokens and score something.
    pub(super) fn valid_for(&self, n_tokens: usize) -> bool {
        self.ctx >= 3
            && self.first < self.ctx - 1
            && self.step >= 1
            && self.count >= 1
            && self
                .count
                .checked_sub(1)
                .and_then(|c| c.checked_mul(self.step))
                .and_then(|s| s.checked_add(self.ctx))
                .is_some_and(|end| end <= n_tokens)
    }

    /// The tokens of window `i`, its first replaced by `bos` when given.
    pub fn window(&self, tokens: &[u32], i: usize, bos: Option<u32>) -> Vec<u32> {
        let start = i * self.step;
        let mut ids = tokens[start..start + self.ctx].to_vec();
        if let Some(bos) = bos {
            ids[0] = bos;
        }
        ids
    }

    /// The tokens that the scored rows of window `i` predict.
    pub fn targets<'a>(&self, tokens: &'a [u32], i: usize) -> &'a [u32] {
        let start = i * self.step;
        &tokens[start + self.first + 1..start + self.ctx]
    }
}

fn check_ctx(ctx: usize) -> Result<()> {
    if ctx < 3 {
        return Err(Error::InvalidInput(format!(
            "the window length must be at least 3 tokens, not {ctx}"
        )));
    }
    Ok(())
}

/// The tokens of `text` for a perplexity run, BOS first when the model adds
/// one, and the BOS id that starts every window (None when it adds none).
pub fn tokenize(
    tokenizer: &crate::tokenizer::Tokenizer,
    text: &str,
) -> Result<(Vec<u32>, Option<u32>)> {
    let bos = tokenizer.bos_id().filter(|_| tokenizer.add_bos());
    let ids = tokenizer.encode(text, false)?;
    let mut tokens = Vec::with_capacity(ids.len() + 1);
    tokens.extend(bos);
    tokens.extend(ids);
    Ok((tokens, bos))
}

/// SHA-256 of token ids, each as 4 little-endian bytes.
pub fn token_hash(tokens: &[u32]) -> [u8; 32] {
    let mut h = Sha256::new();
    for &t in tokens {
        h.update(t.to_le_bytes());
    }
    h.finalize().into()
}

/// What one row of logits says about the token that follows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowScore {
    /// `−log p(next)`.
    pub nll: f64,
    /// `log Σ exp(logit)`: the log-probability of token `i` is
    /// `logits[i] − log_sum_exp`.
    pub log_sum_exp: f64,
    /// The most likely token (the first of equals).
    pub top: u32,
}

/// Scores one row of logits against the token that follows, in f64.
/// Non-finite logits and a `target` outside the row are errors.
pub fn score_row(logits: &[f32], target: u32) -> Result<RowScore> {
    if logits.is_empty() {
        return Err(Error::InvalidInput("an empty row of logits".into()));
    }
    if target as usize >= logits.len() {
        return Err(Error::InvalidInput(format!(
            "token {target} is outside the {} logits of a row",
            logits.len()
        )));
    }
    let mut top = 0;
    let mut max = logits[0];
    for (i, &l) in logits.iter().enumerate() {
        if !l.is_finite() {
            return Err(Error::InvalidInput(format!(
                "the logit of token {i} is {l}: the model's output is not finite"
            )));
        }
        if l > max {
            max = l;
            top = i;
        }
    }
    let max = f64::from(max);
    let sum: f64 = logits.iter().map(|&l| (f64::from(l) - max).exp()).sum();
    let log_sum_exp = max + sum.ln();
    Ok(RowScore {
        nll: log_sum_exp - f64::from(logits[target as usize]),
        log_sum_exp,
        top: top as u32,
    })
}

/// Running sums of a quantity (negative log-likelihoods, KL divergences)
/// for its mean and the standard error of that mean.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sums {
    pub count: usize,
    pub sum: f64,
    pub sum_sq: f64,
}

impl Sums {
    pub fn push(&mut self, v: f64) {
        self.count += 1;
        self.sum += v;
        self.sum_sq += v * v;
    }

    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum / self.count as f64
        }
    }

    /// The standard error of the mean, `sqrt(var / (n − 1))` with the
    /// population variance as llama.cpp computes it; 0 for fewer than two
    /// values or no spread.
    pub fn std_error(&self) -> f64 {
        if self.count < 2 {
            return 0.0;
        }
        let n = self.count as f64;
        let mean = self.sum / n;
        let var = self.sum_sq / n - mean * mean;
        if var > 0.0 {
            (var / (n - 1.0)).sqrt()
        } else {
            0.0
        }
    }

    /// `exp(mean)`: the perplexity when the values are negative
    /// log-likelihoods.
    pub fn ppl(&self) -> f64 {
        self.mean().exp()
    }

    /// The perplexity's uncertainty, `PPL × std_error` (llama.cpp's "+/-").
    pub fn ppl_uncertainty(&self) -> f64 {
        self.ppl() * self.std_error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_logits_have_the_vocabulary_size_as_perplexity() {
        let vocab = 1000;
        let mut sums = Sums::default();
        for t in 0..300u32 {
            let row = vec![0.25f32; vocab];
            let s = score_row(&row, t * 3 % vocab as u32).unwrap();
            assert!((s.nll - (vocab as f64).ln()).abs() < 1e-12, "{}", s.nll);
            sums.push(s.nll);
        }
        assert!((sums.ppl() - vocab as f64).abs() < 1e-9, "{}", sums.ppl());
        assert_eq!(sums.ppl_uncertainty(), 0.0);
    }

    #[test]
    fn scores_match_a_direct_softmax() {
        let row = [1.0f32, 3.0, -2.0, 0.5];
        let z: f64 = row.iter().map(|&l| f64::from(l).exp()).sum();
        for t in 0..4 {
            let s = score_row(&row, t).unwrap();
            let p = f64::from(row[t as usize]).exp() / z;
            assert!((s.nll + p.ln()).abs() < 1e-12);
            assert_eq!(s.top, 1);
        }
        assert!(score_row(&row, 4).is_err());
        assert!(score_row(&[1.0, f32::NAN], 0).is_err());
        assert!(score_row(&[], 0).is_err());
    }

    #[test]
    fn windows_follow_llama_cpp() {
        let w = Windows::chunks(1030, 512, None).unwrap();
        assert_eq!((w.count, w.first, w.scored(), w.step), (2, 256, 255, 512));
        let tokens: Vec<u32> = (0..1030).collect();
        assert_eq!(w.window(&tokens, 1, Some(7))[..2], [7, 513]);
        assert_eq!(w.targets(&tokens, 1).first(), Some(&(512 + 257)));
        assert_eq!(w.targets(&tokens, 1).last(), Some(&1023));
        assert!(Windows::chunks(500, 512, None).is_err());
        assert!(Windows::chunks(5000, 2, None).is_err());
        assert_eq!(Windows::chunks(5000, 512, Some(3)).unwrap().count, 3);
        assert!(Windows::chunks(5000, 512, Some(0)).is_err());
    }

    #[test]
    fn strided_windows_score_every_token_once() {
        let (n, ctx, stride) = (100, 16, 5);
        let w = Windows::strided(n, ctx, stride, None).unwrap();
        let tokens: Vec<u32> = (0..n as u32).collect();
        let scored: Vec<u32> = (0..w.count)
            .flat_map(|i| w.targets(&tokens, i).to_vec())
            .collect();
        let want: Vec<u32> = ((ctx - stride) as u32..w.tokens_used() as u32).collect();
        assert_eq!(scored, want);
        assert!(w.tokens_used() <= n && w.tokens_used() + stride > n);
        assert!(Windows::strided(n, ctx, 0, None).is_err());
        assert!(Windows::strided(n, ctx, ctx, None).is_err());
    }
}
