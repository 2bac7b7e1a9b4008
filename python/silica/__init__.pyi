"""silica: tensors on every GPU (Vulkan, Metal, DX12 through wgpu) and the
CPU, transformer models and linear probes, from Python.

Devices are named as ``SILICA_DEVICE`` names them: ``"cpu"``, ``"gpu"`` (the
best adapter), ``"gpu:N"``, ``"vulkan"``/``"metal"``/``"dx12"``/``"gl"``, or
part of an adapter's name. Where no device is given, ``default_device()`` is
used: the one ``set_default_device`` chose, else ``SILICA_DEVICE``, else the
best hardware GPU, else the CPU. ``SILICA_STRICT=1`` (an op without a GPU
kernel raises instead of running on the CPU) and ``SILICA_CHECK=1`` (every
GPU op is compared with the CPU) work as for the Rust library.

Dtypes are strings: ``"f32"``, ``"f16"``, ``"bf16"`` (compute types),
``"u32"`` and ``"i64"`` (indices and masks); NumPy's names and dtype objects
are accepted wherever a dtype is. NumPy has no bfloat16: bf16 tensors come
back as float32 (exactly), and ``ml_dtypes.bfloat16`` arrays become bf16
tensors. ``silica.tensor()`` makes one copy; ``.numpy()`` of a CPU tensor
is a read-only view of its memory (bf16 excepted), of a GPU tensor one copy.

Errors raise with the Rust message: ``ValueError`` (shapes, arguments,
devices that differ), ``TypeError`` (dtypes), ``IndexError`` (dimensions,
indices), ``MemoryError`` (out of memory, or past ``set_memory_limit``),
``DeviceLostError`` (a ``RuntimeError``: the GPU was lost), ``RuntimeError``
(no such device, strict-mode fallbacks, check-mode differences).
The interpreter is released while silica works, so threads run in parallel.
"""

from collections.abc import Iterator, Mapping, Sequence
from os import PathLike
from typing import Any, Literal, Optional, Union, final, overload

import numpy as np
import numpy.typing as npt

__version__: str

_DTypeName = Literal["f32", "f16", "bf16", "u32", "i64"]
_DTypeLike = Union[str, np.dtype[Any], type]
_DeviceLike = Union["Device", str]
_ArrayLike = Union["Tensor", npt.ArrayLike]
_Number = Union[int, float, np.number[Any]]
_Operand = Union["Tensor", _Number, npt.ArrayLike]
_Dims = Union[int, Sequence[int], None]
_Message = Union[Mapping[str, str], tuple[str, str]]
_Messages = Union[str, Sequence[_Message]]

float32: Literal["f32"]
float16: Literal["f16"]
bfloat16: Literal["bf16"]
uint32: Literal["u32"]
int64: Literal["i64"]

@final
class DeviceLostError(RuntimeError):
    """The GPU device was lost (driver reset, device removed or destroyed);
    tensors on it are gone, and ``Device(...)`` opens it anew."""

# ----- devices ------------------------------------------------------------------

@final
class Device:
    """A device: the CPU or one GPU adapter, opened on first use.

    >>> dev = silica.Device("gpu")
    >>> x = silica.ones((1024, 1024), device=dev)
    >>> dev.memory_allocated(), dev.memory_reserved()
    """

    def __new__(cls, spec: _DeviceLike) -> Device:
        """``Device("cpu")``, ``Device("gpu")``, ``Device("gpu:1")``,
        ``Device("vulkan")``, ``Device("llvmpipe")`` (part of a name).
        Raises ``RuntimeError`` when nothing matches."""
    @property
    def type(self) -> Literal["cpu", "gpu"]:
        """``"cpu"`` or ``"gpu"``."""
    @property
    def index(self) -> Optional[int]:
        """The adapter index of a GPU (``gpu:N``); ``None`` for the CPU."""
    @property
    def name(self) -> str:
        """The adapter's name (``"host CPU (N threads)"`` for the CPU)."""
    @property
    def backend(self) -> Literal["vulkan", "metal", "dx12", "gl", "cpu"]:
        """The graphics API behind the device."""
    def info(self) -> dict[str, Any]:
        """What the device is and can do (name, backend, device_type, driver,
        f16, subgroups, subgroup_size, cooperative_matrix, timestamps,
        max_storage_binding, max_buffer, memory_bytes), as ``silica devices``
        prints it."""
    def memory_allocated(self) -> int:
        """Bytes held by live tensors (``torch.cuda.memory_allocated``). The
        CPU counts its tensors process-wide."""
    def memory_reserved(self) -> int:
        """Bytes of device memory silica holds, cached blocks included
        (``torch.cuda.memory_reserved``)."""
    def max_memory_allocated(self) -> int:
        """The peak of ``memory_allocated`` since the device opened or the
        last ``reset_peak_memory_stats``."""
    def memory_stats(self) -> dict[str, Optional[int]]:
        """Every counter: ``allocated``, ``reserved``, ``peak_allocated``,
        ``live_buffers``, ``cached_buffers``, ``limit``."""
    def reset_peak_memory_stats(self) -> None:
        """Resets the peak counter to the current allocation."""
    def empty_cache(self) -> None:
        """Frees cached blocks that no tensor uses (``torch.cuda.empty_cache``)."""
    def set_memory_limit(self, limit: Optional[int]) -> None:
        """Caps the bytes this device may hold (``None`` removes the cap);
        allocations past it raise ``MemoryError``."""
    def synchronize(self) -> None:
        """Waits until all work submitted to the device has finished."""
    def fallback_report(self) -> dict[str, int]:
        """Ops that ran on the CPU because this GPU has no kernel for them:
        ``{"op/dtype": count}`` (empty for the CPU)."""
    def set_strict(self, on: bool) -> None:
        """Strict mode: an op without a GPU kernel raises ``RuntimeError``
        instead of running on the CPU (``SILICA_STRICT=1`` sets it at open)."""
    def set_check(self, on: bool) -> None:
        """Check mode: every GPU op is run again on the CPU and compared
        (``SILICA_CHECK=1`` sets it at open)."""
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

def devices() -> list[Device]:
    """The CPU and every GPU adapter, ranked best first (software adapters
    such as lavapipe last). Nothing is opened."""

def save_pipeline_caches() -> list[str]:
    """Saves the compiled GPU pipelines of the devices this process opened
    under the cache folder (``SILICA_CACHE``; Vulkan only), so that the next
    process finds its kernels built; the package calls it at exit. Returns
    the files written. ``SILICA_NO_PIPELINE_CACHE=1`` turns the cache off."""
    ...

def device_count() -> int:
    """The number of GPU adapters (software ones included)."""

def default_device() -> Device:
    """The device used where none is given: the one ``set_default_device``
    chose, else ``SILICA_DEVICE``, else the best hardware GPU, else the CPU."""

def set_default_device(device: Optional[_DeviceLike]) -> None:
    """Sets the device used where none is given (``None``: back to
    ``SILICA_DEVICE`` / the best GPU)."""

def synchronize(device: Optional[_DeviceLike] = None) -> None:
    """Waits for the work submitted to ``device`` (default: the default device)."""

def empty_cache(device: Optional[_DeviceLike] = None) -> None:
    """``Device.empty_cache`` of ``device`` (default: the default device)."""

def memory_allocated(device: Optional[_DeviceLike] = None) -> int:
    """``Device.memory_allocated`` of ``device`` (default: the default device)."""

def memory_reserved(device: Optional[_DeviceLike] = None) -> int:
    """``Device.memory_reserved`` of ``device`` (default: the default device)."""

def max_memory_allocated(device: Optional[_DeviceLike] = None) -> int:
    """``Device.max_memory_allocated`` of ``device`` (default: the default device)."""

def reset_peak_memory_stats(device: Optional[_DeviceLike] = None) -> None:
    """``Device.reset_peak_memory_stats`` of ``device`` (default: the default device)."""

# ----- tensors --------------------------------------------------------------------

@final
class Tensor:
    """An n-dimensional array on a silica device.

    Views (``transpose``, ``narrow``, slices, ``broadcast_to``, ``reshape``
    where the layout allows) share the elements; ops make new tensors.
    Operators broadcast like NumPy; operands must have one dtype and one
    device (Python numbers and NumPy arrays are converted to the tensor's).

    >>> a = silica.tensor(np.random.rand(4, 3).astype(np.float32), device="gpu")
    >>> (a @ a.T).softmax(-1).sum(-1).numpy()
    array([1., 1., 1., 1.], dtype=float32)
    """

    @property
    def shape(self) -> tuple[int, ...]:
        """The dimensions."""
    @property
    def dtype(self) -> _DTypeName:
        """The element type."""
    @property
    def device(self) -> Device:
        """The device the elements live on."""
    @property
    def ndim(self) -> int:
        """The number of dimensions."""
    @property
    def nbytes(self) -> int:
        """Bytes of the elements."""
    @property
    def T(self) -> Tensor:
        """The dimensions in reverse order (a view), as NumPy's ``.T``."""
    @property
    def mT(self) -> Tensor:
        """The last two dimensions swapped (a view)."""
    def numel(self) -> int:
        """The number of elements."""
    @overload
    def size(self, dim: None = None) -> tuple[int, ...]:
        """The shape, or the size of dimension ``dim``."""
    @overload
    def size(self, dim: int) -> int: ...
    def is_contiguous(self) -> bool:
        """Whether the elements are laid out in row-major order."""
    # conversions
    def numpy(self) -> np.ndarray:
        """The elements as a NumPy array: on the CPU a read-only view
        sharing the tensor's memory (bf16, as float32, is a copy); from a
        GPU one copy, after the work that produces them."""
    __array_ufunc__: None
    """NumPy leaves ``ndarray <op> Tensor`` to the tensor."""
    def __array__(self, dtype: Optional[_DTypeLike] = None, copy: Optional[bool] = None) -> np.ndarray:
        """NumPy's array protocol: ``numpy.asarray(t)`` is ``t.numpy()``,
        ``numpy.array(t)`` a writable copy; ``copy=False`` raises where no
        view is possible."""
    def tolist(self) -> Any:
        """The elements as nested Python lists."""
    def item(self) -> Union[int, float]:
        """The one element of a one-element tensor."""
    def to(self, *args: Union[_DeviceLike, _DTypeLike], device: Optional[_DeviceLike] = None, dtype: Optional[_DTypeLike] = None) -> Tensor:
        """``to(device)``, ``to(dtype)``, ``to(device, dtype)`` or with
        keywords: a copy on that device and/or of that dtype (the tensor
        itself when nothing changes). A string that names no dtype names a
        device."""
    def astype(self, dtype: _DTypeLike) -> Tensor:
        """A copy converted to ``dtype`` (rounding to nearest even)."""
    def cpu(self) -> Tensor:
        """A copy on the CPU."""
    def contiguous(self) -> Tensor:
        """The same elements in row-major order (itself when already so)."""
    def clone(self) -> Tensor:
        """A contiguous copy."""
    # views
    def __getitem__(self, key: Any, /) -> Tensor:
        """Integers, slices (any step), ``None``, ``...`` and one 1-D index
        array (a list, a NumPy integer array or an integer tensor). Boolean
        masks are not supported (use ``silica.where``)."""
    def __len__(self) -> int: ...
    def reshape(self, *shape: Union[int, Sequence[int]]) -> Tensor:
        """The same elements with another shape (one ``-1`` is inferred): a
        view where the layout allows, else a copy."""
    def view(self, *shape: Union[int, Sequence[int]]) -> Tensor:
        """Same as ``reshape``."""
    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """Dimensions ``start_dim..=end_dim`` merged into one."""
    def transpose(self, dim0: int, dim1: int) -> Tensor:
        """Two dimensions swapped (a view)."""
    def t(self) -> Tensor:
        """The last two dimensions swapped (a view)."""
    def permute(self, *dims: Union[int, Sequence[int]]) -> Tensor:
        """The dimensions reordered (a view): result dimension ``i`` is ``dims[i]``."""
    def narrow(self, dim: int, start: int, length: int) -> Tensor:
        """Entries ``start..start + length`` of dimension ``dim`` (a view)."""
    def squeeze(self, dim: Optional[int] = None) -> Tensor:
        """Dimension ``dim`` (of size 1) removed, or every size-1 dimension."""
    def unsqueeze(self, dim: int) -> Tensor:
        """A size-1 dimension inserted at ``dim``."""
    def broadcast_to(self, *shape: Union[int, Sequence[int]]) -> Tensor:
        """NumPy-style broadcast to ``shape`` (a view)."""
    def expand(self, *shape: Union[int, Sequence[int]]) -> Tensor:
        """Same as ``broadcast_to``."""
    def index_select(self, dim: int, index: Union[Tensor, Sequence[int]]) -> Tensor:
        """Entries of dimension ``dim`` picked by a 1-D list or u32/i64 tensor."""
    # operators (NumPy broadcasting; numbers and arrays on either side)
    def __add__(self, other: _Operand, /) -> Tensor: ...
    def __radd__(self, other: _Operand, /) -> Tensor: ...
    def __sub__(self, other: _Operand, /) -> Tensor: ...
    def __rsub__(self, other: _Operand, /) -> Tensor: ...
    def __mul__(self, other: _Operand, /) -> Tensor: ...
    def __rmul__(self, other: _Operand, /) -> Tensor: ...
    def __truediv__(self, other: _Operand, /) -> Tensor: ...
    def __rtruediv__(self, other: _Operand, /) -> Tensor: ...
    def __pow__(self, other: _Operand, mod: None = None, /) -> Tensor: ...
    def __rpow__(self, other: _Operand, mod: None = None, /) -> Tensor: ...
    def __matmul__(self, other: _ArrayLike, /) -> Tensor: ...
    def __rmatmul__(self, other: _ArrayLike, /) -> Tensor: ...
    def __neg__(self) -> Tensor: ...
    def __pos__(self) -> Tensor: ...
    def __abs__(self) -> Tensor: ...
    def __eq__(self, other: _Operand, /) -> Tensor:  # type: ignore[override]
        """Elementwise ``==``: a u32 mask of 0s and 1s (as are ``!= < <= > >=``)."""
    def __ne__(self, other: _Operand, /) -> Tensor: ...  # type: ignore[override]
    def __lt__(self, other: _Operand, /) -> Tensor: ...
    def __le__(self, other: _Operand, /) -> Tensor: ...
    def __gt__(self, other: _Operand, /) -> Tensor: ...
    def __ge__(self, other: _Operand, /) -> Tensor: ...
    def __bool__(self) -> bool: ...
    def __float__(self) -> float: ...
    def __int__(self) -> int: ...
    # elementwise
    def exp(self) -> Tensor: ...
    def log(self) -> Tensor: ...
    def sqrt(self) -> Tensor: ...
    def rsqrt(self) -> Tensor: ...
    def abs(self) -> Tensor: ...
    def neg(self) -> Tensor: ...
    def reciprocal(self) -> Tensor: ...
    def square(self) -> Tensor: ...
    def sin(self) -> Tensor: ...
    def cos(self) -> Tensor: ...
    def tanh(self) -> Tensor: ...
    def relu(self) -> Tensor: ...
    def sigmoid(self) -> Tensor: ...
    def silu(self) -> Tensor: ...
    def gelu(self, approximate: Literal["none", "tanh"] = "none") -> Tensor:
        """GELU with erf (``"none"``) or its tanh approximation."""
    def pow(self, exponent: _Operand) -> Tensor: ...
    def maximum(self, other: _Operand) -> Tensor: ...
    def minimum(self, other: _Operand) -> Tensor: ...
    # reductions
    def sum(self, dim: _Dims = None, keepdim: bool = False) -> Tensor:
        """Sum over ``dim`` (an int, a sequence of ints, or ``None``: all)."""
    def mean(self, dim: _Dims = None, keepdim: bool = False) -> Tensor: ...
    def max(self, dim: _Dims = None, keepdim: bool = False) -> Tensor:
        """The largest values over ``dim`` (``argmax`` gives the indices)."""
    def min(self, dim: _Dims = None, keepdim: bool = False) -> Tensor: ...
    def argmax(self, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:
        """Index of the largest value along ``dim`` (of the flattened tensor
        for ``None``), as u32."""
    def argmin(self, dim: Optional[int] = None, keepdim: bool = False) -> Tensor: ...
    def softmax(self, dim: int = -1) -> Tensor: ...
    def log_softmax(self, dim: int = -1) -> Tensor: ...
    # products and transformer ops
    def matmul(self, other: _ArrayLike) -> Tensor:
        """Matrix product as ``torch.matmul`` defines it (batch dimensions
        broadcast, 1-D operands as vectors)."""
    def rms_norm(self, weight: Optional[_ArrayLike] = None, eps: float = 1e-6) -> Tensor:
        """RMSNorm over the last dimension: ``x / sqrt(mean(x**2) + eps) *
        weight`` (ones when ``None``), computed in f32."""
    def layer_norm(self, weight: Optional[_ArrayLike] = None, bias: Optional[_ArrayLike] = None, eps: float = 1e-5) -> Tensor:
        """LayerNorm over the last dimension (weight ones, bias zeros when ``None``)."""
    def rope(self, cos: _ArrayLike, sin: _ArrayLike, style: Literal["half", "adjacent"] = "half") -> Tensor:
        """Rotary embeddings of ``[.., T, heads, D]`` with f32 angle tables
        ``[T, D/2]`` (``rope_tables``): ``"half"`` pairs ``i`` with ``i +
        D/2`` (Hugging Face), ``"adjacent"`` pairs ``2i`` with ``2i+1`` (GGUF)."""
    def attention(self, k: Tensor, v: Tensor, mask: Optional[_ArrayLike] = None, scale: Optional[float] = None, causal: bool = False) -> Tensor:
        """Scaled dot-product attention with these queries. ``q``, ``k``,
        ``v`` are ``[B, T, heads, D]`` or ``[T, heads, D]`` (heads after
        positions, unlike PyTorch's ``[B, heads, T, D]``); the KV heads may
        divide the query heads (grouped-query attention). ``mask`` is added
        to the scores and broadcasts to ``[B, heads, Tq, Tk]`` (``-inf``
        hides a key); ``scale`` defaults to ``1/sqrt(D)``; with ``causal``
        the queries are the last ``Tq`` of the ``Tk`` positions."""
    def swiglu(self, up: _ArrayLike) -> Tensor:
        """``silu(self) * up``."""

def tensor(data: _ArrayLike, device: Optional[_DeviceLike] = None, dtype: Optional[_DTypeLike] = None) -> Tensor:
    """A tensor of ``data`` (a NumPy array, nested lists, a number or a
    tensor) on ``device`` (default: ``default_device()``), of ``dtype``
    (default: the array's: float32, float16, ``ml_dtypes.bfloat16``, uint32
    and int64 as they are, float64 as f32, bool as u32, other integers as
    i64). The elements are copied once (uploaded straight from the array's
    memory on a GPU)."""

def from_numpy(array: npt.ArrayLike, device: Optional[_DeviceLike] = None, dtype: Optional[_DTypeLike] = None) -> Tensor:
    """Same as ``tensor``."""

def zeros(shape: Union[int, Sequence[int]], dtype: Optional[_DTypeLike] = None, device: Optional[_DeviceLike] = None) -> Tensor:
    """A tensor of zeros (f32 unless ``dtype``)."""

def ones(shape: Union[int, Sequence[int]], dtype: Optional[_DTypeLike] = None, device: Optional[_DeviceLike] = None) -> Tensor:
    """A tensor of ones (f32 unless ``dtype``)."""

def full(shape: Union[int, Sequence[int]], value: float, dtype: Optional[_DTypeLike] = None, device: Optional[_DeviceLike] = None) -> Tensor:
    """A tensor filled with ``value`` (f32 unless ``dtype``)."""

def arange(start: float, end: Optional[float] = None, step: float = 1.0, dtype: Optional[_DTypeLike] = None, device: Optional[_DeviceLike] = None) -> Tensor:
    """``arange(end)`` or ``arange(start, end, step)``: a 1-D tensor."""

def randn(shape: Union[int, Sequence[int]], seed: int = 0, dtype: Optional[_DTypeLike] = None, device: Optional[_DeviceLike] = None) -> Tensor:
    """Standard normal samples from a seeded generator: the same seed gives
    the same values on every device."""

def rand(shape: Union[int, Sequence[int]], seed: int = 0, dtype: Optional[_DTypeLike] = None, device: Optional[_DeviceLike] = None) -> Tensor:
    """Uniform samples in ``[0, 1)`` from a seeded generator."""

def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Concatenation along ``dim`` (the other dimensions must agree)."""

def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Tensors of one shape stacked along a new dimension ``dim``."""

def where(condition: Tensor, x: _Operand, y: _Operand) -> Tensor:
    """``x`` where ``condition`` is non-zero, else ``y`` (broadcast; ``x``
    and ``y`` may be numbers)."""

def rope_tables(positions: Union[int, Sequence[float]], head_dim: int, theta: float = 10000.0, device: Optional[_DeviceLike] = None) -> tuple[Tensor, Tensor]:
    """The f32 ``(cos, sin)`` tables ``[T, head_dim/2]`` for ``rope``: pair
    ``i`` of position ``p`` turns by ``p * theta**(-2i/head_dim)``.
    ``positions`` is a count ``T`` (positions ``0..T``) or the positions."""

def matmul(a: Tensor, b: _ArrayLike) -> Tensor:
    """Matrix product; same as ``a @ b``."""
def softmax(x: Tensor, dim: int = -1) -> Tensor: ...
def log_softmax(x: Tensor, dim: int = -1) -> Tensor: ...
def rms_norm(x: Tensor, weight: Optional[_ArrayLike] = None, eps: float = 1e-6) -> Tensor:
    """``Tensor.rms_norm``."""
def layer_norm(x: Tensor, weight: Optional[_ArrayLike] = None, bias: Optional[_ArrayLike] = None, eps: float = 1e-5) -> Tensor:
    """``Tensor.layer_norm``."""
def rope(x: Tensor, cos: _ArrayLike, sin: _ArrayLike, style: Literal["half", "adjacent"] = "half") -> Tensor:
    """``Tensor.rope``."""
def attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[_ArrayLike] = None, scale: Optional[float] = None, causal: bool = False) -> Tensor:
    """``Tensor.attention`` with ``q`` as the queries (``[B, T, heads, D]``)."""
def swiglu(gate: Tensor, up: _ArrayLike) -> Tensor:
    """``silu(gate) * up``."""
def sum(x: Tensor, dim: _Dims = None, keepdim: bool = False) -> Tensor: ...
def mean(x: Tensor, dim: _Dims = None, keepdim: bool = False) -> Tensor: ...
def max(x: Tensor, dim: _Dims = None, keepdim: bool = False) -> Tensor: ...
def min(x: Tensor, dim: _Dims = None, keepdim: bool = False) -> Tensor: ...
def argmax(x: Tensor, dim: Optional[int] = None, keepdim: bool = False) -> Tensor: ...
def maximum(a: Tensor, b: _Operand) -> Tensor: ...
def minimum(a: Tensor, b: _Operand) -> Tensor: ...
def exp(x: Tensor) -> Tensor: ...
def log(x: Tensor) -> Tensor: ...
def sqrt(x: Tensor) -> Tensor: ...
def rsqrt(x: Tensor) -> Tensor: ...
def abs(x: Tensor) -> Tensor: ...
def neg(x: Tensor) -> Tensor: ...
def reciprocal(x: Tensor) -> Tensor: ...
def square(x: Tensor) -> Tensor: ...
def sin(x: Tensor) -> Tensor: ...
def cos(x: Tensor) -> Tensor: ...
def tanh(x: Tensor) -> Tensor: ...
def relu(x: Tensor) -> Tensor: ...
def sigmoid(x: Tensor) -> Tensor: ...
def silu(x: Tensor) -> Tensor: ...
def gelu(x: Tensor, approximate: Literal["none", "tanh"] = "none") -> Tensor: ...

# ----- models -----------------------------------------------------------------------

@final
class Embedder:
    """A sentence-transformers model (default: all-MiniLM-L6-v2), with
    sentence-transformers' call shape.

    >>> model = silica.Embedder()
    >>> v = model.encode(["A man is eating food.", "A man is eating bread."])
    >>> model.similarity(v, v)
    """

    def __new__(cls, model: Optional[str] = None, device: Optional[_DeviceLike] = None, dtype: Optional[_DTypeLike] = None, max_seq_length: Optional[int] = None) -> Embedder:
        """Loads ``model`` (a sentence-transformers folder or a Hugging Face
        id; ``None``: the built-in all-MiniLM-L6-v2, fetched on first use
        into ``~/.cache/silica``) onto ``device``, computing in ``dtype``
        (f32 unless given)."""
    @overload
    def encode(self, sentences: str, batch_size: int = 32, normalize_embeddings: bool = False, show_progress_bar: Optional[bool] = None) -> npt.NDArray[np.float32]:
        """Embeddings ``[n, dim]`` (float32), or ``[dim]`` for one string.
        Sentences go through the model ``batch_size`` at a time, sorted by
        length; ``normalize_embeddings`` scales each to unit length (the
        default model already does); ``show_progress_bar`` is accepted and
        ignored."""
    @overload
    def encode(self, sentences: Sequence[str], batch_size: int = 32, normalize_embeddings: bool = False, show_progress_bar: Optional[bool] = None) -> npt.NDArray[np.float32]: ...
    def similarity(self, a: npt.ArrayLike, b: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """Cosine similarities ``[n, m]`` of embeddings ``[n, d]`` and ``[m, d]``."""
    def tokenize(self, text: str) -> list[int]:
        """The ids the model sees (special tokens added, cut at ``max_seq_length``)."""
    def capture(self, texts: Sequence[str], layers: Optional[Sequence[int]] = None, pool: Literal["last", "mean", "all"] = "last", site: Literal["residual", "attn", "mlp"] = "residual", batch_size: int = 16) -> dict[int, Any]:
        """``capture_activations(self, ...)``."""
    def get_sentence_embedding_dimension(self) -> int: ...
    @property
    def dim(self) -> int:
        """The length of the embeddings."""
    @property
    def max_seq_length(self) -> int:
        """Tokens per sentence at most (longer ones are cut)."""
    @property
    def n_layers(self) -> int: ...
    @property
    def device(self) -> Device: ...
    @property
    def model_path(self) -> str: ...

@final
class GenerationStream(Iterator[str]):
    """The text of a generation as it is produced. Iterating waits with the
    interpreter released and lets Ctrl-C through; ``close()``, leaving a
    ``with`` block or dropping the stream stops the generation."""

    def __iter__(self) -> GenerationStream: ...
    def __next__(self) -> str: ...
    def close(self) -> None:
        """Stops the generation."""
    @property
    def stats(self) -> Optional[dict[str, Any]]:
        """Once finished: ``prompt_tokens``, ``generated_tokens``,
        ``prefill_seconds``, ``decode_seconds``, ``decode_tokens_per_second``,
        ``stop_reason`` (``eos``, ``stop string``, ``max tokens``, ``context
        full``, ``cancelled``) and ``tokens``; ``None`` before."""
    def __enter__(self) -> GenerationStream: ...
    def __exit__(self, t: Any, v: Any, tb: Any, /) -> None: ...

@final
class Generator:
    """A GGUF decoder (Llama 2/3, Mistral, Qwen2/3, Gemma 2/3, Phi-3/4,
    SmolLM; default: SmolLM2-135M-Instruct) that generates text.

    >>> g = silica.Generator()
    >>> for piece in g.generate("Once upon a time", max_tokens=32, stream=True):
    ...     print(piece, end="", flush=True)
    >>> g.chat([{"role": "user", "content": "Name a fruit."}], temperature=0)
    """

    def __new__(cls, model: Optional[str] = None, device: Optional[_DeviceLike] = None, dtype: Optional[_DTypeLike] = None, dequantize: bool = False) -> Generator:
        """Loads ``model`` (a GGUF file, a folder holding one, or a Hugging
        Face id ``org/name[/FILE.gguf]``; ``None``: the built-in
        SmolLM2-135M-Instruct, fetched on first use) onto ``device``,
        activations in ``dtype`` (f32 unless given); quantized weights stay
        quantized unless ``dequantize``."""
    @overload
    def generate(self, prompt: str, max_tokens: int = 128, temperature: float = 0.7, top_k: int = 40, top_p: float = 0.9, min_p: float = 0.05, repetition_penalty: float = 1.1, seed: int = 42, stop: Union[str, Sequence[str], None] = None, stream: Literal[False] = False, frequency_penalty: float = 0.0, presence_penalty: float = 0.0) -> str:
        """The continuation of ``prompt`` (without the prompt): the whole
        text, or with ``stream=True`` an iterator of pieces as they come.
        ``temperature=0`` is greedy. The defaults are ``silica generate``'s,
        so ``generate(p, temperature=0)`` writes what ``silica generate p
        --temperature 0`` does. Stops at end-of-sequence, at one of ``stop``
        (not included), after ``max_tokens``, or when the context is full.
        ``frequency_penalty`` and ``presence_penalty`` (-2 to 2) are
        OpenAI's: a token seen c times loses ``c * frequency_penalty +
        presence_penalty``."""
    @overload
    def generate(self, prompt: str, max_tokens: int = 128, temperature: float = 0.7, top_k: int = 40, top_p: float = 0.9, min_p: float = 0.05, repetition_penalty: float = 1.1, seed: int = 42, stop: Union[str, Sequence[str], None] = None, *, stream: Literal[True], frequency_penalty: float = 0.0, presence_penalty: float = 0.0) -> GenerationStream: ...
    @overload
    def chat(self, messages: _Messages, max_tokens: int = 128, temperature: float = 0.7, top_k: int = 40, top_p: float = 0.9, min_p: float = 0.05, repetition_penalty: float = 1.1, seed: int = 42, stop: Union[str, Sequence[str], None] = None, stream: Literal[False] = False, frequency_penalty: float = 0.0, presence_penalty: float = 0.0) -> str:
        """The assistant's reply to ``messages`` (a string: one user
        message; or ``{"role": ..., "content": ...}`` dicts or ``(role,
        content)`` pairs), rendered with the model's own chat template (as
        ``silica generate --chat``). Settings and ``stream`` as ``generate``."""
    @overload
    def chat(self, messages: _Messages, max_tokens: int = 128, temperature: float = 0.7, top_k: int = 40, top_p: float = 0.9, min_p: float = 0.05, repetition_penalty: float = 1.1, seed: int = 42, stop: Union[str, Sequence[str], None] = None, *, stream: Literal[True], frequency_penalty: float = 0.0, presence_penalty: float = 0.0) -> GenerationStream: ...
    def apply_chat_template(self, messages: _Messages, add_generation_prompt: bool = True) -> str:
        """The prompt text the model's chat template makes of ``messages``."""
    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids (with BOS where the model adds one, when ``add_special``)."""
    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of token ids."""
    def capture(self, texts: Sequence[str], layers: Optional[Sequence[int]] = None, pool: Literal["last", "mean", "all"] = "last", site: Literal["residual", "attn", "mlp"] = "residual", batch_size: int = 16) -> dict[int, Any]:
        """``capture_activations(self, ...)``."""
    @property
    def config(self) -> dict[str, Any]:
        """architecture, n_layers, d_model, n_heads, n_kv_heads, head_dim,
        ffn_dim, vocab_size, context_length."""
    @property
    def n_layers(self) -> int: ...
    @property
    def name(self) -> str:
        """``general.name`` of the file (else its path)."""
    @property
    def model_path(self) -> str: ...
    @property
    def device(self) -> Device: ...
    @property
    def template_name(self) -> Optional[str]:
        """``gguf`` (the file's own template), ``chatml (fallback)``, ...;
        ``None`` when the model has none."""
    @property
    def last_stats(self) -> Optional[dict[str, Any]]:
        """``GenerationStream.stats`` of the last finished generation."""

# ----- probes ---------------------------------------------------------------------------

def capture_activations(model: Union[Generator, Embedder, str, None], texts: Union[str, Sequence[str]], layers: Union[int, Sequence[int], None] = None, pool: Literal["last", "mean", "all"] = "last", site: Literal["residual", "attn", "mlp"] = "residual", batch_size: int = 16, max_tokens: Optional[int] = None) -> dict[int, Any]:
    """The hidden states of ``layers`` of ``model`` (a loaded ``Generator``
    or ``Embedder``; a name or ``None`` loads a decoder) for each text, as
    ``silica activations`` captures them: ``{layer: array}``.

    Layers are numbered as transformers' ``hidden_states`` (0 the
    embeddings, ``n_layers`` the last, after the final norm); negative ones
    count from the end (default ``[-1]``), and the dict's keys are the
    resulting indices (``-1`` becomes ``n_layers``). ``pool="last"`` (the
    last token) and ``"mean"`` give ``[len(texts), d]`` float32 arrays;
    ``"all"`` a list of ``[tokens, d]`` arrays, one per text. ``site`` reads
    the residual stream, or a block's attention (``"attn"``) or
    feed-forward (``"mlp"``) output. Texts run in padded batches of up to
    ``batch_size``; ``max_tokens`` cuts longer texts (else they are an error
    past the model's context)."""

@final
class Probe:
    """Logistic-regression probes (one per layer) and their held-out
    metrics, as ``silica probe train`` makes them.

    >>> acts = silica.capture_activations(g, texts, layers=[6, 12, -1])
    >>> probe = silica.train_probe(acts, labels, model=g)
    >>> probe.best_layer, probe.metrics["accuracy"]
    >>> probe.predict(["a new text"], model=g)
    """

    @staticmethod
    def load(path: Union[str, PathLike[str]], device: Optional[_DeviceLike] = None) -> Probe:
        """Reads a probe file (``Probe.save``, or ``silica probe train -o
        FILE``); predictions run on ``device`` (default: ``default_device()``)."""
    def save(self, path: Union[str, PathLike[str]]) -> None:
        """Writes the probes to a safetensors file (``silica probe run`` reads it)."""
    def predict_proba(self, x: Union[npt.ArrayLike, Mapping[int, npt.ArrayLike], str, Sequence[str]], layer: Optional[int] = None, model: Union[Generator, Embedder, str, None] = None, batch_size: int = 16) -> npt.NDArray[np.float32]:
        """Class probabilities ``[n, classes]`` (``[classes]`` for one row)
        of states ``x`` (``[n, d]``, ``[d]``, or a ``capture_activations``
        dict), or of texts read through ``model`` (default: the model the
        probe names, loaded for the call). The probe of ``layer``, else of
        the best layer. One-vs-rest probes give each class's probability
        (rows need not sum to 1), multiclass ones a distribution."""
    def predict(self, x: Union[npt.ArrayLike, Mapping[int, npt.ArrayLike], str, Sequence[str]], layer: Optional[int] = None, model: Union[Generator, Embedder, str, None] = None, batch_size: int = 16) -> Union[str, list[str]]:
        """The most probable class of each row or text."""
    def parameters(self, layer: Optional[int] = None) -> dict[str, npt.NDArray[np.float32]]:
        """``weight [classes, d]`` and ``bias [classes]`` (on standardized
        states) and the standardization's ``mean`` and ``std`` ``[d]``."""
    @property
    def classes(self) -> list[str]:
        """Class names, in the order of the probability columns."""
    @property
    def layers(self) -> list[int]: ...
    @property
    def best_layer(self) -> Optional[int]:
        """The layer whose probe scored best on the held-out rows (accuracy, then macro F1)."""
    @property
    def kind(self) -> Literal["one-vs-rest", "multiclass"]: ...
    @property
    def pool(self) -> Literal["last", "mean"]: ...
    @property
    def site(self) -> Literal["residual", "attn", "mlp"]: ...
    @property
    def model(self) -> str:
        """The model the states came from (path or name; empty if not given)."""
    @property
    def holdout(self) -> list[int]:
        """The rows held out for scoring."""
    @property
    def metrics(self) -> Optional[dict[str, Any]]:
        """Held-out metrics of the best (or only) layer: ``accuracy``,
        ``macro_f1``, ``f1`` per class, ``confusion[true][predicted]``,
        ``n_train``, ``n_test``, ``final_loss``; ``None`` without a holdout."""
    @property
    def metrics_by_layer(self) -> dict[int, dict[str, Any]]: ...
    @property
    def device(self) -> Device: ...

def train_probe(x: Union[npt.ArrayLike, Mapping[int, npt.ArrayLike]], labels: Sequence[Any], *, layer: Optional[int] = None, multiclass: bool = False, l2: float = 1e-3, epochs: int = 100, batch_size: int = 32, lr: float = 3e-3, seed: int = 0, holdout: float = 0.25, device: Optional[_DeviceLike] = None, model: Union[Generator, Embedder, str, None] = None, pool: Literal["last", "mean"] = "last", site: Literal["residual", "attn", "mlp"] = "residual") -> Probe:
    """Trains logistic-regression probes on states ``x`` (``[n, d]``, or a
    ``capture_activations`` dict: one probe per layer) for ``labels`` (one
    per row, converted with ``str``; classes in order of first appearance),
    on ``device``, with AdamW through silica's autograd, as ``silica probe
    train``: one binary probe per class, or with ``multiclass`` one softmax
    probe; the objective is the mean loss plus ``l2/2 * |W|**2``
    (scikit-learn's ``C = 1 / (l2 * n_train)``). A seeded ``holdout`` share
    of the rows is held out and scored. ``layer`` (for an array), ``model``,
    ``pool`` and ``site`` say where the states came from: they are kept in
    the probe (and its file) so that it can read new text."""
