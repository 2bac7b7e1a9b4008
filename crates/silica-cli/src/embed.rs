//! `silica embed`: sentence embeddings with a BERT-family sentence encoder
//! (by default the built-in all-MiniLM-L6-v2). A few sentences print their
//! cosine similarity matrix; `--output` writes the vectors as `.npy` or
//! `.jsonl`.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use silica::DType;
use silica_models::bert::{SentenceEncoder, cosine};
use silica_models::resolve::{DEFAULT_ENCODER, resolve_encoder};

use crate::progress::Progress;
use crate::{CliError, emit};

/// Up to this many sentences, the full similarity matrix is printed.
const MATRIX_MAX: usize = 16;
/// Up to this many sentences, the most similar pairs are printed instead.
const PAIRS_MAX: usize = 5000;
/// How many pairs to print.
const TOP_PAIRS: usize = 10;

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum EmbedDType {
    F32,
    F16,
}

#[derive(clap::Args)]
pub struct EmbedArgs {
    /// Sentences to embed (the lines of --file come after them).
    sentences: Vec<String>,
    /// A sentence-transformers model folder (config.json, model.safetensors,
    /// tokenizer.json) [default: the built-in all-MiniLM-L6-v2]
    #[arg(long, value_name = "PATH")]
    model: Option<String>,
    /// Read sentences from FILE, one per line ("-": standard input); blank
    /// lines are skipped.
    #[arg(long, short = 'f', value_name = "FILE")]
    file: Option<PathBuf>,
    /// Write the embeddings to OUT instead of printing similarities: .npy
    /// (float32, shape [n, dim]) or .jsonl (one {"text", "embedding"} per line).
    #[arg(long, short = 'o', value_name = "OUT")]
    output: Option<PathBuf>,
    /// cpu, gpu, gpu:N, metal, vulkan, dx12, gl or part of an adapter's name
    /// [default: SILICA_DEVICE, else the best GPU, else the CPU]
    #[arg(long, value_name = "SEL")]
    device: Option<String>,
    /// Sentences per forward pass.
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = parse_batch_size)]
    batch_size: usize,
    /// Compute dtype of the weights and activations.
    #[arg(long, value_enum, default_value_t = EmbedDType::F32)]
    dtype: EmbedDType,
}

fn parse_batch_size(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

/// The file formats of `--output`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Npy,
    Jsonl,
}

fn output_format(path: &Path) -> Result<Format, CliError> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("npy") => Ok(Format::Npy),
        Some("jsonl") => Ok(Format::Jsonl),
        _ => Err(CliError::msg(format!(
            "{}: unknown output format (use a name ending in .npy or .jsonl)",
            path.display()
        ))),
    }
}

pub fn run(args: &EmbedArgs) -> Result<(), CliError> {
    // Check everything cheap before loading the model.
    let format = args.output.as_deref().map(output_format).transpose()?;
    let mut sentences: Vec<String> = args.sentences.clone();
    if let Some(file) = &args.file {
        sentences.extend(read_lines(file)?);
    }
    if sentences.iter().all(|s| s.trim().is_empty()) {
        return Err(CliError::msg(
            "no sentences to embed: pass some, or --file FILE with one per line".into(),
        ));
    }
    if format.is_none() && sentences.len() > PAIRS_MAX {
        return Err(CliError::msg(format!(
            "{} sentences are too many to compare here; write them with --output OUT.npy",
            sentences.len()
        )));
    }
    let dtype = match args.dtype {
        EmbedDType::F32 => DType::F32,
        EmbedDType::F16 => DType::F16,
    };
    let device = crate::open_device(args.device.as_deref())?;
    let dir = resolve_encoder(args.model.as_deref())?;

    let start = Instant::now();
    let encoder = SentenceEncoder::load(&dir, &device, dtype)?.with_batch_size(args.batch_size);
    let load_time = start.elapsed();

    let start = Instant::now();
    let texts: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let mut progress = Progress::new(texts.len(), args.batch_size, "embedded", "sentences");
    let vectors =
        encoder.embed_with_progress(&texts, |done, total| progress.update(done, total))?;
    progress.finish();
    let embed_time = start.elapsed();

    let model_name = if args.model.is_none() {
        DEFAULT_ENCODER.name.to_string()
    } else {
        dir.display().to_string()
    };
    let summary = format!(
        "{model_name}: {} sentence{} embedded in {:.2} s on {device} in {} (dimension {}; model loaded in {:.2} s)",
        texts.len(),
        if texts.len() == 1 { "" } else { "s" },
        embed_time.as_secs_f64(),
        dtype.as_str(),
        encoder.dim(),
        load_time.as_secs_f64(),
    );
    match (&args.output, format) {
        (Some(out), Some(format)) => {
            write_output(out, format, &texts, &vectors, encoder.dim())?;
            emit(&format!(
                "{summary}\nwrote {} embeddings to {}\n",
                vectors.len(),
                out.display()
            ))
        }
        _ => emit(&format!("{summary}\n\n{}", similarities(&texts, &vectors)?)),
    }
}

/// The non-blank lines of `path` ("-": standard input), without line ends.
fn read_lines(path: &Path) -> Result<Vec<String>, CliError> {
    let mut bytes = Vec::new();
    let name = if path == Path::new("-") {
        io::stdin()
            .lock()
            .read_to_end(&mut bytes)
            .map_err(|e| CliError::msg(format!("standard input: {e}")))?;
        "standard input".to_string()
    } else {
        bytes =
            std::fs::read(path).map_err(|e| CliError::msg(format!("{}: {e}", path.display())))?;
        path.display().to_string()
    };
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(&bytes);
    let mut lines = Vec::new();
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let line = std::str::from_utf8(line).map_err(|e| {
            CliError::msg(format!(
                "{name}: line {} is not valid UTF-8 (at byte {} of the line)",
                i + 1,
                e.valid_up_to()
            ))
        })?;
        if !line.trim().is_empty() {
            lines.push(line.to_string());
        }
    }
    Ok(lines)
}

/// The similarity matrix for a few sentences, else the most similar pairs.
fn similarities(texts: &[&str], vectors: &[Vec<f32>]) -> Result<String, CliError> {
    let n = texts.len();
    let mut out = String::new();
    if n <= MATRIX_MAX {
        for (i, t) in texts.iter().enumerate() {
            writeln!(out, "[{}] {}", i + 1, shorten(t, 100))?;
        }
        if n == 1 {
            return Ok(out);
        }
        writeln!(out, "\ncosine similarity:")?;
        write!(out, "{:>5}", "")?;
        for j in 0..n {
            write!(out, "{:>8}", format!("[{}]", j + 1))?;
        }
        writeln!(out)?;
        for i in 0..n {
            write!(out, "{:<5}", format!("[{}]", i + 1))?;
            for j in 0..n {
                write!(out, "{:>8.4}", cosine(&vectors[i], &vectors[j]))?;
            }
            writeln!(out)?;
        }
        return Ok(out);
    }
    let mut pairs: Vec<(f32, usize, usize)> = Vec::new();
    for i in 0..n {
        for j in i + 1..n {
            let c = cosine(&vectors[i], &vectors[j]);
            pairs.push((c, i, j));
            if pairs.len() > 4 * TOP_PAIRS {
                pairs.sort_by(|a, b| b.0.total_cmp(&a.0));
                pairs.truncate(TOP_PAIRS);
            }
        }
    }
    pairs.sort_by(|a, b| b.0.total_cmp(&a.0));
    pairs.truncate(TOP_PAIRS);
    writeln!(
        out,
        "the {} most similar of {} pairs (write all vectors with --output OUT.npy):",
        pairs.len(),
        n * (n - 1) / 2
    )?;
    for (c, i, j) in pairs {
        writeln!(
            out,
            "{c:.4}  [{}] {}\n        [{}] {}",
            i + 1,
            shorten(texts[i], 70),
            j + 1,
            shorten(texts[j], 70)
        )?;
    }
    Ok(out)
}

/// At most `max` characters of `s` on one line.
fn shorten(s: &str, max: usize) -> String {
    let one_line: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= max {
        return one_line;
    }
    let mut cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// Writes the vectors next to `path` and renames the file into place, so
/// that an interrupted run leaves no partial output under the final name.
fn write_output(
    path: &Path,
    format: Format,
    texts: &[&str],
    vectors: &[Vec<f32>],
    dim: usize,
) -> Result<(), CliError> {
    let err = |e: io::Error| CliError::msg(format!("{}: {e}", path.display()));
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let write = || -> io::Result<()> {
        let mut w = io::BufWriter::new(std::fs::File::create(&tmp)?);
        match format {
            Format::Npy => write_npy(&mut w, vectors, dim)?,
            Format::Jsonl => write_jsonl(&mut w, texts, vectors)?,
        }
        w.into_inner().map_err(|e| e.into_error())?.sync_all()
    };
    if let Err(e) = write().and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    Ok(())
}

/// An NPY version 1.0 file: float32 little-endian, C order, shape [n, dim].
fn write_npy(w: &mut impl Write, vectors: &[Vec<f32>], dim: usize) -> io::Result<()> {
    let mut header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {dim}), }}",
        vectors.len()
    );
    // magic (6) + version (2) + header length (2) + header, padded with
    // spaces and ended by a newline to a multiple of 64 bytes
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let len = u16::try_from(header.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NPY header too long"))?;
    w.write_all(b"\x93NUMPY\x01\x00")?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(header.as_bytes())?;
    for v in vectors {
        for x in v {
            w.write_all(&x.to_le_bytes())?;
        }
    }
    Ok(())
}

/// One `{"text": ..., "embedding": [...]}` object per line.
fn write_jsonl(w: &mut impl Write, texts: &[&str], vectors: &[Vec<f32>]) -> io::Result<()> {
    let mut line = String::new();
    for (t, v) in texts.iter().zip(vectors) {
        line.clear();
        line.push_str("{\"text\": ");
        json_string(&mut line, t);
        line.push_str(", \"embedding\": [");
        for (i, x) in v.iter().enumerate() {
            if i > 0 {
                line.push_str(", ");
            }
            if x.is_finite() {
                // Display prints the shortest decimal that reads back
                // exactly, never in exponent form: valid JSON.
                let _ = write!(line, "{x}");
            } else {
                line.push_str("null");
            }
        }
        line.push_str("]}\n");
        w.write_all(line.as_bytes())?;
    }
    Ok(())
}

/// `s` as a JSON string literal.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_header_is_aligned() {
        let mut buf = Vec::new();
        write_npy(&mut buf, &[vec![1.0, 2.0], vec![3.0, 4.0]], 2).unwrap();
        let header_len = u16::from_le_bytes([buf[8], buf[9]]) as usize;
        assert_eq!((10 + header_len) % 64, 0);
        assert_eq!(buf[10 + header_len - 1], b'\n');
        let header = std::str::from_utf8(&buf[10..10 + header_len]).unwrap();
        assert!(header.contains("'shape': (2, 2)"), "{header}");
        assert_eq!(buf.len(), 10 + header_len + 16);
        assert_eq!(
            &buf[10 + header_len..10 + header_len + 4],
            &1f32.to_le_bytes()
        );
    }

    #[test]
    fn jsonl_escapes_text() {
        let mut buf = Vec::new();
        write_jsonl(
            &mut buf,
            &["a \"quote\"\\ \t\u{1}é"],
            &[vec![0.5, -1e-7, f32::NAN]],
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "{\"text\": \"a \\\"quote\\\"\\\\ \\t\\u0001é\", \"embedding\": [0.5, -0.0000001, null]}\n"
        );
    }

    #[test]
    fn shorten_cuts_on_characters() {
        assert_eq!(shorten("héllo  wörld", 20), "héllo wörld");
        assert_eq!(shorten("ééééé", 3), "éé…");
    }
}
