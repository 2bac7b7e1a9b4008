//! `silica serve`: an OpenAI-compatible HTTP server. The port opens at once
//! and the models load behind it (`GET /health` answers 503 until they
//! are in); chat and text completions go to the batching engine
//! (`engine.rs`), embeddings to the sentence encoder. On SIGTERM or Ctrl-C
//! it stops accepting, lets the requests in flight finish (at most
//! `--grace` seconds) and exits 0.

mod engine;
mod metrics;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};
use silica::{DType, Device};
use silica_models::bert::SentenceEncoder;
use silica_models::chat::{Message, ModelTemplate, encode_prompt};
use silica_models::gguf::GgufFile;
use silica_models::llama::{Llama, LoadOptions};
use silica_models::resolve;
use silica_models::sampling::SamplingParams;
use silica_models::tokenizer::Tokenizer;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::CliError;
use crate::activations::parse_positive;
use engine::{Engine, Event, Job};
use metrics::Metrics;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// A GGUF decoder [default: the built-in SmolLM2-135M-Instruct]
    #[arg(long, value_name = "PATH")]
    model: Option<String>,
    /// The sentence encoder of /v1/embeddings (a sentence-transformers
    /// folder or name), or "none" [default: the built-in all-MiniLM-L6-v2]
    #[arg(long, value_name = "PATH")]
    embed_model: Option<String>,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// cpu, gpu, gpu:N, ... (one process per GPU on a host with several)
    /// [default: SILICA_DEVICE, else the best GPU, else the CPU]
    #[arg(long, value_name = "SEL")]
    device: Option<String>,
    /// Sequences decoded together at most; more requests wait.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = parse_positive)]
    parallel: usize,
    /// Requests that may wait for a slot; beyond, 429 with Retry-After.
    #[arg(long, value_name = "N", default_value_t = 64)]
    queue: usize,
    /// Positions per sequence (prompt and generated tokens) [default: the
    /// model's context, at most 4096]
    #[arg(long, value_name = "N", value_parser = parse_positive)]
    ctx: Option<usize>,
    /// Require `Authorization: Bearer KEY` on the /v1 endpoints.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Seconds the requests in flight get to finish after SIGTERM.
    #[arg(long, value_name = "S", default_value_t = 30)]
    grace: u64,
    /// Compute dtype of the decoder: f32, f16 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Compute every prompt whole: by default a finished request's KV
    /// cache stays in its slot, and a prompt that starts with the same
    /// tokens (a chat's earlier turns, a shared system prompt) computes only
    /// the rest.
    #[arg(long)]
    no_prompt_cache: bool,
    /// Rows of a step (sequences decoded together, or a prompt's tokens)
    /// from which quantized products multiply f16 copies of the weights,
    /// decoded once and kept beside them: on a GPU with `--dtype f16`, 2
    /// bytes a weight more for many times the throughput of many streams
    /// (docs/tuning.md, "Decoded weights kept"); 0 off, else from 9
    /// [default: SILICA_KEEP_DECODED, else 0]
    #[arg(long, value_name = "ROWS")]
    keep_decoded: Option<u32>,
}

/// What is served once loaded.
struct Loaded {
    engine: Engine,
    tokenizer: Arc<Tokenizer>,
    template: Option<ModelTemplate>,
    model_id: String,
    context: usize,
    encoder: Option<(String, Mutex<SentenceEncoder>)>,
    device: Device,
}

struct AppState {
    loaded: OnceLock<Loaded>,
    api_key: Option<String>,
    queue: usize,
    metrics: Arc<Metrics>,
    started: u64,
    stopping: AtomicBool,
}

type Shared = Arc<AppState>;

pub fn run(args: &ServeArgs) -> Result<(), CliError> {
    let dtype = crate::generate::parse_dtype(&args.dtype)?;
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .or_else(|_| {
            use std::net::ToSocketAddrs;
            (args.host.as_str(), args.port)
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .ok_or(())
        })
        .map_err(|_| CliError::msg(format!("--host {:?} is not an address", args.host)))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CliError::msg(format!("the async runtime: {e}")))?;
    runtime.block_on(serve(args, addr, dtype))
}

async fn serve(args: &ServeArgs, addr: SocketAddr, dtype: DType) -> Result<(), CliError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CliError::msg(format!("cannot listen on {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| CliError::msg(e.to_string()))?;
    eprintln!("silica serve: listening on http://{local} (loading the models)");
    let metrics = Arc::new(Metrics::new());
    let state: Shared = Arc::new(AppState {
        loaded: OnceLock::new(),
        api_key: args.api_key.clone(),
        queue: args.queue,
        metrics: metrics.clone(),
        started: unix_now(),
        stopping: AtomicBool::new(false),
    });
    // the models load while the port answers /health with 503
    let (load_tx, mut load_rx) = tokio::sync::oneshot::channel();
    {
        let state = state.clone();
        let opts = LoadArgs {
            model: args.model.clone(),
            embed: args.embed_model.clone(),
            device: args.device.clone(),
            parallel: args.parallel,
            ctx: args.ctx,
            prompt_cache: !args.no_prompt_cache,
            keep_decoded: args.keep_decoded,
        };
        std::thread::spawn(move || {
            let r = load(opts, dtype, metrics).map(|l| {
                let _ = state.loaded.set(l);
            });
            let _ = load_tx.send(r);
        });
    }
    let app = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/health/live", get(live))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .with_state(state.clone());
    let grace = Duration::from_secs(args.grace);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        let _ = stop_rx.await;
    });
    let server = tokio::spawn(async move { server.await });
    tokio::select! {
        r = &mut load_rx => match r {
            Ok(Ok(())) => {
                let l = state.loaded.get().expect("set before the message");
                eprintln!(
                    "silica serve: ready: {} on {} ({} positions per sequence){}",
                    l.model_id,
                    l.device,
                    l.context,
                    l.encoder.as_ref().map(|e| format!(", embeddings: {}", e.0)).unwrap_or_default()
                );
                // kernels built while loading are there for a restarted replica
                tokio::task::spawn_blocking(silica::save_pipeline_caches);
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(CliError::msg("internal error: the model loader stopped".into())),
        },
        _ = shutdown_signal() => {
            return Ok(());
        }
    }
    shutdown_signal().await;
    eprintln!(
        "silica serve: stopping: no new requests; waiting up to {} s for those in flight",
        args.grace
    );
    state.stopping.store(true, Ordering::SeqCst);
    let _ = stop_tx.send(());
    let finished = tokio::time::timeout(grace, server).await.is_ok();
    // the decode thread lets go of the device before the process exits
    if let Some(l) = state.loaded.get() {
        let engine = &l.engine;
        tokio::task::block_in_place(|| engine.shutdown());
    }
    if finished {
        eprintln!("silica serve: stopped");
    } else {
        eprintln!("silica serve: stopped after the grace period, with requests still in flight")
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// What `load` takes of the command line.
struct LoadArgs {
    model: Option<String>,
    embed: Option<String>,
    device: Option<String>,
    parallel: usize,
    ctx: Option<usize>,
    prompt_cache: bool,
    keep_decoded: Option<u32>,
}

fn load(
    LoadArgs {
        model,
        embed,
        device,
        parallel,
        ctx,
        prompt_cache,
        keep_decoded,
    }: LoadArgs,
    dtype: DType,
    metrics: Arc<Metrics>,
) -> Result<Loaded, CliError> {
    if keep_decoded.is_some_and(|rows| rows > 0) && dtype != DType::F16 {
        eprintln!(
            "silica serve: --keep-decoded takes effect with --dtype f16 only (the copies are multiplied with f16 activations)"
        );
    }
    let device = match keep_decoded {
        Some(rows) => {
            let opts = silica::GpuOptions {
                keep_decoded: rows,
                ..silica::GpuOptions::from_env()
            };
            silica::Device::select_with_options(device.as_deref(), &opts)?
        }
        None => crate::open_device(device.as_deref())?,
    };
    let path = resolve::resolve_decoder(model.as_deref())?;
    // the kernels an earlier server of this model used are built while it
    // loads (the engine waits for them before the server is ready)
    device.build_kernels_ahead(&crate::kernel_tag("serve", &path, dtype, false));
    let gguf = GgufFile::open(&path)?;
    let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf)?);
    let template = ModelTemplate::from_gguf(&gguf)?;
    let llama = Llama::load_with(
        &gguf,
        &device,
        LoadOptions {
            dtype,
            dequantize: false,
        },
    )?;
    let context = ctx.unwrap_or(4096).min(llama.config.context_length);
    let model_id = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let encoder = match embed.as_deref() {
        Some("none") => None,
        other => {
            let dir = resolve::resolve_encoder(other)?;
            let enc = SentenceEncoder::load(&dir, &device, DType::F32)?;
            // the folder's name, or for the built-in model (a folder named
            // `model`) its name without the description
            let id = dir
                .file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .filter(|s| s != "model")
                .unwrap_or_else(|| {
                    let name = resolve::DEFAULT_ENCODER.name;
                    name.split(" (").next().unwrap_or(name).to_string()
                });
            Some((id, Mutex::new(enc)))
        }
    };
    let engine = Engine::start(
        llama,
        tokenizer.clone(),
        parallel,
        context,
        prompt_cache,
        metrics,
    )?;
    Ok(Loaded {
        engine,
        tokenizer,
        template,
        model_id,
        context,
        encoder,
        device,
    })
}

/// Whether `e` is the device running out of memory (answered 503: the
/// request may succeed later, the server goes on).
fn is_oom(e: &silica_models::Error) -> bool {
    matches!(
        e,
        silica_models::Error::Tensor(silica::Error::OutOfMemory { .. })
    )
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// An error in OpenAI's JSON shape.
struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    param: Option<&'static str>,
    code: Option<&'static str>,
}

impl ApiError {
    fn bad(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: None,
            code: None,
        }
    }
    fn param(mut self, p: &'static str) -> Self {
        self.param = Some(p);
        self
    }
    fn status(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }});
        let mut r = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

/// The loaded models, after the API key check; 503 while loading or stopping.
fn ready<'a>(state: &'a AppState, headers: &HeaderMap) -> Result<&'a Loaded, ApiError> {
    if let Some(key) = &state.api_key {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            let mut e = ApiError::status(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "a valid API key is needed: Authorization: Bearer KEY",
            );
            e.code = Some("invalid_api_key");
            return Err(e);
        }
    }
    if state.stopping.load(Ordering::SeqCst) {
        return Err(ApiError::status(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the server is shutting down",
        ));
    }
    state.loaded.get().ok_or_else(|| {
        ApiError::status(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the models are loading",
        )
    })
}

fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "the body is not valid JSON"
        } else {
            "the request does not fit the API"
        };
        ApiError::bad(format!("{what}: {e}"))
    })
}

#[derive(Deserialize)]
#[serde(untagged)]
enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The sampling fields chat and text completions share.
#[derive(Deserialize)]
struct Sampling {
    model: Option<String>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    stop: Option<StopField>,
    seed: Option<u64>,
    n: Option<i64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    content: Option<Content>,
}

#[derive(Deserialize)]
struct ChatRequest {
    messages: Vec<ChatMessage>,
    #[serde(flatten)]
    sampling: Sampling,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PromptField {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct CompletionRequest {
    prompt: PromptField,
    #[serde(flatten)]
    sampling: Sampling,
}

fn check_model(given: Option<&str>, served: &str) -> Result<(), ApiError> {
    match given {
        None => Ok(()),
        Some(m) if m == served || m == "default" || m == "silica" => Ok(()),
        Some(m) => Err(ApiError::bad(format!(
            "model {m:?} is not served here; this server has {served:?}"
        ))
        .param("model")),
    }
}

/// The engine job for `prompt` under `s`'s settings, and its event stream.
fn job(
    l: &Loaded,
    s: &Sampling,
    prompt: Vec<u32>,
) -> Result<(Job, mpsc::UnboundedReceiver<Event>), ApiError> {
    check_model(s.model.as_deref(), &l.model_id)?;
    if let Some(n) = s.n
        && n != 1
    {
        return Err(ApiError::bad("only n = 1 is supported").param("n"));
    }
    if prompt.is_empty() {
        return Err(ApiError::bad("the prompt is empty").param("prompt"));
    }
    if prompt.len() >= l.context {
        return Err(ApiError::bad(format!(
            "the prompt has {} tokens; this server's context holds {}",
            prompt.len(),
            l.context
        ))
        .param("messages"));
    }
    let room = l.context - prompt.len();
    let max_tokens = match s.max_completion_tokens.or(s.max_tokens) {
        Some(m) if m <= 0 => {
            return Err(
                ApiError::bad(format!("max_tokens must be at least 1, not {m}"))
                    .param("max_tokens"),
            );
        }
        Some(m) => (m as usize).min(room),
        None => room,
    };
    let temperature = s.temperature.unwrap_or(1.0);
    let top_p = s.top_p.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad("temperature must be between 0 and 2").param("temperature"));
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad("top_p must be above 0 and at most 1").param("top_p"));
    }
    for (name, v) in [
        ("frequency_penalty", s.frequency_penalty),
        ("presence_penalty", s.presence_penalty),
    ] {
        if v.is_some_and(|v| !(-2.0..=2.0).contains(&v)) {
            return Err(ApiError::bad(format!("{name} must be between -2 and 2")).param(name));
        }
    }
    let stop = match &s.stop {
        None => Vec::new(),
        Some(StopField::One(x)) => vec![x.clone()],
        Some(StopField::Many(v)) => v.clone(),
    };
    let params = SamplingParams {
        temperature,
        top_k: s.top_k.unwrap_or(0),
        top_p,
        min_p: s.min_p.unwrap_or(0.0),
        repetition_penalty: s.repetition_penalty.unwrap_or(1.0),
        frequency_penalty: s.frequency_penalty.unwrap_or(0.0),
        presence_penalty: s.presence_penalty.unwrap_or(0.0),
        seed: s.seed.unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        }),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    Ok((
        Job {
            prompt,
            params,
            max_tokens,
            stop,
            events: tx,
            submitted: Instant::now(),
        },
        rx,
    ))
}

fn submit(state: &AppState, l: &Loaded, job: Job) -> Result<(), ApiError> {
    if l.engine.queued.load(Ordering::SeqCst) >= state.queue {
        return Err(ApiError::status(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "every sequence slot is busy and the queue is full; retry shortly",
        ));
    }
    state.metrics.prompt(job.prompt.len());
    if !l.engine.submit(job) {
        return Err(ApiError::status(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the decode engine has stopped",
        ));
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Kind {
    Chat,
    Text,
}

async fn chat_completions(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let r = chat_inner(&state, &headers, &body).await;
    finish(&state, "/v1/chat/completions", r)
}

async fn chat_inner(
    state: &Shared,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let l = ready(state, headers)?;
    let req: ChatRequest = parse(body)?;
    if req.messages.is_empty() {
        return Err(ApiError::bad("messages must not be empty").param("messages"));
    }
    let mut messages = Vec::with_capacity(req.messages.len());
    for m in &req.messages {
        let text = match &m.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut t = String::new();
                for p in parts {
                    if p.kind != "text" {
                        return Err(ApiError::bad(format!(
                            "message content of type {:?} is not supported (text only)",
                            p.kind
                        ))
                        .param("messages"));
                    }
                    t.push_str(p.text.as_deref().unwrap_or(""));
                }
                t
            }
        };
        messages.push(Message::new(m.role.clone(), text));
    }
    let template = l
        .template
        .as_ref()
        .ok_or_else(|| ApiError::bad("the model has no chat template; use /v1/completions"))?;
    let prompt = template
        .encode(&l.tokenizer, &messages, true)
        .map_err(|e| ApiError::bad(e.to_string()).param("messages"))?;
    generate(state, l, &req.sampling, prompt, Kind::Chat).await
}

/// Queues `prompt` under `sampling`'s settings and answers with its result,
/// streamed or whole.
async fn generate(
    state: &AppState,
    l: &Loaded,
    sampling: &Sampling,
    prompt: Vec<u32>,
    kind: Kind,
) -> Result<Response, ApiError> {
    let (job, rx) = job(l, sampling, prompt)?;
    let include_usage = sampling
        .stream_options
        .as_ref()
        .is_some_and(|o| o.include_usage);
    submit(state, l, job)?;
    respond(l, rx, kind, sampling.stream, include_usage).await
}

async fn completions(State(state): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let r = completions_inner(&state, &headers, &body).await;
    finish(&state, "/v1/completions", r)
}

async fn completions_inner(
    state: &Shared,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let l = ready(state, headers)?;
    let req: CompletionRequest = parse(body)?;
    let text = match &req.prompt {
        PromptField::One(t) => t.clone(),
        PromptField::Many(v) if v.len() == 1 => v[0].clone(),
        PromptField::Many(_) => {
            return Err(ApiError::bad("one prompt per request").param("prompt"));
        }
    };
    let prompt = encode_prompt(&l.tokenizer, &text)
        .map_err(|e| ApiError::bad(e.to_string()).param("prompt"))?;
    generate(state, l, &req.sampling, prompt, Kind::Text).await
}

fn finish(state: &AppState, endpoint: &'static str, r: Result<Response, ApiError>) -> Response {
    let resp = match r {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    state.metrics.request(endpoint, resp.status().as_u16());
    resp
}

fn completion_id(kind: Kind) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    match kind {
        Kind::Chat => format!("chatcmpl-{:x}{n:06}", unix_now()),
        Kind::Text => format!("cmpl-{:x}{n:06}", unix_now()),
    }
}

/// OpenAI's usage object; `cached`: prompt tokens taken from the KV cache
/// of an earlier request.
fn usage(prompt: usize, cached: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// A chunk (streamed) or a whole response's choice.
fn choice(kind: Kind, text: Option<&str>, finish: Option<&str>, first: bool, delta: bool) -> Value {
    match (kind, delta) {
        (Kind::Chat, true) => {
            let mut d = serde_json::Map::new();
            if first {
                d.insert("role".into(), json!("assistant"));
            }
            if let Some(t) = text {
                d.insert("content".into(), json!(t));
            }
            json!({"index": 0, "delta": d, "logprobs": null, "finish_reason": finish})
        }
        (Kind::Chat, false) => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text.unwrap_or("")},
            "logprobs": null,
            "finish_reason": finish,
        }),
        (Kind::Text, _) => {
            json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish})
        }
    }
}

async fn respond(
    l: &Loaded,
    mut rx: mpsc::UnboundedReceiver<Event>,
    kind: Kind,
    stream: bool,
    include_usage: bool,
) -> Result<Response, ApiError> {
    let id = completion_id(kind);
    let created = unix_now();
    let object = match (kind, stream) {
        (Kind::Chat, true) => "chat.completion.chunk",
        (Kind::Chat, false) => "chat.completion",
        (Kind::Text, _) => "text_completion",
    };
    let model = l.model_id.clone();
    if !stream {
        let mut text = String::new();
        loop {
            match rx.recv().await {
                Some(Event::Text(t)) => text.push_str(&t),
                Some(Event::Done {
                    finish,
                    prompt_tokens,
                    cached_tokens,
                    completion_tokens,
                }) => {
                    let body = json!({
                        "id": id, "object": object, "created": created, "model": model,
                        "choices": [choice(kind, Some(&text), Some(finish.as_str()), true, false)],
                        "usage": usage(prompt_tokens, cached_tokens, completion_tokens),
                    });
                    return Ok(axum::Json(body).into_response());
                }
                Some(Event::Failed { status, message }) => {
                    return Err(ApiError::status(
                        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                        "server_error",
                        message,
                    ));
                }
                None => {
                    return Err(ApiError::status(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        "the generation ended without a result",
                    ));
                }
            }
        }
    }
    // streamed: engine events become SSE chunks in a task of their own; a
    // client that leaves drops the SSE stream, which ends that task, which
    // drops the engine's receiver, which frees the sequence
    let (tx, out) = mpsc::unbounded_channel::<Result<SseEvent, Infallible>>();
    tokio::spawn(async move {
        let chunk = |choices: Value, usage_v: Value| {
            let mut v = json!({"id": id, "object": object, "created": created, "model": model, "choices": choices});
            if include_usage {
                v["usage"] = usage_v;
            }
            SseEvent::default().data(v.to_string())
        };
        let mut first = true;
        while let Some(ev) = rx.recv().await {
            let sent = match ev {
                Event::Text(t) => {
                    let c = choice(kind, Some(&t), None, first, true);
                    first = false;
                    tx.send(Ok(chunk(json!([c]), Value::Null)))
                }
                Event::Done {
                    finish,
                    prompt_tokens,
                    cached_tokens,
                    completion_tokens,
                } => {
                    let c = choice(kind, None, Some(finish.as_str()), first, true);
                    let _ = tx.send(Ok(chunk(json!([c]), Value::Null)));
                    if include_usage {
                        let _ = tx.send(Ok(chunk(
                            json!([]),
                            usage(prompt_tokens, cached_tokens, completion_tokens),
                        )));
                    }
                    let _ = tx.send(Ok(SseEvent::default().data("[DONE]")));
                    break;
                }
                Event::Failed { status, message } => {
                    let e = json!({"error": {"message": message, "type": "server_error", "param": null, "code": status}});
                    let _ = tx.send(Ok(SseEvent::default().data(e.to_string())));
                    let _ = tx.send(Ok(SseEvent::default().data("[DONE]")));
                    break;
                }
            };
            if sent.is_err() {
                break;
            }
        }
    });
    Ok(Sse::new(UnboundedReceiverStream::new(out))
        .keep_alive(KeepAlive::default())
        .into_response())
}

#[derive(Deserialize)]
#[serde(untagged)]
enum EmbedInput {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct EmbedRequest {
    input: EmbedInput,
    model: Option<String>,
    encoding_format: Option<String>,
    dimensions: Option<usize>,
}

async fn embeddings(State(state): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let r = embeddings_inner(&state, &headers, &body).await;
    finish(&state, "/v1/embeddings", r)
}

async fn embeddings_inner(
    state: &Shared,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let l = ready(state, headers)?;
    let req: EmbedRequest = parse(body)?;
    let Some((id, _)) = &l.encoder else {
        return Err(ApiError::bad(
            "this server has no embedding model (--embed-model none)",
        ));
    };
    check_model(req.model.as_deref(), id)?;
    let texts = match req.input {
        EmbedInput::One(t) => vec![t],
        EmbedInput::Many(v) => v,
    };
    if texts.is_empty() {
        return Err(ApiError::bad("input must not be empty").param("input"));
    }
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad(format!(
                "encoding_format {other:?}: expected float or base64"
            ))
            .param("encoding_format"));
        }
    };
    let state2 = state.clone();
    let (vectors, tokens) = tokio::task::spawn_blocking(move || {
        let l = state2.loaded.get().expect("ready checked it");
        let enc = l
            .encoder
            .as_ref()
            .expect("checked above")
            .1
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let tokens: usize = texts
            .iter()
            .map(|t| enc.tokenize(t).map(|v| v.len()).unwrap_or(0))
            .sum();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        enc.embed(&refs).map(|v| (v, tokens))
    })
    .await
    .map_err(|e| {
        ApiError::status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            e.to_string(),
        )
    })?
    .map_err(|e| {
        if is_oom(&e) {
            ApiError::status(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                e.to_string(),
            )
        } else {
            ApiError::bad(e.to_string())
        }
    })?;
    if let Some(d) = req.dimensions
        && vectors.first().is_some_and(|v| v.len() != d)
    {
        return Err(ApiError::bad(format!(
            "dimensions {d}: the model's embeddings have {}",
            vectors[0].len()
        ))
        .param("dimensions"));
    }
    state.metrics.embedded(vectors.len());
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(axum::Json(json!({
        "object": "list",
        "data": data,
        "model": id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

async fn models(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let r = ready(&state, &headers).map(|l| {
        let mut data = vec![json!({"id": l.model_id, "object": "model", "created": state.started, "owned_by": "silica"})];
        if let Some((id, _)) = &l.encoder {
            data.push(json!({"id": id, "object": "model", "created": state.started, "owned_by": "silica"}));
        }
        axum::Json(json!({"object": "list", "data": data})).into_response()
    });
    finish(&state, "/v1/models", r)
}

/// Ready: 200 once the models are loaded (and not stopping), else 503.
async fn health(State(state): State<Shared>) -> Response {
    let (status, text) = if state.stopping.load(Ordering::SeqCst) {
        (StatusCode::SERVICE_UNAVAILABLE, "stopping")
    } else if state.loaded.get().is_some() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "loading")
    };
    (status, axum::Json(json!({"status": text}))).into_response()
}

/// Live: 200 while the process serves at all.
async fn live() -> Response {
    axum::Json(json!({"status": "live"})).into_response()
}

async fn metrics_text(State(state): State<Shared>) -> Response {
    let loaded = state.loaded.get();
    let memory = loaded.map(|l| l.device.memory_stats()).unwrap_or_default();
    let kernels = loaded.map_or((0, Duration::ZERO), |l| l.device.pipeline_builds());
    let mut r = state.metrics.render(&memory, kernels).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    r
}

async fn not_found(State(state): State<Shared>) -> Response {
    let e = ApiError::status(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "no such endpoint",
    );
    finish(&state, "other", Err(e))
}
