//! Llama-family decoders (Llama 2/3, Mistral, Qwen2, SmolLM) from GGUF.
//!
//! Weights are dequantized at load into the compute dtype (quantized
//! storage on the device is a later step). The forward pass uses silica's
//! fused ops (RMSNorm, RoPE, attention, SwiGLU) and runs on every device;
//! the Q/K/V projections and the gate/up projections are each one matmul
//! over weights concatenated at load. The KV cache is a pair of device
//! tensors per layer, preallocated and appended to in place.

use std::path::Path;

pub use silica::RopeStyle;
use silica::{AttentionOpts, DType, Device, Tensor};

use crate::gguf::GgufFile;
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

struct Layer {
    attn_norm: Tensor,    // [d]
    wqkv: Tensor,         // [(heads + 2 * kv_heads) * hd, d]: Q, K and V stacked
    bqkv: Option<Tensor>, // [(heads + 2 * kv_heads) * hd]
    wo: Tensor,           // [d, heads * hd]
    ffn_norm: Tensor,     // [d]
    w_gate_up: Tensor,    // [2 * ffn, d]: gate, then up
    w_down: Tensor,       // [d, ffn]
}

/// A loaded decoder.
pub struct Llama {
    pub config: LlamaConfig,
    device: Device,
    dtype: DType,
    embed: Tensor, // [vocab, d]
    layers: Vec<Layer>,
    out_norm: Tensor, // [d]
    lm_head: Tensor,  // [vocab, d] (the embedding when tied)
}

/// Keys and values of the positions seen so far, per layer: `[capacity,
/// kv_heads, hd]` buffers of which the first `len` rows are filled, and the
/// rotary angle tables `[capacity, hd / 2]` for the same positions.
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
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

fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let y = x.matmul(&w.t()?)?;
    Ok(match b {
        Some(b) => y.add(b)?,
        None => y,
    })
}

impl Llama {
    /// Loads a GGUF decoder onto `device`, dequantizing weights to `dtype`.
    pub fn load(f: &GgufFile, device: &Device, dtype: DType) -> Result<Self> {
        let config = LlamaConfig::from_gguf(f)?;
        let get = |name: &str| -> Result<Tensor> {
            let (shape, values) = f.dequantize(name)?;
            let t = Tensor::from_vec(values, &shape, &Device::cpu())?.to_dtype(dtype)?;
            Ok(t.to_device(device)?)
        };
        let opt = |name: &str| -> Result<Option<Tensor>> {
            if f.tensor_info(name).is_some() {
                get(name).map(Some)
            } else {
                Ok(None)
            }
        };
        let (d, hd) = (config.d_model, config.head_dim);
        let expect = |t: Tensor, name: &str, shape: &[usize]| -> Result<Tensor> {
            if t.shape() != shape {
                return Err(Error::Format {
                    path: f.path().to_path_buf(),
                    offset: f.tensor_info(name).map_or(0, |i| i.offset),
                    msg: format!(
                        "tensor {name} has shape {:?}, expected {shape:?}",
                        t.shape()
                    ),
                });
            }
            Ok(t)
        };
        let mut layers = Vec::with_capacity(config.n_layers);
        for i in 0..config.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}");
            let w = |s: &str, shape: &[usize]| expect(get(&n(s))?, &n(s), shape);
            let (qd, kvd) = (config.n_heads * hd, config.n_kv_heads * hd);
            let wq = w("attn_q.weight", &[qd, d])?;
            let wk = w("attn_k.weight", &[kvd, d])?;
            let wv = w("attn_v.weight", &[kvd, d])?;
            let biases = [
                opt(&n("attn_q.bias"))?,
                opt(&n("attn_k.bias"))?,
                opt(&n("attn_v.bias"))?,
            ];
            let bqkv = match biases {
                [None, None, None] => None,
                [bq, bk, bv] => {
                    // a missing bias of the three is zero
                    let or_zero = |b: Option<Tensor>, len: usize| match b {
                        Some(b) => expect(b, "attention bias", &[len]),
                        None => Ok(Tensor::zeros(&[len], dtype, device)?),
                    };
                    let parts = [or_zero(bq, qd)?, or_zero(bk, kvd)?, or_zero(bv, kvd)?];
                    Some(Tensor::cat(&[&parts[0], &parts[1], &parts[2]], 0)?)
                }
            };
            let w_gate = w("ffn_gate.weight", &[config.ffn_dim, d])?;
            let w_up = w("ffn_up.weight", &[config.ffn_dim, d])?;
            layers.push(Layer {
                attn_norm: w("attn_norm.weight", &[d])?,
                wqkv: Tensor::cat(&[&wq, &wk, &wv], 0)?,
                bqkv,
                wo: w("attn_output.weight", &[d, qd])?,
                ffn_norm: w("ffn_norm.weight", &[d])?,
                w_gate_up: Tensor::cat(&[&w_gate, &w_up], 0)?,
                w_down: w("ffn_down.weight", &[d, config.ffn_dim])?,
            });
        }
        let embed = expect(
            get("token_embd.weight")?,
            "token_embd.weight",
            &[config.vocab_size, d],
        )?;
        let lm_head = match opt("output.weight")? {
            Some(t) => expect(t, "output.weight", &[config.vocab_size, d])?,
            None => embed.clone(),
        };
        Ok(Self {
            out_norm: expect(get("output_norm.weight")?, "output_norm.weight", &[d])?,
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
            k: Vec::new(),
            v: Vec::new(),
            cos: None,
            sin: None,
            capacity: 0,
            len: 0,
        }
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
        let shape = [capacity, c.n_kv_heads, c.head_dim];
        let grow = |old: &Tensor| -> Result<Tensor> {
            let mut t = Tensor::zeros(&shape, self.dtype, &self.device)?;
            t.slice_assign(0, &old.narrow(0, 0, cache.len)?)?;
            Ok(t)
        };
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for li in 0..c.n_layers {
            match (cache.k.get(li), cache.v.get(li)) {
                (Some(ok), Some(ov)) => {
                    k.push(grow(ok)?);
                    v.push(grow(ov)?);
                }
                _ => {
                    k.push(Tensor::zeros(&shape, self.dtype, &self.device)?);
                    v.push(Tensor::zeros(&shape, self.dtype, &self.device)?);
                }
            }
        }
        let (cos, sin) = self.rope_tables(capacity)?;
        *cache = KvCache {
            k,
            v,
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
        let start = cache.len;
        if start + t > c.context_length {
            return Err(Error::InvalidInput(format!(
                "{} positions exceed the model's context of {} tokens",
                start + t,
                c.context_length
            )));
        }
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= c.vocab_size) {
            return Err(Error::InvalidInput(format!(
                "token id {bad} is outside the vocabulary of {} tokens",
                c.vocab_size
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
        let ids_t = Tensor::from_slice(ids, &[t], &self.device)?;
        let mut x = self.embed.index_select(0, &ids_t)?; // [t, d]
        let eps = c.rms_eps as f32;
        let opts = AttentionOpts::causal(hd);
        for (li, l) in self.layers.iter().enumerate() {
            let hn = x.rms_norm(&l.attn_norm, eps)?;
            let qkv = linear(&hn, &l.wqkv, l.bqkv.as_ref())?; // [t, (h + 2 kvh) * hd]
            let q = qkv.narrow(1, 0, h * hd)?.reshape(&[t, h, hd])?;
            let k = qkv.narrow(1, h * hd, kvh * hd)?.reshape(&[t, kvh, hd])?;
            let v = qkv
                .narrow(1, (h + kvh) * hd, kvh * hd)?
                .reshape(&[t, kvh, hd])?;
            let q = q.rope(&cos, &sin, c.rope_style)?;
            let k = k.rope(&cos, &sin, c.rope_style)?;
            // rows past `len` are not part of the cache until the step succeeds
            cache.k[li].slice_assign(start, &k)?;
            cache.v[li].slice_assign(start, &v)?;
            let k_all = cache.k[li].narrow(0, 0, total)?;
            let v_all = cache.v[li].narrow(0, 0, total)?;
            let att = q
                .attention(&k_all, &v_all, None, opts)?
                .reshape(&[t, h * hd])?;
            x = x.add(&linear(&att, &l.wo, None)?)?;

            let hn = x.rms_norm(&l.ffn_norm, eps)?;
            let gate_up = linear(&hn, &l.w_gate_up, None)?; // [t, 2 * ffn]
            let gate = gate_up.narrow(1, 0, c.ffn_dim)?;
            let up = gate_up.narrow(1, c.ffn_dim, c.ffn_dim)?;
            x = x.add(&linear(&gate.swiglu(&up)?, &l.w_down, None)?)?;
        }
        cache.len = total;
        let x = if last_only { x.narrow(0, t - 1, 1)? } else { x };
        let x = x.rms_norm(&self.out_norm, eps)?;
        // logits leave in f32 whatever the compute dtype: sampling reads them on the host
        Ok(linear(&x, &self.lm_head, None)?.to_dtype(DType::F32)?)
    }
}
