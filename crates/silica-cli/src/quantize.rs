//! `silica quantize`: converts a GGUF model to F32, F16, Q8_0, Q4_0, Q4_1 or
//! Q4_K,
//! or writes a random-weight Llama-shaped model (`--synthetic`) to measure
//! decode speed without downloading one.
//!
//! Which tensors get which type, like llama.cpp's `llama-quantize` with a
//! pure type:
//!
//! * 1-D tensors (norms, biases) are F32;
//! * tensors of 2 or more dimensions whose rows (`ne[0]`) are whole blocks
//!   of the chosen type (32 values, 256 for Q4_K) get it, except the token
//!   embedding, which is Q8_0 when the chosen type is 4-bit (its rounding
//!   error reaches every token);
//! * under Q4_K, rows of whole blocks of 32 but not of 256 are Q8_0 (where
//!   llama.cpp falls back to Q5_0, which silica cannot write);
//! * other tensors (rows not a multiple of 32) are F16 for `f16`, else F32;
//! * tensors of a type silica cannot decode (IQ formats, integers) are
//!   copied unchanged.
//!
//! With `--lora`, adapters are merged into the weights they touch before
//! those are encoded: `W + s · B · A` in f32, row slice by row slice
//! (a tensor an adapter touches is re-encoded even where its type does not
//! change); the output is a plain GGUF model.
//!
//! Tensors are converted one slice of rows at a time and streamed to the
//! output, so memory holds the memory-mapped input and a few MiB more. The
//! output is written to `OUTPUT.partial` and renamed when complete.

mod synthetic;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use half::f16;
use silica::{DType, Device};
use silica_models::gguf::{GgmlType, GgufFile, GgufWriter, MetaValue, TensorSink};
use silica_models::llama::LlamaConfig;
use silica_models::{kquant, quant};

use crate::CliError;

#[derive(clap::Args)]
pub struct QuantizeArgs {
    /// INPUT.gguf OUTPUT.gguf, or only OUTPUT.gguf with --synthetic.
    #[arg(value_name = "PATHS", num_args = 1..=2, required = true)]
    paths: Vec<PathBuf>,
    /// The type of the weight matrices: q8_0, q4_0, q4_1, q4_k, f16 or f32.
    #[arg(long = "type", value_name = "TYPE", default_value = "q8_0")]
    ty: String,
    /// Write a random-weight model of this shape instead of converting a
    /// file: a real model's (smollm2-135m, llama-1b, llama-3b, llama-8b,
    /// qwen3-0.6b, gemma2-2b, gemma3-270m, phi3-mini, phi4-mini) or a tiny one of the
    /// architecture tests (tiny-llama3, tiny-yarn, tiny-qwen3, tiny-gemma3,
    /// tiny-gemma2, tiny-phi3, tiny-phi4).
    #[arg(long, value_name = "NAME")]
    synthetic: Option<String>,
    /// Seed of the random weights of --synthetic.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// A LoRA adapter to merge into the weights (PEFT folder, its
    /// .safetensors, or a llama.cpp .gguf adapter), `:SCALE` after the path
    /// to scale it (default 1). Repeat for several.
    #[arg(long, value_name = "PATH[:SCALE]", value_parser = crate::generate::parse_lora)]
    lora: Vec<(PathBuf, f32)>,
}

/// The types `--type` accepts: (name, ggml type, llama.cpp `LLAMA_FTYPE`
/// value for `general.file_type`).
/// Pure Q4_K has no value of its own: it is closest to `MOSTLY_Q4_K_S`.
const TYPES: [(&str, GgmlType, u32); 6] = [
    ("f32", GgmlType::F32, 0),
    ("f16", GgmlType::F16, 1),
    ("q4_0", GgmlType::Q4_0, 2),
    ("q4_1", GgmlType::Q4_1, 3),
    ("q8_0", GgmlType::Q8_0, 7),
    ("q4_k", GgmlType::Q4_K, 14),
];

/// ggml's `GGML_QNT_VERSION`, written as `general.quantization_version`.
const QUANTIZATION_VERSION: u32 = 2;
/// Elements converted at a time (16 MiB of f32).
const CHUNK_ELEMENTS: usize = 1 << 22;

/// The chosen output type.
#[derive(Clone, Copy)]
struct Target {
    ty: GgmlType,
    file_type: u32,
}

impl Target {
    fn parse(name: &str) -> Result<Self, CliError> {
        let lower = name.to_ascii_lowercase();
        TYPES
            .iter()
            .find(|t| t.0 == lower)
            .map(|&(_, ty, file_type)| Target { ty, file_type })
            .ok_or_else(|| {
                let names: Vec<&str> = TYPES.iter().map(|t| t.0).collect();
                CliError::msg(format!(
                    "unknown --type {name:?} (one of {})",
                    names.join(", ")
                ))
            })
    }

    fn is_4bit(self) -> bool {
        matches!(self.ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K)
    }

    fn is_quantized(self) -> bool {
        !matches!(self.ty, GgmlType::F32 | GgmlType::F16)
    }

    /// The type of the tensor `name` with row-major `shape` (see the module
    /// documentation).
    fn tensor_type(self, name: &str, shape: &[usize]) -> GgmlType {
        let row = shape.last().copied().unwrap_or(1);
        // every type of TYPES has a block size
        let block = self.ty.block_size().unwrap_or(1);
        if shape.len() < 2 {
            GgmlType::F32
        } else if name == "token_embd.weight" && self.is_4bit() && row.is_multiple_of(quant::QK) {
            GgmlType::Q8_0
        } else if row.is_multiple_of(block) {
            self.ty
        } else if self.is_quantized() && row.is_multiple_of(quant::QK) {
            GgmlType::Q8_0
        } else if self.ty == GgmlType::F16 {
            GgmlType::F16
        } else {
            GgmlType::F32
        }
    }

    /// Sets `general.file_type` (and the quantization version for the
    /// quantized types).
    fn set_metadata(self, w: &mut GgufWriter) -> Result<(), CliError> {
        w.metadata("general.file_type", MetaValue::U32(self.file_type))?;
        if self.is_quantized() {
            w.metadata(
                "general.quantization_version",
                MetaValue::U32(QUANTIZATION_VERSION),
            )?;
        }
        Ok(())
    }
}

/// Encodes `values` as `ty`, one of the types of [`TYPES`]. Quantized types
/// need whole blocks ([`Target::tensor_type`] guarantees whole rows of whole
/// blocks).
fn encode(ty: GgmlType, values: &[f32]) -> Result<Vec<u8>, CliError> {
    Ok(match ty {
        GgmlType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        GgmlType::Q8_0 => quant::quantize_q8_0(values),
        GgmlType::Q4_0 => quant::quantize_q4_0(values),
        GgmlType::Q4_1 => quant::quantize_q4_1(values),
        GgmlType::Q4_K => kquant::quantize_q4_k(values),
        other => return Err(CliError::msg(format!("cannot encode {other}"))),
    })
}

/// Converts `rows` rows of `row_len` values into `sink` as `ty`, a slice of
/// rows at a time: `produce(first_row, n_rows)` gives the f32 values of the
/// slice; `progress` hears how many elements are done. As many slices as
/// there are threads are made and encoded at once, and written in order.
fn convert_rows(
    sink: &mut TensorSink<'_>,
    ty: GgmlType,
    rows: usize,
    row_len: usize,
    produce: impl Fn(usize, usize) -> Result<Vec<f32>, CliError> + Sync,
    progress: &mut Progress,
) -> Result<(), CliError> {
    use rayon::prelude::*;
    let step = (CHUNK_ELEMENTS / row_len).max(1);
    let slices: Vec<(usize, usize)> = (0..rows)
        .step_by(step)
        .map(|first| (first, step.min(rows - first)))
        .collect();
    for batch in slices.chunks(rayon::current_num_threads()) {
        let encoded: Vec<Result<Vec<u8>, CliError>> = batch
            .par_iter()
            .map(|&(first, n)| encode(ty, &produce(first, n)?))
            .collect();
        for (bytes, &(_, n)) in encoded.into_iter().zip(batch) {
            sink.write(&bytes?)?;
            progress.advance((n * row_len) as u64);
        }
    }
    Ok(())
}

pub fn run(args: &QuantizeArgs) -> Result<(), CliError> {
    let target = Target::parse(&args.ty)?;
    let (source, output) = match (&args.synthetic, args.paths.as_slice()) {
        (Some(_), _) if !args.lora.is_empty() => {
            return Err(CliError::msg(
                "--lora merges into an INPUT model, not a --synthetic one".into(),
            ));
        }
        (Some(name), [output]) => (Source::Synthetic(name), output),
        (None, [input, output]) => (Source::File(input), output),
        (Some(_), _) => {
            return Err(CliError::msg(
                "--synthetic takes one path, the OUTPUT (no INPUT)".into(),
            ));
        }
        (None, _) => {
            return Err(CliError::msg(
                "give INPUT and OUTPUT (or --synthetic NAME and OUTPUT)".into(),
            ));
        }
    };
    let start = Instant::now();
    let partial = partial_path(output);
    let written = match source {
        Source::Synthetic(name) => synthetic::Shape::by_name(name)
            .and_then(|shape| synthetic::write(shape, target, args.seed, &partial)),
        Source::File(input) => convert(input, target, &args.lora, &partial),
    };
    let stats = match written {
        Ok(stats) => stats,
        Err(e) => {
            // the partial file is useless; failing to remove it changes nothing
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    std::fs::rename(&partial, output).map_err(|e| {
        CliError::msg(format!(
            "cannot rename {} to {}: {e}",
            partial.display(),
            output.display()
        ))
    })?;
    let size = std::fs::metadata(output).map_or(0, |m| m.len());
    eprintln!(
        "silica: wrote {} ({}): {} tensors, {:.1} MiB, in {:.1} s",
        output.display(),
        target.ty,
        stats.tensors,
        size as f64 / (1u64 << 20) as f64,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What to write.
enum Source<'a> {
    /// A random-weight model of this shape name.
    Synthetic(&'a str),
    /// A conversion of this GGUF file.
    File(&'a Path),
}

/// What was written.
struct Stats {
    tensors: usize,
}

/// `OUTPUT.partial`, beside the output.
fn partial_path(output: &Path) -> PathBuf {
    let mut name = output.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// Converts the GGUF file `input` to `target` with the adapters of `lora`
/// merged in, writing `output`.
fn convert(
    input: &Path,
    target: Target,
    lora: &[(PathBuf, f32)],
    output: &Path,
) -> Result<Stats, CliError> {
    if !input.is_file() {
        return Err(CliError::msg(format!("{}: no such file", input.display())));
    }
    let file = GgufFile::open(input)?;
    let adapters = if lora.is_empty() {
        Vec::new()
    } else {
        let config = LlamaConfig::from_gguf(&file)?;
        crate::generate::open_adapters(lora, &config, &Device::cpu(), DType::F32)?
    };
    let adapted = |name: &str| adapters.iter().any(|(a, _)| a.get(name).is_some());
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata() {
        w.metadata(key.as_str(), value.clone())?;
    }
    target.set_metadata(&mut w)?;
    let mut plan = Vec::with_capacity(file.tensors().len());
    let mut kept = Vec::new();
    for info in file.tensors() {
        let shape = info.shape();
        let planned = target.tensor_type(&info.name, &shape);
        let ty = if info.ggml_type == planned || quant::is_supported(info.ggml_type) {
            planned
        } else if adapted(&info.name) {
            return Err(CliError::msg(format!(
                "--lora: tensor '{}' is {}, which silica cannot decode to merge an adapter into",
                info.name, info.ggml_type
            )));
        } else {
            kept.push(format!("'{}' ({})", info.name, info.ggml_type));
            info.ggml_type
        };
        w.declare_tensor(info.name.as_str(), &shape, ty)?;
        plan.push((info, ty));
    }
    let mut out = w.create(output)?;
    eprintln!(
        "silica: converting {} ({} tensors) to {}",
        input.display(),
        plan.len(),
        target.ty
    );
    for (adapter, scale) in &adapters {
        eprintln!(
            "silica: merging LoRA adapter {} at scale {scale} into {} tensors",
            adapter.path().display(),
            adapter.weights().count()
        );
    }
    if !kept.is_empty() {
        eprintln!(
            "silica: copied unchanged, of types silica cannot decode: {}",
            kept.join(", ")
        );
    }
    let total = plan.iter().map(|(info, _)| info.numel()).sum();
    let mut progress = Progress::new(total);
    for &(info, ty) in &plan {
        progress.tensor(&info.name, info.ggml_type, ty);
        let bytes = file.tensor_bytes(info);
        out.write_tensor_with(&info.name, |sink| -> Result<(), CliError> {
            if ty == info.ggml_type && !adapted(&info.name) {
                sink.write(bytes)?;
                progress.advance(info.numel());
                return Ok(());
            }
            // The reader checked that rows are whole blocks of the input
            // type and that the data is numel / block * type_size bytes.
            let row_len = info.dims.first().copied().unwrap_or(1) as usize;
            let rows = info.numel() as usize / row_len;
            let row_bytes = bytes.len() / rows;
            let produce = |first: usize, n: usize| -> Result<Vec<f32>, CliError> {
                let slice = &bytes[first * row_bytes..(first + n) * row_bytes];
                let mut values = quant::dequantize(info.ggml_type, slice, n * row_len)
                    .map_err(|e| CliError::msg(format!("tensor '{}': {e}", info.name)))?;
                for (adapter, scale) in &adapters {
                    adapter.merge_rows(&info.name, first, &mut values, *scale)?;
                }
                Ok(values)
            };
            convert_rows(sink, ty, rows, row_len, produce, &mut progress)
        })?;
    }
    out.finish()?;
    progress.done();
    Ok(Stats {
        tensors: plan.len(),
    })
}

/// Progress on stderr: one line rewritten in place on a terminal, nothing
/// otherwise (logs stay short).
struct Progress {
    total: u64,
    done: u64,
    current: String,
    shown: bool,
    tty: bool,
}

impl Progress {
    fn new(total: u64) -> Self {
        Progress {
            total: total.max(1),
            done: 0,
            current: String::new(),
            shown: false,
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// Starts tensor `name`, converted from `from` to `to`.
    fn tensor(&mut self, name: &str, from: GgmlType, to: GgmlType) {
        self.current = format!("{name} {from} -> {to}");
        self.show();
    }

    fn advance(&mut self, elements: u64) {
        self.done += elements;
        self.show();
    }

    fn show(&mut self) {
        if self.tty {
            let percent = self.done as f64 / self.total as f64 * 100.0;
            let mut err = std::io::stderr().lock();
            // progress is best effort: a failed write to stderr is ignored
            let _ = write!(err, "\r\x1b[K[{percent:5.1}%] {}", self.current);
            let _ = err.flush();
            self.shown = true;
        }
    }

    /// Clears the progress line.
    fn done(&mut self) {
        if self.shown {
            eprint!("\r\x1b[K");
        }
    }
}
