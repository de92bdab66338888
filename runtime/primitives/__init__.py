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

import importlib
import os
from functools import lru_cache

ENTRY_POINT_GROUP = "kdbkit.primitives"


@lru_cache(maxsize=None)
def own_modules() -> tuple[str, ...]:
    """kdbkit's own primitives: this folder's packages, by name (a listing, nothing imported)."""
    folder = __path__[0]
    return tuple(f"{__name__}.{name}" for name in sorted(os.listdir(folder))
                 if name.isidentifier() and os.path.isfile(os.path.join(folder, name, "__init__.py")))


@lru_cache(maxsize=None)
def added_modules() -> tuple[str, ...]:
    """The primitives other packages add (entry points of :data:`ENTRY_POINT_GROUP`, by name).

    Asked only for what kdbkit's own primitives do not answer: reading the installed
    distributions' metadata costs a process's first call more than the rest of its set-up.
    """
    from importlib.metadata import entry_points

    own = own_modules()
    found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)
    return tuple(dict.fromkeys(ep.value for ep in found if ep.value not in own))


def primitive_modules() -> tuple[str, ...]:
    """The module of every primitive: kdbkit's own, then the added ones. Nothing is imported."""
    return own_modules() + added_modules()


def load_own() -> None:
    """Import kdbkit's own primitive packages (each registers its solvers and problem kind)."""
    for module in own_modules():
        importlib.import_module(module)


def load_all() -> None:
    """Import every primitive package, so that every solver is registered."""
    load_own()
    for module in added_modules():
        importlib.import_module(module)


@lru_cache(maxsize=None)
def _own_api() -> dict[str, str]:
    names: dict[str, str] = {}
    for module in own_modules():
        for name in _declared_all(module):
            names.setdefault(name, module)
    return names


def api_module(name: str) -> str | None:
    """The module that defines the primitive API ``name`` (``kdbkit.<name>``), or None: kdbkit's
    own primitives first, the added ones only for a name none of those has."""
    return _own_api().get(name) or (api_names().get(name) if not name.startswith("_") else None)


@lru_cache(maxsize=None)
def api_names() -> dict[str, str]:
    """Each public name of a primitive -> the module that defines it: the names a primitive
    package lists in ``__all__``, read from its source (nothing is imported), first one wins."""
    names = dict(_own_api())
    for module in added_modules():
        for name in _declared_all(module):
            names.setdefault(name, module)
    return names


def _declared_all(module: str) -> list[str]:
    """The literal ``__all__`` of package ``module``'s ``__init__.py`` (empty without one)."""
    import ast  # here: a first call that needs no added primitive never loads it
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return []
    for node in ast.parse(Path(spec.origin).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return [e.value for e in getattr(node.value, "elts", ()) if isinstance(e, ast.Constant)]
    return []
