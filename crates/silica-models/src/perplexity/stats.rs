//! The statistics of a comparison with saved logits (KL divergence, Δp,
//! top-1 agreement, both perplexities) and llama.cpp's report of them.

use super::codec::RowComparison;
use super::windows::Sums;

/// The statistics of a comparison, position by position.
#[derive(Clone, Debug, Default)]
pub struct KlStats {
    pub nll: Sums,
    pub nll_base: Sums,
    /// Σ nll · nll_base, for the covariance of the two.
    pub nll_cross: f64,
    pub kld: Sums,
    pub p_diff: Sums,
    /// Σ Δp⁴, for the uncertainty of the RMS of Δp.
    pub p_diff_4: f64,
    pub same_top: usize,
    kld_values: Vec<f64>,
    p_diff_values: Vec<f64>,
}

/// A value and its uncertainty.
pub type Estimate = (f64, f64);

/// The percentiles of a list of values, interpolated as llama.cpp does.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spread {
    pub max: f64,
    pub p99_9: f64,
    pub p99: f64,
    pub p95: f64,
    pub p90: f64,
    pub p75: f64,
    pub median: f64,
    pub p25: f64,
    pub p10: f64,
    pub p5: f64,
    pub p1: f64,
    pub p0_1: f64,
    pub min: f64,
}

impl Spread {
    /// Of `values` (any order; NaNs sort last). All zero when empty.
    pub fn of(values: &[f64]) -> Spread {
        if values.is_empty() {
            return Spread::default();
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let at = |f: f64| {
            let p = f * (n - 1) as f64;
            let i = p as usize;
            let frac = p - i as f64;
            (1.0 - frac) * v[i] + frac * v[(i + 1).min(n - 1)]
        };
        let median = if n.is_multiple_of(2) {
            0.5 * (v[n / 2] + v[n / 2 - 1])
        } else {
            v[n / 2]
        };
        Spread {
            max: v[n - 1],
            p99_9: at(0.999),
            p99: at(0.99),
            p95: at(0.95),
            p90: at(0.90),
            p75: at(0.75),
            median,
            p25: at(0.25),
            p10: at(0.10),
            p5: at(0.05),
            p1: at(0.01),
            p0_1: at(0.001),
            min: v[0],
        }
    }
}

/// What [`KlStats`] amounts to, as llama.cpp reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct KlSummary {
    /// Positions compared.
    pub count: usize,
    /// PPL of this run.
    pub ppl: Estimate,
    /// PPL of the saved run.
    pub ppl_base: Estimate,
    /// Correlation of the two runs' log-likelihoods' means (llama.cpp's
    /// `Cor(ln(PPL(Q)), ln(PPL(base)))`), as a fraction.
    pub ln_ppl_correlation: f64,
    /// `ln(PPL / PPL_base)`.
    pub ln_ppl_ratio: Estimate,
    /// `PPL / PPL_base`.
    pub ppl_ratio: Estimate,
    /// `PPL − PPL_base`.
    pub ppl_diff: Estimate,
    /// Mean KL divergence.
    pub kld: Estimate,
    pub kld_spread: Spread,
    /// Mean Δp (a fraction, not %).
    pub p_diff: Estimate,
    pub p_diff_spread: Spread,
    /// Root mean square of Δp.
    pub p_diff_rms: Estimate,
    /// Share of positions whose most likely token is the same.
    pub same_top: Estimate,
}

impl KlStats {
    pub fn push(&mut self, c: &RowComparison) {
        self.nll.push(c.nll);
        self.nll_base.push(c.nll_base);
        self.nll_cross += c.nll * c.nll_base;
        self.kld.push(c.kld);
        self.p_diff.push(c.p_diff);
        self.p_diff_4 += c.p_diff.powi(4);
        self.same_top += usize::from(c.same_top);
        self.kld_values.push(c.kld);
        self.p_diff_values.push(c.p_diff);
    }

    /// Positions compared.
    pub fn count(&self) -> usize {
        self.kld.count
    }

    /// The KL divergence of each position, in order.
    pub fn kld_values(&self) -> &[f64] {
        &self.kld_values
    }

    /// Δp of each position, in order.
    pub fn p_diff_values(&self) -> &[f64] {
        &self.p_diff_values
    }

    /// The covariance of the two runs' mean negative log-likelihoods.
    fn nll_covariance(&self) -> f64 {
        let n = self.count();
        if n < 2 {
            return 0.0;
        }
        let n = n as f64;
        (self.nll_cross / n - self.nll.mean() * self.nll_base.mean()) / (n - 1.0)
    }

    /// `ln(PPL / PPL_base)` and its uncertainty.
    pub fn ln_ppl_ratio(&self) -> Estimate {
        let (a, b) = (self.nll.std_error(), self.nll_base.std_error());
        let var = a * a + b * b - 2.0 * self.nll_covariance();
        (self.nll.mean() - self.nll_base.mean(), var.max(0.0).sqrt())
    }

    /// The root mean square of Δp and its uncertainty.
    pub fn p_diff_rms(&self) -> Estimate {
        let sq = Sums {
            count: self.p_diff.count,
            sum: self.p_diff.sum_sq,
            sum_sq: self.p_diff_4,
        };
        let rms = sq.mean().sqrt();
        let unc = if rms > 0.0 {
            0.5 / rms * sq.std_error()
        } else {
            0.0
        };
        (rms, unc)
    }

    /// The share of positions with the same most likely token, and its
    /// binomial uncertainty.
    pub fn same_top(&self) -> Estimate {
        let n = self.count();
        if n == 0 {
            return (0.0, 0.0);
        }
        let p = self.same_top as f64 / n as f64;
        let unc = if n > 1 {
            (p * (1.0 - p) / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        (p, unc)
    }

    pub fn summary(&self) -> KlSummary {
        let ppl = (self.nll.ppl(), self.nll.ppl_uncertainty());
        let ppl_base = (self.nll_base.ppl(), self.nll_base.ppl_uncertainty());
        let cov = self.nll_covariance();
        let (sa, sb) = (self.nll.std_error(), self.nll_base.std_error());
        let ln_ppl_correlation = if sa > 0.0 && sb > 0.0 {
            cov / (sa * sb)
        } else {
            0.0
        };
        let ln_ppl_ratio = self.ln_ppl_ratio();
        let ratio = ln_ppl_ratio.0.exp();
        let ppl_cov = ppl.0 * ppl_base.0 * cov;
        let diff_var = ppl.1 * ppl.1 + ppl_base.1 * ppl_base.1 - 2.0 * ppl_cov;
        KlSummary {
            count: self.count(),
            ppl,
            ppl_base,
            ln_ppl_correlation,
            ln_ppl_ratio,
            ppl_ratio: (ratio, ratio * ln_ppl_ratio.1),
            ppl_diff: (ppl.0 - ppl_base.0, diff_var.max(0.0).sqrt()),
            kld: (self.kld.mean(), self.kld.std_error()),
            kld_spread: Spread::of(&self.kld_values),
            p_diff: (self.p_diff.mean(), self.p_diff.std_error()),
            p_diff_spread: Spread::of(&self.p_diff_values),
            p_diff_rms: self.p_diff_rms(),
            same_top: self.same_top(),
        }
    }

    /// The header of [`KlStats::chunk_line`]'s table, as llama.cpp prints it.
    pub fn chunk_header() -> &'static str {
        "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p"
    }

    /// One line of the per-window table: the running figures after window
    /// `index` (1-based).
    pub fn chunk_line(&self, index: usize) -> String {
        let ratio = self.ln_ppl_ratio();
        let rms = self.p_diff_rms();
        let top = self.same_top();
        format!(
            "{index:4}    {:9.4} ± {:9.4}    {:10.5} ± {:10.5}    {:10.5} ± {:10.5}    {:6.3} ± {:6.3} %    {:6.3} ± {:6.3} %",
            self.nll.ppl(),
            self.nll.ppl_uncertainty(),
            ratio.0,
            ratio.1,
            self.kld.mean(),
            self.kld.std_error(),
            100.0 * rms.0,
            100.0 * rms.1,
            100.0 * top.0,
            100.0 * top.1,
        )
    }
}

impl KlSummary {
    /// The three sections of llama.cpp's `--kl-divergence` report
    /// (perplexity, KL divergence, token probability), line for line.
    pub fn report(&self) -> String {
        let mut s = String::new();
        let mut line = |l: String| {
            s.push_str(&l);
            s.push('\n');
        };
        line("====== Perplexity statistics ======".into());
        line(format!(
            "Mean PPL(Q)                   : {:10.6} ± {:10.6}",
            self.ppl.0, self.ppl.1
        ));
        line(format!(
            "Mean PPL(base)                : {:10.6} ± {:10.6}",
            self.ppl_base.0, self.ppl_base.1
        ));
        line(format!(
            "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%",
            100.0 * self.ln_ppl_correlation
        ));
        line(format!(
            "Mean ln(PPL(Q)/PPL(base))     : {:10.6} ± {:10.6}",
            self.ln_ppl_ratio.0, self.ln_ppl_ratio.1
        ));
        line(format!(
            "Mean PPL(Q)/PPL(base)         : {:10.6} ± {:10.6}",
            self.ppl_ratio.0, self.ppl_ratio.1
        ));
        line(format!(
            "Mean PPL(Q)-PPL(base)         : {:10.6} ± {:10.6}",
            self.ppl_diff.0, self.ppl_diff.1
        ));
        line(String::new());
        line("====== KL divergence statistics ======".into());
        line(format!(
            "Mean    KLD: {:10.6} ± {:10.6}",
            self.kld.0, self.kld.1
        ));
        let k = &self.kld_spread;
        for (label, v) in [
            ("Maximum KLD", k.max),
            ("99.9%   KLD", k.p99_9),
            ("99.0%   KLD", k.p99),
            ("95.0%   KLD", k.p95),
            ("90.0%   KLD", k.p90),
            ("Median  KLD", k.median),
            ("10.0%   KLD", k.p10),
            (" 5.0%   KLD", k.p5),
            (" 1.0%   KLD", k.p1),
            (" 0.1%   KLD", k.p0_1),
            ("Minimum KLD", k.min),
        ] {
            line(format!("{label}: {v:10.6}"));
        }
        line(String::new());
        line("====== Token probability statistics ======".into());
        line(format!(
            "Mean    Δp: {:6.3} ± {:5.3} %",
            100.0 * self.p_diff.0,
            100.0 * self.p_diff.1
        ));
        let p = &self.p_diff_spread;
        for (label, v) in [
            ("Maximum Δp", p.max),
            ("99.9%   Δp", p.p99_9),
            ("99.0%   Δp", p.p99),
            ("95.0%   Δp", p.p95),
            ("90.0%   Δp", p.p90),
            ("75.0%   Δp", p.p75),
            ("Median  Δp", p.median),
            ("25.0%   Δp", p.p25),
            ("10.0%   Δp", p.p10),
            (" 5.0%   Δp", p.p5),
            (" 1.0%   Δp", p.p1),
            (" 0.1%   Δp", p.p0_1),
            ("Minimum Δp", p.min),
        ] {
            line(format!("{label}: {:6.3}%", 100.0 * v));
        }
        line(format!(
            "RMS Δp    : {:6.3} ± {:5.3} %",
            100.0 * self.p_diff_rms.0,
            100.0 * self.p_diff_rms.1
        ));
        line(format!(
            "Same top p: {:6.3} ± {:5.3} %",
            100.0 * self.same_top.0,
            100.0 * self.same_top.1
        ));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_interpolates_like_llama_cpp() {
        let v: Vec<f64> = (0..11).map(f64::from).collect();
        let s = Spread::of(&v);
        assert_eq!((s.min, s.max, s.median), (0.0, 10.0, 5.0));
        assert!((s.p90 - 9.0).abs() < 1e-12);
        assert!((s.p95 - 9.5).abs() < 1e-12);
        assert_eq!(Spread::of(&[1.0, 3.0]).median, 2.0);
    }
}
