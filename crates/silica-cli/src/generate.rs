//! `silica generate`: text generation with a Llama-family model (by
//! default the built-in SmolLM2-135M-Instruct), streamed as it is produced.

use std::io::Write;
use std::time::Instant;

use silica::{DType, Device};
use silica_models::chat::{ChatTemplate, Message};
use silica_models::gguf::GgufFile;
use silica_models::llama::{Llama, LoadOptions};
use silica_models::resolve;
use silica_models::sampling::{Sampler, SamplingParams};
use silica_models::tokenizer::Tokenizer;

use crate::CliError;

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// The prompt (the user's message with --chat).
    prompt: String,
    /// A GGUF file or a folder holding one [default: the built-in SmolLM2-135M-Instruct]
    #[arg(long, value_name = "PATH")]
    model: Option<String>,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    chat: bool,
    /// A system message for --chat (replaces the template's default one).
    #[arg(long, value_name = "TEXT", requires = "chat")]
    system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// 0 picks the most likely token every time (greedy).
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    /// Sample from the k most likely tokens only (0: all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Sample from the smallest set of tokens whose probability reaches p.
    #[arg(long, default_value_t = 0.9)]
    top_p: f32,
    /// Drop tokens less likely than this fraction of the most likely one.
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Penalize tokens already present (1: off).
    #[arg(long, default_value_t = 1.1)]
    repeat_penalty: f32,
    /// Seed of the sampler: the same seed gives the same text.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Stop when the output contains this text (may repeat).
    #[arg(long, value_name = "TEXT")]
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

pub fn run(args: &GenerateArgs) -> Result<(), CliError> {
    let dtype = parse_dtype(&args.dtype)?;
    if args.prompt.trim().is_empty() {
        return Err(CliError::msg("the prompt is empty".into()));
    }
    let device = match &args.device {
        Some(sel) => Device::select(sel)?,
        None => Device::best()?,
    };
    let path = resolve::resolve_decoder(args.model.as_deref())?;
    let load_start = Instant::now();
    let gguf = GgufFile::open(&path)?;
    let tokenizer = Tokenizer::from_gguf(&gguf)?;
    let opts = LoadOptions {
        dtype,
        dequantize: args.dequantize,
    };
    let model = Llama::load_with(&gguf, &device, opts)?;
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

    let prompt_ids = if args.chat {
        let source = gguf.get("tokenizer.chat_template").and_then(|v| v.as_str());
        let template = ChatTemplate::detect(source).ok_or_else(|| {
            CliError::msg("--chat: the model has no chat template silica recognises (ChatML, Llama 2, Llama 3)".into())
        })?;
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(Message {
                role: "system".into(),
                content: system.clone(),
            });
        }
        messages.push(Message {
            role: "user".into(),
            content: args.prompt.clone(),
        });
        tokenizer.encode(&template.render(&messages, true), false)?
    } else {
        tokenizer.encode(&args.prompt, true)?
    };
    if !args.chat {
        print!("{}", args.prompt);
    }
    let mut sampler = Sampler::new(SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repeat_penalty,
        seed: args.seed,
    });
    device.reset_peak_memory();
    let mut stdout = std::io::stdout();
    let stats = silica_models::generate::generate(
        &model,
        &tokenizer,
        &prompt_ids,
        &mut sampler,
        args.max_tokens,
        &args.stop,
        |piece| {
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        },
    )?;
    println!();
    let peak = device.memory_stats().peak_allocated;
    let memory = if device.is_gpu() {
        format!(
            "peak device memory {:.0} MiB",
            peak as f64 / (1 << 20) as f64
        )
    } else {
        "host memory".to_string()
    };
    eprintln!(
        "[{device} | {model_name} | {} prompt tokens, prefill {:.0} ms | {} tokens at {:.1} tok/s | {memory} | stop: {}]",
        stats.prompt_tokens,
        stats.prefill_time.as_secs_f64() * 1e3,
        stats.generated_tokens,
        stats.decode_tokens_per_second(),
        stats.stop_reason
    );
    Ok(())
}
