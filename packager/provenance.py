"""A kernel package's provenance: an in-toto Statement v1 with a SLSA provenance v1 predicate.

``kdb package`` writes it as ``<module>/provenance.intoto.json``, listed with its SHA-256 in
``manifest.json``, so that ``kdb package --sign`` covers it too. It records what the packaging
knows, and only that:

- ``subject``: each data file of the package (bundle, find-db) by name and SHA-256;
- ``buildDefinition``: the package, version and target (and, for one part of a bundle split by
  size, ``splitFrom``: its part number, the number of parts, the whole bundle's SHA-256); the
  compiler and its version and the
  binary format (the bundle's metadata); every kernel source the bundle was built from, by the
  digest of its source manifest (SHA-256 of the source and every file it includes);
- ``runDetails``: the builder (kdbkit, its version; the host only when asked:
  ``--provenance-host``, since a host name makes the wheel differ between machines) and the
  times.

``kdb build`` leaves ``<bundle>.provenance.json`` beside each bundle it writes (its *build
record*: the bundle's SHA-256, the build's start and end, and the catalogue's digest: SHA-256 of
its problems' configs, sorted, one a line). ``kdb package`` embeds a record whose SHA-256 is the
bundle's (a bundle merged or rebuilt since has none): its times and catalogue digest. Without
one, the times are ``SOURCE_DATE_EPOCH`` where set (start and end), else the bundle's ``created``
as the end, else none, and the catalogue is not recorded (a bundle does not name it). Times follow
:func:`kdbkit.kdb.reproducible.created_stamp`: a reproducible build without ``SOURCE_DATE_EPOCH``
records none. Everything here comes from the bundle, its record and the environment, so the same
inputs give the same bytes (JSON, keys sorted, one form).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import socket
from pathlib import Path
from typing import Iterable

from kdbkit.kdb.bundle import BundleMetadata
from kdbkit.kdb.file_hash import sha256_of
from kdbkit.kdb.reproducible import source_date_epoch
from kdbkit.kdb.writer import write_file_atomically
from kdbkit.kdb.version import __version__

FILE = "provenance.intoto.json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:kdbkit:kdb-build-and-package:v1"
BUILDER_ID = "urn:kdbkit:kdb"
RECORD_SUFFIX = ".provenance.json"  # the build record beside a bundle: sm_90.kdb.provenance.json
RECORD_FORMAT = 1
_MAX_RECORD_BYTES = 64 << 10


def catalogue_digest(configs: Iterable[str]) -> dict:
    """The catalogue's digest as a build record keeps it: SHA-256 of its problems' configs."""
    unique = sorted(set(configs))
    return {"sha256": hashlib.sha256("".join(f"{c}\n" for c in unique).encode()).hexdigest(),
            "problems": len(unique)}


def write_build_record(bundle: Path, started: str, finished: str, catalogue: dict | None) -> Path:
    """Write ``<bundle>.provenance.json`` for a bundle just built (times as
    :func:`~kdbkit.kdb.reproducible.created_stamp` gives them, "" for none)."""
    record = {"format": RECORD_FORMAT, "bundle_sha256": sha256_of(bundle), "startedOn": started, "finishedOn": finished,
              "catalogue": catalogue}
    return write_file_atomically(bundle.with_name(bundle.name + RECORD_SUFFIX),
                                 (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())


def read_build_record(bundle: Path, bundle_sha256: str) -> dict | None:
    """The build record beside ``bundle`` when it describes these bytes, else None (none there,
    unreadable, malformed, or for another bundle)."""
    try:
        with open(bundle.with_name(bundle.name + RECORD_SUFFIX), "rb") as f:
            record = json.loads(f.read(_MAX_RECORD_BYTES))
        if record.get("format") != RECORD_FORMAT or record.get("bundle_sha256") != bundle_sha256:
            return None
        catalogue = record.get("catalogue")
        if catalogue is not None and not (isinstance(catalogue.get("sha256"), str)
                                          and isinstance(catalogue.get("problems"), int)):
            return None
        return {"startedOn": str(record.get("startedOn") or ""), "finishedOn": str(record.get("finishedOn") or ""),
                "catalogue": catalogue}
    except (OSError, ValueError, AttributeError):
        return None


def statement(data_files: dict[str, str], md: BundleMetadata, *, package: str, version: str, target: str,
              host: bool = False, record: dict | None = None, split: dict | None = None) -> bytes:
    """The statement's bytes.

    Args:
        data_files: each data file's name and SHA-256 (hex).
        md: the bundle's metadata.
        host: record this machine's host name (the packaging host).
        record: the bundle's build record (:func:`read_build_record`), where there is one.
        split: for one part of a bundle split by size: its part number, the number of parts and
            the whole bundle's SHA-256 (``bundleSha256``).

    Raises:
        KdbError: ``SOURCE_DATE_EPOCH`` is malformed.
    """
    epoch = source_date_epoch()
    metadata: dict[str, str] = {}
    if record is not None:
        metadata = {k: record[k] for k in ("startedOn", "finishedOn") if record[k]}
    elif epoch is not None:
        when = _dt.datetime.fromtimestamp(epoch, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        metadata = {"startedOn": when, "finishedOn": when}
    elif md.created:
        metadata = {"finishedOn": md.created}
    builder: dict = {"id": BUILDER_ID, "version": {"kdbkit": __version__}}
    internal: dict = {"compilers": [md.compiler] if md.compiler else [], "binaryFormat": md.binary_format,
                      "reproducible": md.reproducible}
    if host:
        internal["packagingHost"] = socket.gethostname()
    predicate = {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"package": package, "version": version, "target": target,
                                   **({"catalogue": record["catalogue"]} if record and record["catalogue"] else {}),
                                   **({"splitFrom": split} if split else {})},
            "internalParameters": internal,
            "resolvedDependencies": [
                {"name": f"kernel-source:{name}", "digest": {"sha256": digest},
                 "annotations": {"covers": "the source and every file it includes"}}
                for name, digest in sorted(md.source_digests.items())],
        },
        "runDetails": {"builder": builder, "metadata": metadata},
    }
    doc = {"_type": STATEMENT_TYPE,
           "subject": [{"name": name, "digest": {"sha256": digest}} for name, digest in sorted(data_files.items())],
           "predicateType": PREDICATE_TYPE, "predicate": predicate}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def summary(data: bytes) -> list[tuple[str, str]]:
    """What a statement says, as (field, value) rows for ``kdb package --show`` and ``kdb db
    info``; a statement that does not parse is one row saying so."""
    try:
        doc = json.loads(data)
        predicate = doc["predicate"]
        definition, run = predicate["buildDefinition"], predicate["runDetails"]
        rows = [("statement", f"{doc['_type']} ({doc['predicateType']})"),
                *[(f"subject {s['name']}", f"sha256:{s['digest']['sha256']}") for s in doc["subject"]],
                ("builder", f"{run['builder']['id']} kdbkit {run['builder'].get('version', {}).get('kdbkit', '?')}"),
                ("compilers", ", ".join(definition["internalParameters"].get("compilers", [])) or "-")]
        host = definition["internalParameters"].get("packagingHost")
        if host:
            rows.append(("packaging host", str(host)))
        times = run.get("metadata", {})
        rows.append(("build started", times.get("startedOn", "-")))
        rows.append(("build finished", times.get("finishedOn", "-")))
        catalogue = definition["externalParameters"].get("catalogue")
        rows.append(("catalogue", f"sha256:{catalogue['sha256']} ({catalogue['problems']} problems)" if catalogue
                     else "not recorded"))
        split = definition["externalParameters"].get("splitFrom")
        if split:
            rows.append(("split", f"part {split['part']} of {split['parts']} of bundle sha256:{split['bundleSha256']}"))
        rows += [(dep["name"], f"sha256:{dep['digest']['sha256']}") for dep in definition["resolvedDependencies"]]
        return rows
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return [("provenance", f"unreadable ({exc})")]
