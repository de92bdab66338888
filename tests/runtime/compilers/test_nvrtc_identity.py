"""The CUDA compiler identity comes from the wheels' file names, and matches the library."""

import pytest

from kdbkit.runtime.compilers import nvrtc
from kdbkit.runtime.errors import CompilerUnavailableError


def test_wheel_version_matches_the_loaded_library():
    wheel = nvrtc.wheel_nvrtc_version()
    if wheel is None:
        pytest.skip("no nvidia-cuda-nvrtc wheel on sys.path: pip install 'kdbkit[cuda]'")
    assert wheel == nvrtc.nvrtc_version()
    assert nvrtc.nvrtc_identity().startswith(f"nvrtc {wheel[0]}.{wheel[1]}")


def test_a_mismatch_refuses_to_compile(monkeypatch):
    if nvrtc.wheel_nvrtc_version() is None:
        pytest.skip("no nvidia-cuda-nvrtc wheel on sys.path: pip install 'kdbkit[cuda]'")
    monkeypatch.setattr(nvrtc, "wheel_nvrtc_version", lambda: (1, 0))
    with pytest.raises(CompilerUnavailableError, match="wheel is"):
        nvrtc.compile_cuda('extern "C" __global__ void k() {}', "sm_90")
