"""Choosing system bundles is a pure function of folders and target, with a trace."""

from kdbkit.kdb import Target, write_bundle
from kdbkit.runtime.paths import SearchDir
from kdbkit.runtime.system_bundles import find_system_bundles


def _bundle(folder, name, target, fmt="cubin", compiler="nvrtc 13.0"):
    folder.mkdir(parents=True, exist_ok=True)
    return write_bundle(folder / name, Target.parse(target), [("k.c.o", "-mcpu=x", b"x" * 100)], compiler=compiler,
                        binary_format=fmt)


def test_exact_then_arch_wide_across_folders(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _bundle(b, "sm_90_132.kdb", "sm_90_132")
    _bundle(a, "sm_90.kdb", "sm_90")
    found, trace = find_system_bundles(Target.parse("sm_90_132"), "cubin", [SearchDir(a, "x"), SearchDir(b, "y")])
    assert [f.path for f in found] == [b / "sm_90_132.kdb", a / "sm_90.kdb"]
    assert [c.status for c in trace] == ["missing", "accepted", "accepted", "missing"]


def test_wrong_bundles_are_rejected_with_reasons(tmp_path):
    d = tmp_path / "d"
    _bundle(d, "gfx90a_110.kdb", "gfx90a_104")  # file name lies about the CU count
    _bundle(d, "gfx90a.kdb", "gfx90a:xnack+")  # built with xnack on, device has it off
    device = Target.parse("gfx90a:xnack-_110")
    found, trace = find_system_bundles(device, "hsaco", [SearchDir(d, "test")])
    assert found == []
    reasons = {c.path.name: c.reason for c in trace}
    assert "104 CUs" in reasons["gfx90a_110.kdb"]
    assert "xnack+" in reasons["gfx90a.kdb"]


def test_wrong_binary_format_and_garbage_files_are_rejected(tmp_path):
    d = tmp_path / "d"
    _bundle(d, "sm_90_132.kdb", "sm_90_132", fmt="ptx")
    (d / "sm_90.kdb").write_bytes(b"garbage" * 100)
    found, trace = find_system_bundles(Target.parse("sm_90_132"), "cubin", [SearchDir(d, "test")])
    assert found == []
    assert "loads cubin" in trace[0].reason and "not a bundle" in trace[1].reason
