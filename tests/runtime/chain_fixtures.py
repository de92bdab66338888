"""Fixtures for lookup-chain tests on the embedded default device (PoCL on the CPU)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

KDB_VARS_TO_CLEAR = ("KDB_DISABLE_CACHE", "KDB_DISABLE_JIT", "KDB_SYSTEM_DB_PATH", "KDB_CUSTOM_CACHE_DIR",
                     "KDB_USER_DB_PATH", "KDB_DEBUG_FIND_ONLY_SOLVER", "KDB_CHECK_NUMERICS",
                     "KDB_DEVICE_ARCH", "KDB_DEVICE_CU", "KDB_ENABLE_LOGGING", "KDB_LOG_LEVEL", "KDB_TRUSTED_KEYS")


def chain_backend_name() -> str:
    """The backend the lookup-chain tests run on: KDB_TEST_BACKEND, default opencl (PoCL)."""
    return os.environ.get("KDB_TEST_BACKEND", "opencl")


def pick_device():
    from kdbkit.runtime.backends.registry import discover_devices

    name = chain_backend_name()
    if name == "opencl":
        pytest.importorskip("pyopencl", reason="pyopencl is not installed: pip install 'kdbkit[opencl]'")
    devices = [d for d in discover_devices() if d.backend == name]
    if not devices:
        pytest.skip(f"no {name} device for the lookup-chain tests (KDB_TEST_BACKEND={name}); "
                    "for PoCL: pip install 'kdbkit[opencl]' && scripts/ensure_cpu_opencl.sh")
    return devices[0]


@pytest.fixture
def isolated(monkeypatch, tmp_path) -> Path:
    """Fresh cache and system folders; no KDB_* settings leak in from the caller."""
    for var in KDB_VARS_TO_CLEAR:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KDB_USER_DB_PATH", str(tmp_path / "userdb"))
    monkeypatch.setenv("KDB_SYSTEM_DB_PATH", str(tmp_path / "system"))
    (tmp_path / "system").mkdir()
    return tmp_path


@pytest.fixture(scope="session")
def chain_device():
    return pick_device()


@pytest.fixture(scope="session")
def chain_backend(chain_device):
    from kdbkit.runtime.backends.registry import open_backend

    return open_backend(chain_device)


@pytest.fixture
def make_handle(isolated, chain_backend):
    from kdbkit.runtime.handle import Handle

    handles = []

    def make(**kwargs):
        h = Handle(backend=chain_backend, **kwargs)
        handles.append(h)
        return h

    yield make
    for h in handles:
        h.close()


@pytest.fixture
def private_kernels(monkeypatch, tmp_path) -> Path:
    """A private copy of kernels/ that a test may edit."""
    from kdbkit.runtime import kernel_sources

    copy = tmp_path / "kernels"
    shutil.copytree(kernel_sources.kernels_dir(), copy)
    monkeypatch.setattr(kernel_sources, "kernels_dir", lambda: copy)
    return copy


def child_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in KDB_VARS_TO_CLEAR}
    env.update(KDB_CUSTOM_CACHE_DIR=str(tmp_path / "cache"), KDB_SYSTEM_DB_PATH=str(tmp_path / "system"),
               KDB_BACKEND=chain_backend_name(), **extra)
    return env
