//! [`Bert`]: a BERT-family encoder's weights on one device and its forward
//! pass.

use std::path::Path;

use silica::{AttentionOpts, DType, Device, Tensor};

use super::config::{Activation, Architecture, BertConfig};
use crate::capture::{CaptureSpec, Collector, NoTaps, Pooler, Site, Taps, check_batch};
use crate::safetensors::SafetensorsFile;
use crate::{Error, Result};

/// A dense layer: `x @ w.T + b` with `w` of shape `[out, in]`.
struct Linear {
    w: Tensor,
    b: Tensor,
}

impl Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.linear(&self.w, &self.b)?)
    }

    /// On the CPU, `w` [n, k] as a view of its transpose stored contiguous:
    /// the `gemm` crate then reads it in place, where it packs a row-major
    /// weight again at every product (two fifths of a one-sentence encode).
    fn for_device(self, device: &Device) -> Result<Linear> {
        if !device.is_cpu() {
            return Ok(self);
        }
        Ok(Linear {
            w: self.w.t()?.contiguous()?.t()?,
            b: self.b,
        })
    }
}

/// LayerNorm over the last dimension (one fused op, computed in f32
/// whatever the model dtype).
struct LayerNorm {
    w: Tensor,
    b: Tensor,
    eps: f32,
}

impl LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.layer_norm(&self.w, &self.b, self.eps)?)
    }
}

struct Layer {
    /// Query, key and value fused into one `[3H, H]` product; the query rows
    /// are pre-scaled by `1/sqrt(head_dim)`.
    qkv: Linear,
    attn_out: Linear,
    attn_ln: LayerNorm,
    intermediate: Linear,
    output: Linear,
    out_ln: LayerNorm,
}

/// A BERT-family encoder on one device.
pub struct Bert {
    config: BertConfig,
    device: Device,
    dtype: DType,
    word: Tensor,
    position: Tensor,
    token_type: Option<Tensor>,
    emb_ln: LayerNorm,
    layers: Vec<Layer>,
}

impl std::fmt::Debug for Bert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bert")
            .field("config", &self.config)
            .field("device", &self.device)
            .field("dtype", &self.dtype)
            .finish_non_exhaustive()
    }
}

/// Weight names of one architecture.
struct Names {
    word: &'static str,
    position: &'static str,
    token_type: &'static str,
    emb_ln: &'static str,
    layer: &'static str,
    q: &'static str,
    k: &'static str,
    v: &'static str,
    attn_out: &'static str,
    attn_ln: &'static str,
    intermediate: &'static str,
    output: &'static str,
    out_ln: &'static str,
}

const BERT_NAMES: Names = Names {
    word: "embeddings.word_embeddings.weight",
    position: "embeddings.position_embeddings.weight",
    token_type: "embeddings.token_type_embeddings.weight",
    emb_ln: "embeddings.LayerNorm",
    layer: "encoder.layer",
    q: "attention.self.query",
    k: "attention.self.key",
    v: "attention.self.value",
    attn_out: "attention.output.dense",
    attn_ln: "attention.output.LayerNorm",
    intermediate: "intermediate.dense",
    output: "output.dense",
    out_ln: "output.LayerNorm",
};

const DISTILBERT_NAMES: Names = Names {
    word: "embeddings.word_embeddings.weight",
    position: "embeddings.position_embeddings.weight",
    token_type: "",
    emb_ln: "embeddings.LayerNorm",
    layer: "transformer.layer",
    q: "attention.q_lin",
    k: "attention.k_lin",
    v: "attention.v_lin",
    attn_out: "attention.out_lin",
    attn_ln: "sa_layer_norm",
    intermediate: "ffn.lin1",
    output: "ffn.lin2",
    out_ln: "output_layer_norm",
};

/// Reads weights with shape checks.
struct Loader<'a> {
    st: &'a SafetensorsFile,
    device: &'a Device,
    dtype: DType,
}

impl Loader<'_> {
    fn tensor(&self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.st.load_shaped(name, shape, self.device, dtype)
    }

    fn linear(&self, prefix: &str, out: usize, inp: usize) -> Result<Linear> {
        Ok(Linear {
            w: self.tensor(&format!("{prefix}.weight"), &[out, inp], self.dtype)?,
            b: self.tensor(&format!("{prefix}.bias"), &[out], self.dtype)?,
        })
    }

    /// `prefix.weight`/`prefix.bias`, or the older `gamma`/`beta`.
    fn layer_norm(&self, prefix: &str, size: usize, eps: f64) -> Result<LayerNorm> {
        let (w, b) = if self.st.contains(&format!("{prefix}.weight")) {
            ("weight", "bias")
        } else if self.st.contains(&format!("{prefix}.gamma")) {
            ("gamma", "beta")
        } else {
            ("weight", "bias")
        };
        Ok(LayerNorm {
            w: self.tensor(&format!("{prefix}.{w}"), &[size], self.dtype)?,
            b: self.tensor(&format!("{prefix}.{b}"), &[size], self.dtype)?,
            eps: eps as f32,
        })
    }
}

impl Bert {
    /// Loads `config.json` and `model.safetensors` from the folder `dir`.
    pub fn load(dir: impl AsRef<Path>, device: &Device, dtype: DType) -> Result<Bert> {
        let dir = dir.as_ref();
        let config = BertConfig::from_file(dir.join("config.json"))?;
        let st = SafetensorsFile::open(dir.join("model.safetensors"))?;
        Bert::from_safetensors(config, &st, device, dtype)
    }

    /// Builds the encoder from the weights of `st` (names with or without a
    /// `bert.`/`model.`/`distilbert.` prefix) in `dtype` (F32, F16 or BF16).
    pub fn from_safetensors(
        config: BertConfig,
        st: &SafetensorsFile,
        device: &Device,
        dtype: DType,
    ) -> Result<Bert> {
        if !dtype.is_float() {
            return Err(Error::InvalidInput(format!(
                "a BERT model runs in f32, f16 or bf16, not {dtype}"
            )));
        }
        let names = match config.architecture {
            Architecture::Bert => &BERT_NAMES,
            Architecture::DistilBert => &DISTILBERT_NAMES,
        };
        let ld = Loader { st, device, dtype };
        let h = config.hidden_size;
        let eps = config.layer_norm_eps;
        let word = ld.tensor(names.word, &[config.vocab_size, h], dtype)?;
        let position = ld.tensor(names.position, &[config.max_position_embeddings, h], dtype)?;
        let token_type = if config.type_vocab_size > 0 {
            Some(ld.tensor(names.token_type, &[config.type_vocab_size, h], dtype)?)
        } else {
            None
        };
        let emb_ln = ld.layer_norm(names.emb_ln, h, eps)?;
        let scale = 1.0 / (config.head_dim() as f32).sqrt();
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("{}.{i}", names.layer);
            let q = ld.linear(&format!("{p}.{}", names.q), h, h)?;
            let k = ld.linear(&format!("{p}.{}", names.k), h, h)?;
            let v = ld.linear(&format!("{p}.{}", names.v), h, h)?;
            let qkv = Linear {
                w: Tensor::cat(&[&q.w.mul_scalar(scale)?, &k.w, &v.w], 0)?,
                b: Tensor::cat(&[&q.b.mul_scalar(scale)?, &k.b, &v.b], 0)?,
            };
            layers.push(Layer {
                qkv: qkv.for_device(device)?,
                attn_out: ld
                    .linear(&format!("{p}.{}", names.attn_out), h, h)?
                    .for_device(device)?,
                attn_ln: ld.layer_norm(&format!("{p}.{}", names.attn_ln), h, eps)?,
                intermediate: ld
                    .linear(
                        &format!("{p}.{}", names.intermediate),
                        config.intermediate_size,
                        h,
                    )?
                    .for_device(device)?,
                output: ld
                    .linear(
                        &format!("{p}.{}", names.output),
                        h,
                        config.intermediate_size,
                    )?
                    .for_device(device)?,
                out_ln: ld.layer_norm(&format!("{p}.{}", names.out_ln), h, eps)?,
            });
        }
        Ok(Bert {
            config,
            device: device.clone(),
            dtype,
            word,
            position,
            token_type,
            emb_ln,
            layers,
        })
    }

    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The last hidden states `[B, T, H]` (in the model dtype).
    ///
    /// `input_ids`: `[B, T]`, U32 or I64. `attention_mask`: `[B, T]`, any
    /// dtype, 1 for real tokens and 0 for padding. `token_type_ids`: `[B, T]`
    /// U32 or I64, or `None` for all zeros (ignored by models without token
    /// types).
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        token_type_ids: Option<&Tensor>,
    ) -> Result<Tensor> {
        let layers = self.config.num_hidden_layers;
        self.forward_taps(
            input_ids,
            attention_mask,
            token_type_ids,
            &mut NoTaps,
            layers,
        )
    }

    /// The states `spec` names for each sequence of `batch` (token ids, as
    /// the tokenizer gives them, special tokens included): one f32 tensor
    /// per point, on the model's device, `[B, d]` for last-token and mean
    /// pooling (over the sequence's own tokens), `[sum of lengths, d]` for
    /// all tokens. Layer 0 is the embeddings' output, layer `i` block
    /// `i`'s; the attention and MLP sites are the dense outputs before
    /// their residual sums and LayerNorms (see [`crate::capture`]).
    pub fn capture(&self, batch: &[&[u32]], spec: &CaptureSpec) -> Result<Vec<Tensor>> {
        let cfg = &self.config;
        spec.check(cfg.num_hidden_layers)?;
        let t = check_batch(batch, cfg.vocab_size)?;
        let b = batch.len();
        let mut ids = vec![0u32; b * t];
        let mut mask = vec![0f32; b * t];
        for (row, s) in batch.iter().enumerate() {
            ids[row * t..row * t + s.len()].copy_from_slice(s);
            mask[row * t..row * t + s.len()].fill(1.0);
        }
        let lens: Vec<usize> = batch.iter().map(|s| s.len()).collect();
        let ids = Tensor::from_vec(ids, &[b, t], &self.device)?;
        let mask = Tensor::from_vec(mask, &[b, t], &self.device)?;
        let mut collector = Collector::new(spec, Pooler::new(spec.pool, &lens, t, &self.device)?);
        self.forward_taps(&ids, &mask, None, &mut collector, spec.deepest())?;
        collector.finish()
    }

    /// [`Bert::forward`] showing `taps` the states it asks for and
    /// stopping after block `stop`.
    fn forward_taps(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        token_type_ids: Option<&Tensor>,
        taps: &mut dyn Taps,
        stop: usize,
    ) -> Result<Tensor> {
        let cfg = &self.config;
        let &[b, t] = input_ids.shape() else {
            return Err(Error::InvalidInput(format!(
                "input_ids must have shape [batch, tokens], not {:?}",
                input_ids.shape()
            )));
        };
        if b == 0 || t == 0 {
            return Err(Error::InvalidInput(format!(
                "empty input of shape {:?}",
                input_ids.shape()
            )));
        }
        if t > cfg.max_position_embeddings {
            return Err(Error::InvalidInput(format!(
                "{t} tokens is more than the model's {} positions",
                cfg.max_position_embeddings
            )));
        }
        for (what, shape) in [
            ("attention_mask", Some(attention_mask.shape())),
            ("token_type_ids", token_type_ids.map(Tensor::shape)),
        ] {
            if let Some(shape) = shape
                && shape != [b, t]
            {
                return Err(Error::InvalidInput(format!(
                    "{what} has shape {shape:?}, input_ids {:?}",
                    [b, t]
                )));
            }
        }
        let h = cfg.hidden_size;
        let n = b * t;

        // Embeddings: word + position + token type, then LayerNorm.
        let words = self.word.index_select(0, &input_ids.reshape(&[n])?)?;
        let mut x = words
            .reshape(&[b, t, h])?
            .add(&self.position.narrow(0, 0, t)?)?;
        if let Some(table) = &self.token_type {
            x = match token_type_ids {
                Some(tt) => x.add(
                    &table
                        .index_select(0, &tt.reshape(&[n])?)?
                        .reshape(&[b, t, h])?,
                )?,
                None => x.add(&table.narrow(0, 0, 1)?)?,
            };
        }
        let mut x = self.emb_ln.forward(&x.reshape(&[n, h])?)?;

        // The padding mask as an additive bias on the attention scores.
        let big = if self.dtype == DType::F16 {
            3.0e4
        } else {
            1.0e9
        };
        let bias = attention_mask
            .to_dtype(self.dtype)?
            .sub_scalar(1.0)?
            .mul_scalar(big)?
            .reshape(&[b, 1, 1, t])?;

        taps.put(0, Site::Residual, &x)?;
        for (li, layer) in self.layers.iter().enumerate().take(stop) {
            x = self.layer_forward(layer, li + 1, &x, &bias, b, t, taps)?;
            taps.put(li + 1, Site::Residual, &x)?;
        }
        Ok(x.reshape(&[b, t, h])?)
    }

    #[allow(clippy::too_many_arguments)]
    fn layer_forward(
        &self,
        layer: &Layer,
        index: usize,
        x: &Tensor,
        bias: &Tensor,
        b: usize,
        t: usize,
        taps: &mut dyn Taps,
    ) -> Result<Tensor> {
        let cfg = &self.config;
        let (h, nh, hd) = (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim());
        // [n, 3H] -> [B, T, 3, heads, head_dim]; q, k, v are views [B, T, heads, head_dim]
        let qkv = layer.qkv.forward(x)?.reshape(&[b, t, 3, nh, hd])?;
        let q = qkv.narrow(2, 0, 1)?.squeeze(2)?;
        let k = qkv.narrow(2, 1, 1)?.squeeze(2)?;
        let v = qkv.narrow(2, 2, 1)?.squeeze(2)?;
        // the query rows of the weights are pre-scaled: scale 1
        let opts = AttentionOpts {
            scale: 1.0,
            causal: false,
        };
        let ctx = q
            .attention(&k, &v, Some(bias), opts)?
            .reshape(&[b * t, h])?;
        let attn = layer.attn_out.forward(&ctx)?;
        taps.put(index, Site::Attention, &attn)?;
        let x = layer.attn_ln.forward(&attn.add(x)?)?;
        let inter = layer.intermediate.forward(&x)?;
        let inter = match cfg.hidden_act {
            Activation::GeluErf => inter.gelu_erf()?,
            Activation::GeluTanh => inter.gelu_tanh()?,
        };
        let mlp = layer.output.forward(&inter)?;
        taps.put(index, Site::Mlp, &mlp)?;
        layer.out_ln.forward(&mlp.add(&x)?)
    }
}
