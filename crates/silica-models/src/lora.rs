//! LoRA adapters: low-rank updates `W + s · B · A` of a Llama-family
//! model's projections, read from PEFT folders (`adapter_config.json` +
//! `adapter_model.safetensors`) or llama.cpp GGUF adapters.
//!
//! An adapter is held in the base GGUF's terms: one [`LoraWeight`] per
//! base tensor name (`blk.3.attn_q.weight`), `a` `[r, in]` and `b` `[out,
//! r]` as plain tensors on a device (so that autograd `Var`s can wrap them
//! for training), with the scale its file implies (`alpha / r`, or `alpha
//! / √r` for rsLoRA). PEFT's names are mapped onto the GGUF ones, and for
//! the architectures whose GGUF query and key rows llama.cpp's converter
//! permuted for its adjacent-pairs rotation (Llama, Mistral, SmolLM: the
//! [`RopeStyle::Adjacent`] ones), B's rows of `q_proj` and `k_proj` get the
//! same permutation, as llama.cpp's `convert_lora_to_gguf.py` does. A GGUF
//! adapter is already in that order.
//!
//! [`Llama::set_adapters`](crate::llama::Llama::set_adapters) applies
//! adapters beside the base products at run time;
//! [`LoraAdapter::merge_rows`] adds them into dequantized weights (`silica
//! quantize --lora`).
//!
//! ```no_run
//! use silica::{DType, Device};
//! use silica_models::gguf::GgufFile;
//! use silica_models::llama::Llama;
//! use silica_models::lora::LoraAdapter;
//! let dev = Device::cpu();
//! let gguf = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let mut model = Llama::load(&gguf, &dev, DType::F32)?;
//! let adapter = LoraAdapter::open("my-adapter/", &model.config, &dev, DType::F32)?;
//! model.set_adapters(&[(&adapter, 1.0)])?;
//! # Ok::<(), silica_models::Error>(())
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use silica::{DType, Device, RopeStyle, Tensor};

use crate::gguf::GgufFile;
use crate::llama::LlamaConfig;
use crate::safetensors::SafetensorsFile;
use crate::{Error, Result};

/// One projection's low-rank update: `delta(x) = scale · (x @ aᵀ) @ bᵀ`.
#[derive(Clone, Debug)]
pub struct LoraWeight {
    /// `[r, in]`.
    pub a: Tensor,
    /// `[out, r]`, rows in the base GGUF tensor's order.
    pub b: Tensor,
    /// `alpha / r` (`alpha / √r` with rsLoRA; 1 for a GGUF adapter without
    /// an alpha), before the scale the adapter is applied at.
    pub scale: f32,
}

impl LoraWeight {
    /// The rank `r`.
    pub fn rank(&self) -> usize {
        self.a.shape()[0]
    }
}

/// A LoRA adapter in the base GGUF's tensor names (see the module
/// documentation).
#[derive(Clone, Debug)]
pub struct LoraAdapter {
    path: PathBuf,
    weights: BTreeMap<String, LoraWeight>,
}

/// PEFT's projection names and the GGUF tensor each becomes.
const PEFT_MODULES: [(&str, &str); 9] = [
    ("q_proj", "attn_q"),
    ("k_proj", "attn_k"),
    ("v_proj", "attn_v"),
    ("o_proj", "attn_output"),
    ("qkv_proj", "attn_qkv"),
    ("gate_proj", "ffn_gate"),
    ("up_proj", "ffn_up"),
    ("down_proj", "ffn_down"),
    ("gate_up_proj", "ffn_up"),
];

/// The shape `[out, in]` of the base's projection `module` (a GGUF name
/// such as `attn_q`), or `None` where the base has no such tensor.
pub fn base_shape(config: &LlamaConfig, module: &str) -> Option<[usize; 2]> {
    let (d, ffn) = (config.d_model, config.ffn_dim);
    let (qd, kvd) = (
        config.n_heads * config.head_dim,
        config.n_kv_heads * config.head_dim,
    );
    // Phi-3 stores Q/K/V and gate/up stacked (attn_qkv, ffn_up of 2·ffn rows)
    let phi3 = config.phi3.is_some();
    Some(match module {
        "attn_q" if !phi3 => [qd, d],
        "attn_k" | "attn_v" if !phi3 => [kvd, d],
        "attn_qkv" if phi3 => [qd + 2 * kvd, d],
        "attn_output" => [d, qd],
        "ffn_gate" if !phi3 => [ffn, d],
        "ffn_up" if !phi3 => [ffn, d],
        "ffn_up" => [2 * ffn, d],
        "ffn_down" => [d, ffn],
        _ => return None,
    })
}

/// Splits `blk.N.module.weight` into `(N, module)`.
pub fn split_name(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("blk.")?.strip_suffix(".weight")?;
    let (layer, module) = rest.split_once('.')?;
    Some((layer.parse().ok()?, module))
}

/// llama.cpp's `LlamaModel.permute` of a query or key matrix's rows for
/// `heads` heads: within each head, the rows of the first half and the
/// second half interleave (row `2i + j` is the old row `j · hd/2 + i`).
/// `rows` is `[heads · hd, cols]` row-major.
fn permute_rope_rows(rows: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let hd = rows.len() / cols / heads;
    let half = hd / 2;
    let mut out = vec![0f32; rows.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let new = h * hd + 2 * i + j;
                let old = h * hd + j * half + i;
                out[new * cols..(new + 1) * cols]
                    .copy_from_slice(&rows[old * cols..(old + 1) * cols]);
            }
        }
    }
    out
}

/// What [`LoraAdapter::open`] reads of `adapter_config.json`.
struct PeftConfig {
    r: usize,
    alpha: f64,
    rslora: bool,
    /// `rank_pattern` and `alpha_pattern`: per-module overrides, keyed by
    /// a module name's ending.
    rank_pattern: Vec<(String, usize)>,
    alpha_pattern: Vec<(String, f64)>,
}

impl PeftConfig {
    fn parse(path: &Path, text: &str) -> Result<Self> {
        let bad = |msg: String| Error::Format {
            path: path.to_path_buf(),
            offset: 0,
            msg,
        };
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        if let Some(t) = v.get("peft_type").and_then(|t| t.as_str())
            && t != "LORA"
        {
            return Err(Error::Unsupported {
                path: path.to_path_buf(),
                what: format!("peft_type {t} (only LORA adapters)"),
            });
        }
        for (key, what) in [
            ("use_dora", "DoRA adapters (use_dora)"),
            ("fan_in_fan_out", "fan_in_fan_out weights (GPT-2's Conv1D)"),
        ] {
            if v.get(key).and_then(|x| x.as_bool()) == Some(true) {
                return Err(Error::Unsupported {
                    path: path.to_path_buf(),
                    what: what.into(),
                });
            }
        }
        let r = v
            .get("r")
            .and_then(|r| r.as_u64())
            .ok_or_else(|| bad("no rank `r` (a whole number)".into()))? as usize;
        if r == 0 {
            return Err(bad("rank `r` is 0".into()));
        }
        let alpha = match v.get("lora_alpha") {
            None | Some(serde_json::Value::Null) => r as f64,
            Some(a) => a
                .as_f64()
                .ok_or_else(|| bad(format!("lora_alpha is {a}, not a number")))?,
        };
        let pattern = |key: &str| -> Vec<(String, f64)> {
            v.get(key)
                .and_then(|p| p.as_object())
                .map(|o| {
                    o.iter()
                        .filter_map(|(k, x)| Some((k.clone(), x.as_f64()?)))
                        .collect()
                })
                .unwrap_or_default()
        };
        Ok(PeftConfig {
            r,
            alpha,
            rslora: v.get("use_rslora").and_then(|x| x.as_bool()) == Some(true),
            rank_pattern: pattern("rank_pattern")
                .into_iter()
                .map(|(k, x)| (k, x as usize))
                .collect(),
            alpha_pattern: pattern("alpha_pattern"),
        })
    }

    /// The rank and alpha of the module `name` (PEFT's dotted module path).
    fn rank_alpha(&self, name: &str) -> (usize, f64) {
        let matches = |key: &str| name == key || name.ends_with(&format!(".{key}"));
        let r = self
            .rank_pattern
            .iter()
            .find(|(k, _)| matches(k))
            .map_or(self.r, |(_, r)| *r);
        let alpha = self
            .alpha_pattern
            .iter()
            .find(|(k, _)| matches(k))
            .map_or(self.alpha, |(_, a)| *a);
        (r, alpha)
    }

    fn scale(&self, r: usize, alpha: f64) -> f32 {
        let r = r as f64;
        (if self.rslora {
            alpha / r.sqrt()
        } else {
            alpha / r
        }) as f32
    }
}

impl LoraAdapter {
    /// Reads the adapter at `path` for a base model of shape `config`, its
    /// tensors on `device` in `dtype`: a PEFT folder, its
    /// `adapter_model.safetensors` (with `adapter_config.json` beside it),
    /// or a llama.cpp GGUF adapter. A tensor the base has no counterpart
    /// for, of another shape than the base's, or of rank 0 is an error
    /// naming it.
    pub fn open(
        path: impl AsRef<Path>,
        config: &LlamaConfig,
        device: &Device,
        dtype: DType,
    ) -> Result<Self> {
        let path = path.as_ref();
        let (config_path, weights_path) = if path.is_dir() {
            (
                path.join("adapter_config.json"),
                path.join("adapter_model.safetensors"),
            )
        } else if is_gguf(path)? {
            let f = GgufFile::open(path)?;
            return Self::from_gguf(&f, config, device, dtype);
        } else if path.file_name().is_some_and(|n| n == "adapter_config.json") {
            let dir = path.parent().unwrap_or(Path::new("."));
            (path.to_path_buf(), dir.join("adapter_model.safetensors"))
        } else {
            let dir = path.parent().unwrap_or(Path::new("."));
            (dir.join("adapter_config.json"), path.to_path_buf())
        };
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|source| Error::Io {
                path: p.to_path_buf(),
                source,
            })
        };
        if !weights_path.is_file() && weights_path.with_extension("bin").is_file() {
            return Err(Error::Unsupported {
                path: weights_path.with_extension("bin"),
                what: "pickled PyTorch adapters (save it as safetensors)".into(),
            });
        }
        let peft = PeftConfig::parse(&config_path, &read(&config_path)?)?;
        let st = SafetensorsFile::open(&weights_path)?;
        Self::from_peft(&peft, &st, config, device, dtype)
    }

    /// An adapter of the given weights (keyed by base GGUF tensor name),
    /// checked against `config` as [`LoraAdapter::open`] checks a file's;
    /// `name` stands for the path in error messages.
    pub fn from_weights(
        name: &str,
        weights: BTreeMap<String, LoraWeight>,
        config: &LlamaConfig,
    ) -> Result<Self> {
        let path = PathBuf::from(name);
        for (base, w) in &weights {
            check_weight(&path, base, base, w.a.shape(), w.b.shape(), config)?;
        }
        Ok(LoraAdapter { path, weights })
    }

    fn from_peft(
        peft: &PeftConfig,
        st: &SafetensorsFile,
        config: &LlamaConfig,
        device: &Device,
        dtype: DType,
    ) -> Result<Self> {
        let path = st.path().to_path_buf();
        let unsupported = |what: String| Error::Unsupported {
            path: path.clone(),
            what,
        };
        // base name -> (module path, A's stored name, B's stored name)
        let mut pairs: BTreeMap<String, (String, Option<String>, Option<String>)> = BTreeMap::new();
        for stored in st.names() {
            let name = stored.strip_prefix("base_model.model.").unwrap_or(&stored);
            let name = name.strip_prefix("model.").unwrap_or(name);
            // `...q_proj.lora_A.weight`, or `lora_A.<adapter>.weight` as
            // some trainers save it
            let (module_path, is_a) = match name.split_once(".lora_A.") {
                Some((m, w)) if w.ends_with("weight") => (m, true),
                _ => match name.split_once(".lora_B.") {
                    Some((m, w)) if w.ends_with("weight") => (m, false),
                    _ => {
                        return Err(unsupported(format!(
                            "tensor '{stored}': not a lora_A or lora_B weight (full weights, \
                             embeddings, DoRA magnitudes and biases are not supported)"
                        )));
                    }
                },
            };
            let base = peft_to_gguf(module_path).ok_or_else(|| {
                let known: Vec<&str> = PEFT_MODULES.iter().map(|m| m.0).collect();
                unsupported(format!(
                    "tensor '{stored}': module '{module_path}' has no counterpart in a \
                     Llama-family GGUF (layers.N.self_attn/mlp.{{{}}})",
                    known.join(", ")
                ))
            })?;
            let entry = pairs
                .entry(base)
                .or_insert_with(|| (module_path.to_string(), None, None));
            if is_a {
                entry.1 = Some(stored.clone());
            } else {
                entry.2 = Some(stored.clone());
            }
        }
        if pairs.is_empty() {
            return Err(unsupported("no lora_A / lora_B tensors".into()));
        }
        let mut weights = BTreeMap::new();
        for (base, (module_path, a_name, b_name)) in pairs {
            let (Some(a_name), Some(b_name)) = (a_name, b_name) else {
                return Err(Error::Missing {
                    path: path.clone(),
                    what: format!("the lora_A or lora_B half of '{module_path}' ({base})"),
                });
            };
            let a_shape = st.meta(&a_name).map(|m| m.shape).unwrap_or_default();
            let b_shape = st.meta(&b_name).map(|m| m.shape).unwrap_or_default();
            check_weight(&path, &a_name, &base, &a_shape, &b_shape, config)?;
            let (r, alpha) = peft.rank_alpha(&module_path);
            if r != a_shape[0] {
                return Err(Error::Format {
                    path: path.clone(),
                    offset: 0,
                    msg: format!(
                        "tensor '{a_name}' has rank {} but adapter_config.json says r = {r}",
                        a_shape[0]
                    ),
                });
            }
            let a = st.load(&a_name, &Device::cpu(), DType::F32)?;
            let mut b = st.load(&b_name, &Device::cpu(), DType::F32)?;
            // llama.cpp's converter permuted these rows of the base weight
            if config.rope_style == RopeStyle::Adjacent {
                let heads = match split_name(&base).map(|(_, m)| m) {
                    Some("attn_q") => Some(config.n_heads),
                    Some("attn_k") => Some(config.n_kv_heads),
                    _ => None,
                };
                if let Some(heads) = heads {
                    let rows = permute_rope_rows(&b.to_vec::<f32>()?, heads, r);
                    b = Tensor::from_vec(rows, &b_shape, &Device::cpu())?;
                }
            }
            let place = |t: Tensor| -> Result<Tensor> { Ok(t.to_dtype(dtype)?.to_device(device)?) };
            weights.insert(
                base,
                LoraWeight {
                    a: place(a)?,
                    b: place(b)?,
                    scale: peft.scale(r, alpha),
                },
            );
        }
        Ok(LoraAdapter { path, weights })
    }

    /// Reads a llama.cpp GGUF adapter (`general.type = adapter`,
    /// `adapter.type = lora`, `blk.N.<module>.weight.lora_a` `[r, in]` and
    /// `.lora_b` `[out, r]`, scale `adapter.lora.alpha / r`).
    pub fn from_gguf(
        f: &GgufFile,
        config: &LlamaConfig,
        device: &Device,
        dtype: DType,
    ) -> Result<Self> {
        let path = f.path().to_path_buf();
        let kind = f.get("general.type").and_then(|v| v.as_str());
        if kind != Some("adapter") {
            return Err(Error::Unsupported {
                path,
                what: format!(
                    "general.type is {}, not adapter: a model file, not a LoRA adapter",
                    kind.unwrap_or("absent")
                ),
            });
        }
        let adapter_type = f.get("adapter.type").and_then(|v| v.as_str());
        if adapter_type != Some("lora") {
            return Err(Error::Unsupported {
                path,
                what: format!(
                    "adapter.type {} (only lora)",
                    adapter_type.unwrap_or("absent")
                ),
            });
        }
        if let Some(arch) = f.get("general.architecture").and_then(|v| v.as_str())
            && arch != config.architecture
        {
            return Err(Error::InvalidInput(format!(
                "{}: the adapter is for a {arch} model, the base is {}",
                path.display(),
                config.architecture
            )));
        }
        let alpha = f
            .get("adapter.lora.alpha")
            .and_then(|v| v.as_f64())
            .unwrap_or(0.0);
        let mut names: BTreeMap<String, (Option<&str>, Option<&str>)> = BTreeMap::new();
        for info in f.tensors() {
            let name = info.name.as_str();
            if let Some(base) = name.strip_suffix(".lora_a") {
                names.entry(base.to_string()).or_default().0 = Some(name);
            } else if let Some(base) = name.strip_suffix(".lora_b") {
                names.entry(base.to_string()).or_default().1 = Some(name);
            } else {
                return Err(Error::Unsupported {
                    path,
                    what: format!(
                        "tensor '{name}': not a .lora_a or .lora_b tensor (adapters that \
                         replace whole tensors are not supported)"
                    ),
                });
            }
        }
        if names.is_empty() {
            return Err(Error::Unsupported {
                path,
                what: "no .lora_a / .lora_b tensors".into(),
            });
        }
        let mut weights = BTreeMap::new();
        for (base, pair) in names {
            let (Some(a_name), Some(b_name)) = pair else {
                return Err(Error::Missing {
                    path,
                    what: format!("the lora_a or lora_b half of '{base}'"),
                });
            };
            let (a_shape, a) = f.dequantize(a_name)?;
            let (b_shape, b) = f.dequantize(b_name)?;
            check_weight(&path, a_name, &base, &a_shape, &b_shape, config)?;
            let r = a_shape[0];
            let place = |v: Vec<f32>, shape: &[usize]| -> Result<Tensor> {
                Ok(Tensor::from_vec(v, shape, &Device::cpu())?
                    .to_dtype(dtype)?
                    .to_device(device)?)
            };
            weights.insert(
                base,
                LoraWeight {
                    a: place(a, &a_shape)?,
                    b: place(b, &b_shape)?,
                    // llama.cpp: no alpha (0) means unscaled
                    scale: if alpha != 0.0 {
                        (alpha / r as f64) as f32
                    } else {
                        1.0
                    },
                },
            );
        }
        Ok(LoraAdapter { path, weights })
    }

    /// The file or folder the adapter came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The updates by base GGUF tensor name, in name order.
    pub fn weights(&self) -> impl Iterator<Item = (&str, &LoraWeight)> {
        self.weights.iter().map(|(k, w)| (k.as_str(), w))
    }

    /// The update of the base tensor `name`, if the adapter has one.
    pub fn get(&self, name: &str) -> Option<&LoraWeight> {
        self.weights.get(name)
    }

    /// Adds `scale · s · B[first..first + n] @ A` (`s` the weight's own
    /// scale) to `rows`, `n` rows of the base tensor `name` from row
    /// `first` (`[n, in]` row-major f32): a slice of the merge `W + s·B·A`.
    /// Nothing happens where the adapter does not touch `name`.
    pub fn merge_rows(&self, name: &str, first: usize, rows: &mut [f32], scale: f32) -> Result<()> {
        let Some(w) = self.weights.get(name) else {
            return Ok(());
        };
        let (r, cols) = (w.a.shape()[0], w.a.shape()[1]);
        let n = rows.len() / cols;
        let a = w.a.to_dtype(DType::F32)?.to_vec::<f32>()?; // [r, in]
        let b =
            w.b.narrow(0, first, n)?
                .to_dtype(DType::F32)?
                .to_vec::<f32>()?; // [n, r]
        let s = scale * w.scale;
        for (i, row) in rows.chunks_exact_mut(cols).enumerate() {
            for k in 0..r {
                let coef = s * b[i * r + k];
                for (x, &ak) in row.iter_mut().zip(&a[k * cols..(k + 1) * cols]) {
                    *x += coef * ak;
                }
            }
        }
        Ok(())
    }
}

/// True when the file at `path` starts with GGUF's magic.
fn is_gguf(path: &Path) -> Result<bool> {
    use std::io::Read;
    let mut magic = [0u8; 4];
    let mut file = std::fs::File::open(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(file.read_exact(&mut magic).is_ok() && &magic == b"GGUF")
}

/// `layers.N.self_attn.q_proj` (or `model.`-prefixed) -> `blk.N.attn_q.weight`.
fn peft_to_gguf(module_path: &str) -> Option<String> {
    let rest = module_path.strip_prefix("layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let proj = rest
        .strip_prefix("self_attn.")
        .or_else(|| rest.strip_prefix("mlp."))?;
    let module = PEFT_MODULES.iter().find(|m| m.0 == proj)?.1;
    Some(format!("blk.{layer}.{module}.weight"))
}

/// Checks one update's shapes against the base: `a` `[r, in]` and `b`
/// `[out, r]` with `r > 0` and `[out, in]` the base tensor's shape.
fn check_weight(
    path: &Path,
    tensor: &str,
    base: &str,
    a: &[usize],
    b: &[usize],
    config: &LlamaConfig,
) -> Result<()> {
    let bad =
        |msg: String| Error::InvalidInput(format!("{}: tensor '{tensor}': {msg}", path.display()));
    let (layer, module) = split_name(base).ok_or_else(|| {
        bad(format!(
            "targets {base}, not a blk.N.<module>.weight tensor"
        ))
    })?;
    if layer >= config.n_layers {
        return Err(bad(format!(
            "targets layer {layer}, but the base model ({}) has {} layers",
            config.architecture, config.n_layers
        )));
    }
    let [out, inp] = base_shape(config, module).ok_or_else(|| {
        bad(format!(
            "targets {base}, which the base model ({}) does not have",
            config.architecture
        ))
    })?;
    let [r, a_in] = a else {
        return Err(bad(format!("lora_a has shape {a:?}, expected [r, {inp}]")));
    };
    if *r == 0 {
        return Err(bad("rank 0".into()));
    }
    if *a_in != inp || b != [out, *r] {
        return Err(bad(format!(
            "lora_a {a:?} and lora_b {b:?} do not fit {base} [{out}, {inp}] of the base \
             model: expected [r, {inp}] and [{out}, r] (an adapter for another model?)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peft_names_map_to_gguf_ones() {
        assert_eq!(
            peft_to_gguf("layers.3.self_attn.q_proj").as_deref(),
            Some("blk.3.attn_q.weight")
        );
        assert_eq!(
            peft_to_gguf("layers.12.mlp.gate_up_proj").as_deref(),
            Some("blk.12.ffn_up.weight")
        );
        assert_eq!(peft_to_gguf("layers.1.self_attn.c_attn"), None);
        assert_eq!(peft_to_gguf("lm_head"), None);
    }

    /// The permutation is llama.cpp's `reshape(h, 2, hd/2, ..).swapaxes(1, 2)`.
    #[test]
    fn rope_permutation_interleaves_the_halves_of_each_head() {
        // 2 heads of 4 rows, 1 column: head rows [0 1 | 2 3] -> [0 2 1 3]
        let rows: Vec<f32> = (0..8).map(|i| i as f32).collect();
        assert_eq!(
            permute_rope_rows(&rows, 2, 1),
            vec![0., 2., 1., 3., 4., 6., 5., 7.]
        );
        // columns travel with their row
        let rows: Vec<f32> = (0..8).map(|i| i as f32).collect();
        assert_eq!(
            permute_rope_rows(&rows, 1, 2),
            vec![0., 1., 4., 5., 2., 3., 6., 7.]
        );
    }

    #[test]
    fn rslora_scales_by_the_square_root_of_the_rank() {
        let text = r#"{"peft_type": "LORA", "r": 16, "lora_alpha": 32, "use_rslora": true,
                       "alpha_pattern": {"down_proj": 8}}"#;
        let c = PeftConfig::parse(Path::new("adapter_config.json"), text).unwrap();
        let (r, alpha) = c.rank_alpha("layers.0.self_attn.q_proj");
        assert_eq!(c.scale(r, alpha), 8.0);
        let (r, alpha) = c.rank_alpha("layers.0.mlp.down_proj");
        assert_eq!(c.scale(r, alpha), 2.0);
        let plain = r#"{"r": 16, "lora_alpha": 32}"#;
        let c = PeftConfig::parse(Path::new("adapter_config.json"), plain).unwrap();
        assert_eq!(c.scale(16, 32.0), 2.0);
        let zero = r#"{"r": 0, "lora_alpha": 32}"#;
        let e = PeftConfig::parse(Path::new("adapter_config.json"), zero)
            .err()
            .unwrap();
        assert!(e.to_string().contains("rank `r` is 0"), "{e}");
    }
}
