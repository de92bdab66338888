"""The registry of every KDB_* environment variable, with typed accessors that never crash.

kdbkit is tuned by environment variables with MIOpen's MIOPEN_* semantics and the prefix ``KDB_``
(DESIGN.md, "Environment variables"). Each is declared once in ``VARIABLES`` with its kind,
default and a one-line meaning, which ``kdb env`` prints via ``snapshot()``; this module is the
one parser of every one of them. ``os.environ`` is read on every call, never cached at import.
A value that does not parse never raises: it is reported once, as one ``warning:`` line through
kdbkit's logger (the variable, the value, what is accepted), and the default applies, as a typo
in a shell profile must not stop a training job. An unregistered name (KeyError) or the wrong
accessor for a kind (TypeError) is a bug in the caller and raises.
"""

from __future__ import annotations

import difflib
import enum
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

PREFIX = "KDB_"
# choices: a comma-separated subset of fixed words; target: a target such as gfx90a:xnack-_110;
# size: bytes, with an optional K, M, G or T suffix (powers of 1024).
KINDS = ("bool", "int", "str", "path", "pathlist", "flags", "choices", "target", "size")
SIZE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
TRUE_SPELLINGS = ("1", "on", "yes", "true", "enable", "enabled")
FALSE_SPELLINGS = ("0", "off", "no", "false", "disable", "disabled")


class CheckNumerics(enum.IntFlag):
    """Bits of ``KDB_CHECK_NUMERICS``, the same values as MIOpen's MIOPEN_CHECK_NUMERICS."""

    NONE = 0
    INFO = 0x01  # fully informative: print the result of every check
    WARN = 0x02  # print only abnormal results (inf, NaN, all zeros)
    THROW = 0x04  # raise an error when an abnormal value is found
    ABORT = 0x08  # abort the process when an abnormal value is found
    STATS = 0x10  # compute and print mean, absmean, min and max


@dataclass(frozen=True)
class EnvVar:
    """One environment variable kdbkit reads.

    Attributes:
        name: the full name, starting with ``KDB_``.
        kind: one of ``KINDS``; decides how the value is parsed.
        default: the parsed value used when the variable is unset, empty or invalid.
        meaning: one line for users: what it does and its default.
    """

    name: str
    kind: str
    default: Any
    meaning: str

    def __post_init__(self) -> None:
        if not self.name.startswith(PREFIX) or self.kind not in KINDS:
            raise ValueError(f"EnvVar({self.name!r}, {self.kind!r}): the name must start with "
                             f"{PREFIX} and the kind be one of {', '.join(KINDS)}")


VARIABLES: tuple[EnvVar, ...] = (
    EnvVar("KDB_ENABLE_LOGGING", "bool", False, "Log API calls and program resolutions "
           "(log level 5 unless KDB_LOG_LEVEL is set). Default: off."),
    EnvVar("KDB_ENABLE_LOGGING_CMD", "bool", False, "Log the driver command line that reproduces "
           "each primitive call. Default: off."),
    EnvVar("KDB_LOG_LEVEL", "int", 0, "Log verbosity: 1 quiet, 2 fatal, 3 error, 4 warning, "
           "5 info, 6 detailed info, 7 trace. Default: 0, meaning 4."),
    EnvVar("KDB_ENABLE_LOGGING_MPMT", "bool", False, "Prefix log lines with [process-id "
           "thread-id], for multi-process/multi-threaded programs. Default: off."),
    EnvVar("KDB_ENABLE_LOGGING_ELAPSED_TIME", "bool", False, "Prefix log lines with the "
           "milliseconds since the previous line. Default: off."),
    EnvVar("KDB_DISABLE_CACHE", "bool", False, "Neither read nor write the user kernel cache "
           "(.ukdb): programs not in a bundle are compiled every time. Default: off."),
    EnvVar("KDB_CACHE_POLICY", "str", None, "readwrite, readonly (never write the user cache), off (no user "
           "cache) or installed-only (installed bundles only). Default: unset (readwrite)."),
    EnvVar("KDB_CACHE_MAXSIZE", "size", 4 << 30, "Most bytes the user kernel cache keeps; the least recently "
           "used programs go first (K, M, G suffixes; 0: no limit). Default: 4G."),
    EnvVar("KDB_REMOTE_CACHE", "str", None, "The cluster cache: redis://[user:password@]host:port/db, asked "
           "after the user cache. Default: unset (none)."),
    EnvVar("KDB_REMOTE_PASSWORD_FILE", "path", None, "File holding the cluster cache's password (mode 600), for a "
           "KDB_REMOTE_CACHE URL without one: keeps it out of the environment. Default: unset."),
    EnvVar("KDB_REMOTE_TIMEOUT_MS", "int", 200, "Milliseconds the cluster cache has to answer a read (a quarter "
           "of it to connect) before it is taken to be down. Default: 200."),
    EnvVar("KDB_REMOTE_BACKOFF", "int", 30, "Seconds the cluster cache is left alone after it failed to answer, "
           "before it is tried again. Default: 30."),
    EnvVar("KDB_REMOTE_LEASE_TTL", "int", 10, "Seconds a cluster compile lease lasts unless its holder renews it: "
           "how long a holder that died holds the other machines back. Default: 10."),
    EnvVar("KDB_REMOTE_SIGNING_KEY", "path", None, "Private key (kdb keys new) that signs what this machine publishes "
           "to the cluster cache. Default: unset (unsigned)."),
    EnvVar("KDB_REMOTE_TRUSTED_KEYS", "pathlist", (), f"Public keys, '{os.pathsep}'-separated: cluster-cache entries "
           "none of them signed are refused. Default: unset (any)."),
    EnvVar("KDB_CACHE_SOURCES", "str", None, "Lookup tiers in order, comma-separated: system, user, jit or "
           "module:Class (a Source subclass), jit last. Default: unset (system,user,jit)."),
    EnvVar("KDB_DISABLE_PREFETCH", "bool", False, "Do not load in the background the programs and set up the "
           "problems the last closed handle used. Default: off."),
    EnvVar("KDB_CUSTOM_CACHE_DIR", "path", None, "Folder of the user kernel cache (.ukdb). "
           "Default: unset (the per-user cache folder)."),
    EnvVar("KDB_USER_DB_PATH", "path", None, "Folder of the user find-db (solver rankings "
           "written by find). Default: unset (the per-user folder)."),
    EnvVar("KDB_SYSTEM_DB_PATH", "pathlist", (), f"Folders (or .kdb files) searched in order for system "
           f"bundles, '{os.pathsep}'-separated. Default: unset (the installed packages' folders)."),
    EnvVar("KDB_TRUSTED_KEYS", "pathlist", (), f"Public keys, '{os.pathsep}'-separated: only system bundles of "
           "installed kernel packages one of them signed (kdb package --sign) are used. Default: unset (any)."),
    EnvVar("KDB_KERNEL_PATH", "pathlist", (), f"Folders of kernel sources searched before kdbkit's own, "
           f"'{os.pathsep}'-separated (a library's kernels). Default: unset."),
    EnvVar("KDB_DISABLE_JIT", "bool", False, "Never compile at run time: a program in no bundle "
           "or cache is an error naming it. Default: off (JIT allowed)."),
    # Solvers are switched off one by one, each with its own KDB_DEBUG_<NAME> (runtime/solver.py;
    # `kdb env` lists them after these). No family switches as MIOpen's MIOPEN_DEBUG_CONV_DIRECT:
    # those once listed here were read nowhere, and two had the names of ConvDirect's and
    # ConvImplicitGemm's own switches.
    EnvVar("KDB_CONV_ALLOW_TF32", "bool", False, "Let fp32 convolutions run in TF32 on the tensor cores "
           "(10-bit mantissa, about 1e-3 relative error). Default: off."),
    EnvVar("KDB_DEBUG_FIND_ONLY_SOLVER", "str", None, "Let find try only this solver (numeric "
           "id or name). Default: unset (every applicable solver)."),
    EnvVar("KDB_CHECK_NUMERICS", "flags", CheckNumerics.NONE, "Check buffers for inf/NaN/zero: "
           "0x01 print all, 0x02 warn, 0x04 raise, 0x08 abort, 0x10 stats. Default: 0 (off)."),
    EnvVar("KDB_COMPILE_PARALLEL_LEVEL", "int", 20, "Most kernels compiled at once (Handle.programs, "
           "find, the offline builder). Default: 20."),
    EnvVar("KDB_COMPILE_LOCK_WAIT", "int", 30, "Seconds to wait for another process or thread compiling the "
           "same program before compiling it here too. Default: 30."),
    # Device overrides for offline work, as MIOPEN_DEVICE_ARCH / MIOPEN_DEVICE_CU.
    EnvVar("KDB_DEVICE_ARCH", "target", None, "Act as if devices of this arch's backend had it "
           "(gfx942, sm_90, gfx90a:xnack-_110). Default: unset (detected)."),
    EnvVar("KDB_DEVICE_CU", "int", None, "Act as if the device had this many compute units, for "
           "offline work. Default: unset (detected)."),
    EnvVar("KDB_DEVICE_RUNTIME", "str", None, "Act as if the devices' driver ran this version ('CUDA 12.4', "
           "'HIP 6.1'), to check packages for another machine. Default: unset (detected)."),
    EnvVar("KDB_BACKEND", "choices", (), "Look for devices of these backends only: cuda, hip, "
           "opencl, comma-separated. Default: unset (all backends)."),
    EnvVar("KDB_CLI_TRACEBACK", "bool", False, "Let `kdb` show Python tracebacks instead of one-line "
           "errors, for bug reports. Default: off."),
)

_BY_NAME = {var.name: var for var in VARIABLES}
# Constraints the kind alone does not express; a value outside them falls back like a typo.
_INT_RANGES: dict[str, tuple[int, int | None]] = {
    "KDB_LOG_LEVEL": (0, 7), "KDB_COMPILE_PARALLEL_LEVEL": (1, None), "KDB_COMPILE_LOCK_WAIT": (0, None), "KDB_DEVICE_CU": (1, None),
    "KDB_REMOTE_TIMEOUT_MS": (1, 60_000), "KDB_REMOTE_BACKOFF": (1, 3600), "KDB_REMOTE_LEASE_TTL": (1, 3600),
    "KDB_CHECK_NUMERICS": (0, 0x1F)}  # 0x1F: every CheckNumerics bit
CACHE_POLICIES = ("readwrite", "readonly", "off", "installed-only")  # runtime/cache_policy.py says what each means
_CHOICES: dict[str, tuple[str, ...]] = {"KDB_CACHE_POLICY": CACHE_POLICIES}  # KDB_BACKEND's: see _choices


def _choices(name: str) -> tuple[str, ...]:
    """The words a ``choices`` variable takes, in their order. The backend names come from
    kdbkit.kdb.arch, imported when first parsed: this module loads nothing of kdbkit at import."""
    if name == "KDB_BACKEND":
        from kdbkit.kdb.arch import BACKENDS

        return BACKENDS
    return _CHOICES[name]


_warned: set[tuple[str, str]] = set()  # (name, raw value): a loop over a bad value warns once
_warned_lock = threading.Lock()


_collecting = threading.local()  # snapshot() gathers problems here instead of reporting them


def _fallback(var: EnvVar, raw: str, accepted: str) -> Any:
    shown = "unset" if var.default in (None, ()) else str(var.default)
    _report(var, raw, f"{var.name}={raw!r} is not understood (accepted: {accepted}); using the default ({shown})")
    return var.default


def _report(var: EnvVar, raw: str, message: str) -> None:
    """Say ``message`` once per (variable, value), or collect it (see :func:`read_quietly`)."""
    problems = getattr(_collecting, "problems", None)
    if problems is not None:
        problems.append(message)
        return
    with _warned_lock:
        first = (var.name, raw) not in _warned
        _warned.add((var.name, raw))
    if first:
        # Imported here: logging_setup reads this module's variables to configure itself.
        from kdbkit.runtime.logging_setup import report_bad_setting

        report_bad_setting(message)


# Linux's limits on a path and on one of its names (PATH_MAX, NAME_MAX, in bytes): a longer
# entry can never be opened (ENAMETOOLONG), so it is dropped when read, not at every use.
MAX_PATH_BYTES = 4095
MAX_NAME_BYTES = 255


def _parse_pathlist(var: EnvVar, text: str) -> list[Path]:
    """The list's paths, in order; an entry that no file system could hold is dropped with one warning."""
    paths = []
    for part in (p.strip() for p in text.split(os.pathsep)):
        if not part:
            continue
        path = _expanded(part)
        names = os.fsencode(str(path)).split(b"/")
        if len(os.fsencode(str(path))) > MAX_PATH_BYTES or any(len(n) > MAX_NAME_BYTES for n in names):
            _report(var, part, f"{var.name}: the entry {part[:60]!r}... ({len(part)} characters) is longer than "
                               f"any path can be ({MAX_PATH_BYTES} bytes, {MAX_NAME_BYTES} per name); skipping it")
            continue
        paths.append(path)
    return paths


def _expanded(text: str) -> Path:
    """``text`` with ``~`` expanded, or as written when the home folder it names is unknown."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        return Path(text)


def _parse_int(var: EnvVar, text: str) -> Any:
    lo, hi = _INT_RANGES.get(var.name, (None, None))
    accepted = "an integer" if var.kind == "int" else "bit flags (decimal or 0x hex)"
    accepted += "" if lo is None else f" from {lo} to {hi}" if hi is not None else f" from {lo} up"
    try:
        # Flags are naturally written in hex; plain ints stay base 10 so "08" is eight.
        number = int(text, 0 if var.kind == "flags" and text.lower().startswith("0x") else 10)
    except ValueError:
        return _fallback(var, text, accepted)
    if (lo is not None and number < lo) or (hi is not None and number > hi):
        return _fallback(var, text, accepted)
    return CheckNumerics(number) if var.name == "KDB_CHECK_NUMERICS" else number


SIZE_SPELLING = "a size in bytes, with an optional K, M, G or T suffix (e.g. 4G; 0: no limit)"


def size_in_bytes(text: str) -> int:
    """``4G``, ``4GB``, ``4GiB`` (all 4 << 30), ``512M``, ``1.5G``, ``100000``: the bytes it says.

    Raises:
        ValueError: not such a size.
    """
    number, suffix = text.strip().upper().rstrip("IB").rstrip(), ""
    if number[-1:] in SIZE_SUFFIXES:
        number, suffix = number[:-1].strip(), number[-1]
    try:
        value = float(number) if len(number) <= 20 else -1.0  # a runaway digit string is no size
    except ValueError:
        value = -1.0
    if not 0 <= value < float(1 << 62) / SIZE_SUFFIXES[suffix]:
        raise ValueError(f"{text!r} is not {SIZE_SPELLING}")
    return int(value * SIZE_SUFFIXES[suffix])


def _parse_size(var: EnvVar, text: str) -> Any:
    try:
        return size_in_bytes(text)
    except ValueError:
        return _fallback(var, text, SIZE_SPELLING)


def _parse(var: EnvVar, raw: str | None) -> Any:
    text = (raw or "").strip()
    if not text:  # `export KDB_X=` is how people clear a variable: treat it as unset
        return list(var.default) if var.kind == "pathlist" else var.default
    if var.kind == "bool":
        if text.lower() in TRUE_SPELLINGS + FALSE_SPELLINGS:
            return text.lower() in TRUE_SPELLINGS
        return _fallback(var, text, "/".join(TRUE_SPELLINGS) + " or " + "/".join(FALSE_SPELLINGS))
    if var.kind in ("int", "flags"):
        return _parse_int(var, text)
    if var.kind == "path":
        return _expanded(text)
    if var.kind == "pathlist":
        return _parse_pathlist(var, text)
    if var.kind == "choices":
        choices = _choices(var.name)
        words = [w.strip().lower() for w in text.split(",") if w.strip()]
        if not words or any(w not in choices for w in words):
            return _fallback(var, text, f"{', '.join(choices)}, comma-separated")
        return tuple(c for c in choices if c in words)
    if var.kind == "size":
        return _parse_size(var, text)
    if var.kind == "target":
        from kdbkit.kdb.errors import BundleNameError
        from kdbkit.kdb.target import Target

        try:
            return Target.parse(text)
        except BundleNameError as exc:
            return _fallback(var, text, f"a target such as gfx90a, sm_90, gfx90a:xnack- or gfx942_304 ({exc.problem})")
    choices = _CHOICES.get(var.name)
    if choices is not None:
        return text.lower() if text.lower() in choices else _fallback(var, text, ", ".join(choices))
    return text


def _suggest(name: str) -> str | None:
    # 0.75 accepts a dropped, doubled or swapped letter but not an unrelated KDB_ name.
    matches = difflib.get_close_matches(name.upper(), list(_BY_NAME), n=1, cutoff=0.75)
    return matches[0] if matches else None


def lookup(name: str | EnvVar) -> EnvVar:
    """The registry entry for ``name``; an ``EnvVar`` (e.g. a per-solver switch) passes through.

    Args:
        name: a registered name, or an ``EnvVar`` declared elsewhere.
    Returns:
        The ``EnvVar``; a KeyError for an unknown name suggests the closest registered one.
    """
    if isinstance(name, EnvVar):
        return name
    try:
        return _BY_NAME[name]
    except KeyError:
        hint = _suggest(name)
        raise KeyError(f"{name} is not a kdbkit environment variable"
                       + (f"; did you mean {hint}?" if hint else "")) from None


def _read(name: str | EnvVar, *kinds: str) -> Any:
    var = lookup(name)
    if var.kind not in kinds:
        accessor = "get_int" if var.kind == "flags" else f"get_{var.kind}"
        raise TypeError(f"{var.name} has kind {var.kind}: read it with {accessor}()")
    if not any_set(var):  # unset or blank, the usual case on hot paths: the default, the name not encoded
        return list(var.default) if var.kind == "pathlist" else var.default
    return _parse(var, os.environ.get(var.name))


def any_set(*names: str | EnvVar) -> bool:
    """Whether any of these variables holds a non-blank value, not parsed: a cheap first test
    on a hot path, before reading the variables with their accessors.

    Args:
        names: registered names or ``EnvVar`` entries.
    Returns:
        True when one of them is set to something other than blanks.
    """
    raw = _RAW_ENVIRON
    for name in names:
        if raw is None:  # no raw table on this platform: the mapping, which encodes each name
            value = os.environ.get(lookup(name).name)
        else:
            value = raw.get(_raw_keys.get(name) or _raw_key(name))
        if value and not value.isspace():
            return True
    return False


def raw_values(*names: str | EnvVar) -> tuple:
    """These variables' values as the environment holds them, unparsed (None where unset): a
    cheap test of whether they changed since last looked at, on a path that runs per file."""
    raw = _RAW_ENVIRON
    if raw is None:
        return tuple(os.environ.get(lookup(name).name) for name in names)
    return tuple(raw.get(_raw_keys.get(name) or _raw_key(name)) for name in names)


def _raw_key(name: str | EnvVar) -> bytes:
    """``name`` encoded as os.environ's own table keys it, remembered (the hit is inlined by callers)."""
    key = _raw_keys[name] = os.environ.encodekey(lookup(name).name)
    return key


# os.environ's own table (encoded keys to encoded values; putenv and monkeypatching update it):
# looking a name up there skips os.environ.get's encoding of the name each time, a cost that
# every repeat call of a primitive would pay for each variable it reads.
_RAW_ENVIRON = getattr(os.environ, "_data", None) if hasattr(os.environ, "encodekey") else None
_raw_keys: dict = {}


def get_bool(name: str | EnvVar) -> bool:
    """A ``bool`` variable: one of ``TRUE_SPELLINGS``/``FALSE_SPELLINGS``, any case.

    Args:
        name: a registered name or an ``EnvVar`` of kind ``bool``.
    Returns:
        The value; the default when unset, empty or unrecognised (which warns once).
    """
    return _read(name, "bool")


def get_int(name: str | EnvVar) -> int | None:
    """An ``int`` (base 10) or ``flags`` (decimal or 0x hex) variable, range-checked.

    Args:
        name: a registered name or an ``EnvVar`` of kind ``int`` or ``flags``.
    Returns:
        The value (``CheckNumerics`` for KDB_CHECK_NUMERICS); the default, possibly None,
        when unset or invalid (which warns once).
    """
    return _read(name, "int", "flags")


def get_str(name: str | EnvVar) -> str | None:
    """A ``str`` variable, stripped; one with fixed choices (KDB_BACKEND) is lower-cased.

    Args:
        name: a registered name or an ``EnvVar`` of kind ``str``.
    Returns:
        The value; the default when unset or not one of its choices (which warns once).
    """
    return _read(name, "str")


def get_size(name: str | EnvVar) -> int:
    """A ``size`` variable in bytes (0 where it means no limit).

    Args:
        name: a registered name or an ``EnvVar`` of kind ``size``.
    Returns:
        The size; the default when unset or not a size (which warns once).
    """
    return _read(name, "size")


def get_path(name: str | EnvVar) -> Path | None:
    """A ``path`` variable, ``~`` expanded; the path need not exist.

    Args:
        name: a registered name or an ``EnvVar`` of kind ``path``.
    Returns:
        The path; None when unset or empty.
    """
    return _read(name, "path")


def get_choices(name: str | EnvVar) -> tuple[str, ...]:
    """A ``choices`` variable: a comma-separated subset of its words, in their declared order.

    Args:
        name: a registered name or an ``EnvVar`` of kind ``choices``.
    Returns:
        The words chosen; the default (empty: no restriction) when unset or invalid (which warns once).
    """
    return _read(name, "choices")


def get_target(name: str | EnvVar):
    """A ``target`` variable, parsed as :meth:`kdbkit.kdb.target.Target.parse` does.

    Args:
        name: a registered name or an ``EnvVar`` of kind ``target``.
    Returns:
        The ``Target``; None when unset or malformed (which warns once, with the parser's reason).
    """
    return _read(name, "target")


def get_pathlist(name: str | EnvVar) -> list[Path]:
    """A ``pathlist`` variable: paths separated by ``os.pathsep``, in order, empties dropped.

    Args:
        name: a registered name or an ``EnvVar`` of kind ``pathlist``.
    Returns:
        The paths; an empty list when unset.
    """
    return _read(name, "pathlist")


def value(name: str | EnvVar) -> Any:
    """Any variable, parsed as its kind's accessor would.

    Args:
        name: a registered name or an ``EnvVar``.
    Returns:
        The parsed value, or the default.
    """
    return _read(name, *KINDS)


def read_quietly(read):
    """Call ``read()`` with bad values collected instead of reported: ``(problems, its result)``.

    Nothing is remembered as reported, so a later ordinary read still reports each problem once.
    """
    _collecting.problems = []
    try:
        value = read()
        return _collecting.problems, value
    finally:
        _collecting.problems = None


def snapshot(extra: Iterable[EnvVar] = ()) -> list[tuple[EnvVar, str | None, Any, str | None]]:
    """Every variable with its text, parsed value and problem, for ``kdb env`` (which shows
    the problems itself: nothing is logged here).

    Args:
        extra: variables declared elsewhere (per-solver switches) to list after the registry.
    Returns:
        ``(var, raw, parsed, problem)`` per variable in registry order; ``raw`` is None when
        unset; ``problem`` is the one-line complaint about a value that does not parse, or None.
    """
    rows = []
    for var in (*VARIABLES, *extra):
        raw = os.environ.get(var.name)
        problems, parsed = read_quietly(lambda: _parse(var, raw))
        rows.append((var, raw, parsed, problems[0] if problems else None))
    return rows


def unknown_kdb_variables(known: Iterable[str] = ()) -> list[str]:
    """KDB_* variables set in the environment that kdbkit does not read: likely typos.

    Args:
        known: more names to accept, e.g. the solver catalogue's per-solver switches.
    Returns:
        One entry per unknown name, sorted: the name, plus ``(did you mean KDB_X?)`` when a
        registered name is close, e.g. ``KDB_DISABLE_JITT (did you mean KDB_DISABLE_JIT?)``.
    """
    accepted = set(_BY_NAME).union(known)
    entries = []
    for name in sorted(n for n in os.environ if n.startswith(PREFIX) and n not in accepted):
        hint = _suggest(name)
        entries.append(f"{name} (did you mean {hint}?)" if hint else name)
    return entries
