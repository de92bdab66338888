"""A compile in a fresh process (NVRTC's, in a reproducible build) gives the same bytes whatever
cores the build may use, and says where its process ran other threads, whose timing could move
the compiler's data (docs/reliability.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kdbkit.packager.build import _sources_of, plan
from kdbkit.packager.catalogue import read_catalogues
from kdbkit.packager.fresh_compile import compile_fresh
from kdbkit.packager.targets import resolve_targets
from tests.prerequisites import require_nvrtc

# conv_igemm.c in FP16: the program whose cubin followed the core count (one core gave one
# cubin, two another) before the child held numpy's OpenBLAS pool to one thread.
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
import threading
from kdbkit.packager.fresh_compile import other_threads
alone = other_threads()
stop = threading.Event()
helper = threading.Thread(target=stop.wait)
helper.start()
beside = other_threads()
stop.set()
helper.join()
print(repr(alone)); print(repr(beside))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc (Linux)")
def test_a_compile_process_with_another_thread_says_its_output_may_vary():
    from kdbkit.packager.fresh_compile import child_environment

    run = subprocess.run([sys.executable, "-c", CHECK], env={**child_environment(), "PATH": os.environ["PATH"]},
                         capture_output=True, text=True, check=True)
    alone, beside = run.stdout.splitlines()
    assert alone == "''"
    assert "ran 2 threads" in beside and "may vary" in beside
