"""One compile in a new process with a fixed, non-randomised address space: how a reproducible
build runs a compiler whose output depends on the process it runs in
(``Compiler.determinism == "fresh-process"``: NVRTC).

Measured on conv_igemm.c (FP16, sm_80, NVRTC 13.5; docs/reliability.md): 7 compiles in one
process gave 3 different cubins, 30 first compiles of fresh processes gave 4 (26 the same one),
and 45 compiles through this module gave 1. ptxas orders some of its work by memory address,
so the bytes follow where its data lies. The child therefore
turns address randomisation off for itself (``personality(ADDR_NO_RANDOMIZE)``, as ``setarch -R``
does) and executes itself again, in a fixed working folder with a fixed environment (only what
locates Python and the compiler, a fixed hash seed, and one thread for every thread pool a
library it imports would start), so that it allocates the same before the compile in every
build, in any folder, on any number of cores; it then reads the job from stdin, compiles once
and writes the outcome to stdout. Each compile costs a Python start (docs/performance.md).

The thread pools matter: numpy (imported with kdbkit's backends) starts an OpenBLAS thread per
extra core, whose stack and start-up allocations move the compiler's data; the cubin then
depended on the build machine's core count (one core gave one cubin, two another) and, under
load, on when that thread ran (the rebuild test failed in about one CI run in three). The child
checks that it runs alone before it compiles, and says so where it does not.

Where the system refuses the personality (some container seccomp profiles) or is not Linux,
the compile still runs, randomised, and says so: the build then reports that its bundle is not
guaranteed bit-identical.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the child imports nothing of kdbkit's before its address space is fixed
    from kdbkit.kdb.target import Target
    from kdbkit.runtime.compilers import Compiler
    from kdbkit.runtime.kernel_sources import KernelSource
    from kdbkit.runtime.program_key import ProgramRequest

_MODULE = "kdbkit.packager.fresh_compile"
ADDR_NO_RANDOMIZE = 0x0040000  # <linux/personality.h>
_QUERY = 0xFFFFFFFF  # personality(0xffffffff) reads the persona without changing it
# What the child's environment keeps: where Python and the compiler's libraries are. Nothing
# else (TMPDIR, HOME, the locale, the folder) may vary its allocations from build to build, and
# no LD_PRELOAD either: a preloaded library (faketime's, a profiler's) moves every allocation
# after it, and ptxas's output moved with them (the rebuild test under faketime).
_KEPT = ("PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CONDA_PREFIX")
RANDOMISED = ("the address space of the compiler's process could not be fixed (personality refused), "
              "so its output may vary")


# Each pool a library of the child could start, held to the calling thread.
_ONE_THREAD = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def child_environment() -> dict[str, str]:
    """The child's environment: the kept variables of this one, a fixed hash seed and
    single-threaded pools."""
    env = {name: os.environ[name] for name in _KEPT if name in os.environ}
    env["PYTHONHASHSEED"] = "0"
    env.update(dict.fromkeys(_ONE_THREAD, "1"))
    return env


def other_threads() -> str:
    """``""`` where this process runs one thread (Linux: its tasks), else why its compile may vary."""
    try:
        count = len(os.listdir("/proc/self/task"))
    except OSError:
        return ""  # not Linux, or no /proc: nothing to check, the address space note says the rest
    if count == 1:
        return ""
    return (f"the compiler's process ran {count} threads (a library started a pool), so its output may vary "
            "with when they ran")


def compile_fresh(compiler: Compiler, request: ProgramRequest, target: Target,
                  source: KernelSource) -> tuple[bytes, str]:
    """``compiler.compile(request, target, source)`` in a new process.

    Returns:
        The binary, and ``""`` where the child's address space was fixed, else why the bytes
        may vary (:data:`RANDOMISED`).

    Raises:
        CompileError: the compile failed (the compiler's error as it raised it), or its process
            died (its exit status and what it printed).
        CompilerUnavailableError: as ``compiler.compile`` raises it.
    """
    if not sys.executable:
        return compiler.compile(request, target, source), "no Python executable to start (sys.executable is empty)"
    proc = subprocess.run([sys.executable, "-m", _MODULE], input=pickle.dumps((compiler, request, target, source)),
                          capture_output=True, env=child_environment(), cwd="/", check=False)
    try:
        kind, value, note = pickle.loads(proc.stdout) if proc.returncode == 0 else (None, None, "")
    except Exception:  # what came back is not an outcome: reported below with the exit status
        kind, value, note = None, None, ""
    if kind == "ok":
        return value, note
    if kind == "error":
        raise value
    from kdbkit.runtime.errors import CompileError

    raise CompileError(f"{request.kernel_file} for {target}: the process compiling it with {compiler.name} ended with "
                       f"status {proc.returncode} and no outcome", "see its output below",
                       log=proc.stderr.decode("utf-8", "replace")[-20000:])


def _fix_address_space() -> str:
    """Execute this child again without address randomisation, unless it already runs so;
    return ``""`` once it does, else why it cannot."""
    if not sys.platform.startswith("linux"):
        return f"{RANDOMISED} (not Linux)"
    import ctypes

    try:
        personality = ctypes.CDLL(None, use_errno=True).personality
    except (OSError, AttributeError):
        return f"{RANDOMISED} (no personality call)"
    current = personality(_QUERY)
    if current != -1 and current & ADDR_NO_RANDOMIZE:
        return ""
    if current == -1 or personality(current | ADDR_NO_RANDOMIZE) == -1:
        return RANDOMISED
    os.execv(sys.executable, [sys.executable, "-m", _MODULE])  # the persona takes effect at exec
    return RANDOMISED  # not reached


def _main() -> int:
    note = _fix_address_space()
    result = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything the compiler prints goes to stderr, never into the outcome
    compiler, request, target, source = pickle.load(sys.stdin.buffer)
    note = note or other_threads()  # after the unpickling, which imports the compiler's modules
    try:
        outcome = ("ok", compiler.compile(request, target, source), note)
    except Exception as exc:  # every error goes back to the builder, which reports it as the compile's
        outcome = ("error", exc, note)
    result.write(pickle.dumps(outcome))
    result.close()
    return 0


if __name__ == "__main__":
    sys.exit(_main())
