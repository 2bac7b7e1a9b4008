//! What Gemma 2 and Gemma 3 add to the Llama-family decoder (a child
//! module of `llama/mod.rs`): their metadata, read and checked as llama.cpp
//! reads it (`src/models/gemma2.cpp`, `gemma3.cpp`), and the attention
//! variants they need, composed from silica's ops so that they run on every
//! device: a sliding window (an additive band mask for several queries, a
//! window of the cache for one) and tanh soft-capping of the scores.
//!
//! The rest of a Gemma layer is in `llama/mod.rs`: GeGLU with tanh-GELU, the
//! post-attention and post-feed-forward RMSNorms, embeddings scaled by √d,
//! the per-head query and key RMSNorm (Gemma 3) and the final soft-cap.
//! GGUF files from llama.cpp's converter store Gemma's norm weights with
//! the `1 +` of `Gemma*RMSNorm` already added, so they are ordinary RMSNorm
//! weights here.

use std::ops::Range;

use silica::{AttentionOpts, DType, Device, Tensor};

use crate::gguf::GgufFile;
use crate::{Error, Result};

/// What a Gemma 2 or Gemma 3 file adds to [`super::LlamaConfig`].
#[derive(Clone, Debug, PartialEq)]
pub struct GemmaConfig {
    /// How many keys a local layer's query sees: its own position and the
    /// `window - 1` before it (`attention.sliding_window`). `None`: every
    /// layer is global (a Gemma 3 file without the key, as llama.cpp's
    /// converter writes models whose `sliding_window_pattern` is 1).
    pub sliding_window: Option<usize>,
    /// Per layer, whether it is local (the sliding window and the local
    /// RoPE base). From `attention.sliding_window_pattern`: a per-layer
    /// array, or `n` (layers `i` with `i % n < n - 1` are local; default 6
    /// for Gemma 3, 2 for Gemma 2), as llama.cpp's `set_swa_pattern`.
    pub local_layers: Vec<bool>,
    /// RoPE base of the local layers (`rope.freq_base_swa`; when absent
    /// 10,000 for Gemma 3 and the global base for Gemma 2). Local layers
    /// rotate without `rope.scaling`.
    pub rope_theta_local: f64,
    /// `s ↦ c · tanh(s / c)` on the scaled attention scores before the
    /// softmax (`attn_logit_softcapping`, Gemma 2).
    pub attn_softcap: Option<f32>,
    /// `l ↦ c · tanh(l / c)` on the logits (`final_logit_softcapping`:
    /// Gemma 2; Gemma 3 where the file has it).
    pub final_softcap: Option<f32>,
}

impl GemmaConfig {
    /// The Gemma keys of `f` (architecture `arch`, `gemma2` or `gemma3`).
    pub(super) fn from_gguf(
        f: &GgufFile,
        arch: &str,
        n_layers: usize,
        rope_theta: f64,
    ) -> Result<Self> {
        let key = |k: &str| format!("{arch}.{k}");
        let bad = |k: &str, what: String| Error::Format {
            path: f.path().to_path_buf(),
            offset: 0,
            msg: format!("{} {what}", key(k)),
        };
        let gemma2 = arch == "gemma2";
        // a positive number, or None where absent and optional
        let positive = |k: &str, required: bool| -> Result<Option<f64>> {
            if f.get(&key(k)).is_none() && !required {
                return Ok(None);
            }
            let v = f.get_f64(&key(k))?;
            if v.is_finite() && v > 0.0 {
                Ok(Some(v))
            } else {
                Err(bad(k, format!("is {v}, expected a positive number")))
            }
        };
        // Gemma 2 files have always carried the window (llama.cpp falls
        // back to 4,096, the released models' value); Gemma 3 files lack it
        // when every layer is global.
        let sliding_window =
            match f.get(&key("attention.sliding_window")) {
                None if gemma2 => {
                    return Err(Error::Missing {
                        path: f.path().to_path_buf(),
                        what: format!("metadata key '{}'", key("attention.sliding_window")),
                    });
                }
                None => None,
                Some(_) => match f.get_u64(&key("attention.sliding_window"))? {
                    0 => {
                        return Err(bad(
                            "attention.sliding_window",
                            "is 0, expected a positive window".into(),
                        ));
                    }
                    w => Some(usize::try_from(w).map_err(|_| {
                        bad("attention.sliding_window", format!("is {w}, too large"))
                    })?),
                },
            };
        let pattern_key = "attention.sliding_window_pattern";
        let local_layers = match f.get(&key(pattern_key)) {
            Some(v) if v.as_array().is_some() => {
                let items = v.as_array().unwrap_or_default();
                if items.len() != n_layers {
                    return Err(bad(
                        pattern_key,
                        format!("has {} entries for {n_layers} layers", items.len()),
                    ));
                }
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| {
                        item.as_bool()
                            .or_else(|| item.as_u64().map(|n| n != 0))
                            .ok_or_else(|| {
                                bad(
                                    pattern_key,
                                    format!("[{i}] is {}, expected a bool", item.type_name()),
                                )
                            })
                    })
                    .collect::<Result<Vec<bool>>>()?
            }
            found => {
                let n = match found {
                    None => {
                        if gemma2 {
                            2
                        } else {
                            6
                        }
                    }
                    Some(_) => f.get_u64(&key(pattern_key))?,
                };
                (0..n_layers as u64)
                    .map(|i| n == 0 || i % n < n - 1)
                    .collect()
            }
        };
        let local_layers = if sliding_window.is_some() {
            local_layers
        } else {
            vec![false; n_layers]
        };
        let rope_theta_local = positive("rope.freq_base_swa", false)?.unwrap_or(if gemma2 {
            rope_theta
        } else {
            10_000.0
        });
        let attn_softcap = if gemma2 {
            positive("attn_logit_softcapping", true)?
        } else {
            None
        };
        let final_softcap = positive("final_logit_softcapping", gemma2)?;
        Ok(Self {
            sliding_window,
            local_layers,
            rope_theta_local,
            attn_softcap: attn_softcap.map(|c| c as f32),
            final_softcap: final_softcap.map(|c| c as f32),
        })
    }

    /// The window of layer `layer`, if it is local.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.sliding_window
            .filter(|_| self.local_layers.get(layer).copied().unwrap_or(false))
    }
}

/// llama.cpp's query scale for Gemma (`f_attention_scale`, after
/// gemma_pytorch's `query_pre_attn_scalar`): `1 / √(d_model / heads)` for
/// the 27B models (Gemma 2's 46 layers, Gemma 3's 62), `1 / √head_dim`
/// otherwise.
pub(super) fn attention_scale(
    arch: &str,
    n_layers: usize,
    d_model: usize,
    n_heads: usize,
    head_dim: usize,
) -> f32 {
    let is_27b = matches!((arch, n_layers), ("gemma2", 46) | ("gemma3", 62));
    if is_27b {
        1.0 / ((d_model / n_heads) as f32).sqrt()
    } else {
        1.0 / (head_dim as f32).sqrt()
    }
}

/// The additive mask `[queries, keys]` of the queries at the positions
/// `queries` over the keys at the positions `keys`: 0 where a query sees a
/// key, `-inf` elsewhere. A query sees the keys at or before it (when
/// `causal`) and, with a `window`, only those less than `window` positions
/// back (llama.cpp's `is_masked_swa`: hidden when `p_query - p_key >=
/// window`).
pub(super) fn attention_mask(
    queries: Range<usize>,
    keys: Range<usize>,
    window: Option<usize>,
    causal: bool,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let (t, tk) = (queries.len(), keys.len());
    let mut m = Vec::with_capacity(t * tk);
    for q in queries {
        m.extend(keys.clone().map(|k| {
            let future = causal && k > q;
            let far = window.is_some_and(|w| q >= k && q - k >= w);
            if future || far {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        }));
    }
    Ok(Tensor::from_vec(m, &[t, tk], &Device::cpu())?
        .to_dtype(dtype)?
        .to_device(device)?)
}

/// Plain causal attention of `q` `[t, H, D]` at positions `start..` over
/// the keys and values `[tk, KVH, D]` at positions `lo..lo + tk`, with the
/// window's band `mask` where some key falls out of a query's window.
pub(super) fn windowed_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: f32,
) -> silica::Result<Tensor> {
    let opts = AttentionOpts {
        scale,
        causal: true,
    };
    q.attention(k, v, mask, opts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufWriter, MetaValue};

    /// The Gemma config of a file holding only `meta` (under `arch.`).
    fn config_of(arch: &str, n_layers: usize, meta: &[(&str, MetaValue)]) -> Result<GemmaConfig> {
        let mut w = GgufWriter::new();
        for (k, v) in meta {
            w.metadata(format!("{arch}.{k}"), v.clone())?;
        }
        let path = std::env::temp_dir().join(format!(
            "silica-gemma-config-{}-{arch}-{}.gguf",
            std::process::id(),
            meta.len()
        ));
        w.write_to_path(&path)?;
        let f = GgufFile::open(&path);
        let _ = std::fs::remove_file(&path);
        GemmaConfig::from_gguf(&f?, arch, n_layers, 1e6)
    }

    #[test]
    fn every_sixth_gemma3_layer_is_global_by_default() {
        let c = config_of(
            "gemma3",
            18,
            &[("attention.sliding_window", MetaValue::U32(512))],
        )
        .unwrap();
        let global: Vec<usize> = (0..18).filter(|&i| c.window(i).is_none()).collect();
        assert_eq!(global, [5, 11, 17]);
        assert_eq!(c.window(0), Some(512));
        assert_eq!(c.rope_theta_local, 10_000.0);
        assert_eq!((c.attn_softcap, c.final_softcap), (None, None));
    }

    #[test]
    fn gemma2_alternates_and_keeps_its_base_for_local_layers() {
        let c = config_of(
            "gemma2",
            4,
            &[
                ("attention.sliding_window", MetaValue::U32(4096)),
                ("attn_logit_softcapping", MetaValue::F32(50.0)),
                ("final_logit_softcapping", MetaValue::F32(30.0)),
            ],
        )
        .unwrap();
        assert_eq!(c.local_layers, [true, false, true, false]);
        assert_eq!(c.rope_theta_local, 1e6);
        assert_eq!((c.attn_softcap, c.final_softcap), (Some(50.0), Some(30.0)));
    }

    #[test]
    fn a_pattern_array_names_the_local_layers_and_no_window_means_all_global() {
        let pattern = MetaValue::Array(vec![
            MetaValue::Bool(false),
            MetaValue::Bool(true),
            MetaValue::Bool(true),
        ]);
        let c = config_of(
            "gemma3",
            3,
            &[
                ("attention.sliding_window", MetaValue::U32(8)),
                ("attention.sliding_window_pattern", pattern),
            ],
        )
        .unwrap();
        assert_eq!(c.local_layers, [false, true, true]);
        let c = config_of("gemma3", 3, &[]).unwrap();
        assert_eq!((c.sliding_window, c.local_layers), (None, vec![false; 3]));
    }

    #[test]
    fn the_mask_hides_the_future_and_keys_out_of_the_window() {
        // queries at 10 and 11 over keys 8..12, a window of 3
        let m = attention_mask(10..12, 8..12, Some(3), true, DType::F32, &Device::cpu()).unwrap();
        let v: Vec<f32> = m.to_vec().unwrap();
        let inf = f32::NEG_INFINITY;
        assert_eq!(v, [0.0, 0.0, 0.0, inf, inf, 0.0, 0.0, 0.0]);
    }
}
