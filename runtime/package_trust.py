"""``KDB_TRUSTED_KEYS``: system bundles only from kernel packages a trusted key signed.

Unset (the default), this module costs nothing: :func:`why_untrusted` returns at once. Set to a
path list of Ed25519 public keys, a system bundle is accepted only when it comes from an
installed kernel package (found through its ``kdbkit.bundles`` entry point) whose
``manifest.json.sig`` (written by ``kdb package --sign``) verifies over its ``manifest.json``
under one of those keys, and whose own SHA-256 and size are the ones that manifest lists. A bare
bundle (``KDB_SYSTEM_DB_PATH``, ``<sys.prefix>/share/kdbkit/db``, where ``kdb install --into``
copies) carries no signature and is rejected, with the reason in the search's trace. Key files
that cannot be used fail closed: every system bundle is rejected, with one warning naming the fix.

Hashing a bundle is the one cost that grows with its size, so a file's SHA-256 is remembered
by its path and stamp (mtime, size, ctime, inode) in this process and in the startup memo: a
later process pays a ``stat``, two small reads and one Ed25519 verification per package
(tests/packager/test_signed_packages.py measures it).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from kdbkit.kdb.file_hash import sha256_of
from kdbkit.runtime import env
from kdbkit.runtime.logging_setup import get_logger, warn_once

_log = get_logger(__name__)
MANIFEST, SIGNATURE = "manifest.json", "manifest.json.sig"  # spelled as packager/wheel.py writes them
_MAX_MANIFEST_BYTES = 1 << 20
_MEMO_SECTION = "bundle_sha256"
_keys: tuple[tuple, object] | None = None  # (the raw setting, its keys or the problem with them)
_digests: dict[tuple, str] = {}
_lock = threading.Lock()


def _trusted_keys():
    """The keys of ``KDB_TRUSTED_KEYS``: None when unset, a problem (str) when unusable."""
    global _keys
    raw = env.raw_values("KDB_TRUSTED_KEYS")
    current = _keys
    if current is not None and current[0] == raw:
        return current[1]
    paths = env.get_pathlist("KDB_TRUSTED_KEYS") if raw[0] is not None else []
    keys: object = None
    if raw[0] is not None:
        from kdbkit.kdb import signing  # only where keys are set (it loads cryptography)
        from kdbkit.kdb.errors import SigningKeyError

        try:
            keys = signing.load_public_keys(paths) if paths else "it names no key file"
        except SigningKeyError as exc:
            keys = exc.problem
        if isinstance(keys, str):
            warn_once(f"trusted-keys:{raw[0]}", f"KDB_TRUSTED_KEYS is unusable ({keys}): no system bundle is used. "
                      "Point it at the .pub files of the keys that sign your kernel packages (`kdb keys new -o DIR` "
                      "makes a pair), or unset it.", logger=_log)
    with _lock:
        _keys = (raw, keys)
    return keys


def enabled() -> bool:
    """Whether ``KDB_TRUSTED_KEYS`` is set (usable or not)."""
    return env.raw_values("KDB_TRUSTED_KEYS")[0] is not None


def why_untrusted(path: Path, origin: str) -> str:
    """Why the system bundle ``path`` (found through ``origin``) is not to be used under
    ``KDB_TRUSTED_KEYS``; "" when it may be (or the setting is unset). Never raises."""
    if not enabled():
        return ""
    keys = _trusted_keys()
    if isinstance(keys, str):
        return f"KDB_TRUSTED_KEYS is unusable ({keys}), so no system bundle is trusted"
    if not origin.startswith("package "):
        return ("a bare bundle carries no signature; with KDB_TRUSTED_KEYS set only bundles of signed kernel "
                "packages are used (`kdb package --sign`, then `kdb install`)")
    folder = path.parent
    try:
        manifest = _read_small(folder / MANIFEST)
    except OSError as exc:
        return f"its package has no readable {MANIFEST} ({exc.strerror or exc})"
    try:
        signature = _read_small(folder / SIGNATURE)
    except FileNotFoundError:
        return "its package is not signed (no manifest.json.sig); KDB_TRUSTED_KEYS accepts only signed packages"
    except OSError as exc:
        return f"its package's {SIGNATURE} is unreadable ({exc.strerror or exc})"
    from kdbkit.kdb import signing

    parsed = signing.read_detached_signature(signature)
    if parsed is None:
        return f"its package's {SIGNATURE} is not a signature `kdb package --sign` writes"
    key_id, sig = parsed
    if not any(k.key_id == key_id for k in keys):
        return f"its package is signed by key {key_id}, which KDB_TRUSTED_KEYS does not list"
    if signing.verify(manifest, sig, keys, key_id) is None:
        return f"its package's signature does not verify under key {key_id} (the manifest or signature was altered)"
    try:
        listed = json.loads(manifest)["files"][path.name]
        want, size = str(listed["sha256"]), int(listed["size"])
    except (ValueError, KeyError, TypeError):
        return f"its package's signed {MANIFEST} does not list {path.name}"
    try:
        digest, actual = _sha256(path)
    except OSError as exc:
        return f"cannot be read to check its SHA-256 ({exc.strerror or exc})"
    if actual != size or digest != want:
        return f"its SHA-256 is not the one its package's signed {MANIFEST} lists (the file was altered)"
    return ""


def _read_small(path: Path) -> bytes:
    with open(path, "rb") as f:
        data = f.read(_MAX_MANIFEST_BYTES + 1)
    if len(data) > _MAX_MANIFEST_BYTES:
        raise OSError(f"over {_MAX_MANIFEST_BYTES} bytes")
    return data


def _sha256(path: Path) -> tuple[str, int]:
    """The file's SHA-256 and size, remembered by its path and stamp."""
    from kdbkit.runtime import startup_memo

    st = os.stat(path)
    key = (os.path.abspath(path), *startup_memo.stamp(st))
    digest = _digests.get(key)
    if digest is not None:
        return digest, st.st_size
    memo, memo_key = startup_memo.memo(), json.dumps(list(key))
    remembered = memo.section(_MEMO_SECTION).get(memo_key)
    if isinstance(remembered, str) and len(remembered) == 64:
        digest = remembered
    else:
        digest = sha256_of(path)
        memo.put(_MEMO_SECTION, memo_key, digest)
    _digests[key] = digest
    return digest, st.st_size
