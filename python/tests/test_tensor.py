"""Tensors: NumPy round trips and every op against NumPy, on the CPU and
on every GPU adapter."""

import math

import numpy as np
import pytest

import silica

RNG = np.random.default_rng(0)


def rand(*shape, lo=-1.0, hi=1.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


def close(t, want, rtol=1e-5, atol=1e-5):
    assert isinstance(t, silica.Tensor)
    got = t.numpy()
    assert got.shape == np.shape(want), (got.shape, np.shape(want))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


# ----- round trips ------------------------------------------------------------


def test_round_trip_dtypes(device):
    x = rand(3, 4)
    t = silica.tensor(x, device=device)
    assert (t.shape, t.dtype, t.device, t.ndim, t.numel()) == ((3, 4), "f32", device, 2, 12)
    assert t.nbytes == 48 and len(t) == 3
    np.testing.assert_array_equal(t.numpy(), x)
    np.testing.assert_array_equal(np.asarray(t), x)
    h = silica.tensor(x.astype(np.float16), device=device)
    assert h.dtype == "f16" and h.numpy().dtype == np.float16
    np.testing.assert_array_equal(h.numpy(), x.astype(np.float16))
    # bf16 leaves as float32, rounded to 8 bits of mantissa
    b = t.to("bf16")
    assert b.dtype == "bf16" and b.numpy().dtype == np.float32
    np.testing.assert_allclose(b.numpy(), x, rtol=2**-8)
    np.testing.assert_array_equal(b.to("f32").numpy(), b.numpy())
    # float64 arrives as f32; ints as i64 or u32; bool as a u32 mask
    assert silica.tensor(x.astype(np.float64), device=device).dtype == "f32"
    assert silica.tensor(np.arange(5), device=device).dtype == "i64"
    u = silica.tensor(np.arange(5, dtype=np.uint32), device=device)
    assert u.dtype == "u32" and u.numpy().tolist() == [0, 1, 2, 3, 4]
    assert silica.tensor([True, False], device=device).numpy().tolist() == [1, 0]
    assert silica.tensor([[1.5, 2.5]], device=device, dtype="f16").dtype == "f16"
    # a strided view reads back in its own order; 0-d and empty tensors
    np.testing.assert_array_equal(t.T.numpy(), x.T)
    assert silica.tensor(np.float32(3.5), device=device).item() == 3.5
    assert silica.tensor(np.zeros((0, 3), np.float32), device=device).shape == (0, 3)


def test_cpu_numpy_shares_the_tensor_memory():
    import gc

    x = rand(3, 4)
    t = silica.tensor(x)
    a, b = t.numpy(), t.numpy()
    # two reads of one tensor are views of the same memory, read-only
    assert np.shares_memory(a, b) and not a.flags.writeable
    with pytest.raises(ValueError):
        a[0, 0] = 1.0
    np.testing.assert_array_equal(a, x)
    # a transposed view keeps its strides instead of gathering
    tt = t.T.numpy()
    assert np.shares_memory(tt, a) and tt.strides == (4, 16)
    np.testing.assert_array_equal(tt, x.T)
    # the array keeps the storage alive after the tensor is gone
    del t, b, tt
    gc.collect()
    np.testing.assert_array_equal(a, x)
    # asarray is the view, array a writable copy; bf16 cannot be viewed
    t = silica.tensor(x)
    assert np.shares_memory(np.asarray(t), t.numpy())
    c = np.array(t)
    assert c.flags.writeable and not np.shares_memory(c, t.numpy())
    assert np.asarray(t, copy=False).base is not None
    with pytest.raises(ValueError):
        np.asarray(t.to("bf16"), copy=False)
    with pytest.raises(ValueError):
        np.asarray(t, dtype=np.float64, copy=False)
    np.testing.assert_array_equal(np.asarray(t, dtype=np.float64), x.astype(np.float64))


def test_gpu_numpy_is_a_copy(gpu):
    t = silica.tensor(rand(2, 2), device=gpu)
    assert t.numpy().flags.writeable
    with pytest.raises(ValueError):
        np.asarray(t, copy=False)


def test_to_moves_between_devices(device):
    x = rand(2, 5)
    t = silica.tensor(x, device="cpu").to(device)
    assert t.device == device
    back = t.to("cpu", "f16")
    assert back.device == silica.Device("cpu") and back.dtype == "f16"
    assert t.to(dtype="f32") is not None
    np.testing.assert_array_equal(t.cpu().numpy(), x)


def test_ml_dtypes_bfloat16_arrives_as_bf16(device):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = rand(4).astype(ml_dtypes.bfloat16)
    t = silica.tensor(x, device=device)
    assert t.dtype == "bf16"
    np.testing.assert_array_equal(t.numpy(), x.astype(np.float32))


def test_constructors_agree_across_devices(device):
    np.testing.assert_array_equal(silica.zeros((2, 3), device=device).numpy(), np.zeros((2, 3)))
    np.testing.assert_array_equal(silica.ones(4, device=device, dtype="f16").numpy(), np.ones(4))
    np.testing.assert_array_equal(silica.full((2,), 7.0, device=device).numpy(), [7, 7])
    np.testing.assert_array_equal(silica.arange(5, device=device).numpy(), np.arange(5))
    np.testing.assert_allclose(silica.arange(1, 2, 0.25, device=device).numpy(), [1, 1.25, 1.5, 1.75])
    cpu = silica.randn((3, 3), seed=7, device="cpu").numpy()
    np.testing.assert_array_equal(silica.randn((3, 3), seed=7, device=device).numpy(), cpu)
    u = silica.rand((100,), seed=1, device=device).numpy()
    assert u.min() >= 0 and u.max() < 1


# ----- elementwise --------------------------------------------------------------


UNARY = {
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "abs": np.abs,
    "neg": np.negative,
    "reciprocal": lambda x: 1 / x,
    "square": np.square,
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "silu": lambda x: x / (1 + np.exp(-x)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(device, name):
    x = rand(4, 7, lo=0.1, hi=2.0) if name in ("log", "sqrt", "rsqrt") else rand(4, 7)
    t = silica.tensor(x, device=device)
    close(getattr(t, name)(), UNARY[name](x))
    close(getattr(silica, name)(t), UNARY[name](x))


def test_gelu(device):
    x = rand(64) * 3
    t = silica.tensor(x, device=device)
    erf = np.vectorize(math.erf)
    close(t.gelu(), 0.5 * x * (1 + erf(x / math.sqrt(2))), atol=1e-5)
    c = math.sqrt(2 / math.pi)
    close(t.gelu("tanh"), 0.5 * x * (1 + np.tanh(c * (x + 0.044715 * x**3))), atol=1e-5)


def test_operators_broadcast(device):
    a, b = rand(3, 1, 5), rand(4, 5, lo=0.5, hi=2.0)
    ta, tb = silica.tensor(a, device=device), silica.tensor(b, device=device)
    close(ta + tb, a + b)
    close(ta - tb, a - b)
    close(ta * tb, a * b)
    close(ta / tb, a / b)
    close(tb**ta, b**a, rtol=1e-5)
    close(-ta, -a)
    close(abs(ta), np.abs(a))
    close(silica.maximum(ta, tb), np.maximum(a, b))
    close(ta.minimum(tb), np.minimum(a, b))
    # scalars on either side, and NumPy arrays as operands
    close(ta + 2, a + 2)
    close(2 - ta, 2 - a)
    close(ta * 0.5, a * 0.5)
    close(3 / tb, 3 / b)
    close(ta**2, a**2)
    close(2.0**ta, 2.0**a)
    close(ta + b, a + b)
    close(b - ta, b - a)
    close(ta + np.float32(1.5), a + 1.5)


def test_comparisons(device):
    a, b = rand(2, 6), rand(6)
    ta, tb = silica.tensor(a, device=device), silica.tensor(b, device=device)
    for got, want in [
        (ta < tb, a < b),
        (ta <= tb, a <= b),
        (ta > tb, a > b),
        (ta >= 0, a >= 0),
        (ta == ta, a == a),
        (ta != tb, a != b),
    ]:
        assert got.dtype == "u32"
        np.testing.assert_array_equal(got.numpy(), want.astype(np.uint32))
    np.testing.assert_array_equal(silica.where(ta > 0, ta, 0.0).numpy(), np.where(a > 0, a, 0))


def test_f16_ops(device):
    a, b = rand(8, 16), rand(16, 8)
    ta = silica.tensor(a, device=device, dtype="f16")
    tb = silica.tensor(b, device=device, dtype="f16")
    close(ta + 1, a + 1, rtol=1e-2, atol=1e-2)
    close((ta @ tb).to("f32"), a @ b, rtol=2e-2, atol=2e-2)
    close(ta.softmax(-1), np.exp(a) / np.exp(a).sum(-1, keepdims=True), rtol=1e-2, atol=1e-3)


# ----- reductions and products ----------------------------------------------------


def test_reductions(device):
    x = rand(3, 4, 5)
    t = silica.tensor(x, device=device)
    close(t.sum(), x.sum(), rtol=1e-4)
    close(t.sum(1), x.sum(1))
    close(t.sum((0, 2), keepdim=True), x.sum((0, 2), keepdims=True), rtol=1e-5)
    close(t.mean(-1), x.mean(-1))
    close(silica.mean(t, (0, 1)), x.mean((0, 1)))
    close(t.max(0), x.max(0))
    close(t.min(2, keepdim=True), x.min(2, keepdims=True))
    np.testing.assert_array_equal(t.argmax(-1).numpy(), x.argmax(-1))
    assert t.argmax().item() == x.argmax()
    assert t.argmin(1).dtype == "u32"


def test_softmax(device):
    x = rand(4, 9) * 5
    t = silica.tensor(x, device=device)
    e = np.exp(x - x.max(-1, keepdims=True))
    close(t.softmax(-1), e / e.sum(-1, keepdims=True))
    close(silica.log_softmax(t, 0), x - np.log(np.exp(x).sum(0, keepdims=True)), atol=1e-5)


def test_matmul(device):
    a, b = rand(2, 3, 8, 16), rand(16, 5)
    ta, tb = silica.tensor(a, device=device), silica.tensor(b, device=device)
    close(ta @ tb, a @ b, rtol=1e-4, atol=1e-5)
    close(silica.matmul(tb.T, tb), b.T @ b, rtol=1e-4, atol=1e-5)
    v = rand(16)
    close(ta @ v, a @ v, rtol=1e-4, atol=1e-5)
    close(v @ tb, v @ b, rtol=1e-4, atol=1e-5)


# ----- transformer ops ----------------------------------------------------------------


def test_norms(device):
    x, w, bias = rand(3, 32), rand(32), rand(32)
    t = silica.tensor(x, device=device)
    rms = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * w
    close(t.rms_norm(silica.tensor(w, device=device)), rms, rtol=1e-4, atol=1e-5)
    close(silica.rms_norm(t, w, eps=1e-6), rms, rtol=1e-4, atol=1e-5)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    ln = (x - mu) / np.sqrt(var + 1e-5) * w + bias
    close(silica.layer_norm(t, w, bias), ln, rtol=1e-4, atol=1e-4)
    close(t.layer_norm(), (x - mu) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-4)


def test_rope(device):
    t_len, heads, d = 5, 2, 8
    x = rand(t_len, heads, d)
    cos, sin = silica.rope_tables(t_len, d, theta=10000.0, device=device)
    pos = np.arange(t_len)[:, None]
    ang = pos * 10000.0 ** (-2 * np.arange(d // 2) / d)
    np.testing.assert_allclose(cos.numpy(), np.cos(ang), rtol=1e-6, atol=1e-6)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., : d // 2], x[..., d // 2 :]
    want = np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], -1)
    close(silica.tensor(x, device=device).rope(cos, sin), want, atol=1e-5)
    xa, xb = x[..., 0::2], x[..., 1::2]
    adj = np.stack([xa * c - xb * s, xa * s + xb * c], -1).reshape(x.shape)
    close(silica.rope(silica.tensor(x, device=device), cos, sin, style="adjacent"), adj, atol=1e-5)


def ref_attention(q, k, v, causal, mask=None):
    b, tq, h, d = q.shape
    tk, kvh = k.shape[1], k.shape[2]
    rep = h // kvh
    k = np.repeat(k, rep, axis=2)
    v = np.repeat(v, rep, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(d)
    if mask is not None:
        s = s + mask
    if causal:
        allowed = np.arange(tk)[None, :] <= np.arange(tq)[:, None] + (tk - tq)
        s = np.where(allowed, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhij,bjhd->bihd", p, v)


@pytest.mark.parametrize("causal", [False, True])
def test_attention(device, causal):
    q, k, v = rand(2, 4, 4, 16), rand(2, 6, 2, 16), rand(2, 6, 2, 16)
    tq, tk, tv = (silica.tensor(a, device=device) for a in (q, k, v))
    close(tq.attention(tk, tv, causal=causal), ref_attention(q, k, v, causal), rtol=1e-4, atol=1e-5)
    mask = np.zeros((2, 1, 1, 6), np.float32)
    mask[1, ..., 4:] = -np.inf  # padding of the second sequence
    close(
        silica.attention(tq, tk, tv, mask=mask),
        ref_attention(q, k, v, False, mask),
        rtol=1e-4,
        atol=1e-5,
    )


def test_swiglu(device):
    g, u = rand(3, 10), rand(3, 10)
    want = g / (1 + np.exp(-g)) * u
    close(silica.swiglu(silica.tensor(g, device=device), silica.tensor(u, device=device)), want)


# ----- views and indexing -------------------------------------------------------------


def test_views(device):
    x = rand(2, 3, 4)
    t = silica.tensor(x, device=device)
    close(t.reshape(6, -1), x.reshape(6, -1))
    close(t.view((4, 6)), x.reshape(4, 6))
    close(t.flatten(), x.reshape(-1))
    close(t.flatten(1), x.reshape(2, 12))
    close(t.transpose(0, 2), x.transpose(2, 1, 0))
    close(t.permute(1, 2, 0), x.transpose(1, 2, 0))
    close(t.mT, np.swapaxes(x, -1, -2))
    close(t.narrow(1, 1, 2), x[:, 1:3])
    close(t.unsqueeze(0).squeeze(0), x)
    close(t[:1].squeeze(), x[0])
    close(t[:, :1].broadcast_to(2, 5, 4), np.broadcast_to(x[:, :1], (2, 5, 4)))
    close(t.expand((3, 2, 3, 4)), np.broadcast_to(x, (3, 2, 3, 4)))
    close(t.T.contiguous(), x.T)
    close(silica.cat([t, t], 1), np.concatenate([x, x], 1))
    close(silica.stack([t, t], -1), np.stack([x, x], -1))


@pytest.mark.parametrize(
    "key",
    [
        1,
        -1,
        (0, 2),
        slice(1, None),
        (slice(None), slice(None, None, 2)),
        (Ellipsis, 0),
        (None, 1, slice(None, None, -1)),
        (slice(None), [2, 0]),
        (slice(None), slice(3, 0, -1), 1),
        (..., None),
    ],
)
def test_indexing(device, key):
    x = rand(3, 4, 5)
    close(silica.tensor(x, device=device)[key], x[key])


def test_index_select(device):
    x = rand(5, 3)
    t = silica.tensor(x, device=device)
    close(t.index_select(0, [4, 0, 0]), x[[4, 0, 0]])
    close(t[silica.tensor(np.array([1, 3]), device=device)], x[[1, 3]])


def test_python_protocols(device):
    t = silica.tensor([[1.0, 2.0]], device=device)
    assert t.tolist() == [[1.0, 2.0]]
    assert float(t[0, 1]) == 2.0 and int(t[0, 0]) == 1
    assert bool(t[0, 0]) is True
    assert "tensor([[1., 2.]]" in repr(t)
    assert [row.tolist() for row in t] == [[1.0, 2.0]]
    with pytest.raises(ValueError):
        bool(t)
