//! Automatic differentiation and optimizers: every op's gradient against
//! central finite differences of an f64 reference written here, the same
//! graphs on every GPU adapter against the CPU, SGD and AdamW against
//! PyTorch's update formulas, and logistic regressions trained to 100%
//! accuracy on every device.

mod common;

use silica::autograd::Var;
use silica::autograd::optim::{AdamW, Optimizer, Sgd};
use silica::{DType, Device, Error, Result, Tensor, UnaryOp};

// ----- deterministic inputs ---------------------------------------------

/// A small xorshift generator: the same values on every run and platform.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Uniform in `[0, 1)`.
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi)`, rounded to f32 so that the f32 tensors and
    /// the f64 reference see the same numbers.
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        (lo + (hi - lo) * self.next()) as f32 as f64
    }

    /// Values in `[lo, hi)`.
    fn array(&mut self, shape: &[usize], lo: f64, hi: f64) -> A {
        let n = shape.iter().product();
        A::new(shape, (0..n).map(|_| self.uniform(lo, hi)).collect())
    }

    /// Values in `±[0.1, 2)`: away from the kinks of `abs` and `relu`.
    fn signed(&mut self, shape: &[usize]) -> A {
        let mut a = self.array(shape, 0.1, 2.0);
        for v in &mut a.data {
            if self.next() < 0.5 {
                *v = -*v;
            }
        }
        a
    }
}

// ----- the f64 reference ------------------------------------------------

/// A row-major f64 array: the reference implementation's tensor.
#[derive(Clone, Debug)]
struct A {
    shape: Vec<usize>,
    data: Vec<f64>,
}

impl A {
    fn new(shape: &[usize], data: Vec<f64>) -> A {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "{shape:?}");
        A {
            shape: shape.to_vec(),
            data,
        }
    }

    fn rank(&self) -> usize {
        self.shape.len()
    }

    fn at(&self, idx: &[usize]) -> f64 {
        let mut flat = 0;
        for (i, s) in idx.iter().zip(&self.shape) {
            flat = flat * s + i;
        }
        self.data[flat]
    }

    /// The array of `shape` whose element at each index is `f(index)`.
    fn from_fn(shape: &[usize], mut f: impl FnMut(&[usize]) -> f64) -> A {
        let n: usize = shape.iter().product();
        let mut idx = vec![0; shape.len()];
        let mut data = Vec::with_capacity(n);
        for _ in 0..n {
            data.push(f(&idx));
            for d in (0..shape.len()).rev() {
                idx[d] += 1;
                if idx[d] < shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        A::new(shape, data)
    }

    fn map(&self, f: impl Fn(f64) -> f64) -> A {
        A::new(&self.shape, self.data.iter().map(|&x| f(x)).collect())
    }

    fn reshape(&self, shape: &[usize]) -> A {
        A::new(shape, self.data.clone())
    }

    fn to_tensor(&self, dev: &Device) -> Tensor {
        let v: Vec<f32> = self.data.iter().map(|&x| x as f32).collect();
        Tensor::from_vec(v, &self.shape, dev).unwrap()
    }
}

fn broadcast_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let da = if i + a.len() >= r {
                a[i + a.len() - r]
            } else {
                1
            };
            let db = if i + b.len() >= r {
                b[i + b.len() - r]
            } else {
                1
            };
            assert!(da == db || da == 1 || db == 1, "{a:?} and {b:?}");
            da.max(db)
        })
        .collect()
}

/// The index into an operand of `shape` that broadcasting maps `idx` to.
fn source_index(idx: &[usize], shape: &[usize]) -> Vec<usize> {
    let skip = idx.len() - shape.len();
    idx[skip..]
        .iter()
        .zip(shape)
        .map(|(&i, &s)| if s == 1 { 0 } else { i })
        .collect()
}

fn zip(a: &A, b: &A, f: impl Fn(f64, f64) -> f64) -> A {
    let shape = broadcast_shape(&a.shape, &b.shape);
    A::from_fn(&shape, |i| {
        f(
            a.at(&source_index(i, &a.shape)),
            b.at(&source_index(i, &b.shape)),
        )
    })
}

fn broadcast_to(a: &A, shape: &[usize]) -> A {
    A::from_fn(shape, |i| a.at(&source_index(i, &a.shape)))
}

fn with_dim(idx: &[usize], dim: usize, k: usize) -> Vec<usize> {
    let mut i = idx.to_vec();
    i[dim] = k;
    i
}

fn sum(a: &A, dim: usize, keepdim: bool) -> A {
    let mut shape = a.shape.clone();
    shape[dim] = 1;
    let out = A::from_fn(&shape, |i| {
        (0..a.shape[dim]).map(|k| a.at(&with_dim(i, dim, k))).sum()
    });
    if keepdim {
        return out;
    }
    shape.remove(dim);
    out.reshape(&shape)
}

fn mean(a: &A, dim: usize, keepdim: bool) -> A {
    let n = a.shape[dim] as f64;
    sum(a, dim, keepdim).map(|x| x / n)
}

fn sum_all(a: &A) -> A {
    A::new(&[], vec![a.data.iter().sum()])
}

fn softmax(a: &A, dim: usize, log: bool) -> A {
    A::from_fn(&a.shape, |i| {
        let row: Vec<f64> = (0..a.shape[dim])
            .map(|k| a.at(&with_dim(i, dim, k)))
            .collect();
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        let ls = a.at(i) - lse;
        if log { ls } else { ls.exp() }
    })
}

fn permute(a: &A, perm: &[usize]) -> A {
    let shape: Vec<usize> = perm.iter().map(|&p| a.shape[p]).collect();
    A::from_fn(&shape, |i| {
        let mut src = vec![0; perm.len()];
        for (j, &p) in perm.iter().enumerate() {
            src[p] = i[j];
        }
        a.at(&src)
    })
}

fn transpose(a: &A, d0: usize, d1: usize) -> A {
    let mut perm: Vec<usize> = (0..a.rank()).collect();
    perm.swap(d0, d1);
    permute(a, &perm)
}

fn narrow(a: &A, dim: usize, start: usize, len: usize) -> A {
    let mut shape = a.shape.clone();
    shape[dim] = len;
    A::from_fn(&shape, |i| a.at(&with_dim(i, dim, i[dim] + start)))
}

fn cat(a: &A, b: &A, dim: usize) -> A {
    let mut shape = a.shape.clone();
    shape[dim] += b.shape[dim];
    A::from_fn(&shape, |i| {
        if i[dim] < a.shape[dim] {
            a.at(i)
        } else {
            b.at(&with_dim(i, dim, i[dim] - a.shape[dim]))
        }
    })
}

/// `torch.matmul`: batch dimensions broadcast, 1-D operands as vectors.
fn matmul(a: &A, b: &A) -> A {
    let a2 = if a.rank() == 1 {
        a.reshape(&[1, a.shape[0]])
    } else {
        a.clone()
    };
    let b2 = if b.rank() == 1 {
        b.reshape(&[b.shape[0], 1])
    } else {
        b.clone()
    };
    let (ra, rb) = (a2.rank(), b2.rank());
    let (m, k, n) = (a2.shape[ra - 2], a2.shape[ra - 1], b2.shape[rb - 1]);
    let (a_batch, b_batch) = (&a2.shape[..ra - 2], &b2.shape[..rb - 2]);
    let mut shape = broadcast_shape(a_batch, b_batch);
    let batch_rank = shape.len();
    shape.extend([m, n]);
    let out = A::from_fn(&shape, |i| {
        let batch = &i[..batch_rank];
        let (row, col) = (i[batch_rank], i[batch_rank + 1]);
        let mut ai = source_index(batch, a_batch);
        let mut bi = source_index(batch, b_batch);
        ai.extend([row, 0]);
        bi.extend([0, col]);
        (0..k)
            .map(|kk| {
                ai[ra - 1] = kk;
                bi[rb - 2] = kk;
                a2.at(&ai) * b2.at(&bi)
            })
            .sum()
    });
    let mut final_shape = out.shape.clone();
    if b.rank() == 1 {
        final_shape.pop();
    }
    if a.rank() == 1 {
        final_shape.remove(final_shape.len() - 1 - (b.rank() != 1) as usize);
    }
    out.reshape(&final_shape)
}

fn cross_entropy(logits: &A, targets: &[u32], weights: Option<&[f64]>) -> A {
    let ls = softmax(logits, 1, true);
    let n = logits.shape[0];
    let total: f64 = (0..n)
        .map(|i| ls.at(&[i, targets[i] as usize]) * weights.map_or(1.0, |w| w[i]))
        .sum();
    A::new(&[], vec![-total / n as f64])
}

fn bce_with_logits(x: &A, y: &A, w: Option<&A>) -> A {
    let loss = zip(x, y, |x, y| x.max(0.0) - x * y + (-x.abs()).exp().ln_1p());
    let loss = match w {
        Some(w) => zip(&loss, w, |l, w| l * w),
        None => loss,
    };
    A::new(
        &[],
        vec![loss.data.iter().sum::<f64>() / loss.data.len() as f64],
    )
}

// ----- the cases --------------------------------------------------------

type Forward = Box<dyn Fn(&[Var], &Device) -> Result<Var>>;
type Reference = Box<dyn Fn(&[A]) -> A>;

/// A differentiable function of `inputs`, as vars and as the f64 reference.
struct Case {
    name: String,
    inputs: Vec<A>,
    forward: Forward,
    reference: Reference,
}

fn case(
    name: impl Into<String>,
    inputs: Vec<A>,
    forward: impl Fn(&[Var], &Device) -> Result<Var> + 'static,
    reference: impl Fn(&[A]) -> A + 'static,
) -> Case {
    Case {
        name: name.into(),
        inputs,
        forward: Box::new(forward),
        reference: Box::new(reference),
    }
}

fn unary_cases(rng: &mut Rng) -> Vec<Case> {
    UnaryOp::ALL
        .iter()
        .map(|&op| {
            let x = match op {
                UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip => {
                    rng.array(&[3, 4], 0.3, 2.0)
                }
                UnaryOp::GeluErf | UnaryOp::GeluTanh | UnaryOp::Silu | UnaryOp::Sigmoid => {
                    // 0 itself: the derivative of gelu_erf has a branch there
                    let mut x = rng.array(&[3, 4], -3.0, 3.0);
                    x.data[5] = 0.0;
                    x
                }
                _ => rng.signed(&[3, 4]),
            };
            case(
                op.name(),
                vec![x],
                move |v, _| v[0].unary(op),
                move |a| a[0].map(|x| op.apply(x)),
            )
        })
        .collect()
}

fn binary_cases(rng: &mut Rng) -> Vec<Case> {
    let shapes: [(&[usize], &[usize]); 5] = [
        (&[2, 3, 4], &[2, 3, 4]),
        (&[2, 3, 4], &[3, 1]),
        (&[2, 3, 4], &[4]),
        (&[3, 1], &[2, 1, 4]),
        (&[1, 3, 1], &[2, 3, 4]),
    ];
    let mut cases = Vec::new();
    for (sa, sb) in shapes {
        let a = rng.signed(sa);
        let b = rng.signed(sb);
        let name = |op: &str| format!("{op} {sa:?} {sb:?}");
        cases.push(case(
            name("add"),
            vec![a.clone(), b.clone()],
            |v, _| v[0].add(&v[1]),
            |a| zip(&a[0], &a[1], |x, y| x + y),
        ));
        cases.push(case(
            name("sub"),
            vec![a.clone(), b.clone()],
            |v, _| v[0].sub(&v[1]),
            |a| zip(&a[0], &a[1], |x, y| x - y),
        ));
        cases.push(case(
            name("mul"),
            vec![a.clone(), b.clone()],
            |v, _| v[0].mul(&v[1]),
            |a| zip(&a[0], &a[1], |x, y| x * y),
        ));
        let b_pos = rng.array(sb, 0.5, 2.0);
        cases.push(case(
            name("div"),
            vec![a, b_pos],
            |v, _| v[0].div(&v[1]),
            |a| zip(&a[0], &a[1], |x, y| x / y),
        ));
    }
    cases
}

fn scalar_cases(rng: &mut Rng) -> Vec<Case> {
    let x = rng.signed(&[3, 4]);
    let pos = rng.array(&[3, 4], 0.3, 2.0);
    vec![
        case(
            "add_scalar",
            vec![x.clone()],
            |v, _| v[0].add_scalar(0.7),
            |a| a[0].map(|x| x + 0.7f32 as f64),
        ),
        case(
            "sub_scalar",
            vec![x.clone()],
            |v, _| v[0].sub_scalar(1.3),
            |a| a[0].map(|x| x - 1.3f32 as f64),
        ),
        case(
            "mul_scalar",
            vec![x.clone()],
            |v, _| v[0].mul_scalar(-2.5),
            |a| a[0].map(|x| x * -2.5),
        ),
        case(
            "div_scalar",
            vec![x],
            |v, _| v[0].div_scalar(3.0),
            |a| a[0].map(|x| x / 3.0),
        ),
        case(
            "pow_scalar",
            vec![pos],
            |v, _| v[0].pow_scalar(2.5),
            |a| a[0].map(|x| x.powf(2.5)),
        ),
    ]
}

fn matmul_cases(rng: &mut Rng) -> Vec<Case> {
    let shapes: [(&[usize], &[usize]); 8] = [
        (&[3, 4], &[4, 5]),
        (&[2, 3, 4], &[4, 5]),
        (&[3, 4], &[2, 4, 5]),
        (&[2, 1, 3, 4], &[3, 4, 2]),
        (&[4], &[4, 5]),
        (&[3, 4], &[4]),
        (&[4], &[4]),
        (&[2, 3, 4], &[4]),
    ];
    let mut cases: Vec<Case> = shapes
        .iter()
        .map(|(sa, sb)| {
            case(
                format!("matmul {sa:?} {sb:?}"),
                vec![rng.signed(sa), rng.signed(sb)],
                |v, _| v[0].matmul(&v[1]),
                |a| matmul(&a[0], &a[1]),
            )
        })
        .collect();
    // transposed operands: views the product reads without a copy
    cases.push(case(
        "matmul of transposes",
        vec![rng.signed(&[4, 3]), rng.signed(&[5, 4])],
        |v, _| v[0].t()?.matmul(&v[1].t()?),
        |a| matmul(&transpose(&a[0], 0, 1), &transpose(&a[1], 0, 1)),
    ));
    cases
}

fn reduce_cases(rng: &mut Rng) -> Vec<Case> {
    let x = rng.signed(&[2, 3, 4]);
    let mut cases = Vec::new();
    for dim in [0isize, 1, -1] {
        for keepdim in [false, true] {
            let d = dim.rem_euclid(3) as usize;
            cases.push(case(
                format!("sum({dim}, {keepdim})"),
                vec![x.clone()],
                move |v, _| v[0].sum(dim, keepdim),
                move |a| sum(&a[0], d, keepdim),
            ));
            cases.push(case(
                format!("mean({dim}, {keepdim})"),
                vec![x.clone()],
                move |v, _| v[0].mean(dim, keepdim),
                move |a| mean(&a[0], d, keepdim),
            ));
        }
    }
    cases.push(case(
        "sum_all",
        vec![x.clone()],
        |v, _| v[0].sum_all(),
        |a| sum_all(&a[0]),
    ));
    cases.push(case(
        "mean_all",
        vec![x.clone()],
        |v, _| v[0].mean_all(),
        |a| sum_all(&a[0]).map(|s| s / 24.0),
    ));
    for (shape, dim) in [(&[3usize, 5][..], -1isize), (&[3, 5], 0), (&[2, 3, 4], 1)] {
        let x = rng.array(shape, -3.0, 3.0);
        let d = dim.rem_euclid(shape.len() as isize) as usize;
        cases.push(case(
            format!("softmax {shape:?} dim {dim}"),
            vec![x.clone()],
            move |v, _| v[0].softmax(dim),
            move |a| softmax(&a[0], d, false),
        ));
        cases.push(case(
            format!("log_softmax {shape:?} dim {dim}"),
            vec![x],
            move |v, _| v[0].log_softmax(dim),
            move |a| softmax(&a[0], d, true),
        ));
    }
    cases
}

fn view_cases(rng: &mut Rng) -> Vec<Case> {
    let x = rng.signed(&[2, 3, 4]);
    vec![
        case(
            "reshape",
            vec![x.clone()],
            // the exp makes the gradient depend on where each element went
            |v, _| v[0].reshape(&[6, 4])?.exp(),
            |a| a[0].reshape(&[6, 4]).map(f64::exp),
        ),
        case(
            "transpose",
            vec![x.clone()],
            |v, _| v[0].transpose(0, 2)?.sin(),
            |a| transpose(&a[0], 0, 2).map(f64::sin),
        ),
        case(
            "t",
            vec![rng.signed(&[3, 4])],
            |v, _| v[0].t()?.reshape(&[12])?.sin(),
            |a| transpose(&a[0], 0, 1).reshape(&[12]).map(f64::sin),
        ),
        case(
            "permute",
            vec![x.clone()],
            |v, _| v[0].permute(&[2, 0, 1])?.sin(),
            |a| permute(&a[0], &[2, 0, 1]).map(f64::sin),
        ),
        case(
            "narrow middle",
            vec![x.clone()],
            |v, _| v[0].narrow(1, 1, 1),
            |a| narrow(&a[0], 1, 1, 1),
        ),
        case(
            "narrow start",
            vec![x.clone()],
            |v, _| v[0].narrow(-1, 0, 3),
            |a| narrow(&a[0], 2, 0, 3),
        ),
        case(
            "narrow end",
            vec![x.clone()],
            |v, _| v[0].narrow(0, 1, 1),
            |a| narrow(&a[0], 0, 1, 1),
        ),
        case(
            "broadcast_to",
            vec![rng.signed(&[3, 1])],
            |v, _| v[0].broadcast_to(&[2, 3, 4])?.sin(),
            |a| broadcast_to(&a[0], &[2, 3, 4]).map(f64::sin),
        ),
        case(
            "unsqueeze, squeeze",
            vec![rng.signed(&[3, 4])],
            |v, _| v[0].unsqueeze(1)?.exp()?.squeeze(1),
            |a| a[0].map(f64::exp),
        ),
        case(
            "cat",
            vec![rng.signed(&[2, 3]), rng.signed(&[2, 2])],
            |v, _| Var::cat(&[&v[0], &v[1]], 1)?.sin(),
            |a| cat(&a[0], &a[1], 1).map(f64::sin),
        ),
    ]
}

fn loss_cases(rng: &mut Rng) -> Vec<Case> {
    let targets = [2u32, 0, 3, 3, 1];
    let ce_weights = [0.5f64, 1.0, 2.0, 0.25, 1.5];
    let mut x = rng.array(&[6, 3], -3.0, 3.0);
    x.data[4] = 0.0; // the kinks of max and abs cancel there
    let hard = A::new(
        &[6, 3],
        (0..18).map(|i| ((i * 7) % 3 == 0) as u8 as f64).collect(),
    );
    let soft = rng.array(&[6, 3], 0.0, 1.0);
    let bce_weights = rng.array(&[6, 1], 0.2, 2.0);
    let mut cases = vec![
        case(
            "cross_entropy",
            vec![rng.array(&[5, 4], -3.0, 3.0)],
            move |v, dev| v[0].cross_entropy(&Tensor::from_slice(&targets, &[5], dev)?),
            move |a| cross_entropy(&a[0], &targets, None),
        ),
        case(
            "cross_entropy_weighted",
            vec![rng.array(&[5, 4], -3.0, 3.0)],
            move |v, dev| {
                let w: Vec<f32> = ce_weights.iter().map(|&w| w as f32).collect();
                v[0].cross_entropy_weighted(
                    &Tensor::from_slice(&targets, &[5], dev)?,
                    &Tensor::from_vec(w, &[5], dev)?,
                )
            },
            move |a| cross_entropy(&a[0], &targets, Some(&ce_weights)),
        ),
    ];
    for (name, y, w) in [
        ("bce_with_logits", hard.clone(), None),
        ("bce_with_logits soft targets", soft, None),
        ("bce_with_logits_weighted", hard, Some(bce_weights)),
    ] {
        let (y2, w2) = (y.clone(), w.clone());
        cases.push(case(
            name,
            vec![x.clone()],
            move |v, dev| match &w2 {
                Some(w) => v[0].bce_with_logits_weighted(&y2.to_tensor(dev), &w.to_tensor(dev)),
                None => v[0].bce_with_logits(&y2.to_tensor(dev)),
            },
            move |a| bce_with_logits(&a[0], &y, w.as_ref()),
        ));
    }
    cases
}

fn composite_cases(rng: &mut Rng) -> Vec<Case> {
    vec![
        case(
            "x * x + x (reuse)",
            vec![rng.signed(&[3, 2])],
            |v, _| v[0].mul(&v[0])?.add(&v[0]),
            |a| a[0].map(|x| x * x + x),
        ),
        case(
            "tanh(x @ w + b) @ u, softmax",
            vec![
                rng.signed(&[4, 3]),
                rng.array(&[3, 5], -0.5, 0.5),
                rng.signed(&[5]),
                rng.array(&[5, 2], -0.5, 0.5),
            ],
            |v, _| {
                v[0].matmul(&v[1])?
                    .add(&v[2])?
                    .tanh()?
                    .matmul(&v[3])?
                    .softmax(-1)
            },
            |a| {
                let h = zip(&matmul(&a[0], &a[1]), &a[2], |x, b| (x + b).tanh());
                softmax(&matmul(&h, &a[3]), 1, false)
            },
        ),
    ]
}

fn all_cases() -> Vec<Case> {
    let mut rng = Rng::new(1);
    let mut cases = unary_cases(&mut rng);
    cases.extend(binary_cases(&mut rng));
    cases.extend(scalar_cases(&mut rng));
    cases.extend(matmul_cases(&mut rng));
    cases.extend(reduce_cases(&mut rng));
    cases.extend(view_cases(&mut rng));
    cases.extend(loss_cases(&mut rng));
    cases.extend(composite_cases(&mut rng));
    cases
}

/// The fixed weights `r` of the scalar `sum(f(inputs) * r)` differentiated
/// for a case whose output has `shape`.
fn loss_weights(shape: &[usize], seed: u64) -> A {
    Rng::new(seed).array(shape, -1.0, 1.0)
}

/// The case's output and the gradients of `sum(output * r)` on `dev`.
fn analytic(case: &Case, r: &A, dev: &Device) -> Result<(Vec<f64>, Vec<Vec<f64>>)> {
    let vars: Vec<Var> = case
        .inputs
        .iter()
        .map(|a| Var::param(a.to_tensor(dev)))
        .collect();
    let out = (case.forward)(&vars, dev)?;
    let loss = out.mul(&Var::constant(r.to_tensor(dev)))?.sum_all()?;
    loss.backward()?;
    let mut grads = Vec::new();
    for (v, a) in vars.iter().zip(&case.inputs) {
        let g = v.grad().expect("every input reaches the loss");
        assert_eq!(g.shape(), a.shape, "{}: gradient shape", case.name);
        assert_eq!(g.dtype(), DType::F32);
        grads.push(g.to_f64_vec()?);
    }
    Ok((out.value().to_f64_vec()?, grads))
}

/// Central differences of `sum(reference(inputs) * r)`, in f64.
fn finite_differences(case: &Case, r: &A) -> Vec<Vec<f64>> {
    let loss = |inputs: &[A]| -> f64 {
        let out = (case.reference)(inputs);
        assert_eq!(out.shape, r.shape, "{}: reference shape", case.name);
        out.data.iter().zip(&r.data).map(|(o, w)| o * w).sum()
    };
    let h = 1e-5;
    let mut inputs = case.inputs.clone();
    let mut grads = Vec::new();
    for i in 0..inputs.len() {
        let mut g = Vec::new();
        for j in 0..inputs[i].data.len() {
            let x = inputs[i].data[j];
            inputs[i].data[j] = x + h;
            let up = loss(&inputs);
            inputs[i].data[j] = x - h;
            let down = loss(&inputs);
            inputs[i].data[j] = x;
            g.push((up - down) / (2.0 * h));
        }
        grads.push(g);
    }
    grads
}

/// `|got - want| <= rtol * |want| + atol * max|want|` element by element.
fn assert_close(name: &str, got: &[f64], want: &[f64], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{name}: lengths");
    let scale = want.iter().fold(1e-3f64, |m, w| m.max(w.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rtol * w.abs() + atol * scale,
            "{name}: element {i} is {g}, expected {w} (max |expected| {scale})"
        );
    }
}

#[test]
fn gradients_match_finite_differences() {
    for (k, case) in all_cases().iter().enumerate() {
        let out_shape = (case.reference)(&case.inputs).shape;
        let r = loss_weights(&out_shape, 100 + k as u64);
        let (out, grads) =
            analytic(case, &r, &Device::Cpu).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let want_out = (case.reference)(&case.inputs);
        assert_close(
            &format!("{} value", case.name),
            &out,
            &want_out.data,
            1e-5,
            1e-6,
        );
        let fd = finite_differences(case, &r);
        for (i, (g, f)) in grads.iter().zip(&fd).enumerate() {
            assert_close(&format!("{} d/input{i}", case.name), g, f, 1e-3, 1e-4);
        }
    }
}

#[test]
fn gradients_on_gpu_match_cpu() {
    for dev in common::gpu_devices() {
        for (k, case) in all_cases().iter().enumerate() {
            let out_shape = (case.reference)(&case.inputs).shape;
            let r = loss_weights(&out_shape, 100 + k as u64);
            let (_, cpu) = analytic(case, &r, &Device::Cpu).unwrap();
            let (_, gpu) =
                analytic(case, &r, &dev).unwrap_or_else(|e| panic!("{} on {dev}: {e}", case.name));
            for (i, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
                let name = format!("{} d/input{i} on {dev}", case.name);
                assert_close(&name, g, c, 1e-3, 1e-4);
            }
        }
    }
}

// ----- the engine's behavior ----------------------------------------------

fn param(values: &[f32], shape: &[usize], dev: &Device) -> Var {
    Var::param(Tensor::from_slice(values, shape, dev).unwrap())
}

fn grad_of(v: &Var) -> Vec<f32> {
    v.grad().expect("a gradient").to_vec().unwrap()
}

#[test]
fn broadcast_gradients_are_summed_back() {
    let dev = Device::Cpu;
    let a = param(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &dev);
    let b = param(&[10.0, 20.0, 30.0], &[3], &dev);
    let c = param(&[2.0, 3.0], &[2, 1], &dev);
    // sum((a + b) * c): d/db = sum over rows of c, d/dc = row sums of a + b
    a.add(&b)
        .unwrap()
        .mul(&c)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(grad_of(&a), [2.0, 2.0, 2.0, 3.0, 3.0, 3.0]);
    assert_eq!(grad_of(&b), [5.0, 5.0, 5.0]);
    assert_eq!(grad_of(&c), [66.0, 75.0]);
    assert_eq!(b.grad().unwrap().shape(), [3]);
    assert_eq!(c.grad().unwrap().shape(), [2, 1]);
}

#[test]
fn gradients_accumulate_until_cleared() {
    let dev = Device::Cpu;
    let x = param(&[1.0, -2.0, 0.5], &[3], &dev);
    let loss = x.mul(&x).unwrap().add(&x).unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    assert_eq!(grad_of(&x), [3.0, -3.0, 2.0]);
    // a second pass over the same graph adds to the gradient
    loss.backward().unwrap();
    assert_eq!(grad_of(&x), [6.0, -6.0, 4.0]);
    x.zero_grad();
    assert!(x.grad().is_none());
    loss.backward().unwrap();
    assert_eq!(grad_of(&x), [3.0, -3.0, 2.0]);
    // a constant and a detached var get no gradient and stop the flow
    let k = Var::constant(Tensor::from_slice(&[2.0f32; 3], &[3], &dev).unwrap());
    x.zero_grad();
    let y = x
        .detach()
        .mul(&x)
        .unwrap()
        .mul(&k)
        .unwrap()
        .sum_all()
        .unwrap();
    y.backward().unwrap();
    assert_eq!(grad_of(&x), [2.0, -4.0, 1.0]);
    assert!(k.grad().is_none());
    assert!(!k.requires_grad() && y.requires_grad() && !y.is_leaf());
}

#[test]
fn vars_are_shared_handles() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Var>();
    let dev = Device::Cpu;
    let x = param(&[1.0, 2.0], &[2], &dev);
    let same = x.clone();
    assert_eq!(same.id(), x.id());
    let y = x.exp().unwrap();
    assert_eq!(format!("{x:?}"), "Var([2], f32, cpu, param)");
    assert!(format!("{y:?}").ends_with("from exp)"), "{y:?}");
    // a gradient reaches every clone
    y.sum_all().unwrap().backward().unwrap();
    assert!(same.grad().is_some());
}

#[test]
fn gradient_through_a_dtype_conversion() {
    let dev = Device::Cpu;
    let x = param(&[1.0, 2.0, 3.0], &[3], &dev);
    let y = x.to_dtype(DType::F16).unwrap().sqr().unwrap();
    assert_eq!(y.dtype(), DType::F16);
    y.to_dtype(DType::F32)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(x.grad().unwrap().dtype(), DType::F32);
    assert_eq!(grad_of(&x), [2.0, 4.0, 6.0]);
    assert!(x.to_dtype(DType::U32).is_err());
}

#[test]
fn long_chains_need_no_recursion() {
    // a graph far deeper than a recursive walk or drop could survive
    let dev = Device::Cpu;
    let x = param(&[1.0], &[1], &dev);
    let mut y = x.clone();
    for _ in 0..100_000 {
        y = y.add_scalar(1.0).unwrap();
    }
    let loss = y.mul_scalar(3.0).unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    assert_eq!(grad_of(&x), [3.0]);
    drop(y);
    drop(loss);
}

#[test]
fn errors_are_values() {
    let dev = Device::Cpu;
    let x = param(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &dev);
    // backward needs one element
    let e = x.mul_scalar(2.0).unwrap().backward().unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { op: "backward", .. }),
        "{e}"
    );
    // ...but takes an explicit gradient for any shape
    let g = Tensor::ones(&[2, 3], DType::F32, &dev).unwrap();
    x.mul_scalar(2.0).unwrap().backward_with(&g).unwrap();
    assert_eq!(grad_of(&x), [2.0; 6]);
    assert!(
        x.backward_with(&Tensor::ones(&[3], DType::F32, &dev).unwrap())
            .is_err()
    );
    // nothing to differentiate
    let k = Var::constant(Tensor::ones(&[1], DType::F32, &dev).unwrap());
    assert!(k.backward().is_err());
    // the ops' own errors
    let y = param(&[1.0; 4], &[4], &dev);
    assert!(matches!(x.add(&y), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(x.matmul(&x), Err(Error::ShapeMismatch { .. })));
    assert!(x.sum(2, false).is_err());
    assert!(x.narrow(1, 2, 2).is_err());
    // losses check their targets
    let t = Tensor::from_slice(&[0u32, 3], &[2], &dev).unwrap();
    assert!(matches!(
        x.cross_entropy(&t),
        Err(Error::IndexOutOfRange { index: 3, .. })
    ));
    let t = Tensor::from_slice(&[0u32, 1, 2], &[3], &dev).unwrap();
    assert!(matches!(
        x.cross_entropy(&t),
        Err(Error::ShapeMismatch { .. })
    ));
    let f = Tensor::from_slice(&[0.0f32, 1.0], &[2], &dev).unwrap();
    assert!(x.cross_entropy(&f).is_err());
    assert!(y.cross_entropy(&t).is_err());
    assert!(x.bce_with_logits(&f).is_err());
    let w = Tensor::ones(&[2, 1], DType::F32, &dev).unwrap();
    let ones = Tensor::ones(&[2, 3], DType::F32, &dev).unwrap();
    assert!(x.bce_with_logits_weighted(&ones, &w).is_ok());
    assert!(
        x.bce_with_logits_weighted(&ones, &ones.t().unwrap())
            .is_err()
    );
    // values of leaves only, and of the same shape
    assert!(
        x.set_value(Tensor::zeros(&[3, 2], DType::F32, &dev).unwrap())
            .is_err()
    );
    assert!(
        x.set_value(Tensor::zeros(&[2, 3], DType::F16, &dev).unwrap())
            .is_err()
    );
    let z = x.mul_scalar(1.0).unwrap();
    assert!(
        z.set_value(Tensor::zeros(&[2, 3], DType::F32, &dev).unwrap())
            .is_err()
    );
    x.set_value(Tensor::zeros(&[2, 3], DType::F32, &dev).unwrap())
        .unwrap();
}

// ----- optimizers ---------------------------------------------------------

/// The loss `sum(c * p²) + sum(d * p)` of the optimizer tests, whose
/// gradient `2 c p + d` the reference computes by hand.
fn quadratic(p: &Var, c: &[f32], d: &[f32]) -> Result<Var> {
    let dev = p.device();
    let c = Var::constant(Tensor::from_slice(c, &[c.len()], &dev)?);
    let d = Var::constant(Tensor::from_slice(d, &[d.len()], &dev)?);
    p.sqr()?.mul(&c)?.add(&p.mul(&d)?)?.sum_all()
}

const P0: [f32; 4] = [1.0, -0.5, 2.0, 0.25];
const C: [f32; 4] = [0.5, 2.0, 0.1, 1.0];
const D: [f32; 4] = [0.3, -0.2, 0.0, 1.5];

fn reference_grad(p: &[f64]) -> Vec<f64> {
    p.iter()
        .zip(C.iter().zip(&D))
        .map(|(&p, (&c, &d))| 2.0 * c as f64 * p + d as f64)
        .collect()
}

/// `steps` steps of `opt` on the quadratic, from `P0`, on `dev`.
fn optimize(opt: &mut dyn Optimizer, steps: usize, dev: &Device) -> Vec<f64> {
    let p = Var::param(Tensor::from_slice(&P0, &[4], dev).unwrap());
    for _ in 0..steps {
        opt.zero_grad(std::slice::from_ref(&p));
        quadratic(&p, &C, &D).unwrap().backward().unwrap();
        opt.step(std::slice::from_ref(&p)).unwrap();
    }
    p.value().to_f64_vec().unwrap()
}

/// `torch.optim.SGD` as its documentation gives it (dampening 0).
fn reference_sgd(lr: f64, momentum: f64, wd: f64, steps: usize) -> Vec<f64> {
    let mut p: Vec<f64> = P0.iter().map(|&x| x as f64).collect();
    let mut b: Option<Vec<f64>> = None;
    for _ in 0..steps {
        let g: Vec<f64> = reference_grad(&p)
            .iter()
            .zip(&p)
            .map(|(g, p)| g + wd * p)
            .collect();
        let d = if momentum != 0.0 {
            let nb: Vec<f64> = match &b {
                None => g,
                Some(b) => b.iter().zip(&g).map(|(b, g)| momentum * b + g).collect(),
            };
            b = Some(nb.clone());
            nb
        } else {
            g
        };
        p = p.iter().zip(&d).map(|(p, d)| p - lr * d).collect();
    }
    p
}

/// `torch.optim.AdamW` as its documentation gives it.
fn reference_adamw(lr: f64, b1: f64, b2: f64, eps: f64, wd: f64, steps: usize) -> Vec<f64> {
    let mut p: Vec<f64> = P0.iter().map(|&x| x as f64).collect();
    let mut m = [0.0; 4];
    let mut v = [0.0; 4];
    for t in 1..=steps as i32 {
        let g = reference_grad(&p);
        for i in 0..4 {
            p[i] -= lr * wd * p[i];
            m[i] = b1 * m[i] + (1.0 - b1) * g[i];
            v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
            let m_hat = m[i] / (1.0 - b1.powi(t));
            let v_hat = v[i] / (1.0 - b2.powi(t));
            p[i] -= lr * m_hat / (v_hat.sqrt() + eps);
        }
    }
    p
}

fn all_devices() -> Vec<Device> {
    let mut devs = vec![Device::Cpu];
    devs.extend(common::gpu_devices());
    devs
}

#[test]
fn sgd_matches_torch_formula() {
    for dev in all_devices() {
        for (momentum, wd) in [(0.0, 0.0), (0.9, 0.0), (0.9, 0.1), (0.5, 0.3)] {
            let mut opt = Sgd::new(0.1).with_momentum(momentum).with_weight_decay(wd);
            let got = optimize(&mut opt, 5, &dev);
            let want = reference_sgd(0.1, momentum, wd, 5);
            let name = format!("sgd momentum {momentum} wd {wd} on {dev}");
            assert_close(&name, &got, &want, 1e-5, 1e-6);
        }
    }
}

#[test]
fn adamw_matches_torch_formula() {
    // one step by hand, from p = 1 with the gradient 2 c p + d = 1.3:
    // m = 0.13, v = 0.00169, m̂ = 1.3, v̂ = 1.69, p = 0.999 - 0.1 * 1.3 / (1.3 + 1e-8)
    let want_first = 0.999 - 0.1 * 1.3 / (1.3 + 1e-8);
    assert!((reference_adamw(0.1, 0.9, 0.999, 1e-8, 0.01, 1)[0] - want_first).abs() < 1e-12);
    for dev in all_devices() {
        let settings = [
            (0.9, 0.999, 1e-8, 0.01),
            (0.8, 0.99, 1e-3, 0.0),
            (0.5, 0.9, 1e-6, 0.2),
        ];
        for (b1, b2, eps, wd) in settings {
            let mut opt = AdamW::new(0.1)
                .with_betas(b1, b2)
                .with_eps(eps)
                .with_weight_decay(wd);
            let got = optimize(&mut opt, 6, &dev);
            let want = reference_adamw(0.1, b1, b2, eps, wd, 6);
            let name = format!("adamw betas ({b1}, {b2}) eps {eps} wd {wd} on {dev}");
            assert_close(&name, &got, &want, 1e-5, 1e-5);
        }
    }
}

#[test]
fn optimizers_skip_params_without_gradients() {
    let dev = Device::Cpu;
    let used = param(&[1.0, 2.0], &[2], &dev);
    let unused = param(&[3.0, 4.0], &[2], &dev);
    let frozen = Var::constant(Tensor::from_slice(&[5.0f32, 6.0], &[2], &dev).unwrap());
    let params = [used.clone(), unused.clone(), frozen.clone(), used.clone()];
    used.mul(&frozen)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let mut sgd = Sgd::new(0.5);
    sgd.step(&params).unwrap();
    // updated once although listed twice
    assert_eq!(used.value().to_vec::<f32>().unwrap(), [-1.5, -1.0]);
    assert_eq!(unused.value().to_vec::<f32>().unwrap(), [3.0, 4.0]);
    assert_eq!(frozen.value().to_vec::<f32>().unwrap(), [5.0, 6.0]);
    let mut adam = AdamW::new(0.1);
    adam.step(&params).unwrap();
    assert_eq!(unused.value().to_vec::<f32>().unwrap(), [3.0, 4.0]);
    adam.zero_grad(&params);
    assert!(used.grad().is_none());
    // bad hyperparameters are errors
    adam.beta1 = 1.0;
    assert!(adam.step(&params).is_err());
    sgd.lr = f64::NAN;
    assert!(sgd.step(&params).is_err());
}

// ----- logistic regressions -----------------------------------------------

/// Points in `[-2, 2]^dims` labelled by the argmax of `w x + b` for a fixed
/// random `w [classes, dims]`, keeping only those whose best score beats
/// the others by `margin`: linearly separable with a margin.
fn separable(classes: usize, dims: usize, n: usize, seed: u64) -> (Vec<f32>, Vec<u32>) {
    let mut rng = Rng::new(seed);
    let w: Vec<f64> = (0..classes * dims)
        .map(|_| rng.uniform(-1.0, 1.0))
        .collect();
    let b: Vec<f64> = (0..classes).map(|_| rng.uniform(-0.5, 0.5)).collect();
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    while ys.len() < n {
        let x: Vec<f64> = (0..dims).map(|_| rng.uniform(-2.0, 2.0)).collect();
        let mut scores: Vec<(f64, usize)> = (0..classes)
            .map(|c| {
                let s: f64 = (0..dims).map(|d| w[c * dims + d] * x[d]).sum();
                (s + b[c], c)
            })
            .collect();
        scores.sort_by(|a, b| b.0.total_cmp(&a.0));
        if scores[0].0 - scores[1].0 > 0.4 {
            xs.extend(x.iter().map(|&v| v as f32));
            ys.push(scores[0].1 as u32);
        }
    }
    (xs, ys)
}

/// Binary logistic regression (sigmoid, BCE and an L2 penalty) trained
/// with AdamW on mini-batches; the training accuracy it reaches.
fn train_binary(dev: &Device) -> Result<f64> {
    let (n, dims, batch) = (48, 3, 16);
    let (xs, ys) = separable(2, dims, n, 7);
    let x = Tensor::from_slice(&xs, &[n, dims], dev)?;
    let y_f: Vec<f32> = ys.iter().map(|&y| y as f32).collect();
    let y = Tensor::from_slice(&y_f, &[n, 1], dev)?;
    let w = Var::param(Tensor::zeros(&[dims, 1], DType::F32, dev)?);
    let b = Var::param(Tensor::zeros(&[1], DType::F32, dev)?);
    let params = [w.clone(), b.clone()];
    let mut opt = AdamW::new(0.1).with_weight_decay(0.0);
    for _ in 0..40 {
        for start in (0..n).step_by(batch) {
            let xb = Var::constant(x.narrow(0, start, batch)?);
            let yb = y.narrow(0, start, batch)?;
            let logits = xb.matmul(&w)?.add(&b)?;
            let l2 = w.sqr()?.sum_all()?.mul_scalar(1e-3)?;
            let loss = logits.bce_with_logits(&yb)?.add(&l2)?;
            opt.zero_grad(&params);
            loss.backward()?;
            opt.step(&params)?;
        }
    }
    let logits = x.matmul(&w.value())?.add(&b.value())?.to_vec::<f32>()?;
    let right = logits
        .iter()
        .zip(&ys)
        .filter(|&(&z, &y)| (z > 0.0) == (y == 1))
        .count();
    Ok(right as f64 / n as f64)
}

/// Softmax regression (cross-entropy, AdamW's decoupled weight decay) over
/// three classes; the training accuracy it reaches.
fn train_multiclass(dev: &Device) -> Result<f64> {
    let (n, dims, classes) = (60, 2, 3);
    let (xs, ys) = separable(classes, dims, n, 11);
    let x = Var::constant(Tensor::from_slice(&xs, &[n, dims], dev)?);
    let y = Tensor::from_slice(&ys, &[n], dev)?;
    let w = Var::param(Tensor::zeros(&[dims, classes], DType::F32, dev)?);
    let b = Var::param(Tensor::zeros(&[classes], DType::F32, dev)?);
    let params = [w.clone(), b.clone()];
    let mut opt = AdamW::new(0.1).with_weight_decay(1e-3);
    for _ in 0..150 {
        let loss = x.matmul(&w)?.add(&b)?.cross_entropy(&y)?;
        opt.zero_grad(&params);
        loss.backward()?;
        opt.step(&params)?;
    }
    let predicted: Vec<u32> = x.matmul(&w)?.add(&b)?.value().argmax(-1, false)?.to_vec()?;
    let right = predicted.iter().zip(&ys).filter(|(p, y)| p == y).count();
    Ok(right as f64 / n as f64)
}

#[test]
fn logistic_regressions_separate_their_training_sets() {
    for dev in all_devices() {
        let binary = train_binary(&dev).unwrap_or_else(|e| panic!("binary on {dev}: {e}"));
        assert_eq!(binary, 1.0, "binary logistic regression on {dev}");
        let multi = train_multiclass(&dev).unwrap_or_else(|e| panic!("softmax on {dev}: {e}"));
        assert_eq!(multi, 1.0, "softmax regression on {dev}");
    }
}
