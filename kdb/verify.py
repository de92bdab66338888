"""Check a bundle end to end: file, schema, metadata, and every entry bound to its key.

``verify_bundle`` never raises for a bad file: it returns a report listing each problem
(with the file, and the key for entry problems) so that ``kdb db verify`` can go through
many files and exit non-zero if any has one.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from kdbkit.kdb.bundle import Bundle
from kdbkit.kdb.errors import KdbError
from kdbkit.kdb.schema import KERN_DB_COLUMNS
from kdbkit.kdb.target import parse_bundle_file_name


@dataclass
class VerifyReport:
    path: Path
    problems: list[str] = field(default_factory=list)
    entries_checked: int = 0
    format_version: int | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def schema_problems(bundle: Bundle) -> list[str]:
    """Differences between the file's ``kern_db`` and MIOpen's layout (empty when equal)."""
    import sqlite_utils  # slow to import: only verification needs it, never the lookup path

    db = sqlite_utils.Database(bundle._conn)
    table = db.table("kern_db")
    problems = []
    try:
        cols = tuple(c.name for c in table.columns)
        indexes = table.indexes
    except (sqlite3.Error, UnicodeDecodeError) as exc:  # the schema's own text is damaged
        return [f"the schema cannot be read ({type(exc).__name__}: {exc})"]
    if cols != KERN_DB_COLUMNS:
        problems.append(f"kern_db columns are {list(cols)}, expected {list(KERN_DB_COLUMNS)}")
    if not any(ix.unique and ix.columns == ["kernel_name", "kernel_args"] for ix in indexes):
        problems.append("no unique index on kern_db(kernel_name, kernel_args): lookups would scan the table")
    return problems


def name_problems(bundle: Bundle) -> list[str]:
    """The file name and the metadata must name the same arch and CU count."""
    target = bundle.metadata.target
    try:
        name = parse_bundle_file_name(bundle.path)
    except KdbError:
        return []  # a free-form name (a merge output, a test file) says nothing to contradict
    if target is None:
        return []
    if (name.arch, name.cu) != (target.arch, target.cu):
        return [f"file name says {_described(name.arch, name.cu)} but the metadata says "
                f"{_described(target.full_arch, target.cu)}"]
    return []


def _described(arch: str, cu: int | None) -> str:
    return f"{arch} with {cu} CUs" if cu is not None else f"{arch} (arch-wide)"


def verify_bundle(path: str | Path, *, check_entries: bool = True) -> VerifyReport:
    """Verify one bundle: SQLite integrity, schema, metadata, name, every entry's hash.

    Args:
        path: the bundle file.
        check_entries: decode every blob and compare its hash (the slow part).

    Returns:
        A report; ``report.ok`` is False if anything is wrong.
    """
    report = VerifyReport(Path(path))
    # Problems only, never the errors' remedies: those would send the user back here.
    try:
        bundle = Bundle.open(path)
    except KdbError as exc:
        report.problems.append(exc.problem)
        return report
    with bundle:
        report.format_version = bundle.metadata.format_version
        try:
            report.problems += [f"{bundle.path}: integrity_check: {m}" for m in bundle.integrity_check()]
            report.problems += [f"{bundle.path}: {m}" for m in schema_problems(bundle) + name_problems(bundle)]
            if bundle.metadata.format_version > 0 and bundle.metadata.target is None:
                report.problems.append(f"{bundle.path}: kdb_meta names no target (backend, arch)")
            if check_entries:
                _check_entries(bundle, report)
        except KdbError as exc:
            report.problems.append(exc.problem)
    return report


def _check_entries(bundle: Bundle, report: VerifyReport) -> None:
    # Row by row from the table (not through the index, not bundle.items()) so that one corrupt
    # entry is reported and the rest are still checked, and each row is checked under its own
    # key: a row holding another entry's bytes, or one the index does not lead to, is named.
    for rowid, _, _, problem in bundle.checked_rows():
        if problem is not None:
            report.problems.append(f"row {rowid}: {problem.problem}")
        report.entries_checked += 1
    for name, args, rowids in bundle.duplicate_keys():
        report.problems.append(f"{bundle.path}: rows {rowids} all hold the key {name} [{args}]")
