"""A library's own kernels through kdbkit: the kernel search path, with the same keys, bundles, caches and chain."""

from __future__ import annotations

import numpy as np
import pytest

from kdbkit.packager.device_build import build_bundle
from kdbkit.runtime.kernel_sources import KernelSearchPath, kernels_dir

SCALE = """\
/* scale.c: y = a * x, a library's own kernel written in kdbkit's dialect. */
#include "kdb_compat.h"
#include "mylib/common.h"

KDB_KERNEL void scale(const KDB_GLOBAL float* x, KDB_GLOBAL float* y, int n, float a)
{
    for (int i = KDB_GLOBAL_ID_X; i < n; i += KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X)
        y[i] = MYLIB_SCALE(a, x[i]);
}
"""


@pytest.fixture
def library(tmp_path):
    """A library's kernel folder: its own kernel and header; kdb_compat.h comes from kdbkit."""
    folder = tmp_path / "mylib kernels"  # a blank in the path, as user folders have
    (folder / "mylib").mkdir(parents=True)
    (folder / "scale.c").write_text(SCALE)
    (folder / "mylib" / "common.h").write_text("#define MYLIB_SCALE(a, x) ((a) * (x))\n")
    return folder


def _run_scale(handle, program, n=1000, a=2.5):
    be = handle.backend
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    dx, dy = be.to_device(x), be.alloc(x.nbytes)
    be.launch(program.function("scale"), (4, 1, 1), (64, 1, 1), [dx, dy, np.int32(n), np.float32(a)])
    np.testing.assert_allclose(be.to_host(dy, np.empty_like(x)), np.float32(a) * x, rtol=1e-6)


def test_a_library_kernel_goes_through_the_whole_chain(isolated, chain_backend, library):
    from kdbkit.runtime.handle import Handle

    with Handle(backend=chain_backend, kernel_path=[library]) as first:
        program = first.program("scale.c")
        assert program.source == "jit" and first.kernel_folder("scale.c") == library
        _run_scale(first, program)
    with Handle(backend=chain_backend, kernel_path=[library]) as second:
        assert second.program("scale.c").source == "user"
        assert second.program("activation.c", "-DKDB_DTYPE=float").source == "jit"  # kdbkit's own, still found


def test_kdb_kernel_path_is_the_same_search_path(isolated, chain_backend, library, monkeypatch):
    from kdbkit.runtime.handle import Handle

    monkeypatch.setenv("KDB_KERNEL_PATH", str(library))
    with Handle(backend=chain_backend) as handle:
        _run_scale(handle, handle.program("scale.c"))
        assert handle.search_path.folders == (library, kernels_dir())


def test_a_bundle_built_from_a_library_serves_it_with_zero_jit(isolated, chain_backend, library, monkeypatch):
    from kdbkit.runtime.handle import Handle

    target = chain_backend.device.target
    build_bundle(target, [("scale.c", ())], isolated / "system", search_path=KernelSearchPath([library]))
    monkeypatch.setenv("KDB_DISABLE_JIT", "1")
    with Handle(backend=chain_backend, kernel_path=[library]) as handle:
        program = handle.program("scale.c")
        assert program.source == "system"
        _run_scale(handle, program)


def test_keys_follow_content_not_folders(isolated, chain_backend, library, tmp_path):
    from kdbkit.runtime.handle import Handle

    import shutil

    copy = tmp_path / "elsewhere"
    shutil.copytree(library, copy)
    with Handle(backend=chain_backend, kernel_path=[library]) as handle:
        assert handle.program("scale.c").source == "jit"
    with Handle(backend=chain_backend, kernel_path=[copy]) as handle:  # same files, another machine's folder
        assert handle.program("scale.c").source == "user"
    (copy / "mylib" / "common.h").write_text("#define MYLIB_SCALE(a, x) ((x) * (a))\n")  # an include changes
    with Handle(backend=chain_backend, kernel_path=[copy]) as handle:
        assert handle.program("scale.c").source == "jit"


def test_the_first_folder_holding_a_name_wins_and_resolve_says_which(kdb_in, isolated, chain_device, library):
    (library / "activation.c").write_text((kernels_dir() / "activation.c").read_text() + "\n/* the library's */\n")
    code, out, _ = kdb_in("resolve", "activation.c", "--kernel-path", library, "--json")
    assert code == 0 and out["kernel_folder"] == str(library)
    code, out, _ = kdb_in("resolve", "activation.c", "--json")
    assert code == 0 and out["kernel_folder"] == str(kernels_dir())


def test_a_missing_kernel_names_the_folders_searched(isolated, chain_backend, library):
    from kdbkit.runtime.errors import KernelSourceError
    from kdbkit.runtime.handle import Handle

    with Handle(backend=chain_backend, kernel_path=[library]) as handle, pytest.raises(KernelSourceError) as info:
        handle.program("nowhere.c")
    assert str(library) in info.value.problem and str(kernels_dir()) in info.value.problem
    assert "KDB_KERNEL_PATH" in info.value.remedy


@pytest.fixture
def kdb_in(capsys, monkeypatch, chain_device):
    import json

    from kdbkit.runtime.cli.app import main

    monkeypatch.setenv("KDB_BACKEND", chain_device.backend)

    def run(*args):
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, json.loads(out) if code == 0 else out, err
    return run
