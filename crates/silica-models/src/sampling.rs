//! Choosing the next token from logits: greedy, or sampling with
//! temperature, top-k, top-p, min-p and a repetition penalty, from a seeded
//! generator (the same seed gives the same tokens).

use rand::{Rng, SeedableRng};

mod device;
pub use device::{Penalties, RowDraw, draw_rows, penalize, penalize_rows, row_cuts};

/// How to pick tokens. `temperature == 0` is greedy (the other settings
/// then only matter through the repetition penalty).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1: all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0: none).
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of tokens already seen (1: off).
    pub repetition_penalty: f32,
    /// Subtract this times the number of times a token was seen (0: off;
    /// OpenAI's `frequency_penalty`).
    pub frequency_penalty: f32,
    /// Subtract this from the logit of every token seen (0: off; OpenAI's
    /// `presence_penalty`).
    pub presence_penalty: f32,
    pub seed: u64,
}

impl SamplingParams {
    /// Always the most likely token.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
        }
    }

    /// Whether a penalty other than the repetition penalty is set (one
    /// that counts the occurrences of each token seen).
    fn counts_seen(&self) -> bool {
        self.frequency_penalty != 0.0 || self.presence_penalty != 0.0
    }

    /// The penalties [`penalize_rows`] applies for these settings.
    pub fn penalties(&self) -> Penalties {
        Penalties {
            repetition: self.repetition_penalty,
            frequency: self.frequency_penalty,
            presence: self.presence_penalty,
        }
    }
}

/// A token picker holding its random state.
pub struct Sampler {
    params: SamplingParams,
    rng: rand::rngs::StdRng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = rand::rngs::StdRng::seed_from_u64(params.seed);
        Self { params, rng }
    }

    /// Greedy with no repetition penalty: the pick needs nothing but the
    /// position of the largest logit (which a device can find itself).
    pub fn is_argmax(&self) -> bool {
        self.params.temperature <= 0.0
            && self.params.repetition_penalty == 1.0
            && !self.params.counts_seen()
    }

    /// The draw of [`draw_rows`] that gives this sampler's distribution
    /// (a temperature, with or without top-k, top-p and min-p), for its
    /// `counter`-th token: the pick then needs no logits on the host.
    /// `None` for greedy samplers and those with a repetition penalty,
    /// which needs the tokens seen.
    /// [`Sampler::device_draw`] where it pays on `device`: on the CPU a cut
    /// row is cheaper on the host (the kernels' searches are for a GPU).
    pub fn device_draw_on(&self, counter: u64, device: &silica::Device) -> Option<RowDraw> {
        self.device_draw(counter)
            .filter(|d| device.is_gpu() || !d.cuts())
    }

    pub fn device_draw(&self, counter: u64) -> Option<RowDraw> {
        (self.params.repetition_penalty == 1.0 && !self.params.counts_seen())
            .then(|| self.row(counter))
            .filter(|r| r.inv_temperature > 0.0)
    }

    /// How this sampler picks its `counter`-th token on `device`, where it
    /// can: the row's draw (the argmax for greedy samplers) and the
    /// penalties to apply first ([`crate::sampling::penalize_rows`]),
    /// which only a GPU takes (on the CPU the host sampler is as fast).
    /// `None` where the pick is the host's.
    pub fn device_pick_on(
        &self,
        counter: u64,
        device: &silica::Device,
    ) -> Option<(RowDraw, Option<Penalties>)> {
        let p = &self.params;
        if p.repetition_penalty == 1.0 && !p.counts_seen() {
            if self.is_argmax() {
                return Some((RowDraw::argmax(), None));
            }
            return self.device_draw_on(counter, device).map(|d| (d, None));
        }
        device
            .is_gpu()
            .then(|| (self.row(counter), Some(p.penalties())))
    }

    /// The draw of the `counter`-th token, the penalty aside (the argmax
    /// for a temperature of 0).
    fn row(&self, counter: u64) -> RowDraw {
        let p = &self.params;
        if p.temperature <= 0.0 {
            return RowDraw::argmax();
        }
        RowDraw {
            inv_temperature: 1.0 / p.temperature,
            key: p.seed,
            counter,
            top_k: u32::try_from(p.top_k).unwrap_or(u32::MAX),
            top_p: p.top_p,
            min_p: p.min_p,
        }
    }

    /// Picks the next token from `logits` (one per vocabulary entry), given
    /// the tokens seen so far (for the repetition penalty).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let p = &self.params;
        let mut logits = logits.to_vec();
        if p.repetition_penalty != 1.0 {
            for &id in history {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.counts_seen() {
            let mut seen = history.to_vec();
            seen.sort_unstable();
            for run in seen.chunk_by(|a, b| a == b) {
                if let Some(l) = logits.get_mut(run[0] as usize) {
                    *l -= run.len() as f32 * p.frequency_penalty + p.presence_penalty;
                }
            }
        }
        if p.temperature <= 0.0 {
            return argmax(&logits);
        }
        // candidates most likely first (the first among equals first), as
        // far as a cut needs them sorted: the top_k most likely, or those a
        // min-p or top-p cut can keep, or every one in vocabulary order
        // where nothing is cut
        let (cand, mut probs) = if p.top_k > 0 {
            let cand = top_k(&logits, p.temperature, p.top_k);
            let probs = softmax_of(&cand);
            (cand, probs)
        } else {
            nucleus(&logits, p.temperature, p.min_p, p.top_p)
        };
        if cand.is_empty() {
            return 0;
        }
        if p.top_k > 0 {
            let sum: f32 = probs.iter().sum();
            probs.iter_mut().for_each(|q| *q /= sum);
        }
        let mut keep = probs.len();
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p;
            keep = keep.min(probs.iter().take_while(|&&q| q >= floor).count().max(1));
        }
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let mut n = 0;
            for &q in &probs[..keep] {
                acc += q;
                n += 1;
                if acc >= p.top_p {
                    break;
                }
            }
            keep = n.max(1);
        }
        let total: f32 = probs[..keep].iter().sum();
        let mut r = self.rng.random::<f32>() * total;
        for (i, &q) in probs[..keep].iter().enumerate() {
            if r < q {
                return cand[i].0;
            }
            r -= q;
        }
        cand[keep - 1].0
    }
}

/// `exp(l - max)` of candidates sorted most likely first.
fn softmax_of(cand: &[(u32, f32)]) -> Vec<f32> {
    let max = cand.first().map_or(0.0, |c| c.1);
    cand.iter().map(|(_, l)| (l - max).exp()).collect()
}

/// The candidates of `logits / t` (NaN left out) that a min-p floor and a
/// top-p cut can keep, most likely first (the first among equals first),
/// and their probabilities over every candidate; with neither cut, every
/// candidate in vocabulary order. Only the entries above a threshold are
/// sorted, the threshold lowered until they hold `top_p` of the
/// probability: the same prefix a sort of the whole vocabulary gives,
/// without sorting Llama 3's 128,256 logits for every token.
fn nucleus(logits: &[f32], t: f32, min_p: f32, top_p: f32) -> (Vec<(u32, f32)>, Vec<f32>) {
    let max = logits
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| l / t)
        .reduce(f32::max);
    let Some(max) = max else {
        return (Vec::new(), Vec::new());
    };
    // exp(l / t - max), 0 for NaN (left out below)
    let e: Vec<f32> = logits
        .iter()
        .map(|&l| if l.is_nan() { 0.0 } else { (l / t - max).exp() })
        .collect();
    let sum: f32 = e.iter().sum();
    let is_cand = |i: usize| !logits[i].is_nan();
    if min_p <= 0.0 && top_p >= 1.0 {
        let ids = (0..logits.len()).filter(|&i| is_cand(i));
        let cand: Vec<(u32, f32)> = ids.map(|i| (i as u32, logits[i] / t)).collect();
        let probs = cand.iter().map(|c| e[c.0 as usize] / sum).collect();
        return (cand, probs);
    }
    // thresholds on e: the most likely candidate's e is 1
    let floor = min_p.max(0.0);
    let mut threshold = if top_p < 1.0 { floor.max(1e-2) } else { floor };
    loop {
        let held: f32 = e.iter().filter(|&&q| q >= threshold).sum::<f32>() / sum;
        if top_p >= 1.0 || held >= top_p || threshold <= floor || threshold < f32::MIN_POSITIVE {
            break;
        }
        threshold = (threshold / 64.0).max(floor);
    }
    let mut cand: Vec<(u32, f32)> = (0..logits.len())
        .filter(|&i| is_cand(i) && e[i] >= threshold)
        .map(|i| (i as u32, logits[i] / t))
        .collect();
    cand.sort_by(|a, b| b.1.total_cmp(&a.1));
    let probs = cand.iter().map(|c| e[c.0 as usize] / sum).collect();
    (cand, probs)
}

/// The `k` largest of `logits / t` (NaN left out) with their indices, the
/// largest first and the first among equals first: what a stable sort of
/// every candidate, cut at `k`, gives, in one pass that compares most
/// logits with the k-th best only (sorting Llama 3's 128,256 logits for
/// every sampled token took milliseconds).
fn top_k(logits: &[f32], t: f32, k: usize) -> Vec<(u32, f32)> {
    use std::cmp::Ordering;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k.min(logits.len()) + 1);
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            continue;
        }
        let s = l / t;
        if best.len() == k && s.total_cmp(&best[k - 1].1) != Ordering::Greater {
            continue;
        }
        // after every candidate at least as large: an equal one came first
        let at = best.partition_point(|&(_, v)| v.total_cmp(&s) != Ordering::Less);
        best.insert(at, (i as u32, s));
        best.truncate(k);
    }
    best
}

/// Index of the largest value (the first among equals).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            ..SamplingParams::greedy()
        }
    }

    #[test]
    fn top_k_is_a_stable_sort_cut_at_k() {
        // ties (values repeat every 7), a NaN, infinities and both zeros
        let mut logits: Vec<f32> = (0..500).map(|i| ((i % 7) as f32 - 3.0) * 0.5).collect();
        logits[10] = f32::NAN;
        logits[20] = f32::INFINITY;
        logits[30] = f32::NEG_INFINITY;
        logits[40] = -0.0;
        logits[41] = 0.0;
        for t in [0.7f32, 1.0, 3.0] {
            let mut all: Vec<(u32, f32)> = logits
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.is_nan())
                .map(|(i, &l)| (i as u32, l / t))
                .collect();
            all.sort_by(|a, b| b.1.total_cmp(&a.1));
            for k in [1, 2, 7, 40, 71, 499, 500, 1000] {
                let want = &all[..k.min(all.len())];
                let got = top_k(&logits, t, k);
                assert_eq!(got.len(), want.len(), "t {t} k {k}");
                for (g, w) in got.iter().zip(want) {
                    assert_eq!((g.0, g.1.to_bits()), (w.0, w.1.to_bits()), "t {t} k {k}");
                }
            }
        }
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0], &[]), 1);
    }

    #[test]
    fn repetition_penalty_demotes_seen_tokens() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::greedy()
        };
        assert_eq!(Sampler::new(p).sample(&[3.0, 2.0], &[0]), 1);
    }

    /// OpenAI's frequency and presence penalties: a token seen c times
    /// loses c * frequency + presence, and neither is drawn on a device.
    #[test]
    fn frequency_and_presence_penalties_subtract() {
        let p = SamplingParams {
            frequency_penalty: 1.0,
            ..SamplingParams::greedy()
        };
        // 3.0 - 2 * 1.0 < 2.0 - 0
        assert_eq!(Sampler::new(p.clone()).sample(&[3.0, 2.0], &[0, 0]), 1);
        assert_eq!(Sampler::new(p).sample(&[3.0, 2.0], &[0]), 0);
        let q = SamplingParams {
            presence_penalty: 2.5,
            temperature: 0.5,
            ..SamplingParams::greedy()
        };
        let s = Sampler::new(q.clone());
        assert!(!s.is_argmax());
        assert!(s.device_draw(0).is_none());
        assert!(s.device_pick_on(0, &silica::Device::Cpu).is_none());
        // 3.0 - 2.5 against 2.0 at a temperature of 0.5: token 1 with
        // probability e^4 / (e^1 + e^4) = 0.95
        let mut s = Sampler::new(q);
        let ones = (0..200)
            .filter(|_| s.sample(&[3.0, 2.0], &[0, 0, 0]) == 1)
            .count();
        assert!(ones > 170, "{ones}");
    }

    #[test]
    fn same_seed_same_tokens_and_filters_hold() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let draw = |p: SamplingParams| {
            let mut s = Sampler::new(p);
            (0..200)
                .map(|_| s.sample(&logits, &[]))
                .collect::<Vec<u32>>()
        };
        assert_eq!(draw(params(0.8)), draw(params(0.8)));
        let mut other = params(0.8);
        other.seed = 7;
        assert_ne!(draw(params(0.8)), draw(other));
        // top-k 3: only the three best ids ever come out
        let mut order: Vec<u32> = (0..50).collect();
        order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        let top3 = &order[..3];
        let k = SamplingParams {
            top_k: 3,
            ..params(1.0)
        };
        assert!(draw(k).iter().all(|t| top3.contains(t)));
        // a tiny top-p keeps only the best token
        let tp = SamplingParams {
            top_p: 1e-6,
            ..params(1.0)
        };
        assert!(draw(tp).iter().all(|&t| t == order[0]));
        // min-p 1.0 keeps only tokens as likely as the best
        let mp = SamplingParams {
            min_p: 1.0,
            ..params(1.0)
        };
        assert!(draw(mp).iter().all(|&t| t == order[0]));
    }

    /// The cuts of a sort of every candidate (the first among equals
    /// first), for `nucleus` to agree with: the kept ids, most likely
    /// first.
    fn kept_by_full_sort(logits: &[f32], t: f32, min_p: f32, top_p: f32) -> Vec<u32> {
        let mut all: Vec<(u32, f32)> = (0..logits.len() as u32)
            .map(|i| (i, logits[i as usize] / t))
            .collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1));
        let e: Vec<f64> = all
            .iter()
            .map(|c| f64::from(c.1 - all[0].1).exp())
            .collect();
        let sum: f64 = e.iter().sum();
        let mut keep = all.len();
        if min_p > 0.0 {
            keep = e
                .iter()
                .take_while(|&&q| q >= f64::from(min_p))
                .count()
                .max(1);
        }
        if top_p < 1.0 {
            let mut acc = 0.0;
            keep = e[..keep]
                .iter()
                .take_while(|&&q| {
                    let before = acc;
                    acc += q / sum;
                    before < f64::from(top_p)
                })
                .count()
                .max(1);
        }
        all[..keep].iter().map(|c| c.0).collect()
    }

    #[test]
    fn the_nucleus_is_the_prefix_a_full_sort_gives() {
        use rand::Rng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for case in 0..300 {
            let v = [10usize, 1000, 50_000][case % 3];
            let spread = [0.5f32, 3.0, 12.0][case / 3 % 3];
            let mut logits: Vec<f32> = (0..v).map(|_| rng.random::<f32>() * spread).collect();
            if case % 7 == 0 {
                // a spike over a long flat tail: top-p reaches far below
                // the spike's probability
                logits.iter_mut().for_each(|l| *l *= 0.01);
                logits[v / 2] = 10.0;
            }
            let t = [0.5f32, 1.0, 1.5][case % 5 % 3];
            let (min_p, top_p) = [(0.0, 0.9), (0.05, 1.0), (0.02, 0.95), (0.0, 0.5)][case % 4];
            let (cand, probs) = nucleus(&logits, t, min_p, top_p);
            // what the sampler keeps of them
            let mut keep = cand.len();
            if min_p > 0.0 {
                let floor = probs[0] * min_p;
                keep = probs.iter().take_while(|&&q| q >= floor).count().max(1);
            }
            if top_p < 1.0 {
                let mut acc = 0.0;
                keep = probs[..keep]
                    .iter()
                    .take_while(|&&q| {
                        let before = acc;
                        acc += q;
                        before < top_p
                    })
                    .count()
                    .max(1);
            }
            let got: Vec<u32> = cand[..keep].iter().map(|c| c.0).collect();
            let want = kept_by_full_sort(&logits, t, min_p, top_p);
            // one is a prefix of the other; f32 against f64 sums may move
            // the cut at a flat edge by a few of thousands
            let common = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            let (short, long) = (got.len().min(want.len()), got.len().max(want.len()));
            assert!(
                common == short && long - short <= 1 + long / 1000,
                "case {case} (v {v}, t {t}, min_p {min_p}, top_p {top_p}): {} kept, {} by a full sort, {common} in common",
                got.len(),
                want.len()
            );
        }
    }
}
