"""One compile in a new, bare process with a fixed, non-randomised address space: how a
reproducible build runs a compiler whose output depends on the process it runs in
(``Compiler.determinism == "fresh-process"``: NVRTC).

ptxas (inside NVRTC) orders some of its work by memory address, so the bytes follow where its
data lies, and so everything the process allocated before the compile. Measured on
conv_igemm.c (FP16, sm_80, NVRTC 13.5; docs/reliability.md): 7 compiles in one process gave 3
different cubins, 30 first compiles of fresh processes gave 4. A fresh kdbkit process with
address randomisation off gave one cubin on one machine, but it still imported kdbkit, numpy
and cuda-bindings first, and what they did moved the compiler's data: numpy's OpenBLAS starts a
thread per extra core (the cubin followed the build machine's core count), and in about one
full CI run in three a compile still differed.

So the compile runs in ``packager/bare_compile.py``: a Python with no site-packages (``-S -s``),
no script folder on its path (``-P``) and no bytecode written (``-B``), which imports only the
standard library, loads the compiler's library itself (NVRTC through ctypes, the wheel's
library by path) and compiles once; it turns address randomisation off for itself
(``personality(ADDR_NO_RANDOMIZE)``, as ``setarch -R`` does) and executes itself again, in a
fixed working folder with a fixed environment, and says so where another thread runs beside
the compile. The compiler builds the job (:meth:`~kdbkit.runtime.compilers.Compiler.bare_job`)
and reads the outcome back. A compile costs a bare Python's start (docs/performance.md).

Where the system refuses the personality (some container seccomp profiles), is not Linux, or
the compiler has no bare job (NVRTC not from its wheel), the compile still runs and says why
its output may vary: the build then reports that its bundle is not guaranteed bit-identical.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kdbkit.kdb.target import Target
    from kdbkit.runtime.compilers import Compiler
    from kdbkit.runtime.kernel_sources import KernelSource
    from kdbkit.runtime.program_key import ProgramRequest

SCRIPT = Path(__file__).with_name("bare_compile.py")
# What the child's environment keeps: where Python and the compiler's libraries are. Nothing
# else (TMPDIR, HOME, the locale, PYTHONPATH, the folder) may vary its allocations from build to
# build, and no LD_PRELOAD either: a preloaded library (faketime's, a profiler's) moves every
# allocation after it, and ptxas's output moved with them (the rebuild test under faketime).
_KEPT = ("PYTHONHOME", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CONDA_PREFIX")
NO_BARE_JOB = "{name} has no compile a bare process can run (its library is not where a wheel puts it), so its output may vary"


def child_environment() -> dict[str, str]:
    """The child's environment: the kept variables of this one and a fixed hash seed."""
    env = {name: os.environ[name] for name in _KEPT if name in os.environ}
    env["PYTHONHASHSEED"] = "0"
    return env


def bare_command() -> list[str]:
    """How the bare process is started (packager/bare_compile.py restarts itself the same way)."""
    return [sys.executable, "-P", "-S", "-s", "-B", str(SCRIPT)]


def compile_fresh(compiler: Compiler, request: ProgramRequest, target: Target,
                  source: KernelSource) -> tuple[bytes, str]:
    """``compiler.compile(request, target, source)`` in a new, bare process.

    Returns:
        The binary, and ``""`` where the process's address space was fixed and the compile ran
        alone in it, else why the bytes may vary.

    Raises:
        CompileError: the compile failed (the compiler's error as it raises it), or its process
            died (its exit status and what it printed).
        CompilerUnavailableError: as ``compiler.compile`` raises it.
    """
    job = compiler.bare_job(request, target, source)
    if job is None or not sys.executable:
        return compiler.compile(request, target, source), NO_BARE_JOB.format(name=compiler.name)
    proc = subprocess.run(bare_command(), input=pickle.dumps(job.payload), capture_output=True,
                          env=child_environment(), cwd="/", check=False)
    try:
        kind, value, version, note = pickle.loads(proc.stdout) if proc.returncode == 0 else (None,) * 4
    except Exception:  # what came back is not an outcome: reported below with the exit status
        kind = None
    if kind is None:
        from kdbkit.runtime.errors import CompileError

        raise CompileError(f"{request.kernel_file} for {target}: the process compiling it with {compiler.name} ended "
                           f"with status {proc.returncode} and no outcome", "see its output below",
                           log=proc.stderr.decode("utf-8", "replace")[-20000:])
    return job.finish(kind, value, version), note
