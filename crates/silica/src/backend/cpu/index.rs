//! Concatenation, gathers and `where` on the CPU (bitwise, any dtype).

use super::host;
use crate::storage::{CpuStorage, map_cpu};
use crate::{Error, Result, Tensor};

/// Sizes before, at and after `axis`.
fn split(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    )
}

pub fn cat(inputs: &[&Tensor], axis: usize, out_shape: &[usize]) -> CpuStorage {
    let (outer, _, inner) = split(out_shape, axis);
    let parts: Vec<CpuStorage> = inputs.iter().map(|t| host(t).gather(t.layout())).collect();
    let widths: Vec<usize> = inputs.iter().map(|t| t.shape()[axis] * inner).collect();
    map_cpu!(&parts[0], first => {
        // invariant: Tensor::cat checked that every part has the first one's dtype
        let typed: Vec<&[_]> = parts
            .iter()
            .map(|p| p.as_typed(first).expect("cat parts share a dtype"))
            .collect();
        let mut v = Vec::with_capacity(out_shape.iter().product());
        for row in 0..outer {
            for (src, &w) in typed.iter().zip(&widths) {
                v.extend_from_slice(&src[row * w..(row + 1) * w]);
            }
        }
        v
    })
}

pub fn index_select(src: &Tensor, idx: &Tensor, axis: usize) -> Result<CpuStorage> {
    let (outer, n, inner) = split(src.shape(), axis);
    let ids: Vec<i64> = match host(idx).gather(idx.layout()) {
        CpuStorage::U32(v) => v.into_iter().map(i64::from).collect(),
        CpuStorage::I64(v) => v,
        // invariant: Tensor::index_select accepts u32 and i64 indices only
        _ => unreachable!("index_select with non-integer indices"),
    };
    if let Some(&bad) = ids.iter().find(|&&i| i < 0 || i as usize >= n) {
        return Err(Error::IndexOutOfRange {
            op: "index_select",
            index: bad,
            size: n,
        });
    }
    // a contiguous source is read where it is (a gather of a few rows of a
    // large table must not copy the table)
    let gathered;
    let (data, base) = if src.is_contiguous() {
        (host(src), src.layout().offset())
    } else {
        gathered = host(src).gather(src.layout());
        (&gathered, 0)
    };
    Ok(map_cpu!(data, v => {
        let mut out = Vec::with_capacity(outer * ids.len() * inner);
        for o in 0..outer {
            for &i in &ids {
                let start = base + (o * n + i as usize) * inner;
                out.extend_from_slice(&v[start..start + inner]);
            }
        }
        out
    }))
}

pub fn where_cond(cond: &Tensor, a: &Tensor, b: &Tensor) -> CpuStorage {
    let mask: Vec<bool> = host(cond)
        .gather(cond.layout())
        .to_f64()
        .iter()
        .map(|&c| c != 0.0)
        .collect();
    let av = host(a).gather(a.layout());
    let bv = host(b).gather(b.layout());
    map_cpu!(&av, x => {
        // invariant: Tensor::where_cond checked that a and b share a dtype
        let y = bv.as_typed(x).expect("where operands share a dtype");
        mask.iter().enumerate().map(|(i, &m)| if m { x[i] } else { y[i] }).collect()
    })
}
