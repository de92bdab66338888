"""`kdb install --check` on AMD packages: the code object version against the ROCm release.

The bundles hold real clang-19 code objects (tests/runtime/amd_bundles.py). A bare bundle is
judged by its first entry's ELF header, so a v4 or v6 one is told apart from kdbkit's v5; a wheel
by its manifest, which says it holds what this kdbkit's builder writes (v5).
"""

from __future__ import annotations

import json

from kdbkit.kdb import Target
from kdbkit.packager.select import choose, scan
from kdbkit.packager.wheel import write_package
from kdbkit.runtime.preflight import DeviceRuntime
from tests.runtime.amd_bundles import amd_bundle

GFX942_304 = Target.parse("gfx942_304")


def _check(kdb, folder, *more):
    code, out, err = kdb("install", "--from", folder, "--target", "gfx942_304", "--check", *more)
    assert "Traceback" not in err
    return code, out


def test_install_check_refuses_a_bundle_and_a_wheel_of_code_objects_the_rocm_loader_predates(tmp_path, kdb,
                                                                                             monkeypatch):
    bundle = amd_bundle(tmp_path / "offered" / "bundle", 5)
    wheel = write_package(bundle, tmp_path / "offered" / "wheels")
    monkeypatch.setenv("KDB_DEVICE_RUNTIME", "HIP 5.1")
    code, out = _check(kdb, tmp_path / "offered", "--json")
    (device,) = json.loads(out)["devices"]
    reasons = {r["candidate"]: r["reason"] for r in device["rejected"]}
    expected = ("holds AMD code object v5, which needs ROCm 5.2 or newer to load; this one supports HIP 5.1: "
                "update ROCm to 5.2 or newer, or install a package of code object v4 or older")
    assert code == 1 and device["chosen"] is None
    assert reasons == {str(bundle): expected, str(wheel): expected}
    code, out = _check(kdb, tmp_path / "offered")  # the table and one line per candidate
    assert code == 1 and out.count("holds AMD code object v5") == 2
    monkeypatch.setenv("KDB_DEVICE_RUNTIME", "HIP 5.2")
    code, out = _check(kdb, tmp_path / "offered", "--json")
    (device,) = json.loads(out)["devices"]
    assert code == 0 and device["chosen"] == str(wheel)  # a wheel before a bare bundle, as always
    monkeypatch.delenv("KDB_DEVICE_RUNTIME")  # nothing says the version (no HIP device here): not judged
    code, out = _check(kdb, tmp_path / "offered", "--json")
    assert code == 0 and json.loads(out)["devices"][0]["chosen"] == str(wheel)


def test_install_chooses_the_bundle_whose_code_objects_this_rocm_loads(tmp_path):
    v4, v5 = amd_bundle(tmp_path / "v4", 4), amd_bundle(tmp_path / "v5", 5)
    v6 = amd_bundle(tmp_path / "v6", 6)
    choice = choose(GFX942_304, scan(tmp_path), runtime=DeviceRuntime("hip", (5, 1)))
    assert choice.chosen.path == v4  # read from its code objects: the one ROCm 5.1 loads
    rejected = dict((c.path, why) for c, why in choice.rejected)
    assert rejected[v5].startswith("holds AMD code object v5, which needs ROCm 5.2")
    assert rejected[v6].startswith("holds AMD code object v6, which needs ROCm 6.2")
    choice = choose(GFX942_304, scan(tmp_path), runtime=DeviceRuntime("hip", (6, 1)))
    assert dict((c.path, why) for c, why in choice.rejected)[v6].endswith(
        "update ROCm to 6.2 or newer, or install a package of code object v5 or older")
    assert choice.chosen.path in (v4, v5)
    choice = choose(GFX942_304, scan(tmp_path), runtime=DeviceRuntime("hip", (6, 2)))
    assert not [why for _, why in choice.rejected if "code object" in why]
