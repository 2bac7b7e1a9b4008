//! Sampling on the device: a row of logits `l` gives the token
//! `argmax(l / T + g)`, where `g` holds one Gumbel variate per vocabulary
//! entry (the Gumbel-max draw, which picks token `i` with probability
//! `softmax(l / T)_i`). The variates come from a counter-based hash of the
//! row's key (the request's seed), its counter (which of its tokens is
//! drawn) and `i`, so a draw needs nothing from the host but those three
//! numbers, and the next step can be queued on the picks before they are
//! read back. A row with `inv_temperature` 0 takes its plain argmax.

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
}

impl RowDraw {
    /// The row's most likely token.
    pub fn argmax() -> RowDraw {
        RowDraw {
            inv_temperature: 0.0,
            key: 0,
            counter: 0,
        }
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
    let words: Vec<u32> = rows
        .iter()
        .flat_map(|r| {
            [
                r.key as u32,
                (r.key >> 32) as u32,
                r.counter as u32,
                r.inv_temperature.to_bits(),
            ]
        })
        .collect();
    let params = Tensor::from_vec(words, &[rows.len(), 4], logits.device())?;
    custom::apply(&GumbelLogits, &[logits, &params])?.argmax(-1, false)
}

/// `l * inv_temperature + g` for the rows that draw, `l` for the others:
/// inputs the logits `[rows, vocab]` f32 and each row's words `[rows, 4]`
/// u32 (key low, key high, counter, inv_temperature's bits).
struct GumbelLogits;

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
        let (logits, params) = (inputs[0], inputs[1]);
        custom::expect_dtype(self.name(), logits, DType::F32)?;
        custom::expect_dtype(self.name(), params, DType::U32)?;
        let [rows, _] = logits.shape() else {
            return Err(silica::Error::InvalidArgument {
                op: "gumbel_logits",
                msg: format!("logits of shape {:?}, want [rows, vocab]", logits.shape()),
            });
        };
        if params.shape() != [*rows, 4] {
            return Err(silica::Error::InvalidArgument {
                op: "gumbel_logits",
                msg: format!("row words of shape {:?}, want [{rows}, 4]", params.shape()),
            });
        }
        Ok((logits.shape().to_vec(), DType::F32))
    }

    fn cpu(&self, inputs: &[&Tensor], _: &mut [&mut Tensor]) -> Result<Tensor> {
        let vocab = inputs[0].shape()[1];
        let mut l: Vec<f32> = inputs[0].to_vec()?;
        let words: Vec<u32> = inputs[1].to_vec()?;
        for (row, w) in l.chunks_mut(vocab.max(1)).zip(words.chunks(4)) {
            let inv_t = f32::from_bits(w[3]);
            if inv_t == 0.0 {
                continue;
            }
            for (i, v) in row.iter_mut().enumerate() {
                let u = uniform(w[0], w[1], w[2], i as u32);
                *v = *v * inv_t - (-u.ln()).ln();
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
}
