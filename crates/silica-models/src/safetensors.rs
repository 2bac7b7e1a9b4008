//! Reading `.safetensors` files: memory-mapped, validated by the
//! `safetensors` crate (header length, JSON, dtypes, shapes and data
//! offsets), and turned into [`Tensor`]s on any device in F32, F16 or BF16.
//!
//! ```no_run
//! use silica::{DType, Device};
//! use silica_models::safetensors::SafetensorsFile;
//! let st = SafetensorsFile::open("model.safetensors")?;
//! // finds `embeddings.word_embeddings.weight`, or the same name behind a
//! // `bert.` or `model.` prefix
//! let emb = st.load("embeddings.word_embeddings.weight", &Device::cpu(), DType::F32)?;
//! # Ok::<(), silica_models::Error>(())
//! ```

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use safetensors::tensor::{Dtype, Metadata, SafeTensorError, SafeTensors};
use silica::{DType, Device, Tensor};

use crate::file_bytes::FileBytes;
use crate::{Error, Result};

/// The prefixes [`SafetensorsFile::find`] tries after the bare name: task
/// heads and wrappers store the encoder as `bert.…`, `model.…` or
/// `distilbert.…`.
pub const NAME_PREFIXES: [&str; 3] = ["bert.", "model.", "distilbert."];

/// The length field that starts every file.
const LEN_FIELD: usize = 8;

/// The dtype and shape of one stored tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMeta {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

/// A validated safetensors file. The header is parsed once; tensor data stays
/// in the (memory-mapped) file until [`SafetensorsFile::load`] converts it.
pub struct SafetensorsFile {
    path: PathBuf,
    data: FileBytes,
    /// Where the tensor data begins (after the length field and the header).
    data_start: usize,
    metadata: Metadata,
}

impl fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SafetensorsFile")
            .field("path", &self.path)
            .field("tensors", &self.metadata.tensors().len())
            .field("data_bytes", &self.metadata.data_len())
            .finish_non_exhaustive()
    }
}

impl SafetensorsFile {
    /// Maps the file at `path` into memory and validates it.
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        let path = path.as_ref();
        let data = FileBytes::map(path)?;
        Self::parse(path.to_path_buf(), data)
    }

    /// Reads a safetensors file held in memory; `name` stands in for the
    /// path in error messages. The same validation as [`SafetensorsFile::open`].
    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<SafetensorsFile> {
        Self::parse(PathBuf::from(name), FileBytes::Owned(bytes))
    }

    fn parse(path: PathBuf, data: FileBytes) -> Result<SafetensorsFile> {
        let bytes = data.bytes();
        // `SafeTensors::deserialize` is `read_metadata` plus a borrow of the
        // data; `read_metadata` does all the checking (header length, UTF-8,
        // JSON, dtypes and shapes against the data offsets, offsets within
        // the file, no gaps) and hands back an owned header that can live
        // next to the bytes.
        let (header_len, metadata) =
            SafeTensors::read_metadata(bytes).map_err(|e| format_error(&path, bytes, e))?;
        // The crate multiplies the dimensions to check them against the
        // data, and a zero-sized tensor ([0, 2^40, 2^40]) passes that
        // whatever its other dimensions; those must still multiply without
        // overflow, as a tensor's strides are their products.
        for (name, info) in metadata.tensors() {
            let mut non_zero = info.shape.iter().filter(|&&d| d != 0);
            if non_zero
                .try_fold(1usize, |n, &d| n.checked_mul(d))
                .is_none()
            {
                return Err(Error::Format {
                    path,
                    offset: LEN_FIELD as u64,
                    msg: format!(
                        "tensor `{name}`: the dimensions of shape {:?} overflow",
                        info.shape
                    ),
                });
            }
        }
        Ok(SafetensorsFile {
            path,
            data_start: LEN_FIELD + header_len,
            metadata,
            data,
        })
    }

    /// The path the file was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The names of all tensors, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.metadata.tensors().into_keys().collect();
        names.sort_unstable();
        names
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.metadata.tensors().len()
    }

    /// True when the file holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The free-form `__metadata__` of the header, if any.
    pub fn user_metadata(&self) -> Option<&HashMap<String, String>> {
        self.metadata.metadata().as_ref()
    }

    /// The stored name for `name`: `name` itself, else `name` behind one of
    /// [`NAME_PREFIXES`] (`bert.`, `model.`, `distilbert.`).
    pub fn find(&self, name: &str) -> Option<String> {
        if self.metadata.info(name).is_some() {
            return Some(name.to_string());
        }
        NAME_PREFIXES
            .iter()
            .map(|p| format!("{p}{name}"))
            .find(|n| self.metadata.info(n).is_some())
    }

    /// True when [`SafetensorsFile::find`] finds `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.find(name).is_some()
    }

    /// Dtype and shape of the tensor `name` (looked up as in
    /// [`SafetensorsFile::find`]).
    pub fn meta(&self, name: &str) -> Option<TensorMeta> {
        let stored = self.find(name)?;
        let info = self.metadata.info(&stored)?;
        Some(TensorMeta {
            dtype: info.dtype,
            shape: info.shape.clone(),
        })
    }

    /// The raw little-endian bytes of the tensor `name`.
    pub fn raw(&self, name: &str) -> Result<(TensorMeta, &[u8])> {
        let stored = self.find(name).ok_or_else(|| self.missing(name))?;
        let info = self
            .metadata
            .info(&stored)
            .ok_or_else(|| self.missing(name))?;
        let (start, end) = info.data_offsets;
        let bytes = self
            .data
            .bytes()
            .get(self.data_start + start..self.data_start + end)
            // Validation guarantees the range; keep a typed error anyway.
            .ok_or_else(|| Error::Format {
                path: self.path.clone(),
                offset: (self.data_start + start) as u64,
                msg: format!("data of tensor `{stored}` is out of range"),
            })?;
        let meta = TensorMeta {
            dtype: info.dtype,
            shape: info.shape.clone(),
        };
        Ok((meta, bytes))
    }

    /// The tensor `name` (looked up as in [`SafetensorsFile::find`]) on
    /// `device`, converted to `dtype` (F32, F16 or BF16). Stored F32, F16
    /// and BF16 tensors are accepted; conversion happens on the host.
    pub fn load(&self, name: &str, device: &Device, dtype: DType) -> Result<Tensor> {
        let (meta, bytes) = self.raw(name)?;
        let shape = meta.shape.as_slice();
        let unsupported = |what: String| Error::Unsupported {
            path: self.path.clone(),
            what,
        };
        if !dtype.is_float() {
            return Err(unsupported(format!(
                "loading tensor `{name}` as {dtype}: only f32, f16 and bf16 are supported"
            )));
        }
        let tensor = match meta.dtype {
            Dtype::F32 => {
                let v = decode::<4, f32>(bytes, f32::from_le_bytes);
                match dtype {
                    DType::F32 => Tensor::from_vec(v, shape, device)?,
                    DType::F16 => Tensor::from_vec(convert(&v, f16::from_f32), shape, device)?,
                    _ => Tensor::from_vec(convert(&v, bf16::from_f32), shape, device)?,
                }
            }
            Dtype::F16 => {
                let v = decode::<2, f16>(bytes, |b| f16::from_bits(u16::from_le_bytes(b)));
                match dtype {
                    DType::F32 => Tensor::from_vec(convert(&v, f16::to_f32), shape, device)?,
                    DType::F16 => Tensor::from_vec(v, shape, device)?,
                    _ => Tensor::from_vec(
                        convert(&v, |x| bf16::from_f32(x.to_f32())),
                        shape,
                        device,
                    )?,
                }
            }
            Dtype::BF16 => {
                let v = decode::<2, bf16>(bytes, |b| bf16::from_bits(u16::from_le_bytes(b)));
                match dtype {
                    DType::F32 => Tensor::from_vec(convert(&v, bf16::to_f32), shape, device)?,
                    DType::F16 => {
                        Tensor::from_vec(convert(&v, |x| f16::from_f32(x.to_f32())), shape, device)?
                    }
                    _ => Tensor::from_vec(v, shape, device)?,
                }
            }
            other => {
                return Err(unsupported(format!(
                    "tensor `{name}` is stored as {other:?}; only F32, F16 and BF16 can be loaded"
                )));
            }
        };
        Ok(tensor)
    }

    /// Like [`SafetensorsFile::load`], checking the shape too.
    pub fn load_shaped(
        &self,
        name: &str,
        shape: &[usize],
        device: &Device,
        dtype: DType,
    ) -> Result<Tensor> {
        if let Some(meta) = self.meta(name)
            && meta.shape != shape
        {
            return Err(Error::Format {
                path: self.path.clone(),
                offset: LEN_FIELD as u64,
                msg: format!(
                    "tensor `{name}` has shape {:?}, expected {shape:?}",
                    meta.shape
                ),
            });
        }
        self.load(name, device, dtype)
    }

    fn missing(&self, name: &str) -> Error {
        Error::Missing {
            path: self.path.clone(),
            what: format!(
                "tensor `{name}` (also looked for it behind the prefixes {})",
                NAME_PREFIXES.join(", ")
            ),
        }
    }
}

/// Little-endian elements of `N` bytes each (the data need not be aligned).
fn decode<const N: usize, T>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            f(a)
        })
        .collect()
}

fn convert<A: Copy, B>(v: &[A], f: impl Fn(A) -> B) -> Vec<B> {
    v.iter().map(|&x| f(x)).collect()
}

/// A `safetensors` error as [`Error::Format`], with the byte offset of the
/// part of the file it concerns: the length field (0) or the JSON header (8).
fn format_error(path: &Path, bytes: &[u8], e: SafeTensorError) -> Error {
    use SafeTensorError as E;
    let header = LEN_FIELD as u64;
    let (offset, msg) = match &e {
        E::HeaderTooSmall => (
            0,
            format!(
                "file of {} bytes is too short for the 8-byte header length",
                bytes.len()
            ),
        ),
        E::HeaderTooLarge | E::InvalidHeaderLength => {
            let n = bytes
                .get(..LEN_FIELD)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                .unwrap_or(0);
            (
                0,
                format!(
                    "{e}: the header claims {n} bytes, the file has {} after the length field",
                    bytes.len().saturating_sub(LEN_FIELD)
                ),
            )
        }
        E::InvalidHeaderDeserialization(json) | E::JsonError(json) => {
            (header + json_offset(bytes, json), e.to_string())
        }
        E::MetadataIncompleteBuffer => (
            header,
            format!("{e} (the data offsets do not end at the end of the file)"),
        ),
        _ => (header, e.to_string()),
    };
    Error::Format {
        path: path.to_path_buf(),
        offset,
        msg,
    }
}

/// The byte offset within the JSON header of a serde_json error (from its
/// 1-based line and column); 0 when unknown.
fn json_offset(bytes: &[u8], e: &serde_json::Error) -> u64 {
    let header = bytes.get(LEN_FIELD..).unwrap_or_default();
    let (line, column) = (e.line(), e.column());
    if line == 0 {
        return 0;
    }
    let mut offset = 0usize;
    for (i, l) in header.split(|&b| b == b'\n').enumerate() {
        if i + 1 == line {
            return (offset + column.saturating_sub(1).min(l.len())) as u64;
        }
        offset += l.len() + 1;
    }
    0
}
