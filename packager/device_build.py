"""Build a system bundle for one target with kdbkit's compilers: the same requests, keys and compilers as the runtime.

The offline builder (catalogues, every target, parallel) comes with the packaging work; this
is the smallest real builder, used by the startup benchmark and the tests. Each request is
read once (:meth:`KernelSearchPath.read`), keyed with :func:`program_key` for the target and
the compiler's identity, compiled from that same read, and written under that key, so the
runtime finds exactly what was built. An AMD code object is stored only if it passes
:func:`check_code_object`: no GPU is at hand here to show that it would fail to load or launch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from kdbkit.kdb import Target, write_bundle
from kdbkit.packager.code_object_checks import check_code_object
from kdbkit.runtime.compilers import Compiler, compiler_for
from kdbkit.runtime.errors import CompileError
from kdbkit.runtime.kernel_sources import KernelSearchPath
from kdbkit.runtime.program_key import ProgramRequest, program_key


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
        fails :func:`check_code_object` is a CompileError naming the kernel file, the
        target and each problem; one that cannot be read is a BinaryLoadError.
    """
    compiler = compiler or compiler_for(target)
    search_path = search_path or KernelSearchPath()
    identity = compiler.identity()
    entries, sources = [], {}
    for item in programs:
        request = item if isinstance(item, ProgramRequest) else ProgramRequest(*item)
        source = search_path.read(request.kernel_file)
        sources[request.kernel_file] = source.digest
        key = program_key(request, target=target, compiler=identity, source_digest=source.digest)
        binary = compiler.compile(request, target, source)
        if compiler.binary_format == "hsaco":
            refuse_failing_code_object(binary, request, target)
        entries.append((key.kernel_name, key.kernel_args, binary))
    recorded = bundle_target or target
    return write_bundle(Path(folder) / (file_name or recorded.bundle_name()), recorded, entries, compiler=identity,
                        binary_format=compiler.binary_format, sources=sources)


def refuse_failing_code_object(binary: bytes, request: ProgramRequest, target: Target) -> None:
    """Refuse a code object that would fail on the device (a CompileError naming the kernel file,
    the target and why): no GPU is at hand in an offline build to show it."""
    problems = check_code_object(binary, target.full_arch, what=f"code object of {request} for {target.full_arch}")
    if problems:
        raise CompileError(f"{request} for {target.full_arch} builds a code object that would fail on the GPU: "
                           f"{'; '.join(problems)}",
                           "fix the kernel or its options; no bundle was written")
