"""``kdb package`` and ``kdb install`` over the packager's API: a folder of bundles packages
(as ``kdb install --from`` takes one), a bundle named twice is one wheel, and an empty folder
says it holds no package and how to make them."""

from __future__ import annotations

import json

from kdbkit.kdb import Target, write_bundle
from kdbkit.runtime.kernel_sources import source_digest

SM90 = Target("cuda", "sm_90")
GFX942 = Target("hip", "gfx942")


def _bundle(folder, target):
    folder.mkdir(parents=True, exist_ok=True)
    return write_bundle(folder / target.bundle_name(), target, [("softmax.c", "-DX", bytes(range(256)) * 8)],
                        compiler="nvrtc 13.0", binary_format="cubin" if target.backend == "cuda" else "hsaco",
                        sources={"softmax.c": source_digest("softmax.c")})


def test_a_folder_of_bundles_packages_each_one(kdb, tmp_path):
    out = tmp_path / "out"
    _bundle(out, SM90), _bundle(out / "more", GFX942)
    code, stdout, err = kdb("package", out, "-o", tmp_path / "wheels", "--json")
    assert code == 0, err
    wheels = sorted(p.split("/")[-1].split("-")[0] for p in json.loads(stdout)["wheels"])
    assert wheels == ["kdbkit_kernels_gfx942", "kdbkit_kernels_sm_90"]
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "wheels").glob("*.whl")) == wheels


def test_a_bundle_named_twice_is_packaged_once(kdb, tmp_path):
    bundle = _bundle(tmp_path / "out", SM90)
    code, stdout, err = kdb("package", bundle, bundle, tmp_path / "out", "-o", tmp_path / "wheels", "--json")
    assert code == 0, err
    assert len(json.loads(stdout)["wheels"]) == 1


def test_a_folder_without_bundles_is_one_line_naming_it(kdb, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = kdb("package", tmp_path / "empty", "-o", tmp_path / "wheels")
    assert code == 1 and "holds no bundle (.kdb)" in " ".join(err.split())


def test_install_from_an_empty_folder_says_it_has_no_packages_and_how_to_make_them(kdb, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = kdb("install", "--from", tmp_path / "empty", "--target", "sm_90_132")
    text = " ".join(err.split())
    assert code == 1 and "holds no kernel package or bundle" in text
    assert "kdb build" in text and "kdb package" in text
