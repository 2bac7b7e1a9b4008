"""Devices and memory: selection, SILICA_DEVICE / SILICA_STRICT /
SILICA_CHECK, the memory counters, fallbacks, a lost device."""

import os
import subprocess
import sys

import numpy as np
import pytest

import silica


def test_devices_lists_cpu_then_every_adapter():
    devs = silica.devices()
    assert devs[0] == silica.Device("cpu") and devs[0].type == "cpu" and devs[0].index is None
    assert len(devs) == 1 + silica.device_count()
    for i, d in enumerate(devs[1:]):
        assert (d.type, d.index) == ("gpu", i)
        assert d.name and d.backend in ("vulkan", "metal", "dx12", "gl")
        assert str(d).startswith(f"gpu:{i} (") and repr(d) == f"Device('gpu:{i}')"
        assert d.info()["index"] == i
    assert len(set(devs)) == len(devs)
    assert silica.Device(silica.Device("cpu")) == silica.Device("cpu")


def test_selectors(gpu):
    assert silica.Device("gpu:0") == gpu
    assert silica.Device("gpu").type == "gpu"
    assert silica.Device(gpu.backend).type == "gpu"
    assert silica.Device(gpu.name[:6]).type == "gpu"


def test_bad_selectors():
    for bad in ["gpu:99", "no-such-adapter-xyz", "gpu:x", ""]:
        with pytest.raises(RuntimeError, match="no device matches"):
            silica.Device(bad)
    with pytest.raises(TypeError):
        silica.Device(3)


def run_python(code, **env):
    full = dict(os.environ, **env)
    out = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_silica_device_picks_the_default():
    code = "import silica; print(repr(silica.default_device()))"
    assert run_python(code, SILICA_DEVICE="cpu") == "Device('cpu')"
    if silica.device_count():
        assert run_python(code, SILICA_DEVICE="gpu:0") == "Device('gpu:0')"
        code = "import silica; print(silica.tensor([1.0]).device.type)"
        assert run_python(code, SILICA_DEVICE="gpu:0") == "gpu"


def test_set_default_device():
    try:
        silica.set_default_device("cpu")
        assert silica.default_device() == silica.Device("cpu")
        assert silica.ones(2).device == silica.Device("cpu")
    finally:
        silica.set_default_device(None)


def test_memory_counters(device):
    device.synchronize()
    before = device.memory_allocated()
    t = silica.zeros((256, 1024), device=device)  # 1 MiB
    assert device.memory_allocated() - before >= t.nbytes
    assert device.memory_reserved() >= device.memory_allocated()
    assert device.max_memory_allocated() >= device.memory_allocated()
    stats = device.memory_stats()
    assert set(stats) == {"allocated", "reserved", "peak_allocated", "live_buffers", "cached_buffers", "limit"}
    del t
    assert device.memory_allocated() == before
    device.reset_peak_memory_stats()
    assert device.max_memory_allocated() == device.memory_allocated()
    device.empty_cache()
    if device.type == "gpu":
        # nothing cached after empty_cache: reserved is what tensors hold
        assert device.memory_stats()["cached_buffers"] == 0
        assert device.memory_reserved() == device.memory_allocated()
    assert silica.memory_allocated(device) == device.memory_allocated()


def test_memory_limit_raises_memory_error(device):
    device.empty_cache()
    device.set_memory_limit(device.memory_reserved() + 4096)
    try:
        assert device.memory_stats()["limit"] is not None
        with pytest.raises(MemoryError, match="out of memory"):
            silica.zeros((1 << 20,), device=device)
        x = silica.tensor(np.ones(4, np.float32), device=device)
        with pytest.raises(MemoryError):
            x.broadcast_to(1 << 18, 4).contiguous()
    finally:
        device.set_memory_limit(None)
    assert silica.zeros((1 << 20,), device=device).shape == (1 << 20,)


def test_synchronize_and_fallback_report(device):
    x = silica.tensor(np.ones((4, 4), np.float32), device=device)
    y = (x @ x).exp()
    device.synchronize()
    silica.synchronize(device)
    assert isinstance(device.fallback_report(), dict)
    np.testing.assert_allclose(y.numpy(), np.exp(4.0 * np.ones((4, 4))), rtol=1e-6)


def test_fallback_is_counted_and_strict_mode_refuses_it(gpu):
    dev = silica._open_private_gpu(gpu.index)
    dev._disable_kernel_for_testing("exp")
    x = silica.tensor(np.linspace(-1, 1, 8, dtype=np.float32), device=dev)
    np.testing.assert_allclose(x.exp().numpy(), np.exp(x.numpy()), rtol=1e-6)
    assert dev.fallback_report() == {"exp/f32": 1}
    dev.set_strict(True)
    with pytest.raises(RuntimeError, match="strict mode"):
        x.exp()
    dev.set_strict(False)
    assert x.exp().shape == (8,)


def test_strict_and_check_modes_from_the_environment(gpu):
    code = (
        "import numpy as np, silica\n"
        "dev = silica._open_private_gpu(0)\n"
        "x = silica.tensor(np.arange(8, dtype=np.float32), device=dev)\n"
        "print((x @ x).item(), x.softmax(-1).sum().item() > 0.99)\n"
        "dev._disable_kernel_for_testing('exp')\n"
        "try:\n"
        "    x.exp()\n"
        "    print('no error')\n"
        "except RuntimeError as e:\n"
        "    print('strict' if 'SILICA_STRICT' in str(e) else e)\n"
    )
    assert run_python(code, SILICA_STRICT="1", SILICA_CHECK="1").splitlines() == ["140.0 True", "strict"]


def test_lost_device_raises_device_lost_error(gpu):
    dev = silica._open_private_gpu(gpu.index)
    x = silica.tensor(np.ones(16, np.float32), device=dev)
    dev._destroy_for_testing()
    with pytest.raises(silica.DeviceLostError, match="was lost") as e:
        (x + x).numpy()
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(RuntimeError):
        x.numpy()
    # the shared device of that adapter is untouched
    assert silica.ones(2, device=gpu).numpy().tolist() == [1.0, 1.0]


def test_pipelines_are_saved_at_exit(gpu, tmp_path):
    # a process that built kernels on a Vulkan device leaves them in the cache folder
    code = (
        "import silica\n"
        "x = silica.tensor([1.0, 2.0, 3.0], device='gpu:0')\n"
        "print(x.softmax(-1).sum().item() > 0.99, silica.Device('gpu:0').backend)\n"
    )
    out = run_python(code, SILICA_CACHE=str(tmp_path))
    assert out.startswith("True"), out
    if not out.endswith("vulkan"):
        pytest.skip("only Vulkan keeps an application pipeline cache")
    files = list((tmp_path / "pipelines").iterdir())
    assert len(files) == 1 and files[0].read_bytes().startswith(b"SILICAPC"), files
