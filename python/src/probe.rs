//! The probe workflow: `silica.capture_activations` (hidden states of
//! chosen layers, pooled per text) and `silica.train_probe` /
//! `silica.Probe` (logistic-regression probes on them, trained on the
//! device; the files `silica probe train` writes and `silica probe run`
//! reads). The capture is `Llama::capture` / `Bert::capture`, the training
//! `silica_models::probe`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use silica::{DType, Tensor};
use silica_models::bert::SentenceEncoder;
use silica_models::capture::{CaptureSpec, Pool, Site, Source, batches};
use silica_models::probe::{self, LinearProbe, Metrics, ProbeKind, ProbeSet, TrainOptions};

use crate::convert::{to_numpy, to_tensor};
use crate::device::{self, PyDevice};
use crate::embedder::PyEmbedder;
use crate::errors::{Failure, Res, detach, value_error};
use crate::generator::{Decoder, PyGenerator};

/// A model states are captured from.
#[derive(Clone)]
enum CaptureModel {
    Decoder(Arc<Decoder>),
    Encoder(Arc<SentenceEncoder>),
}

impl CaptureModel {
    /// A loaded `Generator` or `Embedder`; a name or `None` loads a decoder
    /// (with `encoder`, a sentence encoder) on the default device.
    fn from_py(obj: Option<&Bound<'_, PyAny>>, encoder: bool) -> PyResult<Self> {
        if let Some(o) = obj {
            if let Ok(g) = o.cast::<PyGenerator>() {
                return Ok(CaptureModel::Decoder(g.get().dec.clone()));
            }
            if let Ok(e) = o.cast::<PyEmbedder>() {
                return Ok(CaptureModel::Encoder(e.get().enc.clone()));
            }
        }
        let name: Option<String> = match obj.filter(|o| !o.is_none()) {
            None => None,
            Some(o) if o.is_instance_of::<PyString>() => Some(o.extract()?),
            Some(o) => {
                return Err(PyTypeError::new_err(format!(
                    "model must be a silica.Generator, a silica.Embedder, a model name or None, not {}",
                    o.get_type().name()?
                )));
            }
        };
        let py = match obj {
            Some(o) => o.py(),
            None => return Err(value_error("no model given")),
        };
        let cls = if encoder {
            py.get_type::<PyEmbedder>()
        } else {
            py.get_type::<PyGenerator>()
        };
        Self::from_py(Some(&cls.call1((name,))?), encoder)
    }

    /// The loaded model, borrowed for capture.
    fn source(&self) -> Source<'_> {
        match self {
            CaptureModel::Decoder(d) => Source::Decoder(&d.model, &d.tokenizer),
            CaptureModel::Encoder(e) => Source::Encoder(e),
        }
    }

    fn path(&self) -> PathBuf {
        match self {
            CaptureModel::Decoder(d) => d.path.clone(),
            CaptureModel::Encoder(e) => e.dir().to_path_buf(),
        }
    }
}

/// Layer indices as transformers numbers `hidden_states` (0 the
/// embeddings, `n_layers` the last), negative ones from the end.
fn normalize_layers(layers: &[i64], n_layers: usize) -> Res<Vec<usize>> {
    let count = n_layers as i64 + 1;
    let mut out = Vec::new();
    for &l in layers {
        let i = if l < 0 { count + l } else { l };
        if i < 0 || i >= count {
            return Err(Failure::Value(format!(
                "layer {l} is out of range: the model has layers 0 (embeddings) to {n_layers} (or -1 to -{count})"
            )));
        }
        if !out.contains(&(i as usize)) {
            out.push(i as usize);
        }
    }
    if out.is_empty() {
        return Err(Failure::Value("no layer given".into()));
    }
    Ok(out)
}

/// What a capture returns: per point, a `[n, d]` buffer (last and mean
/// pooling) or one `[len, d]` buffer per text (all tokens).
enum Captured {
    Rows(Vec<Vec<f32>>),
    PerText(Vec<Vec<Vec<f32>>>),
}

fn run_capture(
    model: Source<'_>,
    texts: &[String],
    spec: &CaptureSpec,
    batch_size: usize,
    max_tokens: Option<usize>,
) -> Res<Captured> {
    let limit = max_tokens.unwrap_or(usize::MAX).min(model.max_tokens());
    let mut ids: Vec<Vec<u32>> = Vec::with_capacity(texts.len());
    for (i, t) in texts.iter().enumerate() {
        let mut v = model.tokenize(t)?;
        if v.is_empty() {
            return Err(Failure::Value(format!("text {i} has no tokens")));
        }
        if v.len() > limit {
            if max_tokens.is_none() {
                return Err(Failure::Value(format!(
                    "text {i} has {} tokens, more than the model's {limit}; pass max_tokens= to cut texts",
                    v.len()
                )));
            }
            v.truncate(limit);
        }
        ids.push(v);
    }
    let lens: Vec<usize> = ids.iter().map(Vec::len).collect();
    let (d, points, n) = (model.d_model(), spec.points.len(), texts.len());
    let all = spec.pool == Pool::All;
    let mut rows = vec![vec![0f32; if all { 0 } else { n * d }]; points];
    let mut per_text: Vec<Vec<Vec<f32>>> = vec![vec![Vec::new(); if all { n } else { 0 }]; points];
    for batch in batches(&lens, batch_size) {
        let seqs: Vec<&[u32]> = batch.iter().map(|&i| ids[i].as_slice()).collect();
        let states = model.capture(&seqs, spec)?;
        for (p, t) in states.iter().enumerate() {
            let v: Vec<f32> = t.to_vec()?;
            let mut at = 0;
            for &i in &batch {
                if all {
                    per_text[p][i] = v[at * d..(at + lens[i]) * d].to_vec();
                    at += lens[i];
                } else {
                    rows[p][i * d..(i + 1) * d].copy_from_slice(&v[at * d..(at + 1) * d]);
                    at += 1;
                }
            }
        }
    }
    Ok(if all {
        Captured::PerText(per_text)
    } else {
        Captured::Rows(rows)
    })
}

/// The hidden states of `layers` of `model` for each of `texts`.
#[allow(clippy::too_many_arguments)]
pub fn capture_activations<'py>(
    py: Python<'py>,
    model: &Bound<'py, PyAny>,
    texts: Vec<String>,
    layers: Option<Vec<i64>>,
    pool: &str,
    site: &str,
    batch_size: usize,
    max_tokens: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    if batch_size == 0 {
        return Err(value_error("batch_size must be 1 or more"));
    }
    if texts.is_empty() {
        return Err(value_error("no texts to capture"));
    }
    let pool = Pool::parse(pool).map_err(Failure::from)?;
    let site = Site::parse(site).map_err(Failure::from)?;
    let m = CaptureModel::from_py(Some(model), false)?;
    let layers = layers.unwrap_or_else(|| vec![-1]);
    let (layers, captured) = detach(py, || {
        let layers = normalize_layers(&layers, m.source().n_layers())?;
        let spec = CaptureSpec {
            points: layers.iter().map(|&l| (l, site)).collect(),
            pool,
        };
        spec.check(m.source().n_layers())?;
        Ok((
            layers,
            run_capture(m.source(), &texts, &spec, batch_size, max_tokens)?,
        ))
    })?;
    let d = m.source().d_model();
    let out = PyDict::new(py);
    match captured {
        Captured::Rows(rows) => {
            for (l, v) in layers.iter().zip(rows) {
                let n = v.len() / d;
                out.set_item(l, PyArray1::from_vec(py, v).reshape([n, d])?)?;
            }
        }
        Captured::PerText(per) => {
            for (l, texts) in layers.iter().zip(per) {
                let list = PyList::empty(py);
                for v in texts {
                    let n = v.len() / d;
                    list.append(PyArray1::from_vec(py, v).reshape([n, d])?)?;
                }
                out.set_item(l, list)?;
            }
        }
    }
    Ok(out)
}

/// `silica.capture_activations`.
#[pyfunction]
#[pyo3(name = "capture_activations", signature = (model, texts, layers=None, pool="last", site="residual", batch_size=16, max_tokens=None))]
#[allow(clippy::too_many_arguments)]
pub fn capture_activations_fn<'py>(
    py: Python<'py>,
    model: &Bound<'py, PyAny>,
    texts: &Bound<'py, PyAny>,
    layers: Option<&Bound<'py, PyAny>>,
    pool: &str,
    site: &str,
    batch_size: usize,
    max_tokens: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let texts: Vec<String> = if texts.is_instance_of::<PyString>() {
        vec![texts.extract()?]
    } else {
        texts.extract()?
    };
    let layers: Option<Vec<i64>> = match layers.filter(|l| !l.is_none()) {
        None => None,
        Some(l) => Some(match l.extract::<i64>() {
            Ok(one) => vec![one],
            Err(_) => l.extract()?,
        }),
    };
    capture_activations(py, model, texts, layers, pool, site, batch_size, max_tokens)
}

/// An `[n, d]` float32 tensor of an array on `device`.
fn states(x: &Bound<'_, PyAny>, device: &silica::Device) -> PyResult<Tensor> {
    let t = to_tensor(x, device, Some(DType::F32))?;
    if t.rank() != 2 {
        return Err(value_error(format!(
            "states must be [rows, d], not {:?}",
            t.shape()
        )));
    }
    Ok(t)
}

/// The model a probe's metadata names: its path and architecture.
fn model_meta(model: Option<&Bound<'_, PyAny>>) -> PyResult<(String, String)> {
    let Some(m) = model.filter(|m| !m.is_none()) else {
        return Ok((String::new(), String::new()));
    };
    if m.is_instance_of::<PyString>() {
        return Ok((m.extract()?, String::new()));
    }
    let cm = CaptureModel::from_py(Some(m), false)?;
    Ok((cm.path().display().to_string(), cm.source().architecture()))
}

/// `silica.train_probe`.
#[pyfunction]
#[pyo3(signature = (x, labels, *, layer=None, multiclass=false, l2=1e-3, epochs=100, batch_size=32, lr=3e-3, seed=0, holdout=0.25, device=None, model=None, pool="last", site="residual"))]
#[allow(clippy::too_many_arguments)]
pub fn train_probe(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    labels: &Bound<'_, PyAny>,
    layer: Option<usize>,
    multiclass: bool,
    l2: f64,
    epochs: usize,
    batch_size: usize,
    lr: f64,
    seed: u64,
    holdout: f64,
    device: Option<&Bound<'_, PyAny>>,
    model: Option<&Bound<'_, PyAny>>,
    pool: &str,
    site: &str,
) -> PyResult<PyProbe> {
    if !(0.0..1.0).contains(&holdout) {
        return Err(value_error(format!(
            "holdout {holdout} must be at least 0 and below 1"
        )));
    }
    let pool = Pool::parse(pool).map_err(Failure::from)?;
    if pool == Pool::All {
        return Err(value_error(
            "probes train on one state per text: pool \"last\" or \"mean\", not \"all\"",
        ));
    }
    let site = Site::parse(site).map_err(Failure::from)?;
    let labels: Vec<String> = labels
        .try_iter()?
        .map(|l| l.and_then(|l| l.str().map(|s| s.to_string())))
        .collect::<PyResult<_>>()?;
    let dev = device::resolve(py, device)?;
    // (layer, states) for each layer trained on
    let mut inputs: Vec<(usize, Tensor)> = Vec::new();
    if let Ok(d) = x.cast::<PyDict>() {
        for (k, v) in d.iter() {
            inputs.push((k.extract()?, states(&v, &dev)?));
        }
        inputs.sort_by_key(|(l, _)| *l);
    } else {
        inputs.push((layer.unwrap_or(0), states(x, &dev)?));
    }
    if inputs.is_empty() {
        return Err(value_error("no states to train on"));
    }
    let (model_name, architecture) = model_meta(model)?;
    let opts = TrainOptions {
        kind: if multiclass {
            ProbeKind::Multiclass
        } else {
            ProbeKind::OneVsRest
        },
        l2,
        epochs,
        batch_size,
        lr,
        seed,
        holdout,
    };
    let set = detach(py, move || {
        let n = inputs[0].1.shape()[0];
        if labels.len() != n {
            return Err(Failure::Value(format!(
                "{} labels for {n} rows of states",
                labels.len()
            )));
        }
        let (classes, ys) = probe::encode_labels(&labels)?;
        let (train_rows, test_rows) = probe::split(n, opts.holdout, opts.seed);
        let mut probes: Vec<LinearProbe> = Vec::new();
        for (layer, xs) in &inputs {
            if xs.shape()[0] != n {
                return Err(Failure::Value(format!(
                    "layer {layer} has {} rows of states, layer {} has {n}",
                    xs.shape()[0],
                    inputs[0].0
                )));
            }
            probes.push(probe::train(
                xs,
                &ys,
                &classes,
                (&train_rows, &test_rows),
                (*layer, site),
                &opts,
            )?);
        }
        // the best held-out accuracy, then macro F1 (as `silica probe train`)
        let best = probes
            .iter()
            .filter_map(|p| p.metrics.as_ref().map(|m| (p.layer, m)))
            .fold(None::<(usize, &Metrics)>, |best, (l, m)| match best {
                Some((_, b)) if (b.accuracy, b.macro_f1) >= (m.accuracy, m.macro_f1) => best,
                _ => Some((l, m)),
            })
            .map(|b| b.0);
        Ok(ProbeSet {
            best_layer: best,
            probes,
            model: model_name,
            architecture,
            pool,
            holdout: test_rows,
            options: opts.describe(site),
        })
    })?;
    Ok(PyProbe { set, device: dev })
}

/// Trained linear probes (one per layer) and their held-out metrics.
#[pyclass(name = "Probe", module = "silica", frozen)]
pub struct PyProbe {
    set: ProbeSet,
    device: silica::Device,
}

fn metrics_dict<'py>(py: Python<'py>, m: &Metrics) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("accuracy", m.accuracy)?;
    d.set_item("macro_f1", m.macro_f1)?;
    d.set_item("f1", m.f1.clone())?;
    d.set_item("confusion", m.confusion.clone())?;
    d.set_item("n_train", m.n_train)?;
    d.set_item("n_test", m.n_test)?;
    d.set_item("final_loss", m.final_loss)?;
    Ok(d)
}

impl PyProbe {
    /// The probe of `layer`, else of the best layer, else the only one.
    fn pick(&self, layer: Option<usize>) -> PyResult<&LinearProbe> {
        let l = match (layer, self.set.best_layer) {
            (Some(l), _) => l,
            (None, _) if self.set.probes.len() == 1 => self.set.probes[0].layer,
            (None, Some(b)) => b,
            (None, None) => {
                return Err(value_error(
                    "the probe has several layers and no best one: pass layer=",
                ));
            }
        };
        self.set.layer(l).map_err(|e| Failure::from(e).into())
    }
}

#[pymethods]
impl PyProbe {
    /// Reads a probe file (`probe.save`, or `silica probe train -o FILE`);
    /// predictions run on `device` (default: `silica.default_device()`).
    #[staticmethod]
    #[pyo3(signature = (path, device=None))]
    fn load(py: Python<'_>, path: PathBuf, device: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let dev = device::resolve(py, device)?;
        let set = detach(py, move || Ok(ProbeSet::load(&path)?))?;
        Ok(Self { set, device: dev })
    }

    /// Writes the probes to a safetensors file that `silica probe run` reads.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        detach(py, || Ok(self.set.save(&path)?))
    }

    /// Class probabilities `[n, classes]` (float32) of states `x` (`[n, d]`
    /// or `[d]`, or a dict from `capture_activations`), or of texts read
    /// through `model` (a `Generator` or `Embedder`; by default the model
    /// the probe file names, loaded for the call). One-vs-rest probes give
    /// each class's probability (rows need not sum to 1), multiclass ones a
    /// distribution.
    #[pyo3(signature = (x, layer=None, model=None, batch_size=16))]
    fn predict_proba<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        layer: Option<usize>,
        model: Option<&Bound<'py, PyAny>>,
        batch_size: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let p = self.pick(layer)?;
        let texts: Option<Vec<String>> = if x.is_instance_of::<PyString>() {
            Some(vec![x.extract()?])
        } else if x.is_instance_of::<PyList>()
            && x.len()? > 0
            && x.get_item(0)?.is_instance_of::<PyString>()
        {
            Some(x.extract()?)
        } else {
            None
        };
        let xs = match texts {
            Some(texts) => {
                let m = match model.filter(|m| !m.is_none()) {
                    Some(m) => m.clone(),
                    None if !self.set.model.is_empty() => {
                        PyString::new(py, &self.set.model).into_any()
                    }
                    None => {
                        return Err(value_error(
                            "the probe names no model: pass model= to read texts",
                        ));
                    }
                };
                let cm = CaptureModel::from_py(Some(&m), self.set.architecture == "bert")?;
                if !self.set.architecture.is_empty()
                    && cm.source().architecture() != self.set.architecture
                {
                    return Err(value_error(format!(
                        "the probe was trained on a {} model's states, not {}",
                        self.set.architecture,
                        cm.source().architecture()
                    )));
                }
                let spec = CaptureSpec {
                    points: vec![(p.layer, p.site)],
                    pool: self.set.pool,
                };
                let dev = self.device.clone();
                detach(py, move || {
                    let Captured::Rows(rows) =
                        run_capture(cm.source(), &texts, &spec, batch_size.max(1), None)?
                    else {
                        return Err(Failure::Value("probes read one state per text".into()));
                    };
                    let n = texts.len();
                    let d = rows[0].len() / n.max(1);
                    Ok(Tensor::from_slice(&rows[0], &[n, d], &dev)?)
                })?
            }
            None => {
                let arr = match x.cast::<PyDict>() {
                    Ok(d) => d.get_item(p.layer)?.ok_or_else(|| {
                        value_error(format!("the states hold no layer {}", p.layer))
                    })?,
                    Err(_) => x.clone(),
                };
                let t = to_tensor(&arr, &self.device, Some(DType::F32))?;
                if t.rank() == 1 {
                    let one = detach(py, || Ok(t.unsqueeze(0)?))?;
                    let probs = detach(py, || Ok(p.probabilities(&one)?.squeeze(0)?))?;
                    return to_numpy(py, &probs);
                }
                t
            }
        };
        let probs = detach(py, || Ok(p.probabilities(&xs)?))?;
        to_numpy(py, &probs)
    }

    /// The most probable class of each row (or text).
    #[pyo3(signature = (x, layer=None, model=None, batch_size=16))]
    fn predict<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        layer: Option<usize>,
        model: Option<&Bound<'py, PyAny>>,
        batch_size: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let probs = self.predict_proba(py, x, layer, model, batch_size)?;
        let classes = self.pick(layer)?.classes.clone();
        let idx: Vec<usize> = probs
            .call_method1("argmax", (-1,))?
            .call_method0("tolist")?
            .extract()
            .or_else(|_| -> PyResult<Vec<usize>> {
                Ok(vec![probs.call_method1("argmax", (-1,))?.extract()?])
            })?;
        let names: Vec<&str> = idx.iter().map(|&i| classes[i].as_str()).collect();
        if probs.getattr("ndim")?.extract::<usize>()? == 1 {
            return Ok(PyString::new(py, names[0]).into_any());
        }
        Ok(PyList::new(py, names)?.into_any())
    }

    /// The class names, in the order of the probability columns.
    #[getter]
    fn classes(&self) -> Vec<String> {
        self.set
            .probes
            .first()
            .map(|p| p.classes.clone())
            .unwrap_or_default()
    }

    /// The layers probed.
    #[getter]
    fn layers(&self) -> Vec<usize> {
        self.set.probes.iter().map(|p| p.layer).collect()
    }

    /// The layer whose probe scored best on the held-out rows.
    #[getter]
    fn best_layer(&self) -> Option<usize> {
        self.set.best_layer
    }

    /// `"one-vs-rest"` or `"multiclass"`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.set
            .probes
            .first()
            .map_or("one-vs-rest", |p| p.kind.name())
    }

    #[getter]
    fn pool(&self) -> &'static str {
        self.set.pool.name()
    }

    #[getter]
    fn site(&self) -> &'static str {
        self.set
            .probes
            .first()
            .map_or("residual", |p| p.site.name())
    }

    /// The model the states came from (a path or name; empty if not given).
    #[getter]
    fn model(&self) -> &str {
        &self.set.model
    }

    /// The rows held out for scoring.
    #[getter]
    fn holdout(&self) -> Vec<usize> {
        self.set.holdout.clone()
    }

    /// Held-out metrics of the best (or only) layer's probe: accuracy,
    /// macro_f1, f1 per class, confusion[true][predicted], n_train,
    /// n_test, final_loss; `None` when nothing was held out.
    #[getter]
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        match self.pick(None) {
            Ok(p) => p.metrics.as_ref().map(|m| metrics_dict(py, m)).transpose(),
            Err(_) => Ok(None),
        }
    }

    /// `metrics` of every layer's probe.
    #[getter]
    fn metrics_by_layer<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for p in &self.set.probes {
            if let Some(m) = &p.metrics {
                d.set_item(p.layer, metrics_dict(py, m)?)?;
            }
        }
        Ok(d)
    }

    /// A layer's probe parameters: `weight` `[classes, d]` and `bias`
    /// `[classes]` on standardized states, and the standardization's
    /// `mean` and `std` `[d]`.
    #[pyo3(signature = (layer=None))]
    fn parameters<'py>(
        &self,
        py: Python<'py>,
        layer: Option<usize>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let p = self.pick(layer)?;
        let (c, d) = (p.classes.len(), p.dim());
        let out = PyDict::new(py);
        out.set_item(
            "weight",
            PyArray1::from_vec(py, p.weight.clone()).reshape([c, d])?,
        )?;
        out.set_item("bias", PyArray1::from_vec(py, p.bias.clone()))?;
        out.set_item("mean", PyArray1::from_vec(py, p.mean.clone()))?;
        out.set_item("std", PyArray1::from_vec(py, p.std.clone()))?;
        Ok(out)
    }

    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice::of(&self.device)
    }

    fn __repr__(&self) -> String {
        let acc: HashMap<usize, f64> = self
            .set
            .probes
            .iter()
            .filter_map(|p| p.metrics.as_ref().map(|m| (p.layer, m.accuracy)))
            .collect();
        let best = self
            .set
            .best_layer
            .and_then(|l| acc.get(&l).map(|a| (l, a)));
        format!(
            "Probe({}, classes={:?}, layers={:?}{})",
            self.kind(),
            self.classes(),
            self.layers(),
            best.map(|(l, a)| format!(", best layer {l}: held-out accuracy {a:.3}"))
                .unwrap_or_default()
        )
    }
}
