//! What the Phi-3 family (GGUF architecture `phi3`: Phi-3-mini 4k and 128k,
//! Phi-3.5-mini, Phi-4-mini) adds to the Llama-family decoder (a child
//! module of `llama/mod.rs`), read and checked as llama.cpp reads it
//! (`src/models/phi3.cpp`, `llama_model::get_rope_factors`) and as its
//! converter writes it (`Phi3MiniModel`):
//!
//! - Q, K and V in one tensor, `blk.N.attn_qkv.weight` (the query rows, then
//!   the key rows, then the value rows), used as the stacked QKV weight;
//!   gate and up in one, `blk.N.ffn_up.weight` (`2 · ffn` rows, the gate's
//!   first), used as the stacked gate/up weight under SwiGLU.
//! - LongRoPE: per-frequency divisors of the rotary frequencies in two
//!   tensors, `rope_factors_long.weight` and `rope_factors_short.weight`,
//!   and a factor on every rotated cos and sin (`rope.scaling.attn_factor`,
//!   which the converter computes as `√(1 + ln s / ln original)` for a
//!   context `s` times the original).
//! - Partial rotation (Phi-4-mini): only the first `rope.dimension_count`
//!   dimensions of each head rotate, in rotate-half pairs among themselves.
//!
//! Both kinds of rotation run in the fused attention step unchanged: the
//! rows of the query and key projections are reordered at load so that the
//! rotated pairs sit where a whole-head rotation pairs them, and the angle
//! tables hold cos 1 and sin 0 for the pairs that do not rotate (see
//! [`Phi3Config::qkv_row_order`]). Scores `q · k` sum over the head's
//! dimensions, so the same order on both sides leaves them unchanged.
//!
//! `attention.sliding_window` is read and checked but not applied: llama.cpp
//! has ignored it since its pull request 13676 (the released configurations
//! do not say which layers it would apply to, and Phi-3.5's and the 128k
//! models' windows are longer than their context), and silica computes what
//! llama.cpp computes.

use silica::{Device, Tensor};

use super::config::{RopeScaling, rope_angles};
use crate::gguf::GgufFile;
use crate::{Error, Result};

/// The GGUF names of the LongRoPE frequency divisors: for contexts longer
/// than the original one, and for the others.
const FACTORS_LONG: &str = "rope_factors_long.weight";
const FACTORS_SHORT: &str = "rope_factors_short.weight";

/// What a `phi3` file adds to [`super::LlamaConfig`].
#[derive(Clone, Debug, PartialEq)]
pub struct Phi3Config {
    /// How many of each head's dimensions rotate (`rope.dimension_count`;
    /// the head size but for Phi-4-mini's partial rotation).
    pub rope_dim: usize,
    /// The context the model was trained with before its context was
    /// stretched (`rope.scaling.original_context_length`; the context
    /// length where absent, as llama.cpp).
    pub original_context: usize,
    /// Multiplies every rotated cos and sin (`rope.scaling.attn_factor`,
    /// 1 where absent), so the scores by its square.
    pub attn_factor: f64,
    /// Whether the rotary frequencies are divided by the long factors
    /// (`rope_factors_long.weight`) rather than the short ones: when the
    /// context in use exceeds the original context, as llama.cpp decides
    /// (`n_ctx_seq > n_ctx_orig_yarn`) once per context. silica's context
    /// is the model's whole context (llama.cpp's default), so a 128k model
    /// always runs with its long factors.
    pub long_factors: bool,
    /// `attention.sliding_window` (0 or absent: none). Not applied, as in
    /// llama.cpp (see the module's comment).
    pub sliding_window: Option<usize>,
}

impl Phi3Config {
    /// The Phi-3 keys of `f`, for heads of `head_dim` and a context of
    /// `context_length` positions.
    pub(super) fn from_gguf(f: &GgufFile, head_dim: usize, context_length: usize) -> Result<Self> {
        let key = |k: &str| format!("phi3.{k}");
        let bad = |k: &str, what: String| Error::Format {
            path: f.path().to_path_buf(),
            offset: 0,
            msg: format!("{} {what}", key(k)),
        };
        let opt_u64 = |k: &str| -> Result<Option<u64>> {
            match f.get(&key(k)) {
                None => Ok(None),
                Some(_) => Ok(Some(f.get_u64(&key(k))?)),
            }
        };
        let rope_dim = match opt_u64("rope.dimension_count")? {
            None => head_dim,
            Some(r) if r == 0 || r % 2 != 0 || r > head_dim as u64 => {
                return Err(bad(
                    "rope.dimension_count",
                    format!("is {r}, expected an even number from 2 to the head size {head_dim}"),
                ));
            }
            Some(r) => r as usize,
        };
        let original_context = match opt_u64("rope.scaling.original_context_length")? {
            None => context_length,
            Some(0) => {
                return Err(bad(
                    "rope.scaling.original_context_length",
                    "is 0, expected a positive length".into(),
                ));
            }
            Some(n) => usize::try_from(n).map_err(|_| {
                bad(
                    "rope.scaling.original_context_length",
                    format!("is {n}, too large"),
                )
            })?,
        };
        let attn_factor = match f.get(&key("rope.scaling.attn_factor")) {
            None => 1.0,
            Some(_) => {
                let v = f.get_f64(&key("rope.scaling.attn_factor"))?;
                if !(v.is_finite() && v > 0.0) {
                    return Err(bad(
                        "rope.scaling.attn_factor",
                        format!("is {v}, expected a positive number"),
                    ));
                }
                v
            }
        };
        // Phi-4-mini's converter writes a window of 0 for none
        let sliding_window = opt_u64("attention.sliding_window")?
            .filter(|&w| w > 0)
            .map(|w| usize::try_from(w).unwrap_or(usize::MAX));
        Ok(Self {
            rope_dim,
            original_context,
            attn_factor,
            long_factors: context_length > original_context,
            sliding_window,
        })
    }

    /// The LongRoPE divisors of the rotary frequencies this model runs
    /// with (`[rope_dim / 2]`, the long or the short ones), or `None` for a
    /// file without them (Phi-3-mini-4k). Both tensors are checked: the
    /// right length, positive and finite.
    pub(super) fn rope_factors(&self, f: &GgufFile) -> Result<Option<Vec<f32>>> {
        let half = self.rope_dim / 2;
        let read = |name: &str| -> Result<Vec<f32>> {
            let offset = f.tensor_info(name).map_or(0, |i| i.offset);
            let bad = |msg: String| Error::Format {
                path: f.path().to_path_buf(),
                offset,
                msg,
            };
            let (shape, values) = f.dequantize(name)?;
            if shape != [half] {
                return Err(bad(format!(
                    "tensor {name} has shape {shape:?}, expected [{half}] (half of phi3.rope.dimension_count)"
                )));
            }
            if let Some(v) = values.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
                return Err(bad(format!("{name} holds {v}, expected positive factors")));
            }
            Ok(values)
        };
        let has = |name: &str| f.tensor_info(name).is_some();
        match (has(FACTORS_LONG), has(FACTORS_SHORT)) {
            (false, false) => Ok(None),
            (true, true) => {
                let long = read(FACTORS_LONG)?;
                let short = read(FACTORS_SHORT)?;
                Ok(Some(if self.long_factors { long } else { short }))
            }
            (long, _) => {
                let (present, absent) = if long {
                    (FACTORS_LONG, FACTORS_SHORT)
                } else {
                    (FACTORS_SHORT, FACTORS_LONG)
                };
                Err(Error::Missing {
                    path: f.path().to_path_buf(),
                    what: format!("tensor '{absent}' (the file has {present})"),
                })
            }
        }
    }

    /// cos and sin of the rotation angles of positions `0..n` for heads of
    /// `head_dim`, `[n, head_dim / 2]` each, in the order of the heads after
    /// [`Phi3Config::qkv_row_order`]: the `rope_dim / 2` rotated pairs
    /// first (frequencies `theta^(-2i / rope_dim)` divided by `factors`,
    /// then `scaling`, cos and sin times the attention factor), then cos 1
    /// and sin 0 for the dimensions that do not rotate.
    pub(super) fn rope_angles(
        &self,
        n: usize,
        head_dim: usize,
        theta: f64,
        factors: Option<&[f32]>,
        scaling: &RopeScaling,
    ) -> (Vec<f32>, Vec<f32>) {
        let (half, rotated) = (head_dim / 2, self.rope_dim / 2);
        let (cos, sin) = rope_angles(n, self.rope_dim, theta, factors, scaling);
        // YaRN's factor already holds rope.scaling.attn_factor (llama.cpp
        // applies the key once whatever the scaling)
        let mscale = match scaling {
            RopeScaling::Yarn { .. } => 1.0,
            _ => self.attn_factor as f32,
        };
        let mut full_cos = Vec::with_capacity(n * half);
        let mut full_sin = Vec::with_capacity(n * half);
        for (c, s) in cos.chunks(rotated).zip(sin.chunks(rotated)) {
            full_cos.extend(c.iter().map(|v| v * mscale));
            full_cos.resize(full_cos.len() + half - rotated, 1.0);
            full_sin.extend(s.iter().map(|v| v * mscale));
            full_sin.resize(full_sin.len() + half - rotated, 0.0);
        }
        (full_cos, full_sin)
    }

    /// The order of the rows of the stacked Q, K, V weight (`order[i]`:
    /// the file's row that becomes row `i`) under which a rotate-half
    /// rotation of whole heads does this model's partial one, or `None`
    /// where every dimension rotates.
    ///
    /// Within each query and key head, llama.cpp (and transformers) rotate
    /// the pairs `(i, i + r/2)` for `i < r/2` (`r`: `rope_dim`) and leave
    /// dimensions `r..head_dim` as they are; the fused attention step
    /// rotates the pairs `(j, j + head_dim/2)`. So the new head takes the
    /// old dimensions `0..r/2`, then the first half of `r..head_dim`, then
    /// `r/2..r`, then the second half of `r..head_dim`: the rotated pairs
    /// land on pairs `j < r/2`, the others on pairs that [`rope_angles`]
    /// leaves unrotated. The value rows keep their order.
    pub fn qkv_row_order(
        &self,
        head_dim: usize,
        n_heads: usize,
        n_kv_heads: usize,
    ) -> Option<Vec<usize>> {
        if self.rope_dim == head_dim {
            return None;
        }
        let (r2, rest2) = (self.rope_dim / 2, (head_dim - self.rope_dim) / 2);
        let head: Vec<usize> = (0..r2)
            .chain(self.rope_dim..self.rope_dim + rest2)
            .chain(r2..self.rope_dim)
            .chain(self.rope_dim + rest2..head_dim)
            .collect();
        let rotated_heads = n_heads + n_kv_heads;
        let rows = (n_heads + 2 * n_kv_heads) * head_dim;
        Some(
            (0..rows)
                .map(|row| {
                    let (h, i) = (row / head_dim, row % head_dim);
                    if h < rotated_heads {
                        h * head_dim + head[i]
                    } else {
                        row
                    }
                })
                .collect(),
        )
    }
}

/// The rows of `bytes` (rows of `row_bytes` each) in `order` (`order[i]`:
/// the row that becomes row `i`).
pub(super) fn reorder_rows(bytes: &[u8], row_bytes: usize, order: &[usize]) -> Vec<u8> {
    let mut out = Vec::with_capacity(order.len() * row_bytes);
    for &r in order {
        out.extend_from_slice(&bytes[r * row_bytes..(r + 1) * row_bytes]);
    }
    out
}

/// The rows (first dimension) of `t` in `order`, on its device.
pub(super) fn select_rows(t: &Tensor, order: &[usize]) -> Result<Tensor> {
    let idx: Vec<u32> = order.iter().map(|&r| r as u32).collect();
    let idx = Tensor::from_slice(&idx, &[idx.len()], &Device::cpu())?.to_device(t.device())?;
    Ok(t.index_select(0, &idx)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(rope_dim: usize) -> Phi3Config {
        Phi3Config {
            rope_dim,
            original_context: 4096,
            attn_factor: 1.5,
            long_factors: true,
            sliding_window: None,
        }
    }

    /// llama.cpp's partial rotate-half of one head at angle table
    /// `(cos, sin)` (`rope_dim / 2` entries): pairs `(i, i + r/2)`, the rest
    /// copied.
    fn partial_rope(x: &[f32], rope_dim: usize, cos: &[f32], sin: &[f32]) -> Vec<f32> {
        let mut y = x.to_vec();
        let r2 = rope_dim / 2;
        for i in 0..r2 {
            let (a, b) = (x[i], x[i + r2]);
            y[i] = a * cos[i] - b * sin[i];
            y[i + r2] = a * sin[i] + b * cos[i];
        }
        y
    }

    /// silica's whole-head rotate-half at `(cos, sin)` (`head_dim / 2`).
    fn full_rope(x: &[f32], cos: &[f32], sin: &[f32]) -> Vec<f32> {
        let h2 = x.len() / 2;
        let mut y = x.to_vec();
        for j in 0..h2 {
            let (a, b) = (x[j], x[j + h2]);
            y[j] = a * cos[j] - b * sin[j];
            y[j + h2] = a * sin[j] + b * cos[j];
        }
        y
    }

    #[test]
    fn the_row_order_turns_a_whole_head_rotation_into_a_partial_one() {
        let (hd, rd) = (16, 12);
        let c = config(rd);
        let order = c.qkv_row_order(hd, 1, 1).unwrap();
        // one query head, one key head (both reordered), one value head (not)
        assert_eq!(order.len(), 3 * hd);
        assert_eq!(&order[2 * hd..], (2 * hd..3 * hd).collect::<Vec<_>>());
        let mut sorted = order[..hd].to_vec();
        sorted.sort();
        assert_eq!(sorted, (0..hd).collect::<Vec<_>>());
        let (cos, sin) = c.rope_angles(7, hd, 10_000.0, None, &RopeScaling::None);
        let (pc, ps) = rope_angles(7, rd, 10_000.0, None, &RopeScaling::None);
        let q: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.37).sin()).collect();
        let k: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.91).cos()).collect();
        for p in [0, 3, 6] {
            let (fc, fs) = (&cos[p * hd / 2..][..hd / 2], &sin[p * hd / 2..][..hd / 2]);
            let (rc, rs) = (&pc[p * rd / 2..][..rd / 2], &ps[p * rd / 2..][..rd / 2]);
            let scaled: (Vec<f32>, Vec<f32>) = (
                rc.iter().map(|v| v * 1.5).collect(),
                rs.iter().map(|v| v * 1.5).collect(),
            );
            let want_q = partial_rope(&q, rd, &scaled.0, &scaled.1);
            let want_k = partial_rope(&k, rd, &scaled.0, &scaled.1);
            let perm = |x: &[f32]| order[..hd].iter().map(|&i| x[i]).collect::<Vec<f32>>();
            let got_q = full_rope(&perm(&q), fc, fs);
            let got_k = full_rope(&perm(&k[..]), fc, fs);
            // the rotated vectors are the expected ones reordered
            assert_eq!(got_q, perm(&want_q));
            assert_eq!(got_k, perm(&want_k));
            let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
            let (got, want) = (dot(&got_q, &got_k), dot(&want_q, &want_k));
            assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        }
    }

    #[test]
    fn whole_head_rotation_keeps_the_file_order() {
        assert_eq!(config(16).qkv_row_order(16, 4, 2), None);
    }

    #[test]
    fn rows_move_as_whole_rows() {
        let bytes: Vec<u8> = (0..12).collect();
        assert_eq!(
            reorder_rows(&bytes, 4, &[2, 0, 1]),
            [8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7]
        );
    }
}
