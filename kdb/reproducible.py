"""The time a build records, and when it records none: ``SOURCE_DATE_EPOCH``.

A bundle's ``created`` field and a wheel's member times are the only clock readings kdbkit
writes into what it builds. Following reproducible-builds.org's ``SOURCE_DATE_EPOCH``
(seconds since 1970-01-01 UTC, a decimal integer): where it is set, that time is recorded
instead of the clock's, so two builds of the same inputs at different times give the same
bytes. A reproducible build without it (``kdb build --reproducible``) records no time at all;
an ordinary build records the current time, as it always did. A malformed value is an error,
as the specification asks, never silently the clock's time.
"""

from __future__ import annotations

import datetime as _dt
import os

from kdbkit.kdb.errors import KdbError

VARIABLE = "SOURCE_DATE_EPOCH"
# A zip member is dated from 1980-01-01 00:00:00 UTC (the DOS date's epoch) to 2107-12-31 23:59:58.
ZIP_EPOCH = 315532800
ZIP_LAST = 4354819198
_MAX_DIGITS = 11  # year 5138: anything longer is a mistake, refused before int() reads it


def source_date_epoch() -> int | None:
    """``SOURCE_DATE_EPOCH`` as seconds, or None where it is unset or empty.

    Raises:
        KdbError: it is set to something other than a non-negative decimal integer.
    """
    raw = os.environ.get(VARIABLE, "").strip()
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= _MAX_DIGITS):
        raise KdbError(f"{VARIABLE}={raw[:40]!r} is not a time in seconds since 1970-01-01 UTC",
                       f"set it to a decimal integer, e.g. {VARIABLE}=$(git log -1 --format=%ct), or unset it")
    return int(raw)


def reproducible_mode(asked: bool = False) -> bool:
    """Whether a build is reproducible: asked for (``--reproducible``), or ``SOURCE_DATE_EPOCH`` set.

    Raises:
        KdbError: ``SOURCE_DATE_EPOCH`` is malformed.
    """
    return asked or source_date_epoch() is not None


def created_stamp(reproducible: bool = False) -> str:
    """What a built bundle's ``created`` says: ``SOURCE_DATE_EPOCH`` where set (UTC ISO-8601, to
    the second), else nothing (``""``) in a reproducible build, else the current time.

    Raises:
        KdbError: ``SOURCE_DATE_EPOCH`` is malformed.
    """
    epoch = source_date_epoch()
    if epoch is None and reproducible:
        return ""
    when = _dt.datetime.now(_dt.timezone.utc) if epoch is None else _dt.datetime.fromtimestamp(epoch, _dt.timezone.utc)
    return when.isoformat(timespec="seconds")


def zip_date_time() -> tuple[int, int, int, int, int, int]:
    """A zip member's date and time: ``SOURCE_DATE_EPOCH`` where set (UTC, within the zip format's
    1980-2107, in its 2-second steps), else 1980-01-01 00:00:00, so that a wheel never depends on
    the clock.

    Raises:
        KdbError: ``SOURCE_DATE_EPOCH`` is malformed.
    """
    epoch = min(max(source_date_epoch() or ZIP_EPOCH, ZIP_EPOCH), ZIP_LAST)
    t = _dt.datetime.fromtimestamp(epoch, _dt.timezone.utc)
    return (t.year, t.month, t.day, t.hour, t.minute, t.second - t.second % 2)
