//! `silica`: the command-line tool of the silica project.
//!
//! Every subcommand lives in its own module and returns `Result<(), CliError>`;
//! `main` turns an error into one line `error: <message>` on stderr and exit
//! status 2. Command-line syntax errors found by clap get the same one line
//! (clap's message without its usage block), and panics too, without a
//! backtrace unless `RUST_BACKTRACE` is set.

mod activations;
mod bench;
mod devices;
mod embed;
mod generate;
mod models;
mod perplexity;
mod probe;
mod progress;
mod quantize;
mod serve;

use std::io::{self, IsTerminal, Write};
use std::panic::{self, AssertUnwindSafe};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run ML workloads on the best GPU of this machine, or on the CPU.
#[derive(Parser)]
#[command(name = "silica", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Capture the hidden states of chosen layers for many prompts, pooled
    /// per prompt, into a safetensors or .npy file (for probes).
    Activations(activations::ActivationsArgs),
    /// Time the transformer kernels on fixed shapes (see BENCHMARKS.md).
    Bench(bench::BenchArgs),
    /// List the CPU and every GPU adapter, and mark the default device.
    Devices(devices::DevicesArgs),
    /// Embed sentences with a sentence encoder (default: all-MiniLM-L6-v2):
    /// print their cosine similarities, or write the vectors (.npy, .jsonl).
    Embed(embed::EmbedArgs),
    /// List the built-in default models, their cache paths and whether they
    /// are cached.
    Models(models::ModelsArgs),
    /// Generate text with a Llama-family model (default: SmolLM2-135M-Instruct).
    Generate(generate::GenerateArgs),
    /// Perplexity of a Llama-family model over a text, and (--save-logits,
    /// --kl-base) KL divergence and top-1 agreement against saved logits.
    Perplexity(perplexity::PerplexityArgs),
    /// Train linear probes on captured activations (train), and read text
    /// through them (run).
    Probe(probe::ProbeArgs),
    /// Serve a model over an OpenAI-compatible HTTP API (chat and text
    /// completions, streamed or not, and embeddings), many requests decoded
    /// together.
    Serve(serve::ServeArgs),
    /// Convert a GGUF model to q8_0, q4_0, q4_1, q4_k, f16 or f32, or write a
    /// random-weight Llama-shaped model (--synthetic) for speed tests.
    Quantize(quantize::QuantizeArgs),
}

/// A failure to report as `error: <message>` (exit status 2).
#[derive(Debug)]
pub struct CliError(String);

impl<E: std::error::Error> From<E> for CliError {
    fn from(e: E) -> Self {
        CliError(e.to_string())
    }
}

impl CliError {
    /// An error from a message.
    pub fn msg(msg: String) -> Self {
        CliError(msg)
    }
}

/// The exit status of every reported error.
const ERROR_STATUS: u8 = 2;

fn main() -> ExitCode {
    // mimalloc, freed pages kept (the silica-alloc crate: docs/tuning.md,
    // "CPU memory reuse")
    silica_alloc::keep_freed_pages();
    quiet_headless_vulkan();
    init_tracing();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    install_panic_hook();
    let result = panic::catch_unwind(AssertUnwindSafe(|| run(cli)));
    // the next process finds the kernels this one built (a no-op on the CPU)
    silica::save_pipeline_caches();
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(CliError(msg))) => {
            eprintln!("error: {}", one_line(&msg));
            ExitCode::from(ERROR_STATUS)
        }
        // the panic hook already printed the message
        Err(_) => ExitCode::from(ERROR_STATUS),
    }
}

/// On a machine without a display, turns off Mesa's Vulkan device-select
/// layer, which otherwise prints `XDG_RUNTIME_DIR is invalid` errors while
/// it looks for a Wayland display to rank adapters by; silica ranks them
/// itself. `NODEVICE_SELECT` set by the user is kept.
fn quiet_headless_vulkan() {
    let has = |v: &str| std::env::var_os(v).is_some_and(|s| !s.is_empty());
    if !has("WAYLAND_DISPLAY") && !has("DISPLAY") && std::env::var_os("NODEVICE_SELECT").is_none() {
        // SAFETY: first thing in main, before any other thread exists
        unsafe { std::env::set_var("NODEVICE_SELECT", "1") };
    }
}

/// Prints `--help` and `--version` as clap does (status 0); any other
/// command-line error as one `error:` line (status 2).
fn usage_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        // help on stdout (status 0), or on stderr for a bare `silica` (status 2)
        e.exit();
    }
    eprintln!("error: {}", clap_message(&e.render().to_string()));
    ExitCode::from(ERROR_STATUS)
}

/// clap's rendered error on one line: its paragraphs joined with "; ",
/// without the usage block, with "(see --help)" for its closing pointer.
fn clap_message(rendered: &str) -> String {
    let mut parts = Vec::new();
    let mut help = false;
    for para in rendered.split("\n\n") {
        let para = para.trim();
        if para.is_empty() || para.starts_with("Usage:") {
            continue;
        }
        if para.starts_with("For more information") {
            help = true;
            continue;
        }
        parts.push(one_line(para.strip_prefix("error:").unwrap_or(para)));
    }
    let mut msg = parts.join("; ");
    if help {
        msg.push_str(" (see --help)");
    }
    msg
}

/// The UTF-8 text of `path` ("-": standard input), a byte-order mark
/// dropped; errors name the file.
pub fn read_text_file(path: &std::path::Path) -> Result<String, CliError> {
    use std::io::Read;
    let (name, bytes) = if path == std::path::Path::new("-") {
        let mut bytes = Vec::new();
        std::io::stdin()
            .lock()
            .read_to_end(&mut bytes)
            .map_err(|e| CliError::msg(format!("standard input: {e}")))?;
        ("standard input".to_string(), bytes)
    } else {
        let bytes =
            std::fs::read(path).map_err(|e| CliError::msg(format!("{}: {e}", path.display())))?;
        (path.display().to_string(), bytes)
    };
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(&bytes);
    String::from_utf8(bytes.to_vec()).map_err(|e| {
        CliError::msg(format!(
            "{name}: not valid UTF-8 (at byte {})",
            e.utf8_error().valid_up_to()
        ))
    })
}

/// The tag under which a tool lists the kernels a model used
/// (`Device::build_kernels_ahead`): the tool, the model file (its
/// absolute path, size and modification time), the dtype and whether the
/// weights are dequantized.
pub fn kernel_tag(
    tool: &str,
    model: &std::path::Path,
    dtype: silica::DType,
    dequantize: bool,
) -> String {
    let file = std::fs::canonicalize(model).unwrap_or_else(|_| model.to_path_buf());
    let stamp = std::fs::metadata(&file)
        .map(|m| {
            let modified = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            format!("{} {modified}", m.len())
        })
        .unwrap_or_default();
    format!(
        "{tool} {} {stamp} {dtype:?} dequantize={dequantize}",
        file.display()
    )
}

/// The device `--device SEL` names, else the one `SILICA_DEVICE` names (its
/// errors say so), else the best GPU, else the CPU.
pub fn open_device(selector: Option<&str>) -> Result<silica::Device, CliError> {
    use silica::Device;
    match selector {
        Some(sel) => Ok(Device::select(sel)?),
        None => Device::best().map_err(|e| match silica::config::device_selector() {
            Some(env) => CliError(format!("SILICA_DEVICE={env}: {e}")),
            _ => e.into(),
        }),
    }
}

fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Activations(args) => activations::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Devices(args) => devices::run(&args),
        Command::Embed(args) => embed::run(&args),
        Command::Models(args) => models::run(&args),
        Command::Generate(args) => generate::run(&args),
        Command::Perplexity(args) => perplexity::run(&args),
        Command::Probe(args) => probe::run(&args),
        Command::Quantize(args) => quantize::run(&args),
        Command::Serve(args) => serve::run(&args),
    }
}

/// Logs go to stderr; `RUST_LOG` overrides the default level `warn` (with
/// the GL backend's adapter-probing errors, harmless on headless machines, off).
fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("warn,wgpu_hal::gles=off"));
    // Fails only if a subscriber is already set, which cannot happen here.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_ansi(io::stderr().is_terminal())
        .without_time()
        .try_init();
}

/// Prints a panic as one `error:` line; the backtrace only on request.
fn install_panic_hook() {
    let backtrace = std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0");
    panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("unknown panic");
        let place = info
            .location()
            .map(|l| format!(" (at {}:{})", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("error: internal error: {}{place}", one_line(msg));
        if backtrace {
            eprintln!("{}", std::backtrace::Backtrace::force_capture());
        }
    }));
}

fn one_line(msg: &str) -> String {
    msg.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Writes `text` to stdout. A closed pipe (`silica devices | head`) ends the
/// program quietly instead of failing.
pub fn emit(text: &str) -> Result<(), CliError> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => std::process::exit(0),
        r => Ok(r?),
    }
}
