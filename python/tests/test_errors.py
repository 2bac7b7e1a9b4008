"""Bad input raises Python exceptions carrying the Rust message, of the
type its kind calls for; nothing takes the interpreter down."""

import numpy as np
import pytest

import silica


def t(x, device, **kw):
    return silica.tensor(np.asarray(x, dtype=np.float32), device=device, **kw)


def test_shape_errors_are_value_errors(device):
    a, b = t(np.ones((2, 3)), device), t(np.ones((4,)), device)
    with pytest.raises(ValueError, match=r"add: shapes \[2, 3\] and \[4\] are incompatible"):
        a + b
    with pytest.raises(ValueError, match="matmul"):
        a @ a
    with pytest.raises(ValueError, match="reshape"):
        a.reshape(4, 2)
    with pytest.raises(ValueError):
        a.reshape(-1, -1)
    with pytest.raises(ValueError, match="attention"):
        a.attention(a, a)
    with pytest.raises(ValueError, match="rms_norm"):
        a.rms_norm(t(np.ones(5), device))
    with pytest.raises(ValueError, match="item"):
        a.item()
    with pytest.raises(ValueError, match="cat"):
        silica.cat([a, b])


def test_index_errors(device):
    a = t(np.ones((2, 3)), device)
    with pytest.raises(IndexError, match="dimension 5 is out of range"):
        a.sum(5)
    with pytest.raises(IndexError, match="out of range"):
        a[2]
    with pytest.raises(IndexError, match="too many indices"):
        a[0, 0, 0]
    with pytest.raises(IndexError, match="boolean"):
        a[np.array([True, False])]
    with pytest.raises(IndexError):
        a[:, [0, 7]]


def test_dtype_errors_are_type_errors(device):
    a = t(np.ones(3), device)
    with pytest.raises(TypeError, match="dtypes f32 and f16 differ"):
        a + a.to("f16")
    with pytest.raises(TypeError, match="not defined for dtype i64"):
        silica.tensor(np.arange(3), device=device).exp()
    with pytest.raises(TypeError, match="NumPy dtype"):
        silica.tensor(np.array(["a"]), device=device)
    with pytest.raises(ValueError, match="unknown dtype"):
        a.astype("float8")


def test_device_mismatch_is_a_value_error(gpu):
    with pytest.raises(ValueError, match="different devices"):
        t([1.0], "cpu") + t([1.0], gpu)


def test_gpu_out_of_memory_is_a_memory_error(gpu):
    dev = silica._open_private_gpu(gpu.index)
    dev.set_memory_limit(1 << 20)
    with pytest.raises(MemoryError, match="out of memory on .*limit of 1048576 bytes"):
        silica.zeros((1 << 19,), device=dev)
    # too large for the adapter at all
    with pytest.raises(MemoryError):
        silica.zeros((1 << 40,), device=gpu)


def test_model_errors():
    with pytest.raises((OSError, RuntimeError, ValueError)):
        silica.Generator("/no/such/model.gguf", device="cpu")
    with pytest.raises(ValueError, match="f32, f16 or bf16"):
        silica.Embedder(device="cpu", dtype="u32")
