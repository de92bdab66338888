"""``kdb build``: targets, catalogue lines skipped with their numbers, shards, exit codes."""

from __future__ import annotations

import json

import pytest

from kdbkit.kdb import open_bundle
from tests.prerequisites import require_nvrtc


@pytest.fixture
def nvrtc():
    require_nvrtc()


def test_a_catalogue_builds_and_a_bad_line_is_named_with_exit_1(kdb, nvrtc, tmp_path):
    catalogue = tmp_path / "model.txt"
    catalogue.write_text("MIOpenDriver conv -n 2 -c 4 -H 9 -W 9 -k 8 -y 3 -x 3 -F 1\nsoftmax,dir=sideways\n")
    code, out, err = kdb("build", "--gpu", "A100-SXM", "-c", catalogue, "-o", tmp_path / "out", "-j", "2", "--json")
    assert code == 1  # the bad line
    report = json.loads(out)
    assert report["failed"] == 0 and report["compiled"] > 0 and list(report["bundles"]) == ["sm_80"]
    assert report["skipped_lines"] == [f"{catalogue}:2: config 'dir=sideways' has no algo=; add algo=<value> "
                                       "(in 'softmax,dir=sideways')"]
    with open_bundle(tmp_path / "out" / "sm_80.kdb") as bundle:
        assert bundle.count() == report["compiled"]
    code, out, err = kdb("build", "--gpu", "A100-SXM", "-c", catalogue, "-o", tmp_path / "out", "--json")
    assert json.loads(out)["compiled"] == 0  # unchanged: nothing compiled


@pytest.mark.parametrize("args, message", [
    (["--target", "sm_80"], "give --catalogue FILE (repeatable) or --all"),
    (["--target", "sm_80", "--all", "--shard", "2/2"], "'2/2' is not I/N with 0 <= I < N"),
    (["--gpu", "MI400X", "--all"], "unknown GPU 'MI400X'"),
    (["--all"], "no target to build for"),
])
def test_bad_arguments_are_one_line_errors(kdb, nvrtc, args, message):
    code, out, err = kdb("build", *args)
    assert code in (1, 2) and message in " ".join(err.split())
