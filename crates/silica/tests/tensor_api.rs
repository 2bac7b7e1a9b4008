//! The tensor API on the CPU: user mistakes are errors (never panics) whose
//! messages name the shapes, views copy nothing and give the right values,
//! property tests of broadcasting, view chains and reshapes against plain
//! index-arithmetic references, element type round trips, and device
//! selection by name.

mod common;

use half::{bf16, f16};
use proptest::prelude::*;
use silica::{DType, Device, Element, Error, Tensor};

fn cpu() -> Device {
    Device::cpu()
}

/// A CPU f32 tensor of `shape` holding `0, 1, 2, ..` in row-major order.
fn iota(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| i as f32).collect();
    Tensor::from_slice(&v, shape, &cpu()).unwrap()
}

fn vals(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// Row-major strides of a contiguous `shape`.
fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Every multi-index of `shape` in row-major order.
fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = shape.iter().product();
    let strides = strides_of(shape);
    (0..n)
        .map(|flat| {
            strides
                .iter()
                .zip(shape)
                .map(|(&s, &d)| (flat / s) % d)
                .collect()
        })
        .collect()
}

// ---------------------------------------------------------------------------
// errors, not panics
// ---------------------------------------------------------------------------

fn err_text<T: std::fmt::Debug>(r: silica::Result<T>, what: &str) -> (Error, String) {
    match r {
        Ok(v) => panic!("{what}: expected an error, got {v:?}"),
        Err(e) => {
            let msg = e.to_string();
            (e, msg)
        }
    }
}

fn assert_mentions(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} does not mention {p:?}");
    }
}

#[test]
fn add_of_incompatible_shapes_is_a_shape_mismatch() {
    let a = iota(&[2, 3]);
    let b = iota(&[4]);
    let (e, msg) = err_text(a.add(&b), "add [2,3] + [4]");
    match e {
        Error::ShapeMismatch { op, lhs, rhs, .. } => {
            assert_eq!(op, "add");
            assert_eq!(lhs, vec![2, 3]);
            assert_eq!(rhs, vec![4]);
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
    assert_mentions(&msg, &["add", "[2, 3]", "[4]"]);

    // the rule is applied per dimension, not to the element count
    let (e, msg) = err_text(iota(&[2, 3]).mul(&iota(&[3, 2])), "mul [2,3] * [3,2]");
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e:?}");
    assert_mentions(&msg, &["[2, 3]", "[3, 2]"]);
    let (e, msg) = err_text(iota(&[2, 3]).lt(&iota(&[2, 2])), "lt");
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e:?}");
    assert_mentions(&msg, &["lt", "[2, 3]", "[2, 2]"]);
    let (e, msg) = err_text(iota(&[3]).broadcast_to(&[3, 2]), "broadcast_to");
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e:?}");
    assert_mentions(&msg, &["broadcast_to", "[3]", "[3, 2]"]);
    let (e, msg) = err_text(iota(&[2, 3]).reshape(&[4, 2]), "reshape");
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e:?}");
    assert_mentions(&msg, &["reshape", "[2, 3]", "[4, 2]"]);
    let (e, msg) = err_text(Tensor::cat(&[&iota(&[2, 3]), &iota(&[2, 4])], 0), "cat");
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e:?}");
    assert_mentions(&msg, &["cat", "[2, 3]", "[2, 4]"]);
}

#[test]
fn matmul_shape_errors() {
    let (e, msg) = err_text(iota(&[2, 3]).matmul(&iota(&[4, 5])), "matmul inner");
    match e {
        Error::ShapeMismatch { op, lhs, rhs, .. } => {
            assert_eq!(op, "matmul");
            assert_eq!(lhs, vec![2, 3]);
            assert_eq!(rhs, vec![4, 5]);
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
    assert_mentions(&msg, &["matmul", "[2, 3]", "[4, 5]"]);
    // vector operands
    let (e, msg) = err_text(iota(&[3]).matmul(&iota(&[4])), "matmul vectors");
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e:?}");
    assert_mentions(&msg, &["[3]", "[4]"]);
    // batch dimensions that do not broadcast
    let (e, msg) = err_text(iota(&[2, 2, 3]).matmul(&iota(&[3, 3, 4])), "matmul batch");
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e:?}");
    assert_mentions(&msg, &["matmul"]);
    // scalars
    let (e, _) = err_text(iota(&[]).matmul(&iota(&[2, 2])), "matmul scalar");
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e:?}");
    // dtypes
    let h = iota(&[3, 2]).to_dtype(DType::F16).unwrap();
    let (e, msg) = err_text(iota(&[2, 3]).matmul(&h), "matmul dtypes");
    assert!(
        matches!(
            e,
            Error::DTypeMismatch {
                lhs: DType::F32,
                rhs: DType::F16,
                ..
            }
        ),
        "{e:?}"
    );
    assert_mentions(&msg, &["f32", "f16"]);
}

#[test]
fn from_slice_with_a_wrong_element_count() {
    let (e, msg) = err_text(
        Tensor::from_slice(&[1.0f32; 5], &[2, 3], &cpu()),
        "from_slice",
    );
    match e {
        Error::ElementCount {
            shape,
            expected,
            got,
            ..
        } => {
            assert_eq!(shape, vec![2, 3]);
            assert_eq!(expected, 6);
            assert_eq!(got, 5);
        }
        other => panic!("expected ElementCount, got {other:?}"),
    }
    assert_mentions(&msg, &["[2, 3]", "6", "5"]);
    let (e, _) = err_text(Tensor::from_vec(vec![1u32; 7], &[], &cpu()), "scalar");
    assert!(
        matches!(
            e,
            Error::ElementCount {
                expected: 1,
                got: 7,
                ..
            }
        ),
        "{e:?}"
    );
    // a shape whose element count overflows is an error too
    let (e, _) = err_text(
        Tensor::from_slice(&[0.0f32; 4], &[usize::MAX, 2], &cpu()),
        "overflowing shape",
    );
    assert!(
        matches!(
            e,
            Error::InvalidArgument { .. } | Error::ElementCount { .. }
        ),
        "{e:?}"
    );
    let (e, _) = err_text(
        Tensor::zeros(&[1 << 40, 1 << 40], DType::F32, &cpu()),
        "zeros of an overflowing shape",
    );
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
}

/// A shape with a 0 holds no element, but its contiguous strides are still
/// products of the other dimensions: those must not overflow either (found
/// by fuzzing the safetensors loader with `[0, 2^40, 2^40]`).
#[test]
fn empty_shapes_whose_other_dimensions_overflow_are_errors() {
    let huge = [0, 1 << 40, 1 << 40];
    let dev = cpu();
    let zeros = Tensor::zeros(&huge, DType::F32, &dev);
    assert!(
        matches!(zeros, Err(Error::InvalidArgument { .. })),
        "{zeros:?}"
    );
    let from = Tensor::from_vec(Vec::<f32>::new(), &huge, &dev);
    assert!(
        matches!(from, Err(Error::InvalidArgument { .. })),
        "{from:?}"
    );
    let empty = Tensor::zeros(&[0, 4], DType::F32, &dev).unwrap();
    let reshaped = empty.reshape(&huge);
    assert!(
        matches!(reshaped, Err(Error::InvalidArgument { .. })),
        "{reshaped:?}"
    );
    let one = Tensor::zeros(&[1, 1], DType::F32, &dev).unwrap();
    let wide = one.broadcast_to(&[1 << 40, 1 << 40]);
    assert!(
        matches!(wide, Err(Error::InvalidArgument { .. })),
        "{wide:?}"
    );
    // two legal operands whose broadcast shape would overflow
    let a = Tensor::zeros(&[0, 1 << 40, 1], DType::F32, &dev).unwrap();
    let b = one.broadcast_to(&[1, 1, 1 << 30]).unwrap();
    let sum = a.add(&b);
    assert!(matches!(sum, Err(Error::InvalidArgument { .. })), "{sum:?}");
    // empty shapes with sane dimensions still work, strides and all
    let ok = Tensor::zeros(&[3, 0, 1 << 20], DType::F32, &dev).unwrap();
    assert_eq!(ok.numel(), 0);
    assert_eq!(ok.layout().strides(), &[0, 1 << 20, 1]);
    assert_eq!(ok.sum(-1, false).unwrap().shape(), &[3, 0]);
}

#[test]
fn dimensions_out_of_range() {
    let t = iota(&[2, 3]);
    type Attempt = Box<dyn Fn(&Tensor) -> silica::Result<Tensor>>;
    let cases: Vec<(&str, isize, Attempt)> = vec![
        ("sum", 2, Box::new(|t| t.sum(2, false))),
        ("max", -3, Box::new(|t| t.max(-3, true))),
        ("softmax", 5, Box::new(|t| t.softmax(5))),
        ("transpose", -3, Box::new(|t| t.transpose(0, -3))),
        ("unsqueeze", 3, Box::new(|t| t.unsqueeze(3))),
        ("unsqueeze", -4, Box::new(|t| t.unsqueeze(-4))),
        ("squeeze", 2, Box::new(|t| t.squeeze(2))),
        ("narrow", 2, Box::new(|t| t.narrow(2, 0, 1))),
        ("cat", 2, Box::new(|t| Tensor::cat(&[t, t], 2))),
        (
            "index_select",
            -3,
            Box::new(|t| {
                let i = Tensor::from_slice(&[0u32], &[1], &Device::cpu())?;
                t.index_select(-3, &i)
            }),
        ),
    ];
    for (name, dim, f) in cases {
        let (e, msg) = err_text(f(&t), name);
        match e {
            Error::DimOutOfRange { op, dim: d, shape } => {
                assert_eq!(op, name);
                assert_eq!(d, dim, "{name}");
                assert_eq!(shape, vec![2, 3], "{name}");
            }
            other => panic!("{name}: expected DimOutOfRange, got {other:?}"),
        }
        assert_mentions(&msg, &[name, "[2, 3]", &dim.to_string()]);
    }
    assert_eq!(t.dim(-1).unwrap(), 3);
    assert!(matches!(t.dim(2), Err(Error::DimOutOfRange { .. })));
    // rank 0: no dimension at all
    let s = iota(&[]);
    assert!(matches!(s.sum(0, false), Err(Error::DimOutOfRange { .. })));
    assert!(matches!(s.t(), Err(Error::InvalidArgument { .. })));
}

#[test]
fn narrow_squeeze_and_permute_argument_errors() {
    let t = iota(&[2, 3]);
    for (start, len) in [(2, 2), (0, 4), (4, 0), (usize::MAX, 2), (1, usize::MAX)] {
        let (e, msg) = err_text(t.narrow(1, start, len), "narrow");
        assert!(
            matches!(e, Error::InvalidArgument { op: "narrow", .. }),
            "{e:?}"
        );
        assert_mentions(&msg, &["narrow", "[2, 3]"]);
    }
    // the edges themselves are fine
    assert_eq!(t.narrow(1, 3, 0).unwrap().shape(), &[2, 0]);
    assert_eq!(t.narrow(1, 0, 3).unwrap().shape(), &[2, 3]);

    let (e, msg) = err_text(t.squeeze(0), "squeeze of a size-2 dimension");
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert_mentions(&msg, &["[2, 3]"]);

    for perm in [&[0usize, 0][..], &[0], &[0, 1, 2], &[0, 2], &[]] {
        let (e, msg) = err_text(t.permute(perm), "permute");
        assert!(
            matches!(e, Error::InvalidArgument { op: "permute", .. }),
            "{perm:?}: {e:?}"
        );
        assert_mentions(&msg, &["permute", "[2, 3]", &format!("{perm:?}")]);
    }
}

#[test]
fn to_vec_with_the_wrong_element_type() {
    let t = iota(&[2, 2]);
    let (e, msg) = err_text(t.to_vec::<u32>(), "to_vec::<u32> of f32");
    match e {
        Error::DTypeMismatch { op, lhs, rhs } => {
            assert_eq!(op, "to_vec");
            assert_eq!(lhs, DType::F32);
            assert_eq!(rhs, DType::U32);
        }
        other => panic!("expected DTypeMismatch, got {other:?}"),
    }
    assert_mentions(&msg, &["to_vec", "f32", "u32"]);
    let h = t.to_dtype(DType::BF16).unwrap();
    assert!(matches!(
        h.to_vec::<f16>(),
        Err(Error::DTypeMismatch {
            lhs: DType::BF16,
            rhs: DType::F16,
            ..
        })
    ));
    assert!(matches!(
        h.to_vec::<f32>(),
        Err(Error::DTypeMismatch { .. })
    ));
    // mixed operand dtypes
    let (e, msg) = err_text(t.add(&h), "add f32 + bf16");
    assert!(matches!(e, Error::DTypeMismatch { op: "add", .. }), "{e:?}");
    assert_mentions(&msg, &["f32", "bf16"]);
}

#[test]
fn operands_on_different_devices() {
    let Some(gpu) = common::first_gpu() else {
        return;
    };
    let c = iota(&[2, 3]);
    let g = c.to_device(&gpu).unwrap();
    let checks: Vec<(&str, silica::Result<Tensor>)> = vec![
        ("add", c.add(&g)),
        ("add", g.add(&c)),
        ("matmul", c.matmul(&g.t().unwrap())),
        ("cat", Tensor::cat(&[&c, &g], 0)),
        ("where", c.gt(&c).unwrap().where_cond(&c, &g)),
        (
            "index_select",
            c.index_select(0, &Tensor::from_slice(&[0u32], &[1], &gpu).unwrap()),
        ),
    ];
    for (name, r) in checks {
        let (e, msg) = err_text(r, name);
        match e {
            Error::DeviceMismatch { op, lhs, rhs } => {
                assert_eq!(op, name);
                assert_ne!(lhs, rhs);
                assert!(lhs == "cpu" || rhs == "cpu", "{name}: {lhs} / {rhs}");
            }
            other => panic!("{name}: expected DeviceMismatch, got {other:?}"),
        }
        assert_mentions(&msg, &[name, "cpu", "gpu:"]);
    }
    // moving one operand fixes it
    let sum = c.add(&g.to_device(&cpu()).unwrap()).unwrap();
    assert_eq!(vals(&sum), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
}

#[test]
fn index_select_out_of_range_on_the_cpu() {
    let t = iota(&[3, 2]);
    let idx = Tensor::from_slice(&[0u32, 3, 1], &[3], &cpu()).unwrap();
    let (e, msg) = err_text(t.index_select(0, &idx), "index_select u32");
    match e {
        Error::IndexOutOfRange { op, index, size } => {
            assert_eq!(op, "index_select");
            assert_eq!(index, 3);
            assert_eq!(size, 3);
        }
        other => panic!("expected IndexOutOfRange, got {other:?}"),
    }
    assert_mentions(&msg, &["index_select", "3"]);
    let neg = Tensor::from_slice(&[1i64, -1], &[2], &cpu()).unwrap();
    let (e, _) = err_text(t.index_select(0, &neg), "index_select i64");
    assert!(
        matches!(
            e,
            Error::IndexOutOfRange {
                index: -1,
                size: 3,
                ..
            }
        ),
        "{e:?}"
    );
    let (e, _) = err_text(
        t.index_select(1, &Tensor::from_slice(&[2u32], &[1], &cpu()).unwrap()),
        "index_select axis 1",
    );
    assert!(
        matches!(
            e,
            Error::IndexOutOfRange {
                index: 2,
                size: 2,
                ..
            }
        ),
        "{e:?}"
    );
    // valid indices work, repeated ones included
    let ok = Tensor::from_slice(&[2u32, 0, 2], &[3], &cpu()).unwrap();
    assert_eq!(
        vals(&t.index_select(0, &ok).unwrap()),
        vec![4.0, 5.0, 0.0, 1.0, 4.0, 5.0]
    );
    // indices must be integers of rank 1
    let (e, _) = err_text(t.index_select(0, &iota(&[2])), "float indices");
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    let idx2 = Tensor::from_slice(&[0u32, 1], &[1, 2], &cpu()).unwrap();
    let (e, msg) = err_text(t.index_select(0, &idx2), "2-D indices");
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert_mentions(&msg, &["[1, 2]"]);
}

#[test]
fn ops_on_unsupported_dtypes() {
    let u = Tensor::from_slice(&[1u32, 2, 3, 4], &[2, 2], &cpu()).unwrap();
    let i = Tensor::from_slice(&[1i64, 2, 3, 4], &[2, 2], &cpu()).unwrap();
    let (e, msg) = err_text(u.exp(), "exp u32");
    match e {
        Error::UnsupportedDType { op, dtype } => {
            assert_eq!(op, "exp");
            assert_eq!(dtype, DType::U32);
        }
        other => panic!("expected UnsupportedDType, got {other:?}"),
    }
    assert_mentions(&msg, &["exp", "u32"]);
    let attempts: Vec<(&str, DType, silica::Result<Tensor>)> = vec![
        ("add", DType::U32, u.add(&u)),
        ("matmul", DType::I64, i.matmul(&i)),
        ("sum", DType::I64, i.sum(0, false)),
        ("softmax", DType::U32, u.softmax(-1)),
        ("mul_scalar", DType::I64, i.mul_scalar(2.0)),
        ("argmax", DType::U32, u.argmax(-1, false)),
    ];
    for (name, dtype, r) in attempts {
        let (e, msg) = err_text(r, name);
        assert!(
            matches!(e, Error::UnsupportedDType { op, dtype: d } if op == name && d == dtype),
            "{name}: {e:?}"
        );
        assert_mentions(&msg, &[name, dtype.as_str()]);
    }
    // bitwise ops work on every dtype
    assert_eq!(
        u.t()
            .unwrap()
            .contiguous()
            .unwrap()
            .to_vec::<u32>()
            .unwrap(),
        vec![1, 3, 2, 4]
    );
    assert_eq!(
        i.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 2.0, 3.0, 4.0]
    );
}

#[test]
fn other_invalid_arguments() {
    let (e, _) = err_text(
        Tensor::arange(0.0, 1.0, 0.0, DType::F32, &cpu()),
        "arange step 0",
    );
    assert!(
        matches!(e, Error::InvalidArgument { op: "arange", .. }),
        "{e:?}"
    );
    let (e, _) = err_text(Tensor::cat(&[], 0), "cat of nothing");
    assert!(
        matches!(e, Error::InvalidArgument { op: "cat", .. }),
        "{e:?}"
    );
    let (e, msg) = err_text(iota(&[2, 0]).max(1, false), "max of an empty dimension");
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert_mentions(&msg, &["[2, 0]"]);
    // sums over an empty dimension are fine
    assert_eq!(vals(&iota(&[2, 0]).sum(1, false).unwrap()), vec![0.0, 0.0]);
}

// ---------------------------------------------------------------------------
// views
// ---------------------------------------------------------------------------

#[test]
fn transpose_and_permute_are_views() {
    let t = iota(&[2, 3]);
    let tt = t.t().unwrap();
    assert_eq!(tt.shape(), &[3, 2]);
    assert!(!tt.is_contiguous());
    assert_eq!(
        tt.layout().strides(),
        &[1, 3],
        "transpose must only swap strides"
    );
    assert_eq!(tt.layout().offset(), 0);
    assert_eq!(vals(&tt), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    assert_eq!(vals(&t.transpose(-1, 0).unwrap()), vals(&tt));
    assert_eq!(vals(&tt.t().unwrap()), vals(&t));
    assert!(tt.t().unwrap().is_contiguous());

    let c = iota(&[2, 3, 4]);
    let p = c.permute(&[2, 0, 1]).unwrap();
    assert_eq!(p.shape(), &[4, 2, 3]);
    assert_eq!(p.layout().strides(), &[1, 12, 4]);
    assert!(!p.is_contiguous());
    let got = vals(&p);
    for (flat, idx) in indices(&[4, 2, 3]).iter().enumerate() {
        let (k, i, j) = (idx[0], idx[1], idx[2]);
        assert_eq!(got[flat], (i * 12 + j * 4 + k) as f32, "p[{k},{i},{j}]");
    }
    // contiguous() materializes the same values
    let pc = p.contiguous().unwrap();
    assert!(pc.is_contiguous());
    assert_eq!(pc.layout().strides(), &[6, 3, 1]);
    assert_eq!(vals(&pc), got);
    // contiguous() of a contiguous tensor is itself; copy() always copies
    assert_eq!(c.contiguous().unwrap().layout(), c.layout());
    assert_eq!(vals(&c.copy().unwrap()), vals(&c));
}

#[test]
fn narrow_is_a_view_with_an_offset() {
    let t = iota(&[3, 4]);
    let cols = t.narrow(1, 1, 2).unwrap();
    assert_eq!(cols.shape(), &[3, 2]);
    assert_eq!(cols.layout().strides(), &[4, 1]);
    assert_eq!(cols.layout().offset(), 1);
    assert!(!cols.is_contiguous());
    assert_eq!(vals(&cols), vec![1.0, 2.0, 5.0, 6.0, 9.0, 10.0]);
    let rows = t.narrow(0, 1, 2).unwrap();
    assert!(rows.is_contiguous(), "whole rows stay contiguous");
    assert_eq!(rows.layout().offset(), 4);
    assert_eq!(vals(&rows), (4..12).map(|i| i as f32).collect::<Vec<_>>());
    // a narrow of a narrow accumulates the offset
    let both = rows.narrow(-1, 3, 1).unwrap();
    assert_eq!(both.layout().offset(), 7);
    assert_eq!(vals(&both), vec![7.0, 11.0]);
    // empty narrows
    let empty = t.narrow(1, 4, 0).unwrap();
    assert_eq!(empty.shape(), &[3, 0]);
    assert_eq!(empty.numel(), 0);
    assert!(vals(&empty).is_empty());
    // ops see the view, not the storage
    assert_eq!(vals(&cols.sum(1, false).unwrap()), vec![3.0, 11.0, 19.0]);
    assert_eq!(
        vals(&cols.mul_scalar(2.0).unwrap()),
        vec![2.0, 4.0, 10.0, 12.0, 18.0, 20.0]
    );
}

#[test]
fn broadcast_unsqueeze_and_squeeze_are_views() {
    let r = iota(&[3]);
    let b = r.broadcast_to(&[2, 3]).unwrap();
    assert_eq!(b.shape(), &[2, 3]);
    assert_eq!(
        b.layout().strides(),
        &[0, 1],
        "broadcast dimensions have stride 0"
    );
    assert_eq!(vals(&b), vec![0.0, 1.0, 2.0, 0.0, 1.0, 2.0]);
    let col = iota(&[3, 1]);
    let bc = col.broadcast_to(&[2, 3, 4]).unwrap();
    assert_eq!(bc.layout().strides(), &[0, 1, 0]);
    let got = vals(&bc);
    for (flat, idx) in indices(&[2, 3, 4]).iter().enumerate() {
        assert_eq!(got[flat], idx[1] as f32);
    }
    assert_eq!(vals(&bc.contiguous().unwrap()), got);
    // the same shape is the same tensor
    assert_eq!(r.broadcast_to(&[3]).unwrap().layout(), r.layout());
    // a scalar broadcasts to anything
    let s = Tensor::from_slice(&[7.0f32], &[], &cpu()).unwrap();
    assert_eq!(vals(&s.broadcast_to(&[2, 2]).unwrap()), vec![7.0; 4]);

    let t = iota(&[2, 3]);
    for (dim, shape) in [
        (0isize, [1, 2, 3]),
        (1, [2, 1, 3]),
        (2, [2, 3, 1]),
        (-1, [2, 3, 1]),
        (-3, [1, 2, 3]),
    ] {
        let u = t.unsqueeze(dim).unwrap();
        assert_eq!(u.shape(), &shape, "unsqueeze({dim})");
        assert!(u.is_contiguous());
        assert_eq!(u.layout().offset(), 0);
        assert_eq!(vals(&u), vals(&t));
        let back = u.squeeze(dim).unwrap();
        assert_eq!(back.shape(), &[2, 3]);
        assert_eq!(vals(&back), vals(&t));
    }
    // unsqueeze of a transposed view keeps it a view
    let ut = t.t().unwrap().unsqueeze(1).unwrap();
    assert_eq!(ut.shape(), &[3, 1, 2]);
    assert!(!ut.is_contiguous());
    assert_eq!(vals(&ut), vals(&t.t().unwrap()));
}

#[test]
fn reshape_is_a_view_when_possible_and_right_otherwise() {
    let t = iota(&[2, 3, 4]);
    let r = t.reshape(&[6, 4]).unwrap();
    assert!(r.is_contiguous());
    assert_eq!(vals(&r), vals(&t));
    // a reshape of an offset view keeps the offset: no copy was made
    let rows = iota(&[4, 6]).narrow(0, 1, 2).unwrap();
    let rr = rows.reshape(&[3, 4]).unwrap();
    assert_eq!(rr.layout().offset(), 6);
    assert_eq!(vals(&rr), (6..18).map(|i| i as f32).collect::<Vec<_>>());
    // column slices whose rows are contiguous reshape without a copy
    let cols = iota(&[4, 8]).narrow(1, 2, 6).unwrap();
    let split = cols.reshape(&[4, 2, 3]).unwrap();
    assert_eq!(split.layout().strides(), &[8, 3, 1]);
    assert_eq!(split.layout().offset(), 2);
    assert_eq!(vals(&split), vals(&cols));
    // non-contiguous views that need a copy still give the right values
    let tt = iota(&[2, 3]).t().unwrap();
    let flat = tt.reshape(&[6]).unwrap();
    assert!(flat.is_contiguous());
    assert_eq!(vals(&flat), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    assert_eq!(
        vals(&tt.reshape(&[2, 3]).unwrap()),
        vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    );
    let flat_cols = cols.reshape(&[24]).unwrap();
    assert_eq!(vals(&flat_cols), vals(&cols));
    let bc = iota(&[3])
        .broadcast_to(&[2, 3])
        .unwrap()
        .reshape(&[3, 2])
        .unwrap();
    assert_eq!(vals(&bc), vec![0.0, 1.0, 2.0, 0.0, 1.0, 2.0]);
    // to and from a scalar
    let s = iota(&[1, 1]).reshape(&[]).unwrap();
    assert_eq!(s.rank(), 0);
    assert_eq!(s.reshape(&[1]).unwrap().shape(), &[1]);
}

#[test]
fn clones_share_storage() {
    let t = iota(&[2, 3]);
    let c = t.clone();
    assert_eq!(c.layout(), t.layout());
    assert_eq!(vals(&c), vals(&t));
    // the matmul doc example: a view operand needs no copy to be right
    let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &cpu()).unwrap();
    assert_eq!(
        vals(&a.matmul(&a.t().unwrap()).unwrap()),
        vec![5.0, 11.0, 11.0, 25.0]
    );
}

// ---------------------------------------------------------------------------
// property tests
// ---------------------------------------------------------------------------

/// Numpy's broadcasting rule, written out plainly.
fn numpy_broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let pad = |s: &[usize]| -> Vec<usize> {
        let mut v = vec![1; rank - s.len()];
        v.extend_from_slice(s);
        v
    };
    let (pa, pb) = (pad(a), pad(b));
    pa.iter()
        .zip(&pb)
        .map(|(&x, &y)| match (x, y) {
            _ if x == y => Some(x),
            (1, _) => Some(y),
            (_, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// Flat index into a contiguous `shape` for the output index `out_idx`
/// (`shape` right-aligned against it, size-1 dimensions repeated).
fn broadcast_source(shape: &[usize], out_idx: &[usize]) -> usize {
    let skip = out_idx.len() - shape.len();
    let strides = strides_of(shape);
    shape
        .iter()
        .enumerate()
        .map(|(d, &n)| {
            if n == 1 {
                0
            } else {
                out_idx[skip + d] * strides[d]
            }
        })
        .sum()
}

/// Two shapes that broadcast: suffixes of one shape with random 1s.
fn compatible_shapes() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    prop::collection::vec(1usize..=4, 0..=4)
        .prop_flat_map(|base| {
            let r = base.len();
            (
                Just(base),
                0..=r,
                0..=r,
                prop::collection::vec(any::<bool>(), r),
                prop::collection::vec(any::<bool>(), r),
            )
        })
        .prop_map(|(base, ra, rb, ones_a, ones_b)| {
            let r = base.len();
            let pick = |len: usize, ones: &[bool]| -> Vec<usize> {
                (r - len..r)
                    .map(|d| if ones[d] { 1 } else { base[d] })
                    .collect()
            };
            (pick(ra, &ones_a), pick(rb, &ones_b))
        })
}

/// Any two small shapes (often incompatible).
fn any_shapes() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (
        prop::collection::vec(1usize..=4, 0..=4),
        prop::collection::vec(1usize..=4, 0..=4),
    )
}

/// One view op; its parameters are reduced modulo the current shape, so
/// every generated chain is valid.
#[derive(Clone, Debug)]
enum ViewOp {
    Transpose(u8, u8),
    Narrow(u8, u8, u8),
    Unsqueeze(u8),
    Squeeze(u8),
    Permute(u64),
}

fn view_op() -> impl Strategy<Value = ViewOp> {
    prop_oneof![
        3 => (any::<u8>(), any::<u8>()).prop_map(|(a, b)| ViewOp::Transpose(a, b)),
        3 => (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(a, b, c)| ViewOp::Narrow(a, b, c)),
        2 => any::<u8>().prop_map(ViewOp::Unsqueeze),
        2 => any::<u8>().prop_map(ViewOp::Squeeze),
        1 => any::<u64>().prop_map(ViewOp::Permute),
    ]
}

/// The reference: a plain row-major array and its shape.
#[derive(Clone, Debug)]
struct Dense {
    shape: Vec<usize>,
    data: Vec<f32>,
}

impl Dense {
    /// A new array of `shape` whose element at `idx` is the element of
    /// `self` at `source(idx)`.
    fn remap(&self, shape: Vec<usize>, source: impl Fn(&[usize]) -> Vec<usize>) -> Dense {
        let strides = strides_of(&self.shape);
        let data = indices(&shape)
            .iter()
            .map(|idx| {
                let src = source(idx);
                assert_eq!(src.len(), self.shape.len());
                let flat: usize = src.iter().zip(&strides).map(|(i, s)| i * s).sum();
                self.data[flat]
            })
            .collect();
        Dense { shape, data }
    }
}

/// A small deterministic generator for the permutation op.
fn permutation(rank: usize, mut seed: u64) -> Vec<usize> {
    let mut p: Vec<usize> = (0..rank).collect();
    for i in (1..rank).rev() {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let j = ((seed >> 33) as usize) % (i + 1);
        p.swap(i, j);
    }
    p
}

/// Applies `op` to the tensor and to the reference; `None` when the op does
/// not apply to the current shape (it is then skipped).
fn apply(op: &ViewOp, t: &Tensor, r: &Dense) -> Option<(Tensor, Dense)> {
    let shape = r.shape.clone();
    let rank = shape.len();
    // negative dimension for odd bytes: both spellings must work
    let signed = |d: usize, byte: u8, rank: usize| -> isize {
        if byte % 2 == 1 {
            d as isize - rank as isize
        } else {
            d as isize
        }
    };
    match *op {
        ViewOp::Transpose(a, b) => {
            if rank == 0 {
                return None;
            }
            let (d0, d1) = (a as usize % rank, b as usize % rank);
            let v = t
                .transpose(signed(d0, a, rank), signed(d1, b, rank))
                .unwrap();
            let mut s = shape.clone();
            s.swap(d0, d1);
            let d = r.remap(s, |idx| {
                let mut src = idx.to_vec();
                src.swap(d0, d1);
                src
            });
            Some((v, d))
        }
        ViewOp::Narrow(a, b, c) => {
            if rank == 0 {
                return None;
            }
            let dim = a as usize % rank;
            let size = shape[dim];
            let start = b as usize % (size + 1);
            let len = c as usize % (size - start + 1);
            let v = t.narrow(signed(dim, a, rank), start, len).unwrap();
            let mut s = shape.clone();
            s[dim] = len;
            let d = r.remap(s, |idx| {
                let mut src = idx.to_vec();
                src[dim] += start;
                src
            });
            Some((v, d))
        }
        ViewOp::Unsqueeze(a) => {
            if rank >= 6 {
                return None;
            }
            let dim = a as usize % (rank + 1);
            let v = t.unsqueeze(signed(dim, a, rank + 1)).unwrap();
            let mut s = shape.clone();
            s.insert(dim, 1);
            let d = r.remap(s, |idx| {
                let mut src = idx.to_vec();
                src.remove(dim);
                src
            });
            Some((v, d))
        }
        ViewOp::Squeeze(a) => {
            let ones: Vec<usize> = (0..rank).filter(|&d| shape[d] == 1).collect();
            if ones.is_empty() {
                return None;
            }
            let dim = ones[a as usize % ones.len()];
            let v = t.squeeze(signed(dim, a, rank)).unwrap();
            let mut s = shape.clone();
            s.remove(dim);
            let d = r.remap(s, |idx| {
                let mut src = idx.to_vec();
                src.insert(dim, 0);
                src
            });
            Some((v, d))
        }
        ViewOp::Permute(seed) => {
            let perm = permutation(rank, seed);
            let v = t.permute(&perm).unwrap();
            let s: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let d = r.remap(s, |idx| {
                let mut src = vec![0; rank];
                for (i, &p) in perm.iter().enumerate() {
                    src[p] = idx[i];
                }
                src
            });
            Some((v, d))
        }
    }
}

/// A shape and a reshape target with the same element count (random
/// regrouping of the prime factors, with random 1s).
fn reshape_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (
        prop::collection::vec(1usize..=6, 0..=4),
        any::<u64>(),
        prop::collection::vec(0usize..4, 0..8),
    )
        .prop_map(|(shape, seed, cuts)| {
            let mut factors: Vec<usize> = Vec::new();
            for &d in &shape {
                let mut n = d;
                let mut p = 2;
                while n > 1 {
                    while n % p == 0 {
                        factors.push(p);
                        n /= p;
                    }
                    p += 1;
                }
            }
            let order = permutation(factors.len(), seed);
            let factors: Vec<usize> = order.iter().map(|&i| factors[i]).collect();
            // group consecutive factors; `cuts` decides group sizes and 1s
            let mut target = Vec::new();
            let mut i = 0;
            for &c in &cuts {
                if c == 0 {
                    target.push(1);
                    continue;
                }
                if i < factors.len() {
                    let end = (i + c).min(factors.len());
                    target.push(factors[i..end].iter().product());
                    i = end;
                }
            }
            if i < factors.len() {
                target.push(factors[i..].iter().product());
            }
            (shape, target)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn broadcast_shapes_follows_numpy((a, b) in prop_oneof![compatible_shapes(), any_shapes()]) {
        let want = numpy_broadcast(&a, &b);
        match (silica::broadcast_shapes("test", &a, &b), &want) {
            (Ok(got), Some(w)) => prop_assert_eq!(&got, w),
            (Err(Error::ShapeMismatch { lhs, rhs, .. }), None) => {
                prop_assert_eq!(lhs, a.clone());
                prop_assert_eq!(rhs, b.clone());
            }
            (got, w) => prop_assert!(false, "{a:?} vs {b:?}: silica {got:?}, numpy {w:?}"),
        }
        // the tensor op agrees with the rule
        let r = iota(&a).add(&iota(&b));
        prop_assert_eq!(r.is_ok(), want.is_some(), "add {:?} + {:?}: {:?}", a, b, r);
        if let Ok(t) = r {
            prop_assert_eq!(t.shape(), want.as_deref().unwrap());
        } else {
            let is_shape_mismatch = matches!(r, Err(Error::ShapeMismatch { .. }));
            prop_assert!(is_shape_mismatch);
        }
    }

    #[test]
    fn broadcast_arithmetic_matches_index_arithmetic((a, b) in compatible_shapes()) {
        let out = numpy_broadcast(&a, &b).expect("compatible by construction");
        let na: usize = a.iter().product();
        let nb: usize = b.iter().product();
        let av: Vec<f32> = (0..na).map(|i| i as f32).collect();
        let bv: Vec<f32> = (0..nb).map(|i| 1000.0 * (i + 1) as f32).collect();
        let ta = Tensor::from_slice(&av, &a, &cpu()).unwrap();
        let tb = Tensor::from_slice(&bv, &b, &cpu()).unwrap();
        let sum = ta.add(&tb).unwrap();
        let diff = ta.sub(&tb).unwrap();
        let rsum = tb.add(&ta).unwrap();
        prop_assert_eq!(sum.shape(), out.as_slice());
        let (s, d, rs) = (vals(&sum), vals(&diff), vals(&rsum));
        for (flat, idx) in indices(&out).iter().enumerate() {
            let x = av[broadcast_source(&a, idx)];
            let y = bv[broadcast_source(&b, idx)];
            prop_assert_eq!(s[flat], x + y, "sum at {:?}", idx);
            prop_assert_eq!(d[flat], x - y, "difference at {:?}", idx);
            prop_assert_eq!(rs[flat], y + x, "reversed sum at {:?}", idx);
        }
        // broadcast_to gives the same element mapping
        let ba = vals(&ta.broadcast_to(&out).unwrap());
        for (flat, idx) in indices(&out).iter().enumerate() {
            prop_assert_eq!(ba[flat], av[broadcast_source(&a, idx)]);
        }
    }

    #[test]
    fn view_chains_match_a_nested_index_reference(
        shape in prop::collection::vec(1usize..=4, 1..=4),
        ops in prop::collection::vec(view_op(), 0..8),
    ) {
        let n: usize = shape.iter().product();
        let t0 = iota(&shape);
        let mut t = t0.clone();
        let mut r = Dense { shape: shape.clone(), data: (0..n).map(|i| i as f32).collect() };
        for op in &ops {
            if let Some((t2, r2)) = apply(op, &t, &r) {
                t = t2;
                r = r2;
                prop_assert_eq!(t.shape(), r.shape.as_slice(), "after {:?}", op);
            }
        }
        // the view reads the original storage: since element i holds i, the
        // storage offsets the layout visits are exactly the expected values
        let offsets: Vec<f32> = t.layout().offsets().map(|o| o as f32).collect();
        prop_assert_eq!(&offsets, &r.data, "layout offsets");
        prop_assert!(t.layout().storage_extent() <= n);
        prop_assert_eq!(t.numel(), r.data.len());
        prop_assert_eq!(&vals(&t), &r.data, "to_vec of the view");
        let c = t.contiguous().unwrap();
        prop_assert!(c.is_contiguous());
        prop_assert_eq!(c.shape(), r.shape.as_slice());
        prop_assert_eq!(&vals(&c), &r.data, "contiguous()");
        prop_assert_eq!(&vals(&t.copy().unwrap()), &r.data, "copy()");
        let flat = t.reshape(&[r.data.len()]).unwrap();
        prop_assert_eq!(&vals(&flat), &r.data, "reshape to 1-D");
        // the source tensor is untouched
        prop_assert_eq!(vals(&t0), (0..n).map(|i| i as f32).collect::<Vec<_>>());
    }

    #[test]
    fn reshape_round_trips((shape, target) in reshape_pair()) {
        let n: usize = shape.iter().product();
        prop_assert_eq!(target.iter().product::<usize>(), n);
        let t = iota(&shape);
        let r = t.reshape(&target).unwrap();
        prop_assert_eq!(r.shape(), target.as_slice());
        prop_assert!(r.is_contiguous(), "a reshape of a contiguous tensor is contiguous");
        prop_assert_eq!(vals(&r), vals(&t));
        let back = r.reshape(&shape).unwrap();
        prop_assert_eq!(back.shape(), shape.as_slice());
        prop_assert_eq!(back.layout(), t.layout());
        // a reshape of a transposed (non-contiguous) view keeps the logical order
        if shape.len() >= 2 {
            let tt = t.t().unwrap();
            let rt = tt.reshape(&target).unwrap();
            prop_assert_eq!(rt.shape(), target.as_slice());
            prop_assert_eq!(vals(&rt), vals(&tt));
            let back = rt.reshape(tt.shape()).unwrap();
            prop_assert_eq!(vals(&back), vals(&tt));
        }
    }

    #[test]
    fn f16_and_bf16_conversions_round_like_half(bits in any::<u32>()) {
        let x = f32::from_bits(bits);
        let t = Tensor::from_slice(&[x, -x, x * 0.5], &[3], &cpu()).unwrap();
        let h: Vec<f16> = t.to_dtype(DType::F16).unwrap().to_vec().unwrap();
        let b: Vec<bf16> = t.to_dtype(DType::BF16).unwrap().to_vec().unwrap();
        for (i, v) in [x, -x, x * 0.5].iter().enumerate() {
            let wh = f16::from_f32(*v);
            let wb = bf16::from_f32(*v);
            prop_assert!(h[i] == wh || (h[i].is_nan() && wh.is_nan()), "f16({}) = {} not {}", v, h[i], wh);
            prop_assert!(h[i].to_bits() == wh.to_bits() || wh.is_nan(), "f16({}) bits", v);
            prop_assert!(b[i].to_bits() == wb.to_bits() || (b[i].is_nan() && wb.is_nan()), "bf16({}) = {} not {}", v, b[i], wb);
        }
    }
}

// ---------------------------------------------------------------------------
// element types
// ---------------------------------------------------------------------------

fn round_trip<T: Element + std::fmt::Debug>(values: &[T], to_bits: impl Fn(&T) -> u64) {
    let dev = cpu();
    let n = values.len();
    for shape in [vec![n], vec![1, n], vec![n, 1]] {
        let t = Tensor::from_slice(values, &shape, &dev).unwrap();
        assert_eq!(t.dtype(), T::DTYPE);
        assert_eq!(t.shape(), shape.as_slice());
        let back: Vec<T> = t.to_vec().unwrap();
        assert_eq!(
            back.iter().map(&to_bits).collect::<Vec<_>>(),
            values.iter().map(&to_bits).collect::<Vec<_>>(),
            "{} round trip",
            T::DTYPE
        );
    }
    let v = Tensor::from_vec(values.to_vec(), &[n], &dev).unwrap();
    assert_eq!(v.to_vec::<T>().unwrap().len(), n);
    // a transposed view of the elements reads back in view order
    if n.is_multiple_of(2) {
        let t = Tensor::from_slice(values, &[2, n / 2], &dev).unwrap();
        let got: Vec<u64> = t
            .t()
            .unwrap()
            .to_vec::<T>()
            .unwrap()
            .iter()
            .map(&to_bits)
            .collect();
        let want: Vec<u64> = (0..n / 2)
            .flat_map(|j| [to_bits(&values[j]), to_bits(&values[n / 2 + j])])
            .collect();
        assert_eq!(got, want, "{} transposed", T::DTYPE);
    }
}

#[test]
fn element_types_round_trip() {
    round_trip(
        &[
            0.0f32,
            -0.0,
            1.5,
            f32::MAX,
            f32::MIN_POSITIVE,
            1e-45,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -3.25,
        ],
        |v| v.to_bits() as u64,
    );
    let f16s: Vec<f16> = [
        0x0000u16, 0x8000, 0x0001, 0x3c00, 0x7bff, 0x7c00, 0xfc00, 0x7e00, 0xc500, 0x03ff,
    ]
    .iter()
    .map(|&b| f16::from_bits(b))
    .collect();
    round_trip(&f16s, |v| v.to_bits() as u64);
    let bf16s: Vec<bf16> = [
        0x0000u16, 0x8000, 0x0001, 0x3f80, 0x7f7f, 0x7f80, 0xff80, 0x7fc0, 0xc0a0, 0x007f,
    ]
    .iter()
    .map(|&b| bf16::from_bits(b))
    .collect();
    round_trip(&bf16s, |v| v.to_bits() as u64);
    round_trip(&[0u32, 1, 2, 123_456_789, u32::MAX - 1, u32::MAX], |v| {
        *v as u64
    });
    round_trip(&[i64::MIN, -1, 0, 1, 1 << 53, i64::MAX], |v| *v as u64);

    for (dtype, size) in [
        (DType::F32, 4),
        (DType::F16, 2),
        (DType::BF16, 2),
        (DType::U32, 4),
        (DType::I64, 8),
    ] {
        assert_eq!(dtype.size_in_bytes(), size);
        assert_eq!(dtype.to_string(), dtype.as_str());
        let z = Tensor::zeros(&[2, 3], dtype, &cpu()).unwrap();
        assert_eq!(z.dtype(), dtype);
        assert_eq!(z.to_f64_vec().unwrap(), vec![0.0; 6]);
        let o = Tensor::ones(&[3], dtype, &cpu()).unwrap();
        assert_eq!(o.to_f64_vec().unwrap(), vec![1.0; 3]);
    }
    assert_eq!(<f32 as Element>::DTYPE, DType::F32);
    assert_eq!(<f16 as Element>::DTYPE, DType::F16);
    assert_eq!(<bf16 as Element>::DTYPE, DType::BF16);
    assert_eq!(<u32 as Element>::DTYPE, DType::U32);
    assert_eq!(<i64 as Element>::DTYPE, DType::I64);
}

#[test]
fn f32_to_f16_to_f32_rounds_like_half() {
    let eps = f32::powi(2.0, -11); // half an f16 ulp at 1.0
    let mut values = vec![
        0.0f32,
        -0.0,
        1.0,
        1.0 + eps,       // a tie: rounds to even (1.0)
        1.0 + 3.0 * eps, // a tie: rounds to even (1.0 + 4 eps)
        1.0 + 1.5 * eps,
        0.1,
        -2.7182817,
        65504.0,
        65519.0,
        65520.0, // rounds to infinity
        1e6,
        -1e6,
        6.0e-8, // near the smallest subnormal
        2.9e-8, // rounds to zero
        1e-5,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MIN_POSITIVE,
    ];
    values.extend((0..200).map(|i| (i as f32 - 100.0) * 0.0137));
    let t = Tensor::from_slice(&values, &[values.len()], &cpu()).unwrap();
    let h = t.to_dtype(DType::F16).unwrap();
    assert_eq!(h.dtype(), DType::F16);
    let back: Vec<f32> = h.to_dtype(DType::F32).unwrap().to_vec().unwrap();
    for (v, got) in values.iter().zip(&back) {
        let want = f16::from_f32(*v).to_f32();
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "f16 round trip of {v}: {got} vs {want}"
        );
    }
    // NaN stays NaN
    let nan = Tensor::from_slice(&[f32::NAN], &[1], &cpu()).unwrap();
    let n: Vec<f32> = nan
        .to_dtype(DType::F16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec()
        .unwrap();
    assert!(n[0].is_nan());
    // the same dtype is the same tensor
    assert_eq!(t.to_dtype(DType::F32).unwrap().layout(), t.layout());
}

/// The GPU's f32 -> f16 rounding (done with integer and float tricks in the
/// kernels) gives the same bits as `half` on every device: every f32 whose
/// magnitude rounds into the subnormal range, the ties and the neighbours
/// of every f16 boundary, overflow, infinities and NaN.
#[test]
fn gpu_f32_to_f16_rounds_like_half() {
    let mut values: Vec<f32> = Vec::new();
    // every 64th f32 from 0 up to 2^-13 (the subnormal halves and the first
    // normal ones), both signs
    let mut b = 0u32;
    while b <= 0x3900_0000 {
        values.push(f32::from_bits(b));
        values.push(-f32::from_bits(b));
        b += 64 * 1021;
    }
    // around each f16 value's midpoints: the ties and one f32 ulp either side
    for h in (0u16..0x7c00).step_by(7) {
        let lo = f16::from_bits(h).to_f32();
        let hi = f16::from_bits(h + 1).to_f32();
        let mid = (lo as f64 + hi as f64) / 2.0;
        let m = mid as f32;
        for v in [
            m,
            f32::from_bits(m.to_bits() + 1),
            f32::from_bits(m.to_bits().saturating_sub(1)),
        ] {
            values.push(v);
            values.push(-v);
        }
    }
    values.extend([
        65504.0,
        65519.0,
        65520.0,
        1e6,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
    ]);
    let n = values.len() & !1;
    values.truncate(n);
    for dev in common::gpu_devices() {
        let t = Tensor::from_slice(&values, &[n], &dev).unwrap();
        let got: Vec<f16> = t.to_dtype(DType::F16).unwrap().to_vec().unwrap();
        for (v, g) in values.iter().zip(&got) {
            let want = f16::from_f32(*v);
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "{dev:?}: f16 of {v:e} ({:#x})",
                v.to_bits()
            );
        }
        let nan = Tensor::from_slice(&[f32::NAN, 1.0], &[2], &dev).unwrap();
        let h: Vec<f16> = nan.to_dtype(DType::F16).unwrap().to_vec().unwrap();
        assert!(h[0].is_nan(), "{dev:?}: NaN became {}", h[0]);
    }
}

#[test]
fn every_16_bit_value_widens_exactly() {
    let bits: Vec<u16> = (0..=u16::MAX).collect();
    let h: Vec<f16> = bits.iter().map(|&b| f16::from_bits(b)).collect();
    let wide: Vec<f32> = Tensor::from_slice(&h, &[h.len()], &cpu())
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec()
        .unwrap();
    for (x, w) in h.iter().zip(&wide) {
        let want = x.to_f32();
        assert!(
            w.to_bits() == want.to_bits() || (w.is_nan() && want.is_nan()),
            "f16 {:#06x}: {w} vs {want}",
            x.to_bits()
        );
    }
    // and narrowing back gives the same bits (NaNs aside)
    let narrow: Vec<f16> = Tensor::from_slice(&wide, &[wide.len()], &cpu())
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap()
        .to_vec()
        .unwrap();
    for (x, y) in h.iter().zip(&narrow) {
        assert!(
            x.to_bits() == y.to_bits() || x.is_nan() && y.is_nan(),
            "{:#06x}",
            x.to_bits()
        );
    }
    let b: Vec<bf16> = bits.iter().map(|&b| bf16::from_bits(b)).collect();
    let wide: Vec<f32> = Tensor::from_slice(&b, &[b.len()], &cpu())
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec()
        .unwrap();
    for (x, w) in b.iter().zip(&wide) {
        let want = x.to_f32();
        assert!(
            w.to_bits() == want.to_bits() || (w.is_nan() && want.is_nan()),
            "bf16 {:#06x}: {w} vs {want}",
            x.to_bits()
        );
    }
}

#[test]
fn integer_conversions() {
    let t = Tensor::from_slice(&[-2.7f32, -0.5, 0.0, 0.9, 3.5, 4e9, 1e20], &[7], &cpu()).unwrap();
    // integer targets truncate toward zero and saturate
    assert_eq!(
        t.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(),
        vec![-2, 0, 0, 0, 3, 4_000_000_000, i64::MAX]
    );
    assert_eq!(
        t.to_dtype(DType::U32).unwrap().to_vec::<u32>().unwrap(),
        vec![0, 0, 0, 0, 3, 4_000_000_000, u32::MAX]
    );
    let i = Tensor::from_slice(&[-5i64, 0, 7, 1 << 40], &[4], &cpu()).unwrap();
    assert_eq!(
        i.to_dtype(DType::U32).unwrap().to_vec::<u32>().unwrap(),
        vec![0, 0, 7, u32::MAX]
    );
    let u = Tensor::from_slice(&[0u32, 7, u32::MAX], &[3], &cpu()).unwrap();
    assert_eq!(
        u.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(),
        vec![0, 7, u32::MAX as i64]
    );
}

// ---------------------------------------------------------------------------
// device selection
// ---------------------------------------------------------------------------

#[test]
fn select_by_name() {
    let c = Device::select("cpu").unwrap();
    assert!(c.is_cpu(), "{c}");
    assert!(c.same(&Device::cpu()));
    assert!(Device::select(" CPU ").unwrap().is_cpu());

    let adapters = silica::adapters();
    let (e, msg) = err_text(Device::select("no-such-adapter-xyz"), "select");
    match e {
        Error::NoDevice { selector, .. } => assert_eq!(selector, "no-such-adapter-xyz"),
        other => panic!("expected NoDevice, got {other:?}"),
    }
    assert!(msg.contains("no-such-adapter-xyz"), "{msg}");
    if adapters.is_empty() {
        assert!(msg.contains("no GPU adapter"), "{msg}");
    } else {
        assert!(msg.contains("adapters found"), "{msg}");
        for (i, a) in adapters.iter().enumerate() {
            assert_mentions(&msg, &[&format!("gpu:{i}"), &a.name]);
        }
    }
    let past = format!("gpu:{}", adapters.len());
    assert!(matches!(Device::select(&past), Err(Error::NoDevice { .. })));
    assert!(matches!(
        Device::gpu(adapters.len()),
        Err(Error::NoDevice { .. })
    ));
    assert!(matches!(
        Device::select("gpu:x"),
        Err(Error::NoDevice { .. })
    ));
    assert!(matches!(Device::select(""), Err(Error::NoDevice { .. })));

    // selectors that name an adapter find it
    if let Some(first) = adapters.first() {
        let d = Device::select("gpu:0").unwrap();
        assert!(d.is_gpu());
        assert_eq!(d.info().name, first.name);
        assert!(
            d.same(&Device::gpu(0).unwrap()),
            "opening twice gives the same device"
        );
        let by_name = Device::select(&first.name.to_uppercase()).unwrap();
        assert_eq!(by_name.info().name, first.name);
        let by_backend = Device::select(first.backend.as_str()).unwrap();
        assert_eq!(by_backend.info().backend, first.backend);
        assert!(Device::select("gpu").unwrap().is_gpu());
    } else {
        assert!(matches!(Device::select("gpu"), Err(Error::NoDevice { .. })));
    }
}

#[test]
fn a_read_started_early_sees_the_values_of_its_time() {
    let mut devices = vec![cpu()];
    devices.extend(common::gpu_devices());
    for d in devices {
        let mut t = Tensor::from_slice(&[1f32, 2.0, 3.0, 4.0], &[4], &d).unwrap();
        let read = t.narrow(0, 1, 2).unwrap().read_later().unwrap();
        // work queued after the read starts: overwrite the tensor in place
        let nines = Tensor::from_slice(&[9f32; 4], &[4], &d).unwrap();
        t.slice_assign(0, &nines).unwrap();
        let after = t.read_later().unwrap();
        assert_eq!(read.to_vec::<f32>().unwrap(), [2.0, 3.0], "{d}");
        assert_eq!(after.to_vec::<f32>().unwrap(), [9.0; 4], "{d}");
        let (e, _) = err_text(
            t.read_later().unwrap().to_vec::<u32>(),
            "a read-back as the wrong element type",
        );
        assert!(matches!(e, Error::DTypeMismatch { .. }), "{d}: {e}");
    }
}
