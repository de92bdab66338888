"""The offline build: plan, parallel compile, incremental rebuilds, shards that merge into the
one-machine build, failures reported while the rest is written, and a bundle built for the
chain device from a logged run serving that run again with no JIT."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import shutil

import numpy as np
import pytest

import kdbkit
from kdbkit.kdb import merge_bundles, open_bundle
from kdbkit.packager.build import build, plan, shard
from kdbkit.packager.catalogue import read_catalogue
from kdbkit.packager.targets import resolve_targets
from kdbkit.runtime.kernel_sources import KernelSearchPath
from kdbkit.runtime.problem import parse_config
from kdbkit.runtime.program_key import ProgramRequest
from tests.prerequisites import require_amdgcn_clang, require_nvrtc
from tests.runtime.chain_fixtures import chain_backend, chain_device, isolated, make_handle  # noqa: F401

PROBLEMS = ["softmax,dir=fwd,algo=accurate,mode=channel,type=fp32,shape=2x4x9x9,xs=324x81x9x1,ys=324x81x9x1,"
            "a=1.0,b=0.0", "3-224-224-7x7-64-112-112-32-3x3-2x2-1x1-0-NCHW-FP16-F"]


@pytest.fixture
def offline():
    """NVRTC and clang-19, which CI installs: sm_80 and gfx942 bundles built with no GPU."""
    require_amdgcn_clang()
    require_nvrtc()
    return resolve_targets(["sm_80_108", "gfx942_304", "sm_90_132"])


def _contents(path):
    with open_bundle(path) as bundle:
        return sorted(bundle.items())


@pytest.mark.slow  # NVRTC and clang compiles for three archs, twice
def test_a_build_writes_one_arch_wide_bundle_per_arch_and_rebuilds_nothing_unchanged(offline, tmp_path):
    jobs, compilers = plan(offline, [parse_config(p) for p in PROBLEMS])
    assert {str(j.bundle) for j in jobs} == {"sm_80", "gfx942", "sm_90"}  # no program depends on the count
    result = build(jobs, compilers, tmp_path, parallel=4)
    assert not result.failures and result.compiled == len(jobs) and result.reused == 0
    for name, path in result.bundles.items():
        with open_bundle(path) as bundle:
            assert str(bundle.metadata.target) == name and bundle.count() == sum(str(j.bundle) == name for j in jobs)
            assert bundle.metadata.compiler == compilers[bundle.metadata.target].identity()
            assert bundle.metadata.source_digests == {  # the manifest: each kernel file it was built from
                j.request.kernel_file: KernelSearchPath().digest(j.request.kernel_file) for j in jobs if str(j.bundle) == name}
    before = {n: p.stat().st_mtime_ns for n, p in result.bundles.items()}
    again = build(jobs, compilers, tmp_path, parallel=4)
    assert (again.compiled, again.reused) == (0, len(jobs))
    assert {n: p.stat().st_mtime_ns for n, p in again.bundles.items()} == before  # nothing rewritten


def test_a_changed_kernel_file_recompiles_only_its_programs(offline, tmp_path):
    kernels = tmp_path / "kernels"
    shutil.copytree(KernelSearchPath().folders[-1], kernels)
    path = KernelSearchPath([kernels])
    problems = [parse_config(p) for p in PROBLEMS]
    jobs, compilers = plan(offline[:1], problems, search_path=path)
    build(jobs, compilers, tmp_path / "out", parallel=2, search_path=path)
    (kernels / "softmax.c").write_text((kernels / "softmax.c").read_text() + "\n/* changed */\n")
    changed, _ = plan(offline[:1], problems, search_path=path)
    result = build(changed, compilers, tmp_path / "out", parallel=2, search_path=path)
    softmax = sum(j.request.kernel_file == "softmax.c" for j in changed)
    assert softmax and result.compiled == softmax and result.reused == len(changed) - softmax
    assert len(_contents(tmp_path / "out" / "sm_80.kdb")) == len(changed)  # the stale keys are gone
    with open_bundle(tmp_path / "out" / "sm_80.kdb") as bundle:
        assert bundle.metadata.source_digests["softmax.c"] == path.digest("softmax.c")  # the manifest follows


def test_each_source_is_read_once_and_compiled_as_keyed(tmp_path):
    """The compile gets the very read the plan keyed: a kernel file broken after planning still
    builds what was planned, stored under the digest of the text compiled; a job without that
    read (made by hand) whose file changed since its key was made is refused, not stored."""
    require_nvrtc()
    kernels = tmp_path / "kernels"
    shutil.copytree(KernelSearchPath().folders[-1], kernels)
    path = KernelSearchPath([kernels])
    planned_digest = path.digest("softmax.c")
    jobs, compilers = plan(resolve_targets(["sm_80"]), [parse_config(PROBLEMS[0])], search_path=path)
    (kernels / "softmax.c").write_text("this is not C\n")  # edited between the plan and the compile
    result = build(jobs, compilers, tmp_path / "out", parallel=1, search_path=path)
    assert not result.failures and result.compiled == len(jobs)
    with open_bundle(tmp_path / "out" / "sm_80.kdb") as bundle:
        assert bundle.metadata.source_digests["softmax.c"] == planned_digest
    unread = [dataclasses.replace(job, source=None) for job in jobs]
    again = build(unread, compilers, tmp_path / "again", parallel=1, search_path=path)
    assert again.compiled == 0 and len(again.failures) == len(jobs)
    assert "softmax.c changed after it was keyed" in again.failures[0].message


@pytest.mark.slow  # every program compiled twice: whole and in three shards
def test_shards_merge_into_the_one_machine_build(offline, tmp_path):
    """The same entries; the same bytes where the compiler is reproducible. clang is (its
    compilation-unit id is a digest of what it compiles); NVRTC 13.5 is not always: one fp16
    program's cubin comes out in either of two forms, 44 bytes apart, from one run to the next."""
    jobs, compilers = plan(offline[:2], [parse_config(p) for p in PROBLEMS])
    whole = build(jobs, compilers, tmp_path / "whole", parallel=4)
    parts = [build(shard(jobs, i, 3), compilers, tmp_path / f"part{i}", parallel=2) for i in range(3)]
    assert sum(len(shard(jobs, i, 3)) for i in range(3)) == len(jobs)
    for name, path in whole.bundles.items():
        pieces = [p.bundles[name] for p in parts if name in p.bundles]
        merge_bundles(tmp_path / f"merged-{name}.kdb", pieces)
        merged, one = _contents(tmp_path / f"merged-{name}.kdb"), _contents(path)
        assert [(n, a) for n, a, _ in merged] == [(n, a) for n, a, _ in one]
        if name.startswith("gfx"):
            assert merged == one
    with pytest.raises(ValueError, match="shard 3/3"):
        shard(jobs, 3, 3)


def test_a_failed_compile_is_reported_with_its_log_and_the_rest_is_written(offline, tmp_path):
    good, broken = ProgramRequest("gemm.c", ["-DKDB_TYPE_FP16"]), ProgramRequest(
        "gemm.c", ["-DKDB_TYPE_FP16", "-DKDB_TYPE_BF16"])  # kdb_data.h refuses both
    jobs, compilers = plan(offline[:1], requests=[good, broken])
    result = build(jobs, compilers, tmp_path, parallel=2)
    assert result.compiled == 1 and len(result.failures) == 1
    failure = result.failures[0]
    assert failure.job.request == broken and "KDB_TYPE" in failure.log
    # The error came back from a worker process: its one line holds the remedy once
    assert str(failure.error).splitlines()[0].count("the compiler's log follows") == 1, str(failure.error)
    assert len(_contents(result.bundles["sm_80"])) == 1


class _LosesAllButOne(concurrent.futures.Executor):
    """A cluster whose workers vanish after one compile: later futures never finish."""

    def __init__(self):
        self.submitted = 0

    def submit(self, fn, *args, **kwargs):
        future = concurrent.futures.Future()
        self.submitted += 1
        if self.submitted == 1:
            future.set_result(fn(*args, **kwargs))
        return future


def test_a_stalled_executor_gives_up_the_compiles_still_out_and_writes_the_rest(offline, tmp_path):
    requests = [ProgramRequest("gemm.c", ["-DKDB_TYPE_FP16"]), ProgramRequest("gemm.c", [])]
    jobs, compilers = plan(offline[:1], requests=requests)
    result = build(jobs, compilers, tmp_path, executor=_LosesAllButOne(), stall_timeout=0.5)
    assert result.compiled == 1 and len(result.failures) == 1
    assert "no compile finished for 0.5 s" in result.failures[0].message
    assert len(_contents(result.bundles["sm_80"])) == 1


def test_a_bundle_built_from_a_logged_run_serves_that_run_with_no_jit(make_handle, isolated, chain_device,  # noqa: F811
                                                                      monkeypatch, capsys, tmp_path):
    """The user's first job: run once with KDB_ENABLE_LOGGING_CMD=1, build what it logged for the
    local device, install the bundle, run again with the JIT switched off."""
    from kdbkit.runtime.logging_setup import configure_logging

    def run(h):
        x = np.random.default_rng(0).standard_normal((2, 4, 9, 8)).astype(np.float32)
        w = np.ones((6, 2, 3, 2), np.float32)
        y = kdbkit.convolution_forward(h, x, w, pad=(1, 0), stride=(2, 1), groups=2)
        return kdbkit.softmax_forward(h, y)

    monkeypatch.setenv("KDB_ENABLE_LOGGING_CMD", "1")
    configure_logging(force=True)
    expected = run(make_handle())
    monkeypatch.delenv("KDB_ENABLE_LOGGING_CMD")
    configure_logging(force=True)
    log = tmp_path / "run.log"
    log.write_text(capsys.readouterr().err)
    catalogue = read_catalogue(log)
    assert len(catalogue.problems) == 2 and not catalogue.errors
    jobs, compilers = plan([chain_device.target], catalogue.problems)
    result = build(jobs, compilers, isolated / "system", parallel=1)
    assert not result.failures and list(result.bundles) == [str(chain_device.target.arch_wide())]
    monkeypatch.setenv("KDB_DISABLE_JIT", "1")  # a program in no bundle would raise JitDisabledError
    monkeypatch.setenv("KDB_DISABLE_CACHE", "1")
    h = make_handle()
    np.testing.assert_allclose(run(h), expected, rtol=1e-6)


def test_all_leaves_out_the_programs_of_solvers_that_cannot_run_on_the_arch():
    require_nvrtc()
    files = {t: {j.request.kernel_file for j in plan(resolve_targets([t]))[0]} for t in ("sm_75", "sm_80", "sm_90")}
    assert not files["sm_75"] & {"conv_igemm_tc.cu", "gemm_tc.cu", "gemm_wgmma.cu"}  # no mma.sync below sm_80
    assert {"conv_igemm_tc.cu", "gemm_tc.cu"} <= files["sm_80"] and "gemm_wgmma.cu" not in files["sm_80"]
    assert {"gemm_wgmma.cu", "gemm_tma.cu", "conv_tma.cu", "conv_wgrad_tma.cu"} <= files["sm_90"]
    assert not files["sm_80"] & {"gemm_tma.cu", "conv_tma.cu", "conv_wgrad_tma.cu"}  # wgmma and TMA: sm_90 alone
