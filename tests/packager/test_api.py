"""The packager's API as ``kdb build``, ``kdb package`` and ``kdb install`` call it: a catalogue
built in two shards equals the one build; the bundles packaged from their folder; the wheel
chosen, verified and (dry run) not installed; a bare bundle installed into a folder."""

from __future__ import annotations

import pytest

from kdbkit.kdb import merge_bundles, open_bundle
from kdbkit.packager import CatalogueError, build_bundles, install_packages, package_bundles
from tests.prerequisites import require_nvrtc

CATALOGUE = ("softmax,dir=fwd,algo=accurate,mode=channel,type=fp32,shape=2x4x9x9,xs=324x81x9x1,ys=324x81x9x1,"
             "a=1.0,b=0.0\nkdb driver activ -n 2 -c 4 -H 4 -W 4 -F 1\n")


@pytest.fixture
def catalogue(tmp_path):
    require_nvrtc()
    path = tmp_path / "model.txt"
    path.write_text(CATALOGUE)
    return path


def _items(path):
    with open_bundle(path) as bundle:
        return sorted(bundle.items())


def test_a_catalogue_in_shards_builds_what_one_build_does(catalogue, tmp_path):
    whole = build_bundles(["sm_80_108"], catalogues=[catalogue], out=tmp_path / "whole", workers=2)
    assert whole.ok and whole.result.compiled == whole.planned > 0 and whole.workers == 2
    parts = [build_bundles(["sm_80"], catalogues=[catalogue], out=tmp_path / f"part{i}", shard=(i, 2), workers=1)
             for i in range(2)]
    assert sum(p.planned for p in parts) == whole.planned
    merge_bundles(tmp_path / "sm_80.kdb", [tmp_path / f"part{i}" / "sm_80.kdb" for i in range(2)])
    assert _items(tmp_path / "sm_80.kdb") == _items(whole.result.bundles["sm_80"])


def test_nothing_to_build_is_refused_before_any_compile(catalogue, tmp_path):
    with pytest.raises(CatalogueError, match="give a catalogue or every program"):
        build_bundles(["sm_80"], out=tmp_path)
    with pytest.raises(CatalogueError, match="does not apply to a cluster build"):
        build_bundles(["sm_80"], every=True, workers=2, cluster="localhost:1", out=tmp_path)
    assert not list(tmp_path.glob("*.kdb"))


def test_built_bundles_package_and_install_through_the_api(catalogue, tmp_path):
    built = build_bundles(["sm_80"], catalogues=[catalogue], out=tmp_path / "out", workers=1)
    packaged, sums = package_bundles([tmp_path / "out"], tmp_path / "wheels")
    assert [p.bundle for p in packaged] == [built.result.bundles["sm_80"]] and sums.is_file()
    report = install_packages(tmp_path / "wheels", targets=["sm_80_108"], dry_run=True)
    (choice,) = report.choices
    assert report.ok and choice.chosen.path == packaged[0].wheel and report.installed == {}
    bare = install_packages(tmp_path / "out", gpus=["A100-SXM"], into=tmp_path / "db")
    assert bare.ok and (tmp_path / "db" / "sm_80.kdb").read_bytes() == built.result.bundles["sm_80"].read_bytes()
