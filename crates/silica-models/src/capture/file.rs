//! Activation files: what `silica activations` writes and `silica probe
//! train` reads.
//!
//! The safetensors form holds one 2-D tensor per captured point, named
//! `layer.{L}` for the residual stream and `layer.{L}.attn` /
//! `layer.{L}.mlp` for a block's outputs, `[sequences, d]` (last-token or
//! mean pooling) or `[tokens, d]` (every token, with an I64 tensor
//! `offsets`, `[sequences + 1]`, giving each sequence's first row). The
//! header's metadata (strings, as safetensors allows) names the model, its
//! layer count and width, the points, the pooling, the dtype, and holds the
//! prompts' texts, ids and labels as JSON arrays where they are known:
//! numpy and PyTorch read it with `safetensors.numpy.load_file` /
//! `safe_open(...).metadata()`.
//!
//! The `.npy` form is one array `[points, rows, d]` with the same metadata
//! (and `offsets`) in a JSON file beside it (`acts.npy` → `acts.json`).
//!
//! Both are written as a capture goes: the header first (every shape is
//! known once the prompts are tokenized), then rows at their places, so a
//! capture never holds more than a batch of states in memory.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use silica::{DType, Device, Tensor};

use super::{Pool, Site};
use crate::safetensors::SafetensorsFile;
use crate::{Error, Result};

/// The format tag in the metadata of every activation file.
pub const FORMAT: &str = "silica-activations/1";

/// What an activation file says about its contents.
#[derive(Clone, Debug, PartialEq)]
pub struct ActivationMeta {
    /// The model file or folder the states come from.
    pub model: String,
    /// The model's architecture (`llama`, `qwen3`, `bert`, ...).
    pub architecture: String,
    /// Blocks of the model (layers are numbered `0..=n_layers`).
    pub n_layers: usize,
    /// Width of each state.
    pub d_model: usize,
    pub points: Vec<(usize, Site)>,
    pub pool: Pool,
    /// The stored dtype: f32, f16 or bf16.
    pub dtype: DType,
    /// Number of sequences captured.
    pub count: usize,
    /// Each sequence's first row and the end (`count + 1` entries), for
    /// every-token pooling.
    pub offsets: Option<Vec<u64>>,
    pub texts: Option<Vec<String>>,
    pub ids: Option<Vec<String>>,
    pub labels: Option<Vec<String>>,
}

impl ActivationMeta {
    /// Rows of each point's tensor.
    pub fn rows(&self) -> usize {
        match &self.offsets {
            Some(o) => o.last().copied().unwrap_or(0) as usize,
            None => self.count,
        }
    }

    /// The tensor name of a point.
    pub fn tensor_name(layer: usize, site: Site) -> String {
        match site {
            Site::Residual => format!("layer.{layer}"),
            other => format!("layer.{layer}.{}", other.name()),
        }
    }

    fn to_strings(&self) -> Result<BTreeMap<String, String>> {
        let json = |v: &Vec<String>| {
            serde_json::to_string(v).map_err(|e| Error::InvalidInput(e.to_string()))
        };
        let mut m = BTreeMap::new();
        m.insert("format".into(), FORMAT.into());
        m.insert("model".into(), self.model.clone());
        m.insert("architecture".into(), self.architecture.clone());
        m.insert("n_layers".into(), self.n_layers.to_string());
        m.insert("d_model".into(), self.d_model.to_string());
        let points: Vec<String> = self
            .points
            .iter()
            .map(|(l, s)| format!("{l}:{}", s.name()))
            .collect();
        m.insert("points".into(), points.join(","));
        m.insert("pool".into(), self.pool.name().into());
        m.insert("dtype".into(), dtype_name(self.dtype)?.into());
        m.insert("count".into(), self.count.to_string());
        if let Some(t) = &self.texts {
            m.insert("texts".into(), json(t)?);
        }
        if let Some(t) = &self.ids {
            m.insert("ids".into(), json(t)?);
        }
        if let Some(t) = &self.labels {
            m.insert("labels".into(), json(t)?);
        }
        Ok(m)
    }

    fn from_strings(m: &HashMap<String, String>, path: &Path) -> Result<Self> {
        let bad = |what: String| Error::InvalidInput(format!("{}: {what}", path.display()));
        let get = |k: &str| {
            m.get(k)
                .ok_or_else(|| bad(format!("not an activation file: no {k:?} in its metadata")))
        };
        if get("format")? != FORMAT {
            return Err(bad(format!(
                "not an activation file: its format is {:?}, not {FORMAT:?}",
                get("format")?
            )));
        }
        let num = |k: &str| -> Result<usize> {
            get(k)?
                .parse()
                .map_err(|_| bad(format!("metadata {k:?} is not a number")))
        };
        let list = |k: &str| -> Result<Option<Vec<String>>> {
            m.get(k)
                .map(|s| {
                    serde_json::from_str(s).map_err(|e| {
                        bad(format!("metadata {k:?} is not a JSON list of strings: {e}"))
                    })
                })
                .transpose()
        };
        let mut points = Vec::new();
        for p in get("points")?.split(',') {
            let (l, s) = p
                .split_once(':')
                .ok_or_else(|| bad(format!("bad point {p:?}")))?;
            let l = l.parse().map_err(|_| bad(format!("bad point {p:?}")))?;
            points.push((l, Site::parse(s)?));
        }
        let dtype = match get("dtype")?.as_str() {
            "f32" => DType::F32,
            "f16" => DType::F16,
            "bf16" => DType::BF16,
            other => return Err(bad(format!("unknown dtype {other:?}"))),
        };
        Ok(Self {
            model: get("model")?.clone(),
            architecture: get("architecture")?.clone(),
            n_layers: num("n_layers")?,
            d_model: num("d_model")?,
            points,
            pool: Pool::parse(get("pool")?)?,
            dtype,
            count: num("count")?,
            offsets: None,
            texts: list("texts")?,
            ids: list("ids")?,
            labels: list("labels")?,
        })
    }
}

fn dtype_name(d: DType) -> Result<&'static str> {
    match d {
        DType::F32 => Ok("f32"),
        DType::F16 => Ok("f16"),
        DType::BF16 => Ok("bf16"),
        other => Err(Error::InvalidInput(format!(
            "activations are stored as f32, f16 or bf16, not {other}"
        ))),
    }
}

/// Writes an activation file row block by row block.
pub struct ActivationWriter {
    file: BufWriter<File>,
    path: PathBuf,
    /// Where each point's tensor data starts in the file.
    starts: Vec<u64>,
    rows: usize,
    d: usize,
    elem: usize,
    dtype: DType,
}

impl ActivationWriter {
    /// Creates `path` (`.safetensors`, or `.npy` with its `.json` beside
    /// it) for the tensors `meta` describes, and writes its header.
    pub fn create(path: &Path, meta: &ActivationMeta) -> Result<Self> {
        let io = |e: std::io::Error| Error::InvalidInput(format!("{}: {e}", path.display()));
        let dtype = meta.dtype;
        let elem = dtype.size_in_bytes();
        let rows = meta.rows();
        let d = meta.d_model;
        let block = (rows * d * elem) as u64;
        let npy = match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("npy") => true,
            Some(e) if e.eq_ignore_ascii_case("safetensors") => false,
            _ => {
                return Err(Error::InvalidInput(format!(
                    "{}: activations are written as .safetensors or .npy",
                    path.display()
                )));
            }
        };
        if npy && dtype == DType::BF16 {
            return Err(Error::InvalidInput(
                "numpy has no bf16: write bf16 activations as .safetensors".into(),
            ));
        }
        let strings = meta.to_strings()?;
        let header: Vec<u8> = if npy {
            let descr = if dtype == DType::F16 { "<f2" } else { "<f4" };
            let shape = format!("({}, {}, {})", meta.points.len(), rows, d);
            let mut h =
                format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
            // magic (6) + version (2) + length (2) + header + '\n', to a multiple of 64
            let pad = (64 - (10 + h.len() + 1) % 64) % 64;
            h.push_str(&" ".repeat(pad));
            h.push('\n');
            let mut out = b"\x93NUMPY\x01\x00".to_vec();
            out.extend_from_slice(&(h.len() as u16).to_le_bytes());
            out.extend_from_slice(h.as_bytes());
            let mut side: serde_json::Map<String, serde_json::Value> = strings
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect();
            if let Some(o) = &meta.offsets {
                side.insert("offsets".into(), serde_json::json!(o));
            }
            side.insert(
                "array".into(),
                "[points, rows, d] in the order of 'points'".into(),
            );
            std::fs::write(
                path.with_extension("json"),
                serde_json::to_vec_pretty(&side).map_err(|e| Error::InvalidInput(e.to_string()))?,
            )
            .map_err(io)?;
            out
        } else {
            let st_dtype = match dtype {
                DType::F32 => "F32",
                DType::F16 => "F16",
                _ => "BF16",
            };
            let mut h = serde_json::Map::new();
            h.insert("__metadata__".into(), serde_json::json!(strings));
            let mut at = 0u64;
            for &(l, s) in &meta.points {
                h.insert(
                    ActivationMeta::tensor_name(l, s),
                    serde_json::json!({"dtype": st_dtype, "shape": [rows, d], "data_offsets": [at, at + block]}),
                );
                at += block;
            }
            if let Some(o) = &meta.offsets {
                let n = (o.len() * 8) as u64;
                h.insert(
                    "offsets".into(),
                    serde_json::json!({"dtype": "I64", "shape": [o.len()], "data_offsets": [at, at + n]}),
                );
            }
            let mut text =
                serde_json::to_string(&h).map_err(|e| Error::InvalidInput(e.to_string()))?;
            while text.len() % 8 != 0 {
                text.push(' ');
            }
            let mut out = (text.len() as u64).to_le_bytes().to_vec();
            out.extend_from_slice(text.as_bytes());
            out
        };
        let file = File::create(path).map_err(io)?;
        let data_start = header.len() as u64;
        let points = meta.points.len() as u64;
        let offsets_len = if npy {
            0
        } else {
            meta.offsets.as_ref().map_or(0, |o| o.len() as u64 * 8)
        };
        file.set_len(data_start + points * block + offsets_len)
            .map_err(io)?;
        let mut file = BufWriter::new(file);
        file.write_all(&header).map_err(io)?;
        if let (false, Some(o)) = (npy, &meta.offsets) {
            file.seek(SeekFrom::Start(data_start + points * block))
                .map_err(io)?;
            for v in o {
                file.write_all(&(*v as i64).to_le_bytes()).map_err(io)?;
            }
        }
        Ok(Self {
            file,
            path: path.to_path_buf(),
            starts: (0..points).map(|p| data_start + p * block).collect(),
            rows,
            d,
            elem,
            dtype,
        })
    }

    /// Writes `data` (`[n, d]` f32, converted to the file's dtype) as rows
    /// `row..row + n` of point `point`.
    pub fn write_rows(&mut self, point: usize, row: usize, data: &[f32]) -> Result<()> {
        let n = data.len() / self.d.max(1);
        if point >= self.starts.len() || data.len() != n * self.d || row + n > self.rows {
            return Err(Error::InvalidInput(format!(
                "{}: rows {row}..{} of point {point} do not fit the file",
                self.path.display(),
                row + n
            )));
        }
        let mut bytes = Vec::with_capacity(data.len() * self.elem);
        match self.dtype {
            DType::F16 => data
                .iter()
                .for_each(|v| bytes.extend_from_slice(&f16::from_f32(*v).to_le_bytes())),
            DType::BF16 => data
                .iter()
                .for_each(|v| bytes.extend_from_slice(&bf16::from_f32(*v).to_le_bytes())),
            _ => data
                .iter()
                .for_each(|v| bytes.extend_from_slice(&v.to_le_bytes())),
        }
        let at = self.starts[point] + (row * self.d * self.elem) as u64;
        let io = |e: std::io::Error| Error::InvalidInput(format!("{}: {e}", self.path.display()));
        self.file.seek(SeekFrom::Start(at)).map_err(io)?;
        self.file.write_all(&bytes).map_err(io)
    }

    /// Flushes the file.
    pub fn finish(mut self) -> Result<()> {
        let path = self.path.clone();
        self.file
            .flush()
            .and_then(|_| self.file.get_ref().sync_all())
            .map_err(|e| Error::InvalidInput(format!("{}: {e}", path.display())))
    }
}

/// An activation file opened for reading (the safetensors form).
pub struct ActivationFile {
    file: SafetensorsFile,
    pub meta: ActivationMeta,
}

impl ActivationFile {
    pub fn open(path: &Path) -> Result<Self> {
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("npy"))
        {
            return Err(Error::InvalidInput(format!(
                "{}: read the .safetensors form of activations (the .npy form is for numpy)",
                path.display()
            )));
        }
        let file = SafetensorsFile::open(path)?;
        let empty = HashMap::new();
        let mut meta = ActivationMeta::from_strings(file.user_metadata().unwrap_or(&empty), path)?;
        if meta.pool == Pool::All {
            let (m, bytes) = file.raw("offsets")?;
            if m.dtype != safetensors::Dtype::I64 || m.shape != [meta.count + 1] {
                return Err(Error::InvalidInput(format!(
                    "{}: offsets is {:?} {:?}, expected I64 [{}]",
                    path.display(),
                    m.dtype,
                    m.shape,
                    meta.count + 1
                )));
            }
            let offsets: Vec<u64> = bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])).max(0) as u64)
                .collect();
            if offsets.windows(2).any(|w| w[1] < w[0]) {
                return Err(Error::InvalidInput(format!(
                    "{}: offsets are not increasing",
                    path.display()
                )));
            }
            meta.offsets = Some(offsets);
        }
        for &(l, s) in &meta.points {
            let name = ActivationMeta::tensor_name(l, s);
            let shape = file.meta(&name).map(|m| m.shape);
            if shape.as_deref() != Some(&[meta.rows(), meta.d_model][..]) {
                return Err(Error::InvalidInput(format!(
                    "{}: tensor {name} is {shape:?}, its metadata says [{}, {}]",
                    path.display(),
                    meta.rows(),
                    meta.d_model
                )));
            }
        }
        Ok(Self { file, meta })
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The states of one point, `[rows, d]`, on `device` in `dtype`.
    pub fn load(&self, layer: usize, site: Site, device: &Device, dtype: DType) -> Result<Tensor> {
        if !self.meta.points.contains(&(layer, site)) {
            let have: Vec<String> = self
                .meta
                .points
                .iter()
                .map(|(l, s)| format!("{l}:{}", s.name()))
                .collect();
            return Err(Error::InvalidInput(format!(
                "{}: layer {layer} ({}) was not captured; the file has {}",
                self.path().display(),
                site.name(),
                have.join(", ")
            )));
        }
        self.file
            .load(&ActivationMeta::tensor_name(layer, site), device, dtype)
    }
}
