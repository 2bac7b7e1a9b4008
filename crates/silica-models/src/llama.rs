//! Llama-family decoders (Llama 2/3, Mistral, Qwen2, SmolLM) from GGUF.
//!
//! Matrices stored in a GGML block format stay in it on the device and are
//! decoded inside the matmul kernels (`QTensor`, `Tensor::matmul_q`); the
//! other weights are converted to the compute dtype at load
//! (`LoadOptions::dequantize` decodes everything at load instead). The forward pass uses silica's
//! fused ops (RMSNorm, RoPE, attention, SwiGLU) and runs on every device;
//! the Q/K/V projections and the gate/up projections are each one matmul
//! over weights concatenated at load. The KV cache is a pair of device
//! tensors per layer, preallocated and appended to in place.

use std::path::Path;

pub use silica::RopeStyle;
use silica::{AttentionOpts, DType, Device, QFuse, QTensor, QuantFormat, Tensor};

use crate::gguf::GgufFile;
use crate::quant;
use crate::{Error, Result};

/// The shape of a model, read from GGUF metadata.
#[derive(Clone, Debug)]
pub struct LlamaConfig {
    pub architecture: String,
    pub n_layers: usize,
    pub d_model: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rope_theta: f64,
    /// Positions are divided by this (linear rope scaling); 1 when absent.
    pub rope_linear_factor: f64,
    pub rope_style: RopeStyle,
    pub rms_eps: f64,
}

const ARCHITECTURES: [&str; 4] = ["llama", "mistral", "qwen2", "smollm"];

impl LlamaConfig {
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let arch = f.get_str("general.architecture")?.to_string();
        if !ARCHITECTURES.contains(&arch.as_str()) {
            return Err(Error::Unsupported {
                path: f.path().to_path_buf(),
                what: format!(
                    "architecture {arch:?} (supported: {})",
                    ARCHITECTURES.join(", ")
                ),
            });
        }
        let key = |k: &str| format!("{arch}.{k}");
        let usize_of = |k: &str| -> Result<usize> { Ok(f.get_u64(&key(k))? as usize) };
        let d_model = usize_of("embedding_length")?;
        let n_heads = usize_of("attention.head_count")?;
        let n_kv_heads = f
            .get(&key("attention.head_count_kv"))
            .and_then(|v| v.as_u64())
            .map_or(n_heads, |v| v as usize);
        let bad = |what: String| Error::Format {
            path: f.path().to_path_buf(),
            offset: 0,
            msg: what,
        };
        if n_heads == 0 || n_kv_heads == 0 || d_model % n_heads != 0 || n_heads % n_kv_heads != 0 {
            return Err(bad(format!(
                "inconsistent attention shape: {d_model} wide, {n_heads} heads, {n_kv_heads} KV heads"
            )));
        }
        let head_dim = f
            .get(&key("rope.dimension_count"))
            .and_then(|v| v.as_u64())
            .map_or(d_model / n_heads, |v| v as usize);
        if head_dim != d_model / n_heads || !head_dim.is_multiple_of(2) {
            return Err(Error::Unsupported {
                path: f.path().to_path_buf(),
                what: format!(
                    "rotary dimension {head_dim} with head size {}",
                    d_model / n_heads
                ),
            });
        }
        let token_count = f
            .get("tokenizer.ggml.tokens")
            .and_then(|v| v.as_array())
            .map(|a| a.len());
        let vocab_size = match f.get(&key("vocab_size")).and_then(|v| v.as_u64()) {
            Some(v) => v as usize,
            None => token_count.ok_or_else(|| Error::Missing {
                path: f.path().to_path_buf(),
                what: format!("{} or tokenizer.ggml.tokens", key("vocab_size")),
            })?,
        };
        let rope_linear_factor = match f.get(&key("rope.scaling.type")).and_then(|v| v.as_str()) {
            None | Some("none") => 1.0,
            Some("linear") => f
                .get(&key("rope.scaling.factor"))
                .and_then(|v| v.as_f64())
                .unwrap_or(1.0),
            Some(other) => {
                return Err(Error::Unsupported {
                    path: f.path().to_path_buf(),
                    what: format!("rope scaling {other:?}"),
                });
            }
        };
        Ok(Self {
            n_layers: usize_of("block_count")?,
            d_model,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim: usize_of("feed_forward_length")?,
            vocab_size,
            context_length: usize_of("context_length")?,
            rope_theta: f
                .get(&key("rope.freq_base"))
                .and_then(|v| v.as_f64())
                .unwrap_or(10_000.0),
            rope_linear_factor,
            rope_style: if arch == "qwen2" {
                RopeStyle::Half
            } else {
                RopeStyle::Adjacent
            },
            rms_eps: f.get_f64(&key("attention.layer_norm_rms_epsilon"))?,
            architecture: arch,
        })
    }
}

/// A linear layer's weight `[out, in]`: a float tensor, or blocks kept
/// quantized on the device.
enum Weight {
    Dense(Tensor),
    Quant(QTensor),
}

impl Weight {
    /// `x @ wᵀ`.
    fn apply(&self, x: &Tensor) -> silica::Result<Tensor> {
        self.fused(x, QFuse::default())
    }

    /// `x @ wᵀ` with the steps around it that `fuse` names: one kernel for
    /// quantized weights on a GPU at decode, the same ops in turn otherwise.
    fn fused(&self, x: &Tensor, fuse: QFuse<'_>) -> silica::Result<Tensor> {
        match self {
            Weight::Quant(w) => x.matmul_q_fused(w, fuse),
            Weight::Dense(w) => {
                let normed;
                let x = match fuse.rms_norm {
                    Some((g, eps)) => {
                        normed = x.rms_norm(g, eps)?;
                        &normed
                    }
                    None => x,
                };
                let mut y = x.matmul(&w.t()?)?;
                if fuse.swiglu {
                    let n = y.dim(-1)? / 2;
                    y = y.narrow(-1, 0, n)?.swiglu(&y.narrow(-1, n, n)?)?;
                }
                match fuse.residual {
                    Some(r) => y.add(r),
                    None => Ok(y),
                }
            }
        }
    }

    /// `residual + x @ wᵀ`.
    fn add_to(&self, x: &Tensor, residual: &Tensor) -> silica::Result<Tensor> {
        let fuse = QFuse {
            residual: Some(residual),
            ..QFuse::default()
        };
        self.fused(x, fuse)
    }
}

/// Projections of one input whose outputs are used side by side (Q, K and
/// V; gate and up): one product over the rows stacked at load when the
/// weights share a storage format, one product per part otherwise (mixed
/// formats, as in Q4_K_M files).
enum Stacked {
    Fused(Weight),
    Split(Vec<Weight>),
}

impl Stacked {
    /// The parts' outputs for `rms_norm(x)` side by side, `[t, rows of
    /// all parts]`, plus `bias` (the parts' biases stacked) where given:
    /// one product (the norm fused in) for stacked weights.
    fn apply(
        &self,
        x: &Tensor,
        norm: (&Tensor, f32),
        bias: Option<&Tensor>,
    ) -> silica::Result<Tensor> {
        let y = match self {
            Stacked::Split(parts) => {
                let hn = x.rms_norm(norm.0, norm.1)?;
                let ys: Vec<Tensor> = parts
                    .iter()
                    .map(|w| w.apply(&hn))
                    .collect::<silica::Result<_>>()?;
                let refs: Vec<&Tensor> = ys.iter().collect();
                Tensor::cat(&refs, -1)?
            }
            Stacked::Fused(w) => {
                let fuse = QFuse {
                    rms_norm: Some(norm),
                    ..QFuse::default()
                };
                w.fused(x, fuse)?
            }
        };
        match bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }

    /// `silu(gate) * up` of `rms_norm(x)` for the gate and up projections:
    /// one kernel for stacked quantized weights on a GPU at decode.
    fn swiglu(&self, x: &Tensor, norm: (&Tensor, f32)) -> silica::Result<Tensor> {
        match self {
            Stacked::Fused(w) => {
                let fuse = QFuse {
                    rms_norm: Some(norm),
                    swiglu: true,
                    ..QFuse::default()
                };
                w.fused(x, fuse)
            }
            Stacked::Split(parts) => {
                let hn = x.rms_norm(norm.0, norm.1)?;
                parts[0].apply(&hn)?.swiglu(&parts[1].apply(&hn)?)
            }
        }
    }
}

struct Layer {
    attn_norm: Tensor,    // [d]
    qkv: Stacked,         // Q [heads * hd, d], K and V [kv_heads * hd, d]
    bqkv: Option<Tensor>, // [(heads + 2 * kv_heads) * hd]
    wo: Weight,           // [d, heads * hd]
    ffn_norm: Tensor,     // [d]
    gate_up: Stacked,     // gate, up [ffn, d]
    w_down: Weight,       // [d, ffn]
}

/// The token embedding: float rows, or quantized rows decoded on lookup.
enum Embedding {
    Dense(Tensor),
    Quant(QTensor),
}

/// How [`Llama::load_with`] places the weights.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Compute dtype of activations and of float weights: f32, f16 or bf16.
    pub dtype: DType,
    /// Decode quantized weights to `dtype` at load instead of keeping them
    /// quantized on the device (the reference path; uses 4-8x the memory).
    pub dequantize: bool,
}

/// A loaded decoder.
pub struct Llama {
    pub config: LlamaConfig,
    device: Device,
    dtype: DType,
    embed: Embedding, // [vocab, d]
    layers: Vec<Layer>,
    out_norm: Tensor, // [d]
    lm_head: Weight,  // [vocab, d] (the embedding when tied)
}

/// Keys and values of the positions seen so far, per layer: `[capacity,
/// 2 * kv_heads, hd]` buffers (the keys' heads, then the values') of which
/// the first `len` rows are filled, and the rotary angle tables
/// `[capacity, hd / 2]` for the same positions.
pub struct KvCache {
    kv: Vec<Tensor>,
    cos: Option<Tensor>,
    sin: Option<Tensor>,
    capacity: usize,
    len: usize,
}

impl KvCache {
    /// Number of positions cached.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Rows of the first cache allocation; the cache doubles from there.
const CACHE_START: usize = 256;

impl Llama {
    /// Loads a GGUF decoder onto `device` with activations in `dtype`,
    /// keeping quantized weights quantized (see [`LoadOptions`]).
    pub fn load(f: &GgufFile, device: &Device, dtype: DType) -> Result<Self> {
        Self::load_with(
            f,
            device,
            LoadOptions {
                dtype,
                dequantize: false,
            },
        )
    }

    /// Loads a GGUF decoder onto `device`. Matrices stored in a block
    /// format silica computes with (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
    /// Q5_K, Q6_K) go to the device as they are in the file unless
    /// `opts.dequantize`; the rest (f32/f16/bf16 matrices, norms, biases)
    /// are converted to `opts.dtype`.
    pub fn load_with(f: &GgufFile, device: &Device, opts: LoadOptions) -> Result<Self> {
        let dtype = opts.dtype;
        let config = LlamaConfig::from_gguf(f)?;
        let info = |name: &str| {
            f.tensor_info(name).ok_or_else(|| Error::Missing {
                path: f.path().to_path_buf(),
                what: format!("tensor '{name}'"),
            })
        };
        let bad_shape = |name: &str, got: &[usize], shape: &[usize]| Error::Format {
            path: f.path().to_path_buf(),
            offset: f.tensor_info(name).map_or(0, |i| i.offset),
            msg: format!("tensor {name} has shape {got:?}, expected {shape:?}"),
        };
        let get = |name: &str, shape: &[usize]| -> Result<Tensor> {
            let (got, values) = f.dequantize(name)?;
            if got != shape {
                return Err(bad_shape(name, &got, shape));
            }
            let t = Tensor::from_vec(values, &got, &Device::cpu())?.to_dtype(dtype)?;
            Ok(t.to_device(device)?)
        };
        let opt = |name: &str, shape: &[usize]| -> Result<Option<Tensor>> {
            if f.tensor_info(name).is_some() {
                get(name, shape).map(Some)
            } else {
                Ok(None)
            }
        };
        // the blocks of a matrix kept quantized: (format, bytes)
        let blocks = |name: &str, shape: &[usize]| -> Result<Option<(QuantFormat, &[u8])>> {
            let i = info(name)?;
            match quant::quant_format(i.ggml_type) {
                Some(fmt) if !opts.dequantize && shape[1].is_multiple_of(fmt.block_elems()) => {
                    if i.shape() != shape {
                        return Err(bad_shape(name, &i.shape(), shape));
                    }
                    Ok(Some((fmt, f.tensor_bytes(i))))
                }
                _ => Ok(None),
            }
        };
        let weight = |name: &str, shape: &[usize]| -> Result<Weight> {
            Ok(match blocks(name, shape)? {
                Some((fmt, bytes)) => {
                    Weight::Quant(QTensor::from_bytes(fmt, shape, bytes, device)?)
                }
                None => Weight::Dense(get(name, shape)?),
            })
        };
        // parts stacked into one matrix when they share a format (the
        // blocks concatenated on the host, one upload)
        let stacked = |names: &[(String, usize)], d: usize| -> Result<Stacked> {
            let parts: Vec<Option<(QuantFormat, &[u8])>> = names
                .iter()
                .map(|(name, n)| blocks(name, &[*n, d]))
                .collect::<Result<_>>()?;
            let rows: usize = names.iter().map(|(_, n)| *n).sum();
            if parts.iter().all(Option::is_none) {
                let dense: Vec<Tensor> = names
                    .iter()
                    .map(|(name, n)| get(name, &[*n, d]))
                    .collect::<Result<_>>()?;
                let refs: Vec<&Tensor> = dense.iter().collect();
                return Ok(Stacked::Fused(Weight::Dense(Tensor::cat(&refs, 0)?)));
            }
            let first = parts[0].map(|(fmt, _)| fmt);
            if parts.iter().all(|p| p.map(|(fmt, _)| fmt) == first)
                && let Some(fmt) = first
            {
                let mut bytes = Vec::with_capacity(fmt.bytes_for(rows * d));
                for (_, b) in parts.iter().flatten() {
                    bytes.extend_from_slice(b);
                }
                let w = QTensor::from_bytes(fmt, &[rows, d], &bytes, device)?;
                return Ok(Stacked::Fused(Weight::Quant(w)));
            }
            Ok(Stacked::Split(
                names
                    .iter()
                    .map(|(name, n)| weight(name, &[*n, d]))
                    .collect::<Result<_>>()?,
            ))
        };
        let d = config.d_model;
        let (qd, kvd) = (
            config.n_heads * config.head_dim,
            config.n_kv_heads * config.head_dim,
        );
        let mut layers = Vec::with_capacity(config.n_layers);
        for i in 0..config.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}");
            let biases = [
                opt(&n("attn_q.bias"), &[qd])?,
                opt(&n("attn_k.bias"), &[kvd])?,
                opt(&n("attn_v.bias"), &[kvd])?,
            ];
            let bqkv = match biases {
                [None, None, None] => None,
                [bq, bk, bv] => {
                    // a missing bias of the three is zero
                    let or_zero = |b: Option<Tensor>, len: usize| match b {
                        Some(b) => Ok::<_, Error>(b),
                        None => Ok(Tensor::zeros(&[len], dtype, device)?),
                    };
                    let parts = [or_zero(bq, qd)?, or_zero(bk, kvd)?, or_zero(bv, kvd)?];
                    Some(Tensor::cat(&[&parts[0], &parts[1], &parts[2]], 0)?)
                }
            };
            let qkv = stacked(
                &[
                    (n("attn_q.weight"), qd),
                    (n("attn_k.weight"), kvd),
                    (n("attn_v.weight"), kvd),
                ],
                d,
            )?;
            let gate_up = stacked(
                &[
                    (n("ffn_gate.weight"), config.ffn_dim),
                    (n("ffn_up.weight"), config.ffn_dim),
                ],
                d,
            )?;
            layers.push(Layer {
                attn_norm: get(&n("attn_norm.weight"), &[d])?,
                qkv,
                bqkv,
                wo: weight(&n("attn_output.weight"), &[d, qd])?,
                ffn_norm: get(&n("ffn_norm.weight"), &[d])?,
                gate_up,
                w_down: weight(&n("ffn_down.weight"), &[d, config.ffn_dim])?,
            });
        }
        let vocab = [config.vocab_size, d];
        let embed = match blocks("token_embd.weight", &vocab)? {
            Some((fmt, bytes)) => {
                Embedding::Quant(QTensor::from_bytes(fmt, &vocab, bytes, device)?)
            }
            None => Embedding::Dense(get("token_embd.weight", &vocab)?),
        };
        let lm_head = match (f.tensor_info("output.weight"), &embed) {
            (Some(_), _) => weight("output.weight", &vocab)?,
            (None, Embedding::Dense(t)) => Weight::Dense(t.clone()),
            (None, Embedding::Quant(q)) => Weight::Quant(q.clone()),
        };
        Ok(Self {
            out_norm: get("output_norm.weight", &[d])?,
            config,
            device: device.clone(),
            dtype,
            embed,
            layers,
            lm_head,
        })
    }

    /// Opens and loads a GGUF file.
    pub fn from_path(path: &Path, device: &Device, dtype: DType) -> Result<Self> {
        Self::load(&GgufFile::open(path)?, device, dtype)
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn new_cache(&self) -> KvCache {
        KvCache {
            kv: Vec::new(),
            cos: None,
            sin: None,
            capacity: 0,
            len: 0,
        }
    }

    /// Builds the GPU kernels of a greedy decode step after `cached`
    /// positions (the step, its f32 logits and their argmax) without running
    /// it (see [`silica::Device::build_kernels_only`]), so that a thread
    /// can do it while another runs the prompt. It uses a cache of its own,
    /// and does nothing where that would take more than the smallest cache
    /// allocation (`CACHE_START` positions), or off the GPU.
    pub fn build_decode_kernels(&self, cached: usize) -> Result<()> {
        if !self.device.is_gpu() || cached + 1 > CACHE_START.min(self.config.context_length) {
            return Ok(());
        }
        self.device.build_kernels_only(|| {
            let mut cache = self.new_cache();
            self.reserve(&mut cache, cached + 1)?;
            cache.len = cached;
            let id = Tensor::zeros(&[1], DType::U32, &self.device)?;
            let logits = self.forward_ids(&id, &mut cache, true)?;
            logits.argmax(-1, false)?;
            Ok(())
        })
    }

    /// cos and sin of the rotation angles of positions `0..n`: `[n, hd / 2]` f32.
    fn rope_tables(&self, n: usize) -> Result<(Tensor, Tensor)> {
        let c = &self.config;
        let half = c.head_dim / 2;
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for p in 0..n {
            let pos = p as f64 / c.rope_linear_factor;
            for i in 0..half {
                let freq = c.rope_theta.powf(-(2.0 * i as f64) / c.head_dim as f64);
                let (s, co) = (pos * freq).sin_cos();
                cos.push(co as f32);
                sin.push(s as f32);
            }
        }
        let mk = |v: Vec<f32>| -> Result<Tensor> {
            Ok(Tensor::from_vec(v, &[n, half], &Device::cpu())?.to_device(&self.device)?)
        };
        Ok((mk(cos)?, mk(sin)?))
    }

    /// Makes room for `total` positions in `cache`, keeping its contents.
    fn reserve(&self, cache: &mut KvCache, total: usize) -> Result<()> {
        if total <= cache.capacity {
            return Ok(());
        }
        let c = &self.config;
        let capacity = total
            .max(CACHE_START)
            .max(cache.capacity * 2)
            .min(c.context_length);
        let shape = [capacity, 2 * c.n_kv_heads, c.head_dim];
        let grow = |old: &Tensor| -> Result<Tensor> {
            let mut t = Tensor::zeros(&shape, self.dtype, &self.device)?;
            t.slice_assign(0, &old.narrow(0, 0, cache.len)?)?;
            Ok(t)
        };
        let mut kv = Vec::with_capacity(c.n_layers);
        for li in 0..c.n_layers {
            kv.push(match cache.kv.get(li) {
                Some(old) => grow(old)?,
                None => Tensor::zeros(&shape, self.dtype, &self.device)?,
            });
        }
        let (cos, sin) = self.rope_tables(capacity)?;
        *cache = KvCache {
            kv,
            cos: Some(cos),
            sin: Some(sin),
            capacity,
            len: cache.len,
        };
        Ok(())
    }

    /// Runs `ids` (the positions after those cached) through the model and
    /// returns f32 logits `[ids.len(), vocab]`, or `[1, vocab]` for the last
    /// position only when `last_only`. On error the cache still holds the
    /// same positions as before.
    pub fn forward(&self, ids: &[u32], cache: &mut KvCache, last_only: bool) -> Result<Tensor> {
        let c = &self.config;
        let t = ids.len();
        if t == 0 {
            return Err(Error::InvalidInput(
                "forward needs at least one token".into(),
            ));
        }
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= c.vocab_size) {
            return Err(Error::InvalidInput(format!(
                "token id {bad} is outside the vocabulary of {} tokens",
                c.vocab_size
            )));
        }
        let ids_t = Tensor::from_slice(ids, &[t], &self.device)?;
        self.forward_ids(&ids_t, cache, last_only)
    }

    /// [`Llama::forward`] for token ids already in a u32 tensor `[t]` on the
    /// model's device, such as the argmax of the previous step's logits:
    /// the step can be queued before that token is read back. The ids are
    /// not checked against the vocabulary here (that would need them on
    /// the host); an argmax over this model's logits is always inside it.
    pub fn forward_ids(
        &self,
        ids_t: &Tensor,
        cache: &mut KvCache,
        last_only: bool,
    ) -> Result<Tensor> {
        let c = &self.config;
        if ids_t.rank() != 1 || ids_t.dtype() != DType::U32 || ids_t.shape()[0] == 0 {
            return Err(Error::InvalidInput(format!(
                "token ids must be a non-empty u32 vector, not {:?} {}",
                ids_t.shape(),
                ids_t.dtype()
            )));
        }
        let t = ids_t.shape()[0];
        let start = cache.len;
        if start + t > c.context_length {
            return Err(Error::InvalidInput(format!(
                "{} positions exceed the model's context of {} tokens",
                start + t,
                c.context_length
            )));
        }
        let (hd, h, kvh) = (c.head_dim, c.n_heads, c.n_kv_heads);
        let total = start + t;
        self.reserve(cache, total)?;
        let (cos, sin) = match (&cache.cos, &cache.sin) {
            (Some(cos), Some(sin)) => (cos.narrow(0, start, t)?, sin.narrow(0, start, t)?),
            // invariant: `reserve` made the tables for at least `total` positions
            _ => unreachable!("a reserved cache has rope tables"),
        };
        let ids_t = ids_t.to_device(&self.device)?;
        let mut x = match &self.embed {
            Embedding::Dense(t) => t.index_select(0, &ids_t)?,
            Embedding::Quant(q) => q.embedding(&ids_t, self.dtype)?,
        }; // [t, d]
        let eps = c.rms_eps as f32;
        let scale = AttentionOpts::causal(hd).scale;
        for (li, l) in self.layers.iter().enumerate() {
            // [t, query heads, then key heads, then value heads, hd]
            let qkv = l
                .qkv
                .apply(&x, (&l.attn_norm, eps), l.bqkv.as_ref())?
                .reshape(&[t, h + 2 * kvh, hd])?;
            // rotates the queries and keys, writes the keys and values at
            // `start..total` (rows past `len` are not part of the cache
            // until the step succeeds) and attends over `0..total`
            let rope = (&cos, &sin, c.rope_style);
            let att = qkv
                .cached_attention(&mut cache.kv[li], start, rope, h, scale)?
                .reshape(&[t, h * hd])?;
            x = l.wo.add_to(&att, &x)?;
            let act = l.gate_up.swiglu(&x, (&l.ffn_norm, eps))?; // [t, ffn]
            x = l.w_down.add_to(&act, &x)?;
        }
        cache.len = total;
        let x = if last_only { x.narrow(0, t - 1, 1)? } else { x };
        let fuse = QFuse {
            rms_norm: Some((&self.out_norm, eps)),
            ..QFuse::default()
        };
        // logits leave in f32 whatever the compute dtype: sampling reads them on the host
        Ok(self.lm_head.fused(&x, fuse)?.to_dtype(DType::F32)?)
    }
}
