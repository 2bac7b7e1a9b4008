//! The one error type of `silica-models`.

use std::path::PathBuf;

/// What can go wrong while finding, reading or running a model. Messages
/// name the file and, for malformed files, the byte offset and what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be opened or read.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A model file is malformed: `offset` is where the problem was found.
    #[error("{}: malformed file at byte {offset}: {msg}", path.display())]
    Format {
        path: PathBuf,
        offset: u64,
        msg: String,
    },
    /// A tensor or metadata key the model needs is absent.
    #[error("{}: missing {what}", path.display())]
    Missing { path: PathBuf, what: String },
    /// A valid file that uses something silica does not support (yet).
    #[error("{}: unsupported: {what}", path.display())]
    Unsupported { path: PathBuf, what: String },
    /// Tokenizer construction or use failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A model could not be found or fetched.
    #[error("model {model}: {msg}")]
    Resolve { model: String, msg: String },
    /// Bad arguments (empty prompt, prompt longer than the context, ...).
    #[error("{0}")]
    InvalidInput(String),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] silica::Error),
}

/// `Result` with the [`Error`] of this crate.
pub type Result<T> = std::result::Result<T, Error>;
