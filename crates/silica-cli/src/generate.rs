//! `silica generate`: text generation with a Llama-family model (by
//! default the built-in SmolLM2-135M-Instruct), streamed as it is produced.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use silica::{DType, Device};
use silica_models::chat::{Message, ModelTemplate};
use silica_models::generate::{GenerationStats, check_prompt};
use silica_models::gguf::GgufFile;
use silica_models::llama::{Llama, LlamaConfig, LoadOptions};
use silica_models::lora::LoraAdapter;
use silica_models::resolve;
use silica_models::sampling::{Sampler, SamplingParams};
use silica_models::tokenizer::{TokenStream, Tokenizer};

use crate::{CliError, emit};

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// The prompt (the user's message with --chat).
    #[arg(required_unless_present = "file", conflicts_with = "file")]
    prompt: Option<String>,
    /// Read the prompt from FILE ("-": standard input) instead; one final
    /// line end is dropped.
    #[arg(long, short = 'f', value_name = "FILE")]
    file: Option<PathBuf>,
    /// A GGUF file or a folder holding one [default: the built-in SmolLM2-135M-Instruct]
    #[arg(long, value_name = "PATH")]
    model: Option<String>,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    chat: bool,
    /// A system message for --chat (replaces the template's default one); an
    /// error when the model's template takes none (Gemma 2, Mistral v0.1).
    #[arg(long, value_name = "TEXT", requires = "chat")]
    system: Option<String>,
    /// Most tokens to generate (fewer when the model's context fills up).
    #[arg(long, value_name = "N", default_value_t = 128, allow_negative_numbers = true,
          value_parser = parse_count)]
    max_tokens: usize,
    /// 0 picks the most likely token every time (greedy).
    #[arg(long, value_name = "T", default_value_t = 0.7, allow_negative_numbers = true,
          value_parser = parse_temperature)]
    temperature: f32,
    /// Sample from the k most likely tokens only (0: all).
    #[arg(long, value_name = "K", default_value_t = 40, allow_negative_numbers = true,
          value_parser = parse_count)]
    top_k: usize,
    /// Sample from the smallest set of tokens whose probability reaches p.
    #[arg(long, value_name = "P", default_value_t = 0.9, allow_negative_numbers = true,
          value_parser = parse_fraction)]
    top_p: f32,
    /// Drop tokens less likely than this fraction of the most likely one.
    #[arg(long, value_name = "P", default_value_t = 0.05, allow_negative_numbers = true,
          value_parser = parse_fraction)]
    min_p: f32,
    /// Penalize tokens already present (1: off).
    #[arg(long, value_name = "X", default_value_t = 1.1, allow_negative_numbers = true,
          value_parser = parse_penalty)]
    repeat_penalty: f32,
    /// Subtract this times the number of times a token already appeared
    /// from its logit, -2 to 2 (OpenAI's frequency_penalty; 0: off).
    #[arg(long, value_name = "F", default_value_t = 0.0, allow_negative_numbers = true,
          value_parser = parse_openai_penalty)]
    frequency_penalty: f32,
    /// Subtract this from the logit of every token already present, -2 to 2
    /// (OpenAI's presence_penalty; 0: off).
    #[arg(long, value_name = "P", default_value_t = 0.0, allow_negative_numbers = true,
          value_parser = parse_openai_penalty)]
    presence_penalty: f32,
    /// Seed of the sampler: the same seed gives the same text.
    #[arg(long, default_value_t = 42, allow_negative_numbers = true, value_parser = parse_seed)]
    seed: u64,
    /// Stop when the output contains this text (may repeat).
    #[arg(long, value_name = "TEXT", value_parser = parse_stop)]
    stop: Vec<String>,
    /// cpu, gpu, gpu:N, metal, vulkan, dx12, gl or part of an adapter's name [default: SILICA_DEVICE, else the best GPU, else the CPU]
    #[arg(long, value_name = "SEL")]
    device: Option<String>,
    /// Compute dtype of the activations and of unquantized weights: f32, f16 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Decode quantized weights to --dtype at load instead of keeping them
    /// quantized on the device (more memory; the reference path).
    #[arg(long)]
    dequantize: bool,
    /// A LoRA adapter to apply: a PEFT folder (adapter_config.json +
    /// adapter_model.safetensors), its .safetensors file, or a llama.cpp
    /// .gguf adapter; `:SCALE` after the path scales it (default 1).
    /// Repeat for several adapters at once.
    #[arg(long, value_name = "PATH[:SCALE]", value_parser = parse_lora)]
    lora: Vec<(PathBuf, f32)>,
    /// Time every GPU kernel (timestamp queries; also SILICA_PROFILE=1) and
    /// print to stderr a timeline of the first token (load, kernel builds,
    /// the prompt's GPU time) and a table per generated token.
    /// Profiling slows decoding: the speed to quote is the one without it.
    #[arg(long)]
    profile: bool,
    /// With --profile: time each submitted batch of kernels as a whole
    /// instead of each kernel. The marks around every kernel cost GPU time
    /// of their own, so the per-kernel table overstates how long the GPU is
    /// busy per token; this gives that figure, gaps between kernels included.
    #[arg(long, requires = "profile")]
    profile_batches: bool,
}

fn parse_count(s: &str) -> Result<usize, String> {
    s.trim()
        .parse()
        .map_err(|_| "expected a whole number, 0 or more".to_string())
}

fn parse_seed(s: &str) -> Result<u64, String> {
    s.trim()
        .parse()
        .map_err(|_| "expected a whole number, 0 or more".to_string())
}

fn parse_number(s: &str) -> Result<f32, String> {
    match s.trim().parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err("expected a finite number".to_string()),
    }
}

fn parse_temperature(s: &str) -> Result<f32, String> {
    match parse_number(s)? {
        v if v >= 0.0 => Ok(v),
        _ => Err("expected 0 (greedy) or more".to_string()),
    }
}

fn parse_fraction(s: &str) -> Result<f32, String> {
    match parse_number(s)? {
        v if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err("expected a number from 0 to 1".to_string()),
    }
}

fn parse_openai_penalty(s: &str) -> Result<f32, String> {
    match parse_number(s)? {
        v if (-2.0..=2.0).contains(&v) => Ok(v),
        _ => Err("expected a number from -2 to 2 (0: off)".to_string()),
    }
}

fn parse_penalty(s: &str) -> Result<f32, String> {
    match parse_number(s)? {
        v if v > 0.0 => Ok(v),
        _ => Err("expected a number above 0 (1: off)".to_string()),
    }
}

/// `PATH[:SCALE]` of `--lora`: a final `:number` is the scale (so paths
/// with colons still work), 1 otherwise.
pub fn parse_lora(s: &str) -> Result<(PathBuf, f32), String> {
    if s.is_empty() {
        return Err("expected PATH or PATH:SCALE".to_string());
    }
    if let Some((path, scale)) = s.rsplit_once(':')
        && !path.is_empty()
        && let Ok(v) = scale.trim().parse::<f32>()
    {
        if !v.is_finite() {
            return Err(format!("the scale {scale:?} is not a finite number"));
        }
        return Ok((PathBuf::from(path), v));
    }
    Ok((PathBuf::from(s), 1.0))
}

/// The adapters of `--lora` for a base of shape `config`, on `device` in
/// `dtype`, each with its scale.
pub fn open_adapters(
    specs: &[(PathBuf, f32)],
    config: &LlamaConfig,
    device: &Device,
    dtype: DType,
) -> Result<Vec<(LoraAdapter, f32)>, CliError> {
    specs
        .iter()
        .map(|(path, scale)| {
            if !path.exists() {
                return Err(CliError::msg(format!(
                    "--lora {}: no such file or folder",
                    path.display()
                )));
            }
            Ok((LoraAdapter::open(path, config, device, dtype)?, *scale))
        })
        .collect()
}

fn parse_stop(s: &str) -> Result<String, String> {
    if s.is_empty() {
        Err("the stop text is empty".to_string())
    } else {
        Ok(s.to_string())
    }
}

pub fn parse_dtype(s: &str) -> Result<DType, CliError> {
    match s.to_ascii_lowercase().as_str() {
        "f32" => Ok(DType::F32),
        "f16" => Ok(DType::F16),
        "bf16" => Ok(DType::BF16),
        other => Err(CliError::msg(format!(
            "unknown dtype {other:?} (f32, f16 or bf16)"
        ))),
    }
}

/// The prompt of `--file` ("-": standard input), one final line end dropped.
fn read_prompt(path: &Path) -> Result<String, CliError> {
    let text = crate::read_text_file(path)?;
    let text = text.strip_suffix('\n').unwrap_or(&text);
    Ok(text.strip_suffix('\r').unwrap_or(text).to_string())
}

/// The model's tokenizer, the prompt's tokens and, with `--chat`, the name
/// of the chat template they went through (`gguf`, `chatml (fallback)`).
fn tokenize_prompt(
    gguf: &GgufFile,
    args: &GenerateArgs,
    prompt: &str,
) -> Result<(Tokenizer, Vec<u32>, Option<String>), CliError> {
    let tokenizer = Tokenizer::from_gguf(gguf)?;
    if !args.chat {
        let ids = tokenizer.encode(prompt, true)?;
        return Ok((tokenizer, ids, None));
    }
    let template = ModelTemplate::from_gguf(gguf)
        .map_err(|e| CliError::msg(format!("--chat: {e}")))?
        .ok_or_else(|| {
            CliError::msg(
                "--chat: the model has no chat template: its file has no tokenizer.chat_template, \
                 and none of the built-in ones (ChatML, Llama 2, Llama 3) fits its vocabulary or name"
                    .into(),
            )
        })?;
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(Message::system(system.as_str()));
    }
    messages.push(Message::user(prompt));
    let ids = template.encode(&tokenizer, &messages, true).map_err(|e| {
        // a template that takes the prompt alone refuses the system message
        if args.system.is_some() && template.render(&messages[1..], true).is_ok() {
            let why = e.to_string();
            let why = why
                .strip_prefix("the chat template rejects these messages: ")
                .unwrap_or(&why);
            CliError::msg(format!(
                "--system: the model's chat template does not accept a system message: {why}"
            ))
        } else {
            CliError::msg(format!("--chat: {e}"))
        }
    })?;
    Ok((tokenizer, ids, Some(template.name())))
}

pub fn run(args: &GenerateArgs) -> Result<(), CliError> {
    // The cheap checks first: the arguments, the prompt, the device and the
    // model's metadata. The prompt is tokenized while the weights load,
    // and its errors (its length among them) are reported before theirs.
    let dtype = parse_dtype(&args.dtype)?;
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(file)) => read_prompt(file)?,
        // clap requires one of the two
        (None, None) => return Err(CliError::msg("no prompt: pass one, or --file FILE".into())),
    };
    if prompt.trim().is_empty() {
        return Err(CliError::msg("the prompt is empty".into()));
    }
    let device = crate::open_device(args.device.as_deref())?;
    let path = resolve::resolve_decoder(args.model.as_deref())?;
    // the kernels an earlier run of this model used are built while it loads
    device.build_kernels_ahead(&crate::kernel_tag(
        "generate",
        &path,
        dtype,
        args.dequantize,
    ));
    let load_start = Instant::now();
    let gguf = GgufFile::open(&path)?;
    let config = LlamaConfig::from_gguf(&gguf)?;
    let adapters = open_adapters(&args.lora, &config, &device, dtype)?;
    let opts = LoadOptions {
        dtype,
        dequantize: args.dequantize,
    };
    // the tokenizer (a large share of the load for a 128K-token
    // vocabulary) is built while the weights load (docs/tuning.md,
    // "Tokenizer built during the load")
    let (tokenized, model) = std::thread::scope(|s| {
        let tokenize = s.spawn(|| tokenize_prompt(&gguf, args, &prompt));
        let model = Llama::load_with(&gguf, &device, opts);
        let tokenized = tokenize.join().unwrap_or_else(|_| {
            Err(CliError::msg(
                "internal error: the tokenizer panicked".into(),
            ))
        });
        (tokenized, model)
    });
    let (tokenizer, prompt_ids, template) = tokenized?;
    check_prompt(prompt_ids.len(), config.context_length)?;
    let mut model = model?;
    if !adapters.is_empty() {
        let refs: Vec<(&LoraAdapter, f32)> = adapters.iter().map(|(a, s)| (a, *s)).collect();
        model.set_adapters(&refs)?;
    }
    // the load ends when the weights are on the device: their uploads
    // would otherwise finish inside the first prompt's time
    device.synchronize()?;
    let model_name = gguf
        .get("general.name")
        .and_then(|v| v.as_str())
        .map(str::to_string)
        .unwrap_or_else(|| path.display().to_string());
    eprintln!(
        "silica: {model_name} ({}, {} layers) on {device}, loaded in {:.1} s",
        model.config.architecture,
        model.config.n_layers,
        load_start.elapsed().as_secs_f64()
    );
    for (adapter, scale) in &adapters {
        eprintln!(
            "silica: LoRA adapter {} at scale {scale} ({} tensors)",
            adapter.path().display(),
            adapter.weights().count()
        );
    }
    // --profile times the prefill's kernels up to the first piece of text,
    // then the decode's
    let profile = args.profile || silica::GpuOptions::from_env().profile;
    let profiling = profile && device.info().timestamps;
    let loaded = Loaded {
        seconds: load_start.elapsed().as_secs_f64(),
        builds: device.pipeline_builds(),
        memory: device.memory_stats().allocated,
    };
    if profile {
        device.set_profiling(profiling);
        device.reset_profile();
        if let Device::Gpu(g) = &device {
            g.set_profile_batches(args.profile_batches);
        }
        if !profiling {
            eprintln!(
                "silica: --profile needs a GPU with timestamp queries; {device} has none, nothing is profiled"
            );
        }
    }
    if !args.chat {
        emit(&prompt)?;
    }
    let mut sampler = Sampler::new(SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repeat_penalty,
        frequency_penalty: args.frequency_penalty,
        presence_penalty: args.presence_penalty,
        seed: args.seed,
    });
    let mut decode_start: Option<Instant> = None;
    let mut prefill: Option<PrefillProfile> = None;
    device.reset_peak_memory();
    let prompt_start = Instant::now();
    let stats = silica_models::generate::generate(
        &model,
        &tokenizer,
        &prompt_ids,
        &mut sampler,
        args.max_tokens,
        &args.stop,
        // a closed pipe ends the program (emit); other write errors
        // must not stop the generation
        |piece| {
            if profiling && decode_start.is_none() {
                // the prefill's work has finished: its logits were read back
                prefill = Some(PrefillProfile {
                    wall: prompt_start.elapsed(),
                    recorded: Duration::ZERO,
                    builds: device.pipeline_builds(),
                    kernels: device.profile_report(),
                    peak_memory: device.memory_stats().peak_allocated,
                });
                device.reset_profile();
                device.set_profiling(true);
                decode_start = Some(Instant::now());
            }
            let _ = emit(piece);
            std::ops::ControlFlow::Continue(())
        },
    )?;
    let decode_wall = decode_start.map(|t| t.elapsed());
    emit("\n")?;
    let peak = device.memory_stats().peak_allocated;
    let memory = if device.is_gpu() {
        format!(
            "peak device memory {:.0} MiB",
            peak as f64 / (1 << 20) as f64
        )
    } else {
        "host memory".to_string()
    };
    // with --chat, the chat template used, before the stop reason (which
    // stays last)
    let template = template
        .map(|name| format!(" | template: {name}"))
        .unwrap_or_default();
    eprintln!(
        "[{device} | {model_name} | {} prompt tokens, prefill {:.0} ms | {} tokens at {:.1} tok/s | {memory}{template} | stop: {}]",
        stats.prompt_tokens,
        stats.prefill_time.as_secs_f64() * 1e3,
        stats.generated_tokens,
        stats.decode_tokens_per_second(),
        if stats.stop_reason == "context full" {
            format!("context full ({} tokens)", model.config.context_length)
        } else {
            stats.stop_reason.to_string()
        }
    );
    if let Some(p) = &mut prefill {
        p.recorded = stats.prefill_record_time;
        print_prefill_timeline(&device, &loaded, p, stats.prompt_tokens);
    }
    if let Some(wall) = decode_wall {
        device.synchronize()?;
        device.set_profiling(false);
        let steps = profiled_steps(&tokenizer, &stats)?;
        print_profile(&device, steps, wall);
    }
    Ok(())
}

/// The model as loaded: when, kernels built by then, device memory held.
struct Loaded {
    seconds: f64,
    builds: (u64, Duration),
    memory: u64,
}

/// What --profile saw of the prompt, up to the first piece of text.
struct PrefillProfile {
    wall: Duration,
    /// Until the prompt's forward pass was recorded.
    recorded: Duration,
    builds: (u64, Duration),
    kernels: Vec<silica::KernelTime>,
    peak_memory: u64,
}

/// The --profile timeline of the first token: load, then the prompt's
/// wall time split into kernel builds, GPU busy time and the rest, then
/// the prompt's kernels by GPU time.
fn print_prefill_timeline(device: &Device, loaded: &Loaded, p: &PrefillProfile, tokens: usize) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let busy: f64 = p.kernels.iter().map(|k| k.seconds).sum();
    let dispatches: u64 = p.kernels.iter().map(|k| k.dispatches).sum();
    let built = p.builds.0 - loaded.builds.0;
    let build_time = p.builds.1.saturating_sub(loaded.builds.1);
    eprintln!(
        "
Timeline of the first token on {device}:"
    );
    eprintln!(
        "  model loaded          {:>9.1} ms  ({} kernels built by then in {:.1} ms; {:.0} MiB on the device)",
        loaded.seconds * 1e3,
        loaded.builds.0,
        ms(loaded.builds.1),
        mib(loaded.memory)
    );
    eprintln!(
        "  prompt of {tokens:>5} tokens {:>9.1} ms  until its first token was read back, of which:",
        ms(p.wall)
    );
    eprintln!(
        "    kernels built       {:>9.1} ms  ({built} kernels, on any thread: the decode's are built beside the prompt)",
        ms(build_time)
    );
    eprintln!(
        "    GPU busy (kernels)  {:>9.1} ms  ({dispatches} dispatches)",
        busy * 1e3
    );
    eprintln!(
        "    the rest            {:>9.1} ms  (recording, uploads, submission, read-back, waiting)",
        (ms(p.wall) - busy * 1e3 - ms(build_time)).max(0.0)
    );
    eprintln!(
        "  the prompt recorded   {:>9.1} ms  after it started (the host's part: kernels found or built, buffers, dispatches)",
        ms(p.recorded)
    );
    eprintln!(
        "  peak device memory    {:>9.0} MiB during the prompt",
        mib(p.peak_memory)
    );
    let mut kernels: Vec<_> = p.kernels.iter().collect();
    kernels.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    const SHOWN: usize = 10;
    eprintln!("  the prompt's kernels by GPU time:");
    for k in kernels.iter().take(SHOWN) {
        eprintln!(
            "    {:<28} {:>6} dispatches {:>9.1} µs",
            k.name,
            k.dispatches,
            k.seconds * 1e6
        );
    }
    if kernels.len() > SHOWN {
        eprintln!("    ({} more kernels)", kernels.len() - SHOWN);
    }
}

/// The forward passes run after the first piece of text was emitted, which
/// is when profiling started: one per generated token except where the loop
/// stopped before running the model on the last one, less those before the
/// first piece (a token that ends inside a character emits nothing).
fn profiled_steps(tokenizer: &Tokenizer, stats: &GenerationStats) -> Result<usize, CliError> {
    let forwards = if stats.stop_reason == "eos" {
        stats.generated_tokens
    } else {
        stats.generated_tokens.saturating_sub(1)
    };
    let mut stream = TokenStream::new(tokenizer);
    for (i, &id) in stats.tokens.iter().enumerate() {
        if stream.push(id)?.is_some() {
            return Ok(forwards.saturating_sub(i));
        }
    }
    Ok(0)
}

/// The --profile table: per kernel, dispatches and GPU time per decode
/// step; then wall time, GPU busy time and host-side time per step.
fn print_profile(device: &Device, steps: usize, wall: Duration) {
    if steps == 0 {
        eprintln!("silica: --profile: no decode step ran (generate at least 2 tokens)");
        return;
    }
    let report = device.profile_report();
    let by_grid = device.profile_report_by_grid();
    let n = steps as f64;
    let busy: f64 = report.iter().map(|k| k.seconds).sum();
    let dispatches: u64 = report.iter().map(|k| k.dispatches).sum();
    let us = |s: f64| s / n * 1e6;
    let share = |s: f64| if busy > 0.0 { 100.0 * s / busy } else { 0.0 };
    // --profile-batches: one entry, whole submitted batches
    let batches = report.iter().any(|k| k.name == "(batches)");
    let marks = if batches {
        "every submitted batch"
    } else {
        "every kernel"
    };
    eprintln!(
        "\nGPU profile of the decode on {device}: {steps} steps, timestamps around {marks}; per token:"
    );
    eprintln!(
        "{:<28} {:>11} {:>12} {:>7}",
        "kernel", "dispatches", "GPU µs", "share"
    );
    for k in &report {
        eprintln!(
            "{:<28} {:>11.1} {:>12.1} {:>6.1}%",
            k.name,
            k.dispatches as f64 / n,
            us(k.seconds),
            share(k.seconds)
        );
        // the grids tell apart the calls of one kernel (e.g. the projections)
        let grids: Vec<_> = by_grid.iter().filter(|g| g.name == k.name).collect();
        if grids.len() > 1 {
            const SHOWN: usize = 6;
            for g in grids.iter().take(SHOWN) {
                let [x, y, z] = g.grid.unwrap_or_default();
                eprintln!(
                    "{:<28} {:>11.1} {:>12.1} {:>6.1}%",
                    format!("  grid {x}x{y}x{z}"),
                    g.dispatches as f64 / n,
                    us(g.seconds),
                    share(g.seconds)
                );
            }
            if grids.len() > SHOWN {
                eprintln!("  ({} more grids)", grids.len() - SHOWN);
            }
        }
    }
    let wall = wall.as_secs_f64();
    eprintln!("decode wall time   {:>10.1} µs/token", wall / n * 1e6);
    eprintln!(
        "GPU busy (kernels) {:>10.1} µs/token ({:.0}% of wall)",
        us(busy),
        100.0 * busy / wall
    );
    eprintln!(
        "host-side          {:>10.1} µs/token (recording, submission, read-backs, waiting, sampling; copies outside kernels)",
        us((wall - busy).max(0.0))
    );
    eprintln!(
        "{}         {:>10.1} per token",
        if batches { "batches   " } else { "dispatches" },
        dispatches as f64 / n
    );
    eprintln!(
        "note: profiling waits for every batch and reads its timestamps back, which slows decoding; quote the decode speed of a run without --profile"
    );
}
