//! Activation capture: the hidden states of chosen layers of a decoder
//! ([`crate::llama::Llama::capture`]) or an encoder
//! ([`crate::bert::Bert::capture`]), pooled per sequence, for probes and
//! other looks inside a model.
//!
//! Layers are numbered as Hugging Face transformers numbers
//! `output_hidden_states`: layer 0 is the embedding output, layer `i` the
//! residual stream after block `i`, and for decoders the last one,
//! `n_layers`, is taken after the final norm (as transformers returns it).
//! Besides the residual stream, a capture can read a block's attention
//! output and its feed-forward (MLP) output: what the block adds to the
//! residual stream (after Gemma's post-norms; before the residual sum and
//! LayerNorm in BERT).

use silica::{DType, Tensor};

pub mod file;
mod source;
pub use file::{ActivationFile, ActivationMeta, ActivationWriter};
pub use source::{Source, TOKENS_PER_BATCH, batches};

use crate::{Error, Result};

/// Where in a layer a capture reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Site {
    /// The residual stream after the layer (`hidden_states[layer]`).
    Residual,
    /// The attention block's output (layers 1 and up).
    Attention,
    /// The feed-forward block's output (layers 1 and up).
    Mlp,
}

impl Site {
    pub fn name(self) -> &'static str {
        match self {
            Site::Residual => "residual",
            Site::Attention => "attn",
            Site::Mlp => "mlp",
        }
    }

    pub fn parse(s: &str) -> Result<Site> {
        match s.trim() {
            "residual" | "resid" | "hidden" => Ok(Site::Residual),
            "attn" | "attention" => Ok(Site::Attention),
            "mlp" | "ffn" => Ok(Site::Mlp),
            other => Err(Error::InvalidInput(format!(
                "unknown capture site {other:?}: expected residual, attn or mlp"
            ))),
        }
    }
}

/// How the states of one sequence's tokens become rows of the result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pool {
    /// The last token's state: one row per sequence.
    Last,
    /// The mean over the sequence's tokens: one row per sequence.
    Mean,
    /// Every token's state: `len` rows per sequence, sequences in order.
    All,
}

impl Pool {
    pub fn name(self) -> &'static str {
        match self {
            Pool::Last => "last",
            Pool::Mean => "mean",
            Pool::All => "all",
        }
    }

    pub fn parse(s: &str) -> Result<Pool> {
        match s.trim() {
            "last" => Ok(Pool::Last),
            "mean" => Ok(Pool::Mean),
            "all" => Ok(Pool::All),
            other => Err(Error::InvalidInput(format!(
                "unknown pooling {other:?}: expected last, mean or all"
            ))),
        }
    }
}

/// What to capture: `(layer, site)` points, each giving one tensor, and
/// the pooling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureSpec {
    pub points: Vec<(usize, Site)>,
    pub pool: Pool,
}

impl CaptureSpec {
    /// The residual stream of `layers`, pooled by `pool`.
    pub fn residual(layers: &[usize], pool: Pool) -> Self {
        Self {
            points: layers.iter().map(|&l| (l, Site::Residual)).collect(),
            pool,
        }
    }

    /// Checks the points against a model of `n_layers` blocks.
    pub fn check(&self, n_layers: usize) -> Result<()> {
        if self.points.is_empty() {
            return Err(Error::InvalidInput(
                "nothing to capture: no layer given".into(),
            ));
        }
        for &(layer, site) in &self.points {
            if layer > n_layers {
                return Err(Error::InvalidInput(format!(
                    "layer {layer} is out of range: the model has layers 0 (embeddings) to {n_layers}"
                )));
            }
            if layer == 0 && site != Site::Residual {
                return Err(Error::InvalidInput(format!(
                    "layer 0 is the embedding output: it has no {} output",
                    site.name()
                )));
            }
        }
        Ok(())
    }

    /// Whether `(layer, site)` is captured, and at which index.
    pub(crate) fn index(&self, layer: usize, site: Site) -> Option<usize> {
        self.points.iter().position(|&p| p == (layer, site))
    }

    /// The deepest layer any point reads.
    pub(crate) fn deepest(&self) -> usize {
        self.points.iter().map(|p| p.0).max().unwrap_or(0)
    }
}

/// Parses a layer list such as `6,12,-1` or `all` for a model of
/// `n_layers` blocks: indices `0..=n_layers`, negative ones counted from
/// the end (`-1` is `n_layers`), `a..b` an inclusive range. Duplicates are
/// dropped; the order is kept.
pub fn parse_layers(spec: &str, n_layers: usize) -> Result<Vec<usize>> {
    let count = n_layers as i64 + 1;
    let one = |s: &str| -> Result<usize> {
        let v: i64 = s.trim().parse().map_err(|_| {
            Error::InvalidInput(format!(
                "layer {s:?} is not a number (expected e.g. 6,12,-1 or 2..8 or all)"
            ))
        })?;
        let i = if v < 0 { count + v } else { v };
        if i < 0 || i >= count {
            return Err(Error::InvalidInput(format!(
                "layer {v} is out of range: the model has layers 0 (embeddings) to {n_layers} \
                 (or -1 to -{count})"
            )));
        }
        Ok(i as usize)
    };
    let mut out: Vec<usize> = Vec::new();
    if spec.trim() == "all" {
        return Ok((0..=n_layers).collect());
    }
    for part in spec.split(',').filter(|p| !p.trim().is_empty()) {
        let items = match part.split_once("..") {
            Some((a, b)) => {
                let (a, b) = (one(a)?, one(b)?);
                if a > b {
                    return Err(Error::InvalidInput(format!(
                        "layer range {part:?} is empty"
                    )));
                }
                (a..=b).collect()
            }
            None => vec![one(part)?],
        };
        for i in items {
            if !out.contains(&i) {
                out.push(i);
            }
        }
    }
    if out.is_empty() {
        return Err(Error::InvalidInput(format!("no layer in {spec:?}")));
    }
    Ok(out)
}

/// Pools `[B * T, d]` states of a right-padded batch (sequence `b` in rows
/// `b * T .. b * T + lens[b]`) on the device, to f32.
pub(crate) struct Pooler {
    pool: Pool,
    /// Last and All: the rows kept; Mean: the `[B, B * T]` averaging matrix.
    plan: Tensor,
}

impl Pooler {
    pub(crate) fn new(pool: Pool, lens: &[usize], t: usize, dev: &silica::Device) -> Result<Self> {
        let b = lens.len();
        let plan = match pool {
            Pool::Last => {
                let rows: Vec<u32> = lens
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| (i * t + l - 1) as u32)
                    .collect();
                Tensor::from_vec(rows, &[b], dev)?
            }
            Pool::All => {
                let rows: Vec<u32> = lens
                    .iter()
                    .enumerate()
                    .flat_map(|(i, &l)| (0..l).map(move |j| (i * t + j) as u32))
                    .collect();
                let n = rows.len();
                Tensor::from_vec(rows, &[n], dev)?
            }
            Pool::Mean => {
                let mut w = vec![0f32; b * b * t];
                for (i, &l) in lens.iter().enumerate() {
                    w[i * b * t + i * t..i * b * t + i * t + l].fill(1.0 / l as f32);
                }
                Tensor::from_vec(w, &[b, b * t], dev)?
            }
        };
        Ok(Self { pool, plan })
    }

    pub(crate) fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.to_dtype(DType::F32)?;
        Ok(match self.pool {
            Pool::Last | Pool::All => x.index_select(0, &self.plan)?,
            Pool::Mean => self.plan.matmul(&x)?,
        })
    }
}

/// What a forward pass shows the states it computes to.
pub(crate) trait Taps {
    fn wants(&self, layer: usize, site: Site) -> bool;
    /// Called with a state the forward computed; keeps it if wanted.
    fn put(&mut self, layer: usize, site: Site, x: &Tensor) -> Result<()>;
}

/// A forward that captures nothing.
pub(crate) struct NoTaps;

impl Taps for NoTaps {
    fn wants(&self, _: usize, _: Site) -> bool {
        false
    }
    fn put(&mut self, _: usize, _: Site, _: &Tensor) -> Result<()> {
        Ok(())
    }
}

/// Keeps the pooled states of a [`CaptureSpec`]'s points.
pub(crate) struct Collector<'a> {
    spec: &'a CaptureSpec,
    pooler: Pooler,
    out: Vec<Option<Tensor>>,
}

impl<'a> Collector<'a> {
    pub(crate) fn new(spec: &'a CaptureSpec, pooler: Pooler) -> Self {
        Self {
            spec,
            pooler,
            out: vec![None; spec.points.len()],
        }
    }

    /// The pooled tensors, in the order of the spec's points.
    pub(crate) fn finish(self) -> Result<Vec<Tensor>> {
        self.out
            .into_iter()
            .zip(&self.spec.points)
            .map(|(t, (layer, site))| {
                t.ok_or_else(|| {
                    Error::InvalidInput(format!(
                        "the forward never reached layer {layer}'s {} output",
                        site.name()
                    ))
                })
            })
            .collect()
    }
}

impl Taps for Collector<'_> {
    fn wants(&self, layer: usize, site: Site) -> bool {
        self.spec.index(layer, site).is_some()
    }
    fn put(&mut self, layer: usize, site: Site, x: &Tensor) -> Result<()> {
        if let Some(i) = self.spec.index(layer, site) {
            self.out[i] = Some(self.pooler.apply(x)?);
        }
        Ok(())
    }
}

/// Checks a batch of token sequences for a capture: non-empty, each
/// sequence non-empty, ids inside the vocabulary. Returns the longest length.
pub(crate) fn check_batch(batch: &[&[u32]], vocab: usize) -> Result<usize> {
    if batch.is_empty() {
        return Err(Error::InvalidInput("an empty batch".into()));
    }
    let mut t = 0;
    for (i, s) in batch.iter().enumerate() {
        if s.is_empty() {
            return Err(Error::InvalidInput(format!(
                "sequence {i} of the batch is empty"
            )));
        }
        if let Some(&bad) = s.iter().find(|&&id| id as usize >= vocab) {
            return Err(Error::InvalidInput(format!(
                "token id {bad} is outside the vocabulary of {vocab} tokens"
            )));
        }
        t = t.max(s.len());
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_lists() {
        assert_eq!(parse_layers("6,12,-1", 30).unwrap(), vec![6, 12, 30]);
        assert_eq!(parse_layers("0..2,-1,2", 4).unwrap(), vec![0, 1, 2, 4]);
        assert_eq!(parse_layers("all", 2).unwrap(), vec![0, 1, 2]);
        assert_eq!(parse_layers("-5", 4).unwrap(), vec![0]);
        for bad in ["31", "-32", "x", "", "3..1"] {
            assert!(parse_layers(bad, 30).is_err(), "{bad}");
        }
    }

    #[test]
    fn pooling_rows() {
        let dev = silica::Device::cpu();
        // two sequences of lengths 2 and 3, padded to 3, d = 2
        let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let x = Tensor::from_vec(x, &[6, 2], &dev).unwrap();
        let lens = [2, 3];
        let last = Pooler::new(Pool::Last, &lens, 3, &dev).unwrap();
        assert_eq!(
            last.apply(&x).unwrap().to_vec::<f32>().unwrap(),
            vec![2., 3., 10., 11.]
        );
        let mean = Pooler::new(Pool::Mean, &lens, 3, &dev).unwrap();
        assert_eq!(
            mean.apply(&x).unwrap().to_vec::<f32>().unwrap(),
            vec![1., 2., 8., 9.]
        );
        let all = Pooler::new(Pool::All, &lens, 3, &dev).unwrap();
        let v = all.apply(&x).unwrap();
        assert_eq!(v.shape(), &[5, 2]);
        assert_eq!(
            v.to_vec::<f32>().unwrap(),
            vec![0., 1., 2., 3., 6., 7., 8., 9., 10., 11.]
        );
    }
}
