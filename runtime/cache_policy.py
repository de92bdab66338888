"""What a process may read, write and compile: ``KDB_CACHE_POLICY`` with the older switches.

- ``readwrite`` (the default): installed bundles, the user cache read and written, the JIT;
- ``readonly``: the user cache is read but never written (a shared or prebuilt cache, a
  container image); what the JIT compiles stays in the process's memory;
- ``off``: no user cache at all (as ``KDB_DISABLE_CACHE``); the JIT's results stay in memory;
- ``installed-only``: fail closed, for deployments: only installed bundles serve programs, and
  a program they lack is an error naming it (no user cache is read, nothing is compiled).

``KDB_DISABLE_CACHE`` and ``KDB_DISABLE_JIT`` keep their meaning and only ever take away: the
policy is the stricter of what they and ``KDB_CACHE_POLICY`` allow.
"""

from __future__ import annotations

from typing import NamedTuple

from kdbkit.runtime import env

DEFAULT_POLICY = "readwrite"  # the words are env.CACHE_POLICIES


class CachePolicy(NamedTuple):
    """What a handle's chain may do; :data:`READWRITE` allows everything."""

    read_user: bool
    write_user: bool
    # the setting that forbids compiling, for the error a miss then raises; "" when compiling is allowed
    no_compile_because: str


def current() -> CachePolicy:
    """The policy the environment asks for now."""
    policy = env.get_str("KDB_CACHE_POLICY") or DEFAULT_POLICY
    no_cache = env.get_bool("KDB_DISABLE_CACHE")
    read_user = policy in ("readwrite", "readonly") and not no_cache
    because = ("KDB_CACHE_POLICY=installed-only" if policy == "installed-only"
               else "KDB_DISABLE_JIT" if env.get_bool("KDB_DISABLE_JIT") else "")
    return CachePolicy(read_user, read_user and policy == "readwrite", because)


READWRITE = CachePolicy(True, True, "")
