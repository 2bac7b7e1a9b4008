//! Several sequences in one forward pass ([`Llama::forward_batch`]): the
//! rows of every sequence's new tokens go through the projections and the
//! feed-forward together (the weights are read once for all of them), and
//! each sequence attends over its own KV cache. This is what lets a server
//! decode many requests at the cost of little more than one.

use silica::{DType, QFuse, Tensor};

use super::{Embedding, KvCache, Llama};
use crate::capture::NoTaps;
use crate::{Error, Result};

/// One sequence's part of a batched step: the tokens after those its cache
/// holds.
pub struct SeqStep<'a> {
    pub ids: &'a [u32],
    pub cache: &'a mut KvCache,
}

/// A sequence's rows and rotation tables for the step.
struct Part {
    row: usize,
    len: usize,
    start: usize,
    cos: Tensor,
    sin: Tensor,
    local: Option<(Tensor, Tensor)>,
}

impl Llama {
    /// Runs each step's tokens after its cache's positions, all sequences
    /// in one pass, and returns the f32 logits of each sequence's last new
    /// position, `[steps, vocab]` in the order of `steps`. Each cache then
    /// holds its new positions too. On error every cache holds the
    /// positions it held before.
    pub fn forward_batch(&self, steps: &mut [SeqStep<'_>]) -> Result<Tensor> {
        let c = &self.config;
        if steps.is_empty() {
            return Err(Error::InvalidInput(
                "a batched step needs a sequence".into(),
            ));
        }
        let mut ids: Vec<u32> = Vec::new();
        let mut parts: Vec<Part> = Vec::with_capacity(steps.len());
        for (i, s) in steps.iter_mut().enumerate() {
            let t = s.ids.len();
            if t == 0 {
                return Err(Error::InvalidInput(format!(
                    "sequence {i} of the batch has no token"
                )));
            }
            if let Some(&bad) = s.ids.iter().find(|&&id| id as usize >= c.vocab_size) {
                return Err(Error::InvalidInput(format!(
                    "token id {bad} is outside the vocabulary of {} tokens",
                    c.vocab_size
                )));
            }
            let start = s.cache.len;
            if start + t > c.context_length {
                return Err(Error::InvalidInput(format!(
                    "{} positions exceed the model's context of {} tokens",
                    start + t,
                    c.context_length
                )));
            }
            self.reserve(s.cache, start + t)?;
            let (Some(cos), Some(sin)) = (&s.cache.cos, &s.cache.sin) else {
                unreachable!("a reserved cache has rope tables")
            };
            let local = match &s.cache.local {
                Some((lc, ls)) => Some((lc.narrow(0, start, t)?, ls.narrow(0, start, t)?)),
                None => None,
            };
            parts.push(Part {
                row: ids.len(),
                len: t,
                start,
                cos: cos.narrow(0, start, t)?,
                sin: sin.narrow(0, start, t)?,
                local,
            });
            ids.extend_from_slice(s.ids);
        }
        let n = ids.len();
        let ids_t = Tensor::from_vec(ids, &[n], &self.device)?;
        let mut x = match &self.embed {
            Embedding::Dense(t) => t.index_select(0, &ids_t)?,
            Embedding::Quant(q) => q.embedding(&ids_t, self.dtype)?,
        }; // [n, d]
        if c.gemma.is_some() {
            x = x.mul_scalar((c.d_model as f32).sqrt())?;
        }
        let (h, scale) = (c.n_heads, c.attention_scale);
        for li in 0..c.n_layers {
            x = self.block(li, x, &mut NoTaps, |qkv| {
                let mut outs = Vec::with_capacity(parts.len());
                for (p, s) in parts.iter().zip(steps.iter_mut()) {
                    let q = qkv.narrow(0, p.row, p.len)?;
                    let rope = (&p.cos, &p.sin, c.rope_style);
                    let cache = &mut s.cache.kv[li];
                    outs.push(match &c.gemma {
                        None => q.cached_attention(cache, p.start, rope, h, scale)?,
                        Some(g) => {
                            let window = g.window(li);
                            let rope = match (&p.local, window) {
                                (Some((lc, ls)), Some(_)) => (lc, ls, c.rope_style),
                                _ => rope,
                            };
                            let mut mask = None;
                            self.gemma_attention(g, window, &q, cache, p.start, rope, &mut mask)?
                        }
                    });
                }
                let refs: Vec<&Tensor> = outs.iter().collect();
                Ok(Tensor::cat(&refs, 0)?)
            })?;
        }
        for (p, s) in parts.iter().zip(steps.iter_mut()) {
            s.cache.len = p.start + p.len;
        }
        let last: Vec<u32> = parts.iter().map(|p| (p.row + p.len - 1) as u32).collect();
        let last = Tensor::from_vec(last, &[parts.len()], &self.device)?;
        let x = x.index_select(0, &last)?;
        let fuse = QFuse {
            rms_norm: Some((&self.out_norm, c.rms_eps as f32)),
            ..QFuse::default()
        };
        let logits = self.lm_head.fused(&x, fuse)?.to_dtype(DType::F32)?;
        Ok(match c.gemma.as_ref().and_then(|g| g.final_softcap) {
            Some(cap) => logits.div_scalar(cap)?.tanh()?.mul_scalar(cap)?,
            None => logits,
        })
    }
}
