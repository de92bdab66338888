"""AMD bundles of real clang-19 code objects of a chosen code object version, for preflight tests.

v5 (clang-19's default, the one version kdbkit's builder stores) comes from the builder itself;
v4 and v6 are compiled with ``-mcode-object-version=N`` and written with ``write_bundle``, as a
bundle from another builder or an older kdbkit would be (the builder refuses them).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from kdbkit.kdb import Target, write_bundle
from kdbkit.runtime.kernel_sources import source_digest
from tests.prerequisites import require_amdgcn_clang

GFX942 = Target.parse("gfx942")  # arch-wide: the bundle a gfx942 device of any CU count reads
PROGRAM = ("activation.c", "-DKDB_DTYPE=float")


@lru_cache(maxsize=None)
def _code_object(version: int) -> bytes:
    from kdbkit.runtime.compilers import AmdgcnClangCompiler
    from tests.runtime.conftest import compile_file

    return compile_file(GFX942, PROGRAM[0], PROGRAM[1], f"-mcode-object-version={version}",
                        compiler=AmdgcnClangCompiler())


def amd_bundle(folder: Path, version: int) -> Path:
    """``folder/gfx942.kdb`` holding ``activation.c`` as code object v``version``; skips without clang."""
    require_amdgcn_clang()
    from kdbkit.runtime.compilers import AmdgcnClangCompiler
    from kdbkit.runtime.compilers.amdgcn_clang import clang_identity

    folder.mkdir(parents=True, exist_ok=True)
    if version == 5:
        from kdbkit.packager.device_build import build_bundle

        return build_bundle(GFX942, [PROGRAM], folder, compiler=AmdgcnClangCompiler())
    return write_bundle(folder / GFX942.bundle_name(), GFX942,
                        [(PROGRAM[0], f"{PROGRAM[1]} -mcode-object-version={version}", _code_object(version))],
                        compiler=clang_identity(), binary_format="hsaco",
                        sources={PROGRAM[0]: source_digest(PROGRAM[0])})
