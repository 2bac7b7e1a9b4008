//! `silica.Generator` and `silica.GenerationStream`: text generation with
//! a GGUF decoder, whole or streamed, with the model's chat template. The
//! loop is `silica_models::generate::generate`, run on a thread of its own
//! so that its pieces of text can be iterated from Python.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use silica_models::chat::{Message, ModelTemplate};
use silica_models::generate::GenerationStats;
use silica_models::gguf::GgufFile;
use silica_models::llama::{Llama, LoadOptions};
use silica_models::resolve;
use silica_models::sampling::{Sampler, SamplingParams};
use silica_models::tokenizer::Tokenizer;

use crate::device::{self, PyDevice};
use crate::dtype;
use crate::errors::{Failure, detach, panic_failure, value_error};

/// A loaded decoder with its tokenizer and chat template.
pub struct Decoder {
    pub model: Llama,
    pub tokenizer: Tokenizer,
    /// The chat template, or why the file has none usable.
    pub template: Result<ModelTemplate, String>,
    pub name: String,
    pub path: PathBuf,
}

/// A GGUF decoder (default: SmolLM2-135M-Instruct) that generates text.
#[pyclass(name = "Generator", module = "silica", frozen)]
pub struct PyGenerator {
    pub dec: Arc<Decoder>,
    last: Arc<Mutex<Option<GenerationStats>>>,
}

/// Sampling settings; the defaults are `silica generate`'s.
struct Sampling {
    params: SamplingParams,
    max_tokens: usize,
    stop: Vec<String>,
}

fn stop_list(stop: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    let Some(s) = stop.filter(|s| !s.is_none()) else {
        return Ok(Vec::new());
    };
    let v: Vec<String> = if s.is_instance_of::<PyString>() {
        vec![s.extract()?]
    } else {
        s.extract()?
    };
    if v.iter().any(String::is_empty) {
        return Err(value_error("a stop string is empty"));
    }
    Ok(v)
}

/// Chat messages: a string (one user message), or a list of
/// `{"role": ..., "content": ...}` dicts or `(role, content)` pairs.
fn messages(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Message>> {
    if obj.is_instance_of::<PyString>() {
        return Ok(vec![Message::user(obj.extract::<String>()?)]);
    }
    let items = obj
        .try_iter()
        .map_err(|_| PyTypeError::new_err("messages must be a string or a list of messages"))?;
    let mut out = Vec::new();
    for m in items {
        let m = m?;
        let (role, content): (String, String) = if let Ok(d) = m.cast::<PyDict>() {
            let get = |k: &str| -> PyResult<String> {
                d.get_item(k)?
                    .ok_or_else(|| value_error(format!("a message has no {k:?}")))?
                    .extract()
            };
            (get("role")?, get("content")?)
        } else if m.is_instance_of::<PyTuple>() {
            m.extract()?
        } else {
            return Err(PyTypeError::new_err(
                "a message is a {\"role\": ..., \"content\": ...} dict or a (role, content) pair",
            ));
        };
        out.push(Message::new(role, content));
    }
    Ok(out)
}

impl PyGenerator {
    fn template(&self) -> PyResult<&ModelTemplate> {
        self.dec
            .template
            .as_ref()
            .map_err(|e| value_error(e.clone()))
    }

    /// Starts generating after `ids`; the text comes through the stream.
    fn start(&self, ids: Vec<u32>, s: Sampling) -> PyResult<PyStream> {
        let (tx, rx) = mpsc::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let (dec, stop_flag) = (self.dec.clone(), cancel.clone());
        std::thread::Builder::new()
            .name("silica-generate".into())
            .spawn(move || run_generation(dec, ids, s, stop_flag, tx))
            .map_err(|e| {
                PyRuntimeError::new_err(format!("cannot start the generation thread: {e}"))
            })?;
        Ok(PyStream {
            rx: Arc::new(Mutex::new(rx)),
            cancel,
            finished: AtomicBool::new(false),
            stats: Mutex::new(None),
            last: self.last.clone(),
        })
    }
}

/// What the generation thread tells the stream.
enum Msg {
    Text(String),
    Done(GenerationStats),
    Failed(Failure),
}

fn run_generation(
    dec: Arc<Decoder>,
    ids: Vec<u32>,
    s: Sampling,
    cancel: Arc<AtomicBool>,
    tx: mpsc::Sender<Msg>,
) {
    let mut sampler = Sampler::new(s.params);
    let text_tx = tx.clone();
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        silica_models::generate::generate(
            &dec.model,
            &dec.tokenizer,
            &ids,
            &mut sampler,
            s.max_tokens,
            &s.stop,
            |piece| {
                // a closed stream (or close()) ends the generation
                if cancel.load(Ordering::Relaxed)
                    || text_tx.send(Msg::Text(piece.to_string())).is_err()
                {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            },
        )
    }));
    let msg = match run {
        Ok(Ok(stats)) => Msg::Done(stats),
        Ok(Err(e)) => Msg::Failed(e.into()),
        Err(p) => Msg::Failed(panic_failure(p)),
    };
    let _ = tx.send(msg);
}

#[pymethods]
impl PyGenerator {
    /// Loads `model` (a GGUF file, a folder holding one, or a Hugging Face
    /// id `org/name[/FILE.gguf]`; `None`: the built-in SmolLM2-135M-Instruct,
    /// fetched on first use) onto `device`, computing in `dtype`; quantized
    /// weights stay quantized unless `dequantize`.
    #[new]
    #[pyo3(signature = (model=None, device=None, dtype=None, dequantize=false))]
    fn new(
        py: Python<'_>,
        model: Option<String>,
        device: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
        dequantize: bool,
    ) -> PyResult<Self> {
        let dev = device::resolve(py, device)?;
        let dt = dtype::compute(dtype)?;
        let dec = detach(py, || {
            let path = resolve::resolve_decoder(model.as_deref())?;
            let gguf = GgufFile::open(&path)?;
            let tokenizer = Tokenizer::from_gguf(&gguf)?;
            let template = match ModelTemplate::from_gguf(&gguf) {
                Ok(Some(t)) => Ok(t),
                Ok(None) => Err(
                    "the model has no chat template: its file has no tokenizer.chat_template, \
                     and none of the built-in ones (ChatML, Llama 2, Llama 3) fits it"
                        .to_string(),
                ),
                Err(e) => Err(e.to_string()),
            };
            let opts = LoadOptions {
                dtype: dt,
                dequantize,
            };
            let model = Llama::load_with(&gguf, &dev, opts)?;
            let name = gguf
                .get("general.name")
                .and_then(|v| v.as_str())
                .map(str::to_string)
                .unwrap_or_else(|| path.display().to_string());
            Ok(Decoder {
                model,
                tokenizer,
                template,
                name,
                path,
            })
        })?;
        Ok(Self {
            dec: Arc::new(dec),
            last: Arc::new(Mutex::new(None)),
        })
    }

    /// The continuation of `prompt` (the prompt itself not included): the
    /// whole text, or with `stream=True` an iterator of text pieces as they
    /// are produced. `temperature=0` is greedy; the defaults are `silica
    /// generate`'s, so `generate(p, temperature=0)` writes what `silica
    /// generate p --temperature 0` does. Stops at end-of-sequence, at one of
    /// `stop` (not included), after `max_tokens`, or when the context is full.
    #[pyo3(signature = (prompt, max_tokens=128, temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.1, seed=42, stop=None, stream=false, frequency_penalty=0.0, presence_penalty=0.0))]
    #[allow(clippy::too_many_arguments)]
    fn generate<'py>(
        &self,
        py: Python<'py>,
        prompt: String,
        max_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        min_p: f32,
        repetition_penalty: f32,
        seed: u64,
        stop: Option<&Bound<'py, PyAny>>,
        stream: bool,
        frequency_penalty: f32,
        presence_penalty: f32,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = sampling(
            max_tokens,
            temperature,
            top_k,
            top_p,
            min_p,
            [repetition_penalty, frequency_penalty, presence_penalty],
            seed,
            stop,
        )?;
        if prompt.trim().is_empty() {
            return Err(value_error("the prompt is empty"));
        }
        let dec = self.dec.clone();
        let ids = detach(py, move || Ok(dec.tokenizer.encode(&prompt, true)?))?;
        self.finish(py, ids, s, stream)
    }

    /// The assistant's reply to chat `messages` (a string: one user
    /// message; or `{"role", "content"}` dicts / `(role, content)` pairs),
    /// rendered with the model's own chat template. Same settings and
    /// `stream` as `generate`.
    #[pyo3(signature = (messages, max_tokens=128, temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.1, seed=42, stop=None, stream=false, frequency_penalty=0.0, presence_penalty=0.0))]
    #[allow(clippy::too_many_arguments)]
    fn chat<'py>(
        &self,
        py: Python<'py>,
        messages: &Bound<'py, PyAny>,
        max_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        min_p: f32,
        repetition_penalty: f32,
        seed: u64,
        stop: Option<&Bound<'py, PyAny>>,
        stream: bool,
        frequency_penalty: f32,
        presence_penalty: f32,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = sampling(
            max_tokens,
            temperature,
            top_k,
            top_p,
            min_p,
            [repetition_penalty, frequency_penalty, presence_penalty],
            seed,
            stop,
        )?;
        let msgs = self::messages(messages)?;
        self.template()?;
        let dec = self.dec.clone();
        let ids = detach(py, move || {
            let t = dec
                .template
                .as_ref()
                .map_err(|e| Failure::Value(e.clone()))?;
            Ok(t.encode(&dec.tokenizer, &msgs, true)?)
        })?;
        self.finish(py, ids, s, stream)
    }

    /// The prompt text the chat template makes of `messages`.
    #[pyo3(signature = (messages, add_generation_prompt=true))]
    fn apply_chat_template(
        &self,
        messages: &Bound<'_, PyAny>,
        add_generation_prompt: bool,
    ) -> PyResult<String> {
        let msgs = self::messages(messages)?;
        self.template()?
            .render(&msgs, add_generation_prompt)
            .map_err(|e| Failure::from(e).into())
    }

    /// Token ids of `text` (with BOS where the model adds one, when `add_special`).
    #[pyo3(signature = (text, add_special=true))]
    fn tokenize(&self, py: Python<'_>, text: String, add_special: bool) -> PyResult<Vec<u32>> {
        let dec = self.dec.clone();
        detach(py, move || Ok(dec.tokenizer.encode(&text, add_special)?))
    }

    /// The text of token ids.
    fn detokenize(&self, py: Python<'_>, ids: Vec<u32>) -> PyResult<String> {
        let dec = self.dec.clone();
        detach(py, move || Ok(dec.tokenizer.decode(&ids)?))
    }

    /// The model's shape: architecture, layers, width, heads, vocabulary, context.
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = &self.dec.model.config;
        let d = PyDict::new(py);
        d.set_item("architecture", &c.architecture)?;
        d.set_item("n_layers", c.n_layers)?;
        d.set_item("d_model", c.d_model)?;
        d.set_item("n_heads", c.n_heads)?;
        d.set_item("n_kv_heads", c.n_kv_heads)?;
        d.set_item("head_dim", c.head_dim)?;
        d.set_item("ffn_dim", c.ffn_dim)?;
        d.set_item("vocab_size", c.vocab_size)?;
        d.set_item("context_length", c.context_length)?;
        Ok(d)
    }

    /// The number of transformer blocks.
    #[getter]
    fn n_layers(&self) -> usize {
        self.dec.model.config.n_layers
    }

    /// `general.name` of the file (else its path).
    #[getter]
    fn name(&self) -> &str {
        &self.dec.name
    }

    #[getter]
    fn model_path(&self) -> String {
        self.dec.path.display().to_string()
    }

    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice::of(self.dec.model.device())
    }

    /// `gguf` (the file's own chat template), `chatml (fallback)`, ... or
    /// `None` when the model has none.
    #[getter]
    fn template_name(&self) -> Option<String> {
        self.dec.template.as_ref().ok().map(|t| t.name())
    }

    /// What the last finished generation did: tokens, times, stop reason.
    #[getter]
    fn last_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        last.map(|s| stats_dict(py, &s)).transpose()
    }

    fn __repr__(&self) -> String {
        format!(
            "Generator('{}', {}, device='{}')",
            self.dec.name,
            self.dec.model.config.architecture,
            PyDevice::of(self.dec.model.device()).selector()
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

impl PyGenerator {
    /// The stream, or all of its text when not streaming.
    fn finish<'py>(
        &self,
        py: Python<'py>,
        ids: Vec<u32>,
        s: Sampling,
        stream: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        // the prompt's length is an error now, not at the first piece
        silica_models::generate::check_prompt(ids.len(), self.dec.model.config.context_length)
            .map_err(Failure::from)?;
        let st = self.start(ids, s)?;
        if stream {
            return Ok(Bound::new(py, st)?.into_any());
        }
        let mut text = String::new();
        while let Some(piece) = st.next_piece(py)? {
            text.push_str(&piece);
        }
        Ok(PyString::new(py, &text).into_any())
    }
}

#[allow(clippy::too_many_arguments)]
fn sampling(
    max_tokens: usize,
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    penalties: [f32; 3],
    seed: u64,
    stop: Option<&Bound<'_, PyAny>>,
) -> PyResult<Sampling> {
    let [repetition_penalty, frequency_penalty, presence_penalty] = penalties;
    let finite = [temperature, top_p, min_p, repetition_penalty]
        .iter()
        .chain(&[frequency_penalty, presence_penalty])
        .all(|v| v.is_finite());
    if !finite || temperature < 0.0 {
        return Err(value_error(
            "temperature must be 0 (greedy) or more, and the settings finite",
        ));
    }
    if !(0.0..=1.0).contains(&top_p) || !(0.0..=1.0).contains(&min_p) {
        return Err(value_error("top_p and min_p must be between 0 and 1"));
    }
    if repetition_penalty <= 0.0 {
        return Err(value_error("repetition_penalty must be above 0 (1: off)"));
    }
    if !(-2.0..=2.0).contains(&frequency_penalty) || !(-2.0..=2.0).contains(&presence_penalty) {
        return Err(value_error(
            "frequency_penalty and presence_penalty must be between -2 and 2 (0: off)",
        ));
    }
    Ok(Sampling {
        params: SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            frequency_penalty,
            presence_penalty,
            seed,
        },
        max_tokens,
        stop: stop_list(stop)?,
    })
}

fn stats_dict<'py>(py: Python<'py>, s: &GenerationStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("prompt_tokens", s.prompt_tokens)?;
    d.set_item("generated_tokens", s.generated_tokens)?;
    d.set_item("prefill_seconds", s.prefill_time.as_secs_f64())?;
    d.set_item("decode_seconds", s.decode_time.as_secs_f64())?;
    d.set_item("decode_tokens_per_second", s.decode_tokens_per_second())?;
    d.set_item("stop_reason", s.stop_reason)?;
    d.set_item("tokens", s.tokens.clone())?;
    Ok(d)
}

// ----- the stream ------------------------------------------------------------

/// The text of a generation as it is produced: iterate it for the pieces.
/// `stats` is set once it has finished; `close()` (or dropping it) stops the
/// generation.
#[pyclass(name = "GenerationStream", module = "silica", frozen)]
pub struct PyStream {
    rx: Arc<Mutex<Receiver<Msg>>>,
    cancel: Arc<AtomicBool>,
    finished: AtomicBool,
    stats: Mutex<Option<GenerationStats>>,
    last: Arc<Mutex<Option<GenerationStats>>>,
}

impl PyStream {
    /// The next piece of text; `None` at the end. Waits with the
    /// interpreter released, and lets Ctrl-C through (which stops the
    /// generation).
    fn next_piece(&self, py: Python<'_>) -> PyResult<Option<String>> {
        if self.finished.load(Ordering::Relaxed) {
            return Ok(None);
        }
        loop {
            let rx = self.rx.clone();
            let msg = py.detach(move || {
                let rx = rx.lock().unwrap_or_else(|e| e.into_inner());
                rx.recv_timeout(Duration::from_millis(100))
            });
            match msg {
                Ok(Msg::Text(t)) => return Ok(Some(t)),
                Ok(Msg::Done(stats)) => {
                    self.finished.store(true, Ordering::Relaxed);
                    *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(stats.clone());
                    *self.stats.lock().unwrap_or_else(|e| e.into_inner()) = Some(stats);
                    return Ok(None);
                }
                Ok(Msg::Failed(f)) => {
                    self.finished.store(true, Ordering::Relaxed);
                    return Err(f.into());
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(e) = py.check_signals() {
                        self.close();
                        return Err(e);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.finished.store(true, Ordering::Relaxed);
                    return Ok(None);
                }
            }
        }
    }
}

#[pymethods]
impl PyStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        self.next_piece(py)
    }

    /// Stops the generation (the rest of the text is not produced).
    fn close(&self) {
        self.cancel.store(true, Ordering::Relaxed);
        self.finished.store(true, Ordering::Relaxed);
    }

    /// What the generation did (`None` until it has finished).
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let s = self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone();
        s.map(|s| stats_dict(py, &s)).transpose()
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __exit__(&self, _t: &Bound<'_, PyAny>, _v: &Bound<'_, PyAny>, _tb: &Bound<'_, PyAny>) {
        self.close();
    }
}

impl Drop for PyStream {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}
