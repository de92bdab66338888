"""kernels_dir() in a checkout and in a wheel layout; source digests over includes."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from kdbkit.runtime import kernel_sources
from kdbkit.runtime.kernel_sources import KernelSourceError, kernels_dir, list_sources, read_source, source_digest

REPO = Path(__file__).resolve().parents[2]


def test_kernels_dir_sits_beside_the_runtime_and_holds_the_header_and_samples():
    import kdbkit.runtime

    # The checkout's kernels/ (an editable install), or kdbkit/kernels in an installed wheel.
    assert kernels_dir() == Path(kdbkit.runtime.__file__).parent.parent / "kernels"
    assert {"activation.c", "reduce_sum.c", "matmul_tiled.c"} <= set(list_sources())
    assert '#include "kdb_compat.h"' in read_source("activation.c")


def _load_copy(runtime_dir: Path):
    """Import a copy of kernel_sources.py placed in ``runtime_dir`` (a fake install)."""
    runtime_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(kernel_sources.__file__, runtime_dir / "kernel_sources.py")
    spec = importlib.util.spec_from_file_location("kdb_test_kernel_sources_copy", runtime_dir / "kernel_sources.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_wheel_layout_is_found(tmp_path):
    package = tmp_path / "site-packages" / "kdbkit"
    shutil.copytree(REPO / "kernels", package / "kernels")
    module = _load_copy(package / "runtime")
    assert module.kernels_dir() == package / "kernels"
    assert module.source_digest("activation.c") == source_digest("activation.c")


def test_missing_kernels_dir_names_the_place_looked(tmp_path):
    module = _load_copy(tmp_path / "kdbkit" / "runtime")
    with pytest.raises(module.KernelSourceError, match="kdbkit/kernels.*reinstall kdbkit"):
        module.kernels_dir()


def test_digest_is_stable_hex():
    digest = source_digest("matmul_tiled.c")
    assert digest == source_digest("matmul_tiled.c")
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert digest != source_digest("activation.c")


def test_digest_covers_included_header_and_nothing_else(private_kernels):
    before = {name: source_digest(name) for name in ("activation.c", "reduce_sum.c")}
    header = private_kernels / "kdb_compat.h"
    header.write_text(header.read_text() + "\n/* edited */\n")
    after = {name: source_digest(name) for name in before}
    assert all(before[n] != after[n] for n in before)

    unrelated = source_digest("activation.c")
    (private_kernels / "matmul_tiled.c").write_text("/* not included by activation.c */\n")
    assert source_digest("activation.c") == unrelated


def test_nested_includes_are_followed_and_cycles_end(private_kernels):
    (private_kernels / "inner.h").write_text('#pragma once\n#include "outer.h"\n#define INNER 1\n')
    (private_kernels / "outer.h").write_text('#pragma once\n#include "inner.h"\n#define OUTER 1\n')
    (private_kernels / "k.c").write_text('#include "outer.h"\n#include <stdint.h>\n')
    first = source_digest("k.c")
    (private_kernels / "inner.h").write_text('#pragma once\n#include "outer.h"\n#define INNER 2\n')
    assert source_digest("k.c") != first


def test_include_next_to_the_includer_wins(private_kernels):
    (private_kernels / "sub").mkdir()
    (private_kernels / "sub" / "k.c").write_text('#include "local.h"\n')
    (private_kernels / "sub" / "local.h").write_text("#define A 1\n")
    first = source_digest("sub/k.c")
    (private_kernels / "sub" / "local.h").write_text("#define A 2\n")
    assert source_digest("sub/k.c") != first


def test_missing_include_names_the_file_and_its_includer(private_kernels):
    (private_kernels / "broken.c").write_text('#include "kdb_compat.h"\n#include "nowhere.h"\n')
    with pytest.raises(KernelSourceError, match=r"'nowhere\.h' \(included from broken\.c\) not found"):
        source_digest("broken.c")


@pytest.mark.parametrize("name", ["missing.c", "../pyproject.toml", "/etc/passwd"])
def test_bad_source_names_are_refused(name):
    with pytest.raises(KernelSourceError):
        read_source(name)
    with pytest.raises(KernelSourceError):
        source_digest(name)


def test_digest_each_equals_one_digest_per_name_and_stats_each_file_once(private_kernels, monkeypatch):
    from kdbkit.runtime.kernel_sources import KernelSearchPath

    names = ["activation.c", "reduce_sum.c", "matmul_tiled.c", "missing.c"]
    (private_kernels / "broken.c").write_text('#include "kdb_compat.h"\n#include "nowhere.h"\n')
    names.append("broken.c")
    search = KernelSearchPath()
    stats = []
    real_stat = kernel_sources.os.stat
    monkeypatch.setattr(kernel_sources.os, "stat", lambda path, *a, **k: (stats.append(path), real_stat(path, *a, **k))[1])
    each = search.digest_each(names)
    in_pass = list(stats)  # this pass's, not the checks' below
    assert list(each) == names
    for name in ("activation.c", "reduce_sum.c", "matmul_tiled.c"):
        assert each[name] == source_digest(name)
    assert isinstance(each["missing.c"], KernelSourceError) and "no kernel source 'missing.c'" in str(each["missing.c"])
    assert isinstance(each["broken.c"], KernelSourceError) and "nowhere.h" in str(each["broken.c"])
    header = str(private_kernels / "kdb_compat.h")
    assert in_pass.count(header) == 1  # four sources include it; one stat
    assert len(in_pass) == len(set(in_pass))

    header_path = private_kernels / "kdb_compat.h"  # an edit between two passes is seen by the next
    header_path.write_text(header_path.read_text() + "\n/* edited */\n")
    assert search.digest_each(["activation.c"])["activation.c"] != each["activation.c"]
