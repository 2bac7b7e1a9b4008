//! The bytes of a model file: memory-mapped from disk, or owned (for
//! parsers run over bytes in memory, as tests and fuzzers do).

use std::fs::File;
use std::path::Path;

use crate::{Error, Result};

pub(crate) enum FileBytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl FileBytes {
    /// Maps the file at `path` read-only.
    pub fn map(path: &Path) -> Result<FileBytes> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        if file.metadata().map_err(io)?.len() == 0 {
            // mapping an empty file fails on some systems; the parsers
            // report it as too short
            return Ok(FileBytes::Owned(Vec::new()));
        }
        // SAFETY: the map is read-only and lives as long as its owner. Like
        // every reader of memory-mapped files, we rely on the file not being
        // truncated or rewritten by another process while it is open; model
        // files are not modified in place.
        Ok(FileBytes::Mapped(
            unsafe { memmap2::Mmap::map(&file) }.map_err(io)?,
        ))
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            FileBytes::Mapped(m) => m,
            FileBytes::Owned(v) => v,
        }
    }
}
