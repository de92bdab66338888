"""A kernel package's provenance: an in-toto Statement v1 with a SLSA provenance v1 predicate.

``kdb package`` writes it as ``<module>/provenance.intoto.json``, listed with its SHA-256 in
``manifest.json``, so that ``kdb package --sign`` covers it too. It records what the packaging
knows, and only that:

- ``subject``: each data file of the package (bundle, find-db) by name and SHA-256;
- ``buildDefinition``: the package, version and target; the compiler and its version and the
  binary format (the bundle's metadata); every kernel source the bundle was built from, by the
  digest of its source manifest (SHA-256 of the source and every file it includes);
- ``runDetails``: the builder (kdbkit, its version; the host only when asked:
  ``--provenance-host``, since a host name makes the wheel differ between machines) and the
  times: ``SOURCE_DATE_EPOCH`` where set (the build's start and end are then that one time, as a
  reproducible build records it), else the bundle's ``created`` time as the build's end, else none.

The catalogue's digest is not recorded: a bundle does not say which catalogue it was built from.
Everything here comes from the bundle and the environment, so the same bundle gives the same
bytes (JSON, keys sorted, one form).
"""

from __future__ import annotations

import datetime as _dt
import json
import socket

from kdbkit.kdb.bundle import BundleMetadata
from kdbkit.kdb.reproducible import source_date_epoch
from kdbkit.kdb.version import __version__

FILE = "provenance.intoto.json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:kdbkit:kdb-build-and-package:v1"
BUILDER_ID = "urn:kdbkit:kdb"


def statement(data_files: dict[str, str], md: BundleMetadata, *, package: str, version: str, target: str,
              host: bool = False) -> bytes:
    """The statement's bytes.

    Args:
        data_files: each data file's name and SHA-256 (hex).
        md: the bundle's metadata.
        host: record this machine's host name (the packaging host).

    Raises:
        KdbError: ``SOURCE_DATE_EPOCH`` is malformed.
    """
    epoch = source_date_epoch()
    metadata: dict[str, str] = {}
    if epoch is not None:
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
            "externalParameters": {"package": package, "version": version, "target": target},
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
        rows.append(("catalogue", "not recorded"))
        rows += [(dep["name"], f"sha256:{dep['digest']['sha256']}") for dep in definition["resolvedDependencies"]]
        return rows
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return [("provenance", f"unreadable ({exc})")]
