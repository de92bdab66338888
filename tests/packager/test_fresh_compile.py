"""A compile in a fresh, bare process (NVRTC's, in a reproducible build) gives the same bytes
whatever cores the build may use, says where its process ran other threads, whose timing could
move the compiler's data (docs/reliability.md), and reports a failed compile as the compiler does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kdbkit.packager.build import _sources_of, plan
from kdbkit.packager.catalogue import read_catalogues
from kdbkit.packager.fresh_compile import SCRIPT, bare_command, child_environment, compile_fresh
from kdbkit.packager.targets import resolve_targets
from kdbkit.runtime.compilers import NvrtcCompiler
from kdbkit.runtime.errors import CompileError
from kdbkit.runtime.program_key import ProgramRequest
from tests.prerequisites import require_nvrtc

# conv_igemm.c in FP16: the program whose cubin followed the core count (one core gave one
# cubin, two another) while the compile process imported numpy, whose OpenBLAS started a thread
# per extra core.
PROBLEM = "3-224-224-7x7-64-112-112-32-3x3-2x2-1x1-0-NCHW-FP16-F\n"


def _igemm_job(tmp_path: Path):
    (tmp_path / "catalogue.txt").write_text(PROBLEM)
    jobs, compilers = plan(resolve_targets(["sm_80"]), read_catalogues([tmp_path / "catalogue.txt"]).problems)
    (job,) = [j for j in jobs if j.request.kernel_file == "conv_igemm.c"]
    return compilers[job.bundle], job, _sources_of([job], None)[job.request.kernel_file]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two cores to compare a compile on one with one on all (Linux)")
def test_a_fresh_compile_gives_the_same_cubin_on_one_core_as_on_all(tmp_path):
    require_nvrtc()
    compiler, job, source = _igemm_job(tmp_path)
    cores = os.sched_getaffinity(0)
    on_all = compile_fresh(compiler, job.request, job.bundle, source)
    os.sched_setaffinity(0, {min(cores)})  # the child inherits it
    try:
        on_one = compile_fresh(compiler, job.request, job.bundle, source)
    finally:
        os.sched_setaffinity(0, cores)
    assert on_all[1] == on_one[1] == "", (on_all[1], on_one[1])
    assert on_one[0] == on_all[0]


CHECK = """
import runpy, sys, threading
script = runpy.run_path(sys.argv[1])  # its functions, not its main
alone = script["_other_threads"]()
stop = threading.Event()
helper = threading.Thread(target=stop.wait)
helper.start()
beside = script["_other_threads"]()
stop.set()
helper.join()
print(repr(alone)); print(repr(beside))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc (Linux)")
def test_a_compile_process_with_another_thread_says_its_output_may_vary():
    run = subprocess.run([*bare_command()[:-1], "-c", CHECK, str(SCRIPT)], env=child_environment(),
                         capture_output=True, text=True, check=True)
    alone, beside = run.stdout.splitlines()
    assert alone == "''"
    assert "ran 2 threads" in beside and "may vary" in beside


def test_a_source_that_does_not_compile_is_the_compilers_error_with_its_log(tmp_path):
    require_nvrtc()
    compiler, job, source = _igemm_job(tmp_path)
    broken = ProgramRequest(job.request.kernel_file, (*job.request.options, "-DKDB_TYPE_BF16=1"))  # both types
    with pytest.raises(CompileError, match="conv_igemm.c failed to compile for sm_80 with nvrtc") as caught:
        compile_fresh(compiler, broken, job.bundle, source)
    assert "--gpu-architecture=sm_80" in caught.value.log and "error" in caught.value.log


def test_a_compiler_without_a_bare_job_compiles_in_this_process_and_says_so(tmp_path):
    class Plain(NvrtcCompiler):
        def bare_job(self, request, target, source):
            return None

    require_nvrtc()
    _, job, source = _igemm_job(tmp_path)
    binary, note = compile_fresh(Plain(), job.request, job.bundle, source)
    assert binary[:4] == b"\x7fELF" and "may vary" in note
