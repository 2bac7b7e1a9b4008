//! The GGUF parser: a cursor over the file's bytes that checks everything.

use std::collections::HashMap;
use std::path::Path;

use super::{
    DEFAULT_ALIGNMENT, GgmlType, MAX_ARRAY_DEPTH, MAX_ARRAY_LEN, MAX_DIMS, MAX_ELEMENTS,
    MAX_STRING_LEN, MetaValue, TensorInfo,
};
use crate::{Error, Result};

/// `GGUF` read as a little-endian `u32`.
const MAGIC: u32 = 0x4655_4747;
/// The fewest bytes one tensor info can take: empty name (8), `n_dims` (4),
/// type (4), offset (8).
const MIN_TENSOR_INFO: u64 = 24;
/// The fewest bytes one metadata pair can take: empty key (8), type (4), a
/// one-byte value (1).
const MIN_KV: u64 = 13;
/// Vectors sized from counts in the file start no larger than this; they grow
/// only as elements are actually read.
const MAX_PREALLOC: usize = 1 << 16;

/// The encoded size of the smallest value of GGUF value type `ty`, or `None`
/// for an unknown type.
fn min_value_size(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        8 => 8,  // an empty string: its length
        9 => 12, // an empty array: element type and count
        _ => return None,
    })
}

/// What [`Parser::parse`] finds.
pub(super) struct Parsed {
    pub(super) version: u32,
    pub(super) alignment: u64,
    pub(super) data_offset: u64,
    pub(super) metadata: Vec<(String, MetaValue)>,
    pub(super) meta_offsets: Vec<u64>,
    pub(super) meta_index: HashMap<String, usize>,
    pub(super) tensors: Vec<TensorInfo>,
    pub(super) tensor_index: HashMap<String, usize>,
}

/// A tensor info as read, before its data range is checked.
struct RawTensor {
    info: TensorInfo,
    /// File offset of the info's data-offset field.
    offset_at: usize,
}

/// A cursor over the file's bytes. Every read checks the bytes left.
pub(super) struct Parser<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Parser<'a> {
    pub(super) fn new(buf: &'a [u8], path: &'a Path) -> Self {
        Parser { buf, pos: 0, path }
    }

    fn err(&self, at: usize, msg: impl Into<String>) -> Error {
        Error::Format {
            path: self.path.to_path_buf(),
            offset: at as u64,
            msg: msg.into(),
        }
    }

    fn left(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// The bytes not read yet.
    fn rest(&self) -> &'a [u8] {
        self.buf.get(self.pos..).unwrap_or_default()
    }

    fn truncated(&self, n: usize, what: &str) -> Error {
        let left = self.left();
        let msg = format!("unexpected end of file reading {what}: need {n} bytes, {left} left");
        self.err(self.pos, msg)
    }

    /// The next `n` bytes.
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let bytes = self
            .rest()
            .get(..n)
            .ok_or_else(|| self.truncated(n, what))?;
        self.pos += n;
        Ok(bytes)
    }

    /// The next `N` bytes, as an array.
    fn fixed<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let bytes = self
            .rest()
            .first_chunk::<N>()
            .ok_or_else(|| self.truncated(N, what))?;
        self.pos += N;
        Ok(*bytes)
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        self.fixed::<1>(what).map(|b| b[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        self.fixed(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        self.fixed(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let at = self.pos;
        let len = self.u64(what)?;
        if len > MAX_STRING_LEN {
            return Err(self.err(
                at,
                format!("{what}: string length {len} exceeds the limit of {MAX_STRING_LEN} bytes"),
            ));
        }
        let left = self.left();
        let n = match usize::try_from(len) {
            Ok(n) if n <= left => n,
            _ => {
                return Err(self.err(
                    at,
                    format!("{what}: string length {len} exceeds the {left} bytes left"),
                ));
            }
        };
        let start = self.pos;
        let bytes = self.take(n, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(self.err(
                start + e.valid_up_to(),
                format!("{what}: invalid UTF-8 in string"),
            )),
        }
    }

    /// A value of type `ty` (read at `ty_at`); `depth` is the number of
    /// arrays it is inside.
    fn value(&mut self, ty: u32, ty_at: usize, depth: usize) -> Result<MetaValue> {
        Ok(match ty {
            0 => MetaValue::U8(self.u8("a u8 value")?),
            1 => MetaValue::I8(i8::from_le_bytes(self.fixed("an i8 value")?)),
            2 => MetaValue::U16(u16::from_le_bytes(self.fixed("a u16 value")?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.fixed("an i16 value")?)),
            4 => MetaValue::U32(self.u32("a u32 value")?),
            5 => MetaValue::I32(i32::from_le_bytes(self.fixed("an i32 value")?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.fixed("an f32 value")?)),
            7 => {
                let at = self.pos;
                match self.u8("a bool value")? {
                    0 => MetaValue::Bool(false),
                    1 => MetaValue::Bool(true),
                    b => return Err(self.err(at, format!("invalid bool value {b} (not 0 or 1)"))),
                }
            }
            8 => MetaValue::String(self.string("a string value")?),
            9 => self.array(depth)?,
            10 => MetaValue::U64(self.u64("a u64 value")?),
            11 => MetaValue::I64(i64::from_le_bytes(self.fixed("an i64 value")?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.fixed("an f64 value")?)),
            _ => return Err(self.err(ty_at, format!("unknown metadata value type {ty}"))),
        })
    }

    /// An array (after its value type), inside `depth` arrays.
    fn array(&mut self, depth: usize) -> Result<MetaValue> {
        let at = self.pos;
        if depth >= MAX_ARRAY_DEPTH {
            return Err(self.err(
                at,
                format!("arrays nested more than {MAX_ARRAY_DEPTH} deep"),
            ));
        }
        let ty = self.u32("an array element type")?;
        let Some(min_size) = min_value_size(ty) else {
            return Err(self.err(
                at,
                format!("unknown metadata value type {ty} of array elements"),
            ));
        };
        let count_at = self.pos;
        let count = self.u64("an array length")?;
        if count > MAX_ARRAY_LEN {
            return Err(self.err(
                count_at,
                format!("array length {count} exceeds the limit of {MAX_ARRAY_LEN}"),
            ));
        }
        let left = self.left() as u64;
        if count.saturating_mul(min_size) > left {
            return Err(self.err(
                count_at,
                format!(
                    "array length {count} needs at least {} bytes, only {left} left",
                    count.saturating_mul(min_size)
                ),
            ));
        }
        let mut items = Vec::with_capacity((count as usize).min(MAX_PREALLOC));
        for _ in 0..count {
            items.push(self.value(ty, at, depth + 1)?);
        }
        Ok(MetaValue::Array(items))
    }

    /// Checks that `count` items of at least `min` bytes each fit in the
    /// bytes left.
    fn check_count(&self, count: u64, min: u64, at: usize, what: &str) -> Result<()> {
        let left = self.left() as u64;
        if count.checked_mul(min).is_none_or(|n| n > left) {
            return Err(self.err(
                at,
                format!(
                    "{what} {count} is impossible: each needs at least {min} bytes, only {left} bytes left"
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn parse(mut self) -> Result<Parsed> {
        let magic = self.u32("the magic")?;
        if magic != MAGIC {
            return Err(self.err(
                0,
                format!(
                    "bad magic {:?}: not a GGUF file (expected \"GGUF\")",
                    String::from_utf8_lossy(&magic.to_le_bytes())
                ),
            ));
        }
        let version = self.u32("the version")?;
        if version != 2 && version != 3 {
            return Err(self.err(
                4,
                format!("unsupported GGUF version {version} (only versions 2 and 3 are supported)"),
            ));
        }
        let tensor_count_at = self.pos;
        let tensor_count = self.u64("the tensor count")?;
        let kv_count_at = self.pos;
        let kv_count = self.u64("the metadata count")?;
        self.check_count(
            tensor_count,
            MIN_TENSOR_INFO,
            tensor_count_at,
            "tensor count",
        )?;
        self.check_count(kv_count, MIN_KV, kv_count_at, "metadata key-value count")?;

        // Metadata.
        let prealloc = (kv_count as usize).min(MAX_PREALLOC);
        let mut metadata = Vec::with_capacity(prealloc);
        let mut meta_offsets = Vec::with_capacity(prealloc);
        let mut meta_index = HashMap::with_capacity(prealloc);
        for _ in 0..kv_count {
            let key_at = self.pos;
            let key = self.string("a metadata key")?;
            if meta_index.contains_key(&key) {
                return Err(self.err(key_at, format!("duplicate metadata key '{key}'")));
            }
            let ty_at = self.pos;
            let ty = self.u32("a metadata value type")?;
            let value = self.value(ty, ty_at, 0)?;
            meta_index.insert(key.clone(), metadata.len());
            meta_offsets.push(ty_at as u64);
            metadata.push((key, value));
        }
        let alignment = match meta_index.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => {
                let at = meta_offsets.get(i).copied().unwrap_or(0) as usize;
                match metadata.get(i).map(|kv| &kv.1) {
                    Some(&MetaValue::U32(a)) if a.is_power_of_two() => u64::from(a),
                    Some(MetaValue::U32(a)) => {
                        return Err(self.err(
                            at,
                            format!("general.alignment {a} is not a non-zero power of two"),
                        ));
                    }
                    other => {
                        let ty = other.map_or("missing", MetaValue::type_name);
                        return Err(self.err(at, format!("general.alignment is {ty}, not u32")));
                    }
                }
            }
        };

        // Tensor infos.
        let prealloc = (tensor_count as usize).min(MAX_PREALLOC);
        let mut raw = Vec::with_capacity(prealloc);
        let mut tensor_index = HashMap::with_capacity(prealloc);
        for _ in 0..tensor_count {
            let name_at = self.pos;
            let name = self.string("a tensor name")?;
            if tensor_index.contains_key(&name) {
                return Err(self.err(name_at, format!("duplicate tensor name '{name}'")));
            }
            let t = self.tensor_info(name)?;
            tensor_index.insert(t.info.name.clone(), raw.len());
            raw.push(t);
        }

        // Data ranges.
        let info_end = self.pos as u64;
        let data_offset = info_end
            .checked_next_multiple_of(alignment)
            .ok_or_else(|| self.err(self.pos, "data section offset overflows"))?;
        let file_len = self.buf.len() as u64;
        for t in &mut raw {
            let TensorInfo { name, size, .. } = &t.info;
            let rel = t.info.offset;
            if !rel.is_multiple_of(alignment) {
                return Err(self.err(
                    t.offset_at,
                    format!(
                        "tensor '{name}': data offset {rel} is not a multiple of the alignment {alignment}"
                    ),
                ));
            }
            let end = data_offset
                .checked_add(rel)
                .and_then(|start| start.checked_add(*size))
                .filter(|&end| end <= file_len);
            if end.is_none() {
                return Err(self.err(
                    t.offset_at,
                    format!(
                        "tensor '{name}': data at {data_offset} + {rel} ({size} bytes) extends past the end of the file ({file_len} bytes)"
                    ),
                ));
            }
            t.info.offset = data_offset + rel;
        }
        let mut order: Vec<&RawTensor> = raw.iter().collect();
        order.sort_by_key(|t| t.info.offset);
        for pair in order.windows(2) {
            if let [a, b] = pair
                && a.info.offset + a.info.size > b.info.offset
            {
                return Err(self.err(
                    b.offset_at,
                    format!(
                        "tensor '{}' data [{}, {}) overlaps tensor '{}' data [{}, {})",
                        b.info.name,
                        b.info.offset,
                        b.info.offset + b.info.size,
                        a.info.name,
                        a.info.offset,
                        a.info.offset + a.info.size
                    ),
                ));
            }
        }
        Ok(Parsed {
            version,
            alignment,
            data_offset,
            metadata,
            meta_offsets,
            meta_index,
            tensors: raw.into_iter().map(|t| t.info).collect(),
            tensor_index,
        })
    }

    /// The rest of a tensor info, after its name. The offset it returns is
    /// still relative to the data section.
    fn tensor_info(&mut self, name: String) -> Result<RawTensor> {
        let n_dims_at = self.pos;
        let n_dims = self.u32("a tensor dimension count")?;
        if n_dims > MAX_DIMS {
            return Err(self.err(
                n_dims_at,
                format!(
                    "tensor '{name}' has {n_dims} dimensions, more than the {MAX_DIMS} of GGML_MAX_DIMS"
                ),
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        let mut numel: u64 = 1;
        for i in 0..n_dims {
            let at = self.pos;
            let dim = self.u64("a tensor dimension")?;
            if dim == 0 {
                return Err(self.err(at, format!("tensor '{name}': dimension {i} is zero")));
            }
            dims.push(dim);
            numel = match numel.checked_mul(dim) {
                Some(n) if n <= MAX_ELEMENTS => n,
                _ => {
                    return Err(self.err(
                        at,
                        format!(
                            "tensor '{name}': dimensions {dims:?} have more than 2^48 elements"
                        ),
                    ));
                }
            };
        }
        let type_at = self.pos;
        let id = self.u32("a tensor type")?;
        let ggml_type = GgmlType::from_id(id);
        let Some((block, type_size)) = ggml_type.layout() else {
            return Err(self.err(type_at, format!("tensor '{name}': unknown ggml type {id}")));
        };
        let (block, type_size) = (block as u64, type_size as u64);
        // ggml quantizes rows: ne[0] must be whole blocks (so numel is too).
        let ne0 = dims.first().copied().unwrap_or(1);
        if !ne0.is_multiple_of(block) {
            return Err(self.err(
                type_at,
                format!(
                    "tensor '{name}': {numel} elements with rows of {ne0} (ne[0]) are not a multiple of the {ggml_type} block size {block}"
                ),
            ));
        }
        // numel <= 2^48 and type_size < 2^9, so this cannot overflow; check
        // anyway.
        let size = (numel / block)
            .checked_mul(type_size)
            .ok_or_else(|| self.err(type_at, format!("tensor '{name}': data size overflows")))?;
        let offset_at = self.pos;
        let offset = self.u64("a tensor data offset")?;
        Ok(RawTensor {
            info: TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
                size,
            },
            offset_at,
        })
    }
}
