"""Build a system bundle for one target from a list of programs (the startup benchmark's, the
tests', a user's own kernels): :func:`kdbkit.packager.build.build` run in this process for one
bundle, all or nothing.

The same builder as ``kdb build``'s, so the same requests, keys and compilers as the runtime:
each source is read once, keyed with :func:`program_key` by that read and compiled from it. An
AMD code object is stored only if it passes
:func:`~kdbkit.packager.code_object_checks.check_code_object`: no GPU is at hand here to show
that it would fail to load or launch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from kdbkit.kdb import Target
from kdbkit.packager.build import build, plan
from kdbkit.runtime.compilers import Compiler, compiler_for
from kdbkit.runtime.kernel_sources import KernelSearchPath
from kdbkit.runtime.program_key import ProgramRequest


def build_bundle(target: Target, programs: Iterable[ProgramRequest | tuple[str, str | Sequence[str]]], folder: Path,
                 *, compiler: Compiler | None = None, bundle_target: Target | None = None,
                 file_name: str | None = None, search_path: KernelSearchPath | None = None) -> Path:
    """Compile ``programs`` for ``target`` into a system bundle.

    Args:
        target: what the binaries are compiled for (its arch; the CU count only names the file).
        programs: requests, or (kernel file, compile options) pairs.
        folder: where to write the bundle (it must exist).
        compiler: the compiler; :func:`compiler_for` ``target`` by default.
        bundle_target: the target to record, if not ``target`` (arch-wide, say).
        file_name: the file name, if not the recorded target's bundle name.
        search_path: where kernel files are found; the default path if None.

    Returns:
        The bundle's path.

    Raises:
        CompilerUnavailableError, CompileError, KernelSourceError: as the compiler and the
        search path raise them; nothing is written then. A code object (``hsaco``) that
        fails its checks is a CompileError naming the kernel file, the target and each
        problem; one that cannot be read is a BinaryLoadError.
    """
    recorded = bundle_target or target
    requests = [item if isinstance(item, ProgramRequest) else ProgramRequest(*item) for item in programs]
    jobs, compilers = plan([target], requests=requests, search_path=search_path,
                           compiler=compiler or compiler_for(target), exact=True)
    name = file_name or recorded.bundle_name()
    result = build(jobs, compilers, Path(folder), parallel=1, file_names={target: name},
                   record_as={target: recorded}, whole=True)
    if result.failures:
        failure = result.failures[0]
        if failure.error is not None:
            raise failure.error
        raise RuntimeError(failure.message)  # this process compiled it: only a bug lands here
    return Path(folder) / name
