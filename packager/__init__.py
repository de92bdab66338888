"""kdbkit's offline side: build bundles, package them, install them (``kdbkit.packager``).

The public API, what ``kdb build``, ``kdb package``, ``kdb install``, ``kdb demo`` and the
tests call (each name is imported the first time it is used: importing this package loads
nothing else):

- :func:`build_bundles` (:mod:`.building`): a catalogue, targets, a shard, a Dask cluster ->
  bundles (with ``publish=``, the same programs in a cluster cache too: :mod:`.publish`),
  through the one builder (:mod:`.build`: :func:`plan`, :func:`shard`, ``build.build``;
  :func:`build_bundle` for one target's list of programs, :mod:`.device_build`).
- :func:`package_bundles` and :func:`install_packages` (:mod:`.distribute`): wheels from
  bundles; the best candidate per device chosen (:func:`scan`, :func:`choose`), verified
  (:func:`verify`) and installed (:func:`install_candidate`).
- :func:`lock_environment`, :func:`check_environment` and :func:`install_locked` (:mod:`.lock`):
  ``kdb lock``, ``kdb doctor --locked`` and ``kdb install --locked``; :func:`read_lock` and
  :func:`write_lock` (:mod:`.lock_file`) read and write ``kdbkit.lock``.
- the errors (:mod:`.errors`): :class:`TargetError`, :class:`PackageError`, :class:`CatalogueError`,
  :class:`PublishError`, :class:`LockError`.

Modules below: targets (names, the GPU table, compilers), catalogue (what to build), build,
cluster (Dask), publish (a cluster cache), code_object_checks, wheel, select, install, lock,
lock_file, tune.
"""

from __future__ import annotations

import importlib

_API = {
    "build_bundles": "building", "BuildReport": "building",
    "plan": "build", "shard": "build", "BuildResult": "build", "Job": "build",
    "compile_workers": "build", "build_bundle": "device_build", "PublishReport": "publish",
    "package_bundles": "distribute", "Packaged": "distribute", "install_packages": "distribute",
    "InstallReport": "distribute", "bundle_files": "distribute",
    "scan": "select", "choose": "select", "Candidate": "select", "Choice": "select",
    "verify": "install", "install_candidate": "install",
    "read_catalogue": "catalogue", "read_catalogues": "catalogue", "resolve_targets": "targets",
    "TargetError": "errors", "PackageError": "errors", "CatalogueError": "errors",
    "PublishError": "errors", "LockError": "errors",
    "lock_environment": "lock", "check_environment": "lock", "install_locked": "lock",
    "read_lock": "lock_file", "write_lock": "lock_file", "Lock": "lock_file", "LockedPackage": "lock_file",
}
_RENAMED = {"install_candidate": "install"}  # the module's name for it, where another name reads better here

__all__ = sorted(_API)


def __getattr__(name: str):
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'kdbkit.packager' has no attribute {name!r}")
    return getattr(importlib.import_module(f"kdbkit.packager.{module}"), _RENAMED.get(name, name))


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
