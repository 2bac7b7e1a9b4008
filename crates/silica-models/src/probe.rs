//! Linear probes: logistic regression on captured activations
//! ([`crate::capture`]), trained on the device with mini-batches and AdamW
//! through [`silica::autograd`], evaluated on a held-out split, saved to
//! and read from safetensors, and applied to new states.
//!
//! A probe standardizes each feature with the training split's mean and
//! standard deviation (kept in the probe), then computes `z = x W^T + b`:
//!
//! - [`ProbeKind::OneVsRest`]: one binary probe per class, `sigmoid(z_c)`
//!   the probability of concept `c` (trained with binary cross-entropy);
//! - [`ProbeKind::Multiclass`]: `softmax(z)` over the classes (cross-entropy).
//!
//! The objective is the mean loss over the training rows plus
//! `l2 / 2 * |W|^2` (the bias is not penalized), the objective of
//! scikit-learn's `LogisticRegression(C = 1 / (l2 * n_train))` on the same
//! standardized features. AdamW (without weight decay: the L2 term is in
//! the loss) runs `epochs` passes over the shuffled training rows with a
//! learning rate that decays to zero along a half cosine.

use std::collections::HashMap;
use std::path::Path;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use silica::autograd::Var;
use silica::autograd::optim::{AdamW, Optimizer};
use silica::{DType, Device, Tensor};

use crate::capture::{Pool, Site};
use crate::safetensors::SafetensorsFile;
use crate::{Error, Result};

/// The format tag in the metadata of every probe file.
pub const FORMAT: &str = "silica-probe/1";

/// How a probe turns scores into probabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    OneVsRest,
    Multiclass,
}

impl ProbeKind {
    pub fn name(self) -> &'static str {
        match self {
            ProbeKind::OneVsRest => "one-vs-rest",
            ProbeKind::Multiclass => "multiclass",
        }
    }
}

/// Training settings.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    pub kind: ProbeKind,
    /// The L2 penalty `l2 / 2 * |W|^2` added to the mean loss.
    pub l2: f64,
    pub epochs: usize,
    pub batch_size: usize,
    /// The peak learning rate of AdamW.
    pub lr: f64,
    /// Seeds the split and the shuffles.
    pub seed: u64,
    /// The share of the rows held out for evaluation (0 to keep none).
    pub holdout: f64,
}

impl Default for TrainOptions {
    fn default() -> Self {
        Self {
            kind: ProbeKind::OneVsRest,
            l2: 1e-3,
            epochs: 100,
            batch_size: 32,
            lr: 3e-3,
            seed: 0,
            holdout: 0.25,
        }
    }
}

impl TrainOptions {
    /// The settings as a probe file's `options` records them, with the
    /// site the activations came from.
    pub fn describe(&self, site: Site) -> String {
        format!(
            "kind={} l2={} epochs={} batch_size={} lr={} seed={} holdout={} site={}",
            self.kind.name(),
            self.l2,
            self.epochs,
            self.batch_size,
            self.lr,
            self.seed,
            self.holdout,
            site.name()
        )
    }
}

/// Held-out results of a probe: predicted class = the most probable one.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Metrics {
    pub accuracy: f64,
    /// The mean over the classes of each class's F1.
    pub macro_f1: f64,
    pub f1: Vec<f64>,
    /// `confusion[true][predicted]`.
    pub confusion: Vec<Vec<usize>>,
    pub n_train: usize,
    pub n_test: usize,
    /// The training objective at the end (mean loss plus the L2 term).
    pub final_loss: f64,
}

impl Metrics {
    /// Scores predictions against the truth for `classes` classes.
    pub fn score(truth: &[usize], predicted: &[usize], classes: usize) -> Self {
        let mut confusion = vec![vec![0usize; classes]; classes];
        for (&t, &p) in truth.iter().zip(predicted) {
            confusion[t][p] += 1;
        }
        let correct: usize = (0..classes).map(|c| confusion[c][c]).sum();
        let f1: Vec<f64> = (0..classes)
            .map(|c| {
                let tp = confusion[c][c] as f64;
                let predicted: usize = (0..classes).map(|t| confusion[t][c]).sum();
                let actual: usize = confusion[c].iter().sum();
                if predicted + actual == 0 {
                    0.0
                } else {
                    2.0 * tp / (predicted + actual) as f64
                }
            })
            .collect();
        Self {
            accuracy: correct as f64 / truth.len().max(1) as f64,
            macro_f1: f1.iter().sum::<f64>() / classes.max(1) as f64,
            f1,
            confusion,
            n_train: 0,
            n_test: truth.len(),
            final_loss: f64::NAN,
        }
    }
}

/// A trained linear probe on the states of one layer.
#[derive(Clone, Debug)]
pub struct LinearProbe {
    pub layer: usize,
    pub site: Site,
    pub kind: ProbeKind,
    pub classes: Vec<String>,
    /// Per feature: subtracted, then divided by `std`.
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
    /// `[classes, d]`, row-major.
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
    pub metrics: Option<Metrics>,
}

/// The training rows and the held-out rows of `n`: a seeded shuffle, the
/// first `holdout` share held out (at least one row of each when both are
/// possible).
pub fn split(n: usize, holdout: f64, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    let mut test = ((n as f64) * holdout).round() as usize;
    if holdout > 0.0 && n >= 2 {
        test = test.clamp(1, n - 1);
    }
    let test_rows = order[..test].to_vec();
    let train_rows = order[test..].to_vec();
    (train_rows, test_rows)
}

/// Class names in order of first appearance and each label's index;
/// errors on an empty label set or a class without examples.
pub fn encode_labels(labels: &[String]) -> Result<(Vec<String>, Vec<usize>)> {
    let mut classes: Vec<String> = Vec::new();
    let mut index = HashMap::new();
    let mut ys = Vec::with_capacity(labels.len());
    for l in labels {
        let i = *index.entry(l.clone()).or_insert_with(|| {
            classes.push(l.clone());
            classes.len() - 1
        });
        ys.push(i);
    }
    if classes.len() < 2 {
        return Err(Error::InvalidInput(format!(
            "a probe needs at least 2 classes; the labels have {}",
            classes.len()
        )));
    }
    Ok((classes, ys))
}

/// Trains a probe on `x` (`[n, d]` f32 states, on the device to train on)
/// with labels `ys` (indices into `classes`). The rows of `test` are held
/// out and scored; `train` are trained on.
pub fn train(
    x: &Tensor,
    ys: &[usize],
    classes: &[String],
    (train_rows, test_rows): (&[usize], &[usize]),
    (layer, site): (usize, Site),
    opts: &TrainOptions,
) -> Result<LinearProbe> {
    let dev = x.device().clone();
    let &[n, d] = x.shape() else {
        return Err(Error::InvalidInput(format!(
            "activations must be [rows, d], not {:?}",
            x.shape()
        )));
    };
    let c = classes.len();
    if ys.len() != n {
        return Err(Error::InvalidInput(format!(
            "{} labels for {n} rows of activations",
            ys.len()
        )));
    }
    if train_rows.is_empty() {
        return Err(Error::InvalidInput("no rows to train on".into()));
    }
    if let Some(&bad) = ys.iter().find(|&&y| y >= c) {
        return Err(Error::InvalidInput(format!(
            "label index {bad} outside {c} classes"
        )));
    }
    for (k, name) in classes.iter().enumerate() {
        if !train_rows.iter().any(|&r| ys[r] == k) {
            return Err(Error::InvalidInput(format!(
                "class {name:?} has no example in the training rows"
            )));
        }
    }
    if opts.epochs == 0
        || opts.batch_size == 0
        || opts.lr.is_nan()
        || opts.lr <= 0.0
        || opts.l2.is_nan()
        || opts.l2 < 0.0
    {
        return Err(Error::InvalidInput(
            "epochs and batch size must be positive, the learning rate positive and l2 not negative"
                .into(),
        ));
    }
    let x = x.to_dtype(DType::F32)?;
    let rows = |r: &[usize]| -> Result<Tensor> {
        let idx: Vec<u32> = r.iter().map(|&i| i as u32).collect();
        Ok(Tensor::from_vec(idx, &[r.len()], &dev)?)
    };
    // standardization from the training rows, in f64 on the host
    let (mean_h, std_h) = feature_stats(&x, train_rows)?;
    if mean_h.iter().chain(&std_h).any(|v| !v.is_finite()) {
        return Err(Error::InvalidInput(
            "the activations hold NaN or infinite values".into(),
        ));
    }
    // the standardization is folded into the weights, so that the states
    // are only ever read by the products: ((x - m) / s) W = x (W / s) - (m / s) W
    let inv_std = Tensor::from_vec(std_h.iter().map(|s| 1.0 / s).collect(), &[d, 1], &dev)?;
    let scaled_mean = Tensor::from_vec(
        mean_h.iter().zip(&std_h).map(|(m, s)| m / s).collect(),
        &[1, d],
        &dev,
    )?;
    let (inv_std, scaled_mean) = (Var::constant(inv_std), Var::constant(scaled_mean));

    let targets_idx: Vec<u32> = ys.iter().map(|&y| y as u32).collect();
    let targets_all = Tensor::from_vec(targets_idx, &[n], &dev)?;
    let onehot_all = match opts.kind {
        ProbeKind::OneVsRest => {
            let mut v = vec![0f32; n * c];
            for (i, &y) in ys.iter().enumerate() {
                v[i * c + y] = 1.0;
            }
            Some(Tensor::from_vec(v, &[n, c], &dev)?)
        }
        ProbeKind::Multiclass => None,
    };

    let w = Var::param(Tensor::zeros(&[d, c], DType::F32, &dev)?);
    let b = Var::param(Tensor::zeros(&[c], DType::F32, &dev)?);
    let params = [w.clone(), b.clone()];
    let mut opt = AdamW::new(opts.lr).with_weight_decay(0.0);
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed ^ 0x5eed);
    let mut order = train_rows.to_vec();
    let steps_per_epoch = order.len().div_ceil(opts.batch_size);
    let total = (opts.epochs * steps_per_epoch) as f64;
    let mut step = 0usize;
    let objective = |xb: &Tensor, idx: &Tensor, w: &Var, b: &Var| -> Result<Var> {
        let folded = w.mul(&inv_std)?; // [d, c]
        let shift = b.sub(&scaled_mean.matmul(w)?)?; // [1, c]
        let logits = Var::constant(xb.clone()).matmul(&folded)?.add(&shift)?;
        let loss = match &onehot_all {
            Some(oh) => logits.bce_with_logits(&oh.index_select(0, idx)?)?,
            None => logits.cross_entropy(&targets_all.index_select(0, idx)?)?,
        };
        // BCE is averaged over classes too: scale back to a sum over the
        // one-vs-rest probes so that each probe has sklearn's objective
        let loss = match opts.kind {
            ProbeKind::OneVsRest => loss.mul_scalar(c as f32)?,
            ProbeKind::Multiclass => loss,
        };
        if opts.l2 > 0.0 {
            let penalty = w.sqr()?.sum_all()?.mul_scalar((opts.l2 / 2.0) as f32)?;
            Ok(loss.add(&penalty)?)
        } else {
            Ok(loss)
        }
    };
    for _ in 0..opts.epochs {
        order.shuffle(&mut rng);
        for chunk in order.chunks(opts.batch_size) {
            let idx = rows(chunk)?;
            let xb = x.index_select(0, &idx)?;
            opt.lr = opts.lr * 0.5 * (1.0 + (std::f64::consts::PI * step as f64 / total).cos());
            opt.zero_grad(&params);
            objective(&xb, &idx, &w, &b)?.backward()?;
            opt.step(&params)?;
            step += 1;
        }
    }
    // the objective over every training row, a block at a time
    let mut final_loss = 0f64;
    for block in train_rows.chunks(BLOCK_ROWS) {
        let idx = rows(block)?;
        let loss: Vec<f32> = objective(&x.index_select(0, &idx)?, &idx, &w, &b)?
            .value()
            .to_vec()?;
        final_loss += loss[0] as f64 * block.len() as f64;
    }
    // each block's value holds the L2 term once: the weighted mean keeps it once
    let final_loss = final_loss / train_rows.len() as f64;
    let weight = w.value().t()?.contiguous()?.to_vec::<f32>()?; // [c, d]
    let mut probe = LinearProbe {
        layer,
        site,
        kind: opts.kind,
        classes: classes.to_vec(),
        mean: mean_h,
        std: std_h,
        weight,
        bias: b.value().to_vec()?,
        metrics: None,
    };
    let metrics = if test_rows.is_empty() {
        None
    } else {
        let xs = x.index_select(0, &rows(test_rows)?)?;
        let probs = probe.probabilities(&xs)?;
        let predicted = argmax_rows(&probs.to_vec::<f32>()?, c);
        let truth: Vec<usize> = test_rows.iter().map(|&r| ys[r]).collect();
        let mut m = Metrics::score(&truth, &predicted, c);
        m.n_train = train_rows.len();
        m.final_loss = final_loss;
        Some(m)
    };
    probe.metrics = metrics;
    Ok(probe)
}

/// Rows per block when states are read in blocks.
const BLOCK_ROWS: usize = 4096;

/// Per feature of `[n, d]` states, the mean and the standard deviation
/// (population, at least 1e-6) over `rows`, accumulated in f64 around the
/// first row's values, reading the states block by block.
fn feature_stats(x: &Tensor, rows: &[usize]) -> Result<(Vec<f32>, Vec<f32>)> {
    let &[n, d] = x.shape() else {
        unreachable!("checked by train")
    };
    let mut wanted = vec![false; n];
    for &r in rows {
        wanted[r] = true;
    }
    let (mut sum, mut sq) = (vec![0f64; d], vec![0f64; d]);
    let mut shift: Option<Vec<f64>> = None;
    for start in (0..n).step_by(BLOCK_ROWS) {
        let len = BLOCK_ROWS.min(n - start);
        if !wanted[start..start + len].contains(&true) {
            continue;
        }
        let block: Vec<f32> = x.narrow(0, start, len)?.to_vec()?;
        for (i, row) in block.chunks(d).enumerate() {
            if !wanted[start + i] {
                continue;
            }
            let k = shift.get_or_insert_with(|| row.iter().map(|&v| v as f64).collect());
            for j in 0..d {
                let v = row[j] as f64 - k[j];
                sum[j] += v;
                sq[j] += v * v;
            }
        }
    }
    let m = rows.len().max(1) as f64;
    let k = shift.unwrap_or_else(|| vec![0.0; d]);
    let mean = (0..d).map(|j| (k[j] + sum[j] / m) as f32).collect();
    let std = (0..d)
        .map(|j| {
            let mu = sum[j] / m;
            ((sq[j] / m - mu * mu).max(0.0).sqrt() as f32).max(1e-6)
        })
        .collect();
    Ok((mean, std))
}

/// The index of the largest entry of each row of `[rows, c]` values.
pub fn argmax_rows(v: &[f32], c: usize) -> Vec<usize> {
    v.chunks(c)
        .map(|row| {
            row.iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |best, (i, &p)| {
                    if p > best.1 { (i, p) } else { best }
                })
                .0
        })
        .collect()
}

impl LinearProbe {
    pub fn dim(&self) -> usize {
        self.mean.len()
    }

    /// Class probabilities of states `x` (`[n, d]`, any float dtype, on any
    /// device): `[n, classes]` f32 on the same device; per class for
    /// one-vs-rest probes (rows need not sum to 1), a distribution for
    /// multiclass ones.
    pub fn probabilities(&self, x: &Tensor) -> Result<Tensor> {
        let dev = x.device();
        let (d, c) = (self.dim(), self.classes.len());
        if x.rank() != 2 || x.shape()[1] != d {
            return Err(Error::InvalidInput(format!(
                "the probe reads {d}-wide states, not {:?}",
                x.shape()
            )));
        }
        // ((x - m) / s) W^T + b = x (W / s)^T + (b - W (m / s)), folded on the host
        let mut folded = self.weight.clone();
        let mut bias = self.bias.clone();
        for k in 0..c {
            for j in 0..d {
                let w = &mut folded[k * d + j];
                bias[k] -= *w * self.mean[j] / self.std[j];
                *w /= self.std[j];
            }
        }
        let w = Tensor::from_vec(folded, &[c, d], dev)?;
        let b = Tensor::from_vec(bias, &[c], dev)?;
        let logits = x.to_dtype(DType::F32)?.matmul(&w.t()?)?.add(&b)?;
        Ok(match self.kind {
            ProbeKind::OneVsRest => logits.sigmoid()?,
            ProbeKind::Multiclass => logits.softmax(-1)?,
        })
    }
}

/// A probe file: probes of one or more layers of the same model, site,
/// pooling and classes, with the layer that scored best.
#[derive(Clone, Debug)]
pub struct ProbeSet {
    pub probes: Vec<LinearProbe>,
    /// The layer of the probe with the best held-out accuracy.
    pub best_layer: Option<usize>,
    pub model: String,
    pub architecture: String,
    pub pool: Pool,
    /// The held-out rows of the activation file (for comparisons).
    pub holdout: Vec<usize>,
    pub options: String,
}

impl ProbeSet {
    /// The probe of `layer`.
    pub fn layer(&self, layer: usize) -> Result<&LinearProbe> {
        self.probes
            .iter()
            .find(|p| p.layer == layer)
            .ok_or_else(|| {
                let have: Vec<String> = self.probes.iter().map(|p| p.layer.to_string()).collect();
                Error::InvalidInput(format!(
                    "the probe file has no probe for layer {layer} (it has {})",
                    have.join(", ")
                ))
            })
    }

    #[allow(clippy::type_complexity)]
    pub fn save(&self, path: &Path) -> Result<()> {
        let first = self
            .probes
            .first()
            .ok_or_else(|| Error::InvalidInput("no probe to save".into()))?;
        let mut meta: HashMap<String, String> = HashMap::new();
        meta.insert("format".into(), FORMAT.into());
        meta.insert("model".into(), self.model.clone());
        meta.insert("architecture".into(), self.architecture.clone());
        meta.insert("kind".into(), first.kind.name().into());
        meta.insert("site".into(), first.site.name().into());
        meta.insert("pool".into(), self.pool.name().into());
        meta.insert("classes".into(), to_json(&first.classes)?);
        let layers: Vec<usize> = self.probes.iter().map(|p| p.layer).collect();
        meta.insert("layers".into(), to_json(&layers)?);
        if let Some(b) = self.best_layer {
            meta.insert("best_layer".into(), b.to_string());
        }
        let metrics: HashMap<String, &Metrics> = self
            .probes
            .iter()
            .filter_map(|p| p.metrics.as_ref().map(|m| (p.layer.to_string(), m)))
            .collect();
        meta.insert("metrics".into(), to_json(&metrics)?);
        meta.insert("holdout".into(), to_json(&self.holdout)?);
        meta.insert("options".into(), self.options.clone());
        // name, shape, little-endian f32 bytes
        let mut tensors: Vec<(String, (Vec<usize>, Vec<u8>))> = Vec::new();
        for p in &self.probes {
            let (c, d) = (p.classes.len(), p.dim());
            let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
            let l = p.layer;
            tensors.push((format!("layer.{l}.weight"), (vec![c, d], bytes(&p.weight))));
            tensors.push((format!("layer.{l}.bias"), (vec![c], bytes(&p.bias))));
            tensors.push((format!("layer.{l}.mean"), (vec![d], bytes(&p.mean))));
            tensors.push((format!("layer.{l}.std"), (vec![d], bytes(&p.std))));
        }
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
            .iter()
            .map(|(name, (shape, data))| {
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data)
                    .map(|v| (name.clone(), v))
                    .map_err(|e| Error::InvalidInput(e.to_string()))
            })
            .collect::<Result<_>>()?;
        safetensors::serialize_to_file(views, Some(meta), path)
            .map_err(|e| Error::InvalidInput(format!("{}: {e}", path.display())))
    }

    pub fn load(path: &Path) -> Result<Self> {
        let file = SafetensorsFile::open(path)?;
        let bad = |what: String| Error::InvalidInput(format!("{}: {what}", path.display()));
        let empty = HashMap::new();
        let meta = file.user_metadata().unwrap_or(&empty);
        let get = |k: &str| {
            meta.get(k)
                .ok_or_else(|| bad(format!("not a probe file: no {k:?} in its metadata")))
        };
        if get("format")? != FORMAT {
            return Err(bad(format!(
                "not a probe file: its format is {:?}, not {FORMAT:?}",
                get("format")?
            )));
        }
        fn parse<T: serde::de::DeserializeOwned>(s: &str, k: &str, path: &Path) -> Result<T> {
            serde_json::from_str(s).map_err(|e| {
                Error::InvalidInput(format!("{}: metadata {k:?}: {e}", path.display()))
            })
        }
        let kind = match get("kind")?.as_str() {
            "one-vs-rest" => ProbeKind::OneVsRest,
            "multiclass" => ProbeKind::Multiclass,
            other => return Err(bad(format!("unknown probe kind {other:?}"))),
        };
        let site = Site::parse(get("site")?)?;
        let classes: Vec<String> = parse(get("classes")?, "classes", path)?;
        let layers: Vec<usize> = parse(get("layers")?, "layers", path)?;
        let mut metrics: HashMap<String, Metrics> = parse(get("metrics")?, "metrics", path)?;
        let cpu = Device::cpu();
        let mut probes = Vec::new();
        for &l in &layers {
            let load = |part: &str| -> Result<Vec<f32>> {
                Ok(file
                    .load(&format!("layer.{l}.{part}"), &cpu, DType::F32)?
                    .to_vec()?)
            };
            let (weight, bias, mean, std) =
                (load("weight")?, load("bias")?, load("mean")?, load("std")?);
            let (c, d) = (classes.len(), mean.len());
            if weight.len() != c * d || bias.len() != c || std.len() != d {
                return Err(bad(format!(
                    "the layer {l} probe's tensors do not fit {c} classes"
                )));
            }
            probes.push(LinearProbe {
                layer: l,
                site,
                kind,
                classes: classes.clone(),
                mean,
                std,
                weight,
                bias,
                metrics: metrics.remove(&l.to_string()),
            });
        }
        let best_layer = meta
            .get("best_layer")
            .map(|s| {
                s.parse()
                    .map_err(|_| bad(format!("best_layer {s:?} is not a number")))
            })
            .transpose()?;
        Ok(Self {
            probes,
            best_layer,
            model: get("model")?.clone(),
            architecture: get("architecture")?.clone(),
            pool: Pool::parse(get("pool")?)?,
            holdout: meta
                .get("holdout")
                .map(|s| parse(s, "holdout", path))
                .transpose()?
                .unwrap_or_default(),
            options: meta.get("options").cloned().unwrap_or_default(),
        })
    }
}

fn to_json<T: serde::Serialize + ?Sized>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::InvalidInput(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_from_a_confusion() {
        let m = Metrics::score(&[0, 0, 1, 1, 2], &[0, 1, 1, 1, 0], 3);
        assert_eq!(
            m.confusion,
            vec![vec![1, 1, 0], vec![0, 2, 0], vec![1, 0, 0]]
        );
        assert!((m.accuracy - 0.6).abs() < 1e-12);
        // F1: class 0: 2*1/(2+2) = 0.5; class 1: 2*2/(3+2) = 0.8; class 2: 0
        assert!((m.macro_f1 - 1.3 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn splits_are_seeded_partitions() {
        let (a, b) = split(100, 0.25, 7);
        assert_eq!((a.len(), b.len()), (75, 25));
        let mut all: Vec<usize> = a.iter().chain(&b).copied().collect();
        all.sort();
        assert_eq!(all, (0..100).collect::<Vec<_>>());
        assert_eq!(split(100, 0.25, 7), (a, b));
        assert_ne!(split(100, 0.25, 8).1, split(100, 0.25, 7).1);
    }
}
