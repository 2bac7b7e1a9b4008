//! `silica.Embedder`: sentence embeddings with a sentence-transformers
//! model, in sentence-transformers' call shape (`encode`, `similarity`).

use std::sync::Arc;

use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use silica_models::bert::SentenceEncoder;
use silica_models::resolve;

use crate::device::{self, PyDevice};
use crate::dtype;
use crate::errors::{Res, detach, value_error};

/// A sentence-transformers model (default: all-MiniLM-L6-v2).
#[pyclass(name = "Embedder", module = "silica", frozen)]
pub struct PyEmbedder {
    pub enc: Arc<SentenceEncoder>,
}

#[pymethods]
impl PyEmbedder {
    /// Loads `model` (a sentence-transformers folder or a Hugging Face id;
    /// `None`: the built-in all-MiniLM-L6-v2, fetched on first use) onto
    /// `device` (default: `silica.default_device()`), computing in `dtype`.
    #[new]
    #[pyo3(signature = (model=None, device=None, dtype=None, max_seq_length=None))]
    fn new(
        py: Python<'_>,
        model: Option<String>,
        device: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
        max_seq_length: Option<usize>,
    ) -> PyResult<Self> {
        let dev = device::resolve(py, device)?;
        let dt = dtype::compute(dtype)?;
        let enc = detach(py, || {
            let dir = resolve::resolve_encoder(model.as_deref())?;
            let mut enc = SentenceEncoder::load(&dir, &dev, dt)?;
            if let Some(n) = max_seq_length {
                enc.set_max_seq_length(n)?;
            }
            Ok(enc)
        })?;
        Ok(Self { enc: Arc::new(enc) })
    }

    /// Embeddings of `sentences`, one row each (`[n, dim]` float32), or
    /// one vector `[dim]` for a single string. Sentences go through the
    /// model `batch_size` at a time, sorted by length (as
    /// sentence-transformers does); `normalize_embeddings` scales each to
    /// unit length (the default model already does).
    #[pyo3(signature = (sentences, batch_size=32, normalize_embeddings=false, show_progress_bar=None))]
    fn encode<'py>(
        &self,
        py: Python<'py>,
        sentences: &Bound<'py, PyAny>,
        batch_size: usize,
        normalize_embeddings: bool,
        show_progress_bar: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = show_progress_bar;
        if batch_size == 0 {
            return Err(value_error("batch_size must be 1 or more"));
        }
        let single = sentences.is_instance_of::<PyString>();
        let texts: Vec<String> = if single {
            vec![sentences.extract()?]
        } else {
            sentences.extract().map_err(|_| {
                PyTypeError::new_err("sentences must be a string or a list of strings")
            })?
        };
        let dim = self.enc.dim();
        let enc = self.enc.clone();
        let flat = detach(py, move || {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let rows = embed(&enc, &refs, batch_size)?;
            let mut flat: Vec<f32> = Vec::with_capacity(rows.len() * dim);
            for mut r in rows {
                if normalize_embeddings {
                    let norm = r.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
                    r.iter_mut().for_each(|x| *x /= norm);
                }
                flat.extend_from_slice(&r);
            }
            Ok(flat)
        })?;
        let n = flat.len() / dim.max(1);
        let arr = PyArray1::from_vec(py, flat);
        if single {
            Ok(arr.into_any())
        } else {
            Ok(arr.reshape([n, dim])?.into_any())
        }
    }

    /// Cosine similarities of two sets of embeddings: `[n, m]` for `[n, d]`
    /// and `[m, d]` (as sentence-transformers' `similarity`).
    fn similarity<'py>(
        &self,
        py: Python<'py>,
        a: &Bound<'py, PyAny>,
        b: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let np = py.import("numpy")?;
        let norm = |x: &Bound<'py, PyAny>| -> PyResult<Bound<'py, PyAny>> {
            let x =
                np.call_method1("atleast_2d", (np.call_method1("asarray", (x, "float32"))?,))?;
            let kw = PyDict::new(py);
            kw.set_item("axis", -1)?;
            kw.set_item("keepdims", true)?;
            let n = np
                .getattr("linalg")?
                .call_method("norm", (&x,), Some(&kw))?
                .call_method1("clip", (1e-12, f64::INFINITY))?;
            x.call_method1("__truediv__", (n,))
        };
        let (a, b) = (norm(a)?, norm(b)?);
        a.call_method1("__matmul__", (b.getattr("T")?,))
    }

    /// The token ids the model sees for `text` (special tokens added, cut
    /// at `max_seq_length`).
    fn tokenize(&self, py: Python<'_>, text: String) -> PyResult<Vec<u32>> {
        let enc = self.enc.clone();
        detach(py, move || Ok(enc.tokenize(&text)?))
    }

    /// The length of the embeddings.
    #[getter]
    fn dim(&self) -> usize {
        self.enc.dim()
    }

    /// sentence-transformers' name for `dim`.
    fn get_sentence_embedding_dimension(&self) -> usize {
        self.enc.dim()
    }

    /// Tokens per sentence at most (longer ones are cut).
    #[getter]
    fn max_seq_length(&self) -> usize {
        self.enc.max_seq_length()
    }

    /// The number of transformer blocks.
    #[getter]
    fn n_layers(&self) -> usize {
        self.enc.model().config().num_hidden_layers
    }

    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice::of(self.enc.device())
    }

    /// The folder the model was loaded from.
    #[getter]
    fn model_path(&self) -> String {
        self.enc.dir().display().to_string()
    }

    fn __repr__(&self) -> String {
        format!(
            "Embedder('{}', dim={}, device='{}')",
            self.enc.dir().display(),
            self.enc.dim(),
            PyDevice::of(self.enc.device()).selector()
        )
    }

    /// Hidden states of chosen layers for `texts`: see `silica.capture_activations`.
    #[pyo3(signature = (texts, layers=None, pool="last", site="residual", batch_size=16))]
    fn capture<'py>(
        slf: &Bound<'py, Self>,
        texts: Vec<String>,
        layers: Option<Vec<i64>>,
        pool: &str,
        site: &str,
        batch_size: usize,
    ) -> PyResult<Bound<'py, PyDict>> {
        crate::probe::capture_activations(
            slf.py(),
            slf.as_any(),
            texts,
            layers,
            pool,
            site,
            batch_size,
            None,
        )
    }
}

/// One embedding per sentence, in order: sorted by length, batches of
/// `batch_size` (what `SentenceEncoder::embed` does with its own batch size).
fn embed(enc: &SentenceEncoder, sentences: &[&str], batch_size: usize) -> Res<Vec<Vec<f32>>> {
    let ids: Vec<Vec<u32>> = sentences
        .iter()
        .map(|s| enc.tokenize(s))
        .collect::<silica_models::Result<_>>()?;
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(ids[i].len()));
    let mut out = vec![Vec::new(); ids.len()];
    for chunk in order.chunks(batch_size) {
        let batch: Vec<&[u32]> = chunk.iter().map(|&i| ids[i].as_slice()).collect();
        for (&i, v) in chunk.iter().zip(enc.embed_ids(&batch)?) {
            out[i] = v;
        }
    }
    Ok(out)
}
