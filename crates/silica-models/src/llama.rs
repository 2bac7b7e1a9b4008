//! Llama-family decoders (Llama 2/3, Mistral, Qwen2, SmolLM) from GGUF.
//!
//! Weights are dequantized at load into the compute dtype (quantized
//! storage on the device is a later step). The forward pass is written with
//! silica's tensor ops, so it runs on every device; the KV cache is a pair
//! of device tensors per layer that grow by concatenation.

use std::path::Path;

use silica::{DType, Device, Tensor};

use crate::gguf::GgufFile;
use crate::{Error, Result};

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// `(x[2i], x[2i+1])`: GGUF files of llama-type models (the converter
    /// permutes the Q/K weights for this).
    Adjacent,
    /// `(x[i], x[i + d/2])`: Hugging Face's rotate-half (Qwen2 in GGUF too).
    Half,
}

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
    attn_norm: Tensor, // [d]
    wq: Tensor,        // [heads * hd, d]
    wk: Tensor,        // [kv_heads * hd, d]
    wv: Tensor,        // [kv_heads * hd, d]
    bq: Option<Tensor>,
    bk: Option<Tensor>,
    bv: Option<Tensor>,
    wo: Tensor,       // [d, heads * hd]
    ffn_norm: Tensor, // [d]
    w_gate: Tensor,   // [ffn, d]
    w_up: Tensor,     // [ffn, d]
    w_down: Tensor,   // [d, ffn]
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

/// Keys and values of the positions seen so far, per layer: `[S, kv_heads, hd]`.
pub struct KvCache {
    k: Vec<Option<Tensor>>,
    v: Vec<Option<Tensor>>,
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

fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let y = x.matmul(&w.t()?)?;
    Ok(match b {
        Some(b) => y.add(b)?,
        None => y,
    })
}

/// RMSNorm, computed in f32: squares of the residual stream overflow f16.
fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let x32 = x.to_dtype(DType::F32)?;
    let scale = x32.sqr()?.mean(-1, true)?.add_scalar(eps as f32)?.rsqrt()?;
    Ok(x32.mul(&scale)?.to_dtype(x.dtype())?.mul(w)?)
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
            layers.push(Layer {
                attn_norm: w("attn_norm.weight", &[d])?,
                wq: w("attn_q.weight", &[config.n_heads * hd, d])?,
                wk: w("attn_k.weight", &[config.n_kv_heads * hd, d])?,
                wv: w("attn_v.weight", &[config.n_kv_heads * hd, d])?,
                bq: opt(&n("attn_q.bias"))?,
                bk: opt(&n("attn_k.bias"))?,
                bv: opt(&n("attn_v.bias"))?,
                wo: w("attn_output.weight", &[d, config.n_heads * hd])?,
                ffn_norm: w("ffn_norm.weight", &[d])?,
                w_gate: w("ffn_gate.weight", &[config.ffn_dim, d])?,
                w_up: w("ffn_up.weight", &[config.ffn_dim, d])?,
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
            k: vec![None; self.config.n_layers],
            v: vec![None; self.config.n_layers],
            len: 0,
        }
    }

    /// cos and sin of the rotation angles for positions `start..start + t`,
    /// shaped `[t, 1, hd / 2, 1]` for adjacent pairs or `[t, 1, 1, hd / 2]`.
    fn rope_tables(&self, start: usize, t: usize) -> Result<(Tensor, Tensor)> {
        let c = &self.config;
        let half = c.head_dim / 2;
        let mut cos = Vec::with_capacity(t * half);
        let mut sin = Vec::with_capacity(t * half);
        for p in start..start + t {
            let pos = p as f64 / c.rope_linear_factor;
            for i in 0..half {
                let freq = c.rope_theta.powf(-(2.0 * i as f64) / c.head_dim as f64);
                let (s, co) = (pos * freq).sin_cos();
                cos.push(co as f32);
                sin.push(s as f32);
            }
        }
        let shape = match c.rope_style {
            RopeStyle::Adjacent => [t, 1, half, 1],
            RopeStyle::Half => [t, 1, 1, half],
        };
        let mk = |v: Vec<f32>| -> Result<Tensor> {
            Ok(Tensor::from_vec(v, &shape, &Device::cpu())?
                .to_dtype(self.dtype)?
                .to_device(&self.device)?)
        };
        Ok((mk(cos)?, mk(sin)?))
    }

    /// Rotates `x [t, heads, hd]`.
    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let (t, h, hd) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let (split, dim) = match self.config.rope_style {
            RopeStyle::Adjacent => (x.reshape(&[t, h, hd / 2, 2])?, -1),
            RopeStyle::Half => (x.reshape(&[t, h, 2, hd / 2])?, -2),
        };
        let x0 = split.narrow(dim, 0, 1)?;
        let x1 = split.narrow(dim, 1, 1)?;
        let y0 = x0.mul(cos)?.sub(&x1.mul(sin)?)?;
        let y1 = x0.mul(sin)?.add(&x1.mul(cos)?)?;
        Ok(Tensor::cat(&[&y0, &y1], dim)?.reshape(&[t, h, hd])?)
    }

    /// Runs `ids` (the positions after those cached) through the model and
    /// returns f32 logits `[ids.len(), vocab]`, or `[1, vocab]` for the last
    /// position only when `last_only`.
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
        let group = h / kvh;
        let total = start + t;
        let ids_t = Tensor::from_slice(ids, &[t], &self.device)?;
        let mut x = self.embed.index_select(0, &ids_t)?; // [t, d]
        let (cos, sin) = self.rope_tables(start, t)?;
        // additive causal mask [t, total]: query i sees keys up to start + i
        let mask = if t > 1 {
            let mut m = vec![0f32; t * total];
            for i in 0..t {
                for j in start + i + 1..total {
                    m[i * total + j] = f32::NEG_INFINITY;
                }
            }
            Some(
                Tensor::from_vec(m, &[t, total], &Device::cpu())?
                    .to_dtype(self.dtype)?
                    .to_device(&self.device)?,
            )
        } else {
            None
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let mut new_k = Vec::with_capacity(self.layers.len());
        let mut new_v = Vec::with_capacity(self.layers.len());
        for (li, l) in self.layers.iter().enumerate() {
            let hn = rms_norm(&x, &l.attn_norm, c.rms_eps)?;
            let q = linear(&hn, &l.wq, l.bq.as_ref())?.reshape(&[t, h, hd])?;
            let k = linear(&hn, &l.wk, l.bk.as_ref())?.reshape(&[t, kvh, hd])?;
            let v = linear(&hn, &l.wv, l.bv.as_ref())?.reshape(&[t, kvh, hd])?;
            let q = self.rope(&q, &cos, &sin)?;
            let k = self.rope(&k, &cos, &sin)?;
            let k_all = match &cache.k[li] {
                Some(prev) => Tensor::cat(&[prev, &k], 0)?,
                None => k,
            };
            let v_all = match &cache.v[li] {
                Some(prev) => Tensor::cat(&[prev, &v], 0)?,
                None => v,
            };
            // query head kv * group + g reads KV head kv: [kvh, group * t, hd]
            let qg = q
                .reshape(&[t, kvh, group, hd])?
                .permute(&[1, 2, 0, 3])?
                .reshape(&[kvh, group * t, hd])?;
            let scores = qg.matmul(&k_all.permute(&[1, 2, 0])?)?.mul_scalar(scale)?; // [kvh, group*t, total]
            let scores = scores.reshape(&[kvh, group, t, total])?;
            let scores = match &mask {
                Some(m) => scores.add(m)?,
                None => scores,
            };
            let probs = scores.softmax(-1)?.reshape(&[kvh, group * t, total])?;
            let att = probs.matmul(&v_all.permute(&[1, 0, 2])?)?; // [kvh, group*t, hd]
            let att = att
                .reshape(&[kvh, group, t, hd])?
                .permute(&[2, 0, 1, 3])?
                .reshape(&[t, h * hd])?;
            x = x.add(&linear(&att, &l.wo, None)?)?;
            new_k.push(k_all);
            new_v.push(v_all);

            let hn = rms_norm(&x, &l.ffn_norm, c.rms_eps)?;
            let gate = linear(&hn, &l.w_gate, None)?.silu()?;
            let up = linear(&hn, &l.w_up, None)?;
            x = x.add(&linear(&gate.mul(&up)?, &l.w_down, None)?)?;
        }
        // the cache changes only once every layer succeeded: a failed step
        // leaves it as it was
        cache.k = new_k.into_iter().map(Some).collect();
        cache.v = new_v.into_iter().map(Some).collect();
        cache.len = total;
        let x = if last_only { x.narrow(0, t - 1, 1)? } else { x };
        let x = rms_norm(&x, &self.out_norm, c.rms_eps)?;
        // logits leave in f32 whatever the compute dtype: sampling reads them on the host
        Ok(linear(&x, &self.lm_head, None)?.to_dtype(DType::F32)?)
    }
}
