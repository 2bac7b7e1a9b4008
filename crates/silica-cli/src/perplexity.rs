//! `silica perplexity`: the perplexity of a Llama-family model over a text,
//! and (`--save-logits`, `--kl-base`) how far another path, dtype, device
//! or quantization moves its next-token distributions, reported as
//! llama.cpp's `llama-perplexity --kl-divergence` reports it. The
//! computation is `silica_models::perplexity`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use silica::Device;
use silica_models::gguf::GgufFile;
use silica_models::llama::{Llama, LoadOptions};
use silica_models::perplexity::{
    self, DEFAULT_CTX, KlStats, LogitsHeader, LogitsReader, LogitsWriter, Mode, Pass, Progress,
    Windows,
};
use silica_models::resolve;
use silica_models::tokenizer::Tokenizer;

use crate::activations::parse_positive;
use crate::{CliError, emit};

#[derive(clap::Args)]
pub struct PerplexityArgs {
    /// The text to score (UTF-8; "-": standard input).
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// A GGUF file or a folder holding one [default: the built-in SmolLM2-135M-Instruct]
    #[arg(long, value_name = "PATH")]
    model: Option<String>,
    /// Tokens per window, each evaluated from an empty cache with BOS
    /// first. Without --stride the windows do not overlap and the second
    /// half of each is scored, as llama.cpp does [default: 512; with
    /// --kl-base, the saved file's windows]
    #[arg(long, value_name = "N", value_parser = parse_positive)]
    ctx: Option<usize>,
    /// Overlapping windows instead: one starts every S tokens and its last
    /// S tokens are scored, so every token after the first window is
    /// scored once, with at least ctx - S - 1 tokens of context.
    #[arg(long, value_name = "S", value_parser = parse_positive)]
    stride: Option<usize>,
    /// Evaluate at most N windows (all that fit the text by default).
    #[arg(long, value_name = "N", value_parser = parse_positive)]
    chunks: Option<usize>,
    /// Save the log-probabilities of every scored position to BASE, to
    /// compare another run with (--kl-base): about 2 bytes per vocabulary
    /// entry per position (24 MiB per 512-token window with a 49,152-token
    /// vocabulary).
    #[arg(long, value_name = "BASE", conflicts_with = "kl_base")]
    save_logits: Option<PathBuf>,
    /// The layout of --save-logits: silica's (with a hash of the text's
    /// tokens), or llama.cpp's, which `llama-perplexity --kl-divergence
    /// --kl-divergence-base BASE` reads (without --stride). --kl-base reads
    /// either.
    #[arg(long, value_name = "FORMAT", default_value = "silica", requires = "save_logits",
          value_parser = ["silica", "llama.cpp"])]
    logits_format: String,
    /// Compare with the log-probabilities saved in BASE (same text and
    /// tokenizer, windows as saved): KL divergence, top-1 agreement, the
    /// change of the correct token's probability and both perplexities.
    #[arg(long, value_name = "BASE", conflicts_with_all = ["ctx", "stride"])]
    kl_base: Option<PathBuf>,
    /// cpu, gpu, gpu:N, metal, vulkan, dx12, gl or part of an adapter's name [default: SILICA_DEVICE, else the best GPU, else the CPU]
    #[arg(long, value_name = "SEL")]
    device: Option<String>,
    /// Compute dtype of the activations and of unquantized weights: f32, f16 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Decode quantized weights to --dtype at load instead of keeping them
    /// quantized on the device.
    #[arg(long)]
    dequantize: bool,
    /// The exact products: activations stay in f32 where the default
    /// rounds them to 8 bits (as SILICA_CPU_INT8=0 and SILICA_INTEGER_GEMV=0).
    #[arg(long)]
    exact: bool,
    /// Score each position as a decode step of one token after the
    /// window's unscored prefix, as generation computes it, instead of the
    /// whole window as one prompt (slower; on a GPU the decode products
    /// round activations where the prompt's do not).
    #[arg(long)]
    decode: bool,
}

/// The text of `path` ("-": standard input), which must not be blank.
fn read_text(path: &Path) -> Result<String, CliError> {
    let text = crate::read_text_file(path)?;
    if text.trim().is_empty() {
        let name = if path == Path::new("-") {
            "standard input".to_string()
        } else {
            path.display().to_string()
        };
        return Err(CliError::msg(format!("{name}: the text is empty")));
    }
    Ok(text)
}

/// Whether `device` rounds activations to 8 bits in its quantized products.
fn int8_activations(device: &Device) -> bool {
    match device {
        Device::Gpu(g) => g.int8_activations(),
        _ => silica::cpu_int8_activations(),
    }
}

pub fn run(args: &PerplexityArgs) -> Result<(), CliError> {
    // the cheap checks first: arguments, the text, the saved file
    let dtype = crate::generate::parse_dtype(&args.dtype)?;
    let text = read_text(&args.file)?;
    let mut base = match &args.kl_base {
        Some(path) => Some(LogitsReader::open(path)?),
        None => None,
    };
    let device = crate::open_device(args.device.as_deref())?;
    if args.exact {
        silica::set_cpu_int8_activations(false);
        if let Device::Gpu(g) = &device {
            g.set_int8_activations(false);
        }
    }
    let path = resolve::resolve_decoder(args.model.as_deref())?;
    let load_start = Instant::now();
    let gguf = GgufFile::open(&path)?;
    let opts = LoadOptions {
        dtype,
        dequantize: args.dequantize,
    };
    // the text is tokenized while the weights load
    let (tokenized, model) = std::thread::scope(|s| {
        let tokenize = s.spawn(|| -> Result<_, CliError> {
            let tokenizer = Tokenizer::from_gguf(&gguf)?;
            Ok(perplexity::tokenize(&tokenizer, &text)?)
        });
        let model = Llama::load_with(&gguf, &device, opts);
        let tokenized = tokenize.join().unwrap_or_else(|_| {
            Err(CliError::msg(
                "internal error: the tokenizer panicked".into(),
            ))
        });
        (tokenized, model)
    });
    let (tokens, bos) = tokenized?;
    let model = model?;
    let model_name = gguf
        .get("general.name")
        .and_then(|v| v.as_str())
        .map(str::to_string)
        .unwrap_or_else(|| path.display().to_string());
    let products = if int8_activations(&device) {
        "8-bit activations"
    } else {
        "exact products"
    };
    let weights = match (args.dequantize, args.decode) {
        (true, true) => ", dequantized, decode steps",
        (true, false) => ", dequantized",
        (false, true) => ", decode steps",
        (false, false) => "",
    };
    let description = format!(
        "{model_name} ({}), {device}, {}{weights}, {products}",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        args.dtype.to_ascii_lowercase()
    );
    eprintln!(
        "silica: {model_name} ({}, {} layers) on {device} ({}{weights}, {products}), loaded in {:.1} s",
        model.config.architecture,
        model.config.n_layers,
        args.dtype.to_ascii_lowercase(),
        load_start.elapsed().as_secs_f64()
    );

    let windows = match &base {
        Some(r) => {
            let saved = r.header().windows;
            Windows {
                count: args.chunks.map_or(saved.count, |c| c.min(saved.count)),
                ..saved
            }
        }
        None => {
            let ctx = args.ctx.unwrap_or(DEFAULT_CTX);
            if ctx > model.config.context_length {
                return Err(CliError::msg(format!(
                    "--ctx {ctx} exceeds the model's context of {} tokens",
                    model.config.context_length
                )));
            }
            if let Some(s) = args.stride
                && s >= ctx
            {
                return Err(CliError::msg(format!(
                    "--stride {s} must be less than the window length --ctx {ctx}"
                )));
            }
            match args.stride {
                Some(s) => Windows::strided(tokens.len(), ctx, s, args.chunks),
                None => Windows::chunks(tokens.len(), ctx, args.chunks),
            }
            .map_err(|e| CliError::msg(format!("{}: {e} (--ctx)", args.file.display())))?
        }
    };
    eprintln!(
        "silica: {}: {} tokens; {} windows of {} tokens{}, {} positions scored in each ({} in all)",
        args.file.display(),
        tokens.len(),
        windows.count,
        windows.ctx,
        if windows.step == windows.ctx {
            String::new()
        } else {
            format!(" every {}", windows.step)
        },
        windows.scored(),
        windows.positions()
    );
    let mut writer = match &args.save_logits {
        Some(p) => {
            let vocab = model.config.vocab_size;
            let header = if args.logits_format == "llama.cpp" {
                LogitsHeader::llama_cpp(&tokens, windows, vocab)?
            } else {
                LogitsHeader::new(&tokens, windows, vocab, &description)
            };
            let size = header.file_bytes();
            let w = LogitsWriter::create(p, header)?;
            eprintln!(
                "silica: saving the log-probabilities to {} ({:.1} MiB)",
                p.display(),
                size as f64 / (1 << 20) as f64
            );
            Some(w)
        }
        None => None,
    };
    if let Some(r) = &base {
        // before anything is printed: a file of another text is refused
        r.check_vocab(model.config.vocab_size)?;
        r.check_tokens(&tokens)?;
        if windows.ctx > model.config.context_length {
            return Err(CliError::msg(format!(
                "{}: saved with windows of {} tokens, more than the model's context of {}",
                r.path().display(),
                windows.ctx,
                model.config.context_length
            )));
        }
        eprintln!(
            "silica: comparing with {}: {}",
            r.path().display(),
            r.header().description
        );
    }
    let mode = match (&mut writer, &mut base) {
        (Some(w), _) => Mode::Save(w),
        (None, Some(r)) => Mode::Compare(r),
        (None, None) => Mode::Perplexity,
    };
    let compare = matches!(mode, Mode::Compare(_));
    if compare {
        let _ = emit(&format!("{}\n", KlStats::chunk_header()));
    }
    let on_window = |p: &Progress<'_>| {
        if p.done == 1 {
            let secs = p.elapsed.as_secs_f64();
            eprintln!(
                "silica: {secs:.2} seconds per window - ETA {}",
                eta(secs * p.windows as f64)
            );
        }
        let line = match p.kl {
            Some(kl) => format!("{}\n", kl.chunk_line(p.done)),
            None => format!("[{}]{:.4},", p.done, p.nll.ppl()),
        };
        let _ = emit(&line);
    };
    let pass = if args.decode {
        Pass::Decode
    } else {
        Pass::Prompt
    };
    let eval = perplexity::evaluate_by(&model, &tokens, &windows, bos, pass, mode, on_window)?;
    emit("\n")?;
    match &eval.kl {
        Some(kl) => emit(&kl.summary().report())?,
        None => emit(&format!(
            "Final estimate: PPL = {:.4} +/- {:.5}\n",
            eval.nll.ppl(),
            eval.nll.ppl_uncertainty()
        ))?,
    }
    if let Some(w) = writer {
        let (path, size) = w.finish()?;
        eprintln!(
            "silica: saved {} positions to {} ({:.1} MiB)",
            windows.positions(),
            path.display(),
            size as f64 / (1 << 20) as f64
        );
    }
    Ok(())
}

/// A duration as llama.cpp's ETA: hours when over one, then minutes.
fn eta(seconds: f64) -> String {
    let total = seconds as u64;
    if total >= 3600 {
        format!(
            "{} hours {:.2} minutes",
            total / 3600,
            (total % 3600) as f64 / 60.0
        )
    } else {
        format!("{:.2} minutes", seconds / 60.0)
    }
}
