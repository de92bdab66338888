"""The arch table and the typed arch: every arch the table knows parses, round-trips through
targets and bundle names, and belongs to its backend; well-spelled archs with no row parse with
facts derived by rule or marked unknown; registration adds and removes a row."""

from __future__ import annotations

import pytest

from kdbkit.kdb.arch import (
    BACKENDS,
    EM_AMDGPU,
    EM_CUDA,
    MATRIX_INSTRUCTIONS,
    ArchFacts,
    arch_row,
    known_archs,
    parse_arch,
    register_arch,
    spelling_of,
    unregister_arch,
)
from kdbkit.kdb.errors import BundleNameError
from kdbkit.kdb.target import Target, bundle_file_name, parse_bundle_file_name

ROWS = known_archs()
SPELLINGS = [row.name + suffix for row in ROWS for suffix in ("", *row.suffixes)]


def test_the_table_covers_what_nvrtc_and_the_repo_name():
    names = {row.name for row in ROWS}
    nvrtc_13 = {"sm_75", "sm_80", "sm_86", "sm_87", "sm_88", "sm_89", "sm_90", "sm_100", "sm_103", "sm_107", "sm_110",
                "sm_120", "sm_121"}
    repo = {"gfx900", "gfx906", "gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950", "gfx1010", "gfx1030",
            "gfx1100", "gfx1101", "gfx1102", "gfx1150", "gfx1151", "gfx1200", "gfx1201"}
    assert nvrtc_13 | {"sm_70", "sm_72"} <= names and repo <= names
    assert len(names) == len(ROWS)  # one row per arch
    assert all(row.matrix <= MATRIX_INSTRUCTIONS.keys() for row in ROWS)
    assert BACKENDS == ("cuda", "hip", "opencl")


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_known_arch_parses_and_round_trips(spelling):
    arch = parse_arch(spelling)
    assert arch.known and arch.spelling == spelling == str(arch)
    assert arch.backend == Target.parse(spelling).backend
    assert arch.elf_machine == {"cuda": EM_CUDA, "hip": EM_AMDGPU}[arch.backend]
    assert arch.wave_size in (32, 64) and (arch.lds_bytes is None or arch.lds_bytes >= 48 * 1024)
    for cu in (None, 1, 304):
        target = Target(arch.backend, spelling, cu=cu)
        assert Target.parse(str(target)) == target and target.arch_facts == arch
        for suffix in (".kdb", ".ukdb"):
            name = target.bundle_name(suffix)
            parsed = parse_bundle_file_name(name)
            assert (parsed.arch, parsed.cu, parsed.backend) == (spelling, cu, arch.backend)
            assert bundle_file_name(parsed.arch, parsed.cu, suffix) == name


@pytest.mark.parametrize("text, name, suffix, features", [
    ("gfx942:xnack-", "gfx942", "", ("xnack-",)),
    ("gfx90a:xnack-:sramecc+", "gfx90a", "", ("sramecc+", "xnack-")),
    ("sm_90a", "sm_90", "a", ()),
    ("sm_120f", "sm_120", "f", ()),
])
def test_suffixes_and_features_keep_the_arch_and_its_facts(text, name, suffix, features):
    arch = parse_arch(text)
    assert (arch.name, arch.suffix, arch.features) == (name, suffix, features)
    assert arch.matrix == parse_arch(name).matrix and arch.known
    target = Target.parse(text + "_110")
    assert target.arch_facts == arch and str(target) == f"{':'.join((name + suffix, *features))}_110"


def test_facts_solvers_ask():
    assert parse_arch("sm_90a").has("wgmma") and parse_arch("sm_90").has("wgmma")
    assert not parse_arch("sm_100a").has("wgmma") and parse_arch("sm_100a").has("tcgen05")
    assert parse_arch("sm_80").has("mma.sync") and not parse_arch("sm_75").has("mma.sync")
    assert parse_arch("gfx942:xnack-").has("mfma") and parse_arch("gfx1100").has("wmma")
    assert not parse_arch("gfx1030").has("wmma") and not parse_arch("gfx1100").has("mfma")
    assert parse_arch("sm_90a").at_least("sm_80") and parse_arch("sm_121f").at_least("sm_120")
    assert not parse_arch("sm_75").at_least("sm_80") and not parse_arch("gfx942").at_least("sm_70")
    assert parse_arch("sm_90a").sm == 90 and parse_arch("gfx90a").gfx == "90a" and parse_arch("gfx90a").sm is None
    assert (parse_arch("gfx942").wave_size, parse_arch("gfx1201").wave_size) == (64, 32)
    assert (parse_arch("gfx942").lds_bytes, parse_arch("gfx950").lds_bytes) == (64 * 1024, 160 * 1024)
    assert parse_arch("ocl-3f9a1c2b7d10").elf_machine is None
    with pytest.raises(ValueError, match="unknown matrix instruction 'wgma'"):
        parse_arch("sm_90").has("wgma")  # a typo is a bug, not a silent "no"
    with pytest.raises(ValueError, match="compares CUDA archs"):
        parse_arch("gfx942").at_least("gfx90a")


@pytest.mark.parametrize("text, backend, family, wave, matrix", [
    ("sm_130", "cuda", "sm_13x", 32, {"mma.sync"}),  # PTX keeps mma.sync from sm_80 on
    ("sm_130a", "cuda", "sm_13x", 32, {"mma.sync"}),
    ("sm_10", "cuda", "sm_1x", 32, set()),
    ("sm_89a", "cuda", "Ada", 32, {"mma.sync"}),  # a row, but no "a" variant: not known as spelt
    ("gfx1250", "hip", "gfx12", None, set()),
    ("gfx000:xnack-", "hip", "gfx0", None, set()),
])
def test_well_spelled_archs_with_no_row_parse_with_rules_or_unknowns(text, backend, family, wave, matrix):
    arch = parse_arch(text)
    assert (arch.backend, arch.family, arch.wave_size, set(arch.matrix), arch.known) == (backend, family, wave, matrix,
                                                                                        False)
    assert Target.parse(text + "_8").arch_facts == arch


@pytest.mark.parametrize("bad", ["", "sm", "sm_", "sm_90x", "gfx", "gfxzz", "ocl-12", "cuda", "gfx90a:xnack", "90"])
def test_misspelt_archs_are_refused_with_examples(bad):
    with pytest.raises(BundleNameError) as info:
        parse_arch(bad)
    assert "sm_90" in str(info.value) or "features" in str(info.value)


def test_registering_a_row_adds_an_arch_and_unregistering_removes_it():
    assert arch_row("gfx1250") is None and not parse_arch("gfx1250").known
    register_arch(ArchFacts("gfx1250", 32, 320 * 1024, frozenset({"wmma"}), (), "gfx12.5"))
    try:
        arch = Target.parse("gfx1250:xnack-_64").arch_facts
        assert arch.known and arch.has("wmma") and arch.lds_bytes == 320 * 1024 and arch.family == "gfx12.5"
        assert "gfx1250" in {row.name for row in known_archs("hip")}
        with pytest.raises(BundleNameError, match="in the table already"):
            register_arch(ArchFacts("gfx1250", 32, None))
    finally:
        unregister_arch("gfx1250")
    assert not parse_arch("gfx1250").known
    for bad, match in [(ArchFacts("gfx1250", 32, None, frozenset({"tensor"})), "unknown matrix"),
                       (ArchFacts("sm_130a", 32, None), "suffix or features"),
                       (ArchFacts("tpu_1", 32, None), "unknown arch")]:
        with pytest.raises(BundleNameError, match=match):
            register_arch(bad)
    assert arch_row("gfx1250") is None and arch_row("sm_130") is None


def test_each_backend_spells_its_archs():
    assert spelling_of("cuda").regex.fullmatch("sm_90a") and spelling_of("hip").full_regex.fullmatch("gfx90a:xnack-")
    assert not spelling_of("hip").regex.fullmatch("gfx90a:xnack-") and not spelling_of("cuda").regex.fullmatch("gfx942")
    with pytest.raises(BundleNameError, match="unknown backend 'tpu'"):
        spelling_of("tpu")
