"""The primitives: one package each, with its problem (config string), solvers and API.

A primitive is found, not listed: every package in this folder, then every package named by
an entry point of group :data:`ENTRY_POINT_GROUP` (``kdbkit.primitives``: ``name = module``),
which is how a package outside kdbkit adds one. A primitive package:

- imports its solvers when imported (registering them in :data:`kdbkit.runtime.solver.REGISTRY`)
  and defines its problem class (a :class:`~kdbkit.runtime.problem.Problem` with a
  ``primitive`` name, which :func:`~kdbkit.runtime.problem.parse_config` then knows);
- names its public API in ``__all__`` (``kdbkit.<name>`` finds it there, :func:`api_names`);
- has a ``problem`` module whose ``catalogue()`` gives one problem per compile-time
  specialisation (what ``kdb build --all`` builds);
- may have a ``driver`` module whose ``SPEC`` is its ``kdb driver`` command (kdbkit's own
  primitives keep theirs in :mod:`kdbkit.runtime.driver`).

Importing a primitive's package registers its solvers; :func:`load_all` imports every one,
for tools that list or build all solvers.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from functools import lru_cache
from pathlib import Path

ENTRY_POINT_GROUP = "kdbkit.primitives"


@lru_cache(maxsize=None)
def primitive_modules() -> tuple[str, ...]:
    """The module of every primitive: kdbkit's own (this folder's packages, by name), then the
    entry points' (by entry-point name). Nothing is imported."""
    from importlib.metadata import entry_points

    own = tuple(f"{__name__}.{info.name}" for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name)
                if info.ispkg)
    found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)
    return own + tuple(dict.fromkeys(ep.value for ep in found if ep.value not in own))


def load_all() -> None:
    """Import every primitive package, so that every solver is registered."""
    for module in primitive_modules():
        importlib.import_module(module)


@lru_cache(maxsize=None)
def api_names() -> dict[str, str]:
    """Each public name of a primitive -> the module that defines it: the names a primitive
    package lists in ``__all__``, read from its source (nothing is imported), first one wins."""
    names: dict[str, str] = {}
    for module in primitive_modules():
        for name in _declared_all(module):
            names.setdefault(name, module)
    return names


def _declared_all(module: str) -> list[str]:
    """The literal ``__all__`` of package ``module``'s ``__init__.py`` (empty without one)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return []
    for node in ast.parse(Path(spec.origin).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return [e.value for e in getattr(node.value, "elts", ()) if isinstance(e, ast.Constant)]
    return []
