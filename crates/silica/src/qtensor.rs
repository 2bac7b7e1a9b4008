//! `QTensor`: a weight matrix kept in a GGML block format on its device,
//! and the product `x @ wᵀ` that dequantizes inside the kernel.

use std::borrow::Cow;

use crate::backend::cpu::packed;
use crate::dispatch::run;
use crate::quant::QuantFormat;
use crate::storage::{CpuStorage, Storage};
use crate::{DType, Device, Error, Op, QFusion, Result, Tensor};

/// A 2-D weight matrix `[rows, cols]` stored in a block format, rows of
/// whole blocks one after the other, exactly as in a GGUF file.
///
/// The blocks go to the device as they are (no dequantized copy exists in
/// host or device memory); [`Tensor::matmul_q`] dequantizes inside its
/// kernel. The raw bytes are held as a `U32` tensor of the padded byte
/// length, so device memory accounting, transfers and the CPU fallback work
/// as for any tensor.
///
/// ```
/// use silica::{DType, Device, QTensor, QuantFormat, Tensor};
/// let dev = Device::cpu();
/// let w = Tensor::randn(&[8, 64], DType::F32, 1, &dev)?;
/// let q = QTensor::quantize(&w, QuantFormat::Q8_0)?;
/// let x = Tensor::randn(&[2, 64], DType::F32, 2, &dev)?;
/// let y = x.matmul_q(&q)?; // [2, 8], close to x.matmul(&w.t()?)
/// assert_eq!(y.shape(), &[2, 8]);
/// # Ok::<(), silica::Error>(())
/// ```
#[derive(Clone)]
pub struct QTensor {
    words: Tensor,
    format: QuantFormat,
    rows: usize,
    cols: usize,
}

impl std::fmt::Debug for QTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QTensor([{}, {}], {}, {})",
            self.rows,
            self.cols,
            self.format,
            self.device()
        )
    }
}

/// Checks that `[rows, cols]` of `format` fits a u32-indexed device buffer
/// and is whole blocks per row; returns the byte length.
fn byte_len(format: QuantFormat, rows: usize, cols: usize) -> Result<usize> {
    let op = "QTensor";
    if !cols.is_multiple_of(format.block_elems()) {
        return Err(Error::InvalidArgument {
            op,
            msg: format!(
                "rows of {cols} values are not whole {format} blocks of {}",
                format.block_elems()
            ),
        });
    }
    rows.checked_mul(format.bytes_for(cols))
        .filter(|&n| n < u32::MAX as usize - 8)
        .ok_or_else(|| Error::InvalidArgument {
            op,
            msg: format!("[{rows}, {cols}] {format} exceeds the 4 GiB buffer limit"),
        })
}

impl QTensor {
    /// A matrix of `shape` `[rows, cols]` from its blocks (`bytes`, exactly
    /// `rows * cols / block_elems * block_bytes` of them), on `device`.
    pub fn from_bytes(
        format: QuantFormat,
        shape: &[usize],
        bytes: &[u8],
        device: &Device,
    ) -> Result<QTensor> {
        let &[rows, cols] = shape else {
            return Err(Error::InvalidArgument {
                op: "QTensor",
                msg: format!("a quantized matrix has 2 dimensions, got shape {shape:?}"),
            });
        };
        let len = byte_len(format, rows, cols)?;
        if bytes.len() != len {
            return Err(Error::InvalidArgument {
                op: "QTensor",
                msg: format!(
                    "[{rows}, {cols}] in {format} takes {len} bytes, {} were given",
                    bytes.len()
                ),
            });
        }
        let n_words = len.div_ceil(4);
        let mut shape = vec![n_words];
        let storage = match device {
            Device::Cpu => {
                let mut words = vec![0u32; n_words];
                let dst = &mut bytemuck::cast_slice_mut::<u32, u8>(&mut words)[..len];
                if let Some(tile) = packed::tile_rows(format, rows, cols) {
                    // tiles of rows for the CPU's kernels, marked by the
                    // shape [tiles, words a tile]
                    packed::pack(format, tile, bytes, rows, cols / format.block_elems(), dst);
                    shape = vec![rows / tile, n_words / (rows / tile)];
                } else {
                    dst.copy_from_slice(bytes);
                }
                Storage::host(CpuStorage::U32(words))?
            }
            // straight from the caller's bytes (a memory-mapped file) to the device
            Device::Gpu(g) => Storage::Gpu(g.upload_bytes(bytes)?),
        };
        Ok(QTensor {
            words: Tensor::from_parts(storage, &shape, DType::U32, device.clone()),
            format,
            rows,
            cols,
        })
    }

    /// Quantizes a 2-D float tensor with ggml's reference quantizer of
    /// `format` (Q8_0, Q4_0 and Q4_1), on its device.
    pub fn quantize(t: &Tensor, format: QuantFormat) -> Result<QTensor> {
        let op = "QTensor::quantize";
        if t.rank() != 2 || !t.dtype().is_float() {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "needs a 2-D float tensor, got {:?} {}",
                    t.shape(),
                    t.dtype()
                ),
            });
        }
        byte_len(format, t.shape()[0], t.shape()[1])?;
        let values: Vec<f32> = t.to_dtype(DType::F32)?.to_vec()?;
        let bytes = match format {
            QuantFormat::Q8_0 => crate::quant::quantize_q8_0(&values),
            QuantFormat::Q4_0 => crate::quant::quantize_q4_0(&values),
            QuantFormat::Q4_1 => crate::quant::quantize_q4_1(&values),
            other => {
                return Err(Error::InvalidArgument {
                    op,
                    msg: format!("silica has no quantizer for {other} (it reads them from GGUF)"),
                });
            }
        };
        QTensor::from_bytes(format, t.shape(), &bytes, t.device())
    }

    /// Random blocks of `format` (`[rows, cols]`), seeded: random quants,
    /// and scales drawn so that the values are of order one. For tests and
    /// benchmarks of the formats silica cannot quantize to.
    pub fn random(
        format: QuantFormat,
        shape: &[usize],
        seed: u64,
        device: &Device,
    ) -> Result<QTensor> {
        use rand::{Rng, SeedableRng};
        let len = match shape {
            &[rows, cols] => byte_len(format, rows, cols)?,
            _ => 0, // from_bytes reports the shape
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut bytes = vec![0u8; len];
        rng.fill(&mut bytes[..]);
        let bb = format.block_bytes();
        // (byte offset, largest magnitude of the quants times sub-scales)
        let scales: &[(usize, f32)] = match format {
            QuantFormat::Q8_0 => &[(0, 127.0)],
            QuantFormat::Q4_0 => &[(0, 8.0)],
            QuantFormat::Q4_1 => &[(0, 15.0), (2, -2.0)],
            QuantFormat::Q5_0 => &[(0, 16.0)],
            QuantFormat::Q5_1 => &[(0, 31.0), (2, -2.0)],
            QuantFormat::Q4_K => &[(0, 15.0 * 63.0), (2, 63.0)],
            QuantFormat::Q5_K => &[(0, 31.0 * 63.0), (2, 63.0)],
            QuantFormat::Q6_K => &[(208, 32.0 * 127.0)],
        };
        for block in bytes.chunks_exact_mut(bb) {
            for &(at, range) in scales {
                let v = rng.random_range(0.5f32..1.5) / range;
                block[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
            }
        }
        QTensor::from_bytes(format, shape, &bytes, device)
    }

    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// `[rows, cols]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    pub fn device(&self) -> &Device {
        self.words.device()
    }

    /// Bytes of the blocks (without the padding to a whole word).
    pub fn size_in_bytes(&self) -> usize {
        self.rows * self.format.bytes_for(self.cols)
    }

    /// The blocks, as in the file.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let words: Vec<u32> = self.words.to_vec()?;
        let mut bytes: Vec<u8> = bytemuck::cast_slice(&words).to_vec();
        bytes.truncate(self.size_in_bytes());
        if let &[tiles, _] = self.words.shape() {
            return Ok(packed::unpack(
                self.format,
                self.rows / tiles,
                &bytes,
                self.rows,
                self.cols / self.format.block_elems(),
            ));
        }
        Ok(bytes)
    }

    /// The matrix decoded to a float tensor of `dtype` on the same device
    /// (decoded on the host: a reference and a fallback, not a fast path).
    pub fn dequantize(&self, dtype: DType) -> Result<Tensor> {
        let values = crate::quant::dequantize(self.format, &self.to_bytes()?);
        Tensor::from_vec(values, &[self.rows, self.cols], &Device::Cpu)?
            .to_dtype(dtype)?
            .to_device(self.device())
    }

    /// The same blocks on `device`.
    pub fn to_device(&self, device: &Device) -> Result<QTensor> {
        if self.device().same(device) {
            return Ok(self.clone());
        }
        QTensor::from_bytes(self.format, &self.shape(), &self.to_bytes()?, device)
    }

    /// The matrices stacked along the rows, `[Σ rows, cols]` (one format,
    /// one row length, one device), as one buffer: what fuses the Q/K/V or
    /// gate/up projections into one product.
    pub fn cat_rows(parts: &[&QTensor]) -> Result<QTensor> {
        let op = "QTensor::cat_rows";
        let Some(first) = parts.first() else {
            return Err(Error::InvalidArgument {
                op,
                msg: "nothing to concatenate".into(),
            });
        };
        let mut bytes = Vec::new();
        let mut rows = 0;
        for p in parts {
            if p.format != first.format || p.cols != first.cols {
                return Err(Error::InvalidArgument {
                    op,
                    msg: format!(
                        "[{}, {}] {} and [{}, {}] {} differ in format or row length",
                        first.rows, first.cols, first.format, p.rows, p.cols, p.format
                    ),
                });
            }
            first.words.same_device(&p.words, op)?;
            bytes.extend_from_slice(&p.to_bytes()?);
            rows += p.rows;
        }
        QTensor::from_bytes(first.format, &[rows, first.cols], &bytes, first.device())
    }
}

impl QTensor {
    /// Rows `ids` (1-D, `U32` or `I64`) of the matrix, decoded to `dtype`:
    /// `[ids.len(), cols]`, the embedding lookup of a quantized table. An id
    /// outside the rows is an error on the CPU and gives a row of zeros on a
    /// GPU, as with [`Tensor::index_select`].
    pub fn embedding(&self, ids: &Tensor, dtype: DType) -> Result<Tensor> {
        let op = "embedding_q";
        self.words.same_device(ids, op)?;
        if ids.rank() != 1 || !matches!(ids.dtype(), DType::U32 | DType::I64) {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "ids must be 1-D u32 or i64, not {:?} {}",
                    ids.shape(),
                    ids.dtype()
                ),
            });
        }
        if !dtype.is_float() {
            return Err(Error::UnsupportedDType { op, dtype });
        }
        let ids = ids.to_dtype(DType::U32)?.contiguous()?;
        run(
            Op::QRows {
                format: self.format,
                k: self.cols,
            },
            &[&ids, &self.words],
            vec![ids.numel(), self.cols],
            dtype,
        )
    }
}

/// What [`Tensor::matmul_q_fused`] does around the product `x @ wᵀ`: the
/// steps of a transformer block that surround its projections, done in the
/// product's kernel where the device has one for them (a GPU, where the
/// GEMV kernels take the product: decode, short prompts, a server's
/// steps), and as separate ops otherwise.
#[derive(Clone, Copy, Debug, Default)]
pub struct QFuse<'a> {
    /// `x.rms_norm(weight, eps)` in place of `x`.
    pub rms_norm: Option<(&'a Tensor, f32)>,
    /// `w` holds two stacked matrices `[2n, k]` (gate, then up): the result
    /// is `silu(x @ gateᵀ) * (x @ upᵀ)`, `[.., n]`.
    pub swiglu: bool,
    /// As `swiglu`, with `gelu_tanh` in place of `silu` (GeGLU, Gemma's
    /// feed-forward); not with `swiglu`.
    pub geglu: bool,
    /// Added to the result (same shape and dtype as the result).
    pub residual: Option<&'a Tensor>,
    /// A low-rank update `(u, b)` added to the product before the SwiGLU:
    /// `u @ b` with `u [.., r]` in f32 (as [`Tensor::project_low_rank`]
    /// gives it, one row per row of `self`) and `b [r, rows of w]` in
    /// `self`'s dtype. A LoRA adapter's update of this projection.
    pub low_rank: Option<(&'a Tensor, &'a Tensor)>,
    /// As `low_rank`, with the product computing u itself: `(a, b)` adds
    /// `self.project_low_rank(a, eps) @ b`, `eps` the `rms_norm`'s where
    /// it is set (its weight folded into `a`, as for
    /// [`Tensor::project_low_rank`]), `a [r, k]` and `b [r, rows of w]` in
    /// `self`'s dtype. On a GPU, where the GEMV kernels take the product
    /// and `a` is small (rank times K up to 32,768), each workgroup
    /// computes u for its rows, which saves a dispatch per product;
    /// elsewhere it is `project_low_rank` and then the product. Not with
    /// `low_rank`.
    pub low_rank_a: Option<(&'a Tensor, &'a Tensor)>,
}

impl Tensor {
    /// `self @ wᵀ` for a quantized weight `w` of shape `[n, k]` stored as
    /// checkpoints store linear layers: `self` is `[.., k]` (any float
    /// dtype), the result `[.., n]` in the same dtype. The blocks are
    /// decoded inside the kernel (GEMV for up to 8 rows, and in chunks of 8
    /// up to `GpuFeatures::gemv_rows` on narrow enough products; tiled
    /// otherwise).
    pub fn matmul_q(&self, w: &QTensor) -> Result<Tensor> {
        self.matmul_q_fused(w, QFuse::default())
    }

    /// `self @ aᵀ` in f32 for a short, wide `a [r, k]` (`self` is `[.., k]`
    /// in `a`'s dtype), of `self`'s rows RMS-normed first (without a
    /// weight: fold it into `a`) where `rms_eps` is given: the first half
    /// of a low-rank update, whose second half [`QFuse::low_rank`] adds to
    /// a quantized product. On a GPU, for up to 8 rows, one kernel with a
    /// workgroup per output element (a matmul would give a rank-wide
    /// output few workgroups).
    ///
    /// ```
    /// use silica::{DType, Device, Tensor};
    /// let dev = Device::cpu();
    /// let x = Tensor::randn(&[1, 64], DType::F32, 1, &dev)?;
    /// let a = Tensor::randn(&[4, 64], DType::F32, 2, &dev)?;
    /// let u = x.project_low_rank(&a, None)?; // [1, 4]
    /// let want = x.matmul(&a.t()?)?;
    /// let diff = u.sub(&want)?.abs()?.max(-1, false)?.to_vec::<f32>()?;
    /// assert!(diff[0] < 1e-4);
    /// # Ok::<(), silica::Error>(())
    /// ```
    pub fn project_low_rank(&self, a: &Tensor, rms_eps: Option<f32>) -> Result<Tensor> {
        let op = "project_low_rank";
        self.same_device(a, op)?;
        let k = self.shape().last().copied().unwrap_or(0);
        if self.rank() == 0 || a.rank() != 2 || a.shape()[1] != k || a.shape()[0] == 0 {
            return Err(Error::ShapeMismatch {
                op,
                lhs: self.shape().to_vec(),
                rhs: a.shape().to_vec(),
                hint: format!("x @ aᵀ needs x [.., k] and a [r, k] with r > 0, k = {k}"),
            });
        }
        if !self.dtype().is_float() || a.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: self.dtype(),
                rhs: a.dtype(),
            });
        }
        let x = self.contiguous()?;
        let a = a.contiguous()?;
        let fused = crate::fused::LowRankIn { rms_eps };
        crate::custom::apply(&fused, &[&x, &a])
    }

    /// A quantized product with the steps around it that `fuse` names:
    /// `residual + swiglu(rms_norm(self) @ wᵀ)`, each part optional (see
    /// [`QFuse`]). The result is `[.., n]` in `self`'s dtype, `n` the rows
    /// of `w` (half of them with `swiglu`). On a GPU, where the GEMV
    /// kernels take the product (see [`Tensor::matmul_q`]), the whole is
    /// one kernel; elsewhere it is the same ops one after the other.
    ///
    /// ```
    /// use silica::{DType, Device, QFuse, QTensor, QuantFormat, Tensor};
    /// let dev = Device::cpu();
    /// let w = Tensor::randn(&[16, 64], DType::F32, 1, &dev)?;
    /// let gate_up = QTensor::quantize(&w, QuantFormat::Q8_0)?;
    /// let x = Tensor::randn(&[1, 64], DType::F32, 2, &dev)?;
    /// let g = Tensor::ones(&[64], DType::F32, &dev)?;
    /// let r = Tensor::randn(&[1, 8], DType::F32, 3, &dev)?;
    /// let fuse = QFuse { rms_norm: Some((&g, 1e-5)), swiglu: true, residual: Some(&r), ..QFuse::default() };
    /// let y = x.matmul_q_fused(&gate_up, fuse)?; // [1, 8]
    /// let h = x.rms_norm(&g, 1e-5)?.matmul_q(&gate_up)?;
    /// let want = h.narrow(1, 0, 8)?.swiglu(&h.narrow(1, 8, 8)?)?.add(&r)?;
    /// let diff = y.sub(&want)?.abs()?.max(-1, false)?.to_vec::<f32>()?;
    /// assert!(diff[0] < 1e-4);
    /// # Ok::<(), silica::Error>(())
    /// ```
    pub fn matmul_q_fused(&self, w: &QTensor, fuse: QFuse<'_>) -> Result<Tensor> {
        if let (Some((a, b)), None) = (fuse.low_rank_a, fuse.low_rank) {
            let k = self.shape().last().copied().unwrap_or(0);
            let rows = self.numel() / k.max(1);
            let r = a.shape().first().copied().unwrap_or(0);
            // (a prefill in f16 keeps `a`: qmatmul_composed projects in f16)
            let prefill16 =
                self.dtype() == DType::F16 && prefill_product(self, w.format, rows, w.rows, k);
            if !prefill16
                && (r * k > LORA_IN_WORK
                    || rows.min(8) * r > crate::backend::gpu::qmatmul::LORA_IN_MAX)
            {
                // too much for every workgroup to project again: u first
                let u = self.project_low_rank(a, fuse.rms_norm.map(|n| n.1))?;
                let fuse = QFuse {
                    low_rank: Some((&u, b)),
                    low_rank_a: None,
                    ..fuse
                };
                return self.matmul_q_fused(w, fuse);
            }
        }
        let plain = fuse.rms_norm.is_none()
            && !fuse.swiglu
            && !fuse.geglu
            && fuse.residual.is_none()
            && fuse.low_rank.is_none()
            && fuse.low_rank_a.is_none();
        let op = if plain { "matmul_q" } else { "matmul_q_fused" };
        self.same_device(&w.words, op)?;
        let k = self.shape().last().copied().unwrap_or(0);
        if self.rank() == 0 || k != w.cols {
            return Err(Error::ShapeMismatch {
                op,
                lhs: self.shape().to_vec(),
                rhs: w.shape().to_vec(),
                hint: format!(
                    "x @ wᵀ needs x [.., {}] for w [{}, {}]",
                    w.cols, w.rows, w.cols
                ),
            });
        }
        if fuse.swiglu && fuse.geglu {
            return Err(Error::InvalidArgument {
                op,
                msg: "swiglu and geglu are two gates: set one".into(),
            });
        }
        let n = if fuse.swiglu || fuse.geglu {
            if !w.rows.is_multiple_of(2) {
                return Err(Error::InvalidArgument {
                    op,
                    msg: format!(
                        "a gated product needs gate and up stacked in w, an even row count, not {}",
                        w.rows
                    ),
                });
            }
            w.rows / 2
        } else {
            w.rows
        };
        let mut out_shape = self.shape().to_vec();
        let last = out_shape.len() - 1;
        out_shape[last] = n;
        // borrowed where no copy is needed: a decode step records hundreds
        // of these products, and a clone of a tensor is not free
        let mut inputs = vec![aligned_rows(self)?, Cow::Borrowed(&w.words)];
        if let Some((g, _)) = fuse.rms_norm {
            self.same_device(g, op)?;
            if g.shape() != [k] || g.dtype() != self.dtype() {
                return Err(Error::InvalidArgument {
                    op,
                    msg: format!(
                        "the norm weight is {:?} {}, expected [{k}] {}",
                        g.shape(),
                        g.dtype(),
                        self.dtype()
                    ),
                });
            }
            inputs.push(aligned_rows(g)?);
        }
        if let Some(r) = fuse.residual {
            self.same_device(r, op)?;
            if r.shape() != out_shape || r.dtype() != self.dtype() {
                return Err(Error::InvalidArgument {
                    op,
                    msg: format!(
                        "the residual is {:?} {}, expected {out_shape:?} {}",
                        r.shape(),
                        r.dtype(),
                        self.dtype()
                    ),
                });
            }
            inputs.push(if r.is_contiguous() {
                Cow::Borrowed(r)
            } else {
                Cow::Owned(r.contiguous()?)
            });
        }
        if let Some((u, b)) = fuse.low_rank {
            self.same_device(u, op)?;
            self.same_device(b, op)?;
            let r = u.shape().last().copied().unwrap_or(0);
            let rows_of_u = u.shape()[..u.rank().saturating_sub(1)].to_vec();
            let fits = u.rank() == self.rank()
                && rows_of_u == self.shape()[..self.rank() - 1]
                && u.dtype() == DType::F32
                && r > 0
                && b.shape() == [r, w.rows]
                && b.dtype() == self.dtype();
            if !fits {
                return Err(Error::InvalidArgument {
                    op,
                    msg: format!(
                        "the low-rank update needs u [.., r] f32 with x's rows and b [r, {}] {}, not u {:?} {} and b {:?} {}",
                        w.rows,
                        self.dtype(),
                        u.shape(),
                        u.dtype(),
                        b.shape(),
                        b.dtype()
                    ),
                });
            }
            inputs.push(from_start(u)?);
            inputs.push(from_start(b)?);
        }
        if let Some((a, b)) = fuse.low_rank_a {
            self.same_device(a, op)?;
            self.same_device(b, op)?;
            let r = a.shape().first().copied().unwrap_or(0);
            let fits = fuse.low_rank.is_none()
                && a.rank() == 2
                && r > 0
                && a.shape()[1] == k
                && a.dtype() == self.dtype()
                && b.shape() == [r, w.rows]
                && b.dtype() == self.dtype();
            if !fits {
                return Err(Error::InvalidArgument {
                    op,
                    msg: format!(
                        "the low-rank update needs a [r, {k}] and b [r, {}] in {} (and no u beside them), not a {:?} {} and b {:?} {}",
                        w.rows,
                        self.dtype(),
                        a.shape(),
                        a.dtype(),
                        b.shape(),
                        b.dtype()
                    ),
                });
            }
            inputs.push(from_start(a)?);
            inputs.push(from_start(b)?);
        }
        let refs: Vec<&Tensor> = inputs.iter().map(|t| t.as_ref()).collect();
        if plain {
            let op = Op::QMatmul { format: w.format };
            return run(op, &refs, out_shape, self.dtype());
        }
        let fused = crate::fused::FusedQMatmul {
            format: w.format,
            fusion: QFusion {
                rms_norm: fuse.rms_norm.map(|(_, eps)| eps),
                swiglu: fuse.swiglu,
                geglu: fuse.geglu,
                residual: fuse.residual.is_some(),
                low_rank: fuse.low_rank.is_some() || fuse.low_rank_a.is_some(),
                project: fuse.low_rank_a.is_some(),
            },
            out_shape,
        };
        crate::custom::apply(&fused, &refs)
    }
}

/// Multiply-adds of `x·aᵀ` per row of x (rank times K) up to which
/// [`QFuse::low_rank_a`] is computed by each workgroup of the product:
/// SmolLM2's products with a rank-16 adapter (at most its stacked Q/K/V's
/// rank 48 × K 576 = 27,648), not a 1B model's (its output projection's
/// 16 × 2,048 = 32,768 and up), whose workgroups would each read more of
/// `a` than the separate projection's dispatch costs (docs/tuning.md,
/// "LoRA's u in the GEMV").
const LORA_IN_WORK: usize = 28 * 1024;

/// `t` if it is contiguous from its buffer's first element, a copy
/// otherwise: the low-rank operands, which the GEMV kernels read whole
/// from element 0 (a's rows then start at whole words).
fn from_start(t: &Tensor) -> Result<Cow<'_, Tensor>> {
    if t.is_contiguous() && t.layout().offset() == 0 {
        Ok(Cow::Borrowed(t))
    } else {
        Ok(Cow::Owned(t.copy()?))
    }
}

/// `t` if it is contiguous from a multiple of 8 elements (the quantized
/// kernels read rows as whole vec4 words, 8 elements covering f32 and the
/// 16-bit types), a copy otherwise.
fn aligned_rows(t: &Tensor) -> Result<Cow<'_, Tensor>> {
    if t.is_contiguous() && t.layout().offset().is_multiple_of(8) {
        Ok(Cow::Borrowed(t))
    } else {
        Ok(Cow::Owned(t.copy()?))
    }
}

/// Whether a quantized product of `m` rows of f16 x with `weight_rows` rows
/// of `k` values counts as a prefill: where the GPU launcher takes it on
/// its cooperative-matrix kernel (every product from
/// [`crate::backend::gpu::qmatmul::COOP_MIN_M`] rows, wide ones from fewer
/// on an adapter with cooperative matrices).
fn prefill_product(
    x: &Tensor,
    format: QuantFormat,
    m: usize,
    weight_rows: usize,
    k: usize,
) -> bool {
    m >= crate::backend::gpu::qmatmul::COOP_MIN_M
        || match x.device() {
            crate::Device::Gpu(g) => g.narrow_coop(format, m, weight_rows, k),
            crate::Device::Cpu => false,
        }
}

/// A fused quantized product (`FusedQMatmul`'s operands) as separate ops:
/// where no kernel fuses it, and the CPU reference. Like the fused
/// kernel, it computes in f32 and rounds to the dtype once, at the end;
/// except a prefill in f16 (see `prefill_product`), which runs every
/// op in f16 as a dense f16 model does, so that a GPU takes the product on
/// tensor cores (qmatmul_coop.wgsl) and the ops around it move half the
/// bytes.
pub(crate) fn qmatmul_composed(
    format: QuantFormat,
    fusion: QFusion,
    inputs: &[&Tensor],
) -> Result<Tensor> {
    let dtype = inputs[0].dtype();
    let k = inputs[0].shape().last().copied().unwrap_or(0);
    let w = inputs[1];
    // the blocks are padded to whole words only: the floor is the row count
    let rows = (w.numel() * 4) / format.bytes_for(k).max(1);
    let m = inputs[0].numel() / k.max(1);
    let prefill16 = dtype == DType::F16 && prefill_product(inputs[0], format, m, rows, k);
    // the compute dtype
    let ct = if prefill16 { DType::F16 } else { DType::F32 };
    let cast = |t: &Tensor| t.to_dtype(ct);
    let mut x = cast(inputs[0])?;
    let mut next = 2;
    if let Some(eps) = fusion.rms_norm {
        x = x.rms_norm(&cast(inputs[2])?, eps)?;
        next += 1;
    }
    let mut shape = x.shape().to_vec();
    let last = shape.len() - 1;
    shape[last] = rows;
    let plain = Op::QMatmul { format };
    let mut y = run(plain, &[aligned_rows(&x)?.as_ref(), w], shape, ct)?;
    let residual = fusion.residual.then(|| inputs[next]);
    next += fusion.residual as usize;
    if fusion.low_rank {
        let u = match fusion.project {
            // a prefill in f16 projects in f16 too: on tensor cores, without
            // copies to f32
            true if prefill16 => {
                let x = inputs[0];
                let x = match fusion.rms_norm {
                    Some(eps) => x.rms_norm(&Tensor::ones(&[k], DType::F16, x.device())?, eps)?,
                    None => x.clone(),
                };
                x.matmul(&inputs[next].t()?)?
            }
            true => inputs[0].project_low_rank(inputs[next], fusion.rms_norm)?,
            false => inputs[next].clone(),
        };
        y = y.add(&cast(&u)?.matmul(&cast(inputs[next + 1])?)?)?;
    }
    if fusion.gated() {
        let n = rows / 2;
        let (gate, up) = (y.narrow(-1, 0, n)?, y.narrow(-1, n, n)?);
        y = if fusion.geglu {
            gate.gelu_tanh()?.mul(&up)?
        } else {
            gate.swiglu(&up)?
        };
    }
    if let Some(r) = residual {
        y = y.add(&cast(r)?)?;
    }
    y.to_dtype(dtype)
}
