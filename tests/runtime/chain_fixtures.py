"""Fixtures for lookup-chain tests on the embedded default device (PoCL on the CPU)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

KDB_VARS_TO_CLEAR = ("KDB_DISABLE_CACHE", "KDB_DISABLE_JIT", "KDB_SYSTEM_DB_PATH", "KDB_CUSTOM_CACHE_DIR",
                     "KDB_DEVICE_ARCH", "KDB_DEVICE_CU", "KDB_ENABLE_LOGGING", "KDB_LOG_LEVEL")


def opencl_device():
    pytest.importorskip("pyopencl", reason="pyopencl is not installed: pip install 'kdbkit[opencl]'")
    from runtime.backends.registry import discover_devices

    devices = [d for d in discover_devices() if d.backend == "opencl"]
    if not devices:
        pytest.skip("no OpenCL device: pip install pocl-binary-distribution")
    return devices[0]


@pytest.fixture
def isolated(monkeypatch, tmp_path) -> Path:
    """Fresh cache and system folders; no KDB_* settings leak in from the caller."""
    for var in KDB_VARS_TO_CLEAR:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KDB_SYSTEM_DB_PATH", str(tmp_path / "system"))
    (tmp_path / "system").mkdir()
    return tmp_path


@pytest.fixture(scope="session")
def ocl_device():
    return opencl_device()


@pytest.fixture(scope="session")
def ocl_backend(ocl_device):
    from runtime.backends.registry import open_backend

    return open_backend(ocl_device)


@pytest.fixture
def make_handle(isolated, ocl_backend):
    from runtime.handle import Handle

    handles = []

    def make():
        h = Handle(backend=ocl_backend)
        handles.append(h)
        return h

    yield make
    for h in handles:
        h.close()


@pytest.fixture
def private_kernels(monkeypatch, tmp_path) -> Path:
    """A private copy of kernels/ that a test may edit."""
    from runtime import kernel_sources

    copy = tmp_path / "kernels"
    shutil.copytree(kernel_sources.kernels_dir(), copy)
    monkeypatch.setattr(kernel_sources, "kernels_dir", lambda: copy)
    return copy


def child_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in KDB_VARS_TO_CLEAR}
    env.update(KDB_CUSTOM_CACHE_DIR=str(tmp_path / "cache"), KDB_SYSTEM_DB_PATH=str(tmp_path / "system"),
               KDB_BACKEND="opencl", **extra)
    return env
