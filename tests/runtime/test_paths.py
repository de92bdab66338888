"""Where system bundles are looked for: the variable, sys.prefix, then installed kernel packages."""

import os
import subprocess
import sys

import pytest

from kdbkit.kdb import Target, write_bundle
from kdbkit.runtime import paths
from kdbkit.runtime.system_bundles import find_system_bundles
from tests.runtime.chain_fixtures import chain_backend_name


def _fake_kernel_package(root, name, entry_value, record=None):
    dist = root / f"{name}-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "entry_points.txt").write_text(f"[console_scripts]\nx = y:z\n\n[kdbkit.bundles]\n{name} = {entry_value}\n")
    if record is not None:
        (dist / "RECORD").write_text("".join(f"{line},,\n" for line in record))


def test_kernel_packages_are_found_through_entry_points(tmp_path, monkeypatch):
    site = tmp_path / "site"
    pkg = site / "kdbkit_kernels_test"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    write_bundle(pkg / "sm_90_132.kdb", Target.parse("sm_90_132"), [("k.c.o", "-mcpu=sm_90", b"x" * 100)],
                 compiler="nvrtc 13.0", binary_format="cubin")
    _fake_kernel_package(site, "kdbkit_kernels_test", "kdbkit_kernels_test",
                         ["kdbkit_kernels_test/__init__.py", "kdbkit_kernels_test/sm_90_132.kdb"])
    _fake_kernel_package(site, "broken_pkg", "no_such_module_here:nothing")
    # a distribution naming a folder it did not install (another package's) is not believed
    (site / "someone_else").mkdir()
    _fake_kernel_package(site, "borrowing", "someone_else", ["borrowing/__init__.py"])
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("KDB_SYSTEM_DB_PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(paths, "_entry_points_seen", None)
    dirs = paths.system_db_dirs()
    origins = [d.origin for d in dirs]
    assert origins[0] == "KDB_SYSTEM_DB_PATH" and origins[1] == "sys.prefix"
    assert "package kdbkit_kernels_test" in origins
    assert "package broken_pkg" not in origins and "package borrowing" not in origins
    found, trace = find_system_bundles(Target.parse("sm_90_132"), "cubin", dirs)
    assert [b.path for b in found] == [pkg / "sm_90_132.kdb"], trace
    for b in found:
        b.close()


_HANDLE_THEN_SCAN = """
import kdbkit
from kdbkit.runtime import paths
with kdbkit.Handle() as handle:
    pass
print(sorted(d.origin for d in paths.system_db_dirs() if d.origin.startswith("package")))
"""


@pytest.mark.parametrize("value", ["kdbkit_kernels_evil", "kdbkit_kernels_evil:bundle_dir"])
def test_handle_never_imports_a_kernel_package(tmp_path, chain_device, value):
    """A kernel package is data: finding its folder must not run its ``__init__.py`` (here, one
    that leaves a marker file and raises), in the new entry-point form or the old one."""
    site, marker = tmp_path / "site", tmp_path / "imported"
    (site / "kdbkit_kernels_evil").mkdir(parents=True)
    (site / "kdbkit_kernels_evil" / "__init__.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\nraise SystemExit('kernel package code ran')\n"
        "def bundle_dir():\n    return '/'\n")
    _fake_kernel_package(site, "kdbkit_kernels_evil", value, ["kdbkit_kernels_evil/__init__.py"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("KDB_")}
    env.update(PYTHONPATH=os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
               KDB_SYSTEM_DB_PATH=str(tmp_path / "none"), KDB_CUSTOM_CACHE_DIR=str(tmp_path / "cache"),
               KDB_USER_DB_PATH=str(tmp_path / "userdb"), KDB_BACKEND=chain_backend_name())
    done = subprocess.run([sys.executable, "-c", _HANDLE_THEN_SCAN], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), "the kernel package's module was imported"
    assert done.stdout.strip() == "['package kdbkit_kernels_evil']"


def test_the_search_is_lazy(tmp_path, monkeypatch):
    monkeypatch.setenv("KDB_SYSTEM_DB_PATH", str(tmp_path))
    scanned = []
    monkeypatch.setattr(paths, "_entry_point_dirs", lambda: scanned.append(1) or iter(()))
    first = next(paths.iter_system_db_dirs())
    assert first.path == tmp_path and scanned == []  # installed packages not asked yet


_BACKGROUND_IMPORT = """
import sys, threading
started, start = [], threading.Thread.start
threading.Thread.start = lambda self: started.append(self) or start(self)  # counted even if done at once
from kdbkit.runtime import paths
paths.import_platformdirs_in_background()
for t in started:
    t.join()
print(sum(t.name == "kdbkit-import-platformdirs" for t in started), "platformdirs" in sys.modules)
"""


def test_platformdirs_is_imported_in_the_background_only_when_a_folder_needs_it(tmp_path):
    import os
    import subprocess

    base = {k: v for k, v in os.environ.items() if not k.startswith("KDB_")}

    def run(**variables):
        proc = subprocess.run([sys.executable, "-c", _BACKGROUND_IMPORT], env={**base, **variables},
                              capture_output=True, text=True, check=True)
        return proc.stdout.split()

    assert run() == ["1", "True"]  # a user who sets nothing: imported beside the device open
    assert run(KDB_CUSTOM_CACHE_DIR=str(tmp_path)) == ["1", "True"]  # the find-db folder still needs it
    both = dict(KDB_CUSTOM_CACHE_DIR=str(tmp_path), KDB_USER_DB_PATH=str(tmp_path))
    assert run(**both) == ["0", "False"]  # neither folder comes from platformdirs: nothing to do
