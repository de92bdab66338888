"""Build a system bundle for a live device with its own backend.

The offline builder (no GPU, every target) comes with the packaging work; this is the
smallest real builder, used by the startup benchmark and the tests: it compiles programs
with the device's backend and writes them under the same keys the runtime looks up, keyed
with the compiler that made them, into ``<folder>/<arch>_<cu>.kdb``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from kdbkit.kdb import Target, write_bundle
from kdbkit.runtime import kernel_sources
from kdbkit.runtime.backends.base import Backend
from kdbkit.runtime.program_key import normalise_options, program_key


def build_device_bundle(backend: Backend, programs: Iterable[tuple[str, str | Sequence[str]]], folder: Path, *,
                        target: Target | None = None, file_name: str | None = None) -> Path:
    """Compile ``programs`` (kernel file, options) with ``backend`` into a system bundle.

    Args:
        backend: an opened backend; its device's target names the bundle.
        programs: (kernel file in ``kernels/``, compile options) pairs.
        folder: where to write the bundle (it must exist).
        target: the target to record, if not the device's own (arch-wide, say).
        file_name: the file name, if not the target's bundle name.

    Returns:
        The bundle's path.
    """
    device_target = backend.device.target
    target = target or device_target
    compiler = backend.compiler_identity()
    entries = []
    for kernel_file, options in programs:
        opts = normalise_options(options)
        key = program_key(kernel_file=kernel_file, options=opts, arch=device_target.full_arch,
                          source_digest=kernel_sources.source_digest(kernel_file), compiler=compiler)
        binary = backend.compile(kernel_sources.read_source(kernel_file), name=kernel_file, options=list(opts),
                                 include_dirs=[kernel_sources.kernels_dir()])
        entries.append((key.kernel_name, key.kernel_args, binary))
    return write_bundle(Path(folder) / (file_name or target.bundle_name()), target, entries, compiler=compiler,
                        binary_format=backend.binary_format)
