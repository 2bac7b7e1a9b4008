//! Llama-family decoders (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM,
//! Gemma 2 and 3, Phi-3) from GGUF.
//!
//! Matrices stored in a GGML block format stay in it on the device and are
//! decoded inside the matmul kernels (`QTensor`, `Tensor::matmul_q`); the
//! other weights are converted to the compute dtype at load
//! (`LoadOptions::dequantize` decodes everything at load instead). The forward pass uses silica's
//! fused ops (RMSNorm, RoPE, attention, SwiGLU) and runs on every device;
//! the Q/K/V projections and the gate/up projections are each one matmul
//! over weights concatenated at load. The KV cache is a pair of device
//! tensors per layer, preallocated and appended to in place. Gemma's
//! additions (sliding windows, soft-capping, GeGLU, post-norms) are in
//! `gemma.rs`; the other architectures never take their path. The shape
//! of a model, as its GGUF metadata gives it, and the rotary angles it
//! implies are in `config.rs`. LoRA adapters ([`Llama::set_adapters`],
//! read by `crate::lora`) add a low-rank update beside each adapted
//! product inside `block`, so every path through it sees them.

use std::path::Path;

pub use silica::RopeStyle;
use silica::{CachedAttentionOpts, DType, Device, QFuse, QTensor, QuantFormat, Tensor};

use crate::gguf::GgufFile;
use crate::lora::{self, LoraAdapter};
use crate::quant;
use crate::{Error, Result};

mod batch;
mod capture;
mod config;
mod gemma;
mod phi3;
use crate::capture::{NoTaps, Site, Taps};
pub use batch::{KvPool, PickedStep, PoolStep, SeqStep};
use config::rope_angles;
pub use config::{LlamaConfig, RopeScaling};
pub use gemma::GemmaConfig;
pub use phi3::Phi3Config;

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
                let gated = fuse.swiglu || fuse.geglu;
                if let (Some(r), None, false) = (fuse.residual, fuse.low_rank, gated) {
                    return x.linear_add(w, r);
                }
                let mut y = x.matmul(&w.t()?)?;
                if let Some((u, b)) = fuse.low_rank {
                    y = y.add(&u.to_dtype(y.dtype())?.matmul(b)?)?;
                }
                if fuse.swiglu || fuse.geglu {
                    let n = y.dim(-1)? / 2;
                    let (gate, up) = (y.narrow(-1, 0, n)?, y.narrow(-1, n, n)?);
                    y = if fuse.geglu {
                        gate.gelu_tanh()?.mul(&up)?
                    } else {
                        gate.swiglu(&up)?
                    };
                }
                match fuse.residual {
                    Some(r) => y.add(r),
                    None => Ok(y),
                }
            }
        }
    }

    /// `x @ wᵀ`, plus the adapters' update where `lora` is given.
    fn apply_with(&self, x: &Tensor, lora: Option<&LowRank>) -> silica::Result<Tensor> {
        self.with_update(x, QFuse::default(), lora)
    }

    /// `residual + x @ wᵀ`, plus the adapters' update where `lora` is
    /// given.
    fn add_to(
        &self,
        x: &Tensor,
        residual: &Tensor,
        lora: Option<&LowRank>,
    ) -> silica::Result<Tensor> {
        let fuse = QFuse {
            residual: Some(residual),
            ..QFuse::default()
        };
        self.with_update(x, fuse, lora)
    }

    /// The product `fuse` describes with the update of `lora` added to it
    /// (in the product's kernel on a GPU at decode).
    fn with_update(
        &self,
        x: &Tensor,
        fuse: QFuse<'_>,
        lora: Option<&LowRank>,
    ) -> silica::Result<Tensor> {
        match lora {
            None => self.fused(x, fuse),
            // the product computes u = x·aᵀ itself (in its GEMV kernel on a
            // GPU: one dispatch instead of two)
            Some(lr) if matches!(self, Weight::Quant(_)) => {
                let fuse = QFuse {
                    low_rank_a: Some((&lr.a, &lr.b)),
                    ..fuse
                };
                self.fused(x, fuse)
            }
            Some(lr) => {
                let u = lr.input(x, fuse.rms_norm.map(|n| n.1))?;
                let fuse = QFuse {
                    low_rank: Some((&u, &lr.b)),
                    ..fuse
                };
                self.fused(x, fuse)
            }
        }
    }
}

/// The active adapters' update of one product, their parts side by side
/// along the rank: `delta(x) = (x @ aᵀ) @ b`, each adapter's scale folded
/// into its rows of `b`, and for a product that follows an RMSNorm, the
/// norm's weight folded into `a` (the update's input is the normed `x`).
/// For a stacked product, each part's columns of `b` are zero outside that
/// part's rows, so the delta is the parts' deltas concatenated.
struct LowRank {
    a: Tensor, // [total rank, in]
    b: Tensor, // [total rank, out]
}

impl LowRank {
    /// `x @ aᵀ` in f32, of `rms_norm(x)` (its weight in `a`) with `eps`.
    fn input(&self, x: &Tensor, eps: Option<f32>) -> silica::Result<Tensor> {
        x.project_low_rank(&self.a, eps)
    }

    /// The update for `x` (normed first with `eps`), in `x`'s dtype.
    fn delta(&self, x: &Tensor, eps: Option<f32>) -> silica::Result<Tensor> {
        self.input(x, eps)?.to_dtype(x.dtype())?.matmul(&self.b)
    }
}

/// The updates of one layer's products (none where no adapter touches them).
#[derive(Default)]
struct LayerLora {
    qkv: Option<LowRank>,
    wo: Option<LowRank>,
    gate_up: Option<LowRank>,
    down: Option<LowRank>,
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
    /// With `lora`, the norm runs on its own (the update needs the normed
    /// input too) and the update goes in as the product's fused residual.
    fn apply(
        &self,
        x: &Tensor,
        norm: (&Tensor, f32),
        bias: Option<&Tensor>,
        lora: Option<&LowRank>,
    ) -> silica::Result<Tensor> {
        let y = match (self, lora) {
            (Stacked::Fused(w), Some(_)) => {
                let fuse = QFuse {
                    rms_norm: Some(norm),
                    ..QFuse::default()
                };
                w.with_update(x, fuse, lora)?
            }
            (Stacked::Split(parts), Some(lr)) => {
                let hn = x.rms_norm(norm.0, norm.1)?;
                let ys: Vec<Tensor> = parts
                    .iter()
                    .map(|w| w.apply(&hn))
                    .collect::<silica::Result<_>>()?;
                let refs: Vec<&Tensor> = ys.iter().collect();
                Tensor::cat(&refs, -1)?.add(&lr.delta(x, Some(norm.1))?)?
            }
            (Stacked::Split(parts), None) => {
                let hn = x.rms_norm(norm.0, norm.1)?;
                let ys: Vec<Tensor> = parts
                    .iter()
                    .map(|w| w.apply(&hn))
                    .collect::<silica::Result<_>>()?;
                let refs: Vec<&Tensor> = ys.iter().collect();
                Tensor::cat(&refs, -1)?
            }
            (Stacked::Fused(w), None) => {
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
    /// one kernel for stacked quantized weights on a GPU at decode (with
    /// `lora`, one more before it for the update's first half; the update
    /// joins the products before the activation).
    fn swiglu(
        &self,
        x: &Tensor,
        norm: (&Tensor, f32),
        lora: Option<&LowRank>,
    ) -> silica::Result<Tensor> {
        self.gated(x, norm, lora, false)
    }

    /// GeGLU, `gelu_tanh(gate) * up` (Gemma), as [`Stacked::swiglu`].
    fn geglu(
        &self,
        x: &Tensor,
        norm: (&Tensor, f32),
        lora: Option<&LowRank>,
    ) -> silica::Result<Tensor> {
        self.gated(x, norm, lora, true)
    }

    /// `act(gate) * up` of `rms_norm(x)`, `act` tanh-GELU where `gelu`,
    /// SiLU otherwise.
    fn gated(
        &self,
        x: &Tensor,
        norm: (&Tensor, f32),
        lora: Option<&LowRank>,
        gelu: bool,
    ) -> silica::Result<Tensor> {
        let gate = |g: &Tensor, up: &Tensor| {
            if gelu {
                g.gelu_tanh()?.mul(up)
            } else {
                g.swiglu(up)
            }
        };
        match self {
            Stacked::Fused(w) => {
                let fuse = QFuse {
                    rms_norm: Some(norm),
                    swiglu: !gelu,
                    geglu: gelu,
                    ..QFuse::default()
                };
                w.with_update(x, fuse, lora)
            }
            Stacked::Split(_) if lora.is_some() => {
                let y = self.apply(x, norm, None, lora)?;
                let n = y.dim(-1)? / 2;
                gate(&y.narrow(-1, 0, n)?, &y.narrow(-1, n, n)?)
            }
            Stacked::Split(parts) => {
                let hn = x.rms_norm(norm.0, norm.1)?;
                gate(&parts[0].apply(&hn)?, &parts[1].apply(&hn)?)
            }
        }
    }
}

struct Layer {
    attn_norm: Tensor,                 // [d]
    qkv: Stacked,                      // Q [heads * hd, d], K and V [kv_heads * hd, d]
    bqkv: Option<Tensor>,              // [(heads + 2 * kv_heads) * hd]
    qk_norm: Option<(Tensor, Tensor)>, // [hd] each: query heads, key heads
    wo: Weight,                        // [d, heads * hd]
    ffn_norm: Tensor,                  // [d]
    gate_up: Stacked,                  // gate, up [ffn, d]
    w_down: Weight,                    // [d, ffn]
    /// Gemma's RMSNorms of the attention's and the feed-forward's outputs
    /// before their residual sums, `[d]` each.
    post_norms: Option<(Tensor, Tensor)>,
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
    /// Llama 3.1's per-frequency divisors of the rotary frequencies
    /// (`rope_freqs.weight`, `[hd / 2]`), or Phi-3's LongRoPE ones for its
    /// context (`[rope_dim / 2]`).
    rope_freqs: Option<Vec<f32>>,
    /// The active adapters' updates per layer (empty: none active).
    lora: Vec<LayerLora>,
}

/// Keys and values of the positions seen so far, per layer: `[capacity,
/// 2 * kv_heads, hd]` buffers (the keys' heads, then the values') of which
/// the first `len` rows are filled, and the rotary angle tables
/// `[capacity, hd / 2]` for the same positions (and those of Gemma's local
/// layers, cos then sin, where it has local layers).
pub struct KvCache {
    kv: Vec<Tensor>,
    cos: Option<Tensor>,
    sin: Option<Tensor>,
    local: Option<(Tensor, Tensor)>,
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
pub(super) const CACHE_START: usize = 256;

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
        if config.gemma.is_some() && dtype == DType::F16 {
            // Gemma 3 270M's residual stream passes 100,000 by the 10th
            // layer (llama.cpp keeps it in f32 whatever the weights)
            return Err(Error::Unsupported {
                path: f.path().to_path_buf(),
                what: format!(
                    "f16 activations for {}: its residual stream exceeds f16's range (use f32 or bf16)",
                    config.architecture
                ),
            });
        }
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
        // a matrix with its rows reordered (`order[i]`: the file's row
        // that becomes row i), for Phi-3's partial rotation
        let weight_in_order = |name: &str, shape: &[usize], order: Option<&[usize]>| {
            let Some(order) = order else {
                return weight(name, shape);
            };
            Ok(match blocks(name, shape)? {
                Some((fmt, bytes)) => {
                    let rows = phi3::reorder_rows(bytes, fmt.bytes_for(shape[1]), order);
                    Weight::Quant(QTensor::from_bytes(fmt, shape, &rows, device)?)
                }
                None => Weight::Dense(phi3::select_rows(&get(name, shape)?, order)?),
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
        // Phi-4-mini's partial rotation: the order of the query and key
        // rows in which the attention step's whole-head rotation does it
        let qkv_order = config
            .phi3
            .as_ref()
            .and_then(|p| p.qkv_row_order(config.head_dim, config.n_heads, config.n_kv_heads));
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
            // Q, K and V in one tensor (Phi-3), whose bias replaces theirs
            let fused_qkv = n("attn_qkv.weight");
            let bqkv = match opt(&n("attn_qkv.bias"), &[qd + 2 * kvd])? {
                Some(b) => Some(b),
                None => bqkv,
            };
            let bqkv = match (bqkv, &qkv_order) {
                (Some(b), Some(order)) => Some(phi3::select_rows(&b, order)?),
                (b, _) => b,
            };
            let separate = f.tensor_info(&n("attn_q.weight")).is_some();
            let qkv = if f.tensor_info(&fused_qkv).is_some() {
                let w = weight_in_order(&fused_qkv, &[qd + 2 * kvd, d], qkv_order.as_deref())?;
                Stacked::Fused(w)
            } else if config.phi3.is_some() && !separate {
                return Err(Error::Missing {
                    path: f.path().to_path_buf(),
                    what: format!("tensor '{fused_qkv}'"),
                });
            } else if qkv_order.is_some() {
                return Err(Error::Unsupported {
                    path: f.path().to_path_buf(),
                    what: format!(
                        "partial rotation with separate Q, K and V tensors ({}; silica reorders \
                         the rows of one attn_qkv tensor)",
                        n("attn_q.weight")
                    ),
                });
            } else {
                stacked(
                    &[
                        (n("attn_q.weight"), qd),
                        (n("attn_k.weight"), kvd),
                        (n("attn_v.weight"), kvd),
                    ],
                    d,
                )?
            };
            let gate_up = if config.phi3.is_some() {
                // gate and up in one tensor, the gate's rows first (Phi-3)
                let w = weight(&n("ffn_up.weight"), &[2 * config.ffn_dim, d])?;
                Stacked::Fused(w)
            } else {
                stacked(
                    &[
                        (n("ffn_gate.weight"), config.ffn_dim),
                        (n("ffn_up.weight"), config.ffn_dim),
                    ],
                    d,
                )?
            };
            let qk_norm = if config.qk_norm {
                let hd = config.head_dim;
                Some((
                    get(&n("attn_q_norm.weight"), &[hd])?,
                    get(&n("attn_k_norm.weight"), &[hd])?,
                ))
            } else {
                None
            };
            let post_norms = if config.gemma.is_some() {
                Some((
                    get(&n("post_attention_norm.weight"), &[d])?,
                    get(&n("post_ffw_norm.weight"), &[d])?,
                ))
            } else {
                None
            };
            layers.push(Layer {
                attn_norm: get(&n("attn_norm.weight"), &[d])?,
                qkv,
                bqkv,
                qk_norm,
                wo: weight(&n("attn_output.weight"), &[d, qd])?,
                ffn_norm: get(&n("ffn_norm.weight"), &[d])?,
                gate_up,
                w_down: weight(&n("ffn_down.weight"), &[d, config.ffn_dim])?,
                post_norms,
            });
        }
        let vocab = [config.vocab_size, d];
        let embed = match blocks("token_embd.weight", &vocab)? {
            Some((fmt, bytes)) => {
                Embedding::Quant(QTensor::from_bytes(fmt, &vocab, bytes, device)?)
            }
            None => Embedding::Dense(get("token_embd.weight", &vocab)?),
        };
        // Gemma 2's output is always the embedding (llama.cpp ignores an
        // output.weight there)
        let output = f
            .tensor_info("output.weight")
            .filter(|_| config.architecture != "gemma2");
        let lm_head = match (output, &embed) {
            (Some(_), _) => weight("output.weight", &vocab)?,
            (None, Embedding::Dense(t)) => Weight::Dense(t.clone()),
            (None, Embedding::Quant(q)) => Weight::Quant(q.clone()),
        };
        // Phi-3's are its LongRoPE factors (llama.cpp reads no rope_freqs there)
        let rope_freqs = match (&config.phi3, f.tensor_info("rope_freqs.weight")) {
            (Some(p), _) => p.rope_factors(f)?,
            (None, None) => None,
            (None, Some(_)) => {
                let half = config.head_dim / 2;
                let (shape, values) = f.dequantize("rope_freqs.weight")?;
                if shape != [half] {
                    return Err(bad_shape("rope_freqs.weight", &shape, &[half]));
                }
                if let Some(v) = values.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
                    return Err(Error::Format {
                        path: f.path().to_path_buf(),
                        offset: info("rope_freqs.weight")?.offset,
                        msg: format!("rope_freqs.weight holds {v}, expected positive factors"),
                    });
                }
                Some(values)
            }
        };
        Ok(Self {
            out_norm: get("output_norm.weight", &[d])?,
            rope_freqs,
            config,
            device: device.clone(),
            dtype,
            embed,
            layers,
            lm_head,
            lora: Vec::new(),
        })
    }

    /// Opens and loads a GGUF file.
    pub fn from_path(path: &Path, device: &Device, dtype: DType) -> Result<Self> {
        Self::load(&GgufFile::open(path)?, device, dtype)
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Applies `adapters` (each with the scale it runs at, times its own
    /// `alpha / r`) from the next forward pass on, in place of those set
    /// before; an empty list turns them off. The base weights stay as they
    /// are: each adapted product gains `(x @ Aᵀ) @ Bᵀ` beside it, all
    /// adapters of a product (and the parts of a stacked one) in one pair
    /// of small products. Changing a scale means calling this again, which
    /// rebuilds those pairs on the device from the adapters' tensors
    /// (nothing is read from a file). An adapter made for another model's
    /// shapes is an error naming the tensor.
    ///
    /// ```no_run
    /// # use silica::{DType, Device};
    /// # use silica_models::{gguf::GgufFile, llama::Llama, lora::LoraAdapter};
    /// # let dev = Device::cpu();
    /// # let mut model = Llama::load(&GgufFile::open("base.gguf")?, &dev, DType::F32)?;
    /// let style = LoraAdapter::open("style/", &model.config, &dev, DType::F32)?;
    /// let facts = LoraAdapter::open("facts.gguf", &model.config, &dev, DType::F32)?;
    /// model.set_adapters(&[(&style, 1.0), (&facts, 0.5)])?;
    /// model.set_adapters(&[(&style, 0.25)])?; // a lighter touch, facts off
    /// # Ok::<(), silica_models::Error>(())
    /// ```
    pub fn set_adapters(&mut self, adapters: &[(&LoraAdapter, f32)]) -> Result<()> {
        let c = &self.config;
        for (adapter, _) in adapters {
            for (name, w) in adapter.weights() {
                let fits = lora::split_name(name).and_then(|(layer, module)| {
                    let [out, inp] = lora::base_shape(c, module)?;
                    let r = w.rank();
                    (layer < c.n_layers && w.a.shape() == [r, inp] && w.b.shape() == [out, r])
                        .then_some(())
                });
                if fits.is_none() {
                    return Err(Error::InvalidInput(format!(
                        "{}: tensor '{name}' (lora_a {:?}, lora_b {:?}) does not fit this {} \
                         model of {} layers",
                        adapter.path().display(),
                        w.a.shape(),
                        w.b.shape(),
                        c.architecture,
                        c.n_layers
                    )));
                }
            }
        }
        let d = c.d_model;
        let (qd, kvd) = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
        // (GGUF module, rows) of the stacked products' parts, in order
        let stacked: [Vec<(&str, usize)>; 2] = if c.phi3.is_some() {
            [
                vec![("attn_qkv", qd + 2 * kvd)],
                vec![("ffn_up", 2 * c.ffn_dim)],
            ]
        } else {
            [
                vec![("attn_q", qd), ("attn_k", kvd), ("attn_v", kvd)],
                vec![("ffn_gate", c.ffn_dim), ("ffn_up", c.ffn_dim)],
            ]
        };
        let [qkv_parts, gate_up_parts] = &stacked;
        // the rows of the stacked Q/K/V as silica reordered them at load (Phi-4-mini)
        let qkv_order = c
            .phi3
            .as_ref()
            .and_then(|p| p.qkv_row_order(c.head_dim, c.n_heads, c.n_kv_heads));
        let mut layers = Vec::with_capacity(c.n_layers);
        for li in 0..c.n_layers {
            let build = |parts: &[(&str, usize)], order: Option<&[usize]>, norm| {
                self.low_rank(li, parts, order, norm, adapters)
            };
            let layer = &self.layers[li];
            layers.push(LayerLora {
                qkv: build(qkv_parts, qkv_order.as_deref(), Some(&layer.attn_norm))?,
                wo: build(&[("attn_output", d)], None, None)?,
                gate_up: build(gate_up_parts, None, Some(&layer.ffn_norm))?,
                down: build(&[("ffn_down", d)], None, None)?,
            });
        }
        let any = layers
            .iter()
            .any(|l| l.qkv.is_some() || l.wo.is_some() || l.gate_up.is_some() || l.down.is_some());
        self.lora = if any { layers } else { Vec::new() };
        Ok(())
    }

    /// True while adapters are set (see [`Llama::set_adapters`]).
    pub fn has_adapters(&self) -> bool {
        !self.lora.is_empty()
    }

    /// The update of layer `li`'s product whose rows are `parts` (GGUF
    /// module names and row counts, stacked in this order, then reordered
    /// by `order` where given) from `adapters`, or `None` where none of
    /// them touches it (or all at scale 0). `norm`: the weight of the
    /// RMSNorm before the product, folded into `a`.
    fn low_rank(
        &self,
        li: usize,
        parts: &[(&str, usize)],
        order: Option<&[usize]>,
        norm: Option<&Tensor>,
        adapters: &[(&LoraAdapter, f32)],
    ) -> Result<Option<LowRank>> {
        let out: usize = parts.iter().map(|p| p.1).sum();
        let place =
            |t: &Tensor| -> Result<Tensor> { Ok(t.to_device(&self.device)?.to_dtype(self.dtype)?) };
        let zeros = |rows: usize, r: usize| Tensor::zeros(&[rows, r], self.dtype, &self.device);
        let (mut a_rows, mut b_cols) = (Vec::new(), Vec::new());
        let mut offset = 0;
        for &(module, rows) in parts {
            let name = format!("blk.{li}.{module}.weight");
            for &(adapter, scale) in adapters {
                let Some(w) = adapter.get(&name) else {
                    continue;
                };
                if scale == 0.0 {
                    continue;
                }
                let r = w.rank();
                a_rows.push(place(&w.a)?); // [r, in]
                let b = place(&w.b)?.mul_scalar(scale * w.scale)?; // [rows, r]
                // this part's rows of the stacked output, zero elsewhere
                let mut col = Vec::with_capacity(3);
                if offset > 0 {
                    col.push(zeros(offset, r)?);
                }
                col.push(b);
                if offset + rows < out {
                    col.push(zeros(out - offset - rows, r)?);
                }
                let refs: Vec<&Tensor> = col.iter().collect();
                b_cols.push(Tensor::cat(&refs, 0)?); // [out, r]
            }
            offset += rows;
        }
        if a_rows.is_empty() {
            return Ok(None);
        }
        let refs: Vec<&Tensor> = a_rows.iter().collect();
        let mut a = Tensor::cat(&refs, 0)?; // [R, in]
        if let Some(g) = norm {
            a = a.mul(g)?;
        }
        let a = a.contiguous()?;
        let refs: Vec<&Tensor> = b_cols.iter().collect();
        let mut b = Tensor::cat(&refs, 1)?; // [out, R]
        if let Some(order) = order {
            b = phi3::select_rows(&b, order)?;
        }
        let b = b.t()?.contiguous()?; // [R, out]
        Ok(Some(LowRank { a, b }))
    }

    pub fn new_cache(&self) -> KvCache {
        KvCache {
            kv: Vec::new(),
            cos: None,
            sin: None,
            local: None,
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
        let factors = self.rope_freqs.as_deref();
        let (cos, sin) = match &c.phi3 {
            Some(p) => p.rope_angles(n, c.head_dim, c.rope_theta, factors, &c.rope_scaling),
            None => rope_angles(n, c.head_dim, c.rope_theta, factors, &c.rope_scaling),
        };
        let mk = |v: Vec<f32>| -> Result<Tensor> {
            Ok(Tensor::from_vec(v, &[n, half], &Device::cpu())?.to_device(&self.device)?)
        };
        Ok((mk(cos)?, mk(sin)?))
    }

    /// The tables of [`Llama::rope_tables`] for Gemma's local layers: base
    /// `theta`, no scaling.
    fn local_rope_tables(&self, n: usize, theta: f64) -> Result<(Tensor, Tensor)> {
        let half = self.config.head_dim / 2;
        let (cos, sin) = rope_angles(n, self.config.head_dim, theta, None, &RopeScaling::None);
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
        let local = match &c.gemma {
            Some(g) if g.local_layers.contains(&true) => {
                Some(self.local_rope_tables(capacity, g.rope_theta_local)?)
            }
            _ => None,
        };
        *cache = KvCache {
            kv,
            cos: Some(cos),
            sin: Some(sin),
            local,
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
        match self.forward_taps(ids_t, cache, last_only, &mut NoTaps, self.config.n_layers)? {
            Some(logits) => Ok(logits),
            None => unreachable!("a forward through every layer gives logits"),
        }
    }

    /// [`Llama::forward_ids`] showing `taps` the states it asks for, and
    /// stopping after block `stop` (without logits) when that is not the last.
    fn forward_taps(
        &self,
        ids_t: &Tensor,
        cache: &mut KvCache,
        last_only: bool,
        taps: &mut dyn Taps,
        stop: usize,
    ) -> Result<Option<Tensor>> {
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
        let h = c.n_heads;
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
        if c.gemma.is_some() {
            x = x.mul_scalar((c.d_model as f32).sqrt())?;
        }
        taps.put(0, Site::Residual, &x)?;
        let local_tables = match &cache.local {
            Some((cos, sin)) => Some((cos.narrow(0, start, t)?, sin.narrow(0, start, t)?)),
            None => None,
        };
        // Gemma's attention masks [t, keys], made once per step for all
        // layers of a kind: (global, local)
        let mut masks: (Option<Tensor>, Option<Tensor>) = (None, None);
        let eps = c.rms_eps as f32;
        let scale = c.attention_scale;
        for li in 0..stop.min(c.n_layers) {
            x = self.block(li, x, taps, |qkv| {
                // rotates the queries and keys, writes the keys and values at
                // `start..total` (rows past `len` are not part of the cache
                // until the step succeeds) and attends over `0..total`
                let rope = (&cos, &sin, c.rope_style);
                match &c.gemma {
                    None => Ok(qkv.cached_attention(&mut cache.kv[li], start, rope, h, scale)?),
                    Some(g) => {
                        let window = g.window(li);
                        let rope = match (&local_tables, window) {
                            (Some((lc, ls)), Some(_)) => (lc, ls, c.rope_style),
                            _ => rope,
                        };
                        let mask = if window.is_some() {
                            &mut masks.1
                        } else {
                            &mut masks.0
                        };
                        self.gemma_attention(g, window, &qkv, &mut cache.kv[li], start, rope, mask)
                    }
                }
            })?;
            self.tap_residual(li + 1, &x, taps)?;
        }
        if stop < c.n_layers {
            return Ok(None);
        }
        cache.len = total;
        let x = if last_only { x.narrow(0, t - 1, 1)? } else { x };
        let fuse = QFuse {
            rms_norm: Some((&self.out_norm, eps)),
            ..QFuse::default()
        };
        // logits leave in f32 whatever the compute dtype: sampling reads them on the host
        let logits = self.lm_head.fused(&x, fuse)?.to_dtype(DType::F32)?;
        Ok(Some(match c.gemma.as_ref().and_then(|g| g.final_softcap) {
            Some(cap) => logits.div_scalar(cap)?.tanh()?.mul_scalar(cap)?,
            None => logits,
        }))
    }

    /// Shows `taps` the residual stream after block `layer` (after the
    /// final norm for the last block, as transformers' hidden states).
    fn tap_residual(&self, layer: usize, x: &Tensor, taps: &mut dyn Taps) -> Result<()> {
        if !taps.wants(layer, Site::Residual) {
            return Ok(());
        }
        if layer == self.config.n_layers {
            let normed = x.rms_norm(&self.out_norm, self.config.rms_eps as f32)?;
            taps.put(layer, Site::Residual, &normed)
        } else {
            taps.put(layer, Site::Residual, x)
        }
    }

    /// One decoder block on the residual stream `x` (`[rows, d]`):
    /// the normed QKV projection (and Qwen3's per-head norms), `attend`
    /// (which turns `[rows, H + 2 KVH, hd]` into the attention's `[rows,
    /// H, hd]` output), the output projection, the feed-forward, and the
    /// residual sums; `taps` sees the block's attention and MLP outputs.
    fn block(
        &self,
        li: usize,
        x: Tensor,
        taps: &mut dyn Taps,
        attend: impl FnOnce(Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let c = &self.config;
        let l = &self.layers[li];
        let (hd, h, kvh) = (c.head_dim, c.n_heads, c.n_kv_heads);
        let eps = c.rms_eps as f32;
        let rows = x.shape()[0];
        // [rows, query heads, then key heads, then value heads, hd]
        let lora = self.lora.get(li);
        let qkv = l
            .qkv
            .apply(
                &x,
                (&l.attn_norm, eps),
                l.bqkv.as_ref(),
                lora.and_then(|a| a.qkv.as_ref()),
            )?
            .reshape(&[rows, h + 2 * kvh, hd])?;
        let qkv = match &l.qk_norm {
            Some((qn, kn)) => qkv.head_norm(qn, kn, h, kvh, eps)?,
            None => qkv,
        };
        let att = attend(qkv)?.reshape(&[rows, h * hd])?;
        let layer = li + 1;
        let (lo, lgu, ld) = (
            lora.and_then(|a| a.wo.as_ref()),
            lora.and_then(|a| a.gate_up.as_ref()),
            lora.and_then(|a| a.down.as_ref()),
        );
        Ok(match &l.post_norms {
            None => {
                let x = if taps.wants(layer, Site::Attention) {
                    let a = l.wo.apply_with(&att, lo)?;
                    taps.put(layer, Site::Attention, &a)?;
                    a.add(&x)?
                } else {
                    l.wo.add_to(&att, &x, lo)?
                };
                let act = l.gate_up.swiglu(&x, (&l.ffn_norm, eps), lgu)?; // [rows, ffn]
                if taps.wants(layer, Site::Mlp) {
                    let m = l.w_down.apply_with(&act, ld)?;
                    taps.put(layer, Site::Mlp, &m)?;
                    m.add(&x)?
                } else {
                    l.w_down.add_to(&act, &x, ld)?
                }
            }
            Some((post_attn, post_ffn)) => {
                // the post-norm and the residual sum in one kernel, unless
                // a tap wants the normed output
                let post = |y: Tensor, norm: &Tensor, x: &Tensor, site, taps: &mut dyn Taps| {
                    if taps.wants(layer, site) {
                        let y = y.rms_norm(norm, eps)?;
                        taps.put(layer, site, &y)?;
                        Ok::<_, Error>(y.add(x)?)
                    } else {
                        Ok(y.rms_norm_add(norm, eps, x)?)
                    }
                };
                let a = l.wo.apply_with(&att, lo)?;
                let x = post(a, post_attn, &x, Site::Attention, taps)?;
                let act = l.gate_up.geglu(&x, (&l.ffn_norm, eps), lgu)?; // [rows, ffn]
                let m = l.w_down.apply_with(&act, ld)?;
                post(m, post_ffn, &x, Site::Mlp, taps)?
            }
        })
    }

    /// Gemma's attention step of one layer (`window`: its sliding window,
    /// if local): [`Tensor::cached_attention_with`] for one position, or
    /// where neither a window nor soft-capping changes anything (the
    /// window covers every key), else composed: the rotation, the cache write, then attention over
    /// the keys in reach, with `mask` (`[t, keys]`, made on first use and
    /// kept for the step's other layers of the same kind) where several
    /// queries see different keys.
    #[allow(clippy::too_many_arguments)]
    fn gemma_attention(
        &self,
        g: &GemmaConfig,
        window: Option<usize>,
        qkv: &Tensor,
        cache: &mut Tensor,
        start: usize,
        (cos, sin, style): (&Tensor, &Tensor, RopeStyle),
        mask: &mut Option<Tensor>,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (h, kvh) = (c.n_heads, c.n_kv_heads);
        let t = qkv.shape()[0];
        let total = start + t;
        // some key falls out of some query's window
        let cut = window.is_some_and(|w| total > w);
        if t == 1 || (g.attn_softcap.is_none() && !cut) {
            // one kernel on a GPU, which reads only the window's keys
            let rope = (cos, sin, style);
            let opts = CachedAttentionOpts {
                scale: c.attention_scale,
                window,
                softcap: g.attn_softcap,
            };
            return Ok(qkv.cached_attention_with(cache, start, rope, h, opts)?);
        }
        let rotated = qkv.rope_heads(cos, sin, style, h + kvh)?;
        cache.slice_assign(start, &rotated.narrow(1, h, 2 * kvh)?)?;
        let q = rotated.narrow(1, 0, h)?;
        // the first key any of the queries sees
        let lo = window.map_or(0, |w| (start + 1).saturating_sub(w));
        let keys = cache.narrow(0, lo, total - lo)?;
        let (k, v) = (keys.narrow(1, 0, kvh)?, keys.narrow(1, kvh, kvh)?);
        let softcap = g.attn_softcap;
        // several queries need a mask (causal and the window's band for
        // soft-capping, the band alone for the attention op, which is
        // causal itself)
        if mask.is_none() {
            *mask = Some(gemma::attention_mask(
                start..total,
                lo..total,
                window,
                softcap.is_some(),
                self.dtype,
                &self.device,
            )?);
        }
        let m = mask.as_ref();
        Ok(match softcap {
            Some(cap) => q.softcapped_attention(&k, &v, m, c.attention_scale, cap)?,
            None => gemma::windowed_attention(&q, &k, &v, m, c.attention_scale)?,
        })
    }
}
