"""Checks an AMD code object passes before a bundle stores it: the ways a clean compile still fails on a GPU.

clang builds a code object that loads and launches wrong in ways no compile error shows, and
no AMD GPU is at hand when bundles are built. Each check below reads the code object
(:func:`read_code_object`) and names what a real device would do with it:

- not code object v5: the version kdbkit builds and tests (``ELFABIVERSION_AMDGPU_HSA_V5``);
- a kernel without its entry symbol or its ``<name>.kd`` descriptor: ``hipModuleGetFunction``
  finds the kernel by them;
- an undefined symbol (a math call lowered to a library call such as ``expf``): no device
  library is linked, so the loader cannot resolve it and the whole module fails to load;
- a wavefront size other than the processor's: the dialect's kernels assume HIP's default;
- more static LDS than a workgroup may have: the launch fails;
- explicit arguments laid out otherwise than hip-python packs them (:func:`packed_offsets`):
  the kernel would read its arguments shifted, silently.
"""

from __future__ import annotations

from kdbkit.kdb.arch import Arch, known_archs, parse_arch
from kdbkit.runtime.backends.amdgpu_code_object import CodeObject, KernelMetadata, packed_offsets, read_code_object
from kdbkit.runtime.backends.elf_notes import TargetStringError, parse_amdgcn_target
from kdbkit.runtime.errors import CompileError, CompilerUnavailableError

# The one version the builder stores. kdb install takes a HIP package made for this kdbkit to hold
# it (a manifest names no version: packager/select.py), so change it only with kdbkit's minor
# version, which a package's kdbkit range ends at.
CODE_OBJECT_VERSION = 5


def check_code_object(data: bytes, target_arch: str, *, what: str = "code object") -> list[str]:
    """Return the problems of an AMD code object built for ``target_arch``; empty when it is fine.

    Args:
        data: the code object.
        target_arch: what it was built for, ``gfx942`` or with features ``gfx90a:xnack-``.
        what: how to name the code object in a :class:`BinaryLoadError`.

    Returns:
        One line per problem, each naming the kernel or symbol concerned.

    Raises:
        BinaryLoadError: ``data`` is not a readable AMD code object.
        CompilerUnavailableError: ``target_arch`` is malformed, or a processor whose wavefront
            size and LDS limit the arch table (:mod:`kdbkit.kdb.arch`) does not hold: not guessed.
    """
    try:
        arch, features = parse_amdgcn_target(target_arch)
    except TargetStringError as e:
        raise CompilerUnavailableError(e.problem, e.remedy) from e
    limits = parse_arch(arch)
    if not limits.known or limits.wave_size is None or limits.lds_bytes is None:
        known = sorted(r.name for r in known_archs("hip") if r.wave_size is not None and r.lds_bytes is not None)
        raise CompilerUnavailableError(
            f"no code-object checks for {arch}: its wavefront size and LDS limit are not known "
            f"(known: {', '.join(known)})",
            "add its row to ARCHS in kdbkit/kdb/arch.py (or register_arch it) from LLVM's AMDGPUUsage")
    co = read_code_object(data, what=what)
    problems = _target_problems(co, arch, features)
    if co.code_object_version != CODE_OBJECT_VERSION:
        problems.append(f"code object v{co.code_object_version}, not v{CODE_OBJECT_VERSION} "
                        f"(build with -mcode-object-version={CODE_OBJECT_VERSION})")
    problems += [f"undefined symbol {name!r}: nothing on the device defines it, so the module fails to load"
                 for name in co.undefined_symbols]
    if not co.kernels:
        problems.append("no kernels in the metadata")
    for kernel in co.kernels.values():
        problems += [f"kernel {kernel.name}: {p}" for p in _kernel_problems(kernel, co, arch, limits)]
    return problems


def _target_problems(co: CodeObject, arch: str, features: tuple[str, ...]) -> list[str]:
    if co.arch != arch:
        return [f"built for {co.arch}, not {arch}"]
    extra = sorted(set(co.features) - set(features))
    if extra:
        return [f"built for {co.target} with features {':'.join(extra)} that {':'.join((arch, *features))} lacks"]
    return []


def _kernel_problems(kernel: KernelMetadata, co: CodeObject, arch: str, limits: Arch) -> list[str]:
    problems = []
    descriptor = f"{kernel.name}.kd"
    if kernel.symbol != descriptor:
        problems.append(f"descriptor symbol is {kernel.symbol!r}, not {descriptor!r}")
    for symbol in dict.fromkeys((kernel.name, kernel.symbol, descriptor)):
        if symbol not in co.defined_symbols:
            problems.append(f"symbol {symbol!r} is not defined")
    if kernel.wavefront_size is None:
        problems.append("no .wavefront_size in its metadata")
    elif kernel.wavefront_size != limits.wave_size:
        problems.append(f"wavefront size {kernel.wavefront_size}, but {arch} runs HIP kernels in wavefronts of "
                        f"{limits.wave_size}")
    lds = kernel.group_segment_fixed_size
    if lds is None:
        problems.append("no .group_segment_fixed_size (static LDS) in its metadata")
    elif lds > limits.lds_bytes:
        problems.append(f"static LDS of {lds} bytes, over the {limits.lds_bytes} a workgroup has on {arch}")
    return problems + _layout_problems(kernel)


def _layout_problems(kernel: KernelMetadata) -> list[str]:
    """The explicit arguments must sit where hip-python's packing puts them, inside the kernarg segment."""
    args = kernel.explicit_args
    if any(a.size < 1 for a in args):
        return ["an explicit argument has size 0; hip-python cannot pack it"]
    expected = packed_offsets([a.size for a in args])
    # Only the first misplaced argument: the ones after it are usually shifted by it.
    problems = [
        f"argument {i} ({a.value_kind}, {a.size} bytes) is at offset {a.offset}, but the HIP launch packs it at "
        f"{at} (hip-python aligns each argument to min(size, 8)); pass it another way, e.g. as separate scalars"
        for i, (a, at) in enumerate(zip(args, expected)) if a.offset != at
    ][:1]  # fmt: skip
    end = max((a.offset + a.size for a in args), default=0)
    if kernel.kernarg_segment_size is None or kernel.kernarg_segment_size < end:
        problems.append(f"kernarg segment of {kernel.kernarg_segment_size} bytes does not hold its explicit "
                        f"arguments ({end} bytes)")
    return problems


def refuse_failing_code_object(binary: bytes, request, target) -> None:
    """Refuse a code object that would fail on the device (a CompileError naming the kernel file,
    the target and why): no GPU is at hand in an offline build to show it.

    Raises:
        CompileError: :func:`check_code_object` found problems.
        BinaryLoadError: ``binary`` is not a readable AMD code object.
    """
    problems = check_code_object(binary, target.full_arch, what=f"code object of {request} for {target.full_arch}")
    if problems:
        raise CompileError(f"{request} for {target.full_arch} builds a code object that would fail on the GPU: "
                           f"{'; '.join(problems)}",
                           "fix the kernel or its options; no bundle was written")
