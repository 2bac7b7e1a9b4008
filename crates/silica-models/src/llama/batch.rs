//! Several sequences in one forward pass ([`Llama::forward_batch`]): the
//! rows of every sequence's new tokens go through the projections and the
//! feed-forward together (the weights are read once for all of them), and
//! each sequence attends over its own KV cache. This is what lets a server
//! decode many requests at the cost of little more than one.
//!
//! [`Llama::forward_pooled`] does the same for sequences whose caches are
//! slots of one [`KvPool`]: a step's attention is then one op per layer for
//! all of them (one kernel on a GPU when each has one new token), where
//! separate caches need one for each.

use silica::{CacheSeq, CacheSeqs, CachedAttentionOpts, DType, QFuse, Tensor};

use super::{CACHE_START, Embedding, KvCache, Llama};
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
            let start = s.cache.len;
            self.check_seq_step(i, s.ids, start)?;
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
        let mut x = self.embed_rows(ids)?;
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
        self.last_logits(&x, last)
    }

    /// That sequence `i` of a batched step brings tokens, each inside the
    /// vocabulary, and that they fit the context after its `start`
    /// positions.
    fn check_seq_step(&self, i: usize, ids: &[u32], start: usize) -> Result<()> {
        let c = &self.config;
        if ids.is_empty() {
            return Err(Error::InvalidInput(format!(
                "sequence {i} of the batch has no token"
            )));
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= c.vocab_size) {
            return Err(Error::InvalidInput(format!(
                "token id {bad} is outside the vocabulary of {} tokens",
                c.vocab_size
            )));
        }
        if start + ids.len() > c.context_length {
            return Err(Error::InvalidInput(format!(
                "{} positions exceed the model's context of {} tokens",
                start + ids.len(),
                c.context_length
            )));
        }
        Ok(())
    }

    /// The embeddings of `ids`, `[n, d]` (scaled by √d for Gemma).
    fn embed_rows(&self, ids: Vec<u32>) -> Result<Tensor> {
        let n = ids.len();
        self.embed_tensor(&Tensor::from_vec(ids, &[n], &self.device)?)
    }

    /// The embeddings of the u32 ids `ids_t` on the model's device.
    fn embed_tensor(&self, ids_t: &Tensor) -> Result<Tensor> {
        let x = match &self.embed {
            Embedding::Dense(t) => t.index_select(0, ids_t)?,
            Embedding::Quant(q) => q.embedding(ids_t, self.dtype)?,
        };
        Ok(match self.config.gemma {
            Some(_) => x.mul_scalar((self.config.d_model as f32).sqrt())?,
            None => x,
        })
    }

    /// The f32 logits of rows `last` of the residual stream `x`.
    fn last_logits(&self, x: &Tensor, last: Vec<u32>) -> Result<Tensor> {
        let c = &self.config;
        let n = last.len();
        let last = Tensor::from_vec(last, &[n], &self.device)?;
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

    /// A pool of `slots` KV caches (see [`KvPool`]), empty; its rows grow
    /// with the longest sequence.
    pub fn new_pool(&self, slots: usize) -> Result<KvPool> {
        if slots == 0 {
            return Err(Error::InvalidInput("a KV pool needs a slot".into()));
        }
        let mut pool = KvPool {
            kv: Vec::new(),
            tables: None,
            capacity: 0,
            lens: vec![0; slots],
            used: vec![false; slots],
            kept: vec![0; slots],
        };
        self.reserve_pool(&mut pool, CACHE_START.min(self.config.context_length))?;
        Ok(pool)
    }

    /// Builds the GPU kernels that pooled steps take, without running them
    /// (see [`silica::Device::build_kernels_only`]): one sequence feeding 1
    /// to 64 tokens and `longest`, two feeding prompts together, and 1 to
    /// 64 sequences (and all the free slots, where more) feeding a token
    /// each, from the host, from the device's picks, and both. A server does this before it says it is ready, so
    /// that its first step of each size does not stop to build kernels (a
    /// driver without its cache takes 0.1 to 1 s a kernel). Each new size
    /// of step can need a kernel of its own: products of up to 64 rows
    /// take the GEMV kernels in chunks of 5 to 8 rows. `pool`'s free slots
    /// are used and left free and empty (and where the steps grew it, it
    /// is grown again for real); nothing happens off the GPU.
    pub fn build_pooled_kernels(&self, pool: &mut KvPool, longest: usize) -> Result<()> {
        if !self.device.is_gpu() {
            return Ok(());
        }
        let free: Vec<usize> = std::iter::from_fn(|| pool.acquire()).collect();
        let capacity = pool.capacity;
        let built = self
            .device
            .build_kernels_only(|| self.pooled_shapes(pool, &free, longest));
        for &slot in &free {
            pool.release(slot);
        }
        if pool.capacity != capacity {
            // the steps grew the pool while nothing ran: its new KV buffers
            // and RoPE tables hold undefined values, so they are made again
            // for real (no slot holds a position yet)
            let grown = pool.capacity;
            pool.capacity = 0;
            pool.kv.clear();
            pool.tables = None;
            self.reserve_pool(pool, grown)?;
        }
        built
    }

    /// Runs one real step of one token in a free slot of `pool` and reads
    /// its pick back, then frees the slot: a server's first steps on the
    /// device cost more than the next ones, so it does this before it
    /// says it is ready. Nothing happens off the GPU or without a free slot.
    pub fn warm_up_pooled(&self, pool: &mut KvPool) -> Result<()> {
        if !self.device.is_gpu() {
            return Ok(());
        }
        let Some(slot) = pool.acquire() else {
            return Ok(());
        };
        let step = [PoolStep { slot, ids: &[0] }];
        let picked = self
            .forward_pooled(pool, &step)
            .and_then(|logits| Ok(logits.argmax(-1, false)?.to_vec::<u32>()?));
        pool.release(slot);
        picked.map(|_| ())
    }

    /// The steps of [`Llama::build_pooled_kernels`] on the slots `free`.
    fn pooled_shapes(&self, pool: &mut KvPool, free: &[usize], longest: usize) -> Result<()> {
        let Some(&first) = free.first() else {
            return Ok(());
        };
        let longest = longest.min(self.config.context_length);
        let ids = vec![0u32; longest.max(64)];
        let chunks = (1..=64.min(longest)).chain((longest > 64).then_some(longest));
        for m in chunks {
            pool.lens[first] = 0;
            let steps = [PoolStep {
                slot: first,
                ids: &ids[..m],
            }];
            self.forward_pooled(pool, &steps)?.argmax(-1, false)?;
        }
        // prompts of two sequences in one step, and a prompt beside a
        // decoding sequence
        if let [a, b, ..] = *free {
            for (ta, tb) in [(2, 2), (2, 1)] {
                (pool.lens[a], pool.lens[b]) = (0, 0);
                let steps = [
                    PoolStep {
                        slot: a,
                        ids: &ids[..ta],
                    },
                    PoolStep {
                        slot: b,
                        ids: &ids[..tb],
                    },
                ];
                self.forward_pooled(pool, &steps)?.argmax(-1, false)?;
            }
        }
        let many = (free.len() > 64).then_some(free.len());
        for n in (1..=free.len().min(64)).chain(many) {
            for &slot in free {
                pool.lens[slot] = 0;
            }
            let steps: Vec<PoolStep> = free[..n]
                .iter()
                .map(|&slot| PoolStep {
                    slot,
                    ids: &ids[..1],
                })
                .collect();
            let argmax = self.forward_pooled(pool, &steps)?.argmax(-1, false)?;
            let picked: Vec<PickedStep> = free[..n]
                .iter()
                .enumerate()
                .map(|(row, &slot)| PickedStep { slot, row })
                .collect();
            self.forward_pooled_picked(pool, &[], &picked, Some(&argmax))?
                .argmax(-1, false)?;
            // and a token from the host beside the picked ones
            if n < free.len() {
                let host = [PoolStep {
                    slot: free[n],
                    ids: &ids[..1],
                }];
                self.forward_pooled_picked(pool, &host, &picked, Some(&argmax))?
                    .argmax(-1, false)?;
            }
        }
        Ok(())
    }

    /// Makes room for `total` positions in every slot of `pool`, keeping
    /// what the slots hold.
    fn reserve_pool(&self, pool: &mut KvPool, total: usize) -> Result<()> {
        if total <= pool.capacity {
            return Ok(());
        }
        let c = &self.config;
        let capacity = total
            .max(pool.capacity * 2)
            .min(c.context_length)
            .max(total);
        let slots = pool.lens.len();
        let shape = [slots * capacity, 2 * c.n_kv_heads, c.head_dim];
        let mut kv = Vec::with_capacity(c.n_layers);
        for li in 0..c.n_layers {
            let mut t = Tensor::zeros(&shape, self.dtype, &self.device)?;
            if let Some(old) = pool.kv.get(li) {
                // a free slot's kept positions move with it
                let held = pool.lens.iter().zip(&pool.kept).map(|(l, k)| *l.max(k));
                for (slot, len) in held.enumerate().filter(|(_, l)| *l > 0) {
                    let rows = old.narrow(0, slot * pool.capacity, len)?;
                    t.slice_assign(slot * capacity, &rows)?;
                }
            }
            kv.push(t);
        }
        let (cos, sin) = self.rope_tables(capacity)?;
        let local = match &c.gemma {
            Some(g) if g.local_layers.contains(&true) => {
                Some(self.local_rope_tables(capacity, g.rope_theta_local)?)
            }
            _ => None,
        };
        pool.kv = kv;
        pool.tables = Some((cos, sin, local));
        pool.capacity = capacity;
        Ok(())
    }

    /// [`Llama::forward_batch`] for sequences that are slots of `pool`:
    /// each step's tokens go after those its slot holds, and the f32
    /// logits of each step's last new position come back, `[steps,
    /// vocab]`. On error every slot holds the positions it held before.
    pub fn forward_pooled(&self, pool: &mut KvPool, steps: &[PoolStep<'_>]) -> Result<Tensor> {
        self.forward_pooled_picked(pool, steps, &[], None)
    }

    /// [`Llama::forward_pooled`] where the sequences `picked` feed one token
    /// each that is still on the device: row `row` of `picks` (u32, such as
    /// the argmax of the previous step's logits), so that the step is
    /// queued before those tokens are read back. Their logits rows come
    /// after those of `steps`, in order. As with [`Llama::forward_ids`],
    /// the picked ids are not checked against the vocabulary (an argmax of
    /// this model's logits is inside it).
    pub fn forward_pooled_picked(
        &self,
        pool: &mut KvPool,
        steps: &[PoolStep<'_>],
        picked: &[PickedStep],
        picks: Option<&Tensor>,
    ) -> Result<Tensor> {
        let c = &self.config;
        if steps.is_empty() && picked.is_empty() {
            return Err(Error::InvalidInput(
                "a batched step needs a sequence".into(),
            ));
        }
        let picks = match (picked.is_empty(), picks) {
            (true, _) => None,
            (false, Some(p)) if p.rank() == 1 && p.dtype() == DType::U32 => Some(p),
            (false, p) => {
                return Err(Error::InvalidInput(format!(
                    "picked steps need their tokens as a u32 vector, not {:?}",
                    p.map(|p| (p.shape().to_vec(), p.dtype()))
                )));
            }
        };
        let slots: Vec<usize> = steps
            .iter()
            .map(|s| s.slot)
            .chain(picked.iter().map(|p| p.slot))
            .collect();
        for (i, &slot) in slots.iter().enumerate() {
            if slot >= pool.lens.len() || !pool.used[slot] {
                return Err(Error::InvalidInput(format!(
                    "sequence {i} of the batch names slot {slot}, which is not in use"
                )));
            }
            if slots[..i].contains(&slot) {
                return Err(Error::InvalidInput(format!(
                    "slot {slot} appears twice in one step"
                )));
            }
        }
        if let Some(p) = picks
            && let Some(bad) = picked.iter().find(|q| q.row >= p.shape()[0])
        {
            return Err(Error::InvalidInput(format!(
                "picked row {} of a vector of {} tokens",
                bad.row,
                p.shape()[0]
            )));
        }
        let mut ids: Vec<u32> = Vec::new();
        let mut positions: Vec<u32> = Vec::new();
        let mut last: Vec<u32> = Vec::with_capacity(slots.len());
        let mut lens: Vec<usize> = Vec::with_capacity(slots.len());
        let mut longest = 0;
        let mut rows = 0;
        for (i, s) in steps.iter().enumerate() {
            let t = s.ids.len();
            let start = pool.lens[s.slot];
            self.check_seq_step(i, s.ids, start)?;
            longest = longest.max(start + t);
            positions.extend((start..start + t).map(|p| p as u32));
            ids.extend_from_slice(s.ids);
            rows += t;
            last.push((rows - 1) as u32);
            lens.push(t);
        }
        for (i, p) in picked.iter().enumerate() {
            let start = pool.lens[p.slot];
            if start + 1 > c.context_length {
                return Err(Error::InvalidInput(format!(
                    "sequence {} of the batch: {} positions exceed the model's context of {} tokens",
                    steps.len() + i,
                    start + 1,
                    c.context_length
                )));
            }
            longest = longest.max(start + 1);
            positions.push(start as u32);
            rows += 1;
            last.push((rows - 1) as u32);
            lens.push(1);
        }
        self.reserve_pool(pool, longest)?;
        let cap = pool.capacity;
        let seqs: Vec<CacheSeq> = slots
            .iter()
            .zip(&lens)
            .map(|(&slot, &len)| CacheSeq {
                len,
                base: slot * cap,
                start: pool.lens[slot],
            })
            .collect();
        let n = positions.len();
        let at = Tensor::from_vec(positions, &[n], &self.device)?;
        let Some((cos, sin, local)) = &pool.tables else {
            unreachable!("a reserved pool has rope tables")
        };
        let (cos, sin) = (cos.index_select(0, &at)?, sin.index_select(0, &at)?);
        let local = match local {
            Some((lc, ls)) => Some((lc.index_select(0, &at)?, ls.index_select(0, &at)?)),
            None => None,
        };
        let window = c.gemma.as_ref().and_then(|g| g.sliding_window);
        let global = CacheSeqs::new(&seqs, None, &self.device)?;
        let windowed = match window {
            Some(w) => Some(CacheSeqs::new(&seqs, Some(w), &self.device)?),
            None => None,
        };
        let mut x = match picks {
            None => self.embed_rows(ids)?,
            Some(p) => {
                let p = p.to_device(&self.device)?;
                // the usual decode step feeds every pick in order: no gather
                let in_order = picked.len() == p.shape()[0]
                    && picked.iter().enumerate().all(|(i, q)| q.row == i);
                let from_device = if in_order {
                    p
                } else {
                    let rows: Vec<u32> = picked.iter().map(|q| q.row as u32).collect();
                    let rows = Tensor::from_vec(rows, &[picked.len()], &self.device)?;
                    p.index_select(0, &rows)?
                };
                let all = if ids.is_empty() {
                    from_device
                } else {
                    let n = ids.len();
                    let host = Tensor::from_vec(ids, &[n], &self.device)?;
                    Tensor::cat(&[&host, &from_device], 0)?
                };
                self.embed_tensor(&all)?
            }
        };
        let h = c.n_heads;
        for li in 0..c.n_layers {
            let cache = &mut pool.kv[li];
            x = self.block(li, x, &mut NoTaps, |qkv| {
                let gemma = c.gemma.as_ref();
                let w = gemma.and_then(|g| g.window(li));
                let (table, rope) = match (w, &windowed, &local) {
                    (Some(_), Some(t), Some((lc, ls))) => (t, (lc, ls, c.rope_style)),
                    (Some(_), Some(t), None) => (t, (&cos, &sin, c.rope_style)),
                    _ => (&global, (&cos, &sin, c.rope_style)),
                };
                let opts = CachedAttentionOpts {
                    scale: c.attention_scale,
                    window: w,
                    softcap: gemma.and_then(|g| g.attn_softcap),
                };
                Ok(qkv.cached_attention_batch(cache, table, rope, h, opts)?)
            })?;
        }
        for (&slot, &len) in slots.iter().zip(&lens) {
            pool.lens[slot] += len;
        }
        self.last_logits(&x, last)
    }
}

/// A sequence of a pooled step whose one new token is row `row` of a
/// tensor on the device (see [`Llama::forward_pooled_picked`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PickedStep {
    pub slot: usize,
    pub row: usize,
}

/// One sequence's part of a pooled step: the tokens after those its slot
/// holds.
pub struct PoolStep<'a> {
    pub slot: usize,
    pub ids: &'a [u32],
}

/// cos and sin of every position a slot holds, and Gemma's local pair.
type PoolTables = (Tensor, Tensor, Option<(Tensor, Tensor)>);

/// The KV caches of up to `slots` sequences as runs of rows of one tensor
/// per layer, so that a batched step attends over all of them with one op
/// (see [`Llama::forward_pooled`]). Every slot has room for the same
/// number of positions, which doubles (up to the model's context) when a
/// sequence needs more.
pub struct KvPool {
    /// Per layer, `[slots × capacity, 2 KVH, head_dim]`.
    kv: Vec<Tensor>,
    /// The rotation tables for `capacity` positions (and Gemma's local ones).
    tables: Option<PoolTables>,
    capacity: usize,
    lens: Vec<usize>,
    used: Vec<bool>,
    /// Positions a free slot still holds from its last sequence, for
    /// [`KvPool::acquire_at`] (0 for used slots).
    kept: Vec<usize>,
}

impl KvPool {
    /// A free slot, marked used and empty; `None` when every slot is used.
    pub fn acquire(&mut self) -> Option<usize> {
        let slot = self.used.iter().position(|u| !u)?;
        self.acquire_at(slot, 0);
        Some(slot)
    }

    /// Takes free slot `slot` with the first `keep` of the positions it
    /// kept from its last sequence (at most [`KvPool::kept`]): the
    /// positions it holds now, to which the next step's tokens go. `None`
    /// when the slot does not exist or is in use.
    pub fn acquire_at(&mut self, slot: usize, keep: usize) -> Option<usize> {
        if self.used.get(slot) != Some(&false) {
            return None;
        }
        let keep = keep.min(self.kept[slot]);
        self.used[slot] = true;
        self.lens[slot] = keep;
        self.kept[slot] = 0;
        Some(keep)
    }

    /// Frees `slot` (its positions are forgotten).
    pub fn release(&mut self, slot: usize) {
        self.release_keeping(slot, 0);
    }

    /// Frees `slot`, keeping its first `keep` positions (at most those it
    /// holds) for a later sequence that starts with the same tokens
    /// ([`KvPool::acquire_at`]). Work already queued on the slot still
    /// lands there, before any step queued after this.
    pub fn release_keeping(&mut self, slot: usize, keep: usize) {
        if self.used.get(slot) == Some(&true) {
            self.used[slot] = false;
            self.kept[slot] = keep.min(self.lens[slot]);
            self.lens[slot] = 0;
        }
    }

    /// Whether `slot` is taken by a sequence.
    pub fn in_use(&self, slot: usize) -> bool {
        self.used.get(slot) == Some(&true)
    }

    /// Positions free slot `slot` kept from its last sequence.
    pub fn kept(&self, slot: usize) -> usize {
        self.kept.get(slot).copied().unwrap_or(0)
    }

    /// Positions `slot` holds.
    pub fn len(&self, slot: usize) -> usize {
        self.lens.get(slot).copied().unwrap_or(0)
    }

    /// The number of slots.
    pub fn slots(&self) -> usize {
        self.lens.len()
    }

    /// Positions each slot has room for before the pool grows.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}
