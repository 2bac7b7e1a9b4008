//! GGUF model files: a defensive, memory-mapped reader for versions 2 and 3.
//!
//! A GGUF file (all integers little-endian) is:
//!
//! 1. a header: magic `GGUF`, version `u32`, tensor count `u64`, metadata
//!    key-value count `u64`;
//! 2. the metadata: per pair, a key (a GGUF string: `u64` length + UTF-8
//!    bytes), a value type `u32` and the value (arrays hold an element type,
//!    a `u64` count and the elements; arrays may nest);
//! 3. the tensor infos: name, `u32` dimension count, `u64` dimensions
//!    (`ne[0]`, the fastest-varying, first), `u32` ggml type and a `u64` data
//!    offset relative to the data section;
//! 4. the data section, starting at the next multiple of `general.alignment`
//!    (default 32) after the tensor infos.
//!
//! The reader trusts nothing in the file: every length and count is checked
//! against the bytes left before anything is allocated, arithmetic is checked,
//! and tensor data ranges must be aligned, inside the file and disjoint. A
//! malformed file gives [`Error::Format`] naming the byte offset and the
//! problem; it never panics.
//!
//! [`GgufWriter`] writes version 3 files in the same layout.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::file_bytes::FileBytes;
use crate::quant::{self, QuantError};
use crate::{Error, Result};

mod ggml_type;
mod reader;
pub mod writer;

pub use ggml_type::GgmlType;
use reader::Parser;
pub use writer::{GgufStream, GgufWriter, TensorSink};

/// The alignment of the data section and of tensor data when the file has no
/// `general.alignment` key.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The longest string (key, value or tensor name) accepted, in bytes.
pub const MAX_STRING_LEN: u64 = 64 << 20;
/// The most elements one metadata array may hold.
pub const MAX_ARRAY_LEN: u64 = 100_000_000;
/// How deeply metadata arrays may nest (an array of arrays is depth 2).
pub const MAX_ARRAY_DEPTH: usize = 4;
/// The most dimensions a tensor may have (`GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// The most elements a tensor may have (2^48).
pub const MAX_ELEMENTS: u64 = 1 << 48;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// Elements all of one type (not checked again after parsing).
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    /// The value of any integer type, if it is not negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value of any number type (64-bit integers may round).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::I8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::U64(v) => Some(v as f64),
            Self::I64(v) => Some(v as f64),
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The string, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements, if this is an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The value, if this is a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The name of the value's type (`"u32"`, `"string"`, `"array"`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::U8(_) => "u8",
            Self::I8(_) => "i8",
            Self::U16(_) => "u16",
            Self::I16(_) => "i16",
            Self::U32(_) => "u32",
            Self::I32(_) => "i32",
            Self::F32(_) => "f32",
            Self::Bool(_) => "bool",
            Self::String(_) => "string",
            Self::Array(_) => "array",
            Self::U64(_) => "u64",
            Self::I64(_) => "i64",
            Self::F64(_) => "f64",
        }
    }
}

/// Where a tensor's data is and what it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in GGUF order: `ne[0]`, the fastest-varying, first.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Absolute file offset of the data.
    pub offset: u64,
    /// Size of the data in bytes.
    pub size: u64,
}

impl TensorInfo {
    /// The shape in row-major (PyTorch) order: the GGUF dims reversed.
    pub fn shape(&self) -> Vec<usize> {
        // Each dim is at most 2^48 (checked when parsing).
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// The number of elements (1 for a tensor without dimensions).
    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF file. Tensor data stays in the file (memory-mapped) until
/// asked for.
pub struct GgufFile {
    path: PathBuf,
    data: FileBytes,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, MetaValue)>,
    /// File offset of each metadata value's type field, for error messages.
    meta_offsets: Vec<u64>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish_non_exhaustive()
    }
}

impl GgufFile {
    /// Maps the file at `path` into memory and parses it.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let data = FileBytes::map(path)?;
        Self::parse(path.to_path_buf(), data)
    }

    /// Parses a GGUF file held in memory; `name` stands in for the path in
    /// error messages. The same parser as [`GgufFile::open`].
    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<GgufFile> {
        Self::parse(PathBuf::from(name), FileBytes::Owned(bytes))
    }

    fn parse(path: PathBuf, data: FileBytes) -> Result<GgufFile> {
        let parsed = Parser::new(data.bytes(), &path).parse()?;
        Ok(GgufFile {
            path,
            data,
            version: parsed.version,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            metadata: parsed.metadata,
            meta_offsets: parsed.meta_offsets,
            meta_index: parsed.meta_index,
            tensors: parsed.tensors,
            tensor_index: parsed.tensor_index,
        })
    }

    /// The file's path (the name given to [`GgufFile::from_bytes`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF version: 2 or 3.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data alignment: `general.alignment`, or 32.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// The file offset where the data section starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// The metadata value under `key`.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        let &i = self.meta_index.get(key)?;
        self.metadata.get(i).map(|kv| &kv.1)
    }

    /// The value under `key` and the offset of its type field.
    fn lookup(&self, key: &str) -> Result<(&MetaValue, u64)> {
        let i = self.meta_index.get(key).copied();
        let entry = i.and_then(|i| Some((&self.metadata.get(i)?.1, *self.meta_offsets.get(i)?)));
        entry.ok_or_else(|| Error::Missing {
            path: self.path.clone(),
            what: format!("metadata key '{key}'"),
        })
    }

    fn wrong_type(&self, key: &str, at: u64, value: &MetaValue, want: &str) -> Error {
        Error::Format {
            path: self.path.clone(),
            offset: at,
            msg: format!(
                "metadata key '{key}' is {} {}, expected {want}",
                value.type_name(),
                short(value)
            ),
        }
    }

    /// The integer under `key`: [`Error::Missing`] when absent,
    /// [`Error::Format`] when not a non-negative integer.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let (v, at) = self.lookup(key)?;
        v.as_u64()
            .ok_or_else(|| self.wrong_type(key, at, v, "a non-negative integer"))
    }

    /// The number under `key`: [`Error::Missing`] when absent,
    /// [`Error::Format`] when not a number.
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        let (v, at) = self.lookup(key)?;
        v.as_f64()
            .ok_or_else(|| self.wrong_type(key, at, v, "a number"))
    }

    /// The string under `key`: [`Error::Missing`] when absent,
    /// [`Error::Format`] when not a string.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let (v, at) = self.lookup(key)?;
        v.as_str()
            .ok_or_else(|| self.wrong_type(key, at, v, "a string"))
    }

    /// All tensors, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(*self.tensor_index.get(name)?)
    }

    /// The raw data of a tensor of this file (empty for an info whose range
    /// is not inside this file, such as one from another file).
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        let range = usize::try_from(info.offset)
            .ok()
            .and_then(|start| Some(start..start.checked_add(usize::try_from(info.size).ok()?)?));
        range.and_then(|r| self.data.bytes().get(r)).unwrap_or(&[])
    }

    /// The tensor named `name` as f32: its row-major shape and values.
    /// [`Error::Missing`] when absent, [`Error::Unsupported`] for types that
    /// [`quant::dequantize`] cannot decode.
    pub fn dequantize(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let info = self.tensor_info(name).ok_or_else(|| Error::Missing {
            path: self.path.clone(),
            what: format!("tensor '{name}'"),
        })?;
        let format = |msg: String| Error::Format {
            path: self.path.clone(),
            offset: info.offset,
            msg: format!("tensor '{name}': {msg}"),
        };
        let numel = usize::try_from(info.numel())
            .map_err(|_| format(format!("{} elements do not fit in memory", info.numel())))?;
        let values = quant::dequantize(info.ggml_type, self.tensor_bytes(info), numel).map_err(
            |e| match e {
                QuantError::Unsupported(ty) => Error::Unsupported {
                    path: self.path.clone(),
                    what: format!("dequantizing tensor '{name}' of type {ty}"),
                },
                other => format(other.to_string()),
            },
        )?;
        Ok((info.shape(), values))
    }
}

/// A value for an error message, cut short.
fn short(value: &MetaValue) -> String {
    match value {
        MetaValue::Array(a) => format!("of {} elements", a.len()),
        MetaValue::String(s) => format!("{:?}", s.chars().take(40).collect::<String>()),
        other => format!("{other:?}"),
    }
}
