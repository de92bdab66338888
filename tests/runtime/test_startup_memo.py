"""The startup memo: kernel-file digests and the entry-point scan kept between processes, and
never trusted for a file or an install that changed."""

from __future__ import annotations

import importlib
import json
import os
import sys

import pytest

from kdbkit.runtime import kernel_sources, paths, startup_memo
from kdbkit.runtime.kernel_sources import KernelSearchPath


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(folder))
    monkeypatch.delenv("KDB_DISABLE_CACHE", raising=False)
    monkeypatch.setattr(kernel_sources, "_files", {})  # as in a fresh process
    return folder


def _kernels(tmp_path):
    folder = tmp_path / "kernels"
    folder.mkdir()
    (folder / "common.h").write_text("#define TWO 2\n")
    (folder / "k.c").write_text('#include "common.h"\nkernel void k(global float* x) { x[0] = TWO; }\n')
    return folder


def _new_process(monkeypatch):
    """What a new process starts with: no per-process file table and no memo read yet."""
    monkeypatch.setattr(kernel_sources, "_files", {})
    monkeypatch.setattr(startup_memo, "_memo", None)


def test_a_later_process_digests_from_the_memo_without_reading_the_files(tmp_path, cache_dir, monkeypatch):
    search = KernelSearchPath([_kernels(tmp_path)])
    digest = search.digest("k.c")
    startup_memo.memo().save()
    saved = json.loads((cache_dir / startup_memo.FILE_NAME).read_text())
    assert len(saved["sections"]["sources"]) == 2  # the source and its include

    _new_process(monkeypatch)
    reads = []
    real_read = kernel_sources._read_bytes
    monkeypatch.setattr(kernel_sources, "_read_bytes", lambda path: reads.append(path) or real_read(path))
    assert KernelSearchPath([tmp_path / "kernels"]).digest("k.c") == digest
    assert reads == []


def test_an_edited_file_is_read_again_even_with_its_old_size_and_mtime(tmp_path, cache_dir, monkeypatch):
    folder = _kernels(tmp_path)
    header = folder / "common.h"
    before = KernelSearchPath([folder]).digest("k.c")
    startup_memo.memo().save()
    st = header.stat()
    header.write_text("#define TWO 3\n")  # same size
    os.utime(header, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the old mtime, as `cp -p` would leave it

    _new_process(monkeypatch)
    after = KernelSearchPath([folder]).digest("k.c")
    assert after != before
    assert after == kernel_sources.KernelSearchPath([folder]).read("k.c").digest  # what a compile would key


@pytest.mark.parametrize("damage", [b"{not json", b'{"schema": 99, "sections": {}}', b'{"schema": 1, "sections": '
                                    b'{"sources": {"PATH": [[1, 2, 3, 4], "zz", []]}}}'])
def test_a_damaged_memo_is_ignored_and_written_again(tmp_path, cache_dir, monkeypatch, damage):
    folder = _kernels(tmp_path)
    expected = KernelSearchPath([folder]).digest("k.c")
    cache_dir.mkdir(parents=True, exist_ok=True)
    (cache_dir / startup_memo.FILE_NAME).write_bytes(damage.replace(b"PATH", str(folder / "k.c").encode()))

    _new_process(monkeypatch)
    assert KernelSearchPath([folder]).digest("k.c") == expected
    startup_memo.memo().save()
    assert json.loads((cache_dir / startup_memo.FILE_NAME).read_text())["schema"] == startup_memo.SCHEMA


def test_an_unwritable_cache_folder_keeps_nothing_and_raises_nothing(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(blocker / "cache"))  # a folder under a file: never creatable
    _new_process(monkeypatch)
    folder = _kernels(tmp_path)
    assert KernelSearchPath([folder]).digest("k.c")
    startup_memo.memo().save()
    assert startup_memo.memo().changed  # still unsaved, and no exception


def test_kdb_disable_cache_keeps_no_memo(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setenv("KDB_DISABLE_CACHE", "1")
    KernelSearchPath([_kernels(tmp_path)]).digest("k.c")
    startup_memo.memo().save()
    assert not cache_dir.exists()


def _package(site, name="kdbkit_kernels_test"):
    """A distribution in ``site`` that names a folder through entry-point group kdbkit.bundles."""
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text("from pathlib import Path\n\ndef bundle_dir():\n"
                                             "    return str(Path(__file__).parent)\n")
    dist = site / f"{name}-1.0.dist-info"
    dist.mkdir()
    (dist / "entry_points.txt").write_text(f"[kdbkit.bundles]\n{name} = {name}:bundle_dir\n")
    sys.modules.pop(name, None)  # another test's package of the same name
    importlib.invalidate_caches()
    return site / name


def test_the_entry_point_scan_is_remembered_until_an_install_changes_the_folder(tmp_path, cache_dir, monkeypatch):
    site = tmp_path / "site"
    folder = _package(site)
    monkeypatch.setattr(sys, "path", [str(site)])
    monkeypatch.setattr(paths, "_entry_points_seen", None)
    assert [d.path for d in paths._entry_point_dirs()] == [folder]
    startup_memo.memo().save()

    _new_process(monkeypatch)
    monkeypatch.setattr(paths, "_entry_points_seen", None)
    scans = []
    real_scan = paths._scan_entry_points
    monkeypatch.setattr(paths, "_scan_entry_points", lambda: scans.append(1) or real_scan())
    assert [d.path for d in paths._entry_point_dirs()] == [folder]
    assert scans == []  # from the memo

    second = _package(site, "kdbkit_kernels_other")  # an install: the folder's stamp changes
    monkeypatch.setattr(paths, "_entry_points_seen", None)
    assert sorted(d.path for d in paths._entry_point_dirs()) == sorted([folder, second])
    assert scans == [1]


def test_a_remembered_folder_that_is_gone_makes_the_scan_run_again(tmp_path, cache_dir, monkeypatch):
    site = tmp_path / "site"
    folder = _package(site)
    monkeypatch.setattr(sys, "path", [str(site)])
    monkeypatch.setattr(paths, "_entry_points_seen", None)
    list(paths._entry_point_dirs())
    startup_memo.memo().save()
    memo = json.loads((cache_dir / startup_memo.FILE_NAME).read_text())
    (key, dirs), = memo["sections"]["entry_points"].items()
    dirs[0][0] = str(tmp_path / "gone")
    (cache_dir / startup_memo.FILE_NAME).write_text(json.dumps(memo))

    _new_process(monkeypatch)
    monkeypatch.setattr(paths, "_entry_points_seen", None)
    assert [d.path for d in paths._entry_point_dirs()] == [folder]


def test_clearing_the_cache_removes_the_memo_and_pruning_only_stale_writes(tmp_path, cache_dir, monkeypatch):
    from kdbkit.runtime.cache_admin import clear_cache, prune_cache

    KernelSearchPath([_kernels(tmp_path)]).digest("k.c")
    startup_memo.memo().save()
    stale, fresh = (cache_dir / f"{startup_memo.TEMP_PREFIX}{name}" for name in ("old", "new"))
    stale.write_text("{")
    fresh.write_text("{")
    os.utime(stale, (0, 0))
    prune_cache(cache_dir)
    assert not stale.exists() and fresh.exists() and (cache_dir / startup_memo.FILE_NAME).exists()
    report = clear_cache(cache_dir)
    assert not (cache_dir / startup_memo.FILE_NAME).exists() and not fresh.exists()
    assert cache_dir / startup_memo.FILE_NAME in report.removed_files
