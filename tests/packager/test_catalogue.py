"""Catalogues: config strings, MIOpen keys and driver commands (kdbkit's logged lines and
MIOpen's), each bad line reported with its number while the rest still builds; the programs
the solvers ask for, per backend; a user's logged calls round-trip to the same problems."""

from __future__ import annotations

import re

import numpy as np
import pytest

import kdbkit
from kdbkit.packager.catalogue import programs_for, read_catalogue
from kdbkit.runtime.primitives.catalogue import all_programs
from kdbkit.runtime.problem import parse_config
from tests.runtime.chain_fixtures import chain_backend, chain_device, isolated, make_handle  # noqa: F401

LINES = """\
# ResNet-50's first layer, three ways, and a softmax
64-112-112-7x7-3-224-224-32-3x3-2x2-1x1-0-NCHW-FP16-B
kdbkit command: [LogCmdConvolution] kdb driver convfp16 -n 32 -c 3 -H 224 -W 224 -k 64 -y 7 -x 7 -p 3 -q 3 -u 2 -v 2 -F 1
MIOpen(HIP): Command [LogCmdConvolution] ./bin/MIOpenDriver convfp16 -n 32 -c 3 -H 224 -W 224 -k 64 -y 7 -x 7 -p 3 -q 3 -u 2 -v 2 -F 6

softmax,dir=fwd,algo=accurate,mode=channel,type=fp32,shape=2x4x9x9,xs=324x81x9x1,ys=324x81x9x1,a=1.0,b=0.0
softmax,dir=sideways
kdb driver conv -n 0
MIOpenDriver convfp16 -n 32 -c 3 -H 224 -W 224 -k 64 -y 7 -x 7 -p 3 -q 3 -u 2 -v 2 -F 1   # again: once
kdbkit warning: [runtime.lookup] Missing system database file: sm_90_132.kdb Performance may degrade
MIOpen(HIP): Info [FindConvFwdAlgorithm] a log's other lines name nothing to build
"""


def test_every_spelling_is_read_and_bad_lines_are_reported_with_their_numbers(tmp_path):
    path = tmp_path / "model.txt"
    path.write_text(LINES)
    catalogue = read_catalogue(path)
    configs = [p.config() for p in catalogue.problems]
    assert configs == ["64-112-112-7x7-3-224-224-32-3x3-2x2-1x1-0-NCHW-FP16-B",  # (again in line 4's -F 6)
                       "3-224-224-7x7-64-112-112-32-3x3-2x2-1x1-0-NCHW-FP16-F",
                       "64-112-112-7x7-3-224-224-32-3x3-2x2-1x1-0-NCHW-FP16-W",
                       "softmax,dir=fwd,algo=accurate,mode=channel,type=fp32,shape=2x4x9x9,xs=324x81x9x1,"
                       "ys=324x81x9x1,a=1.0,b=0.0"]
    assert [(e.line, e.text.split(",")[0].split(" -n")[0]) for e in catalogue.errors] == [
        (7, "softmax"), (8, "kdb driver conv")]
    assert "has no algo=" in catalogue.errors[0].reason and catalogue.log_lines == 2
    assert "-n: 0 is below 1" in catalogue.errors[1].reason and str(catalogue.errors[1]).startswith(f"{path}:8: ")


def test_the_programs_are_the_solvers_per_backend(tmp_path):
    path = tmp_path / "model.txt"
    path.write_text(LINES)
    problems = read_catalogue(path).problems
    cuda, opencl = programs_for(problems, "cuda"), programs_for(problems, "opencl")
    files = {p.kernel_file for p in cuda}
    assert {"conv_igemm_tc.cu", "conv_direct.c", "conv_igemm.c", "softmax.c"} <= files
    assert all(p.kernel_file.endswith(".c") for p in opencl) and set(opencl) < set(cuda)
    assert set(cuda) <= set(all_programs("cuda"))  # a model's programs are a slice of --all's
    assert len(set(cuda)) == len(cuda)


def test_a_run_logged_with_kdb_enable_logging_cmd_is_its_own_catalogue(make_handle, logging_cmd, capsys,  # noqa: F811
                                                                       tmp_path):
    """Run a model once with KDB_ENABLE_LOGGING_CMD=1, keep its stderr (warnings and all): it names
    what the model used."""
    h = make_handle()
    x, w = np.ones((2, 4, 9, 8), np.float32), np.ones((6, 2, 3, 2), np.float32)
    y = kdbkit.convolution_forward(h, x, w, pad=(1, 0), stride=(2, 1), groups=2)
    kdbkit.softmax_forward(h, y)
    log = capsys.readouterr().err
    path = tmp_path / "run.log"
    path.write_text(log)
    catalogue = read_catalogue(path)
    assert not catalogue.errors
    logged = re.findall(r"--config '?([^' ]+)'?", log)
    assert [p.config() for p in catalogue.problems] == [parse_config(c).config() for c in logged] and len(logged) == 2


def test_a_find_db_is_a_catalogue_of_the_problems_find_ranked(make_handle, isolated):  # noqa: F811
    from kdbkit.kdb.errors import NotABundleError
    from kdbkit.runtime.find import find_solutions

    h = make_handle()
    problems = [parse_config(PROBLEM) for PROBLEM in (
        "softmax,dir=fwd,algo=accurate,mode=channel,type=fp32,shape=2x4x9x9,xs=324x81x9x1,ys=324x81x9x1,a=1.0,b=0.0",
        "4-9-9-3x3-6-9-9-2-1x1-1x1-1x1-0-NCHW-FP32-F")]
    for problem in problems:
        find_solutions(h, problem)
    (ufdb,) = (isolated / "userdb").rglob("*.ufdb")
    catalogue = read_catalogue(ufdb)
    assert not catalogue.errors and sorted(p.config() for p in catalogue.problems) == sorted(
        p.config() for p in problems)
    bogus = isolated / "bogus.fdb"
    bogus.write_text("not sqlite")
    with pytest.raises(NotABundleError, match="is not a find-db"):
        read_catalogue(bogus)


def test_a_built_in_network_is_a_catalogue_and_a_missing_file_names_them(tmp_path, monkeypatch):
    from kdbkit.runtime.models import builtin_catalogue

    monkeypatch.chdir(tmp_path)
    read = read_catalogue("resnet50")
    assert [p.config() for p in read.problems] == [p.config() for p in builtin_catalogue("resnet50")]
    assert {p.primitive for p in read_catalogue("bert_base").problems} >= {"gemm", "softmax", "layernorm"}
    (tmp_path / "resnet50").write_text("# a file of that name wins over the built-in one\n")
    assert read_catalogue("resnet50").problems == []
    with pytest.raises(FileNotFoundError, match="nor a built-in catalogue: resnet18, resnet50, vgg16"):
        read_catalogue("resnet51")
