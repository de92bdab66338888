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


def test_a_binary_catalogue_is_one_line_naming_the_file(kdb, tmp_path):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    for command in (["build", "--target", "sm_80"], ["tune"]):
        code, _, err = kdb(*command, "-c", binary)
        text = " ".join(err.split())
        assert code == 1 and f"{binary} is not a text catalogue" in text, (command, err)
        assert "internal error" not in text and len(err.strip().splitlines()) == 1


def test_an_empty_catalogue_is_refused(kdb, nvrtc, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing yet\n\n")
    code, out, err = kdb("build", "--target", "sm_80", "-c", empty, "-o", tmp_path / "out")
    assert code == 1 and "no problem to build" in " ".join(err.split())
    assert not list(tmp_path.glob("out/*.kdb"))


def test_cluster_with_jobs_is_a_usage_error(kdb, tmp_path):
    code, _, err = kdb("build", "--target", "sm_80", "--all", "--cluster", "localhost:1", "-j", "2")
    assert code == 2 and "-j" in err and "--cluster" in err


def test_the_default_worker_count_is_kdb_compile_parallel_level(kdb, nvrtc, monkeypatch, tmp_path):
    from kdbkit.packager.build import compile_workers

    monkeypatch.setattr("os.cpu_count", lambda: 64)
    monkeypatch.delenv("KDB_COMPILE_PARALLEL_LEVEL", raising=False)
    assert compile_workers() == 20  # `kdb env`'s documented default, as MIOpen's
    monkeypatch.setenv("KDB_COMPILE_PARALLEL_LEVEL", "3")
    assert compile_workers() == 3 and compile_workers(5) == 5
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.delenv("KDB_COMPILE_PARALLEL_LEVEL")
    assert compile_workers() == 2  # never more processes than cores
    catalogue = tmp_path / "one.txt"
    catalogue.write_text("softmax,dir=fwd,algo=accurate,mode=channel,type=fp32,shape=2x4x9x9,xs=324x81x9x1,"
                         "ys=324x81x9x1,a=1.0,b=0.0\n")
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    code, out, err = kdb("build", "--target", "sm_80", "-c", catalogue, "-o", tmp_path / "out", "--json")
    assert code == 0, err
    assert json.loads(out)["workers"] == 20
