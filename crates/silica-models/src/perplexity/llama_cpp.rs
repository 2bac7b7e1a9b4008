//! The rows of llama.cpp's `--kl-divergence-base` file, encoded and
//! compared as llama.cpp does, so that either program's run can be
//! compared with the other's saved logits.

use super::codec::{CODE_MAX, RowComparison};
use super::windows::{RowScore, score_row};
use crate::{Error, Result};

pub(super) const LLAMA_CPP_MAGIC: &[u8; 8] = b"_logits_";
/// The range of llama.cpp's saved log-probabilities below the maximum.
pub(super) const LLAMA_CPP_SPAN: f32 = 16.0;

/// One scored position as llama.cpp's `--kl-divergence-base` file keeps
/// it: the log-probability of token `i` is `scale · codes[i] +
/// min_log_prob`, over the 16 nats below the most likely token (code 0 for
/// the tokens at or below that).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LlamaCppRow {
    pub scale: f32,
    pub min_log_prob: f32,
    pub codes: Vec<u16>,
}

impl LlamaCppRow {
    /// Encodes a row of logits as llama.cpp's `log_softmax` does when it
    /// saves them (scored against `target`).
    pub fn encode(logits: &[f32], target: u32) -> Result<(LlamaCppRow, RowScore)> {
        let score = score_row(logits, target)?;
        let max = logits[score.top as usize];
        let min = logits
            .iter()
            .copied()
            .fold(max, f32::min)
            .max(max - LLAMA_CPP_SPAN);
        let scale = (max - min) / f32::from(CODE_MAX);
        let codes = if scale > 0.0 {
            let inv = 1.0 / scale;
            logits
                .iter()
                .map(|&l| {
                    if l > min {
                        (inv * (l - min)).round().min(f32::from(CODE_MAX)) as u16
                    } else {
                        0
                    }
                })
                .collect()
        } else {
            vec![0; logits.len()]
        };
        let min_log_prob = (f64::from(min) - score.log_sum_exp) as f32;
        let row = LlamaCppRow {
            scale,
            min_log_prob,
            codes,
        };
        Ok((row, score))
    }

    /// Compares a row of logits with this one as llama.cpp's
    /// `--kl-divergence` does: `KL = Σ p_base · (log p_base − log p)` over
    /// the tokens whose saved log-probability is above −16, without
    /// renormalizing; the base's top token is the first of its largest
    /// codes and its probability of `target` the decoded one.
    pub fn compare(&self, logits: &[f32], target: u32) -> Result<RowComparison> {
        if self.codes.len() != logits.len() {
            return Err(Error::InvalidInput(format!(
                "a saved row of {} tokens against logits of {}",
                self.codes.len(),
                logits.len()
            )));
        }
        let score = score_row(logits, target)?;
        let (scale, min) = (f64::from(self.scale), f64::from(self.min_log_prob));
        let mut kld = 0.0;
        let mut top = 0;
        for (i, (&c, &l)) in self.codes.iter().zip(logits).enumerate() {
            if c > self.codes[top] {
                top = i;
            }
            let lp_base = scale * f64::from(c) + min;
            if lp_base > -f64::from(LLAMA_CPP_SPAN) {
                kld += lp_base.exp() * (lp_base - (f64::from(l) - score.log_sum_exp));
            }
        }
        let nll_base = -(scale * f64::from(self.codes[target as usize]) + min);
        Ok(RowComparison {
            nll: score.nll,
            nll_base,
            kld,
            p_diff: (-score.nll).exp() - (-nll_base).exp(),
            same_top: score.top as usize == top,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_rows_decode_and_compare_as_llama_cpp_does() {
        let row = [0.0f32, -1.0, -30.0, -2.5];
        let (saved, score) = LlamaCppRow::encode(&row, 1).unwrap();
        assert_eq!(saved.codes[0], CODE_MAX);
        assert_eq!(saved.codes[2], 0, "below the 16-nat floor");
        assert!((saved.scale - 16.0 / 65535.0).abs() < 1e-9);
        assert!((f64::from(saved.min_log_prob) - (-16.0 - score.log_sum_exp)).abs() < 1e-6);
        let c = saved.compare(&row, 1).unwrap();
        assert!(c.kld.abs() < 1e-4, "{}", c.kld);
        assert!(c.same_top);
        assert!(
            (c.nll_base - c.nll).abs() < 2e-4,
            "{} {}",
            c.nll_base,
            c.nll
        );
        // the next token below the floor: llama.cpp's base probability is the floor's
        let c = saved.compare(&row, 2).unwrap();
        assert!(
            (c.nll_base - (16.0 + score.log_sum_exp)).abs() < 1e-4,
            "{}",
            c.nll_base
        );
        assert!(c.nll > 29.0);
        // a flat row has scale 0 and every code 0
        let (flat, _) = LlamaCppRow::encode(&[1.0; 8], 3).unwrap();
        assert_eq!((flat.scale, flat.codes.iter().max()), (0.0, Some(&0)));
        let c = flat.compare(&[1.0; 8], 3).unwrap();
        assert!(c.kld.abs() < 1e-6 && (c.nll_base - 8f64.ln()).abs() < 1e-6);
    }
}
