"""Shared fixtures: every device (the CPU and each GPU adapter, lavapipe
included), the `silica` command-line tool the bindings are compared with,
and the default models."""

import os
import pathlib
import shutil

import pytest

import silica

ROOT = pathlib.Path(__file__).resolve().parents[2]


def gpu_devices():
    return [silica.Device(f"gpu:{i}") for i in range(silica.device_count())]


def all_devices():
    return [silica.Device("cpu")] + gpu_devices()


def pytest_generate_tests(metafunc):
    # `device`: each test runs on the CPU and on every GPU adapter found
    if "device" in metafunc.fixturenames:
        devs = all_devices()
        metafunc.parametrize("device", devs, ids=[str(d).split(" ")[0] for d in devs])


def pytest_sessionstart(session):
    if os.environ.get("SILICA_REQUIRE_GPU") == "1" and silica.device_count() == 0:
        raise pytest.UsageError("SILICA_REQUIRE_GPU=1 but no GPU adapter was found")


@pytest.fixture
def gpu():
    """The first GPU adapter (lavapipe where there is no hardware GPU)."""
    if silica.device_count() == 0:
        pytest.skip("no GPU adapter (set SILICA_REQUIRE_GPU=1 to make this an error)")
    return silica.Device("gpu:0")


@pytest.fixture(scope="session")
def cli():
    """The `silica` tool (SILICA_CLI, else target/release/silica as
    `cargo test --release` or `cargo build --release` leaves it)."""
    path = os.environ.get("SILICA_CLI") or str(ROOT / "target" / "release" / "silica")
    if not os.path.isfile(path):
        path = shutil.which("silica")
    if not path:
        pytest.skip("the silica tool is not built (cargo build --release -p silica-cli)")
    return path


@pytest.fixture(scope="session")
def generator():
    """The default decoder (SmolLM2-135M-Instruct) on the CPU."""
    return silica.Generator(device="cpu")


@pytest.fixture(scope="session")
def embedder():
    """The default sentence encoder (all-MiniLM-L6-v2) on the CPU."""
    return silica.Embedder(device="cpu")
