//! Sampling on the device: a row of logits `l` gives the token
//! `argmax(l / T + g)`, where `g` holds one Gumbel variate per vocabulary
//! entry (the Gumbel-max draw, which picks token `i` with probability
//! `softmax(l / T)_i`). The variates come from a counter-based hash of the
//! row's key (the request's seed), its counter (which of its tokens is
//! drawn) and `i`, so a draw needs nothing from the host but those three
//! numbers, and the next step can be queued on the picks before they are
//! read back. A row with `inv_temperature` 0 takes its plain argmax.
//!
//! Top-k, top-p and min-p cut the row first, as the host sampler does (top-k
//! first, then min-p against the most likely token and top-p over what
//! top-k kept): each becomes a threshold on `l / T`, found by a search
//! over counts (top-k) and masses (top-p) of the entries above it, and the
//! entries below the highest threshold take no part in the draw. Entries
//! more than 80 below the row's largest `l / T` (a probability under
//! e^-80 of the largest one's) are always left out of a cut row. Ties at a
//! threshold are all kept.

use silica::custom::{self, CustomOp, GpuCall, Tolerance, WgslKernel};
use silica::{DType, Device, KernelNeeds, Result, Tensor};

/// What one row of a step draws.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowDraw {
    /// 1 / temperature; 0 takes the largest logit.
    pub inv_temperature: f32,
    /// The request's seed.
    pub key: u64,
    /// Which of the request's tokens this is (0 for the first).
    pub counter: u64,
    /// Keep the `top_k` most likely entries (0: all).
    pub top_k: u32,
    /// Keep the most likely entries that hold `top_p` of the probability
    /// (1: all).
    pub top_p: f32,
    /// Drop entries less likely than `min_p` times the most likely (0: none).
    pub min_p: f32,
}

impl RowDraw {
    /// The row's most likely token.
    pub fn argmax() -> RowDraw {
        RowDraw {
            inv_temperature: 0.0,
            key: 0,
            counter: 0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
        }
    }

    /// Whether the row is cut before the draw.
    pub fn cuts(&self) -> bool {
        self.top_k > 0 || self.top_p < 1.0 || self.min_p > 0.0
    }

    /// The row's words for the kernels.
    fn words(&self) -> [u32; 8] {
        [
            self.key as u32,
            (self.key >> 32) as u32,
            self.counter as u32,
            self.inv_temperature.to_bits(),
            self.top_k,
            self.top_p.to_bits(),
            self.min_p.to_bits(),
            0,
        ]
    }
}

/// The token each row of `logits` (`[rows, vocab]`, f32, on any device)
/// draws, as a `[rows]` u32 tensor on the same device.
pub fn draw_rows(logits: &Tensor, rows: &[RowDraw]) -> Result<Tensor> {
    if logits.shape().len() != 2 || logits.shape()[0] != rows.len() {
        return Err(silica::Error::InvalidArgument {
            op: "draw_rows",
            msg: format!(
                "logits of shape {:?} for {} rows, want [rows, vocab]",
                logits.shape(),
                rows.len()
            ),
        });
    }
    custom::expect_dtype("draw_rows", logits, DType::F32)?;
    if rows.iter().all(|r| r.inv_temperature == 0.0) {
        return logits.argmax(-1, false);
    }
    let words: Vec<u32> = rows.iter().flat_map(RowDraw::words).collect();
    let words = Tensor::from_vec(words, &[rows.len(), 8], logits.device())?;
    let cuts = if rows.iter().any(RowDraw::cuts) {
        cuts_of(logits, &words, rows)?
    } else {
        Tensor::from_vec(
            vec![f32::NEG_INFINITY; rows.len()],
            &[rows.len()],
            logits.device(),
        )?
    };
    custom::apply(&GumbelLogits, &[logits, &words, &cuts])?.argmax(-1, false)
}

/// Each row's threshold on `l * inv_temperature` below which its entries
/// take no part in the draw (`[rows]`, f32, -inf where nothing is cut), on
/// `logits`' device: top-k, top-p and min-p as [`RowDraw`] sets them.
pub fn row_cuts(logits: &Tensor, rows: &[RowDraw]) -> Result<Tensor> {
    let words: Vec<u32> = rows.iter().flat_map(RowDraw::words).collect();
    let words = Tensor::from_vec(words, &[rows.len(), 8], logits.device())?;
    cuts_of(logits, &words, rows)
}

/// [`RowCuts`] of the rows `draws` describes (`words` theirs), with the
/// scratch its kernel needs (zeros before and after).
fn cuts_of(logits: &Tensor, words: &Tensor, draws: &[RowDraw]) -> Result<Tensor> {
    let cuts = RowCuts {
        top_k: draws
            .iter()
            .any(|r| r.inv_temperature != 0.0 && r.top_k > 0),
        top_p: draws
            .iter()
            .any(|r| r.inv_temperature != 0.0 && r.top_p < 1.0),
    };
    let rows = logits.shape().first().copied().unwrap_or(0);
    let vocab = logits.shape().get(1).copied().unwrap_or(0);
    let (groups, _) = split(rows, vocab);
    let mut scratch = Tensor::zeros(&[rows, scratch_words(groups)], DType::F32, logits.device())?;
    custom::apply_in_place(&cuts, &[logits, words], &mut [&mut scratch])
}

/// Entries a thread of `row_cut.wgsl` reads at once (256 threads, 8 loads
/// each): a workgroup's share of a row is a multiple of this.
const STEP: usize = 2048;

/// Workgroups a pass of `row_cut.wgsl` aims at over all rows: one row
/// spreads over many, many rows over fewer each.
const PASS_GROUPS: usize = 256;

/// Workgroups per row and entries each reads, for `rows` rows of `vocab`.
fn split(rows: usize, vocab: usize) -> (usize, usize) {
    let steps = vocab.div_ceil(STEP).max(1);
    let groups = steps.min((PASS_GROUPS / rows.max(1)).max(1));
    (groups, steps.div_ceil(groups) * STEP)
}

/// Scratch words a row needs with `groups` workgroups: two states of 16
/// words, two slots of 16 partials per workgroup.
fn scratch_words(groups: usize) -> usize {
    32 + 32 * groups
}

/// Passes of a search for a threshold, each narrowing it 8 times: past
/// about 10 the bounds are adjacent floats and passes change nothing.
const PASSES: u32 = 12;

/// How far below the largest `l / T` a cut row reaches at most.
const REACH: f32 = 80.0;

/// The CPU reference of `row_cut.wgsl`: the same steps in the same f32
/// arithmetic (sums in another order).
fn cut_of(row: &[f32], w: &[u32]) -> f32 {
    let inv_t = f32::from_bits(w[3]);
    let (top_k, top_p, min_p) = (w[4], f32::from_bits(w[5]), f32::from_bits(w[6]));
    if inv_t == 0.0 || (top_k == 0 && top_p >= 1.0 && min_p <= 0.0) {
        return f32::NEG_INFINITY;
    }
    let s = |l: f32| l * inv_t;
    let valid = || row.iter().filter(|l| !l.is_nan()).map(|&l| s(l));
    let Some(m) = valid().reduce(f32::max) else {
        return f32::NEG_INFINITY;
    };
    // the count of entries at or above t and their mass
    let above = |t: f32| {
        valid()
            .filter(|&v| v >= t)
            .fold((0u32, 0f32), |(c, q), v| (c + 1, q + (v - m).exp()))
    };
    let floor = m - REACH;
    let mut cut = floor;
    if top_k > 0 {
        let c = above(floor).0;
        if c > top_k {
            let test = |t| {
                let c = above(t).0;
                (c, c >= top_k)
            };
            cut = search(floor, m, c, test, |c_lo, _| c_lo == top_k);
        }
    }
    if top_p < 1.0 {
        let (c, q) = above(cut);
        let goal = top_p * q;
        let test = |t| {
            let (c, q) = above(t);
            (c, q >= goal)
        };
        cut = search(cut, m, c, test, |c_lo, c_hi| Some(c_lo) == c_hi);
    }
    if min_p > 0.0 {
        cut = cut.max(m + min_p.ln());
    }
    cut
}

/// The highest threshold in `[lo, hi]` that holds (`test` gives the count
/// of entries at or above a threshold and whether it holds; it holds at
/// `lo`, where `count` entries are), to within adjacent floats or until
/// `pinned` (the counts at `lo` and, once known, at `hi`) says no later
/// pass changes which entries `lo` keeps. Each pass tests the 7
/// thresholds that split `[lo, hi]` into 8 and keeps the eighth where the
/// answer lies: `row_cut.wgsl`'s search, pass for pass.
fn search(
    mut lo: f32,
    mut hi: f32,
    count: u32,
    test: impl Fn(f32) -> (u32, bool),
    pinned: impl Fn(u32, Option<u32>) -> bool,
) -> f32 {
    let (mut c_lo, mut c_hi) = (count, None);
    for _ in 0..PASSES {
        if pinned(c_lo, c_hi) {
            break;
        }
        let w = (hi - lo) * 0.125;
        let t: [f32; 7] = std::array::from_fn(|j| lo + w * (j + 1) as f32);
        let r = t.map(&test);
        // `holds` falls from true to false as the threshold rises
        let n = r.iter().filter(|x| x.1).count();
        if n > 0 {
            lo = t[n - 1];
            c_lo = r[n - 1].0;
        }
        if n < 7 {
            hi = t[n];
            c_hi = Some(r[n].0);
        }
    }
    lo
}

/// The thresholds of [`row_cuts`]: inputs the logits `[rows, vocab]` f32
/// and each row's words `[rows, 8]` u32; in place a scratch `[rows,
/// scratch_words(groups)]` f32 of zeros (`groups` from [`split`]), which
/// it leaves zeros.
struct RowCuts {
    /// Whether any row has a top-k cut (a search of it dispatched).
    top_k: bool,
    /// Whether any row has a top-p cut.
    top_p: bool,
}

static ROW_CUT: WgslKernel = WgslKernel {
    name: "row_cut",
    source: include_str!("row_cut.wgsl"),
    needs: KernelNeeds::NOTHING,
};

impl CustomOp for RowCuts {
    fn name(&self) -> &'static str {
        "row_cut"
    }

    fn output(&self, inputs: &[&Tensor], in_place: &[&Tensor]) -> Result<(Vec<usize>, DType)> {
        let rows = check_rows("row_cut", inputs[0], inputs[1])?;
        let want = [rows, scratch_words(split(rows, inputs[0].shape()[1]).0)];
        match in_place {
            [s] if s.shape() == want && s.dtype() == DType::F32 => Ok((vec![rows], DType::F32)),
            _ => Err(silica::Error::InvalidArgument {
                op: "row_cut",
                msg: format!("wants one f32 scratch of shape {want:?} updated in place"),
            }),
        }
    }

    fn cpu(&self, inputs: &[&Tensor], _scratch: &mut [&mut Tensor]) -> Result<Tensor> {
        let vocab = inputs[0].shape()[1];
        let l: Vec<f32> = inputs[0].to_vec()?;
        let words: Vec<u32> = inputs[1].to_vec()?;
        let cuts: Vec<f32> = words
            .chunks(8)
            .enumerate()
            .map(|(r, w)| cut_of(&l[r * vocab..(r + 1) * vocab], w))
            .collect();
        Tensor::from_vec(cuts, &[inputs[1].shape()[0]], &Device::Cpu)
    }

    fn gpu(&self, call: &mut GpuCall<'_>) -> Result<bool> {
        let [rows, vocab] = call.inputs()[0].shape() else {
            return Ok(false);
        };
        let (rows, vocab) = (*rows, *vocab);
        let (groups, chunk) = split(rows, vocab);
        if rows > 65_535 || groups > 65_535 {
            return Ok(false);
        }
        let stride = scratch_words(groups) as u32;
        // the maximum, each search asked for (its start and its passes),
        // the pass that writes the cuts, then the clear
        let searches = u32::from(self.top_k) + u32::from(self.top_p);
        let passes = (0..2 + searches * (1 + PASSES)).chain([u32::MAX]);
        for pass in passes {
            let params = custom::params(&[
                rows as u32,
                vocab as u32,
                groups as u32,
                pass,
                PASSES,
                stride,
                chunk as u32,
            ]);
            call.dispatch(&ROW_CUT, &params, [groups as u32, rows as u32, 1])?;
        }
        Ok(true)
    }

    fn tolerance(&self, dtype: DType, _: usize) -> Tolerance {
        Tolerance::sums(dtype)
    }
}

/// What a row's pick demotes the tokens seen by, as the host sampler does:
/// the repetition penalty (an entry seen `c` times divided by
/// `repetition^c` where positive, multiplied by it where not), then
/// OpenAI's frequency and presence penalties (`c * frequency + presence`
/// subtracted).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Penalties {
    /// 1: off.
    pub repetition: f32,
    /// 0: off.
    pub frequency: f32,
    /// 0: off.
    pub presence: f32,
}

impl Penalties {
    /// No penalty: the row is left as it is.
    pub const NONE: Penalties = Penalties {
        repetition: 1.0,
        frequency: 0.0,
        presence: 0.0,
    };

    /// Whether the penalties change nothing.
    pub fn is_none(&self) -> bool {
        *self == Penalties::NONE
    }
}

/// `logits` (`[vocab]` or `[1, vocab]`, f32, on any device) with a
/// repetition penalty applied to the tokens `seen` (known on the host) and
/// `in_flight` (a `[1]` u32 token picked on the device, not read back yet):
/// [`penalize_rows`] for one row with the repetition penalty alone.
pub fn penalize(
    logits: &Tensor,
    seen: &[u32],
    in_flight: Option<&Tensor>,
    penalty: f32,
) -> Result<Tensor> {
    let vocab = logits.shape().last().copied().unwrap_or(0);
    if logits.numel() != vocab || vocab == 0 {
        return Err(silica::Error::InvalidArgument {
            op: "penalize",
            msg: format!("logits of shape {:?}, want one row", logits.shape()),
        });
    }
    let row = logits.reshape(&[1, vocab])?;
    let pens = Penalties {
        repetition: penalty,
        ..Penalties::NONE
    };
    let flight = in_flight.map(|t| (t, &[(0u32, 0u32)][..]));
    penalize_rows(&row, &[seen], flight, &[pens])?.reshape(logits.shape())
}

/// `logits` (`[rows, vocab]`, f32, on any device) with each row's
/// [`Penalties`] applied to the tokens it has seen: `seen[r]` (known on the
/// host) and, for each `(pick, row)` of `in_flight`'s list, the token
/// `picks[pick]` of a `[n]` u32 tensor on the device (picked by a step not
/// read back yet). An entry seen `c` times is demoted once per occurrence;
/// ids past the vocabulary count nowhere. On a GPU the histories travel as
/// ids and the penalties run there, so that the pick after them can stay
/// on the device too.
pub fn penalize_rows(
    logits: &Tensor,
    seen: &[&[u32]],
    in_flight: Option<(&Tensor, &[(u32, u32)])>,
    penalties: &[Penalties],
) -> Result<Tensor> {
    custom::expect_dtype("penalize", logits, DType::F32)?;
    let [rows, vocab] = logits.shape() else {
        return Err(silica::Error::InvalidArgument {
            op: "penalize",
            msg: format!("logits of shape {:?}, want [rows, vocab]", logits.shape()),
        });
    };
    let (rows, vocab) = (*rows, *vocab);
    if seen.len() != rows || penalties.len() != rows || vocab == 0 {
        return Err(silica::Error::InvalidArgument {
            op: "penalize",
            msg: format!(
                "{rows} rows of {vocab} logits against {} histories and {} penalties",
                seen.len(),
                penalties.len()
            ),
        });
    }
    if let Some(p) = penalties.iter().find(|p| {
        !(p.repetition.is_finite()
            && p.repetition > 0.0
            && p.frequency.is_finite()
            && p.presence.is_finite())
    }) {
        return Err(silica::Error::InvalidArgument {
            op: "penalize",
            msg: format!("penalties {p:?}: want a positive repetition penalty and finite ones"),
        });
    }
    let dev = logits.device();
    // (id, row) pairs; an empty list is one id past the vocabulary, which
    // counts nowhere
    let mut pairs: Vec<u32> = seen
        .iter()
        .enumerate()
        .flat_map(|(r, ids)| ids.iter().flat_map(move |&id| [id, r as u32]))
        .collect();
    if pairs.is_empty() {
        pairs.extend([u32::MAX, 0]);
    }
    let n = pairs.len();
    let pairs = Tensor::from_vec(pairs, &[n], dev)?;
    let none;
    let (picks, mut flight) = match in_flight {
        Some((t, list)) => {
            custom::expect_dtype("penalize", t, DType::U32)?;
            if let Some(&(pick, row)) = list
                .iter()
                .find(|&&(pick, row)| pick as usize >= t.numel() || row as usize >= rows)
            {
                return Err(silica::Error::InvalidArgument {
                    op: "penalize",
                    msg: format!(
                        "token in flight {pick} of {} for row {row} of {rows}",
                        t.numel()
                    ),
                });
            }
            (
                t,
                list.iter().flat_map(|&(p, r)| [p, r]).collect::<Vec<u32>>(),
            )
        }
        None => {
            none = Tensor::from_vec(vec![u32::MAX], &[1], dev)?;
            (&none, Vec::new())
        }
    };
    if flight.is_empty() {
        // pick 0 of a list holding one id past the vocabulary, or row
        // `rows`, which counts nowhere
        flight.extend([0, rows as u32]);
    }
    let f = flight.len();
    let flight = Tensor::from_vec(flight, &[f], dev)?;
    let pens: Vec<f32> = penalties
        .iter()
        .flat_map(|p| [p.repetition, p.frequency, p.presence])
        .collect();
    let pens = Tensor::from_vec(pens, &[rows, 3], dev)?;
    let mut counts = Tensor::zeros(&[rows * vocab], DType::U32, dev)?;
    custom::apply_in_place(
        &RowPenalties,
        &[logits, &pairs, picks, &flight, &pens],
        &mut [&mut counts],
    )
}

/// [`penalize_rows`]: inputs the logits `[rows, vocab]` f32, the seen
/// (id, row) pairs `[2n]` u32, the picks in flight `[m]` u32, the (pick,
/// row) pairs of those in flight `[2f]` u32 and each row's penalties
/// `[rows, 3]` f32; in place the counts `[rows * vocab]` u32 of zeros,
/// which it leaves zeros.
struct RowPenalties;

static PENALTY_COUNT: WgslKernel = WgslKernel {
    name: "penalty_count",
    source: include_str!("penalty_count.wgsl"),
    needs: KernelNeeds::NOTHING,
};

static PENALTY_APPLY: WgslKernel = WgslKernel {
    name: "penalty_apply",
    source: include_str!("penalty_apply.wgsl"),
    needs: KernelNeeds::NOTHING,
};

/// `penalty^c` as `c - 1` products (the kernel's roundings).
fn penalty_power(penalty: f32, c: u32) -> f32 {
    (1..c).fold(penalty, |f, _| f * penalty)
}

/// A logit seen `c > 0` times, demoted by `p` as the kernel does it.
fn demoted(l: f32, c: u32, p: &[f32]) -> f32 {
    let f = penalty_power(p[0], c);
    let l = if l > 0.0 { l / f } else { l * f };
    l - (c as f32 * p[1] + p[2])
}

impl CustomOp for RowPenalties {
    fn name(&self) -> &'static str {
        "row_penalties"
    }

    fn output(&self, inputs: &[&Tensor], in_place: &[&Tensor]) -> Result<(Vec<usize>, DType)> {
        let op = "row_penalties";
        custom::expect_dtype(op, inputs[0], DType::F32)?;
        for t in &inputs[1..4] {
            custom::expect_dtype(op, t, DType::U32)?;
        }
        custom::expect_dtype(op, inputs[4], DType::F32)?;
        let [rows, vocab] = inputs[0].shape() else {
            return Err(silica::Error::InvalidArgument {
                op,
                msg: format!(
                    "logits of shape {:?}, want [rows, vocab]",
                    inputs[0].shape()
                ),
            });
        };
        let pairs_even = inputs[1].numel().is_multiple_of(2) && inputs[3].numel().is_multiple_of(2);
        match in_place {
            [c] if pairs_even
                && inputs[4].shape() == [*rows, 3]
                && c.shape() == [rows * vocab]
                && c.dtype() == DType::U32 =>
            {
                Ok((inputs[0].shape().to_vec(), DType::F32))
            }
            _ => Err(silica::Error::InvalidArgument {
                op,
                msg: format!(
                    "wants (id, row) pairs, penalties [{rows}, 3] and counts [{}] u32 updated in place",
                    rows * vocab
                ),
            }),
        }
    }

    fn cpu(&self, inputs: &[&Tensor], _counts: &mut [&mut Tensor]) -> Result<Tensor> {
        let mut l: Vec<f32> = inputs[0].to_vec()?;
        let (rows, vocab) = (inputs[0].shape()[0], inputs[0].shape()[1]);
        let pairs: Vec<u32> = inputs[1].to_vec()?;
        let picks: Vec<u32> = inputs[2].to_vec()?;
        let flight: Vec<u32> = inputs[3].to_vec()?;
        let pens: Vec<f32> = inputs[4].to_vec()?;
        let mut counts = vec![0u32; rows * vocab];
        let mut count = |id: u32, row: u32| {
            if (id as usize) < vocab && (row as usize) < rows {
                counts[row as usize * vocab + id as usize] += 1;
            }
        };
        for p in pairs.chunks_exact(2) {
            count(p[0], p[1]);
        }
        for f in flight.chunks_exact(2) {
            count(picks.get(f[0] as usize).copied().unwrap_or(u32::MAX), f[1]);
        }
        for (i, (v, &c)) in l.iter_mut().zip(&counts).enumerate() {
            if c > 0 {
                let r = i / vocab;
                *v = demoted(*v, c, &pens[3 * r..3 * r + 3]);
            }
        }
        Tensor::from_vec(l, inputs[0].shape(), &Device::Cpu)
    }

    fn gpu(&self, call: &mut GpuCall<'_>) -> Result<bool> {
        let [rows, vocab] = call.inputs()[0].shape() else {
            return Ok(false);
        };
        let (rows, vocab) = (*rows, *vocab);
        let n = call.inputs()[1].numel() / 2;
        let (m, f) = (call.inputs()[2].numel(), call.inputs()[3].numel() / 2);
        let groups = call.groups_for(n + f, 256)?;
        let params = custom::params(&[
            n as u32,
            f as u32,
            vocab as u32,
            groups[0],
            rows as u32,
            m as u32,
        ]);
        call.dispatch(&PENALTY_COUNT, &params, groups)?;
        let groups = call.groups_for(rows * vocab, 256)?;
        let params = custom::params(&[(rows * vocab) as u32, vocab as u32, groups[0]]);
        call.dispatch(&PENALTY_APPLY, &params, groups)?;
        Ok(true)
    }

    fn tolerance(&self, dtype: DType, _: usize) -> Tolerance {
        Tolerance::elementwise(dtype)
    }
}

/// The rows of logits `[rows, vocab]` f32 against words `[rows, 8]` u32.
fn check_rows(op: &'static str, logits: &Tensor, words: &Tensor) -> Result<usize> {
    custom::expect_dtype(op, logits, DType::F32)?;
    custom::expect_dtype(op, words, DType::U32)?;
    let [rows, _] = logits.shape() else {
        return Err(silica::Error::InvalidArgument {
            op,
            msg: format!("logits of shape {:?}, want [rows, vocab]", logits.shape()),
        });
    };
    if words.shape() != [*rows, 8] {
        return Err(silica::Error::InvalidArgument {
            op,
            msg: format!("row words of shape {:?}, want [{rows}, 8]", words.shape()),
        });
    }
    Ok(*rows)
}

/// `l * inv_temperature + g` for the rows that draw (`CUT` below the row's
/// cut), `l` for the others: inputs the logits `[rows, vocab]` f32, each
/// row's words `[rows, 8]` u32 ([`RowDraw::words`]) and cuts `[rows]` f32.
struct GumbelLogits;

/// What a cut entry becomes: the lowest finite f32, below any draw.
const CUT: f32 = f32::MIN;

static GUMBEL: WgslKernel = WgslKernel {
    name: "gumbel_logits",
    source: include_str!("gumbel.wgsl"),
    needs: KernelNeeds::NOTHING,
};

/// The hash of the kernel (the "lowbias32" integer mixer).
fn mix(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// The uniform variate in (0, 1) of entry `i` of a row: from a hash of the
/// key, the counter and `i`.
fn uniform(key_lo: u32, key_hi: u32, counter: u32, i: u32) -> f32 {
    unit(mix(i ^ mix(counter ^ mix(key_lo ^ mix(key_hi)))))
}

/// 23 bits of `h`, centred in their interval: every value and the sum
/// with 0.5 are exact in f32, so the largest is 1 - 2^-24, never 1 (24
/// bits would round the largest to 1, whose Gumbel variate is infinite).
fn unit(h: u32) -> f32 {
    ((h >> 9) as f32 + 0.5) / 8_388_608.0
}

impl CustomOp for GumbelLogits {
    fn name(&self) -> &'static str {
        "gumbel_logits"
    }

    fn output(&self, inputs: &[&Tensor], _: &[&Tensor]) -> Result<(Vec<usize>, DType)> {
        let rows = check_rows(self.name(), inputs[0], inputs[1])?;
        custom::expect_dtype(self.name(), inputs[2], DType::F32)?;
        if inputs[2].shape() != [rows] {
            return Err(silica::Error::InvalidArgument {
                op: "gumbel_logits",
                msg: format!("cuts of shape {:?}, want [{rows}]", inputs[2].shape()),
            });
        }
        Ok((inputs[0].shape().to_vec(), DType::F32))
    }

    fn cpu(&self, inputs: &[&Tensor], _scratch: &mut [&mut Tensor]) -> Result<Tensor> {
        let vocab = inputs[0].shape()[1];
        let mut l: Vec<f32> = inputs[0].to_vec()?;
        let words: Vec<u32> = inputs[1].to_vec()?;
        let cuts: Vec<f32> = inputs[2].to_vec()?;
        let rows = l.chunks_mut(vocab.max(1)).zip(words.chunks(8)).zip(cuts);
        for ((row, w), cut) in rows {
            let inv_t = f32::from_bits(w[3]);
            if inv_t == 0.0 {
                continue;
            }
            for (i, v) in row.iter_mut().enumerate() {
                let s = *v * inv_t;
                *v = if s >= cut {
                    let u = uniform(w[0], w[1], w[2], i as u32);
                    s - (-u.ln()).ln()
                } else {
                    CUT
                };
            }
        }
        Tensor::from_vec(l, inputs[0].shape(), &Device::Cpu)
    }

    fn gpu(&self, call: &mut GpuCall<'_>) -> Result<bool> {
        let [rows, vocab] = call.inputs()[0].shape() else {
            return Ok(false);
        };
        let (rows, vocab) = (*rows, *vocab);
        let n = rows * vocab;
        let groups = call.groups_for(n, 256)?;
        let params = custom::params(&[n as u32, vocab as u32, groups[0]]);
        call.dispatch(&GUMBEL, &params, groups)?;
        Ok(true)
    }

    fn tolerance(&self, dtype: DType, _: usize) -> Tolerance {
        // a logarithm of a logarithm: a few roundings more than one op
        let t = Tolerance::elementwise(dtype);
        Tolerance {
            rel: 8.0 * t.rel,
            ..t
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uniforms_stay_inside_the_interval_and_differ_by_counter() {
        let a: Vec<f32> = (0..1000).map(|i| uniform(7, 0, 0, i)).collect();
        let b: Vec<f32> = (0..1000).map(|i| uniform(7, 0, 1, i)).collect();
        assert!(a.iter().all(|&u| u > 0.0 && u < 1.0));
        assert_ne!(a, b);
        let mean = a.iter().sum::<f32>() / a.len() as f32;
        assert!((mean - 0.5).abs() < 0.03, "{mean}");
        // the ends: finite Gumbel variates
        for h in [0, 511, 512, u32::MAX - 511, u32::MAX] {
            let u = unit(h);
            assert!(u > 0.0 && u < 1.0, "{h}: {u}");
            assert!((-(-u.ln()).ln()).is_finite(), "{h}: {u}");
        }
    }

    /// Rows of the same four logits, each its own counter: the tokens drawn
    /// come in the proportions of softmax(l / T).
    #[test]
    fn draws_follow_the_tempered_softmax() {
        let (l, t, n) = ([2.0f32, 1.0, 0.0, -1.0], 0.8f32, 20_000usize);
        let logits: Vec<f32> = l.iter().copied().cycle().take(4 * n).collect();
        let logits = Tensor::from_vec(logits, &[n, 4], &Device::Cpu).unwrap();
        let rows: Vec<RowDraw> = (0..n as u64)
            .map(|counter| RowDraw {
                inv_temperature: 1.0 / t,
                key: 42,
                counter,
                ..RowDraw::argmax()
            })
            .collect();
        let picks: Vec<u32> = draw_rows(&logits, &rows).unwrap().to_vec().unwrap();
        let z: f32 = l.iter().map(|v| (v / t).exp()).sum();
        for (tok, v) in l.iter().enumerate() {
            let want = (v / t).exp() / z;
            let got = picks.iter().filter(|&&p| p as usize == tok).count() as f32 / n as f32;
            assert!(
                (got - want).abs() < 0.01,
                "token {tok}: {got} drawn, {want} expected"
            );
        }
        // the same key and counters draw the same tokens; argmax rows take
        // the largest logit
        let again: Vec<u32> = draw_rows(&logits, &rows).unwrap().to_vec().unwrap();
        assert_eq!(picks, again);
        let greedy = vec![RowDraw::argmax(); n];
        let top: Vec<u32> = draw_rows(&logits, &greedy).unwrap().to_vec().unwrap();
        assert!(top.iter().all(|&p| p == 0));
    }

    /// The searches that stop once the kept entries are pinned keep what
    /// the definitions keep: exactly k entries for top-k, and for top-p the
    /// fewest most likely entries (of those top-k kept) whose mass reaches
    /// top_p of theirs. Rows of 3,000 entries: spread, a spike over a flat
    /// tail, and coarse (many ties below the top).
    #[test]
    fn early_stopping_cuts_keep_what_the_definitions_keep() {
        let mut h = 0x9e37_79b9u32;
        let mut next = || {
            h ^= h << 13;
            h ^= h >> 17;
            h ^= h << 5;
            h as f32 / u32::MAX as f32
        };
        for case in 0..60 {
            let row: Vec<f32> = (0..3000)
                .map(|i| match case % 3 {
                    0 => next() * 12.0,
                    1 => (if i == 17 { 9.0 } else { 0.0 }) + next() * 0.5,
                    _ => (next() * 6.0).floor() + if i < 40 { next() * 3.0 + 6.0 } else { 0.0 },
                })
                .collect();
            let inv_t = [1.0f32, 1.25, 0.5][case % 3];
            let top_k = [0u32, 1, 5, 40][case % 4];
            let top_p = [1.0f32, 0.9, 0.5, 0.95, 0.2][case % 5];
            if top_k == 0 && top_p >= 1.0 {
                continue;
            }
            let d = RowDraw {
                inv_temperature: inv_t,
                key: 1,
                counter: 0,
                top_k,
                top_p,
                min_p: 0.0,
            };
            let cut = cut_of(&row, &d.words());
            let kept = row.iter().filter(|&&l| l * inv_t >= cut).count();
            let mut s: Vec<f32> = row.iter().map(|&l| l * inv_t).collect();
            s.sort_by(|a, b| b.total_cmp(a));
            let ties_at = |n: usize| n < s.len() && n > 0 && s[n] == s[n - 1];
            let mut n = if top_k > 0 { top_k as usize } else { s.len() };
            if ties_at(n) {
                continue; // a tie at the k-th entry keeps all of it
            }
            if top_p < 1.0 {
                let mass: Vec<f32> = s[..n].iter().map(|v| (v - s[0]).exp()).collect();
                let goal = top_p * mass.iter().sum::<f32>();
                let mut sum = 0.0;
                n = 1 + mass
                    .iter()
                    .position(|q| {
                        sum += q;
                        sum >= goal
                    })
                    .unwrap();
                while ties_at(n) {
                    n += 1;
                }
            }
            assert_eq!(kept, n, "case {case}: k {top_k}, p {top_p}, cut at {cut}");
        }
    }

    /// The penalty demotes each seen token once per occurrence (the one
    /// in flight included), divides positive logits and multiplies the
    /// others, ignores ids past the vocabulary, and refuses bad operands.
    #[test]
    fn the_penalty_counts_each_occurrence() {
        let l = Tensor::from_vec(vec![2.0f32, -1.0, 0.5, 4.0, 0.0], &[1, 5], &Device::Cpu).unwrap();
        let flight = Tensor::from_vec(vec![3u32], &[1], &Device::Cpu).unwrap();
        let got: Vec<f32> = penalize(&l, &[0, 1, 1, 99], Some(&flight), 2.0)
            .unwrap()
            .to_vec()
            .unwrap();
        assert_eq!(got, vec![1.0, -4.0, 0.5, 2.0, 0.0]);
        let none: Vec<f32> = penalize(&l, &[], None, 2.0).unwrap().to_vec().unwrap();
        assert_eq!(none, vec![2.0, -1.0, 0.5, 4.0, 0.0]);
        let two = Tensor::from_vec(vec![0f32; 10], &[2, 5], &Device::Cpu).unwrap();
        assert!(penalize(&two, &[1], None, 2.0).is_err());
        assert!(penalize(&l, &[1], None, 0.0).is_err());
        assert!(penalize(&l, &[1], None, f32::NAN).is_err());
    }

    /// Each row demotes what it has seen by its own penalties: the
    /// repetition penalty per occurrence, then c * frequency + presence;
    /// a token in flight counts for the row its pair names, and rows
    /// without penalties or history stay as they are.
    #[test]
    fn row_penalties_demote_each_row_as_the_host_sampler() {
        let l = vec![
            2.0f32, -1.0, 0.5, 4.0, //
            2.0, -1.0, 0.5, 4.0, //
            2.0, -1.0, 0.5, 4.0,
        ];
        let logits = Tensor::from_vec(l.clone(), &[3, 4], &Device::Cpu).unwrap();
        let picks = Tensor::from_vec(vec![7u32, 3, 1], &[3], &Device::Cpu).unwrap();
        let pens = [
            Penalties {
                repetition: 2.0,
                ..Penalties::NONE
            },
            Penalties {
                frequency: 1.0,
                presence: 0.5,
                ..Penalties::NONE
            },
            Penalties::NONE,
        ];
        let seen: [&[u32]; 3] = [&[0, 1, 1], &[2, 2, 9], &[0, 1, 2, 3]];
        // row 0's token in flight is picks[1] = 3, row 1's picks[2] = 1
        let flight = [(1u32, 0u32), (2, 1)];
        let got: Vec<f32> = penalize_rows(&logits, &seen, Some((&picks, &flight)), &pens)
            .unwrap()
            .to_vec()
            .unwrap();
        let want = vec![
            1.0, -4.0, 0.5, 2.0, //
            2.0, -2.5, -2.0, 4.0, //
            2.0, -1.0, 0.5, 4.0,
        ];
        assert_eq!(got, want);
        // the host sampler's greedy picks over the same histories agree
        for (r, p) in pens.iter().enumerate() {
            let mut history = seen[r].to_vec();
            if let Some(&(pick, _)) = flight.iter().find(|f| f.1 as usize == r) {
                history.push([7u32, 3, 1][pick as usize]);
            }
            let mut host = crate::sampling::Sampler::new(crate::sampling::SamplingParams {
                repetition_penalty: p.repetition,
                frequency_penalty: p.frequency,
                presence_penalty: p.presence,
                ..crate::sampling::SamplingParams::greedy()
            });
            let row = &got[4 * r..4 * r + 4];
            let best = (0..4).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
            assert_eq!(host.sample(&l[4 * r..4 * r + 4], &history), best as u32);
        }
        // bad operands
        let bad = |seen: &[&[u32]], flight: &[(u32, u32)], pens: &[Penalties]| {
            penalize_rows(&logits, seen, Some((&picks, flight)), pens).is_err()
        };
        assert!(bad(&seen[..2], &flight, &pens));
        assert!(bad(&seen, &flight, &pens[..2]));
        assert!(bad(&seen, &[(3, 0)], &pens));
        assert!(bad(&seen, &[(0, 3)], &pens));
        let nan = Penalties {
            frequency: f32::NAN,
            ..Penalties::NONE
        };
        assert!(bad(&seen, &flight, &[nan, nan, nan]));
        let flat = Tensor::from_vec(l, &[12], &Device::Cpu).unwrap();
        assert!(penalize_rows(&flat, &[&[]], None, &[Penalties::NONE]).is_err());
    }

    /// With top-k, top-p and min-p, the draws come in the proportions the
    /// host sampler gives: the kept tokens' tempered softmax, renormalized.
    #[test]
    fn cut_draws_follow_the_kept_softmax() {
        let l = [2.0f32, 1.5, 1.0, 0.0, -1.0];
        let t = 1.0f32;
        let n = 20_000usize;
        let p: Vec<f32> = {
            let e: Vec<f32> = l.iter().map(|v| (v / t).exp()).collect();
            let z: f32 = e.iter().sum();
            e.iter().map(|v| v / z).collect()
        };
        // (top_k, top_p, min_p) and the tokens the host sampler keeps
        let cases: [(u32, f32, f32, usize); 5] = [
            (3, 1.0, 0.0, 3),
            (0, 0.7, 0.0, 2), // p = 0.46, 0.28, 0.17, 0.06, 0.02
            (0, 1.0, 0.3, 3), // p[2] / p[0] = 0.37, p[3] / p[0] = 0.14
            (4, 0.5, 0.0, 2), // within the top 4: 0.47 < 0.5 <= 0.76
            (0, 1e-6, 0.0, 1),
        ];
        let logits: Vec<f32> = l.iter().copied().cycle().take(5 * n).collect();
        let logits = Tensor::from_vec(logits, &[n, 5], &Device::Cpu).unwrap();
        for (top_k, top_p, min_p, kept) in cases {
            let rows: Vec<RowDraw> = (0..n as u64)
                .map(|counter| RowDraw {
                    inv_temperature: 1.0 / t,
                    key: 9,
                    counter,
                    top_k,
                    top_p,
                    min_p,
                })
                .collect();
            let picks: Vec<u32> = draw_rows(&logits, &rows).unwrap().to_vec().unwrap();
            let z: f32 = p[..kept].iter().sum();
            for (tok, &pt) in p.iter().enumerate() {
                let want = if tok < kept { pt / z } else { 0.0 };
                let got = picks.iter().filter(|&&q| q as usize == tok).count() as f32 / n as f32;
                assert!(
                    (got - want).abs() < 0.012,
                    "({top_k}, {top_p}, {min_p}) token {tok}: {got} drawn, {want} expected"
                );
            }
        }
    }
}
