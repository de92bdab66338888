"""Backends and archs are described in two modules only: kdb/arch.py (spellings and the arch
table) and runtime/backends/spec.py (the backend specs). This test greps kdbkit's sources for
the copies that used to live elsewhere: a tuple of backend names, an arch regex, an arch taken
apart by hand, a capability found by hasattr, a machine-local test by backend name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("kdb", "runtime", "packager")
OWNERS = {Path("kdb/arch.py"), Path("runtime/backends/spec.py")}

_NAME = r"""["'](?:cuda|hip|opencl)["']"""
FORBIDDEN = {
    "a tuple of backend names": re.compile(rf"{_NAME}\s*,\s*{_NAME}"),
    "an arch regex": re.compile(r"sm_\\d|sm_\[|gfx\[|ocl-\["),
    "an arch taken apart by hand": re.compile(r"""startswith\(\s*["'](?:sm_|gfx|ocl-)|arch\[3:\]|rstrip\(["']af"""),
    "a capability found by hasattr": re.compile(
        r"""hasattr\([^)]*backend|getattr\([^)]*backend[^)]*["'](?:stream|resident_groups|wrap)["']"""),
    "a machine-local test by backend name": re.compile(r"""backend\s*==\s*["']opencl["']"""),
}

# Lines of the copies this issue removed: each must be caught, so the test can fail.
OLD_COPIES = {
    "a tuple of backend names": ['BACKEND_CHOICES = ("cuda", "hip", "opencl")', 'if dev.backend in ("cuda", "hip"):',
                                 'for b in ("cuda", "hip") for c in compilers_for(b)]'],
    "an arch regex": ['_ARCH_RE = re.compile(r"sm_\\d+[af]?")',
                      'arch_pattern = re.compile(r"gfx[0-9a-f]+(?::[a-z][a-z0-9]*[+-])*")',
                      '("opencl", re.compile(r"ocl-[0-9a-f]{6,64}")),'],
    "an arch taken apart by hand": ['digits = arch[3:].rstrip("afs") if arch.startswith("sm_") else ""',
                                    'if device.backend != "cuda" or int(target.arch[3:]) < 70:',
                                    'if not (arch.startswith("gfx") and len(arch) > 3'],
    "a capability found by hasattr": ['if not hasattr(self.backend, "stream"):',
                                      'resident = getattr(handle.backend, "resident_groups", None)'],
    "a machine-local test by backend name": ['if target.backend == "opencl":'],
}


def sources() -> list[Path]:
    return sorted(p.relative_to(ROOT) for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("what", FORBIDDEN)
def test_the_grep_catches_the_old_copies(what):
    for line in OLD_COPIES[what]:
        assert FORBIDDEN[what].search(line), line


def test_no_module_but_the_two_describes_backends_or_archs():
    found = []
    for path in sources():
        if path in OWNERS:
            continue
        for number, line in enumerate((ROOT / path).read_text().splitlines(), 1):
            found += [f"{path}:{number}: {what}: {line.strip()}" for what, rx in FORBIDDEN.items() if rx.search(line)]
    assert not found, "\n".join(found)
    assert len(sources()) > 100 and all((ROOT / owner).is_file() for owner in OWNERS)
