"""Kernel packages: wheels written with their manifest and entry point, candidates ranked or
rejected with the reason, every SHA-256 and archive member checked before anything is
installed, bare bundles copied into the db folder."""

from __future__ import annotations

import base64
import hashlib
import json
import stat
import zipfile

import pytest

from kdbkit.kdb import Target, write_bundle
from kdbkit.kdb.version import __version__
from kdbkit.kdb.find_db import FindRecord, configs_in, write_system_find_db
from kdbkit.packager import install as installer
from kdbkit.packager.select import choose, scan
from kdbkit.packager.wheel import compatible_versions, module_name, package_name, write_package
from kdbkit.packager.errors import PackageError
from kdbkit.runtime.kernel_sources import source_digest

SM90 = Target("cuda", "sm_90", (), 132)
CONFIG = "softmax,dir=fwd,algo=accurate,mode=channel,type=fp32,shape=2x4x9x9,xs=324x81x9x1,ys=324x81x9x1,a=1.0,b=0.0"


def _bundle(folder, target=SM90.arch_wide(), sources=None):
    folder.mkdir(parents=True, exist_ok=True)
    sources = sources if sources is not None else {"softmax.c": source_digest("softmax.c")}
    return write_bundle(folder / target.bundle_name(), target, [("softmax.c", "-DX", bytes(range(256)) * 8)],
                        compiler="nvrtc 13.0", binary_format="cubin" if target.backend == "cuda" else "hsaco",
                        sources=sources)


def _find_db(folder, name="sm_90_132.fdb"):
    folder.mkdir(parents=True, exist_ok=True)
    return write_system_find_db(folder / name, name[:-4], {CONFIG: [FindRecord(1, "SoftmaxBlock", 0, 0.01, 0)]},
                                producer="test")


def test_names_spell_every_target_as_a_distribution_can():
    assert package_name(SM90) == "kdbkit-kernels-sm_90-132"
    assert package_name(Target("hip", "gfx90a", ("xnack-",), 110)) == "kdbkit-kernels-gfx90a-xnack-off-110"
    assert module_name(Target("hip", "gfx942")) == "kdbkit_kernels_gfx942"
    assert compatible_versions("0.1.0") == ">=0.1.0,<0.2"


def test_a_wheel_holds_the_bundle_find_db_manifest_and_entry_point(tmp_path):
    bundle, fdb = _bundle(tmp_path / "b"), _find_db(tmp_path / "t")
    wheel = write_package(bundle, tmp_path / "w", find_db=fdb)
    assert wheel.name.startswith("kdbkit_kernels_sm_90_132-")  # the find-db was tuned on 132 CUs
    from wheel.wheelfile import WheelFile

    with WheelFile(wheel) as archive:  # reads every member against RECORD
        members = {name: archive.read(name) for name in archive.namelist()}
    module = "kdbkit_kernels_sm_90_132"
    manifest = json.loads(members[f"{module}/manifest.json"])
    assert manifest["target"] == "sm_90_132" and manifest["compiler"] == "nvrtc 13.0"
    assert manifest["sources"] == {"softmax.c": source_digest("softmax.c")}
    for name in ("sm_90.kdb", "sm_90_132.fdb"):
        assert manifest["files"][name]["sha256"] == hashlib.sha256(members[f"{module}/{name}"]).hexdigest()
    entry_points = members[f"{module}-{__version__}.dist-info/entry_points.txt"].decode()
    assert entry_points == f"[kdbkit.bundles]\n{module} = {module}\n"  # names a folder, runs nothing
    metadata = members[f"{module}-{__version__}.dist-info/METADATA"].decode()
    assert f"Requires-Dist: kdbkit{compatible_versions(__version__)}" in metadata
    assert write_package(bundle, tmp_path / "again", find_db=fdb).read_bytes()[:30] == wheel.read_bytes()[:30]


def test_a_find_db_for_another_arch_or_misnamed_is_refused(tmp_path):
    bundle = _bundle(tmp_path / "b")
    with pytest.raises(PackageError, match="tuned for gfx942_304, but the bundle is for sm_90"):
        write_package(bundle, tmp_path / "w", find_db=_find_db(tmp_path / "t", "gfx942_304.fdb"))
    with pytest.raises(PackageError, match="a find-db is named for its GPU"):
        write_package(bundle, tmp_path / "w", find_db=_find_db(tmp_path / "t", "tuned.fdb"))


def test_the_exact_target_beats_arch_wide_and_a_wheel_beats_a_bare_bundle(tmp_path):
    src = tmp_path / "src"
    write_package(_bundle(src / "a"), tmp_path / "w")                               # arch-wide wheel
    write_package(_bundle(src / "a"), tmp_path / "w", find_db=_find_db(src / "t"))  # tuned on 132 CUs
    write_package(_bundle(src / "a"), tmp_path / "w", find_db=_find_db(src / "t", "sm_90_114.fdb"))
    _bundle(tmp_path / "w" / "bare")                                                # bare arch-wide bundle
    write_package(_bundle(src / "g", Target("hip", "gfx942")), tmp_path / "w")
    candidates = scan(tmp_path / "w")
    assert len(candidates) == 5

    exact = choose(SM90, candidates)
    assert exact.chosen.path.name.startswith("kdbkit_kernels_sm_90_132-") and exact.rank == 0
    reasons = {c.path.name: why for c, why in exact.rejected}
    assert reasons[f"kdbkit_kernels_gfx942-{__version__}-py3-none-any.whl"].endswith("backend hip != cuda")
    assert reasons["sm_90.kdb"].startswith("a better candidate was chosen")

    pcie = choose(Target("cuda", "sm_90", (), 114), candidates)
    assert pcie.chosen.path.name.startswith("kdbkit_kernels_sm_90_114-")
    other = choose(Target("cuda", "sm_90", (), 66), candidates)  # no package tuned for it
    assert other.chosen.path.name.startswith("kdbkit_kernels_sm_90-") and other.rank == 1
    assert choose(Target("cuda", "sm_80", (), 108), candidates).chosen is None


def test_stale_sources_other_kdbkit_versions_and_damage_are_rejected_with_why(tmp_path):
    write_package(_bundle(tmp_path / "s", sources={"softmax.c": "0" * 64}), tmp_path / "w")
    write_package(_bundle(tmp_path / "v"), tmp_path / "old", version="0.0.9")
    (tmp_path / "w" / "kdbkit_kernels_broken-0.1.0-py3-none-any.whl").write_bytes(b"not a zip")
    reasons = [why for _, why in choose(SM90, scan(tmp_path / "w")).rejected]
    assert any("built from other kernel sources than these (1 of 1 files differ: softmax.c)" in r for r in reasons)
    assert any(r.startswith("damaged: not a readable wheel") for r in reasons)
    old = choose(SM90, scan(tmp_path / "old"))
    assert old.chosen is None and old.rejected[0][1] == f"made for kdbkit >=0.0.9,<0.1; this is kdbkit {__version__}"


def _rewrite(wheel, change):
    """Rewrite a wheel's members through ``change(members) -> members``, with RECORD made to match,
    so that only the installer's own checks can catch what changed."""
    with zipfile.ZipFile(wheel) as archive:
        infos = {i.filename: (i, archive.read(i.filename)) for i in archive.infolist() if not i.filename.endswith("RECORD")}
        record = next(n for n in archive.namelist() if n.endswith("RECORD"))
    infos = change(infos)
    lines = []
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, (info, data) in infos.items():
            archive.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            lines.append(f"{name},sha256={digest},{len(data)}")
        archive.writestr(record, "\n".join(lines + [f"{record},,"]) + "\n")


def _with_member(name, data=b"x", mode=0o644 | stat.S_IFREG):
    def change(infos):
        info = zipfile.ZipInfo(name)
        info.external_attr = mode << 16
        return {**infos, name: (info, data)}
    return change


@pytest.mark.parametrize("member, why", [
    ("../evil.py", "a '..' component"),
    ("/etc/evil.py", "an absolute path"),
    ("elsewhere/evil.py", "outside its package folder"),
])
def test_unsafe_members_are_refused_before_anything_is_installed(tmp_path, member, why):
    wheel = write_package(_bundle(tmp_path / "b"), tmp_path / "w")
    _rewrite(wheel, _with_member(member))
    (candidate,) = scan(tmp_path / "w")
    with pytest.raises(PackageError, match=f"member {member!r} is {why}"):
        installer.verify(candidate)


def test_a_link_member_is_refused(tmp_path):
    wheel = write_package(_bundle(tmp_path / "b"), tmp_path / "w")
    _rewrite(wheel, _with_member("kdbkit_kernels_sm_90/link", b"/etc/passwd", 0o777 | stat.S_IFLNK))
    with pytest.raises(PackageError, match="is a link"):
        installer.verify(scan(tmp_path / "w")[0])


def test_altered_members_and_checksums_are_refused(tmp_path):
    wheel = write_package(_bundle(tmp_path / "b"), tmp_path / "w")
    installer.write_sums(tmp_path / "w", [wheel])
    installer.verify(scan(tmp_path / "w")[0])  # as written: passes

    def swap_bundle(infos):
        info, data = infos["kdbkit_kernels_sm_90/sm_90.kdb"]
        return {**infos, "kdbkit_kernels_sm_90/sm_90.kdb": (info, data[:-1] + bytes([data[-1] ^ 1]))}

    _rewrite(wheel, swap_bundle)  # RECORD agrees; the manifest and SHA256SUMS do not
    with pytest.raises(PackageError, match="SHA-256 does not match .*SHA256SUMS"):
        installer.verify(scan(tmp_path / "w")[0])
    (tmp_path / "w" / "SHA256SUMS").unlink()
    with pytest.raises(PackageError, match="sm_90.kdb does not match the SHA-256 in its manifest"):
        installer.verify(scan(tmp_path / "w")[0])

    plain = write_package(_bundle(tmp_path / "c"), tmp_path / "x")
    with zipfile.ZipFile(plain, "a") as archive:  # a member RECORD does not know
        archive.writestr("kdbkit_kernels_sm_90/extra.py", "print('hi')")
    with pytest.raises(PackageError, match="member 'kdbkit_kernels_sm_90/extra.py' is not part of a kernel package"):
        installer.verify(scan(tmp_path / "x")[0])


def test_a_bare_bundle_and_its_find_db_are_copied_into_the_db_folder(tmp_path):
    _bundle(tmp_path / "from")
    tuned = _find_db(tmp_path / "from", "sm_90.fdb")
    (candidate,) = scan(tmp_path / "from")
    installer.verify(candidate)
    done = installer.install(candidate, db_dir=tmp_path / "db")
    assert done.files == ("sm_90.kdb", "sm_90.fdb")
    assert (tmp_path / "db" / "sm_90.kdb").read_bytes() == candidate.path.read_bytes()
    assert configs_in(tmp_path / "db" / "sm_90.fdb") == configs_in(tuned)


def test_a_damaged_bare_bundle_is_refused(tmp_path):
    import sqlite3

    path = _bundle(tmp_path / "from")
    with sqlite3.connect(path) as conn:  # an entry whose bytes no longer match their hash
        conn.execute("UPDATE kern_db SET kernel_blob = ?, uncompressed_size = 0", (b"\0" * 64,))
    (candidate,) = scan(tmp_path / "from")
    with pytest.raises(PackageError, match="the bundle is damaged"):
        installer.verify(candidate)
