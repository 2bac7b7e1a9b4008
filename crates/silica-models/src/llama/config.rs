//! The shape of a Llama-family model, read and checked from its GGUF
//! metadata ([`LlamaConfig`]), its rotary scaling ([`RopeScaling`]), and
//! the rotary angles that these imply, computed as llama.cpp computes them.

use silica::AttentionOpts;

use super::RopeStyle;
use super::gemma::{self, GemmaConfig};
use super::phi3::Phi3Config;
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
    /// How rotary angles are stretched for contexts longer than training.
    pub rope_scaling: RopeScaling,
    pub rope_style: RopeStyle,
    pub rms_eps: f64,
    /// RMSNorm of each query and key head before the rotation (Qwen3,
    /// Gemma 3).
    pub qk_norm: bool,
    /// Multiplies `q · k` before the softmax: `1 / √head_dim`, except
    /// where the architecture says otherwise (Gemma's 27B models).
    pub attention_scale: f32,
    /// Gemma 2 and 3: GeGLU, post-norms, scaled embeddings, sliding
    /// windows, soft-capping (`None` for the other architectures).
    pub gemma: Option<GemmaConfig>,
    /// Phi-3: LongRoPE and partial rotation (`None` for the other
    /// architectures); its stacked Q/K/V and gate/up tensors are read in
    /// `load_with`.
    pub phi3: Option<Phi3Config>,
}

/// The `rope.scaling.*` keys of a GGUF file. Per-frequency factors (Llama
/// 3.1's, in the tensor `rope_freqs.weight`) apply on top of any of them.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f64,
    },
    /// YaRN: frequencies interpolated by `factor` below the band between
    /// `beta_slow` and `beta_fast` rotations over `original_context`
    /// positions, kept above it, and every angle's cos and sin multiplied
    /// by `attn_factor · (1 + 0.1 ln factor)` (by `attn_factor` alone for
    /// a factor of at most 1), as llama.cpp does.
    Yarn {
        factor: f64,
        original_context: usize,
        beta_fast: f64,
        beta_slow: f64,
        attn_factor: f64,
    },
}

const ARCHITECTURES: [&str; 8] = [
    "llama", "mistral", "qwen2", "qwen3", "smollm", "gemma2", "gemma3", "phi3",
];

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
        if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(bad(format!(
                "inconsistent attention shape: {n_heads} heads, {n_kv_heads} KV heads \
                 ({} and {})",
                key("attention.head_count"),
                key("attention.head_count_kv")
            )));
        }
        let opt_usize = |k: &str| -> Result<Option<usize>> {
            match f.get(&key(k)) {
                None => Ok(None),
                Some(_) => Ok(Some(usize_of(k)?)),
            }
        };
        // the head size: attention.key_length where given (Qwen3, Gemma),
        // else the width split between the heads
        let head_dim = match opt_usize("attention.key_length")? {
            Some(k) => k,
            None if d_model.is_multiple_of(n_heads) => d_model / n_heads,
            None => {
                return Err(bad(format!(
                    "{} is absent and {d_model} ({}) is not a multiple of {n_heads} heads",
                    key("attention.key_length"),
                    key("embedding_length")
                )));
            }
        };
        if let Some(v) = opt_usize("attention.value_length")?
            && v != head_dim
        {
            return Err(Error::Unsupported {
                path: f.path().to_path_buf(),
                what: format!("value heads of {v} beside key heads of {head_dim}"),
            });
        }
        if head_dim == 0 || !head_dim.is_multiple_of(2) || head_dim > 256 {
            return Err(bad(format!(
                "head size {head_dim} must be even, non-zero and at most 256"
            )));
        }
        // Phi-3's partial rotation is checked with its other keys
        if let Some(rot) = opt_usize("rope.dimension_count")?
            && rot != head_dim
            && arch != "phi3"
        {
            return Err(Error::Unsupported {
                path: f.path().to_path_buf(),
                what: format!(
                    "rotary dimension {rot} ({}) with head size {head_dim}: partial rotation",
                    key("rope.dimension_count")
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
        let rope_scaling = rope_scaling(f, &arch)?;
        let n_layers = usize_of("block_count")?;
        let rope_theta = f
            .get(&key("rope.freq_base"))
            .and_then(|v| v.as_f64())
            .unwrap_or(10_000.0);
        let is_gemma = matches!(arch.as_str(), "gemma2" | "gemma3");
        let gemma = if is_gemma {
            Some(GemmaConfig::from_gguf(f, &arch, n_layers, rope_theta)?)
        } else {
            None
        };
        let context_length = usize_of("context_length")?;
        let phi3 = if arch == "phi3" {
            Some(Phi3Config::from_gguf(f, head_dim, context_length)?)
        } else {
            None
        };
        let attention_scale = if is_gemma {
            gemma::attention_scale(&arch, n_layers, d_model, n_heads, head_dim)
        } else {
            AttentionOpts::causal(head_dim).scale
        };
        Ok(Self {
            n_layers,
            d_model,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim: usize_of("feed_forward_length")?,
            vocab_size,
            context_length,
            rope_theta,
            rope_scaling,
            rope_style: if matches!(
                arch.as_str(),
                "qwen2" | "qwen3" | "gemma2" | "gemma3" | "phi3"
            ) {
                RopeStyle::Half
            } else {
                RopeStyle::Adjacent
            },
            rms_eps: f.get_f64(&key("attention.layer_norm_rms_epsilon"))?,
            qk_norm: matches!(arch.as_str(), "qwen3" | "gemma3"),
            attention_scale,
            gemma,
            phi3,
            architecture: arch,
        })
    }
}

/// The rotary scaling of an `arch` file, its keys checked.
fn rope_scaling(f: &GgufFile, arch: &str) -> Result<RopeScaling> {
    let key = |k: &str| format!("{arch}.rope.scaling.{k}");
    let bad = |k: &str, what: &str| Error::Format {
        path: f.path().to_path_buf(),
        offset: 0,
        msg: format!("{} {what}", key(k)),
    };
    let number = |k: &str, default: Option<f64>| -> Result<f64> {
        match (f.get(&key(k)), default) {
            (None, Some(d)) => Ok(d),
            _ => {
                let v = f.get_f64(&key(k))?;
                if v.is_finite() && v > 0.0 {
                    Ok(v)
                } else {
                    Err(bad(k, &format!("is {v}, expected a positive number")))
                }
            }
        }
    };
    let kind = match f.get(&key("type")) {
        None => "none",
        Some(_) => f.get_str(&key("type"))?,
    };
    Ok(match kind {
        "none" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: number("factor", Some(1.0))?,
        },
        // Phi-3's LongRoPE factors are tensors (phi3.rs); the type itself
        // is linear scaling in llama.cpp, by a factor its converter never
        // writes
        "longrope" if arch == "phi3" => RopeScaling::Linear {
            factor: number("factor", Some(1.0))?,
        },
        "yarn" => {
            let original = f.get_u64(&key("original_context_length"))?;
            if original == 0 {
                return Err(bad("original_context_length", "is 0"));
            }
            RopeScaling::Yarn {
                factor: number("factor", None)?,
                original_context: original as usize,
                beta_fast: number("yarn_beta_fast", Some(32.0))?,
                beta_slow: number("yarn_beta_slow", Some(1.0))?,
                attn_factor: number("attn_factor", Some(1.0))?,
            }
        }
        other => {
            return Err(Error::Unsupported {
                path: f.path().to_path_buf(),
                what: format!("rope scaling {other:?} ({})", key("type")),
            });
        }
    })
}

/// cos and sin of the rotation angles of positions `0..n` for a head of
/// `head_dim`, `[n, head_dim / 2]` each, as llama.cpp's rope computes
/// them: frequencies `theta^(-2i / head_dim)` divided by the per-frequency
/// `factors` (Llama 3.1's `rope_freqs`), then scaled.
pub(super) fn rope_angles(
    n: usize,
    head_dim: usize,
    theta: f64,
    factors: Option<&[f32]>,
    scaling: &RopeScaling,
) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let freqs: Vec<f64> = (0..half)
        .map(|i| {
            let f = theta.powf(-(2.0 * i as f64) / head_dim as f64);
            f / factors.map_or(1.0, |ff| f64::from(ff[i]))
        })
        .collect();
    // per frequency: (interpolated share, extrapolated share, scale); the
    // angle is pos * freq * (interp / factor + extrap)
    let mix: Vec<(f64, f64)> = match *scaling {
        RopeScaling::None => vec![(0.0, 1.0); half],
        RopeScaling::Linear { factor } => vec![(1.0 / factor, 0.0); half],
        RopeScaling::Yarn {
            factor,
            original_context,
            beta_fast,
            beta_slow,
            ..
        } => {
            let corr = |rotations: f64| {
                head_dim as f64
                    * (original_context as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln()
                    / (2.0 * theta.ln())
            };
            let low = corr(beta_fast).floor().max(0.0);
            let high = corr(beta_slow).ceil().min(head_dim as f64 - 1.0);
            (0..half)
                .map(|i| {
                    let y = (i as f64 - low) / (high - low).max(0.001);
                    let ramp = 1.0 - y.clamp(0.0, 1.0);
                    ((1.0 - ramp) / factor, ramp)
                })
                .collect()
        }
    };
    let mscale = match *scaling {
        RopeScaling::Yarn {
            factor,
            attn_factor,
            ..
        } => {
            attn_factor
                * if factor > 1.0 {
                    1.0 + 0.1 * factor.ln()
                } else {
                    1.0
                }
        }
        _ => 1.0,
    };
    let mut cos = Vec::with_capacity(n * half);
    let mut sin = Vec::with_capacity(n * half);
    for p in 0..n {
        for (freq, (interp, extrap)) in freqs.iter().zip(&mix) {
            let angle = p as f64 * freq * (interp + extrap);
            let (s, c) = angle.sin_cos();
            cos.push((c * mscale) as f32);
            sin.push((s * mscale) as f32);
        }
    }
    (cos, sin)
}
