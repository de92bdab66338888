"""Imports point one way: ``kdb`` <- the runtime's core <- {driver, models, cli}; the packager
uses ``kdb`` and the runtime's core, never the CLI; only the CLI imports the packager from the
runtime. Every import statement of every module is read (``ast``: function-level imports too,
since a deferred import is still a dependency), so a new module is checked with no entry here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "runtime"
# Above the runtime's core: the driver (kdb driver), the model zoo, the CLI, and the CLI's demo
# runs (runtime/demo.py, run by `kdb demo` in a child process).
ABOVE_CORE = (RUNTIME / "driver", RUNTIME / "models", RUNTIME / "cli", RUNTIME / "demo.py")
NOT_FOR_CORE = ("kdbkit.runtime.driver", "kdbkit.runtime.models", "kdbkit.runtime.cli", "kdbkit.runtime.demo")


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; ``from kdbkit.runtime import cli`` counts
    as ``kdbkit.runtime.cli``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def modules(folder: Path):
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _violations(paths, forbidden) -> list[str]:
    return [f"{path.relative_to(ROOT)} imports {name}" for path in paths for name in sorted(imports(path))
            if _within(name, forbidden)]


def core_modules() -> list[Path]:
    return [p for p in modules(RUNTIME) if not any(p == a or a in p.parents for a in ABOVE_CORE)]


def test_kdb_imports_nothing_of_the_runtime_or_the_packager():
    assert _violations(modules(ROOT / "kdb"), ("kdbkit.runtime", "kdbkit.packager", "runtime", "packager")) == []


def test_the_packager_never_imports_the_cli():
    assert _violations(modules(ROOT / "packager"), ("kdbkit.runtime.cli",)) == []


def test_the_runtime_core_imports_neither_the_driver_nor_the_models_nor_the_cli():
    assert _violations(core_modules(), NOT_FOR_CORE) == []


def test_only_the_cli_imports_the_packager_from_the_runtime():
    outside_cli = [p for p in modules(RUNTIME) if RUNTIME / "cli" not in p.parents]
    assert _violations(outside_cli, ("kdbkit.packager",)) == []


def test_nothing_imports_the_old_top_level_names():
    paths = [p for folder in ("kdb", "runtime", "packager", "tests", "scripts") for p in modules(ROOT / folder)]
    assert [f"{p.relative_to(ROOT)} imports {n}" for p in paths for n in sorted(imports(p))
            if n.split(".")[0] in ("kdb", "runtime", "packager")] == []


@pytest.mark.parametrize("source, expected", [
    ("from kdbkit.runtime import cli", True),
    ("def f():\n    from kdbkit.runtime.driver.registry import command_line", True),
    ("import kdbkit.runtime.models", True),
    ("from kdbkit.runtime.handle import Handle", False),
])
def test_the_check_sees_every_spelling_of_an_import(tmp_path, source, expected):
    path = tmp_path / "m.py"
    path.write_text(source + "\n")
    assert bool([n for n in imports(path) if _within(n, NOT_FOR_CORE)]) == expected
