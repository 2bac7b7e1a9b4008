//! Matrix products on the CPU through the `gemm` crate.

use rayon::prelude::*;

use super::host;
use crate::storage::CpuStorage;
use crate::{DType, Tensor};

/// A 2-D f32 operand: element `(i, j)` is at `data[offset + i * rs + j * cs]`.
pub(super) struct Operand<'a> {
    pub data: &'a [f32],
    pub offset: usize,
    pub rs: usize,
    pub cs: usize,
}

/// f32 data and the layout to read it with: the tensor's own storage for
/// f32 (no copy, any strides), a contiguous f32 copy otherwise.
fn as_f32(t: &Tensor) -> (std::borrow::Cow<'_, [f32]>, crate::Layout) {
    match host(t) {
        CpuStorage::F32(v) => (std::borrow::Cow::Borrowed(v.as_slice()), t.layout().clone()),
        other => (
            std::borrow::Cow::Owned(other.gather_f32(t.layout())),
            crate::Layout::contiguous(t.shape()),
        ),
    }
}

/// Storage offset of batch `b` of `layout` (all dimensions but the last two).
fn batch_offset(layout: &crate::Layout, mut b: usize) -> usize {
    let r = layout.rank();
    let mut off = layout.offset();
    for d in (0..r - 2).rev() {
        let n = layout.shape()[d];
        off += (b % n) * layout.strides()[d];
        b /= n;
    }
    off
}

pub fn matmul(a: &Tensor, b: &Tensor, out_shape: &[usize], out: DType) -> CpuStorage {
    let r = out_shape.len();
    let (m, n) = (out_shape[r - 2], out_shape[r - 1]);
    let k = a.shape()[r - 1];
    let batches: usize = out_shape[..r - 2].iter().product();
    let (ad, al) = as_f32(a);
    let (bd, bl) = as_f32(b);
    let mut result = vec![0f32; batches * m * n];
    if m * n > 0 {
        let one_batch = |(i, dst): (usize, &mut [f32])| {
            let lhs = Operand {
                data: &ad,
                offset: batch_offset(&al, i),
                rs: al.strides()[r - 2],
                cs: al.strides()[r - 1],
            };
            let rhs = Operand {
                data: &bd,
                offset: batch_offset(&bl, i),
                rs: bl.strides()[r - 2],
                cs: bl.strides()[r - 1],
            };
            gemm_f32(m, n, k, &lhs, &rhs, dst, batches == 1, false);
        };
        if batches > 1 && batches * m * n * k >= 1 << 16 {
            result.par_chunks_mut(m * n).enumerate().for_each(one_batch);
        } else {
            result.chunks_mut(m * n).enumerate().for_each(one_batch);
        }
    }
    CpuStorage::from_f32(result, out)
}

/// `dst [m, n] (row-major) = lhs [m, k] @ rhs [k, n]`, or `+=` with
/// `accumulate`.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_f32(
    m: usize,
    n: usize,
    k: usize,
    lhs: &Operand,
    rhs: &Operand,
    dst: &mut [f32],
    parallel: bool,
    accumulate: bool,
) {
    if k == 0 {
        if !accumulate {
            dst.fill(0.0);
        }
        return;
    }
    // Bounds: the largest element each operand reaches must be inside its slice.
    let reach =
        |o: &Operand, rows: usize, cols: usize| o.offset + (rows - 1) * o.rs + (cols - 1) * o.cs;
    assert!(reach(lhs, m, k) < lhs.data.len() && reach(rhs, k, n) < rhs.data.len());
    assert_eq!(dst.len(), m * n);
    let par = if parallel && m * n * k >= 1 << 18 {
        gemm::Parallelism::Rayon(rayon::current_num_threads())
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the asserts above keep every index gemm computes from the given
    // dimensions and strides inside the three slices; dst is exclusively borrowed.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.data.as_ptr().add(lhs.offset),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr().add(rhs.offset),
            rhs.cs as isize,
            rhs.rs as isize,
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

/// `x [.., k] @ wᵀ + bias` for f32 `x` (contiguous) and `w [n, k]` (any
/// strides) on the CPU: the result starts as the bias rows and the product
/// accumulates into it, so no separate pass adds the bias. `None` for other
/// dtypes or a strided `x`.
pub(crate) fn linear_f32(x: &Tensor, w: &Tensor, bias: &Tensor) -> Option<Vec<f32>> {
    let (CpuStorage::F32(xd), CpuStorage::F32(wd)) = (host(x), host(w)) else {
        return None;
    };
    if !x.is_contiguous() || w.rank() != 2 {
        return None;
    }
    let (n, k) = (w.shape()[0], w.shape()[1]);
    let m: usize = x.shape()[..x.rank().saturating_sub(1)].iter().product();
    let b = host(bias).gather_f32(bias.layout());
    let mut out = Vec::with_capacity(m * n);
    for _ in 0..m {
        out.extend_from_slice(&b);
    }
    if m * n > 0 && k > 0 {
        let lhs = Operand {
            data: xd,
            offset: x.layout().offset(),
            rs: k,
            cs: 1,
        };
        // wᵀ: element (i, j) is w[j, i]
        let rhs = Operand {
            data: wd,
            offset: w.layout().offset(),
            rs: w.layout().strides()[1],
            cs: w.layout().strides()[0],
        };
        gemm_f32(m, n, k, &lhs, &rhs, &mut out, true, true);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor};

    #[test]
    fn linear_accumulates_into_the_bias_rows() {
        // w as stored and as a transposed view, x with leading dimensions,
        // an offset x (copied), and K = 0 (the bias alone)
        let dev = Device::cpu();
        let cases: [(&[usize], usize); 4] =
            [(&[2, 3, 16], 7), (&[1, 33], 65), (&[5, 4], 1), (&[4, 0], 3)];
        for (i, &(xs, n)) in cases.iter().enumerate() {
            let k = *xs.last().unwrap();
            let x = Tensor::randn(xs, DType::F32, i as u64, &dev).unwrap();
            let w = Tensor::randn(&[n, k], DType::F32, 10 + i as u64, &dev).unwrap();
            let wt = w.t().unwrap().contiguous().unwrap().t().unwrap();
            let b = Tensor::randn(&[n], DType::F32, 20 + i as u64, &dev).unwrap();
            let want = x.matmul(&w.t().unwrap()).unwrap().add(&b).unwrap();
            let want = want.to_vec::<f32>().unwrap();
            for w in [&w, &wt] {
                let got = x.linear(w, &b).unwrap();
                assert_eq!(got.shape(), &[&xs[..xs.len() - 1], &[n]].concat()[..]);
                for (g, e) in got.to_vec::<f32>().unwrap().iter().zip(&want) {
                    assert!(
                        (g - e).abs() <= 1e-5 * e.abs().max(1.0),
                        "{xs:?} {n}: {g} vs {e}"
                    );
                }
            }
        }
        let x = Tensor::randn(&[2, 8], DType::F32, 1, &dev).unwrap();
        let w = Tensor::randn(&[3, 8], DType::F32, 2, &dev).unwrap();
        assert!(
            x.linear(&w, &Tensor::zeros(&[4], DType::F32, &dev).unwrap())
                .is_err()
        );
        assert!(
            x.linear(
                &w.t().unwrap(),
                &Tensor::zeros(&[3], DType::F32, &dev).unwrap()
            )
            .is_err()
        );
    }
}
