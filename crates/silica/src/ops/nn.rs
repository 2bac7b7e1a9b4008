//! Fused transformer ops: RMSNorm, LayerNorm, rotary embeddings and
//! scaled dot-product attention. Each runs as one kernel, where the same
//! computation written with elementwise ops and matmuls would launch many.

use crate::dispatch::run;
use crate::{DType, Error, Op, Result, Tensor};

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// `(x[2i], x[2i+1])`: GGUF files of llama-type models (the converter
    /// permutes the Q/K weights for this), GPT-J.
    Adjacent,
    /// `(x[i], x[i + d/2])`: Hugging Face's rotate-half (Llama and Qwen2
    /// checkpoints in safetensors, Qwen2 in GGUF too).
    Half,
}

/// Parameters of [`Tensor::attention`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionOpts {
    /// Multiplies `q · k` before the softmax; usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// Query `i` sees keys `0..=i + (Tk - Tq)`: the queries are the last
    /// `Tq` positions of the `Tk` keys (a decode step over a KV cache, or a
    /// whole prompt when `Tq == Tk`).
    pub causal: bool,
}

impl AttentionOpts {
    /// Causal attention with the usual `1 / sqrt(head_dim)` scale.
    pub fn causal(head_dim: usize) -> Self {
        Self {
            scale: 1.0 / (head_dim as f32).sqrt(),
            causal: true,
        }
    }
}

/// Parameters of [`Tensor::cached_attention_with`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CachedAttentionOpts {
    /// Multiplies `q · k`; usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// A sliding window: the query at position `p` sees the keys at
    /// `p - window + 1 ..= p` only (`None`: every earlier key).
    pub window: Option<usize>,
    /// Soft-capping of the scaled scores, `cap · tanh(s / cap)`, before
    /// the softmax (`None`: none).
    pub softcap: Option<f32>,
}

impl CachedAttentionOpts {
    /// Plain causal attention with `scale`.
    pub fn scaled(scale: f32) -> Self {
        Self {
            scale,
            window: None,
            softcap: None,
        }
    }
}

/// One sequence of [`Tensor::cached_attention_batch`]: its `len` new
/// positions (rows of the stacked projection, after those of the
/// sequences before it), after the `start` it has cached in the rows of
/// the shared cache from `base` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheSeq {
    pub len: usize,
    pub base: usize,
    pub start: usize,
}

/// The sequences of a batched attention step with the window they attend
/// through, made once for the layers that share them (a step's table of
/// where each sequence's keys start goes to the device once).
#[derive(Clone, Debug)]
pub struct CacheSeqs {
    seqs: Vec<CacheSeq>,
    window: Option<usize>,
    /// U32 `[2 B]`: each sequence's first key row and key count, the
    /// new position's included (for the batched kernel).
    table: Tensor,
}

impl CacheSeqs {
    /// `seqs` attending through `window` (`None`: every cached key), their
    /// table on `device`.
    pub fn new(seqs: &[CacheSeq], window: Option<usize>, device: &crate::Device) -> Result<Self> {
        if seqs.is_empty() || seqs.iter().any(|s| s.len == 0) || window == Some(0) {
            return Err(Error::InvalidArgument {
                op: "cached_attention_batch",
                msg: format!(
                    "needs sequences of at least one new position and a positive window, \
                     not {seqs:?} with window {window:?}"
                ),
            });
        }
        let mut words = Vec::with_capacity(2 * seqs.len());
        for s in seqs {
            let total = s.start + s.len;
            let first = window.map_or(0, |w| (s.start + 1).saturating_sub(w));
            let fits = |v: usize| u32::try_from(v).ok();
            let (Some(row), Some(keys)) = (fits(s.base + first), fits(total - first)) else {
                return Err(Error::InvalidArgument {
                    op: "cached_attention_batch",
                    msg: format!("cache rows past u32 in {s:?}"),
                });
            };
            words.extend([row, keys]);
        }
        let table = Tensor::from_vec(words, &[2 * seqs.len()], device)?;
        Ok(Self {
            seqs: seqs.to_vec(),
            window,
            table,
        })
    }

    pub fn seqs(&self) -> &[CacheSeq] {
        &self.seqs
    }
}

/// A norm's weight or bias as the kernels read it: contiguous from the
/// start of its storage (the GPU kernels take no offset for these, so a
/// narrowed view, such as one row of a stacked parameter, is copied).
fn packed_row_param(p: &Tensor) -> Result<Tensor> {
    if p.is_contiguous() && p.layout().offset() == 0 {
        Ok(p.clone())
    } else {
        p.copy()
    }
}

impl Tensor {
    fn check_row_param(&self, op: &'static str, name: &str, p: &Tensor) -> Result<()> {
        self.same_device(p, op)?;
        let n = *self.shape().last().unwrap_or(&0);
        if p.shape() != [n] {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "{name} has shape {:?}, expected [{n}] for input {:?}",
                    p.shape(),
                    self.shape()
                ),
            });
        }
        if p.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: self.dtype(),
                rhs: p.dtype(),
            });
        }
        Ok(())
    }

    /// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) * weight`,
    /// computed in f32 whatever the dtype (squares of activations overflow
    /// f16) and rounded once.
    ///
    /// ```
    /// use silica::{Device, Tensor};
    /// let dev = Device::cpu();
    /// let x = Tensor::from_slice(&[3.0f32, 4.0], &[1, 2], &dev)?;
    /// let w = Tensor::from_slice(&[1.0f32, 2.0], &[2], &dev)?;
    /// let y: Vec<f32> = x.rms_norm(&w, 0.0)?.to_vec()?;
    /// let r = (12.5f32).sqrt();
    /// assert!((y[0] - 3.0 / r).abs() < 1e-6 && (y[1] - 8.0 / r).abs() < 1e-6);
    /// # Ok::<(), silica::Error>(())
    /// ```
    pub fn rms_norm(&self, weight: &Tensor, eps: f32) -> Result<Tensor> {
        let op = Op::RmsNorm { eps };
        self.require_rank(op.name(), 1)?;
        self.check_row_param(op.name(), "weight", weight)?;
        let w = packed_row_param(weight)?;
        run(op, &[self, &w], self.shape().to_vec(), self.dtype())
    }

    /// `self.rms_norm(weight, eps) + residual` (`residual` of `self`'s
    /// shape and dtype), rounded once: a norm after a product before its
    /// residual sum (Gemma's post-attention and post-feed-forward norms).
    /// One kernel on a GPU where the rows can be read as whole words.
    pub fn rms_norm_add(&self, weight: &Tensor, eps: f32, residual: &Tensor) -> Result<Tensor> {
        let name = "rms_norm_add";
        self.require_rank(name, 1)?;
        self.check_row_param(name, "weight", weight)?;
        self.same_device(residual, name)?;
        if residual.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: name,
                lhs: self.dtype(),
                rhs: residual.dtype(),
            });
        }
        if residual.shape() != self.shape() {
            return Err(Error::ShapeMismatch {
                op: name,
                lhs: self.shape().to_vec(),
                rhs: residual.shape().to_vec(),
                hint: "the residual has the normed tensor's shape".into(),
            });
        }
        let w = packed_row_param(weight)?;
        let op = crate::fused::RmsNormAdd { eps };
        crate::custom::apply(&op, &[self, &w, residual])
    }

    /// LayerNorm over the last dimension: `(x - mean) / sqrt(var + eps) *
    /// weight + bias`, computed in f32 and rounded once.
    pub fn layer_norm(&self, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<Tensor> {
        let op = Op::LayerNorm { eps };
        self.require_rank(op.name(), 1)?;
        self.check_row_param(op.name(), "weight", weight)?;
        self.check_row_param(op.name(), "bias", bias)?;
        let w = packed_row_param(weight)?;
        let b = packed_row_param(bias)?;
        run(op, &[self, &w, &b], self.shape().to_vec(), self.dtype())
    }

    /// Rotary position embeddings. `self` is `[.., T, H, D]` (T positions, H
    /// heads of D dimensions, D even); `cos` and `sin` are F32 `[T, D / 2]`:
    /// the angles of pair `i` at each position. Each pair `(x0, x1)` becomes
    /// `(x0 cos - x1 sin, x0 sin + x1 cos)`; `style` says which dimensions
    /// pair up.
    pub fn rope(&self, cos: &Tensor, sin: &Tensor, style: RopeStyle) -> Result<Tensor> {
        self.rope_heads(cos, sin, style, usize::MAX)
    }

    /// [`Tensor::rope`] of the first `rotated` heads, the others copied
    /// unchanged: the queries and keys of a packed `[T, Q + K + V heads, D]`
    /// projection rotated (and the values carried along) in one kernel.
    pub fn rope_heads(
        &self,
        cos: &Tensor,
        sin: &Tensor,
        style: RopeStyle,
        rotated: usize,
    ) -> Result<Tensor> {
        let op = Op::Rope { style, rotated };
        self.require_rank(op.name(), 3)?;
        let r = self.rank();
        let (t, d) = (self.shape()[r - 3], self.shape()[r - 1]);
        if d % 2 != 0 {
            return Err(Error::InvalidArgument {
                op: op.name(),
                msg: format!("head size {d} of {:?} is odd", self.shape()),
            });
        }
        for (name, table) in [("cos", cos), ("sin", sin)] {
            self.same_device(table, op.name())?;
            if table.shape() != [t, d / 2] || table.dtype() != DType::F32 {
                return Err(Error::InvalidArgument {
                    op: op.name(),
                    msg: format!(
                        "{name} is {:?} {}, expected [{t}, {}] f32 for input {:?}",
                        table.shape(),
                        table.dtype(),
                        d / 2,
                        self.shape()
                    ),
                });
            }
        }
        let (cos, sin) = (cos.contiguous()?, sin.contiguous()?);
        run(op, &[self, &cos, &sin], self.shape().to_vec(), self.dtype())
    }

    /// Scaled dot-product attention, `softmax(q kᵀ · scale + mask) v`, with
    /// an online softmax (no `[Tq, Tk]` score matrix is stored): one kernel,
    /// or on a GPU for up to 4 queries two (chunks of keys, then their merge).
    ///
    /// - `self` (the queries) is `[B, Tq, H, D]` or `[Tq, H, D]`;
    /// - `k` and `v` are `[B, Tk, KVH, D]` or `[Tk, KVH, D]`, where KVH
    ///   divides H: query head `h` reads KV head `h / (H / KVH)` (grouped-
    ///   and multi-query attention need no copy of K and V);
    /// - `mask`, if given, is added to the scores and broadcasts to
    ///   `[B, H, Tq, Tk]` (a padding mask `[B, 1, 1, Tk]`, for example);
    ///   `-inf` hides a key.
    ///
    /// The result has the queries' shape. A query that sees no key at all
    /// (every score `-inf`) gives NaN, as in PyTorch.
    pub fn attention(
        &self,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        opts: AttentionOpts,
    ) -> Result<Tensor> {
        let op = Op::Attention {
            scale: opts.scale,
            causal: opts.causal,
        };
        let name = op.name();
        let bad = |msg: String| Error::InvalidArgument { op: name, msg };
        let rank = self.rank();
        if !(rank == 3 || rank == 4) || k.rank() != rank || v.rank() != rank {
            return Err(bad(format!(
                "q {:?}, k {:?} and v {:?} must all be [B, T, heads, D] or [T, heads, D]",
                self.shape(),
                k.shape(),
                v.shape()
            )));
        }
        for other in [k, v] {
            self.same_device(other, name)?;
            if other.dtype() != self.dtype() {
                return Err(Error::DTypeMismatch {
                    op: name,
                    lhs: self.dtype(),
                    rhs: other.dtype(),
                });
            }
        }
        let q4 = if rank == 3 {
            self.unsqueeze(0)?
        } else {
            self.clone()
        };
        let k4 = if rank == 3 {
            k.unsqueeze(0)?
        } else {
            k.clone()
        };
        let v4 = if rank == 3 {
            v.unsqueeze(0)?
        } else {
            v.clone()
        };
        let [b, tq, h, d] = [q4.shape()[0], q4.shape()[1], q4.shape()[2], q4.shape()[3]];
        let [kb, tk, kvh, kd] = [k4.shape()[0], k4.shape()[1], k4.shape()[2], k4.shape()[3]];
        if k4.shape() != v4.shape() || kb != b || kd != d || kvh == 0 || h % kvh != 0 {
            return Err(bad(format!(
                "q {:?}, k {:?}, v {:?}: k and v must match, share q's batch and head size, \
                 and their head count must divide q's",
                self.shape(),
                k.shape(),
                v.shape()
            )));
        }
        if d % 2 != 0 || d > 256 {
            return Err(bad(format!("head size {d} must be even and at most 256")));
        }
        if opts.causal && tq > tk {
            return Err(bad(format!(
                "causal attention of {tq} queries over {tk} keys: the queries must be the last positions"
            )));
        }
        let mut inputs = vec![q4, k4, v4];
        if let Some(m) = mask {
            self.same_device(m, name)?;
            if m.dtype() != self.dtype() {
                return Err(Error::DTypeMismatch {
                    op: name,
                    lhs: self.dtype(),
                    rhs: m.dtype(),
                });
            }
            inputs.push(m.broadcast_to(&[b, h, tq, tk])?);
        }
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let out = run(op, &refs, vec![b, tq, h, d], self.dtype())?;
        if rank == 3 { out.squeeze(0) } else { Ok(out) }
    }

    /// One step of causal attention over a KV cache, rotary embedding and
    /// cache update included: what a decoder layer does between its QKV
    /// projection and its output projection.
    ///
    /// - `self` is `[T, H + 2 KVH, D]`: the queries, keys and values of `T`
    ///   new positions side by side, as one stacked projection gives them,
    ///   not yet rotated;
    /// - `cache` is `[capacity, 2 KVH, D]`: the keys of positions `0..start`
    ///   in heads `0..KVH`, their values in heads `KVH..2 KVH`. The step
    ///   writes positions `start..start + T` into it in place (keys
    ///   rotated); like [`Tensor::slice_assign`], a cache whose storage is
    ///   shared with another tensor first gets its own copy;
    /// - `rope` is the angle tables `cos` and `sin`, F32 `[T, D / 2]`, of
    ///   the new positions (as in [`Tensor::rope`]) and the pairing style;
    /// - `heads` is `H`, a multiple of `KVH`; `scale` multiplies `q · k`.
    ///
    /// Returns `[T, H, D]`: each new query, rotated, attends to the keys up
    /// to its own position. The result equals [`Tensor::rope_heads`], then
    /// [`Tensor::slice_assign`], then [`Tensor::attention`] over the cache's
    /// first `start + T` rows; on a GPU a single new position (a decode
    /// step) runs as one kernel instead of three.
    pub fn cached_attention(
        &self,
        cache: &mut Tensor,
        start: usize,
        rope: (&Tensor, &Tensor, RopeStyle),
        heads: usize,
        scale: f32,
    ) -> Result<Tensor> {
        let opts = CachedAttentionOpts::scaled(scale);
        self.cached_attention_with(cache, start, rope, heads, opts)
    }

    /// [`Tensor::cached_attention`] with a sliding window and soft-capped
    /// scores (Gemma's attention) where `opts` has them. A decode step on
    /// a GPU stays one kernel with either; the window's keys are the
    /// cache's rows from `start + 1 - window` on, so a step reads no more
    /// than the window whatever the cache holds.
    pub fn cached_attention_with(
        &self,
        cache: &mut Tensor,
        start: usize,
        rope: (&Tensor, &Tensor, RopeStyle),
        heads: usize,
        opts: CachedAttentionOpts,
    ) -> Result<Tensor> {
        self.check_step(cache, start, heads, opts)?;
        let d = self.shape()[2];
        let t = self.shape()[0];
        let (cos, sin, style) = rope;
        // the fused kernel checks nothing of the tables: rope_heads' checks
        // below run for any other table
        let tables_fit = [cos, sin]
            .iter()
            .all(|x| x.shape() == [1, d / 2] && x.dtype() == DType::F32);
        if self.device().is_gpu() && t == 1 && tables_fit {
            let step = crate::fused::AttentionStep {
                start,
                style,
                heads,
                scale: opts.scale,
                window: opts.window,
                softcap: opts.softcap,
            };
            return crate::custom::apply_in_place(&step, &[self, cos, sin], &mut [cache]);
        }
        self.cached_attention_composed(cache, 0, start, rope, heads, opts)
    }

    /// The checks of [`Tensor::cached_attention_with`] but the tables'.
    fn check_step(
        &self,
        cache: &Tensor,
        start: usize,
        heads: usize,
        opts: CachedAttentionOpts,
    ) -> Result<()> {
        let name = "cached_attention";
        let bad = |msg: String| Error::InvalidArgument { op: name, msg };
        self.same_device(cache, name)?;
        if cache.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: name,
                lhs: self.dtype(),
                rhs: cache.dtype(),
            });
        }
        if self.rank() != 3 || cache.rank() != 3 {
            return Err(bad(format!(
                "qkv {:?} must be [T, heads, D] and the cache {:?} [capacity, 2 KV heads, D]",
                self.shape(),
                cache.shape()
            )));
        }
        let [t, packed, d] = [self.shape()[0], self.shape()[1], self.shape()[2]];
        let [capacity, kv2, cd] = [cache.shape()[0], cache.shape()[1], cache.shape()[2]];
        let kvh = kv2 / 2;
        let fits = cd == d
            && kv2.is_multiple_of(2)
            && kvh > 0
            && heads.is_multiple_of(kvh)
            && packed == heads + kv2
            && start.checked_add(t).is_some_and(|end| end <= capacity);
        if !fits {
            return Err(bad(format!(
                "qkv {:?} with {heads} query heads, cache {:?}, {t} positions at {start}: \
                 qkv must hold the query heads and the cache's key and value heads, the \
                 query heads a multiple of the KV heads, the positions inside the cache",
                self.shape(),
                cache.shape()
            )));
        }
        if opts.window == Some(0) || opts.softcap.is_some_and(|c| !(c > 0.0 && c.is_finite())) {
            return Err(bad(format!(
                "the window {:?} must be positive and the soft cap {:?} positive and finite",
                opts.window, opts.softcap
            )));
        }
        Ok(())
    }

    /// [`Tensor::cached_attention_with`] for several sequences at once,
    /// whose caches are runs of rows of one `cache` (a server's pool):
    /// `self` stacks the sequences' new rows in the order of `seqs`, and
    /// `cos` and `sin` their angles row for row. Each sequence writes its
    /// rows at `base + start ..` and attends over its own keys only. On a
    /// GPU, a step where every sequence has one new position runs as one
    /// kernel for all of them, instead of one for each; otherwise each
    /// sequence goes as [`Tensor::cached_attention_with`] would. The
    /// caller keeps the sequences' runs of rows apart.
    pub fn cached_attention_batch(
        &self,
        cache: &mut Tensor,
        seqs: &CacheSeqs,
        rope: (&Tensor, &Tensor, RopeStyle),
        heads: usize,
        opts: CachedAttentionOpts,
    ) -> Result<Tensor> {
        let name = "cached_attention_batch";
        let bad = |msg: String| Error::InvalidArgument { op: name, msg };
        self.same_device(cache, name)?;
        self.same_device(&seqs.table, name)?;
        if cache.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: name,
                lhs: self.dtype(),
                rhs: cache.dtype(),
            });
        }
        let rows: usize = seqs.seqs.iter().map(|s| s.len).sum();
        let cache_rows = if cache.rank() == 3 {
            cache.shape()[0]
        } else {
            0
        };
        let in_cache = seqs
            .seqs
            .iter()
            .all(|s| s.base + s.start + s.len <= cache_rows);
        if self.rank() != 3 || self.shape()[0] != rows || !in_cache || seqs.window != opts.window {
            return Err(bad(format!(
                "qkv {:?} must hold the {rows} new rows of {:?}, each inside the cache {:?}, \
                 with the sequences' window {:?} in the options",
                self.shape(),
                seqs.seqs,
                cache.shape(),
                seqs.window
            )));
        }
        let (cos, sin, style) = rope;
        let tables_fit = [cos, sin]
            .iter()
            .all(|x| x.rank() == 2 && x.shape()[0] == rows && x.dtype() == DType::F32);
        if !tables_fit {
            return Err(bad(format!(
                "the angle tables {:?} and {:?} must be F32 with a row for each of the {rows} new rows",
                cos.shape(),
                sin.shape()
            )));
        }
        let op = crate::fused::BatchAttentionStep {
            seqs: seqs.seqs.clone(),
            style,
            heads,
            scale: opts.scale,
            window: opts.window,
            softcap: opts.softcap,
        };
        // the single step's checks (heads, sizes) on the first sequence's rows
        let first = seqs.seqs[0];
        let probe = self.narrow(0, 0, first.len)?;
        probe.check_step(cache, first.base + first.start, heads, opts)?;
        let (cos, sin) = (cos.contiguous()?, sin.contiguous()?);
        crate::custom::apply_in_place(&op, &[self, &cos, &sin, &seqs.table], &mut [cache])
    }

    /// Attention with tanh soft-capping of the scores (Gemma 2's), composed
    /// from matmuls: `softmax(cap · tanh(q kᵀ · scale / cap) + mask) v`,
    /// with `self` (q) `[t, H, D]`, `k` and `v` `[tk, KVH, D]` (query head
    /// `h` reads KV head `h / (H / KVH)`) and an additive `mask` `[t, tk]`
    /// (none: every key is seen). Returns `[t, H, D]`.
    pub fn softcapped_attention(
        &self,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        scale: f32,
        cap: f32,
    ) -> Result<Tensor> {
        let name = "softcapped_attention";
        let fits = self.rank() == 3
            && k.rank() == 3
            && v.shape() == k.shape()
            && k.shape()[2] == self.shape()[2]
            && k.shape()[1] > 0
            && self.shape()[1].is_multiple_of(k.shape()[1])
            && mask.is_none_or(|m| m.shape() == [self.shape()[0], k.shape()[0]]);
        if !(fits && cap > 0.0 && cap.is_finite()) {
            return Err(Error::InvalidArgument {
                op: name,
                msg: format!(
                    "q {:?}, k {:?}, v {:?}, mask {:?}, cap {cap}: q [t, H, D], k and v [tk, KVH, D] \
                     with H a multiple of KVH, the mask [t, tk], a positive finite cap",
                    self.shape(),
                    k.shape(),
                    v.shape(),
                    mask.map(|m| m.shape().to_vec())
                ),
            });
        }
        let q = self;
        let [t, h, d] = [q.shape()[0], q.shape()[1], q.shape()[2]];
        let [tk, kvh] = [k.shape()[0], k.shape()[1]];
        let group = h / kvh;
        // [KVH, group · t, D]: the query heads of each KV head one after another
        let qh = q
            .permute(&[1, 0, 2])?
            .contiguous()?
            .reshape(&[kvh, group * t, d])?;
        let scores = qh.matmul(&k.permute(&[1, 2, 0])?)?; // [KVH, group · t, tk]
        let mut scores = scores.mul_scalar(scale / cap)?.tanh()?.mul_scalar(cap)?;
        if let Some(m) = mask {
            scores =
                scores
                    .reshape(&[kvh, group, t, tk])?
                    .add(m)?
                    .reshape(&[kvh, group * t, tk])?;
        }
        let out = scores.softmax(-1)?.matmul(&v.permute(&[1, 0, 2])?)?; // [KVH, group · t, D]
        out.reshape(&[h, t, d])?.permute(&[1, 0, 2])?.contiguous()
    }

    /// RMSNorm of each query head and each key head of a packed QKV tensor,
    /// before the rotation (Qwen3's and Gemma 3's head norms): `self` is
    /// `[T, q_heads + k_heads + rest, D]`; heads `0..q_heads` are normalized
    /// with `q_weight` `[D]`, the next `k_heads` with `k_weight`, the rest
    /// (the value heads) are copied. One kernel on a GPU for f32 and f16;
    /// the same as [`Tensor::narrow`], [`Tensor::rms_norm`] and
    /// [`Tensor::cat`] elsewhere.
    pub fn head_norm(
        &self,
        q_weight: &Tensor,
        k_weight: &Tensor,
        q_heads: usize,
        k_heads: usize,
        eps: f32,
    ) -> Result<Tensor> {
        let name = "head_norm";
        for w in [q_weight, k_weight] {
            self.same_device(w, name)?;
            if w.dtype() != self.dtype() {
                return Err(Error::DTypeMismatch {
                    op: name,
                    lhs: self.dtype(),
                    rhs: w.dtype(),
                });
            }
        }
        let fits = self.rank() == 3
            && q_heads + k_heads <= self.shape()[1]
            && [q_weight, k_weight]
                .iter()
                .all(|w| w.shape() == [self.shape()[2]]);
        if !fits {
            return Err(Error::InvalidArgument {
                op: name,
                msg: format!(
                    "qkv {:?} must be [T, heads, D] with at least {q_heads} + {k_heads} heads, \
                     the weights [D], not {:?} and {:?}",
                    self.shape(),
                    q_weight.shape(),
                    k_weight.shape()
                ),
            });
        }
        let op = crate::fused::HeadNorm {
            q_heads,
            k_heads,
            eps,
        };
        let x = if self.is_contiguous() {
            self.clone()
        } else {
            self.contiguous()?
        };
        crate::custom::apply(&op, &[&x, q_weight, k_weight])
    }

    /// [`Tensor::cached_attention_with`] as rope, a cache update and
    /// attention over the keys in reach (operands already checked), for a
    /// sequence whose position 0 is the cache's row `base`: a window that
    /// hides keys from some query, or soft-capping, needs a mask of
    /// several queries and, with soft-capping, the scores composed from
    /// matmuls.
    pub(crate) fn cached_attention_composed(
        &self,
        cache: &mut Tensor,
        base: usize,
        start: usize,
        (cos, sin, style): (&Tensor, &Tensor, RopeStyle),
        heads: usize,
        opts: CachedAttentionOpts,
    ) -> Result<Tensor> {
        let t = self.shape()[0];
        let total = start + t;
        let kv2 = cache.shape()[1];
        let kvh = kv2 / 2;
        let rotated = self.rope_heads(cos, sin, style, heads + kvh)?;
        cache.slice_assign(base + start, &rotated.narrow(1, heads, kv2)?)?;
        // the first key the first query sees
        let lo = opts.window.map_or(0, |w| (start + 1).saturating_sub(w));
        let keys = cache.narrow(0, base + lo, total - lo)?;
        let (k, v) = (keys.narrow(1, 0, kvh)?, keys.narrow(1, kvh, kvh)?);
        let q = rotated.narrow(1, 0, heads)?;
        // a later query loses keys the first one sees
        let cut = t > 1 && opts.window.is_some_and(|w| total - lo > w);
        let mask = if cut || (t > 1 && opts.softcap.is_some()) {
            Some(window_mask(
                start..total,
                lo..total,
                opts.window,
                self.dtype(),
                self.device(),
            )?)
        } else {
            None
        };
        match opts.softcap {
            None => {
                let causal = AttentionOpts {
                    scale: opts.scale,
                    causal: true,
                };
                q.attention(&k, &v, mask.as_ref(), causal)
            }
            Some(cap) => q.softcapped_attention(&k, &v, mask.as_ref(), opts.scale, cap),
        }
    }

    fn require_rank(&self, op: &'static str, min: usize) -> Result<()> {
        if self.rank() < min {
            return Err(Error::InvalidArgument {
                op,
                msg: format!("needs at least {min} dimensions, got {:?}", self.shape()),
            });
        }
        Ok(())
    }
}

/// The additive mask `[queries, keys]` of the queries at the positions
/// `queries` over the keys at the positions `keys`: 0 where a query sees a
/// key (at or before it, and with a `window` less than `window` positions
/// back), `-inf` elsewhere.
fn window_mask(
    queries: std::ops::Range<usize>,
    keys: std::ops::Range<usize>,
    window: Option<usize>,
    dtype: DType,
    device: &crate::Device,
) -> Result<Tensor> {
    let (t, tk) = (queries.len(), keys.len());
    let mut m = Vec::with_capacity(t * tk);
    for q in queries {
        m.extend(keys.clone().map(|k| {
            let seen = k <= q && window.is_none_or(|w| q - k < w);
            if seen { 0.0 } else { f32::NEG_INFINITY }
        }));
    }
    Tensor::from_vec(m, &[t, tk], &crate::Device::cpu())?
        .to_dtype(dtype)?
        .to_device(device)
}
