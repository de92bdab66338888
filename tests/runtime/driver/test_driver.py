"""``kdb driver`` (MIOpenDriver's equivalent) and KDB_ENABLE_LOGGING_CMD, on the chain device (PoCL in CI)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

import kdbkit
from kdbkit.runtime.cli.app import main
from kdbkit.runtime.driver import registry
from kdbkit.runtime.driver.tensors import HostTensors
from kdbkit.runtime.logging_setup import configure_logging
from kdbkit.runtime.problem import parse_config
from kdbkit.runtime.tensor import DeviceTensor, TensorDesc
from tests.runtime.chain_fixtures import chain_backend, chain_device, child_env, isolated, make_handle  # noqa: F401

FLOAT = r"[0-9]+\.[0-9]{6}"
SCI = r"[0-9]\.[0-9]e[+-][0-9]{2}"


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory):
    """One kernel cache for the module: each test's find-db and system folder stay its own."""
    return tmp_path_factory.mktemp("driver-cache")


@pytest.fixture
def kdb(isolated, kernel_cache, chain_device, monkeypatch, capsys):  # noqa: F811
    """Run ``kdb ARGS...`` in-process on the chain device; returns (exit code, stdout, stderr)."""
    monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(kernel_cache))
    monkeypatch.setenv("KDB_BACKEND", chain_device.backend)

    def run(*args):
        words = shlex.split(args[0]) if len(args) == 1 else [str(a) for a in args]
        code = main(words)
        captured = capsys.readouterr()
        return code, captured.out, captured.err
    return run


def _problems(out: str) -> list[str]:
    return re.findall(r"^Problem: (\S+)$", out, re.M)


@pytest.mark.parametrize("command, title, flags", [
    ("activ", "Activation", "-m elu -A 0.5"),
    ("softmax", "Softmax", "-a 2 -m 0 -A 0.5 -B 0.25"),
    ("lnorm", "Layer Norm", "--dim 2"),
    ("pool", "Pooling", "-m max -y 3 -x 3 -u 2 -v 2 -p 1 -q 1"),
    ("pool", "Pooling", "-m avg -y 2 -x 3 -u 1 -v 2 -q 1"),
    ("pool", "Pooling", "-m avg_in -y 3 -x 2 -u 2 -v 1 -p 1"),
])
def test_forward_and_backward_verify_and_are_timed(kdb, command, title, flags):
    code, out, err = kdb(f"driver {command} -n 2 -c 4 -H 4 -W 8 {flags} -F 0 -V 1 -t 1 -i 3")
    assert code == 0, out + err
    assert out.startswith("Device: ")
    configs = _problems(out)
    assert [parse_config(c).direction for c in configs] == ["fwd", "bwd"]
    assert all(parse_config(c).config() == c and "shape=2x4x4x8" in c for c in configs)
    for phase in ("Forward", "Backward"):
        assert re.search(rf"^GPU Kernel Time {phase} {title} Elapsed: {FLOAT} ms \(average\)$", out, re.M), out
        ok = re.search(rf"^{phase} {title} Verifies OK on CPU reference \(({SCI}) < 1\.0e-05\)$", out, re.M)
        assert ok and float(ok.group(1)) < 1e-5, out
    assert len(re.findall(r"^Solver: \w+ \(\d+\), chosen by heuristic$", out, re.M)) == 2


@pytest.mark.parametrize("command, tolerance, flags", [
    ("conv", "1.0e-05", "-k 6 -y 3 -x 2 -p 1 -q 0 -u 2 -v 1 -l 1 -j 2 -g 2"),
    ("convfp16", "2.0e-03", "-k 5 -y 3 -x 3 -p 1 -q 1 -I NHWC -O NHWC -f NHWC"),
    ("convbfp16", "1.6e-02", "-k 8 -y 1 -x 1 -u 2 -v 2"),
])
def test_convolution_verifies_every_direction_as_miopens_driver_prints_it(kdb, command, tolerance, flags):
    code, out, err = kdb(f"driver {command} -n 2 -c 4 -H 9 -W 8 {flags} -V 1 -t 1 -i 2")
    assert code == 0, out + err
    configs = [parse_config(c) for c in _problems(out)]
    assert [p.direction for p in configs] == ["F", "B", "W"] and all(p.config() == c for p, c in
                                                                      zip(configs, _problems(out)))
    for timing, verdict, name in (("Forward Conv.", "Forward Convolution", "fwd"),
                                  ("Backward Data Conv.", "Backward Convolution Data", "bwd"),
                                  ("Backward Weights Conv.", "Backward Convolution Weights", "wrw")):
        assert re.search(rf"^GPU Kernel Time {re.escape(timing)} Elapsed: {FLOAT} ms \(average\)$", out, re.M), out
        assert re.search(rf"^stats: {name}-conv\d+x\d+u\d+, 2, 4, \d+, \d+, \d+, \d+, \d+, \d+, \d+, \d+, "
                         rf"[0-9.]+, [0-9.]+, {FLOAT}$", out, re.M), out
        assert re.search(rf"^{verdict} Verifies OK on CPU reference \({SCI} < {tolerance}\)$", out, re.M), out
    code, out, err = kdb(f"driver conv --config '{configs[1].config()}' -V 1")  # a key runs its own direction
    assert code == 0 and [parse_config(c) for c in _problems(out)] == [configs[1]], out + err


@pytest.mark.parametrize("flags, biases", [("-F 0", ["fwd", "bwd"]), ("-F 1", ["fwd"]), ("-F 4", ["bwd"]),
                                           ("-F 3 -I NHWC -O NHWC -f NHWC", ["fwd", "bwd"])])
def test_convolution_bias_runs_after_the_convolutions_it_belongs_to(kdb, flags, biases):
    """-b 1: y += bias after a forward, db from dy with the backward directions, each verified."""
    code, out, err = kdb(f"driver convfp16 -n 2 -c 4 -H 9 -W 8 -k 6 -y 3 -x 3 -p 1 -q 1 {flags} -b 1 -V 1 -t 1")
    assert code == 0, out + err
    problems = [parse_config(c) for c in _problems(out)]
    bias = [p for p in problems if p.primitive == "convbias"]
    assert [p.direction for p in bias] == biases and len(problems) == len(bias) + bin(int(flags[3]) or 7).count("1")
    layout = "NHWC" if "NHWC" in flags else "NCHW"
    assert all(p.strides == (432, 1, 48, 6) if layout == "NHWC" else p.strides == (432, 72, 8, 1) for p in bias)
    for d in biases:
        phase = "Forward" if d == "fwd" else "Backward"
        assert re.search(rf"^GPU Kernel Time {phase} Bias Conv. Elapsed: {FLOAT} ms \(average\)$", out, re.M), out
        assert re.search(rf"^{phase} Convolution Bias Verifies OK on CPU reference \({SCI} < ", out, re.M), out


def test_tensorop_verifies_with_broadcasting_and_is_timed(kdb):
    code, out, err = kdb("driver tensorop --op max -n 2 -c 8 -H 2 -W 3 --bshape 1x8x1x1 -A 0.5 -B -2 --beta 0.25 -t 1")
    assert code == 0, out + err
    (config,) = _problems(out)
    problem = parse_config(config)
    assert (problem.op, problem.b_shape, problem.alpha2, problem.beta) == ("max", (1, 8, 1, 1), -2.0, 0.25)
    assert "Solver: OpTensorStrided (6), chosen by heuristic" in out
    assert re.search(rf"^GPU Kernel Time Tensor Op Elapsed: {FLOAT} ms \(average\)$", out, re.M)
    assert re.search(rf"^Tensor Op Verifies OK on CPU reference \({SCI} < 1\.0e-05\)$", out, re.M)


def test_pooling_saves_indices_only_for_max_when_asked(kdb):
    code, out, err = kdb("driver pool -n 1 -c 2 -H 6 -W 6 -y 3 -x 3 -u 3 -v 3 --indices 0 -F 0")
    assert code == 0, out + err
    assert [parse_config(c).indices for c in _problems(out)] == [False, True]  # as pooling_backward describes it
    code, out, err = kdb("driver pool -m avg -n 1 -c 2 -H 6 -W 6 -F 1")
    assert code == 0 and _problems(out)[0].endswith(",idx=0"), out + err  # pooling_forward keeps none for avg


@pytest.mark.parametrize("mode, mode_name, flags", [
    (1, "spatial", ""),
    (0, "per_act", "-s 0 -r 0 --momentum 0.25 --eps 1e-3"),
])
def test_batchnorm_training_backward_and_inference_verify_and_are_timed(kdb, mode, mode_name, flags):
    code, out, err = kdb(f"driver bnorm -n 4 -c 3 -H 4 -W 5 -m {mode} {flags} -F 1 -b 1 -t 1 -i 2")
    assert code == 0, out + err
    train, bwd = (parse_config(c) for c in _problems(out))
    assert (train.direction, bwd.direction) == ("train", "bwd") and train.mode == bwd.mode == mode_name
    assert train.shape == (4, 3, 4, 5) and train.running == ("-r 0" not in flags) and bwd.saved == ("-s 0" not in flags)
    for title in ("Forward Training", "Backward"):
        assert re.search(rf"^GPU Kernel Time {title} Batch Normalization Elapsed: {FLOAT} ms \(average\)$", out, re.M)
        assert re.search(rf"^{title} Batch Normalization Verifies OK on CPU reference \({SCI} < 1\.0e-05\)$", out,
                         re.M), out
    code, out, err = kdb(f"driver bnorm -n 4 -c 3 -H 4 -W 5 -m {mode} -F 2 -t 1")
    assert code == 0, out + err
    assert [parse_config(c).direction for c in _problems(out)] == ["infer"]
    assert re.search(rf"^GPU Kernel Time Forward Inference Batch Normalization Elapsed: {FLOAT} ms", out, re.M)
    assert re.search(rf"^Forward Inference Batch Normalization Verifies OK on CPU reference \({SCI} < 1\.0e-05\)$",
                     out, re.M)
    code, out, err = kdb(f"driver bnorm -n 4 -c 3 -H 4 -W 5 -m {mode} -F 0 -b 1")  # backward alone
    assert code == 0 and [parse_config(c).direction for c in _problems(out)] == ["bwd"], out + err


@pytest.mark.parametrize("flags, m, n, k, batch", [
    ("-m 24 -n 16 -k 40", 24, 16, 40, 1),
    ("-m 17 -n 9 -k 33 -u 1 -v 1 -b 3 -A 0.5 -B -1.5", 17, 9, 33, 3),
    ("-m 8 -n 12 -k 20 -u 1 -b 2 -B 0.25", 8, 12, 20, 2),
])
def test_gemm_verifies_and_is_timed(kdb, flags, m, n, k, batch):
    code, out, err = kdb(f"driver gemm {flags} -t 1")
    assert code == 0, out + err
    (config,) = _problems(out)
    problem = parse_config(config)
    assert (problem.m, problem.n, problem.k, problem.batch) == (m, n, k, batch)
    assert (problem.trans_a, problem.trans_b) == ("-u 1" in flags, "-v 1" in flags)
    assert problem.ldc == n and problem.stride_c == (m * n if batch > 1 else 0)  # packed, as gemm() describes it
    assert re.search(r"^Solver: \w+ \(\d+\), chosen by heuristic$", out, re.M)
    assert re.search(rf"^GPU Kernel Time GEMM Elapsed: {FLOAT} ms \(average\)$", out, re.M), out
    assert re.search(rf"^GEMM Verifies OK on CPU reference \({SCI} < 1\.0e-05\)$", out, re.M), out


@pytest.mark.parametrize("command, dtype, tolerance", [("poolfp16 -m avg_in -p 1 -y 3 -x 3 -F 0", "fp16", "2.0e-03"),
                                                       ("poolbfp16 -F 2", "bf16", "1.6e-02"),
                                                       ("bnormfp16 -F 1 -b 1", "fp16", "2.0e-03"),
                                                       ("bnormbfp16 -F 2 -m 0", "bf16", "1.6e-02"),
                                                       ("gemmfp16 -m 20 -n 24 -k 36 -B 1", "fp16", "2.0e-03"),
                                                       ("gemmbfp16 -m 20 -n 24 -k 36 -v 1", "bf16", "1.6e-02")])
def test_miopen_command_names_set_the_type_of_the_new_primitives(kdb, command, dtype, tolerance):
    code, out, err = kdb(f"driver {command}")
    assert code == 0, out + err
    configs = _problems(out)
    assert configs and all(parse_config(c).dtype.label == dtype for c in configs)
    assert len(re.findall(rf"Verifies OK on CPU reference \({SCI} < {re.escape(tolerance)}\)", out)) == len(configs)


@pytest.mark.parametrize("command, config, flags, configs", [
    ("pool", "pool,dir=bwd,mode=max,type=bf16,shape=2x3x7x9,win=3x2,stride=1x2,pad=1x0,xs=300x100x10x1,"
     "ys=200x60x6x1,idx=1", "-F 0", ["fwd", "bwd"]),
    ("pool", "pool,dir=fwd,mode=avg_in,type=fp32,shape=1x2x5x5,win=3x3,stride=2x2,pad=1x1,xs=50x1x10x2,"
     "ys=18x1x6x2,idx=0", "-t 1", ["fwd"]),
    ("bnorm", "bnorm,dir=train,mode=per_act,type=fp16,shape=4x3x2x5,xs=40x10x5x1,ys=35x11x5x1,eps=0.001,f=0.25,"
     "running=1,saved=1", "-F 1 -t 1", ["train"]),
    ("bnorm", "bnorm,dir=bwd,mode=spatial,type=fp32,shape=3x2x3x3,xs=1x3x18x6,ys=18x9x3x1,eps=1e-05,f=0.1,"
     "running=1,saved=0", "-F 0", ["bwd"]),
    ("bnorm", "bnorm,dir=infer,mode=spatial,type=fp32,shape=2x3x4x4,xs=64x16x4x1,ys=48x16x4x1,eps=1e-05,f=0.1,"
     "running=1,saved=1", "", ["infer"]),
    ("gemm", "gemm,type=fp16,m=5,n=7,k=6,ta=1,tb=0,batch=3,lda=8,ldb=9,ldc=10,sa=60,sb=0,sc=55,a=0.5,b=0.25", "-t 1",
     [None]),
])
def test_a_strided_config_round_trips(kdb, command, config, flags, configs):
    code, out, err = kdb("driver", command, "--config", config, *shlex.split(flags))
    assert code == 0, out + err
    got = _problems(out)
    assert [getattr(parse_config(c), "direction", None) for c in got] == configs
    assert config in got and all(parse_config(c).config() == c for c in got)
    assert out.count("Verifies OK") == len(configs) and "FAILED" not in out


@pytest.mark.parametrize("command, dtype, tolerance", [("softmaxbfp16", "bf16", "1.6e-02"),
                                                       ("activfp16", "fp16", "2.0e-03"),
                                                       ("layernorm", "fp32", "1.0e-05")])
def test_miopen_command_names_set_the_type(kdb, command, dtype, tolerance):
    code, out, err = kdb(f"driver {command} -n 1 -c 8 -H 2 -W 2 -F 2")
    assert code == 0, out + err
    (config,) = _problems(out)
    assert parse_config(config).dtype.label == dtype and parse_config(config).direction == "bwd"
    assert re.search(rf"Verifies OK on CPU reference \({SCI} < {re.escape(tolerance)}\)", out)


def test_find_then_the_find_db(kdb, isolated):  # noqa: F811
    args = "driver softmax -n 2 -c 8 -H 2 -W 2 -F 1"
    code, out, err = kdb(f"{args} -S -1")
    assert code == 0, out + err
    # every applicable forward solver: SoftmaxThread, SoftmaxRows and SoftmaxBlock for rows of 8
    found = re.search(r"^Find: timed 3 solver\(s\) and recorded the ranking in the user find-db: (\w+) \((\d+)\)",
                      out, re.M)
    assert found, out
    best = f"Solver: {found.group(1)} ({found.group(2)}), chosen by find (-S -1)"
    assert best in out and "Verifies OK" in out
    assert list((isolated / "userdb").iterdir())
    code, out, err = kdb(f"{args} -S -1")  # a second run reads the ranking
    assert code == 0 and re.search(r"^Find: ranking read from the find-db \(user\), nothing timed: ", out, re.M)
    assert best in out
    code, out, err = kdb(args)  # immediate mode follows it too
    assert code == 0 and f"Solver: {found.group(1)} ({found.group(2)}), chosen by find-db (immediate mode)" in out


@pytest.mark.parametrize("solver", ["SoftmaxBlock", "4"])
def test_a_solver_asked_for(kdb, solver):
    code, out, err = kdb(f"driver softmax -n 1 -c 8 -H 2 -W 2 -F 0 -S {solver}")
    assert code == 0, out + err
    assert out.count("Solver: SoftmaxBlock (4), chosen by -S") == 2 and out.count("Verifies OK") == 2


def test_a_strided_config_runs_both_directions(kdb):
    config = "activ,dir=bwd,mode=leakyrelu,type=fp16,shape=3x5,xs=8x1,ys=6x1,a=0.25,b=0.0,g=0.0"
    code, out, err = kdb("driver", "activ", "--config", config, "-t", "1")
    assert code == 0, out + err
    assert _problems(out) == [config] and "ActivStrided" in out
    code, out, err = kdb("driver", "activ", "--config", config, "-F", "0")
    assert code == 0, out + err
    assert _problems(out) == [config.replace("dir=bwd", "dir=fwd"), config] and out.count("Verifies OK") == 2


@pytest.mark.parametrize("args, message", [
    ("driver activ -x 3", "No such option: -x"),
    ("driver softmax -a 3", "Invalid value for -a: 3 is not one of 0, 1, 2"),
    ("driver softmax -n abc", "Invalid value for '-n'"),
    ("driver softmax -n 0", "Invalid value for -n: 0 is below 1"),
    ("driver activ -m nope", "unknown activation mode 'nope'"),
    ("driver tensorop -F 1", "No such option: -F"),
    ("driver tensorop --bshape 1x3x1x1", "b's size 3 in dimension 1 neither is 1 nor matches a's 8"),
    ("driver lnorm --dim 4", "layer norm dim 4 for a 4-D tensor"),
    ("driver softmax -S 1", "Invalid value for -S: '1' is not a softmax solver"),
    ("driver nosuch", "No such command 'nosuch'"),
    ("driver activ --config 'activ,dir=fwd,mode=relu'", "has no shape="),
    ("driver activ -n 3 --config 'activ,dir=fwd,mode=relu,type=fp32,shape=4,xs=1,ys=1'",
     "-n cannot be combined with --config"),
    ("driver activ -F 2 --config 'activ,dir=fwd,mode=relu,type=fp32,shape=4,xs=1,ys=1'",
     "the config is a fwd problem but -F 2 asks for bwd"),
    ("driver softmax --config 'activ,dir=fwd,mode=relu,type=fp32,shape=4,xs=1,ys=1'",
     "names a activ problem and `kdb driver softmax` runs softmax ones: run `kdb driver activ`"),
    ("driver pool -m median", "Invalid value for -m: 'median' is not one of max, avg, avg_in"),
    ("driver pool -H 4 -y 5", "leaves no output"),
    ("driver pool -p 2", "pooling pad (2, 0) is not smaller than the window (2, 2)"),
    ("driver pool -u 0", "Invalid value for -u: 0 is below 1"),
    ("driver pool -S 9", "Invalid value for -S: '9' is not a pool solver"),
    ("driver bnorm -F 0", "-F 0 without -b 1 runs nothing"),
    ("driver bnorm -m 2", "Invalid value for -m: 2 is not one of 0, 1"),
    ("driver bnorm --eps 0", "batch norm eps 0.0"),
    ("driver bnorm -F 2 --config 'bnorm,dir=train,mode=spatial,type=fp32,shape=1x2x2x2,xs=8x4x2x1,ys=8x4x2x1'",
     "the config is a train problem but -F 2 asks for infer; give -F 1 or leave -F out"),
    ("driver bnorm -b 1 --config 'bnorm,dir=bwd,mode=spatial,type=fp32,shape=1x2x2x2,xs=8x4x2x1,ys=8x4x2x1'",
     "-b cannot be combined with --config"),
    ("driver conv -I NHWC", "-I NHWC, -O NCHW and -f NCHW differ"),
    ("driver conv -m trans", "Invalid value for -m: 'trans' is not one of conv"),
    ("driver conv -c 4 -k 6 -g 3", "multiples of the group count"),
    ("driver conv -H 2 -y 3", "leaves no output"),
    ("driver conv -F 8", "Invalid value for -F: 8 is not one of"),
    ("driver conv --config '64-56-56-3x3-64-56-56-32-1x1-1x1-1x1-1-NCHW-FP32-F'", "has a bias"),
    ("driver conv -y 3 --config '4-9-9-3x3-6-9-9-2-1x1-1x1-1x1-0-NCHW-FP32-F'", "-y cannot be combined with --config"),
    ("driver gemm -H 3", "No such option: -H"),
    ("driver gemm -F 1", "No such option: -F"),
    ("driver gemm -u 2", "Invalid value for -u: 2 is not one of 0, 1"),
    ("driver gemm -k 0", "Invalid value for -k: 0 is below 1"),
    ("driver gemm --config 'gemm,type=fp32,m=4,n=4,k=4,ta=0,tb=0,batch=1,lda=3,ldb=4,ldc=4,sa=0,sb=0,sc=0'",
     "gemm lda=3 is smaller than the 4 columns it strides over"),
    ("driver gemm --config 'pool,dir=fwd,mode=max,type=fp32,shape=1x1x2x2,win=2x2,stride=2x2,pad=0x0,xs=4x4x2x1,"
     "ys=1x1x1x1'", "names a pool problem and `kdb driver gemm` runs gemm ones: run `kdb driver pool`"),
])
def test_bad_flags_are_one_line_usage_errors(kdb, args, message):
    code, out, err = kdb(args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and message in err, err


def test_a_wrong_result_fails_with_exit_1(kdb, monkeypatch):
    spec = registry.for_primitive("softmax")
    real = type(spec).reference
    monkeypatch.setattr(type(spec), "reference", lambda self, p, t: {k: v + 0.03 for k, v in real(self, p, t).items()})
    code, out, err = kdb("driver softmax -n 1 -c 8 -H 2 -W 2 -F 0")
    assert code == 1, out + err
    assert re.search(rf"^Forward Softmax FAILED: ({SCI}) > 1\.0e-05$", out, re.M), out
    assert re.search(rf"^Backward Softmax FAILED: {SCI} > 1\.0e-05$", out, re.M)


@pytest.mark.parametrize("args, output", [
    ("pool -n 1 -c 2 -H 4 -W 4 -F 1", "y"), ("pool -n 1 -c 2 -H 4 -W 4 -F 2", "dx"),
    *(("bnorm -n 2 -c 2 -H 2 -W 2 -F 1", name) for name in ("y", "saved_mean", "saved_invstd", "running_mean",
                                                               "running_var")),
    ("bnorm -n 2 -c 2 -H 2 -W 2 -F 2", "y"),
    *(("bnorm -n 2 -c 2 -H 2 -W 2 -F 0 -b 1", name) for name in ("dx", "dscale", "dbias")),
    ("gemm -m 4 -n 4 -k 4", "c"),
    ("conv -n 1 -c 2 -H 5 -W 5 -k 3 -F 1", "y"), ("conv -n 1 -c 2 -H 5 -W 5 -k 3 -F 2", "dx"),
    ("conv -n 1 -c 2 -H 5 -W 5 -k 3 -F 4", "dw"),
])
def test_every_output_is_verified(kdb, monkeypatch, args, output):
    spec = registry.for_primitive(parse_config(_problems(kdb(f"driver {args} -V 0")[1])[0]).primitive)
    real = type(spec).reference

    def off(self, p, t):
        expected = real(self, p, t)
        return {**expected, output: expected[output] + 0.03}
    monkeypatch.setattr(type(spec), "reference", off)
    code, out, err = kdb(f"driver {args}")
    assert code == 1 and re.search(rf"^[\w ]+ FAILED: ({SCI}) > 1\.0e-05$", out, re.M), out + err


def test_a_tolerance_too_tight_fails_and_no_verification_passes(kdb):
    code, out, err = kdb("driver softmaxbfp16 -n 1 -c 8 -H 2 -W 2 -F 1 --tolerance 1e-9")
    assert code == 1 and re.search(rf"^Forward Softmax FAILED: {SCI} > 1\.0e-09$", out, re.M), out
    code, out, err = kdb("driver softmaxbfp16 -n 1 -c 8 -H 2 -W 2 -F 1 --tolerance 1e-9 -V 0")
    assert code == 0 and "Verifies" not in out and "FAILED" not in out


def test_a_missing_device_is_one_line(kdb):
    code, out, err = kdb("driver activ --device 99")
    assert code == 1 and "no device 99" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [
    "driver conv -n 99999999999999999999",  # was numpy's ValueError: Maximum allowed dimension exceeded
    "driver conv -n 100000 -c 1000 -H 1000 -W 1000 -F 1",  # was a MemoryError for 728 TiB
    "driver gemm -m 4000000 -n 4000000 -k 4000000",
])
def test_sizes_the_device_cannot_hold_are_refused_in_one_line_before_allocating(kdb, chain_device, args):
    code, out, err = kdb(args)
    errors = [line for line in err.splitlines() if not line.startswith("kdbkit warning: ")]
    assert code == 1 and len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith("error: the problem's tensors need ") and "give smaller sizes" in errors[0]
    assert f"and {chain_device.name} has " in errors[0] and "of global memory" in errors[0]
    assert "Solver:" not in out  # refused before a solver was chosen or a buffer made


def test_sizes_this_machine_cannot_hold_are_refused_before_allocating():
    from kdbkit.runtime.driver.tensors import check_fits
    from kdbkit.runtime.errors import ProblemError

    huge = {"x": TensorDesc(kdbkit.DataType.FP32, (2**50,), (1,))}  # 4 PiB: a device this big, no host
    with pytest.raises(ProblemError, match=r"needs about 16\.0 PiB of host memory .*\(x 4\.0 PiB\) and this machine"):
        check_fits(huge, "a large device", 2**62)
    check_fits({"x": TensorDesc(kdbkit.DataType.FP32, (1024,), (1,))}, "a device", 4096)  # fits exactly


def test_writes_between_strides_are_caught():
    desc = TensorDesc(kdbkit.DataType.FP32, (2, 3), (4, 1))  # one gap after each row of 3
    t = HostTensors({"y": desc}, np.random.default_rng(0))
    assert t.flat["y"].size == desc.span == 7
    values = t.set("y", np.arange(6.0).reshape(2, 3))
    assert values.tolist() == [[0, 1, 2], [3, 4, 5]] and t.flat["y"][[0, 1, 2, 4, 5, 6]].tolist() == list(range(6))
    back = t.flat["y"].copy()
    assert t.gaps_changed("y", back) == 0
    back[3] += 1
    assert t.gaps_changed("y", back) == 1


# -- KDB_ENABLE_LOGGING_CMD: every primitive call logs the driver command that reproduces it --

LOG_LINE = re.compile(r"^kdbkit command: \[(LogCmd\w+)\] (kdb driver .*)$", re.M)


def _strided(be, shape, strides, rng, dtype=np.float32):
    desc = TensorDesc(kdbkit.DataType.parse(dtype), shape, strides)
    return DeviceTensor(be.to_device(rng.standard_normal(desc.span).astype(dtype)), desc)


def _calls():
    """(name, call(handle) -> None): primitive calls, strided device tensors among them."""
    def softmax_nhwc(h):
        rng, shape = np.random.default_rng(1), (2, 3, 4, 5)
        x = _strided(h.backend, shape, (60, 1, 15, 3), rng)  # NHWC
        kdbkit.softmax_forward(h, x, algorithm="log", mode="channel", alpha=0.5, beta=0.25,
                               y=_strided(h.backend, shape, (60, 1, 15, 3), rng))

    def activation_backward_padded(h):
        rng = np.random.default_rng(2)
        x, y, dy = (_strided(h.backend, (3, 5), (8, 1), rng, np.float16) for _ in range(3))
        dx = _strided(h.backend, (3, 5), (6, 1), rng, np.float16)
        kdbkit.activation_backward(h, x, y, dy, "elu", alpha=0.7, dx=dx)

    def tensorop_broadcast(h):
        a = np.random.default_rng(3).standard_normal((2, 4, 3)).astype(np.float32)
        kdbkit.op_tensor(h, "min", a, a[:1, :, :1].copy(), alpha1=2.0, alpha2=-1.0, solver="OpTensorStrided")

    def layernorm_backward(h):
        rng = np.random.default_rng(4)
        x, dy, w = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 3, 8)), rng.standard_normal(8)
        x, dy, w = (a.astype(np.float32) for a in (x, dy, w))
        _, mean, rstd = kdbkit.layernorm_forward(h, x, w, w, dim=2)
        kdbkit.layernorm_backward(h, x, dy, mean, rstd, w, dim=2)

    def pooling_max_padded(h):
        x = np.random.default_rng(5).standard_normal((2, 3, 7, 9)).astype(np.float32)
        y, indices = kdbkit.pooling_forward(h, x, window=(3, 2), stride=(2, 1), pad=(1, 1))
        kdbkit.pooling_backward(h, y, x.shape, window=(3, 2), stride=(2, 1), pad=(1, 1), indices=indices)

    def batchnorm_per_act_unsaved(h):
        rng = np.random.default_rng(6)
        x, dy = (rng.standard_normal((4, 2, 3, 3)).astype(np.float32) for _ in range(2))
        scale, bias = (rng.standard_normal(18).astype(np.float32) for _ in range(2))
        kdbkit.batchnorm_training(h, x, scale, bias, mode="per_act", eps=1e-3)  # no running statistics
        kdbkit.batchnorm_backward(h, x, dy, scale, mode="per_act", eps=1e-3)  # statistics computed again
        kdbkit.batchnorm_inference(h, x, scale, bias, scale, np.abs(bias) + 1, mode="per_act")

    def gemm_transposed_batch_shared_b(h):
        rng = np.random.default_rng(7)
        a, b, c = rng.standard_normal((3, 6, 5)), rng.standard_normal((7, 6)), rng.standard_normal((3, 5, 7))
        a, b, c = (v.astype(np.float32) for v in (a, b, c))
        kdbkit.gemm(h, a, b, trans_a=True, trans_b=True, alpha=0.5, beta=-0.25, c=c)

    def convolution_channels_last_all_directions(h):
        rng, be = np.random.default_rng(8), h.backend
        x = _strided(be, (2, 4, 7, 6), (168, 1, 24, 4), rng)  # NHWC
        w = _strided(be, (6, 2, 3, 3), (18, 1, 6, 2), rng)  # KYXC
        geometry = {"pad": 1, "stride": (2, 1), "dilation": (1, 2), "groups": 2}
        y = kdbkit.convolution_forward(h, x, w, **geometry)
        kdbkit.convolution_backward_data(h, y, w, x.desc.shape, **geometry)
        kdbkit.convolution_backward_weights(h, y, x, w.desc.shape, **geometry)

    return [("softmax_nhwc", softmax_nhwc), ("activation_backward_padded", activation_backward_padded),
            ("tensorop_broadcast", tensorop_broadcast), ("layernorm_backward", layernorm_backward),
            ("pooling_max_padded", pooling_max_padded), ("batchnorm_per_act_unsaved", batchnorm_per_act_unsaved),
            ("gemm_transposed_batch_shared_b", gemm_transposed_batch_shared_b),
            ("convolution_channels_last_all_directions", convolution_channels_last_all_directions)]


@pytest.mark.parametrize("call", [c for _, c in _calls()], ids=[n for n, _ in _calls()])
def test_the_logged_command_reproduces_the_problem(kdb, make_handle, logging_cmd, capsys, call):  # noqa: F811
    call(make_handle())
    logged = LOG_LINE.findall(capsys.readouterr().err)
    assert logged
    for label, command in logged:
        words = shlex.split(command)
        config = words[words.index("--config") + 1]
        spec = registry.for_primitive(parse_config(config).primitive)
        assert label == spec.log_label and words[:3] == ["kdb", "driver", spec.command]
        code, out, err = kdb(*words[1:])
        assert code == 0, out + err
        assert _problems(out) == [config] and "Verifies OK" in out
        # the driver's own call logs the very same command
        assert LOG_LINE.findall(err) == [(label, command)]


def _pool_calls(h):
    x = np.random.default_rng(5).standard_normal((2, 3, 7, 9)).astype(np.float32)
    y, indices = kdbkit.pooling_forward(h, x, window=(3, 2), stride=(2, 1), pad=(1, 1))
    kdbkit.pooling_backward(h, y, x.shape, window=(3, 2), stride=(2, 1), pad=(1, 1), indices=indices)
    kdbkit.pooling_forward(h, x, mode="avg", window=(3, 2), stride=(2, 1), pad=(1, 1))


def _bnorm_calls(h):
    x, one = np.ones((4, 2, 3, 3), np.float32), np.ones(18, np.float32)
    kdbkit.batchnorm_training(h, x, one, one, mode="per_act", eps=1e-3, momentum=0.25, running_mean=one.copy(),
                              running_var=one.copy())
    kdbkit.batchnorm_backward(h, x, x, one, mode="per_act", eps=1e-3)
    kdbkit.batchnorm_inference(h, x, one, one, one, one, mode="per_act")


def _conv_calls(h):
    x, w = np.ones((2, 4, 9, 8), np.float16), np.ones((6, 2, 3, 2), np.float16)
    geometry = {"pad": (1, 0), "stride": (2, 1), "dilation": (1, 2), "groups": 2}
    y = kdbkit.convolution_forward(h, x, w, **geometry)
    kdbkit.convolution_backward_data(h, y, w, x.shape, **geometry)
    kdbkit.convolution_backward_weights(h, y, x, w.shape, **geometry)


def _gemm_calls(h):
    a, b, c = np.ones((3, 6, 5), np.float16), np.ones((3, 7, 6), np.float16), np.ones((3, 5, 7), np.float16)
    kdbkit.gemm(h, a, b, trans_a=True, trans_b=True, alpha=0.5, beta=-0.25, c=c)


@pytest.mark.parametrize("call, args", [
    (_pool_calls, ["pool -n 2 -c 3 -H 7 -W 9 -y 3 -x 2 -u 2 -v 1 -p 1 -q 1 -F 0 -V 0",
                   "pool -m avg -n 2 -c 3 -H 7 -W 9 -y 3 -x 2 -u 2 -v 1 -p 1 -q 1 -F 1 -V 0"]),
    (_bnorm_calls, ["bnorm -n 4 -c 2 -H 3 -W 3 -m 0 --eps 1e-3 --momentum 0.25 -F 1 -b 1 -s 0 -V 0",
                    "bnorm -n 4 -c 2 -H 3 -W 3 -m 0 -F 2 -V 0"]),
    (_gemm_calls, ["gemmfp16 -m 5 -n 7 -k 6 -u 1 -v 1 -b 3 -A 0.5 -B -0.25 -V 0"]),
    (_conv_calls, ["convfp16 -n 2 -c 4 -H 9 -W 8 -k 6 -y 3 -x 2 -p 1 -q 0 -u 2 -v 1 -l 1 -j 2 -g 2 -F 0 -V 0"]),
], ids=["pool", "bnorm", "gemm", "conv"])
def test_the_flags_describe_a_call_as_the_call_does(kdb, make_handle, logging_cmd, capsys, call, args):  # noqa: F811
    """The same work has the same config string (so the same find-db record) from the flags as from a call."""
    call(make_handle())
    logged = [shlex.split(command) for _, command in LOG_LINE.findall(capsys.readouterr().err)]
    driven = []
    for words in args:
        code, out, err = kdb(f"driver {words}")
        assert code == 0, out + err
        driven += _problems(out)
    assert driven == [words[words.index("--config") + 1] for words in logged]


def test_the_logged_command_runs_in_a_shell(make_handle, logging_cmd, capsys, isolated, kernel_cache):  # noqa: F811
    _calls()[0][1](make_handle())
    (_, command), = LOG_LINE.findall(capsys.readouterr().err)
    words = shlex.split(command)
    env = {**child_env(isolated, KDB_USER_DB_PATH=str(isolated / "userdb")), "KDB_CUSTOM_CACHE_DIR": str(kernel_cache)}
    done = subprocess.run([sys.executable, "-m", "kdbkit.runtime.cli.app", *words[1:]], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _problems(done.stdout) == [words[words.index("--config") + 1]]
    assert "Forward Softmax Verifies OK on CPU reference" in done.stdout


def test_an_asked_solver_is_in_the_logged_command(make_handle, logging_cmd, capsys):  # noqa: F811
    kdbkit.activation_forward(make_handle(), np.ones(4, np.float32), "relu", solver=2)
    (label, command), = LOG_LINE.findall(capsys.readouterr().err)
    assert label == "LogCmdActivation"
    assert command == ("kdb driver activ --config 'activ,dir=fwd,mode=relu,type=fp32,shape=4,xs=1,ys=1,a=0.0,b=0.0,"
                       "g=0.0' -F 1 -S 2")


def test_nothing_is_logged_without_the_variable(make_handle, capsys):  # noqa: F811
    configure_logging(force=True)
    kdbkit.activation_forward(make_handle(), np.ones(4, np.float32))
    assert "LogCmd" not in capsys.readouterr().err


def test_pool_takes_miopens_input_flag_and_refuses_it_with_the_shape_flags(kdb):
    code, out, err = kdb("driver pool --input 2x3x9x10 -m max -y 3 -x 3 -u 2 -v 2 -F 1")
    assert code == 0, out + err
    assert "shape=2x3x9x10" in _problems(out)[0]
    for bad, message in (("--input 2x3x9x10 -H 9", "--input gives the whole shape: drop -H"),
                         ("--input 2x3x9", "'2x3x9' is not four sizes"), ("--input 2x0x9x9", "not four sizes")):
        code, out, err = kdb(f"driver pool {bad} -F 1")
        assert code == 2 and message in out + err, out + err


def test_forward_max_pooling_indices_are_verified_exactly(kdb, monkeypatch):
    code, out, err = kdb("driver pool -n 1 -c 2 -H 7 -W 9 -m max -y 3 -x 3 -u 2 -v 2 -F 1")
    assert code == 0 and "Forward Pooling Verifies OK" in out, out + err
    from kdbkit.runtime.driver import pool

    real = pool.ref.forward

    def off_by_one(x, mode, *rest):  # a reference whose argmax differs from any right kernel's
        y, indices = real(x, mode, *rest)
        return y, None if indices is None else indices + 1

    monkeypatch.setattr(pool.ref, "forward", off_by_one)
    code, out, err = kdb("driver pool -n 1 -c 2 -H 7 -W 9 -m max -y 3 -x 3 -u 2 -v 2 -F 1")
    assert code == 1, out + err
    assert re.search(r"^Forward Pooling FAILED: wrote 24 of 24 indices unlike the reference's$", out, re.M), out
