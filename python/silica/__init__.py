"""silica: tensors on every GPU (Vulkan, Metal, DX12 through wgpu) and the
CPU, transformer models and linear probes, from Python.

    >>> import numpy as np, silica
    >>> dev = silica.default_device()          # SILICA_DEVICE, else the best GPU, else the CPU
    >>> a = silica.tensor(np.random.rand(64, 32).astype(np.float32), device=dev)
    >>> b = (a @ a.T).softmax(-1)
    >>> b.numpy().sum(-1)                      # rows sum to 1
    >>> dev.memory_allocated(), dev.max_memory_allocated()

The type stubs (``__init__.pyi``) document every function and class.
"""

from ._silica import (
    Device,
    DeviceLostError,
    Embedder,
    GenerationStream,
    Generator,
    Probe,
    Tensor,
    __version__,
    arange,
    capture_activations,
    cat,
    default_device,
    device_count,
    devices,
    full,
    ones,
    rand,
    randn,
    rope_tables,
    save_pipeline_caches,
    set_default_device,
    stack,
    tensor,
    train_probe,
    where,
    zeros,
)
from ._silica import _open_private_gpu  # test hook: a GPU device of its own

import atexit as _atexit

# the next process finds the kernels this one built (Vulkan; nothing on the CPU)
_atexit.register(save_pipeline_caches)

# dtype names (silica's dtypes are these strings)
float32 = "f32"
float16 = "f16"
bfloat16 = "bf16"
uint32 = "u32"
int64 = "i64"


def from_numpy(array, device=None, dtype=None):
    """Same as ``silica.tensor``."""
    return tensor(array, device=device, dtype=dtype)


def synchronize(device=None):
    """Waits until the work submitted to ``device`` (default: the default device) has finished."""
    _device(device).synchronize()


def empty_cache(device=None):
    """Frees the cached blocks of ``device`` (default: the default device) that no tensor uses."""
    _device(device).empty_cache()


def memory_allocated(device=None):
    """Bytes held by live tensors on ``device`` (default: the default device)."""
    return _device(device).memory_allocated()


def memory_reserved(device=None):
    """Bytes of memory silica holds on ``device``, cached blocks included."""
    return _device(device).memory_reserved()


def max_memory_allocated(device=None):
    """The peak of ``memory_allocated`` on ``device`` since it opened or the last reset."""
    return _device(device).max_memory_allocated()


def reset_peak_memory_stats(device=None):
    """Resets the peak counter of ``device`` to its current allocation."""
    _device(device).reset_peak_memory_stats()


def _device(device):
    if device is None:
        return default_device()
    return device if isinstance(device, Device) else Device(device)


# function forms of the tensor methods
def matmul(a, b):
    """Matrix product as ``torch.matmul`` defines it; same as ``a @ b``."""
    return a.matmul(b)


def softmax(x, dim=-1):
    """Softmax over ``dim``."""
    return x.softmax(dim)


def log_softmax(x, dim=-1):
    """Log-softmax over ``dim``."""
    return x.log_softmax(dim)


def rms_norm(x, weight=None, eps=1e-6):
    """RMSNorm over the last dimension: ``x / sqrt(mean(x**2) + eps) * weight``."""
    return x.rms_norm(weight, eps)


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """LayerNorm over the last dimension."""
    return x.layer_norm(weight, bias, eps)


def rope(x, cos, sin, style="half"):
    """Rotary embeddings of ``x`` ``[.., T, heads, D]``; see ``Tensor.rope``."""
    return x.rope(cos, sin, style)


def attention(q, k, v, mask=None, scale=None, causal=False):
    """Scaled dot-product attention of ``[B, T, heads, D]`` tensors; see ``Tensor.attention``."""
    return q.attention(k, v, mask, scale, causal)


def swiglu(gate, up):
    """``silu(gate) * up``."""
    return gate.swiglu(up)


def sum(x, dim=None, keepdim=False):  # noqa: A001 (the tensor library's name)
    """Sum over ``dim`` (``None``: every element)."""
    return x.sum(dim, keepdim)


def mean(x, dim=None, keepdim=False):
    """Mean over ``dim`` (``None``: every element)."""
    return x.mean(dim, keepdim)


def max(x, dim=None, keepdim=False):  # noqa: A001
    """The largest value over ``dim`` (``None``: every element)."""
    return x.max(dim, keepdim)


def min(x, dim=None, keepdim=False):  # noqa: A001
    """The smallest value over ``dim`` (``None``: every element)."""
    return x.min(dim, keepdim)


def argmax(x, dim=None, keepdim=False):
    """Index of the largest value along ``dim`` (of the flattened tensor for ``None``)."""
    return x.argmax(dim, keepdim)


def maximum(a, b):
    """Elementwise maximum with broadcasting."""
    return a.maximum(b)


def minimum(a, b):
    """Elementwise minimum with broadcasting."""
    return a.minimum(b)


def _unary(name, doc):
    def f(x):
        return getattr(x, name)()

    f.__name__ = f.__qualname__ = name
    f.__doc__ = doc
    return f


exp = _unary("exp", "Elementwise e**x.")
log = _unary("log", "Elementwise natural logarithm.")
sqrt = _unary("sqrt", "Elementwise square root.")
rsqrt = _unary("rsqrt", "Elementwise 1 / sqrt(x).")
abs = _unary("abs", "Elementwise absolute value.")  # noqa: A001
neg = _unary("neg", "Elementwise -x.")
reciprocal = _unary("reciprocal", "Elementwise 1 / x.")
square = _unary("square", "Elementwise x * x.")
sin = _unary("sin", "Elementwise sine.")
cos = _unary("cos", "Elementwise cosine.")
tanh = _unary("tanh", "Elementwise hyperbolic tangent.")
relu = _unary("relu", "Elementwise max(x, 0).")
sigmoid = _unary("sigmoid", "Elementwise 1 / (1 + e**-x).")
silu = _unary("silu", "Elementwise x * sigmoid(x).")


def gelu(x, approximate="none"):
    """GELU: ``approximate="none"`` (erf) or ``"tanh"``."""
    return x.gelu(approximate)
