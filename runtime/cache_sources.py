"""Which tiers a handle's lookup chain has, in order, and making them.

The tiers come from ``Handle(sources=...)``, else from ``KDB_CACHE_SOURCES``, else
:data:`DEFAULT`. Each entry is one of:

- a built-in name: ``system`` (installed bundles), ``remote`` (the cluster cache that
  ``KDB_REMOTE_CACHE`` names; after ``user`` by default where it is set), ``user`` (the per-user cache; left out, or
  read but never written, as :mod:`~kdbkit.runtime.cache_policy` says), ``jit`` (compile, and
  put into every writable tier before it; forbidden, naming the program and the setting, where
  the policy says so);
- ``module:Class``: a :class:`~kdbkit.runtime.tier.Source` subclass importable from Python
  (an installed package, or a module on ``PYTHONPATH``), made with no arguments;
- in ``Handle(sources=...)`` only: a :class:`~kdbkit.runtime.tier.Source` instance.

Every tier is handed the handle's :class:`~kdbkit.runtime.tier.TierContext` (``attach``)
before its first lookup. A tier that compiles (``jit``) must come last, names are unique, and
a tier that says it is writable must be a :class:`~kdbkit.runtime.tier.WritableSource`. A bad
``KDB_CACHE_SOURCES`` is reported once and the default chain is used (a typo in a shell profile
must not stop a job); a bad ``sources`` argument raises :class:`CacheSourcesError`.
"""

from __future__ import annotations

import importlib
import weakref
from typing import Sequence, Union

from kdbkit.kdb import KdbError, Target
from kdbkit.runtime import cache_policy, env, paths
from kdbkit.runtime.cache_policy import CachePolicy
from kdbkit.runtime.jit import JitSource
from kdbkit.runtime.logging_setup import get_logger, warn_once
from kdbkit.runtime.lookup import SystemBundleSource, UserCacheSource
from kdbkit.runtime.system_bundles import SystemBundleSearch
from kdbkit.runtime.tier import Source, SourceCheck, SourceInfo, TierContext, WritableSource

_log = get_logger(__name__)
DEFAULT = ("system", "user", "jit")
WITH_REMOTE = ("system", "user", "remote", "jit")  # the default where KDB_REMOTE_CACHE names a server
# Tier instances attached to a handle's chain: a tier keys with its handle's context, so one
# instance serves one handle (the handle closes it with its chain).
_ATTACHED: "weakref.WeakSet[Source]" = weakref.WeakSet()
SourceEntry = Union[str, Source]
_REMEDY = ("list tiers in order, comma-separated: system, user, jit or module:Class (a Source subclass), "
           "with jit last, e.g. system,user,mypkg.tiers:SharedTier,jit")


class CacheSourcesError(KdbError, ValueError):
    """A list of cache tiers that cannot be made into a chain."""


def parse(text: str) -> list[str]:
    """``KDB_CACHE_SOURCES``'s entries, stripped.

    Raises:
        CacheSourcesError: an empty entry.
    """
    entries = [part.strip() for part in text.split(",")]
    if not all(entries):
        raise CacheSourcesError(f"cache tiers {text!r} hold an empty entry", _REMEDY)
    return entries


def assemble(entries: Sequence[SourceEntry] | None, context: TierContext,
             policy: CachePolicy = cache_policy.READWRITE) -> list[Source]:
    """The chain's tiers below memory, made, checked and attached to ``context``.

    Args:
        entries: the tiers in order (see the module's docstring); None for ``KDB_CACHE_SOURCES``,
            else :data:`DEFAULT`.
        context: what each tier is told about the handle.
        policy: whether ``user`` is read and written and ``jit`` compiles
            (:func:`kdbkit.runtime.cache_policy.current` for the environment's).

    Raises:
        CacheSourcesError: ``entries`` names an unknown tier, one that does not import or is no
            Source, a name twice, or a tier after the one that compiles.
    """
    if entries is not None:
        return _make(list(entries), context, policy)
    raw = env.get_str("KDB_CACHE_SOURCES")
    if raw:
        try:
            return _make(parse(raw), context, policy)
        except CacheSourcesError as exc:
            warn_once(f"cache-sources:{raw}", f"KDB_CACHE_SOURCES={raw!r} is not understood ({exc.problem}); "
                      f"using the default chain ({','.join(DEFAULT)}); {exc.remedy}", logger=_log)
    if env.get_str("KDB_REMOTE_CACHE"):
        try:
            return _make(list(WITH_REMOTE), context, policy)
        except CacheSourcesError as exc:  # a job must not stop at a cluster setting: it runs without
            warn_once(f"remote-cache:{exc.problem}", f"{exc.problem}; going on without the cluster cache; "
                      f"{exc.remedy}", logger=_log)
    return _make(list(DEFAULT), context, policy)


def _make(entries: list[SourceEntry], context: TierContext, policy: CachePolicy) -> list[Source]:
    tiers: list[Source] = []
    tier: Source | None = None
    try:
        for entry in entries:
            tier = _one(entry, context, tiers, policy)
            if tier is not None:
                _check(tier, tiers)
                tier.attach(context)
                _ATTACHED.add(tier)
                tiers.append(tier)
    except BaseException:
        for made in {id(t): t for t in (*tiers, tier) if t is not None}.values():
            if not any(made is e for e in entries):  # made here, not lent by the caller
                made.close()
            _ATTACHED.discard(made)
        raise
    return tiers


def _one(entry: SourceEntry, context: TierContext, before: list[Source], policy: CachePolicy) -> Source | None:
    if isinstance(entry, Source):
        if entry in _ATTACHED:  # its context (keys, target) is another handle's: its entries would be keyed wrong
            raise CacheSourcesError(f"cache tier {getattr(entry, 'name', type(entry).__name__)!r} already serves "
                                    "another handle", "pass a new instance to each handle, or name it as "
                                    "module:Class (a new one is made per handle)")
        return entry
    if not isinstance(entry, str):
        raise CacheSourcesError(f"cache tier {entry!r} is a {type(entry).__name__}, not a name or a Source", _REMEDY)
    if entry == "system":
        search = SystemBundleSearch(context.target, context.binary_format, paths.iter_system_db_dirs(),
                                    context.runtime)
        return SystemBundleSource(search, context.keys)
    if entry == "user":
        if not policy.read_user:
            return None
        return UserCacheSource(context.keys, context.compiler, context.binary_format, writable=policy.write_user)
    if entry == "remote":  # a cache like the user's: the policy governs it alike
        url = env.get_str("KDB_REMOTE_CACHE")
        if not url:
            raise CacheSourcesError("cache tier 'remote' needs KDB_REMOTE_CACHE", "set KDB_REMOTE_CACHE=redis://host:port/0")
        if not policy.read_user:
            return None
        tier = _remote(url)
        tier.writable = policy.write_user and tier.writable  # False where its signing key cannot be used
        return tier
    if entry == "jit":
        return JitSource(context.target, context.keys, context.compiler, list(before), policy.no_compile_because)
    if ":" in entry:
        return _imported(entry)
    raise CacheSourcesError(f"no cache tier {entry!r}", _REMEDY)


def _remote(url: str) -> Source:
    try:
        from kdbkit.runtime import entry_signing
        from kdbkit.runtime.redis_tier import RedisTier

        return RedisTier(url, entry_signing.from_env())  # KDB_REMOTE_SIGNING_KEY, KDB_REMOTE_TRUSTED_KEYS
    except ImportError as exc:
        raise CacheSourcesError(f"cache tier 'remote' needs the redis client ({exc})",
                                "pip install 'kdbkit[cluster]'") from exc
    except ValueError as exc:  # the client's own check of the URL (which it does not repeat in full)
        raise CacheSourcesError("KDB_REMOTE_CACHE is not a Redis URL",
                                "set it to redis://[user:password@]host:port/db") from exc
    except KdbError as exc:  # KDB_REMOTE_PASSWORD_FILE
        raise CacheSourcesError(exc.problem, exc.remedy) from exc


def _imported(spec: str) -> Source:
    """An instance of the Source subclass ``module:Class`` names, made with no arguments."""
    module_name, _, class_name = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except Exception as exc:  # ImportError, AttributeError, or the module's own failure on import
        raise CacheSourcesError(f"cache tier {spec!r} does not import ({type(exc).__name__}: {exc})",
                                "install the package that provides it, or put its folder on PYTHONPATH") from exc
    if not (isinstance(cls, type) and issubclass(cls, Source)):
        raise CacheSourcesError(f"cache tier {spec!r} is not a Source subclass",
                                "name a class derived from kdbkit.runtime.tier.Source")
    try:
        return cls()
    except Exception as exc:
        raise CacheSourcesError(f"cache tier {spec!r} cannot be made ({type(exc).__name__}: {exc})",
                                "check the settings that tier reads") from exc


def _check(tier: Source, before: list[Source]) -> None:
    name = getattr(tier, "name", None)
    if not isinstance(name, str) or not name or name == "memory":
        raise CacheSourcesError(f"cache tier {type(tier).__name__} has no name of its own ({name!r})",
                                "set the class attribute name, which Program.source reports")
    if before and before[-1].compiles:
        raise CacheSourcesError(f"cache tier {tier.name!r} comes after {before[-1].name!r}, which compiles "
                                "and so answers every request", _REMEDY)
    if any(t.name == tier.name for t in before):
        raise CacheSourcesError(f"cache tier {tier.name!r} is listed twice", "list each tier once")
    if tier.writable and not isinstance(tier, WritableSource):
        raise CacheSourcesError(f"cache tier {tier.name!r} says it is writable but is no WritableSource",
                                "derive it from kdbkit.runtime.tier.WritableSource and implement put")


def survey(target: Target, binary_format: str) -> list[tuple[str, SourceInfo | None, list[SourceCheck]]]:
    """The chain a handle on a device of ``target`` would have, for reports made with no device
    open (``kdb doctor``): per tier, its heading, its description and its health facts, the tiers
    closed again. A tier that fails to describe itself gets None and one fact saying why.

    Raises:
        CacheSourcesError: never for ``KDB_CACHE_SOURCES`` (a bad value gives the default chain).
    """
    from kdbkit.runtime.compilers import LazyCompiler
    from kdbkit.runtime.kernel_sources import KernelSearchPath
    from kdbkit.runtime.lookup import Keys

    context = TierContext(target, binary_format, Keys(target, KernelSearchPath(())), LazyCompiler(target))
    tiers = assemble(None, context, cache_policy.current())
    report = []
    try:
        for tier in tiers:
            try:
                report.append((tier.title or tier.name, tier.describe(), tier.checks()))
            except Exception as exc:  # a report shows a failing tier; it does not stop at it
                report.append((tier.title or tier.name, None,
                               [SourceCheck("error", f"{type(exc).__name__}: {exc}", False)]))
    finally:
        for tier in tiers:
            tier.close()
    return report
