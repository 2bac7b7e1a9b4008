//! silica's encoding of a scored position's log-probabilities (16-bit
//! codes over a span below the most likely token, beside the exact
//! log-probabilities of the top and the actual next token) and the
//! comparison of a row of logits with a saved one.

use super::windows::{RowScore, score_row};
use crate::{Error, Result};

/// The largest code; codes `1..=CODE_MAX` cover the span.
pub(super) const CODE_MAX: u16 = u16::MAX;

/// One scored position as a logits file keeps it
/// (see the [`perplexity`](super) module documentation).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SavedRow {
    /// The most likely token.
    pub top: u32,
    /// Its log-probability.
    pub top_log_prob: f32,
    /// The log-probability of the token that actually follows.
    pub target_log_prob: f32,
    /// One code per token of the vocabulary.
    pub codes: Vec<u16>,
}

/// Turns rows of logits into [`SavedRow`]s and back, for one `span`.
#[derive(Clone, Debug)]
pub struct LogProbCodec {
    span: f32,
    step: f64,
    /// `exp((c − 1) · step)` for each code `c ≥ 1` (index 0 unused).
    weights: Vec<f64>,
}

impl LogProbCodec {
    /// A codec keeping log-probabilities down to `span` below the most
    /// likely token's (finite, above 0 and at most 1,000).
    pub fn new(span: f32) -> Result<LogProbCodec> {
        if !(span.is_finite() && span > 0.0 && span <= 1000.0) {
            return Err(Error::InvalidInput(format!(
                "the span of saved log-probabilities must be above 0 and at most 1000, not {span}"
            )));
        }
        let step = f64::from(span) / f64::from(CODE_MAX - 1);
        let mut weights = vec![0.0; CODE_MAX as usize + 1];
        for (c, w) in weights.iter_mut().enumerate().skip(1) {
            *w = ((c - 1) as f64 * step).exp();
        }
        Ok(LogProbCodec {
            span,
            step,
            weights,
        })
    }

    pub fn span(&self) -> f32 {
        self.span
    }

    /// Scores a row of logits against `target` and encodes it.
    pub fn encode(&self, logits: &[f32], target: u32) -> Result<(SavedRow, RowScore)> {
        let score = score_row(logits, target)?;
        let top_lp = f64::from(logits[score.top as usize]) - score.log_sum_exp;
        let floor = top_lp - f64::from(self.span);
        let codes = logits
            .iter()
            .map(|&l| {
                let d = f64::from(l) - score.log_sum_exp - floor;
                if d < 0.0 {
                    0
                } else {
                    (1.0 + (d / self.step).round()).min(f64::from(CODE_MAX)) as u16
                }
            })
            .collect();
        let row = SavedRow {
            top: score.top,
            top_log_prob: top_lp as f32,
            target_log_prob: -score.nll as f32,
            codes,
        };
        Ok((row, score))
    }

    /// The log-probabilities a row stands for, renormalized to sum to 1;
    /// `-inf` for tokens below the span.
    pub fn decode(&self, row: &SavedRow) -> Vec<f64> {
        let (_, log_z) = self.norm(row);
        let floor = f64::from(row.top_log_prob) - f64::from(self.span);
        row.codes
            .iter()
            .map(|&c| {
                if c == 0 {
                    f64::NEG_INFINITY
                } else {
                    floor + f64::from(c - 1) * self.step - log_z
                }
            })
            .collect()
    }

    /// The sum of the codes' weights and the log of the decoded
    /// probabilities' sum before renormalization.
    fn norm(&self, row: &SavedRow) -> (f64, f64) {
        let s: f64 = row.codes.iter().map(|&c| self.weights[c as usize]).sum();
        let floor = f64::from(row.top_log_prob) - f64::from(self.span);
        (s, floor + s.ln())
    }

    /// Compares a row of logits with a saved row of the same position.
    pub fn compare(&self, logits: &[f32], target: u32, base: &SavedRow) -> Result<RowComparison> {
        if base.codes.len() != logits.len() {
            return Err(Error::InvalidInput(format!(
                "a saved row of {} tokens against logits of {}",
                base.codes.len(),
                logits.len()
            )));
        }
        let score = score_row(logits, target)?;
        let (s, _) = self.norm(base);
        if !(s.is_finite() && s > 0.0) {
            return Err(Error::InvalidInput(
                "a saved row without a token in its span".into(),
            ));
        }
        let ln_s = s.ln();
        // base log-probability of a code c ≥ 1: (c − 1)·step − ln s, since
        // the floor cancels in the renormalization
        let kld: f64 = base
            .codes
            .iter()
            .zip(logits)
            .filter(|&(&c, _)| c != 0)
            .map(|(&c, &l)| {
                let lp_base = f64::from(c - 1) * self.step - ln_s;
                let lp = f64::from(l) - score.log_sum_exp;
                self.weights[c as usize] / s * (lp_base - lp)
            })
            .sum();
        let nll_base = -f64::from(base.target_log_prob);
        Ok(RowComparison {
            nll: score.nll,
            nll_base,
            // rounding can leave −1e-17 for identical rows
            kld: kld.max(0.0),
            p_diff: (-score.nll).exp() - (-nll_base).exp(),
            same_top: score.top == base.top,
        })
    }
}

/// One position of this run against the saved one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowComparison {
    /// `−log p(next)` of this run.
    pub nll: f64,
    /// `−log p(next)` of the saved run.
    pub nll_base: f64,
    /// `KL(base ‖ this)` of the next-token distributions.
    pub kld: f64,
    /// `p(next) − p_base(next)`.
    pub p_diff: f64,
    /// Whether both put the same token first.
    pub same_top: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perplexity::DEFAULT_SPAN;

    #[test]
    fn a_row_against_its_own_codes_has_no_divergence() {
        let codec = LogProbCodec::new(DEFAULT_SPAN).unwrap();
        let mut x = 12345u32;
        let row: Vec<f32> = (0..5000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x as f32 / u32::MAX as f32) * 30.0 - 20.0
            })
            .collect();
        let (saved, score) = codec.encode(&row, 17).unwrap();
        assert_eq!(saved.codes[saved.top as usize], CODE_MAX);
        let c = codec.compare(&row, 17, &saved).unwrap();
        assert!(c.kld < 1e-7, "{}", c.kld);
        assert!(c.same_top);
        assert!((c.nll - score.nll).abs() < 1e-12);
        assert!((c.nll_base - score.nll).abs() < 1e-5);
        // the decoded probabilities are within half a step of the truth
        let lp = codec.decode(&saved);
        let z: f64 = lp.iter().map(|v| v.exp()).sum();
        assert!((z - 1.0).abs() < 1e-9);
        for (i, &l) in row.iter().enumerate() {
            let truth = f64::from(l) - score.log_sum_exp;
            if lp[i].is_finite() {
                assert!((lp[i] - truth).abs() < 3e-4, "{i}: {} {truth}", lp[i]);
            } else {
                assert!(truth < f64::from(saved.top_log_prob) - 23.9);
            }
        }
        // a shifted row diverges
        let shifted: Vec<f32> = row
            .iter()
            .enumerate()
            .map(|(i, &l)| l + (i % 7) as f32 * 0.3)
            .collect();
        let d = codec.compare(&shifted, 17, &saved).unwrap();
        assert!(d.kld > 1e-3, "{}", d.kld);
    }

    #[test]
    fn kl_of_known_distributions() {
        // base p = (0.5, 0.5), this q = (0.9, 0.1): KL(p‖q) = 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1)
        let codec = LogProbCodec::new(DEFAULT_SPAN).unwrap();
        let (base, _) = codec.encode(&[0.0, 0.0], 1).unwrap();
        let q = [0.9f32.ln(), 0.1f32.ln()];
        let c = codec.compare(&q, 1, &base).unwrap();
        let want = 0.5 * (0.5f64 / 0.9).ln() + 0.5 * (0.5f64 / 0.1).ln();
        assert!((c.kld - want).abs() < 1e-6, "{} {want}", c.kld);
        assert!((c.p_diff - (0.1 - 0.5)).abs() < 1e-6);
        assert!(c.same_top, "the first of equals is the top");
    }
}
