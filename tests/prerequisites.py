"""Skip a test whose prerequisite is missing, unless this run says it must be there.

Locally, a test that needs clang-19 or the hip-python lines skips with the command that
installs them. CI installs them and lists them in ``KDB_TEST_REQUIRE`` (comma-separated
names), so there a missing prerequisite fails the run instead of skipping silently.
"""

from __future__ import annotations

import os

import pytest

REQUIRE_VAR = "KDB_TEST_REQUIRE"
KNOWN = {"amdgcn-clang", "hip-standin", "redis-server"}


def required(name: str) -> bool:
    assert name in KNOWN, name
    return name in {n.strip() for n in os.environ.get(REQUIRE_VAR, "").split(",")}


def skip_or_fail(name: str, reason: str) -> None:
    """Skip with ``reason``, or fail where ``KDB_TEST_REQUIRE`` names ``name``."""
    if required(name):
        pytest.fail(f"{REQUIRE_VAR} requires {name}: {reason}", pytrace=False)
    pytest.skip(reason)


NO_AMDGCN_CLANG = "no clang with the amdgcn target on PATH (apt-get install clang-19 lld-19)"


def require_amdgcn_clang() -> None:
    """Skip (or fail, where required) without a clang that builds AMD code objects."""
    from kdbkit.runtime.compilers.amdgcn_clang import find_clang

    if find_clang() is None:
        skip_or_fail("amdgcn-clang", NO_AMDGCN_CLANG)


def require_nvrtc() -> None:
    """Skip without NVRTC (the CUDA extra: pip install 'kdbkit[cuda]', which CI installs)."""
    from kdbkit.runtime.compilers import NvrtcCompiler

    if NvrtcCompiler().supported_archs() is None:
        pytest.skip("no NVRTC: pip install 'kdbkit[cuda]'")


def require_redis_server() -> str:
    """The path of Debian's ``redis-server``; skip (or fail, where required) without it."""
    import shutil

    path = shutil.which("redis-server")
    if path is None:
        skip_or_fail("redis-server", "no redis-server on PATH (apt-get install redis-server)")
    return path
