//! Shapes, strides and offsets: how a tensor's logical elements map onto its storage.

use crate::{Error, Result};

/// Where the elements of a tensor sit in its storage: element `(i0, i1, ..)`
/// is at `offset + i0 * strides[0] + i1 * strides[1] + ..` (in elements).
///
/// Views (transpose, narrow, broadcast, ...) only build a new `Layout`; they
/// never touch the data. A stride of 0 repeats an element (broadcasting).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

/// Largest number of elements a shape may describe: a tensor of 8-byte
/// elements must stay addressable with `isize`.
const MAX_ELEMENTS: usize = isize::MAX as usize / 8;

/// Checks that `shape` is one a tensor can have and returns its number of
/// elements. Not only the element count must fit: the product of the
/// non-zero dimensions must too, since the strides of a contiguous layout
/// are products of the trailing dimensions whether or not another one is 0
/// (`[0, 2^40, 2^40]` holds no element but its strides overflow).
pub fn check_shape(op: &'static str, shape: &[usize]) -> Result<usize> {
    let span = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d.max(1)))
        .filter(|&n| n <= MAX_ELEMENTS);
    match span {
        Some(_) => Ok(numel(shape)),
        None => Err(Error::InvalidArgument {
            op,
            msg: format!("shape {shape:?} has too many elements"),
        }),
    }
}

/// Row-major strides of a contiguous tensor of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// Number of elements of `shape` (1 for a scalar).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Numpy's broadcasting rule: align from the right; sizes must match or be 1.
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i < rank - a.len() {
            1
        } else {
            a[i - (rank - a.len())]
        };
        let db = if i < rank - b.len() {
            1
        } else {
            b[i - (rank - b.len())]
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: a.to_vec(),
                    rhs: b.to_vec(),
                    hint: format!("dimension {i} of the broadcast: {da} vs {db}"),
                });
            }
        };
    }
    check_shape(op, &out)?;
    Ok(out)
}

/// Turns a possibly negative dimension index into `0..rank`.
pub fn normalize_dim(op: &'static str, dim: isize, shape: &[usize]) -> Result<usize> {
    let rank = shape.len() as isize;
    let d = if dim < 0 { dim + rank } else { dim };
    if d < 0 || d >= rank {
        return Err(Error::DimOutOfRange {
            op,
            dim,
            shape: shape.to_vec(),
        });
    }
    Ok(d as usize)
}

impl Layout {
    /// A contiguous row-major layout starting at element 0.
    pub fn contiguous(shape: &[usize]) -> Self {
        Self {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    /// A layout from its parts; the caller guarantees it stays inside the storage.
    pub(crate) fn new(shape: Vec<usize>, strides: Vec<usize>, offset: usize) -> Self {
        debug_assert_eq!(shape.len(), strides.len());
        Self {
            shape,
            strides,
            offset,
        }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    /// Offset of the first element, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// True when the elements are in row-major order without gaps (the
    /// offset may be non-zero). Size-1 dimensions may have any stride.
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
            if n != 1 && s != expected {
                return false;
            }
            expected *= n;
        }
        true
    }

    /// The number of storage elements this layout may touch, counted from 0
    /// (`offset` + the farthest reachable element + 1); 0 when empty.
    pub fn storage_extent(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        self.offset
            + self
                .shape
                .iter()
                .zip(&self.strides)
                .map(|(&n, &s)| (n - 1) * s)
                .sum::<usize>()
            + 1
    }

    /// Swaps two dimensions.
    pub fn transpose(&self, d0: usize, d1: usize) -> Self {
        let mut l = self.clone();
        l.shape.swap(d0, d1);
        l.strides.swap(d0, d1);
        l
    }

    /// Reorders dimensions: dimension `i` of the result is `perm[i]` of `self`.
    pub fn permute(&self, perm: &[usize]) -> Self {
        Self {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        }
    }

    /// Keeps `len` entries of dimension `dim` starting at `start`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Self {
        let mut l = self.clone();
        if len > 0 {
            l.offset += start * self.strides[dim];
        }
        l.shape[dim] = len;
        l
    }

    /// Broadcasts to `shape` (already checked compatible): new leading
    /// dimensions and size-1 dimensions get stride 0.
    pub fn broadcast_to(&self, shape: &[usize]) -> Self {
        let extra = shape.len() - self.rank();
        let mut strides = vec![0; shape.len()];
        for (i, &n) in shape.iter().enumerate().skip(extra) {
            let src = i - extra;
            strides[i] = if self.shape[src] == n {
                self.strides[src]
            } else {
                0
            };
        }
        Self {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        }
    }

    /// Inserts a size-1 dimension at `dim` (`0..=rank`).
    pub fn unsqueeze(&self, dim: usize) -> Self {
        let mut l = self.clone();
        let stride = if dim < self.rank() {
            self.strides[dim] * self.shape[dim]
        } else {
            1
        };
        l.shape.insert(dim, 1);
        l.strides.insert(dim, stride);
        l
    }

    /// Removes dimension `dim`, which must have size 1.
    pub fn squeeze(&self, dim: usize) -> Self {
        let mut l = self.clone();
        l.shape.remove(dim);
        l.strides.remove(dim);
        l
    }

    /// The same elements seen with `shape` without copying, when the strides
    /// allow it (always for contiguous layouts); `None` when a copy is needed.
    pub fn reshape(&self, shape: &[usize]) -> Option<Self> {
        if self.is_contiguous() {
            return Some(Self {
                shape: shape.to_vec(),
                strides: contiguous_strides(shape),
                offset: self.offset,
            });
        }
        // Group the old dimensions into chunks that are contiguous among
        // themselves, and map each new dimension onto one chunk.
        let old: Vec<(usize, usize)> = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|(n, _)| **n != 1)
            .map(|(&n, &s)| (n, s))
            .collect();
        let mut new_strides = vec![0; shape.len()];
        let mut oi = 0;
        let mut ni = 0;
        while ni < shape.len() {
            if shape[ni] == 1 {
                new_strides[ni] = 1;
                ni += 1;
                continue;
            }
            if oi >= old.len() {
                return None;
            }
            // take old dims [oi, oj) and new dims [ni, nj) with equal products
            let (mut op, mut np) = (old[oi].0, shape[ni]);
            let (mut oj, mut nj) = (oi + 1, ni + 1);
            while op != np {
                if op < np {
                    if oj >= old.len() {
                        return None;
                    }
                    op *= old[oj].0;
                    oj += 1;
                } else {
                    if nj >= shape.len() {
                        return None;
                    }
                    np *= shape[nj];
                    nj += 1;
                }
            }
            // the old chunk must be contiguous within itself
            for k in oi..oj - 1 {
                if old[k].1 != old[k + 1].1 * old[k + 1].0 {
                    return None;
                }
            }
            let mut stride = old[oj - 1].1;
            for k in (ni..nj).rev() {
                new_strides[k] = stride;
                stride *= shape[k];
            }
            oi = oj;
            ni = nj;
        }
        if oi != old.len() {
            return None;
        }
        Some(Self {
            shape: shape.to_vec(),
            strides: new_strides,
            offset: self.offset,
        })
    }

    /// Storage offsets of every element in row-major logical order.
    pub fn offsets(&self) -> StridedOffsets<'_> {
        StridedOffsets {
            layout: self,
            index: vec![0; self.rank()],
            next: if self.numel() == 0 {
                None
            } else {
                Some(self.offset)
            },
        }
    }

    /// Merges neighbouring dimensions that are contiguous with each other in
    /// every one of `layouts` (all of the same shape). Kernels see fewer
    /// dimensions; the element order is unchanged.
    pub fn coalesce(layouts: &[&Layout]) -> Vec<Layout> {
        let shape = layouts[0].shape();
        let mut out: Vec<Layout> = layouts
            .iter()
            .map(|l| Layout::new(vec![], vec![], l.offset))
            .collect();
        for (d, &size) in shape.iter().enumerate() {
            if size == 1 {
                continue;
            }
            let mergeable = !out[0].shape.is_empty()
                && layouts.iter().zip(&out).all(|(l, o)| {
                    let last = o.strides.len() - 1;
                    o.strides[last] == l.strides[d] * size
                });
            for (l, o) in layouts.iter().zip(out.iter_mut()) {
                if mergeable {
                    let last = o.shape.len() - 1;
                    o.shape[last] *= size;
                    o.strides[last] = l.strides[d];
                } else {
                    o.shape.push(size);
                    o.strides.push(l.strides[d]);
                }
            }
        }
        out
    }
}

/// Iterator over the storage offsets of a [`Layout`], row-major.
pub struct StridedOffsets<'a> {
    layout: &'a Layout,
    index: Vec<usize>,
    next: Option<usize>,
}

impl Iterator for StridedOffsets<'_> {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        let current = self.next?;
        let shape = &self.layout.shape;
        let strides = &self.layout.strides;
        let mut off = current;
        let mut d = shape.len();
        self.next = loop {
            if d == 0 {
                break None;
            }
            d -= 1;
            self.index[d] += 1;
            off += strides[d];
            if self.index[d] < shape[d] {
                break Some(off);
            }
            off -= strides[d] * self.index[d];
            self.index[d] = 0;
        };
        Some(current)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_of_a_transpose() {
        let l = Layout::contiguous(&[2, 3]).transpose(0, 1);
        assert_eq!(l.offsets().collect::<Vec<_>>(), vec![0, 3, 1, 4, 2, 5]);
    }

    #[test]
    fn reshape_of_non_contiguous() {
        // [4, 6] narrowed to columns 0..6 of an [4, 8] buffer: rows stay contiguous
        let l = Layout::contiguous(&[4, 8]).narrow(1, 2, 6);
        let r = l.reshape(&[4, 2, 3]).unwrap();
        assert_eq!(r.strides(), &[8, 3, 1]);
        assert!(l.reshape(&[24]).is_none());
        let t = Layout::contiguous(&[2, 3]).transpose(0, 1);
        assert!(t.reshape(&[6]).is_none());
        assert_eq!(t.reshape(&[3, 2, 1]).unwrap().strides(), &[1, 3, 1]);
    }

    #[test]
    fn coalesce_merges_contiguous_dims() {
        let a = Layout::contiguous(&[2, 3, 4]);
        let b = Layout::contiguous(&[3, 4]).broadcast_to(&[2, 3, 4]);
        let c = Layout::coalesce(&[&a, &b]);
        assert_eq!(c[0].shape(), &[2, 12]);
        assert_eq!(c[1].strides(), &[0, 1]);
    }

    #[test]
    fn broadcast_rule() {
        assert_eq!(broadcast_shapes("t", &[3, 1], &[4]).unwrap(), vec![3, 4]);
        assert!(broadcast_shapes("t", &[3, 2], &[4]).is_err());
        assert_eq!(broadcast_shapes("t", &[], &[2, 0]).unwrap(), vec![2, 0]);
    }
}
