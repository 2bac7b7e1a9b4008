//! Activation capture for decoders ([`Llama::capture`]): a batch of
//! sequences, right-padded to one length, runs through the blocks at once
//! without a KV cache (causal attention keeps every real token from seeing
//! the padding after it), and the states asked for are pooled on the device.

use silica::{AttentionOpts, Tensor};

use super::{Embedding, Llama};
use crate::capture::{CaptureSpec, Collector, Pooler, Site, Taps, check_batch};
use crate::{Error, Result};

impl Llama {
    /// The states `spec` names for each sequence of `batch` (token ids, as
    /// the tokenizer gives them; the sequences may differ in length): one
    /// f32 tensor per point of the spec, on the model's device, `[B, d]`
    /// for last-token and mean pooling, `[sum of lengths, d]` for all
    /// tokens (sequences in order). Blocks after the deepest layer asked
    /// for are not run. Numbering and sites: see [`crate::capture`].
    pub fn capture(&self, batch: &[&[u32]], spec: &CaptureSpec) -> Result<Vec<Tensor>> {
        let c = &self.config;
        spec.check(c.n_layers)?;
        let t = check_batch(batch, c.vocab_size)?;
        if t > c.context_length {
            return Err(Error::InvalidInput(format!(
                "a sequence of {t} tokens exceeds the model's context of {} tokens",
                c.context_length
            )));
        }
        if self.batchable(t) {
            return self.capture_padded(batch, t, spec);
        }
        // one sequence at a time through the cached forward, whose
        // attention handles Gemma's windows and soft-capping
        let mut parts: Vec<Vec<Tensor>> = Vec::with_capacity(batch.len());
        for s in batch {
            let pooler = Pooler::new(spec.pool, &[s.len()], s.len(), &self.device)?;
            let mut collector = Collector::new(spec, pooler);
            let mut cache = self.new_cache();
            let ids = Tensor::from_slice(s, &[s.len()], &self.device)?;
            self.forward_taps(&ids, &mut cache, true, &mut collector, spec.deepest())?;
            parts.push(collector.finish()?);
        }
        (0..spec.points.len())
            .map(|i| {
                let refs: Vec<&Tensor> = parts.iter().map(|p| &p[i]).collect();
                Ok(Tensor::cat(&refs, 0)?)
            })
            .collect()
    }

    /// Whether plain causal attention over a padded batch of `t` positions
    /// computes what the model's own attention does: not where a sliding
    /// window cuts keys off or scores are soft-capped.
    fn batchable(&self, t: usize) -> bool {
        match &self.config.gemma {
            None => true,
            Some(g) => g.attn_softcap.is_none() && g.sliding_window.is_none_or(|w| t <= w),
        }
    }

    fn capture_padded(
        &self,
        batch: &[&[u32]],
        t: usize,
        spec: &CaptureSpec,
    ) -> Result<Vec<Tensor>> {
        let c = &self.config;
        let (hd, h, kvh) = (c.head_dim, c.n_heads, c.n_kv_heads);
        let b = batch.len();
        let lens: Vec<usize> = batch.iter().map(|s| s.len()).collect();
        let mut ids = vec![0u32; b * t];
        for (row, s) in batch.iter().enumerate() {
            ids[row * t..row * t + s.len()].copy_from_slice(s);
        }
        let ids = Tensor::from_vec(ids, &[b * t], &self.device)?;
        let mut collector = Collector::new(spec, Pooler::new(spec.pool, &lens, t, &self.device)?);
        let mut x = match &self.embed {
            Embedding::Dense(table) => table.index_select(0, &ids)?,
            Embedding::Quant(q) => q.embedding(&ids, self.dtype)?,
        }; // [b * t, d]
        if c.gemma.is_some() {
            x = x.mul_scalar((c.d_model as f32).sqrt())?;
        }
        collector.put(0, Site::Residual, &x)?;
        // the rotation tables of positions 0..t, once per sequence
        let tile = |(cos, sin): (Tensor, Tensor)| -> Result<(Tensor, Tensor)> {
            let cos = Tensor::cat(&vec![&cos; b], 0)?;
            let sin = Tensor::cat(&vec![&sin; b], 0)?;
            Ok((cos, sin))
        };
        let global = tile(self.rope_tables(t)?)?;
        let local = match &c.gemma {
            Some(g) if g.local_layers.contains(&true) => {
                Some(tile(self.local_rope_tables(t, g.rope_theta_local)?)?)
            }
            _ => None,
        };
        let opts = AttentionOpts {
            scale: c.attention_scale,
            causal: true,
        };
        for li in 0..spec.deepest() {
            let is_local = c.gemma.as_ref().is_some_and(|g| g.window(li).is_some());
            let (cos, sin) = match (&local, is_local) {
                (Some(tables), true) => tables,
                _ => &global,
            };
            x = self.block(li, x, &mut collector, |qkv| {
                let r = qkv.rope_heads(cos, sin, c.rope_style, h + kvh)?;
                let q = r.narrow(1, 0, h)?.reshape(&[b, t, h, hd])?;
                let k = r.narrow(1, h, kvh)?.reshape(&[b, t, kvh, hd])?;
                let v = r.narrow(1, h + kvh, kvh)?.reshape(&[b, t, kvh, hd])?;
                Ok(q.attention(&k, &v, None, opts)?.reshape(&[b * t, h, hd])?)
            })?;
            self.tap_residual(li + 1, &x, &mut collector)?;
        }
        collector.finish()
    }
}
