//! Models named by a Hugging Face id (`org/name`): the hub cache layout, and
//! downloads into it through the blocking client of the `hf-hub` crate.
//!
//! The cache is the one the hub's own tools use, so a model fetched by
//! `huggingface-cli` is found here and the other way round:
//!
//! ```text
//! <cache>/models--ORG--NAME/
//!     refs/main                   the commit `main` pointed at when last fetched
//!     blobs/<etag>                each file's bytes, named by the hub's etag
//!     snapshots/<commit>/<file>   a link to the blob of `file` at `commit`
//! ```
//!
//! A download first asks the hub which commit `main` is and what files it
//! holds, then fetches the missing files of that one commit, so a snapshot
//! never mixes files of two commits.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

use hf_hub::api::sync::{Api, ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};

use super::{io_err, offline, resolve_err};
use crate::{Error, Result};

/// The hub's address when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where and how models named by a Hugging Face id are fetched.
/// [`HubOptions::from_env`] reads the hub's usual environment variables; the
/// `*_with` resolution functions take the options explicitly, so that a
/// program (or a test) can set them without touching the environment.
#[derive(Clone, Debug)]
pub struct HubOptions {
    /// The hub's address, without a trailing `/`.
    pub endpoint: String,
    /// The hub cache folder (see [`hf_cache_dir`]).
    pub cache_dir: PathBuf,
    /// Access token, sent for private and gated models.
    pub token: Option<String>,
    /// Use the cache only and never touch the network.
    pub offline: bool,
    /// Draw a progress bar on stderr (when it is a terminal) while downloading.
    pub progress: bool,
}

impl HubOptions {
    /// The options the environment asks for: the endpoint `$HF_ENDPOINT`
    /// (else [`DEFAULT_ENDPOINT`]), the cache [`hf_cache_dir`], the token
    /// `$HF_TOKEN` (else the file `huggingface-cli login` writes,
    /// `$HF_TOKEN_PATH` or `$HF_HOME/token`), offline when [`offline`] says
    /// so, with a progress bar.
    pub fn from_env() -> HubOptions {
        let endpoint = env_nonempty("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.into());
        let token = env_nonempty("HF_TOKEN").or_else(|| {
            let path = env_nonempty("HF_TOKEN_PATH")
                .map(PathBuf::from)
                .unwrap_or_else(|| hf_home().join("token"));
            let token = std::fs::read_to_string(path).ok()?;
            Some(token.trim().to_string()).filter(|t| !t.is_empty())
        });
        HubOptions {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            cache_dir: hf_cache_dir(),
            token,
            offline: offline(),
            progress: true,
        }
    }
}

fn env_nonempty(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.is_empty())
}

/// The Hugging Face home folder: `$HF_HOME`, else `~/.cache/huggingface`.
fn hf_home() -> PathBuf {
    if let Some(d) = std::env::var_os("HF_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("huggingface")
}

/// The Hugging Face hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `~/.cache/huggingface/hub`.
pub fn hf_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HF_HUB_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    hf_home().join("hub")
}

/// Whether `part` may be one `/`-separated part of a model id, by the hub's
/// rules: letters, digits, `-`, `_` and `.`, starting and ending with a
/// letter, digit or `_`, no `--` or `..` (so `./x` and `../x` are paths).
fn is_id_part(part: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    part.starts_with(word)
        && part.ends_with(word)
        && part.chars().all(|c| word(c) || c == '-' || c == '.')
        && !part.contains("--")
        && !part.contains("..")
}

/// Whether `id` has the form of a model id (`org/name`), whatever is on disk.
pub(crate) fn is_hf_id_syntax(id: &str) -> bool {
    id.split_once('/')
        .is_some_and(|(org, name)| is_id_part(org) && is_id_part(name))
}

/// Whether `spec` looks like a Hugging Face model id (`org/name`) and is not
/// a local path.
pub fn is_hf_id(spec: &str) -> bool {
    is_hf_id_syntax(spec) && !Path::new(spec).exists()
}

/// Whether `file` is a safe relative path inside a repo: no empty, `.` or
/// `..` parts, no backslashes (a hub that names `../x` must not write
/// outside the cache).
fn is_repo_path(file: &str) -> bool {
    !file.is_empty()
        && file
            .split('/')
            .all(|p| !p.is_empty() && p != "." && p != ".." && !p.contains('\\'))
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
        _ => Err(resolve_err(
            id,
            format!(
                "{} holds several snapshots and no refs/main",
                snapshots.display()
            ),
        )),
    }
}

/// One model repo on the hub, as of the commit `main` pointed at when it
/// was opened.
pub(crate) struct HubRepo<'a> {
    id: &'a str,
    options: &'a HubOptions,
    api: Api,
    commit: String,
    files: Vec<String>,
}

impl<'a> HubRepo<'a> {
    /// Asks the hub for the commit of `main` and its files. When downloads
    /// are off it fails before any request; `wanted` says what the cache
    /// lacked, for that message.
    pub(crate) fn open(id: &'a str, options: &'a HubOptions, wanted: &str) -> Result<Self> {
        if options.offline {
            return Err(resolve_err(
                id,
                format!(
                    "{wanted} is not in the Hugging Face cache {} and downloads are off (HF_HUB_OFFLINE/SILICA_OFFLINE); unset them to download it, or pass a local path",
                    options.cache_dir.display()
                ),
            ));
        }
        let api = guard(id, || {
            ApiBuilder::from_cache(Cache::new(options.cache_dir.clone()))
                .with_endpoint(options.endpoint.clone())
                .with_token(options.token.clone())
                .with_progress(options.progress)
                .with_user_agent("silica", env!("CARGO_PKG_VERSION"))
                .build()
        })?
        .map_err(|e| hub_err(id, options, "setting up the hub client", None, e))?;
        let info = guard(id, || api.model(id.to_string()).info())?
            .map_err(|e| hub_err(id, options, "listing the model's files", None, e))?;
        // The commit names a cache folder: nothing but a hash may do that.
        if info.sha.is_empty() || !info.sha.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(resolve_err(
                id,
                format!(
                    "{} named the commit {:?}, not a hash",
                    options.endpoint, info.sha
                ),
            ));
        }
        Ok(HubRepo {
            id,
            options,
            api,
            commit: info.sha,
            files: info.siblings.into_iter().map(|s| s.rfilename).collect(),
        })
    }

    /// Every file of the repo, as paths relative to its root.
    pub(crate) fn files(&self) -> &[String] {
        &self.files
    }

    /// Whether the repo holds `file`.
    pub(crate) fn has(&self, file: &str) -> bool {
        self.files.iter().any(|f| f == file)
    }

    /// The snapshot folder holding `files`: those not there yet are
    /// downloaded, and `refs/main` then names this commit.
    pub(crate) fn fetch(&self, files: &[&str]) -> Result<PathBuf> {
        let (id, options) = (self.id, self.options);
        let cache = Cache::new(options.cache_dir.clone());
        let snapshot = cache.model(id.to_string()).pointer_path(&self.commit);
        let repo = self.api.repo(Repo::with_revision(
            id.to_string(),
            RepoType::Model,
            self.commit.clone(),
        ));
        for &file in files {
            if !is_repo_path(file) {
                return Err(resolve_err(
                    id,
                    format!("refusing the file name {file:?} (it would leave the cache)"),
                ));
            }
            let dest = snapshot.join(file);
            if dest.is_file() {
                continue;
            }
            tracing::info!("downloading {file} of {id} at {}", self.commit);
            eprintln!(
                "silica: downloading {file} of {id} (commit {}) from {} into {}",
                self.commit.get(..12).unwrap_or(&self.commit),
                options.endpoint,
                options.cache_dir.display()
            );
            let path = guard(id, || repo.download(file))?
                .map_err(|e| hub_err(id, options, &format!("downloading {file}"), Some(file), e))?;
            if path != dest {
                return Err(resolve_err(
                    id,
                    format!(
                        "downloading {file}: the hub served it as {}, not as commit {}",
                        path.display(),
                        self.commit
                    ),
                ));
            }
        }
        cache
            .model(id.to_string())
            .create_ref(&self.commit)
            .map_err(|e| io_err(&options.cache_dir, e))?;
        Ok(snapshot)
    }
}

/// Runs a call into `hf-hub`, turning a panic (it has a few `expect`s on
/// malformed answers from the server) into an error.
fn guard<T>(id: &str, call: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(AssertUnwindSafe(call)).map_err(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        resolve_err(id, format!("the hub client failed: {what}"))
    })
}

/// A clear message for what went wrong while `doing` something with the
/// hub; `file` is set for downloads, whose 404 means the file is absent.
fn hub_err(
    id: &str,
    options: &HubOptions,
    doing: &str,
    file: Option<&str>,
    err: ApiError,
) -> Error {
    let endpoint = &options.endpoint;
    let msg = match &err {
        ApiError::RequestError(request) => match (request.as_ref(), file) {
            (ureq::Error::StatusCode(404), Some(file)) => {
                format!("{file} was not found on {endpoint} (HTTP 404)")
            }
            (ureq::Error::StatusCode(code @ (401 | 404)), _) => format!(
                "not found on {endpoint}, or not authorized (HTTP {code}): check the id; a private or gated model needs HF_TOKEN"
            ),
            (ureq::Error::StatusCode(403), _) => format!(
                "access denied by {endpoint} (HTTP 403): a gated model needs its terms accepted on the hub and HF_TOKEN set"
            ),
            (ureq::Error::StatusCode(code), _) => format!("{endpoint} answered HTTP {code}"),
            (
                ureq::Error::HostNotFound
                | ureq::Error::ConnectionFailed
                | ureq::Error::Io(_)
                | ureq::Error::Timeout(_),
                _,
            ) => format!(
                "could not reach {endpoint} ({request}); check the network, or set HF_HUB_OFFLINE=1 to use the cache only"
            ),
            (other, _) => format!("{endpoint}: {other}"),
        },
        other => other.to_string(),
    };
    resolve_err(id, format!("{doing}: {msg}"))
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
        for path in ["./x", "../x", "x/..", "a--b/c", "-a/b", "a/b."] {
            assert!(!is_hf_id(path), "{path}");
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn repo_paths_stay_inside_the_snapshot() {
        assert!(is_repo_path("model.gguf") && is_repo_path("1_Pooling/config.json"));
        for bad in [
            "",
            "../x.gguf",
            "a/../../x",
            "/abs.gguf",
            "a//b",
            "./x",
            "a\\..\\b",
        ] {
            assert!(!is_repo_path(bad), "{bad}");
        }
    }
}
