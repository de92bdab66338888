import pytest

from kdbkit.kdb import BundleNameError, Target, bundle_file_name, parse_bundle_file_name


@pytest.mark.parametrize("text,backend,arch,features,cu", [
    ("sm_90_132", "cuda", "sm_90", (), 132),
    ("sm_90", "cuda", "sm_90", (), None),
    ("sm_100a_148", "cuda", "sm_100a", (), 148),
    ("gfx90a:xnack-_110", "hip", "gfx90a", ("xnack-",), 110),
    ("gfx90a:xnack-:sramecc+", "hip", "gfx90a", ("sramecc+", "xnack-"), None),
    ("gfx942_304", "hip", "gfx942", (), 304),
    ("gfx1100", "hip", "gfx1100", (), None),
    ("ocl-3f9a1c2b7d10_2", "opencl", "ocl-3f9a1c2b7d10", (), 2),
])
def test_target_parse_round_trips(text, backend, arch, features, cu):
    t = Target.parse(text)
    assert (t.backend, t.arch, t.features, t.cu) == (backend, arch, features, cu)
    assert Target.parse(str(t)) == t


@pytest.mark.parametrize("bad", ["", "sm", "sm_", "gfx", "foo_12", "sm_90_", "gfx90a_0", "gfx90a:xnack", "sm_90 132"])
def test_malformed_targets_are_refused_with_an_example(bad):
    with pytest.raises(BundleNameError, match="malformed|unknown|positive") as info:
        Target.parse(bad)
    assert "e.g." in info.value.remedy or "give a positive" in info.value.remedy


@pytest.mark.parametrize("name,arch,cu,user", [
    ("gfx90a_110.kdb", "gfx90a", 110, False),
    ("gfx906.kdb", "gfx906", None, False),
    ("sm_90_132.kdb", "sm_90", 132, False),
    ("sm_90.kdb", "sm_90", None, False),
    ("/some/dir/gfx942_304.ukdb", "gfx942", 304, True),
])
def test_file_names_parse(name, arch, cu, user):
    parsed = parse_bundle_file_name(name)
    assert (parsed.arch, parsed.cu, parsed.user) == (arch, cu, user)
    suffix = ".ukdb" if user else ".kdb"
    assert bundle_file_name(arch, cu, suffix) == name.rsplit("/", 1)[-1]


@pytest.mark.parametrize("bad", ["gfx90a_110.db", "notes.kdb", "sm_90_132", "gfx90a_x.kdb"])
def test_bad_file_names(bad):
    with pytest.raises(BundleNameError, match="not a bundle name"):
        parse_bundle_file_name(bad)


def test_target_bundle_names_and_arch_wide():
    t = Target.parse("gfx90a:xnack-_110")
    assert t.bundle_name() == "gfx90a_110.kdb"
    assert t.arch_wide().bundle_name() == "gfx90a.kdb"
    assert t.built_bundle_name() == t.arch_wide().built_bundle_name() == "gfx90a.kdb"
    assert t.full_arch == "gfx90a:xnack-"


def test_accepts_says_why_not():
    device = Target.parse("gfx90a:xnack-_110")
    assert device.accepts(Target.parse("gfx90a_110")) is None
    assert device.accepts(Target.parse("gfx90a")) is None
    assert device.accepts(Target.parse("gfx90a:xnack-")) is None
    assert "104 CUs" in device.accepts(Target.parse("gfx90a_104"))
    assert "xnack+" in device.accepts(Target.parse("gfx90a:xnack+"))
    assert "arch" in device.accepts(Target.parse("gfx942"))
    assert "backend" in device.accepts(Target.parse("sm_90"))


def test_backend_must_match_arch():
    with pytest.raises(BundleNameError):
        Target("cuda", "gfx90a")


def test_targets_mixing_arch_wide_and_per_cu_sort():
    mixed = [Target.parse(t) for t in ("gfx942_304", "gfx90a_110", "gfx90a", "sm_90_132", "gfx90a_104", "sm_90")]
    assert [str(t) for t in sorted(mixed)] == ["sm_90", "sm_90_132", "gfx90a", "gfx90a_104", "gfx90a_110", "gfx942_304"]
    assert Target.parse("gfx90a") < Target.parse("gfx90a_104") and max(mixed) == Target.parse("gfx942_304")
