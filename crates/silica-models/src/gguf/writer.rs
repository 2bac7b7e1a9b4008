//! [`GgufWriter`]: writes GGUF version 3 files that [`GgufFile`] and
//! llama.cpp read.
//!
//! A file is described first (metadata and every tensor's name, shape and
//! type), because the header lists where each tensor's data will be; the
//! data follows in the order the tensors were added. Small files can hold
//! their data in memory ([`GgufWriter::add_tensor`] then
//! [`GgufWriter::write_to_path`]); large ones declare their tensors
//! ([`GgufWriter::declare_tensor`]) and stream the data afterwards through a
//! [`GgufStream`], one tensor (or one slice of a tensor) at a time.
//!
//! Everything the reader would reject is rejected here first, as an
//! [`Error::InvalidInput`] naming the key or tensor: duplicate tensor names,
//! data of the wrong length, rows that are not whole blocks, mixed-type
//! arrays, a `general.alignment` that is not a power of two.
//!
//! ```no_run
//! use silica_models::gguf::{GgmlType, GgufFile, GgufWriter, MetaValue};
//!
//! let mut w = GgufWriter::new();
//! w.metadata("general.architecture", MetaValue::String("llama".into()))?;
//! // a [2, 3] f32 tensor: shapes are row-major, like `TensorInfo::shape`
//! let values = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
//! let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
//! w.add_tensor("x", &[2, 3], GgmlType::F32, bytes)?;
//! w.write_to_path("x.gguf")?;
//! assert_eq!(GgufFile::open("x.gguf")?.dequantize("x")?.1, values);
//! # Ok::<(), silica_models::Error>(())
//! ```
//!
//! [`GgufFile`]: super::GgufFile

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use super::{
    DEFAULT_ALIGNMENT, GgmlType, MAX_ARRAY_DEPTH, MAX_ARRAY_LEN, MAX_DIMS, MAX_ELEMENTS,
    MAX_STRING_LEN, MetaValue,
};
use crate::{Error, Result};

/// `GGUF` as a little-endian `u32`.
const MAGIC: u32 = 0x4655_4747;
/// The GGUF version written.
const VERSION: u32 = 3;
/// The longest tensor name ggml accepts (`GGML_MAX_NAME` less its NUL).
pub const MAX_TENSOR_NAME: usize = 63;

fn invalid(msg: String) -> Error {
    Error::InvalidInput(format!("GGUF writer: {msg}"))
}

/// A tensor as described to the writer.
struct PendingTensor {
    name: String,
    /// GGUF order: `ne[0]`, the row length, first.
    dims: Vec<u64>,
    ggml_type: GgmlType,
    /// Bytes of data.
    size: u64,
    /// The data, when given to [`GgufWriter::add_tensor`].
    data: Option<Vec<u8>>,
}

/// Builds a GGUF v3 file: metadata, tensor descriptions, then data. See the
/// [module documentation](self).
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<PendingTensor>,
    names: HashSet<String>,
}

impl std::fmt::Debug for GgufWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufWriter")
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufWriter {
    /// An empty file: no metadata, no tensors.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets metadata `key` to `value`. Setting a key again replaces its value
    /// where it first appeared (GGUF files cannot repeat a key). Arrays must
    /// hold elements of one type; an empty array is written as an array of
    /// `u8` (the element type of an empty [`MetaValue::Array`] is unknown).
    /// `general.alignment` must be a `u32` power of two.
    pub fn metadata(&mut self, key: impl Into<String>, value: MetaValue) -> Result<&mut Self> {
        let key = key.into();
        if key.len() as u64 > MAX_STRING_LEN {
            return Err(invalid(format!(
                "metadata key of {} bytes exceeds the limit of {MAX_STRING_LEN}",
                key.len()
            )));
        }
        check_value(&key, &value, 0)?;
        if key == "general.alignment" {
            match value {
                MetaValue::U32(a) if a.is_power_of_two() => {}
                ref other => {
                    return Err(invalid(format!(
                        "general.alignment must be a u32 power of two, got {} {other:?}",
                        other.type_name()
                    )));
                }
            }
        }
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => self.metadata.push((key, value)),
        }
        Ok(self)
    }

    /// The metadata set so far, in file order.
    pub fn metadata_entries(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// The data alignment: `general.alignment`, or 32.
    pub fn alignment(&self) -> u64 {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            // metadata() accepts only a u32 power of two under this key
            Some((_, MetaValue::U32(a))) => u64::from(*a),
            _ => DEFAULT_ALIGNMENT,
        }
    }

    /// Adds a tensor with its data in memory. `shape` is row-major, as
    /// [`TensorInfo::shape`](super::TensorInfo::shape) gives it back: the
    /// last dimension is the row length (ggml's `ne[0]`) and must be a whole
    /// number of `ggml_type` blocks; `data` must be exactly the tensor's size
    /// (elements / block size * bytes per block).
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        shape: &[usize],
        ggml_type: GgmlType,
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        let name = name.into();
        let tensor = describe(&name, shape, ggml_type)?;
        if data.len() as u64 != tensor.size {
            return Err(invalid(format!(
                "tensor '{name}' of shape {shape:?} and type {ggml_type} needs {} bytes, got {}",
                tensor.size,
                data.len()
            )));
        }
        self.push(PendingTensor {
            data: Some(data),
            ..tensor
        })
    }

    /// Adds a tensor whose data will be streamed later with
    /// [`GgufStream::write_tensor`] or [`GgufStream::write_tensor_with`].
    /// `shape` as for [`GgufWriter::add_tensor`].
    pub fn declare_tensor(
        &mut self,
        name: impl Into<String>,
        shape: &[usize],
        ggml_type: GgmlType,
    ) -> Result<&mut Self> {
        let name = name.into();
        let tensor = describe(&name, shape, ggml_type)?;
        self.push(tensor)
    }

    fn push(&mut self, tensor: PendingTensor) -> Result<&mut Self> {
        if !self.names.insert(tensor.name.clone()) {
            return Err(invalid(format!("duplicate tensor name '{}'", tensor.name)));
        }
        self.tensors.push(tensor);
        Ok(self)
    }

    /// The number of tensors added or declared.
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    /// Writes the whole file to `out`. Every tensor must have been given its
    /// data ([`GgufWriter::add_tensor`]); otherwise nothing is written.
    pub fn write<W: Write>(self, out: W) -> Result<W> {
        self.check_all_data()?;
        self.begin(out)?.finish()
    }

    /// Writes the whole file to `path` (created or truncated), like
    /// [`GgufWriter::write`].
    pub fn write_to_path(self, path: impl AsRef<Path>) -> Result<()> {
        self.check_all_data()?;
        self.create(path)?.finish().map(drop)
    }

    fn check_all_data(&self) -> Result<()> {
        match self.tensors.iter().find(|t| t.data.is_none()) {
            Some(t) => Err(invalid(format!(
                "tensor '{}' was declared but has no data (stream it with begin/create)",
                t.name
            ))),
            None => Ok(()),
        }
    }

    /// Writes the header to `out` and returns the stream that takes the
    /// declared tensors' data, in the order they were added (data given to
    /// [`GgufWriter::add_tensor`] is written when its turn comes).
    pub fn begin<W: Write>(self, out: W) -> Result<GgufStream<W>> {
        GgufStream::start(self, out, PathBuf::from("<output>"))
    }

    /// [`GgufWriter::begin`] on a new file at `path` (created or truncated).
    pub fn create(self, path: impl AsRef<Path>) -> Result<GgufStream<BufWriter<File>>> {
        let path = path.as_ref();
        let file = File::create(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        GgufStream::start(self, BufWriter::new(file), path.to_path_buf())
    }
}

/// Checks a tensor description and computes its size.
fn describe(name: &str, shape: &[usize], ggml_type: GgmlType) -> Result<PendingTensor> {
    if name.len() > MAX_TENSOR_NAME {
        return Err(invalid(format!(
            "tensor name '{name}' is {} bytes, more than ggml's {MAX_TENSOR_NAME}",
            name.len()
        )));
    }
    if shape.is_empty() || shape.len() > MAX_DIMS as usize {
        return Err(invalid(format!(
            "tensor '{name}' has shape {shape:?}: 1 to {MAX_DIMS} dimensions are needed"
        )));
    }
    if shape.contains(&0) {
        return Err(invalid(format!(
            "tensor '{name}' has shape {shape:?} with a zero dimension"
        )));
    }
    let numel = shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| {
            invalid(format!(
                "tensor '{name}' of shape {shape:?} has more than 2^48 elements"
            ))
        })?;
    let Some((block, type_size)) = ggml_type.layout() else {
        return Err(invalid(format!(
            "tensor '{name}': unknown ggml type {ggml_type}"
        )));
    };
    let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
    let row = dims[0]; // shape is not empty (checked above)
    if !row.is_multiple_of(block as u64) {
        return Err(invalid(format!(
            "tensor '{name}' of shape {shape:?}: rows of {row} are not a whole number of {ggml_type} blocks of {block}"
        )));
    }
    Ok(PendingTensor {
        name: name.to_string(),
        dims,
        ggml_type,
        // numel <= 2^48 and type_size < 2^9: no overflow
        size: numel / block as u64 * type_size as u64,
        data: None,
    })
}

/// Checks that the reader will accept `value` under `key`, `depth` arrays
/// deep.
fn check_value(key: &str, value: &MetaValue, depth: usize) -> Result<()> {
    match value {
        MetaValue::String(s) if s.len() as u64 > MAX_STRING_LEN => Err(invalid(format!(
            "metadata '{key}': a string of {} bytes exceeds the limit of {MAX_STRING_LEN}",
            s.len()
        ))),
        MetaValue::Array(items) => {
            if depth + 1 > MAX_ARRAY_DEPTH {
                return Err(invalid(format!(
                    "metadata '{key}': arrays nested more than {MAX_ARRAY_DEPTH} deep"
                )));
            }
            if items.len() as u64 > MAX_ARRAY_LEN {
                return Err(invalid(format!(
                    "metadata '{key}': an array of {} elements exceeds the limit of {MAX_ARRAY_LEN}",
                    items.len()
                )));
            }
            let ty = items.first().map(MetaValue::type_name);
            if let Some((i, other)) = items
                .iter()
                .enumerate()
                .find(|(_, v)| Some(v.type_name()) != ty)
            {
                return Err(invalid(format!(
                    "metadata '{key}': array element {i} is {}, element 0 is {} (GGUF arrays hold one type)",
                    other.type_name(),
                    ty.unwrap_or("?")
                )));
            }
            items
                .iter()
                .try_for_each(|v| check_value(key, v, depth + 1))
        }
        _ => Ok(()),
    }
}

/// The GGUF value type id of `value`.
fn type_id(value: &MetaValue) -> u32 {
    match value {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Appends `value`'s encoding, without its type id.
fn put_value(out: &mut Vec<u8>, value: &MetaValue) {
    match value {
        MetaValue::U8(v) => out.push(*v),
        MetaValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::Bool(v) => out.push(u8::from(*v)),
        MetaValue::String(s) => put_string(out, s),
        MetaValue::Array(items) => {
            let ty = items.first().map_or(0, type_id);
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            items.iter().for_each(|v| put_value(out, v));
        }
        MetaValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}

/// A tensor whose data the stream still has to write.
struct Slot {
    name: String,
    /// Absolute file offset of the data.
    offset: u64,
    size: u64,
    data: Option<Vec<u8>>,
}

/// A GGUF file whose header is written and whose tensor data is being
/// written, in order. Made by [`GgufWriter::begin`] or
/// [`GgufWriter::create`]; [`GgufStream::finish`] checks that every tensor
/// got its data.
pub struct GgufStream<W: Write> {
    out: W,
    path: PathBuf,
    /// Bytes written so far: the file offset.
    pos: u64,
    alignment: u64,
    slots: std::vec::IntoIter<Slot>,
    /// The next tensor to write, if any.
    next: Option<Slot>,
}

impl<W: Write> std::fmt::Debug for GgufStream<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufStream")
            .field("path", &self.path)
            .field("pos", &self.pos)
            .field("next", &self.next_tensor())
            .finish_non_exhaustive()
    }
}

impl<W: Write> GgufStream<W> {
    fn start(w: GgufWriter, out: W, path: PathBuf) -> Result<Self> {
        let alignment = w.alignment();
        let mut header = Vec::new();
        header.extend_from_slice(&MAGIC.to_le_bytes());
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&(w.tensors.len() as u64).to_le_bytes());
        header.extend_from_slice(&(w.metadata.len() as u64).to_le_bytes());
        for (key, value) in &w.metadata {
            put_string(&mut header, key);
            header.extend_from_slice(&type_id(value).to_le_bytes());
            put_value(&mut header, value);
        }
        let mut rel = 0u64;
        let mut relative = Vec::with_capacity(w.tensors.len());
        for t in &w.tensors {
            put_string(&mut header, &t.name);
            header.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            t.dims
                .iter()
                .for_each(|d| header.extend_from_slice(&d.to_le_bytes()));
            header.extend_from_slice(&t.ggml_type.id().to_le_bytes());
            header.extend_from_slice(&rel.to_le_bytes());
            relative.push(rel);
            rel = (rel + t.size).next_multiple_of(alignment);
        }
        let data_offset = (header.len() as u64).next_multiple_of(alignment);
        let slots: Vec<Slot> = w
            .tensors
            .into_iter()
            .zip(relative)
            .map(|(t, rel)| Slot {
                name: t.name,
                offset: data_offset + rel,
                size: t.size,
                data: t.data,
            })
            .collect();
        let mut stream = GgufStream {
            out,
            path,
            pos: 0,
            alignment,
            slots: slots.into_iter(),
            next: None,
        };
        stream.put(&header)?;
        stream.pad_to(data_offset)?;
        stream.advance()?;
        Ok(stream)
    }

    fn io(&self, source: io::Error) -> Error {
        Error::Io {
            path: self.path.clone(),
            source,
        }
    }

    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).map_err(|e| self.io(e))?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    fn pad_to(&mut self, offset: u64) -> Result<()> {
        const ZEROS: [u8; 256] = [0; 256];
        while self.pos < offset {
            let n = (offset - self.pos).min(ZEROS.len() as u64) as usize;
            self.put(&ZEROS[..n])?;
        }
        Ok(())
    }

    /// Moves to the next tensor that needs streamed data, writing the ones
    /// with data in memory on the way.
    fn advance(&mut self) -> Result<()> {
        while let Some(mut slot) = self.slots.next() {
            self.pad_to(slot.offset)?;
            match slot.data.take() {
                Some(data) => self.put(&data)?,
                None => {
                    self.next = Some(slot);
                    return Ok(());
                }
            }
        }
        self.next = None;
        Ok(())
    }

    /// The name of the tensor whose data is expected next, or `None` when all
    /// are written.
    pub fn next_tensor(&self) -> Option<&str> {
        self.next.as_ref().map(|s| s.name.as_str())
    }

    /// Writes the data of tensor `name`, which must be the next one
    /// ([`GgufStream::next_tensor`]), all at once.
    pub fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<()> {
        self.write_tensor_with(name, |sink| sink.write(data))
    }

    /// Writes the data of tensor `name`, which must be the next one, in
    /// pieces: `fill` gets a [`TensorSink`] and must write exactly the
    /// tensor's size into it.
    pub fn write_tensor_with<E: From<Error>>(
        &mut self,
        name: &str,
        fill: impl FnOnce(&mut TensorSink<'_>) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let (size, start) = match &self.next {
            Some(slot) if slot.name == name => (slot.size, slot.offset),
            Some(slot) => {
                return Err(invalid(format!(
                    "tensor '{name}' written out of order: '{}' comes next",
                    slot.name
                ))
                .into());
            }
            None => {
                return Err(invalid(format!(
                    "tensor '{name}' written, but no declared tensor is left to write"
                ))
                .into());
            }
        };
        debug_assert_eq!(self.pos, start, "advance() pads to the slot's offset");
        let mut sink = TensorSink {
            stream: self.erase(),
            name,
            left: size,
        };
        fill(&mut sink)?;
        if sink.left != 0 {
            let got = size - sink.left;
            return Err(invalid(format!("tensor '{name}' needs {size} bytes, got {got}")).into());
        }
        self.advance()?;
        Ok(())
    }

    fn erase(&mut self) -> &mut dyn RawSink {
        self
    }

    /// Pads the end of the data to the alignment, flushes, and gives the
    /// output back. Fails if a declared tensor got no data.
    pub fn finish(mut self) -> Result<W> {
        if let Some(name) = self.next_tensor() {
            return Err(invalid(format!(
                "the file ends before the data of tensor '{name}'"
            )));
        }
        let end = self.pos.next_multiple_of(self.alignment);
        self.pad_to(end)?;
        self.out.flush().map_err(|e| self.io(e))?;
        Ok(self.out)
    }
}

/// The part of a [`GgufStream`] a [`TensorSink`] writes through, without its
/// output type.
trait RawSink {
    fn put_bytes(&mut self, bytes: &[u8]) -> Result<()>;
}

impl<W: Write> RawSink for GgufStream<W> {
    fn put_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        self.put(bytes)
    }
}

/// Takes one tensor's data in pieces; see [`GgufStream::write_tensor_with`].
pub struct TensorSink<'a> {
    stream: &'a mut dyn RawSink,
    name: &'a str,
    /// Bytes still expected.
    left: u64,
}

impl TensorSink<'_> {
    /// Appends `bytes` to the tensor's data; more than its size is an error.
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let n = bytes.len() as u64;
        if n > self.left {
            return Err(invalid(format!(
                "tensor '{}': {n} more bytes written with only {} left of its size",
                self.name, self.left
            )));
        }
        self.stream.put_bytes(bytes)?;
        self.left -= n;
        Ok(())
    }

    /// Bytes still expected.
    pub fn remaining(&self) -> u64 {
        self.left
    }
}
