"""Signed kernel packages: `kdb package --sign` signs each wheel's manifest (which lists every data
file's SHA-256); `kdb install --trusted-key` (and `--locked` with it) installs only packages one
of those keys signed, refusing unsigned, tampered and untrusted ones with nothing installed.

Packages are real `kdb package` wheels of small bundles with fake binaries; pip is replaced by a
recorder, so that what would have been installed is seen without changing this environment.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from kdbkit.kdb import Target
from kdbkit.kdb.signing import read_detached_signature, write_key_pair
from kdbkit.kdb.version import __version__
from kdbkit.packager import install as installer
from kdbkit.packager import install_packages
from kdbkit.packager.errors import PackageError
from kdbkit.packager.select import scan
from kdbkit.packager.wheel import write_package
from tests.packager.test_packages import _bundle, _rewrite
from tests.runtime.chain_fixtures import isolated  # noqa: F401

SM90 = Target.parse("sm_90")
MODULE = "kdbkit_kernels_sm_90"
WHEEL = f"{MODULE}-{__version__}-py3-none-any.whl"


@pytest.fixture
def keys(tmp_path):
    """Two key pairs: (private, public, signer) of the publisher, and of a stranger."""
    return write_key_pair(tmp_path / "keys"), write_key_pair(tmp_path / "other")


@pytest.fixture
def pip_calls(monkeypatch) -> list:
    """pip replaced by a recorder: each call's wheels."""
    calls = []
    monkeypatch.setattr(installer, "pip_install_wheels", lambda wheels, digests=None: calls.append(list(wheels)))
    return calls


def _signed(tmp_path, signer, folder="w") -> Path:
    wheel = write_package(_bundle(tmp_path / "b"), tmp_path / folder, signer=signer)
    installer.write_sums(tmp_path / folder, [wheel])
    return wheel


def _members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _install(folder: Path, keys):
    return install_packages(folder, targets=["sm_90"], trusted_keys=keys)


def test_a_signed_wheel_carries_the_signature_over_its_manifest(tmp_path, keys):
    (_, _, signer), _ = keys
    wheel = _signed(tmp_path, signer)
    members = _members(wheel)
    key_id, signature = read_detached_signature(members[f"{MODULE}/manifest.json.sig"])
    assert key_id == signer.key_id
    assert signer.public_key.verifies(members[f"{MODULE}/manifest.json"], signature)
    manifest = json.loads(members[f"{MODULE}/manifest.json"])
    assert manifest["files"]["sm_90.kdb"]["size"] == len(members[f"{MODULE}/sm_90.kdb"])
    # the same key and bundle give the same wheel, byte for byte (Ed25519 is deterministic)
    again = write_package(_bundle(tmp_path / "b2"), tmp_path / "again", signer=signer)
    assert again.read_bytes() == wheel.read_bytes()
    unsigned = write_package(_bundle(tmp_path / "b3"), tmp_path / "unsigned")
    assert f"{MODULE}/manifest.json.sig" not in _members(unsigned)


def test_a_signed_package_installs_under_its_trusted_key(tmp_path, keys, pip_calls):
    (_, pub, signer), _ = keys
    _signed(tmp_path, signer)
    from kdbkit.kdb.signing import load_public_keys

    report = _install(tmp_path / "w", load_public_keys([pub]))
    assert report.ok and [w.name for w in pip_calls[0]] == [WHEEL]
    # and a signed package installs where no key is asked for, too
    assert install_packages(tmp_path / "w", targets=["sm_90"]).ok


def _refused(folder: Path, pub: Path, pip_calls, match: str) -> None:
    from kdbkit.kdb.signing import load_public_keys

    with pytest.raises(PackageError, match=match) as refused:
        _install(folder, load_public_keys([pub]))
    assert "\n" not in str(refused.value) and WHEEL in str(refused.value)  # one line, naming the package
    assert pip_calls == []  # nothing installed


def test_an_unsigned_package_is_refused(tmp_path, keys, pip_calls):
    (_, pub, _), _ = keys
    write_package(_bundle(tmp_path / "b"), tmp_path / "w")
    _refused(tmp_path / "w", pub, pip_calls, "kdbkit-kernels-sm_90 is not signed")


def test_a_package_signed_by_an_untrusted_key_is_refused(tmp_path, keys, pip_calls):
    (_, pub, _), (_, _, stranger) = keys
    _signed(tmp_path, stranger)
    _refused(tmp_path / "w", pub, pip_calls, f"signed by key {stranger.key_id}, which is not trusted")


def _flip(data: bytes, where: int | None = None) -> bytes:
    i = len(data) // 2 if where is None else where
    return data[:i] + bytes([data[i] ^ 1]) + data[i + 1:]


def _flip_signature(data: bytes) -> bytes:
    """One bit of the signature changed, the file still in its exact form."""
    parsed = json.loads(data)
    raw = base64.b64decode(parsed["signature"])
    parsed["signature"] = base64.b64encode(_flip(raw, 5)).decode()
    return (json.dumps(parsed, indent=1, sort_keys=True) + "\n").encode()


@pytest.mark.parametrize("member, change, match", [
    ("sm_90.kdb", _flip, "sm_90.kdb does not match the SHA-256 in its manifest"),
    ("manifest.json", lambda d: d.replace(b'"nvrtc 13.0"', b'"nvrtc 13.1"'), "signature does not verify"),
    ("manifest.json.sig", lambda d: _flip_signature(d), "signature does not verify"),
])
def test_a_tampered_package_is_refused(tmp_path, keys, pip_calls, member, change, match):
    """One byte changed (RECORD rewritten to match, as whoever altered it would): refused, nothing installed."""
    (_, pub, signer), _ = keys
    wheel = _signed(tmp_path, signer)
    name = f"{MODULE}/{member}"

    def alter(infos):
        info, data = infos[name]
        changed = change(data)
        assert changed != data
        return {**infos, name: (info, changed)}

    _rewrite(wheel, alter)
    (tmp_path / "w" / "SHA256SUMS").unlink()  # else SHA256SUMS catches it first
    _refused(tmp_path / "w", pub, pip_calls, match)


def test_a_signature_in_another_form_is_refused_even_without_trusted_keys(tmp_path, keys):
    (_, _, signer), _ = keys
    wheel = _signed(tmp_path, signer)
    name = f"{MODULE}/manifest.json.sig"

    def reformat(infos):
        info, data = infos[name]
        return {**infos, name: (info, json.dumps(json.loads(data)).encode())}  # the same content, other bytes

    _rewrite(wheel, reformat)
    (tmp_path / "w" / "SHA256SUMS").unlink()
    with pytest.raises(PackageError, match="is not a signature `kdb package --sign` writes"):
        installer.verify(scan(tmp_path / "w")[0])


def test_a_bare_bundle_is_refused_under_a_trusted_key(tmp_path, keys, pip_calls):
    (_, pub, _), _ = keys
    _bundle(tmp_path / "w")
    from kdbkit.kdb.signing import load_public_keys

    with pytest.raises(PackageError, match="a bare bundle carries no signature"):
        install_packages(tmp_path / "w", targets=["sm_90"], trusted_keys=load_public_keys([pub]), into=tmp_path / "db")
    assert not (tmp_path / "db").exists()


def test_the_command_line_signs_and_checks(kdb, tmp_path, keys, pip_calls):
    (key, pub, signer), (_, other_pub, _) = keys
    bundle = _bundle(tmp_path / "b")
    code, out, err = kdb("package", bundle, "-o", tmp_path / "w", "--sign", key)
    assert code == 0, err
    assert f"signed with key {signer.key_id}" in out
    code, out, err = kdb("install", "--from", tmp_path / "w", "--target", "sm_90", "--trusted-key", pub)
    assert code == 0, err
    assert [w.name for w in pip_calls[0]] == [WHEEL]
    code, out, err = kdb("install", "--from", tmp_path / "w", "--target", "sm_90", "--trusted-key", other_pub)
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and "which is not trusted" in lines[0] and WHEEL in lines[0], err
    assert len(pip_calls) == 1


def test_a_locked_install_honours_trusted_keys(kdb, tmp_path, keys, pip_calls):
    from kdbkit.kdb.signing import load_public_keys
    from kdbkit.packager.lock import install_locked
    from kdbkit.packager.lock_file import Lock, LockedPackage
    from kdbkit.packager.wheel import compatible_versions

    (_, pub, _), (_, _, stranger) = keys
    wheel = _signed(tmp_path, stranger)
    locked = Lock((LockedPackage("kdbkit-kernels-sm_90", __version__, "sm_90", compatible_versions(), "nvrtc 13.0",
                                 installer.sha256_of(wheel), {}, {}),))
    assert install_locked(locked, tmp_path / "w", dry_run=True)  # no key asked for: installs
    with pytest.raises(PackageError, match="which is not trusted"):
        install_locked(locked, tmp_path / "w", trusted_keys=load_public_keys([pub]))
    assert pip_calls == []


# --- KDB_TRUSTED_KEYS: the runtime's system bundles only from signed installed packages ---------

def _site(tmp_path, monkeypatch, wheel: Path, name="site") -> Path:
    """``wheel`` installed by pip into a folder on sys.path, as `kdb install` would install it."""
    from kdbkit.runtime import paths
    from tests.packager.test_lock import _pip_into

    folder = tmp_path / name
    _pip_into(folder, [wheel])
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(paths, "_entry_points_seen", None)
    return folder


def _search(target=SM90):
    from kdbkit.runtime import paths
    from kdbkit.runtime.system_bundles import find_system_bundles

    bundles, trace = find_system_bundles(target, "cubin", paths.iter_system_db_dirs())
    for b in bundles:
        b.close()
    return [(c.path.name, c.origin, c.status, c.reason) for c in trace if c.status != "missing"]


def test_trusted_keys_accept_a_signed_installed_package(isolated, tmp_path, keys, monkeypatch):
    (_, pub, signer), _ = keys
    _site(tmp_path, monkeypatch, _signed(tmp_path, signer))
    monkeypatch.setenv("KDB_TRUSTED_KEYS", str(pub))
    assert _search() == [("sm_90.kdb", "package kdbkit_kernels_sm_90", "accepted", "")]


def test_trusted_keys_reject_unsigned_untrusted_and_bare_bundles(isolated, tmp_path, keys, monkeypatch):
    (_, pub, _), (_, _, stranger) = keys
    _bundle(isolated / "system")  # a bare bundle in KDB_SYSTEM_DB_PATH
    _site(tmp_path, monkeypatch, write_package(_bundle(tmp_path / "u"), tmp_path / "unsigned"), "s1")
    assert [c[2] for c in _search()] == ["accepted", "accepted"]  # unset: both used, nothing checked
    monkeypatch.setenv("KDB_TRUSTED_KEYS", str(pub))
    (bare, package) = _search()
    assert bare[2] == "rejected" and "a bare bundle carries no signature" in bare[3]
    assert package[2] == "rejected" and "its package is not signed" in package[3]

    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if not p.endswith("s1")])
    _site(tmp_path, monkeypatch, write_package(_bundle(tmp_path / "x"), tmp_path / "stranger", signer=stranger), "s2")
    (_, package) = _search()
    assert package[2] == "rejected" and f"signed by key {stranger.key_id}, which KDB_TRUSTED_KEYS" in package[3]


def test_trusted_keys_reject_an_altered_installed_bundle_or_manifest(isolated, tmp_path, keys, monkeypatch):
    (_, pub, signer), _ = keys
    site = _site(tmp_path, monkeypatch, _signed(tmp_path, signer))
    monkeypatch.setenv("KDB_TRUSTED_KEYS", str(pub))
    assert _search()[0][2] == "accepted"  # its SHA-256 is remembered now, by the file's stamp
    bundle = site / MODULE / "sm_90.kdb"
    data = bundle.read_bytes()
    bundle.write_bytes(data + b"\0")  # one byte more: SQLite does not mind, the manifest does
    (found,) = _search()
    assert found[2] == "rejected" and "SHA-256 is not the one its package's signed manifest.json lists" in found[3]
    bundle.write_bytes(data)
    assert _search()[0][2] == "accepted"

    manifest = site / MODULE / "manifest.json"
    manifest.write_bytes(manifest.read_bytes().replace(b"nvrtc 13.0", b"nvrtc 13.1"))
    (found,) = _search()
    assert found[2] == "rejected" and "signature does not verify" in found[3]


def test_unusable_trusted_keys_fail_closed_with_one_warning(isolated, tmp_path, keys, monkeypatch, capfd):
    (_, _, signer), _ = keys
    _site(tmp_path, monkeypatch, _signed(tmp_path, signer))
    capfd.readouterr()
    monkeypatch.setenv("KDB_TRUSTED_KEYS", str(tmp_path / "no-such.pub"))
    (found,) = _search()
    _search()
    assert found[2] == "rejected" and "KDB_TRUSTED_KEYS is unusable" in found[3]
    warnings = [line for line in capfd.readouterr().err.splitlines() if "KDB_TRUSTED_KEYS is unusable" in line]
    assert len(warnings) == 1 and "no-such.pub" in warnings[0] and "`kdb keys new -o DIR`" in warnings[0]


def test_the_trust_check_costs_little_once_its_digest_is_remembered(isolated, tmp_path, keys, monkeypatch):
    """The added cost on one bundle: paid per search only with KDB_TRUSTED_KEYS set, and no hashing
    once the file's digest is remembered (a new process reads it from the startup memo)."""
    import time

    from kdbkit.runtime import package_trust

    (_, pub, signer), _ = keys
    site = _site(tmp_path, monkeypatch, _signed(tmp_path, signer))
    bundle, origin = site / MODULE / "sm_90.kdb", "package kdbkit_kernels_sm_90"
    assert package_trust.why_untrusted(bundle, origin) == ""  # unset: nothing read
    monkeypatch.setenv("KDB_TRUSTED_KEYS", str(pub))
    assert package_trust.why_untrusted(bundle, origin) == ""
    package_trust._digests.clear()  # as a new process: the memo remembers
    hashed = []
    hash_file = package_trust.sha256_of
    monkeypatch.setattr(package_trust, "sha256_of", lambda path: hashed.append(path) or hash_file(path))
    start = time.perf_counter()
    for _ in range(100):
        assert package_trust.why_untrusted(bundle, origin) == ""
    per_check = (time.perf_counter() - start) / 100
    assert hashed == [] and per_check < 0.005, per_check
    print(f"trust check per bundle: {per_check * 1e6:.0f} us")


# --- provenance: an in-toto statement in every wheel, covered by the signature ----------------

def test_each_wheel_carries_an_in_toto_provenance_statement_listed_in_its_manifest(tmp_path, keys, monkeypatch):
    from kdbkit.runtime.kernel_sources import source_digest

    (_, _, signer), _ = keys
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    members = _members(_signed(tmp_path, signer))
    data = members[f"{MODULE}/provenance.intoto.json"]
    statement = json.loads(data)
    bundle_sha = hashlib.sha256(members[f"{MODULE}/sm_90.kdb"]).hexdigest()
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    assert statement["subject"] == [{"name": "sm_90.kdb", "digest": {"sha256": bundle_sha}}]
    definition, run = statement["predicate"]["buildDefinition"], statement["predicate"]["runDetails"]
    assert definition["externalParameters"] == {"package": "kdbkit-kernels-sm_90", "version": __version__,
                                                "target": "sm_90"}
    assert definition["internalParameters"]["compilers"] == ["nvrtc 13.0"]
    assert "packagingHost" not in definition["internalParameters"]  # only when asked
    assert definition["resolvedDependencies"] == [
        {"name": "kernel-source:softmax.c", "digest": {"sha256": source_digest("softmax.c")},
         "annotations": {"covers": "the source and every file it includes"}}]
    assert run["builder"]["version"] == {"kdbkit": __version__}
    assert run["metadata"] == {"startedOn": "2023-11-14T22:13:20Z", "finishedOn": "2023-11-14T22:13:20Z"}
    manifest = json.loads(members[f"{MODULE}/manifest.json"])  # listed, so the signature covers it
    assert manifest["files"]["provenance.intoto.json"] == {"sha256": hashlib.sha256(data).hexdigest(),
                                                           "size": len(data)}
    hosted = _members(write_package(_bundle(tmp_path / "h"), tmp_path / "hosted", provenance_host=True))
    assert json.loads(hosted[f"{MODULE}/provenance.intoto.json"])["predicate"]["buildDefinition"][
        "internalParameters"]["packagingHost"] == __import__("socket").gethostname()


def test_a_tampered_provenance_is_refused(tmp_path, keys, pip_calls):
    (_, pub, signer), _ = keys
    wheel = _signed(tmp_path, signer)
    name = f"{MODULE}/provenance.intoto.json"

    def alter(infos):
        info, data = infos[name]
        return {**infos, name: (info, data.replace(b"nvrtc 13.0", b"nvrtc 99.9"))}

    _rewrite(wheel, alter)
    (tmp_path / "w" / "SHA256SUMS").unlink()
    _refused(tmp_path / "w", pub, pip_calls, "provenance.intoto.json does not match the SHA-256 in its manifest")


def test_signed_wheels_are_bit_identical_across_two_packagings(tmp_path, keys, monkeypatch):
    (_, _, signer), _ = keys
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    bundle = _bundle(tmp_path / "b")
    first = write_package(bundle, tmp_path / "one", signer=signer).read_bytes()
    copy = tmp_path / "elsewhere" / "deeper" / bundle.name
    copy.parent.mkdir(parents=True)
    copy.write_bytes(bundle.read_bytes())
    assert write_package(copy, tmp_path / "two", signer=signer).read_bytes() == first
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000001")  # another recorded time: other bytes
    assert write_package(bundle, tmp_path / "three", signer=signer).read_bytes() != first


def test_package_show_and_db_info_print_the_provenance(kdb, isolated, tmp_path, keys, monkeypatch):
    (key, _, signer), _ = keys
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    wheel = _signed(tmp_path, signer)
    code, out, err = kdb("package", "--show", wheel)
    assert code == 0, err
    assert f"signed: key {signer.key_id}" in out and "build finished: 2023-11-14T22:13:20Z" in out
    assert "compilers: nvrtc 13.0" in out and "kernel-source:softmax.c: sha256:" in out
    code, out, _ = kdb("package", "--show", wheel, "--json")
    assert json.loads(out)["provenance"]["predicateType"] == "https://slsa.dev/provenance/v1"

    site = _site(tmp_path, monkeypatch, wheel)
    code, out, err = kdb("db", "info", site / MODULE / "sm_90.kdb")
    assert code == 0, err
    assert "provenance (its kernel package's provenance.intoto.json)" in out and "compilers: nvrtc 13.0" in out
    code, out, _ = kdb("db", "info", tmp_path / "b" / "sm_90.kdb")  # a bundle outside any package
    assert code == 0 and "provenance: none" in out


def test_a_build_record_beside_the_bundle_gives_the_times_and_catalogue(tmp_path, monkeypatch):
    from kdbkit.packager import provenance

    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    bundle = _bundle(tmp_path / "b")
    catalogue = provenance.catalogue_digest(["b", "a", "a"])
    assert catalogue == {"sha256": hashlib.sha256(b"a\nb\n").hexdigest(), "problems": 2}
    provenance.write_build_record(bundle, "2026-01-01T00:00:00+00:00", "2026-01-01T00:05:00+00:00", catalogue)

    def statement(out):
        members = _members(write_package(bundle, tmp_path / out))
        return json.loads(members[f"{MODULE}/provenance.intoto.json"])["predicate"]

    predicate = statement("w1")
    assert predicate["buildDefinition"]["externalParameters"]["catalogue"] == catalogue
    assert predicate["runDetails"]["metadata"] == {"startedOn": "2026-01-01T00:00:00+00:00",
                                                   "finishedOn": "2026-01-01T00:05:00+00:00"}
    bundle.write_bytes(bundle.read_bytes() + b"\0")  # the bundle changed since: its record is not its own
    predicate = statement("w2")
    assert "catalogue" not in predicate["buildDefinition"]["externalParameters"]
    assert "startedOn" not in predicate["runDetails"]["metadata"]


def test_kdb_build_leaves_the_record_that_kdb_package_embeds(tmp_path, keys, monkeypatch):
    from kdbkit.packager import build_bundles, package_bundles, provenance
    from tests.packager.test_api import CATALOGUE
    from tests.prerequisites import require_nvrtc

    require_nvrtc()
    (_, _, signer), _ = keys
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    (tmp_path / "model.txt").write_text(CATALOGUE)
    built = build_bundles(["sm_80"], catalogues=[tmp_path / "model.txt"], out=tmp_path / "out", workers=1)
    bundle = built.result.bundles["sm_80"]
    assert bundle.with_name("sm_80.kdb.provenance.json").is_file()
    (packaged,), _ = package_bundles([tmp_path / "out"], tmp_path / "wheels", signer=signer)
    members = _members(packaged.wheel)
    predicate = json.loads(members["kdbkit_kernels_sm_80/provenance.intoto.json"])["predicate"]
    catalogue = predicate["buildDefinition"]["externalParameters"]["catalogue"]
    assert catalogue["problems"] == 2  # the two lines of the catalogue
    assert len(catalogue["sha256"]) == 64
    assert predicate["runDetails"]["metadata"] == {"startedOn": "2023-11-14T22:13:20+00:00",
                                                   "finishedOn": "2023-11-14T22:13:20+00:00"}
    assert "kernel-source:" in predicate["buildDefinition"]["resolvedDependencies"][0]["name"]
