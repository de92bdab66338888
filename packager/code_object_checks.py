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

from dataclasses import dataclass

from kdbkit.runtime.backends.amdgpu_code_object import CodeObject, KernelMetadata, packed_offsets, read_code_object
from kdbkit.runtime.backends.elf_notes import TargetStringError, parse_amdgcn_target
from kdbkit.runtime.errors import CompileError, CompilerUnavailableError

CODE_OBJECT_VERSION = 5


@dataclass(frozen=True)
class ProcessorLimits:
    """What a processor runs: its wavefront size as clang builds HIP by default, and LDS per workgroup."""

    wavefront_size: int
    lds_bytes: int


# gfx9 (GCN/CDNA) runs wave64; gfx10+ (RDNA) can run both, and clang builds HIP wave32 there
# (measured with clang-19 for every processor below). LDS per workgroup is 64 KiB on all of
# them (LLVM's AMDGPUUsage processor table, and the limit clang-19 itself enforces: "local
# memory (80000) exceeds limit (65536)"); gfx950's 160 KiB waits for a clang that knows it
# (clang-19 refuses gfx950). A processor not here is refused, not guessed.
_WAVE64 = ("gfx900", "gfx906", "gfx908", "gfx90a", "gfx940", "gfx941", "gfx942")
_WAVE32 = ("gfx1010", "gfx1030", "gfx1100", "gfx1101", "gfx1102", "gfx1150", "gfx1151", "gfx1200", "gfx1201")
PROCESSOR_LIMITS = {
    **{arch: ProcessorLimits(64, 64 * 1024) for arch in _WAVE64},
    **{arch: ProcessorLimits(32, 64 * 1024) for arch in _WAVE32},
}


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
        CompilerUnavailableError: ``target_arch`` is malformed, or a processor whose limits
            :data:`PROCESSOR_LIMITS` does not hold.
    """
    try:
        arch, features = parse_amdgcn_target(target_arch)
    except TargetStringError as e:
        raise CompilerUnavailableError(e.problem, e.remedy) from e
    limits = PROCESSOR_LIMITS.get(arch)
    if limits is None:
        raise CompilerUnavailableError(
            f"no code-object checks for {arch}: its wavefront size and LDS limit are not known "
            f"(known: {', '.join(sorted(PROCESSOR_LIMITS))})",
            "add them to PROCESSOR_LIMITS in kdbkit/packager/code_object_checks.py from LLVM's AMDGPUUsage")
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


def _kernel_problems(kernel: KernelMetadata, co: CodeObject, arch: str, limits: ProcessorLimits) -> list[str]:
    problems = []
    descriptor = f"{kernel.name}.kd"
    if kernel.symbol != descriptor:
        problems.append(f"descriptor symbol is {kernel.symbol!r}, not {descriptor!r}")
    for symbol in dict.fromkeys((kernel.name, kernel.symbol, descriptor)):
        if symbol not in co.defined_symbols:
            problems.append(f"symbol {symbol!r} is not defined")
    if kernel.wavefront_size is None:
        problems.append("no .wavefront_size in its metadata")
    elif kernel.wavefront_size != limits.wavefront_size:
        problems.append(f"wavefront size {kernel.wavefront_size}, but {arch} runs HIP kernels in wavefronts of "
                        f"{limits.wavefront_size}")
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
