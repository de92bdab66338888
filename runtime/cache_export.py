"""Export the warm user cache as bundles and find-dbs that ``kdb package`` takes (``kdb cache export``).

A job run once with the JIT leaves its programs in the user cache (``<arch>.ukdb``) and, where it
ran find, its rankings in the user find-db (``<arch>_<cu>.ufdb``). :func:`export_cache` turns
them, per target, into the bundle ``<arch>.kdb`` that ``kdb build`` writes for the same programs
(arch-wide, as the cache file is: no kernel takes the CU count as an option) and the system
find-db ``<arch>_<cu>.fdb`` that ``kdb tune`` writes, so ``kdb package`` and ``kdb install``
take them as they are: run once anywhere with the JIT, export, package, install everywhere.

How the keys line up. The user cache stores a program under ``program_key(request, target,
compiler=<the local compiler's identity>, source_digest=<the source as the JIT read it>)``; a
system bundle is looked up with ``program_key(request, target, compiler=<the compiler the bundle
records>, source_digest=<the source as the handle reads it now>)``. Both rows are
``(<file>.o, "<options> -mcpu=<full arch> --kdb-key=<digest>")``. So an entry is copied unchanged
into a bundle that records compiler C exactly when its key, computed again from the file, options
and arch its row names (:func:`~kdbkit.runtime.program_key.parse_key`), the kernel source as it is
now (``KDB_KERNEL_PATH``, then kdbkit's own ``kernels/``: the path ``kdb install`` checks a
package's sources against) and C, is its row: then a device of that arch with JIT off finds it
in the installed bundle as a "system" hit.

The compiler. A cache file records the compiler that created it, but entries of a newer one (a
PoCL or NVRTC upgrade) may sit beside the old ones, each keyed with its own identity; an entry
records none. Each entry's compiler is found by computing its key with every identity known here
(the file's and the installed compilers'); a bundle records one compiler, so it takes the one
with the most entries (on a tie, the compiler installed here) and the others' entries are
skipped as ``other-compiler``. An entry no identity reproduces is ``stale``: its source changed
since the compile (or a compiler not known here made it; the two cannot be told apart, since the
key is a digest).

The cluster tier (Redis) is not read: it is keyed by the program key's digest alone, with no
index of names and options to make a bundle's rows from. Its programs are exported once a hit
has written them through to this user cache, as every node that ran the job has them.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from kdbkit.kdb import Bundle, KdbError, Target
from kdbkit.kdb.errors import CorruptEntryError
from kdbkit.kdb.find_db import SYSTEM_SUFFIX, USER_SUFFIX, read_rankings, write_system_find_db
from kdbkit.kdb.target import USER_SUFFIX as CACHE_SUFFIX
from kdbkit.kdb.target import backend_of_arch, parse_bundle_file_name
from kdbkit.kdb.version import __version__
from kdbkit.kdb.writer import write_bundle
from kdbkit.runtime import paths, private_folder
from kdbkit.runtime.errors import ExportError, KernelSourceError, OptionsError
from kdbkit.runtime.kernel_sources import KernelSearchPath
from kdbkit.runtime.program_key import ParsedKey, key_hasher, normalise_options, parse_key
from kdbkit.runtime.user_cache import folder_writable

PRODUCER = f"kdbkit {__version__} (kdb cache export)"

# Why an entry (or a whole file) is left out; the keys are what --json and the tests name.
REASONS = {
    "stale": "its key does not match its kernel source as it is now (the file or one it includes changed since "
             "the compile, or a compiler not known here made it)",
    "no-source": "its kernel file is not on the kernel search path (KDB_KERNEL_PATH, then kdbkit's own)",
    "other-compiler": "another compiler made it, and a bundle records one compiler",
    "damaged": "it fails its hash check, or the file cannot be read",
    "not-a-key": "its name and options are not a kdbkit program key for the file's arch",
    "gone": "it left the cache (evicted or cleared) during the export",
    "untrusted": "others may write the file or its folder, so it may hold what they planted",
}
REMOTE_NOTE = ("the cluster cache (KDB_REMOTE_CACHE) is keyed by digest alone, with no index of names and options: its "
               "programs are exported only once a hit wrote them through to this user cache (run the job on this node)")


@dataclass(frozen=True)
class Skipped:
    """One entry left out of the export, or a whole file (no kernel name), and why."""

    file: str
    kernel_name: str
    kernel_args: str
    reason: str  # a key of REASONS
    detail: str = ""


@dataclass
class TargetExport:
    """What one target's export wrote.

    Attributes:
        target: the bundle's target: the cache file's backend and arch, arch-wide.
        compilers_checked: the identities each entry's key was computed with.
        by_compiler: entries whose key one compiler reproduced, counted per compiler.
        compiler: the one the bundle records (most entries), or None when none matched.
        bundle: the bundle written, or None when no entry could be exported.
        find_dbs: the system find-dbs written beside it, one per device (CU count) ranked on.
    """

    target: Target
    cache_file: Path
    compilers_checked: list[str]
    by_compiler: dict[str, int] = field(default_factory=dict)
    compiler: str | None = None
    bundle: Path | None = None
    programs: int = 0
    find_dbs: list[Path] = field(default_factory=list)
    rankings: int = 0  # problems ranked, over every find-db written


@dataclass
class ExportReport:
    """Everything one export wrote and skipped."""

    out: Path
    cache_folder: Path
    find_db_folder: Path
    targets: list[TargetExport]
    skipped: list[Skipped]

    @property
    def counts(self) -> dict[str, int]:
        """Skipped entries and files by reason."""
        return dict(sorted(collections.Counter(s.reason for s in self.skipped).items()))

    @property
    def bundles(self) -> list[Path]:
        return [t.bundle for t in self.targets if t.bundle is not None]

    def as_dict(self) -> dict:
        """The report as JSON-ready data (``kdb cache export --json``)."""
        return {
            "out": str(self.out), "cache_folder": str(self.cache_folder), "find_db_folder": str(self.find_db_folder),
            "targets": [{"target": str(t.target), "cache_file": str(t.cache_file), "bundle": t.bundle and str(t.bundle),
                         "compiler": t.compiler, "programs": t.programs, "by_compiler": t.by_compiler,
                         "compilers_checked": t.compilers_checked, "find_dbs": [str(p) for p in t.find_dbs],
                         "rankings": t.rankings} for t in self.targets],
            "skipped_by_reason": self.counts,
            "skipped": [s.__dict__ for s in self.skipped],
            "remote": REMOTE_NOTE,
        }


@dataclass(frozen=True)
class CachedTarget:
    """A user cache file and the user find-dbs of its arch."""

    target: Target  # arch-wide
    cache_file: Path
    find_dbs: tuple[Path, ...]


def compilers_here(target: Target) -> list[str]:
    """The identities of the compilers installed here that build for ``target``, preferred first
    (empty where there is none): the entries of a cache may have been keyed with any of them."""
    from kdbkit.runtime.compilers import compiler_for, compilers_for

    found = []
    try:
        found.append(compiler_for(target).identity())
    except KdbError:  # none installed, or (OpenCL) no local device of that arch
        pass
    for compiler in compilers_for(target.backend):
        if compiler.unsupported(target) is None:
            try:
                found.append(compiler.identity())
            except KdbError:
                pass
    return list(dict.fromkeys(found))


def cached_targets(cache_folder: Path, find_db_folder: Path) -> list[CachedTarget]:
    """Every arch that has a user cache file in ``cache_folder``, with the user find-dbs of that
    arch in ``find_db_folder`` (one per device ranked on), sorted by target."""
    rankings: dict[str, list[Path]] = collections.defaultdict(list)
    for path in sorted(find_db_folder.glob(f"*{USER_SUFFIX}")) if find_db_folder.is_dir() else ():
        try:
            rankings[Target.parse(path.name.removesuffix(USER_SUFFIX)).arch].append(path)
        except KdbError:
            continue  # not named for a device: no find-db of kdbkit's
    found = []
    for path in sorted(cache_folder.glob(f"*{CACHE_SUFFIX}")) if cache_folder.is_dir() else ():
        try:
            name = parse_bundle_file_name(path)
            target = Target(backend_of_arch(name.arch), name.arch)
        except KdbError:
            continue
        found.append(CachedTarget(target, path, tuple(rankings.get(target.arch, ()))))
    return sorted(found, key=lambda c: c.target)


def export_cache(out: Path, targets: Sequence[str] = (), *, force: bool = False, cache_folder: Path | None = None,
                 find_db_folder: Path | None = None,
                 compilers: Callable[[Target], list[str]] = compilers_here) -> ExportReport:
    """Write, for each cached target, its bundle and find-dbs into ``out``.

    Args:
        out: the folder to write into (made if missing).
        targets: which targets (``ocl-3f9a1c2b7d10_2``, ``sm_90``); with a CU count, only that
            device's find-db goes with the bundle. Empty: every cached target.
        force: write into a folder that holds files already, replacing those this export writes.
        cache_folder: the user cache's folder (default: ``KDB_CUSTOM_CACHE_DIR`` or the per-user one).
        find_db_folder: the user find-db's folder (default: ``KDB_USER_DB_PATH`` or the per-user one).
        compilers: the identities of the compilers here for a target (:func:`compilers_here`).

    Returns:
        What was written and what was skipped, with why.

    Raises:
        ExportError: no user cache, an unknown or malformed target, a cache folder or file
            others may write, an output folder that cannot be written or (without ``force``)
            holds files.
        KdbError, OSError: a bundle or find-db could not be written (the folder filled up).
    """
    cache_folder = cache_folder or paths.user_cache_dir()
    find_db_folder = find_db_folder or paths.user_db_dir()
    available = cached_targets(cache_folder, find_db_folder)
    if not available:
        raise ExportError(f"no user cache in {cache_folder}: no {CACHE_SUFFIX} file to export",
                          "run the job once with the JIT on (it fills the cache), or point KDB_CUSTOM_CACHE_DIR at "
                          "the folder it filled")
    chosen = _select(targets, available, cache_folder)
    for path in (cache_folder, *(c.cache_file for c in chosen)):
        why = private_folder.untrusted(path)
        if why:
            raise ExportError(f"not exporting binaries from the user cache: {why}", "fix it as said, then export again")
    _prepare(out, force)
    report = ExportReport(out, cache_folder, find_db_folder, [], [])
    search_path = KernelSearchPath()  # KDB_KERNEL_PATH, then kdbkit's own: what `kdb install` checks against
    for cached in chosen:
        report.targets.append(_export_target(cached, out, search_path, compilers(cached.target), report.skipped))
    return report


def _select(requested: Sequence[str], available: list[CachedTarget], cache_folder: Path) -> list[CachedTarget]:
    """The cached targets ``requested`` names (every one when it names none), each once."""
    if not requested:
        return available
    by_arch = {c.target.arch: c for c in available}
    picked: dict[str, set[Path]] = {}
    for text in requested:
        try:
            wanted = Target.parse(text)
        except KdbError as exc:
            raise ExportError(f"--target {text!r}: {exc.problem}", exc.remedy) from None
        cached = by_arch.get(wanted.arch)
        if cached is None:
            have = ", ".join(str(c.target) for c in available)
            raise ExportError(f"no user cache for target {text} in {cache_folder} (it holds {have})",
                              "name one of those with --target (`kdb cache ls` lists them), or run the job on that "
                              "device with the JIT first")
        fdbs = picked.setdefault(wanted.arch, set())
        fdbs.update(p for p in cached.find_dbs
                    if wanted.cu is None or Target.parse(p.name.removesuffix(USER_SUFFIX)).cu == wanted.cu)
    return [CachedTarget(by_arch[a].target, by_arch[a].cache_file, tuple(sorted(f))) for a, f in sorted(picked.items())]


def _prepare(out: Path, force: bool) -> None:
    """Refuse an output folder that cannot be written or (without ``force``) holds files; make it."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"-o {out} is a file, not a folder", "give a folder (new or empty) for the bundles")
    writable, why = folder_writable(out)
    if not writable:
        raise ExportError(f"cannot write the export to {out}: {why}", "give a folder you may write with -o")
    present = sorted(os.listdir(out)) if out.is_dir() else []
    if present and not force:
        listed = ", ".join(present[:3]) + (", ..." if len(present) > 3 else "")
        raise ExportError(f"{out} already holds {len(present)} file(s) ({listed})",
                          "give a new or empty folder, or --force to replace the files this export writes there")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"cannot make {out}: {exc.strerror or exc}", "give a folder you may write with -o") from None


def _export_target(cached: CachedTarget, out: Path, search_path: KernelSearchPath, here: list[str],
                   skipped: list[Skipped]) -> TargetExport:
    """Export one cache file and its find-dbs; what cannot be exported goes to ``skipped``."""
    file = str(cached.cache_file)
    try:
        cache = _open(cached.cache_file)
    except KdbError as exc:
        skipped.append(Skipped(file, "", "", "damaged", exc.problem))
        return TargetExport(cached.target, cached.cache_file, here)
    with cache:
        md = cache.metadata
        checked = list(dict.fromkeys(c for c in (*here, md.compiler) if c))
        done = TargetExport(cached.target, cached.cache_file, checked)
        if md.target is None or md.target.arch != cached.target.arch:
            skipped.append(Skipped(file, "", "", "not-a-key", f"its metadata names {md.target or 'no target'}"))
            return done
        try:
            by_compiler = _classify(cache, cached.target, search_path, checked, skipped)
            done.by_compiler = {c: len(rows) for c, rows in by_compiler.items()}
            done.compiler = _majority(by_compiler, here)
            for other, rows in by_compiler.items():
                if other != done.compiler:
                    skipped += [Skipped(file, name, args, "other-compiler", f"made by {other}; the bundle records "
                                        f"{done.compiler}") for name, args, _, _ in rows]
            if done.compiler is not None:
                rows = by_compiler[done.compiler]
                done.bundle, done.programs = _write(cache, rows, out / cached.target.bundle_name(), cached.target,
                                                    done.compiler, md.binary_format, skipped)
        except KdbError as exc:  # the file itself is damaged where it was read (an entry's damage is a skip)
            skipped.append(Skipped(file, "", "", "damaged", exc.problem))
            return done
    if done.bundle is not None:  # a find-db ships with its bundle: alone it cannot be packaged
        for path in cached.find_dbs:
            written = _export_find_db(path, out, skipped)
            if written is not None:
                done.find_dbs.append(written[0])
                done.rankings += written[1]
    return done


def _open(path: Path) -> Bundle:
    """The cache file, read-only; ``immutable`` where SQLite cannot make the WAL's ``-shm`` beside it."""
    try:
        return Bundle.open(path)
    except KdbError:
        return Bundle.open(path, immutable=True)


def _classify(cache: Bundle, target: Target, search_path: KernelSearchPath, compilers: list[str],
              skipped: list[Skipped]) -> dict[str, list[tuple[str, str, str, str]]]:
    """Every sound entry whose key one of ``compilers`` reproduces from the current sources, by
    that compiler, as (name, args, kernel file, source digest); every other entry is skipped."""
    file = str(cache.path)
    digests: dict[str, str | KernelSourceError] = {}
    by_compiler: dict[str, list[tuple[str, str, str, str]]] = collections.defaultdict(list)
    for _, name, args, problem in cache.checked_rows():  # each blob checked against its keyed hash
        if problem is not None:
            skipped.append(Skipped(file, name, args, "damaged", problem.problem))
            continue
        parsed = parse_key(name, args)
        if parsed is None or parsed.arch.split(":")[0] != target.arch or not _normal(parsed.options):
            skipped.append(Skipped(file, name, args, "not-a-key"))  # no request of the runtime is keyed so
            continue
        digest = digests.get(parsed.kernel_file)
        if digest is None:
            try:
                digest = search_path.digest(parsed.kernel_file)
            except KernelSourceError as exc:
                digest = exc
            digests[parsed.kernel_file] = digest
        if isinstance(digest, KernelSourceError):
            skipped.append(Skipped(file, name, args, "no-source", digest.problem))
            continue
        made_by = next((c for c in compilers if _row(parsed, digest, c) == (name, args)), None)
        if made_by is None:
            skipped.append(Skipped(file, name, args, "stale", f"{parsed.kernel_file} as it is now, compiled by "
                                   f"{' or '.join(compilers) or 'no compiler known here'}"))
        else:
            by_compiler[made_by].append((name, args, parsed.kernel_file, digest))
    return dict(by_compiler)


def _normal(options: tuple[str, ...]) -> bool:
    """Whether ``options`` are in the normal form every request's options take (a row's are,
    unless an option held a space that its readable key cannot keep)."""
    try:
        return normalise_options(options) == options
    except OptionsError:
        return False


def _row(parsed: ParsedKey, digest: str, compiler: str) -> tuple[str, str]:
    """The row (name, args) of ``parsed`` with ``digest`` and ``compiler``, as a system lookup keys
    it (``Keys.key``: the same :func:`key_hasher` over the device's full arch)."""
    key = key_hasher(parsed.kernel_file, parsed.arch, digest, compiler).key(parsed.options)
    return key.kernel_name, key.kernel_args


def _majority(by_compiler: dict[str, list], here: list[str]) -> str | None:
    """The compiler with the most entries; on a tie, the one installed here, then by name."""
    if not by_compiler:
        return None
    order = {c: i for i, c in enumerate(here)}
    return min(by_compiler, key=lambda c: (-len(by_compiler[c]), order.get(c, len(order)), c))


def _write(cache: Bundle, rows: list[tuple[str, str, str, str]], path: Path, target: Target, compiler: str,
           binary_format: str, skipped: list[Skipped]) -> tuple[Path | None, int]:
    """Write ``rows`` as a bundle at ``path`` (as ``kdb build`` writes one: zstd, a dictionary
    where it pays, the source manifest); (None, 0) when none could be read again."""
    written = 0

    def entries() -> Iterator[tuple[str, str, bytes]]:
        # A generator, so that a cache of gigabytes is never all in memory (write_bundle batches).
        nonlocal written
        for name, args, _, _ in rows:
            try:
                binary = cache.get(name, args)  # checked again: the file may have changed since
            except CorruptEntryError as exc:
                skipped.append(Skipped(str(cache.path), name, args, "damaged", exc.problem))
                continue
            if binary is None:
                skipped.append(Skipped(str(cache.path), name, args, "gone"))
                continue
            written += 1
            yield name, args, binary

    sources = dict(sorted({kernel_file: digest for _, _, kernel_file, digest in rows}.items()))
    write_bundle(path, target, entries(), compiler=compiler, binary_format=binary_format, sources=sources)
    if not written:
        path.unlink(missing_ok=True)
        return None, 0
    return path, written


def _export_find_db(path: Path, out: Path, skipped: list[Skipped]) -> tuple[Path, int] | None:
    """The user find-db ``path`` written to ``out`` as a system one (``<arch>_<cu>.fdb``), and
    how many problems it ranks; None (skipped, with why) when it cannot be used or ranks none."""
    why = private_folder.untrusted(path.parent) or private_folder.untrusted(path)
    if why:  # the runtime ignores such a find-db; a package must not ship what it ignores
        skipped.append(Skipped(str(path), "", "", "untrusted", why))
        return None
    try:
        rankings = read_rankings(path)
    except KdbError as exc:
        skipped.append(Skipped(str(path), "", "", "damaged", exc.problem))
        return None
    if not rankings:
        return None
    stem = path.name.removesuffix(USER_SUFFIX)
    return write_system_find_db(out / f"{stem}{SYSTEM_SUFFIX}", stem, rankings, producer=PRODUCER), len(rankings)
