"""``kdb targets``: the known GPUs' table and the installed compilers, as text and JSON."""

from __future__ import annotations

import json

import pytest

from kdbkit.runtime.compilers import AmdgcnClangCompiler

from tests.prerequisites import require_amdgcn_clang, require_nvrtc


@pytest.fixture
def compilers():
    require_amdgcn_clang()
    require_nvrtc()


def test_kdb_targets_lists_the_table_and_the_compilers(compilers, kdb):
    code, out, err = kdb("targets")
    assert code == 0, err
    assert "MI300X" in out and "gfx942_304" in out and "H100-SXM" in out and "sm_90_132" in out
    assert f"clang (hip): {AmdgcnClangCompiler().identity()}: " in out and "gfx942" in out
    code, out, err = kdb("targets", "--json")
    table = json.loads(out)
    mi300x = next(g for g in table["gpus"] if g["gpu"] == "MI300X")
    assert mi300x["target"] == "gfx942_304" and mi300x["built_by"].startswith("clang ")
    nvrtc = next(c for c in table["compilers"] if c["compiler"] == "nvrtc")
    assert "sm_90" in nvrtc["archs"] and nvrtc["identity"].startswith("nvrtc ")
