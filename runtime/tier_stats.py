"""How each tier of the lookup chain has served: hits, misses, puts, refusals, errors and latency.

Every resolution below memory notes its steps here (the chain), and every write into a tier
(the JIT, a write-through) notes a put or an error. The counts are the process's, over all its
handles; a handle's ``close`` (and the process's exit) appends what was noted since the last save
to ``tier-stats.jsonl`` in the user cache folder, so ``kdb cache stats`` shows the tiers of every
process of this user that ran with a writable cache. Latencies are kept as a histogram of
quarter-octave buckets (a bucket's upper bound is within 19% of any time in it), so files from
many processes merge exactly and percentiles stay cheap.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Iterable

from kdbkit.runtime.program import Step

FILE_NAME = "tier-stats.jsonl"
COUNTS = ("hits", "misses", "puts", "refusals", "errors", "compiles")
# What a step's outcome counts as (anything else, e.g. "loaded", is not a tier's answer).
_KIND = {"hit": "hits", "miss": "misses", "refused": "refusals", "corrupt": "refusals", "damaged": "errors",
         "failed": "errors", "unavailable": "errors", "compiled": "compiles", "built by another process": "hits"}
_MAX_BUCKET = 200  # 2**(200/4) µs: far past any real latency; a bigger index is clamped


def bucket(ms: float) -> int:
    """The histogram bucket of a latency: the smallest ``b`` with ``ms * 1000 <= 2 ** (b / 4)``."""
    us = ms * 1000.0
    return 0 if us <= 1.0 else min(_MAX_BUCKET, math.ceil(4 * math.log2(us)))


def bucket_ms(b: int) -> float:
    """A bucket's upper bound in milliseconds."""
    return 2 ** (b / 4) / 1000.0


def percentile(histogram: dict[int, int], q: float) -> float | None:
    """The ``q`` quantile (0 to 1) of ``histogram``'s latencies, as its bucket's upper bound; None when empty."""
    total = sum(histogram.values())
    if total == 0:
        return None
    rank, seen = q * total, 0
    for b in sorted(histogram):
        seen += histogram[b]
        if seen >= rank:
            return bucket_ms(b)
    return bucket_ms(max(histogram))


class TierStats:
    """One tier's counts and latency histogram."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.latency: Counter[int] = Counter()

    def add(self, other: "TierStats") -> None:
        self.counts.update(other.counts)
        self.latency.update(other.latency)

    def as_dict(self) -> dict:
        data = {k: self.counts.get(k, 0) for k in COUNTS}
        for name, q in (("p50_ms", 0.5), ("p90_ms", 0.9), ("p99_ms", 0.99)):
            data[name] = percentile(self.latency, q)
        return data

    @classmethod
    def from_json(cls, data: dict) -> "TierStats":
        """A tier's record from the file; a malformed one raises ValueError (the file is then started anew)."""
        stats = cls()
        for k in COUNTS:
            value = data.get("counts", {}).get(k, 0)
            if not (isinstance(value, int) and 0 <= value < 2 ** 62):
                raise ValueError(f"count {k!r} is {value!r}")
            stats.counts[k] = value
        for b, n in data.get("latency", {}).items():
            if not (str(b).isdigit() and int(b) <= _MAX_BUCKET and isinstance(n, int) and 0 <= n < 2 ** 62):
                raise ValueError(f"latency bucket {b!r} is {n!r}")
            stats.latency[int(b)] = n
        return stats

    def to_json(self) -> dict:
        return {"counts": {k: v for k, v in self.counts.items() if v},
                "latency": {str(b): n for b, n in sorted(self.latency.items())}}


class ProcessStats:
    """The process's stats by tier name: ``total`` since it started, ``pending`` since the last save."""

    def __init__(self) -> None:
        self.total: dict[str, TierStats] = {}
        self.pending: dict[str, TierStats] = {}
        self._lock = threading.Lock()

    def note(self, tier: str, kind: str, ms: float | None = None) -> None:
        with self._lock:
            for table in (self.total, self.pending):
                stats = table.get(tier) or table.setdefault(tier, TierStats())
                stats.counts[kind] += 1
                if ms is not None:
                    stats.latency[bucket(ms)] += 1

    def note_steps(self, steps: Iterable[Step]) -> None:
        """Count a resolution's steps below memory (a system bundle's step names its file: its tier is ``system``)."""
        for step in steps:
            kind = _KIND.get(step.outcome)
            if kind is not None and step.name != "memory":
                self.note(step.name.split(" ", 1)[0], kind, step.ms)

    def snapshot(self) -> dict[str, dict]:
        """Each tier's counts and percentiles in this process."""
        with self._lock:
            return {name: stats.as_dict() for name, stats in sorted(self.total.items())}

    def take_pending(self) -> dict[str, TierStats]:
        with self._lock:
            pending, self.pending = self.pending, {}
        return pending


PROCESS = ProcessStats()


MAX_FILE_BYTES = 1 << 20  # past this, the next save folds the file's records into one


def load(folder: Path) -> tuple[dict[str, TierStats], float | None]:
    """The saved stats in ``folder`` and since when they are kept (empty: none). The file holds a
    record per save, one JSON line each; a line that is not one of ours (torn by a full disk,
    written by hand) is skipped."""
    tiers: dict[str, TierStats] = {}
    since: float | None = None
    try:
        text = (folder / FILE_NAME).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return tiers, since
    for line in text.splitlines():
        try:
            record = json.loads(line)
            parsed = {str(name): TierStats.from_json(data) for name, data in record["tiers"].items()}
            when = float(record["t"])
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        for name, stats in parsed.items():
            tiers.setdefault(name, TierStats()).add(stats)
        since = when if since is None else min(since, when)
    return tiers, since


def _record(tiers: dict[str, TierStats], when: float) -> bytes:
    return (json.dumps({"t": when, "tiers": {n: s.to_json() for n, s in sorted(tiers.items())}}) + "\n").encode()


def save(folder: Path) -> None:
    """Append what this process noted since its last save to ``folder``'s file, as one line in
    one ``O_APPEND`` write (no lock: processes closing handles never wait on each other). Never
    raises: stats only inform."""
    pending = PROCESS.take_pending()
    if not pending or not folder.is_dir():  # no cache was made here: nothing to report beside
        return
    path = folder / FILE_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, _record(pending, time.time()))
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size > MAX_FILE_BYTES:  # fold the records into one (a save racing this loses its line: counts only)
            tiers, since = load(folder)
            tmp = folder / f".{FILE_NAME}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, _record(tiers, since or time.time()))
            finally:
                os.close(fd)
            os.replace(tmp, path)
    except OSError:  # a full or read-only disk loses some counts, never a job
        pass


def reset(folder: Path) -> None:
    try:
        (folder / FILE_NAME).unlink()
    except FileNotFoundError:
        pass


_exit_folder: list[Path] = []  # the folder of the last handle made: where the process's exit saves


def save_at_exit(folder: Path) -> None:
    """Save into ``folder`` when the process exits, for the handles it never closed (the latest
    handle's folder wins: one file gets what is left)."""
    if not _exit_folder:
        atexit.register(lambda: save(_exit_folder[0]))
        _exit_folder.append(folder)
    _exit_folder[0] = folder
