"""Tests of runtime.env: the KDB_* registry, parsing, fallbacks and typo detection."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kdbkit.kdb import Target
from kdbkit.runtime import env
from kdbkit.runtime.env import CheckNumerics, EnvVar

# DESIGN.md, "Environment variables", plus the device overrides and KDB_DISABLE_PREFETCH; kept here rather than parsed
# from ../shared/DESIGN.md because CI checks out the repository alone.
EXPECTED = [
    "KDB_ENABLE_LOGGING", "KDB_ENABLE_LOGGING_CMD", "KDB_LOG_LEVEL", "KDB_ENABLE_LOGGING_MPMT",
    "KDB_ENABLE_LOGGING_ELAPSED_TIME", "KDB_DISABLE_CACHE", "KDB_CUSTOM_CACHE_DIR",
    "KDB_USER_DB_PATH", "KDB_SYSTEM_DB_PATH", "KDB_DISABLE_JIT", "KDB_DEBUG_FIND_ONLY_SOLVER", "KDB_CHECK_NUMERICS",
    "KDB_COMPILE_PARALLEL_LEVEL", "KDB_DEVICE_ARCH", "KDB_DEVICE_CU", "KDB_BACKEND", "KDB_KERNEL_PATH",
    "KDB_CLI_TRACEBACK", "KDB_DISABLE_PREFETCH",
    "KDB_CACHE_SOURCES",  # the lookup chain's tiers (issue 26)
    "KDB_CACHE_POLICY", "KDB_CACHE_MAXSIZE",  # what may be read, written, compiled; the cache's bound (issue 27)
    "KDB_REMOTE_CACHE",  # the cluster cache (issue 28)
    "KDB_REMOTE_SIGNING_KEY", "KDB_REMOTE_TRUSTED_KEYS",  # signed cluster-cache entries (issue 28)
    "KDB_TRUSTED_KEYS",  # system bundles only from signed kernel packages (issue 29)
    "KDB_REMOTE_TIMEOUT_MS", "KDB_REMOTE_BACKOFF", "KDB_REMOTE_LEASE_TTL",  # its outage and lease settings
    "KDB_REMOTE_PASSWORD_FILE",  # its password kept out of the environment
    "KDB_DEVICE_RUNTIME",  # preflight against another machine's driver (issue 29)
    "KDB_COMPILE_LOCK_WAIT",  # the bound on waiting for another compile of a program (issue 27)
    "KDB_CONV_ALLOW_TF32",  # fp32 convolutions in TF32 only when asked (issue 30)
]
TRUE = ["1", "on", "yes", "true", "enable", "enabled"]
FALSE = ["0", "off", "no", "false", "disable", "disabled"]
REPO = Path(__file__).resolve().parents[2]
# A per-solver switch (on unless switched off), as runtime/solver.py declares them.
SWITCH = EnvVar("KDB_DEBUG_TEST_SOLVER", "bool", True, "Set to 0 to exclude the test solver. Default: enabled.")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, fresh_log):
    """No KDB_* from the outer shell, and a fresh once-only warning memory per test."""
    for name in [n for n in os.environ if n.startswith("KDB_")]:
        monkeypatch.delenv(name)
    fresh_log()


@pytest.fixture
def warnings_seen(capsys):
    """The kdbkit warning lines written since the last call."""
    def read() -> list[str]:
        return [line for line in capsys.readouterr().err.splitlines() if line.startswith("kdbkit warning: ")]
    return read


@pytest.fixture
def _no_warning(warnings_seen):
    def call(func, *args):
        result = func(*args)
        assert warnings_seen() == []
        return result
    return call


# The registry ---------------------------------------------------------------------------------

def test_registry_lists_exactly_the_documented_variables():
    names = [var.name for var in env.VARIABLES]
    assert len(names) == len(set(names)), "duplicate entries"
    assert sorted(names) == sorted(EXPECTED)


@pytest.mark.parametrize("var", env.VARIABLES, ids=lambda v: v.name)
def test_every_variable_has_a_one_line_meaning_with_its_default(var):
    assert var.kind in env.KINDS
    assert var.meaning and "\n" not in var.meaning and len(var.meaning) < 160
    assert "Default:" in var.meaning


@pytest.mark.parametrize("var", env.VARIABLES, ids=lambda v: v.name)
def test_unset_gives_the_default_without_warning(var, _no_warning):
    expected = list(var.default) if var.kind == "pathlist" else var.default
    assert _no_warning(env.value, var.name) == expected


def test_kinds_and_defaults_of_note():
    kinds = {var.name: (var.kind, var.default) for var in env.VARIABLES}
    assert kinds["KDB_SYSTEM_DB_PATH"][0] == "pathlist"
    assert kinds["KDB_CHECK_NUMERICS"][0] == "flags"
    assert kinds["KDB_COMPILE_PARALLEL_LEVEL"] == ("int", 20)
    assert kinds["KDB_LOG_LEVEL"] == ("int", 0)


def test_every_name_is_declared_once_with_one_meaning():
    """The registry and the solvers' switches together, as `kdb env` lists them: KDB_DEBUG_CONV_DIRECT
    and KDB_DEBUG_CONV_IMPLICIT_GEMM were both a family switch (read nowhere) and a solver's own."""
    from kdbkit.runtime.solver import switches

    names = [var.name for var in (*env.VARIABLES, *switches())]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
    assert "KDB_DEBUG_CONV_FFT" not in names  # kdbkit has no FFT convolution
    # As MIOPEN_DEBUG_*: a solver is on unless its switch is 0.
    assert all((v.kind, v.default) == ("bool", True) for v in switches())


def test_envvar_is_frozen_and_validated():
    var = env.VARIABLES[0]
    with pytest.raises(AttributeError):
        var.default = True  # type: ignore[misc]
    with pytest.raises(ValueError):
        EnvVar("KDB_X", "float", 0, "m")
    with pytest.raises(ValueError):
        EnvVar("MIOPEN_X", "bool", False, "m")


def test_check_numerics_bits_match_miopen():
    assert [int(f) for f in (CheckNumerics.INFO, CheckNumerics.WARN, CheckNumerics.THROW,
                             CheckNumerics.ABORT, CheckNumerics.STATS)] == [1, 2, 4, 8, 16]


# Booleans ------------------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", TRUE)
@pytest.mark.parametrize("variant", [str.lower, str.upper, str.title, lambda s: f"  {s}\t"])
def test_true_spellings(monkeypatch, spelling, variant, _no_warning):
    monkeypatch.setenv("KDB_DISABLE_JIT", variant(spelling))
    assert _no_warning(env.get_bool, "KDB_DISABLE_JIT") is True


@pytest.mark.parametrize("spelling", FALSE)
@pytest.mark.parametrize("variant", [str.lower, str.upper, str.title, lambda s: f" {s} "])
def test_false_spellings(monkeypatch, spelling, variant, _no_warning):
    monkeypatch.setenv(SWITCH.name, variant(spelling))
    assert _no_warning(env.get_bool, SWITCH) is False


def test_empty_bool_is_unset(monkeypatch, _no_warning):
    monkeypatch.setenv(SWITCH.name, "  ")
    assert _no_warning(env.get_bool, SWITCH) is True


@pytest.mark.parametrize("var, default", [("KDB_DISABLE_JIT", False), (SWITCH, True)], ids=["registered", "switch"])
def test_bad_bool_warns_once_in_one_line_and_uses_default(monkeypatch, var, default, warnings_seen, _no_warning):
    name = env.lookup(var).name
    monkeypatch.setenv(name, "maybe")
    assert env.get_bool(var) is default
    (text,) = warnings_seen()  # one clean line: no file name, no source line, no "UserWarning"
    assert text.startswith(f"kdbkit warning: {name}='maybe' is not understood (accepted: ")
    assert all(spelling in text for spelling in TRUE + FALSE) and "Warning" not in text
    assert _no_warning(env.get_bool, var) is default  # second read: silent
    monkeypatch.setenv(name, "perhaps")  # another bad value is news: warn again
    env.get_bool(var)
    assert "perhaps" in warnings_seen()[0]


# Integers and flags --------------------------------------------------------------------------

def test_int_parses_and_strips(monkeypatch):
    monkeypatch.setenv("KDB_COMPILE_PARALLEL_LEVEL", " 8 ")
    assert env.get_int("KDB_COMPILE_PARALLEL_LEVEL") == 8
    monkeypatch.setenv("KDB_DEVICE_CU", "132")
    assert env.get_int("KDB_DEVICE_CU") == 132


@pytest.mark.parametrize("name, text, default", [
    ("KDB_COMPILE_PARALLEL_LEVEL", "eight", 20), ("KDB_COMPILE_PARALLEL_LEVEL", "2.5", 20),
    ("KDB_COMPILE_PARALLEL_LEVEL", "0", 20), ("KDB_LOG_LEVEL", "9", 0), ("KDB_LOG_LEVEL", "-1", 0),
    ("KDB_DEVICE_CU", "lots", None), ("KDB_CHECK_NUMERICS", "0x40", CheckNumerics.NONE),
    ("KDB_CHECK_NUMERICS", "junk", CheckNumerics.NONE),
])
def test_bad_int_warns_once_and_uses_default(monkeypatch, name, text, default, warnings_seen, _no_warning):
    monkeypatch.setenv(name, text)
    assert env.get_int(name) == default
    (message,) = warnings_seen()
    assert name in message and repr(text) in message
    assert ("an integer" in message) or ("bit flags" in message), "should say what is accepted"
    assert _no_warning(env.get_int, name) == default


@pytest.mark.parametrize("text, flags", [
    ("0x14", CheckNumerics.THROW | CheckNumerics.STATS), ("0X02", CheckNumerics.WARN),
    ("5", CheckNumerics.INFO | CheckNumerics.THROW), ("0", CheckNumerics.NONE), ("31", 0x1F),
])
def test_check_numerics_flags(monkeypatch, text, flags, _no_warning):
    monkeypatch.setenv("KDB_CHECK_NUMERICS", text)
    value = _no_warning(env.get_int, "KDB_CHECK_NUMERICS")
    assert isinstance(value, CheckNumerics) and value == flags


# Strings and paths ---------------------------------------------------------------------------

def test_str_choices_and_targets(monkeypatch, warnings_seen):
    monkeypatch.setenv("KDB_DEBUG_FIND_ONLY_SOLVER", " ConvDirect ")
    assert env.get_str("KDB_DEBUG_FIND_ONLY_SOLVER") == "ConvDirect"
    monkeypatch.setenv("KDB_DEVICE_ARCH", " gfx942_304 ")
    assert env.get_target("KDB_DEVICE_ARCH") == Target("hip", "gfx942", (), 304)
    monkeypatch.setenv("KDB_BACKEND", "CUDA")
    assert env.get_choices("KDB_BACKEND") == ("cuda",)
    monkeypatch.setenv("KDB_BACKEND", "opencl, cuda")
    assert env.get_choices("KDB_BACKEND") == ("cuda", "opencl")  # discovery order, whatever was written
    assert warnings_seen() == []
    monkeypatch.setenv("KDB_BACKEND", "vulkan")
    assert env.get_choices("KDB_BACKEND") == ()
    monkeypatch.setenv("KDB_DEVICE_ARCH", "vega")
    assert env.get_target("KDB_DEVICE_ARCH") is None
    backend, arch = warnings_seen()
    assert "KDB_BACKEND='vulkan'" in backend and "cuda, hip, opencl" in backend
    assert "KDB_DEVICE_ARCH='vega'" in arch and "malformed target 'vega'" in arch


def test_each_variable_has_one_parser():
    # Nothing outside env.py reads a KDB_* variable from the environment itself, nor keeps its
    # name in a constant to do so.
    direct = re.compile(r"""(?:environ(?:\.get)?\s*[(\[]|getenv\()\s*["']KDB_""")
    alias = re.compile(r"""^\s*\w+\s*=\s*["']KDB_[A-Z_]+["']\s*$""", re.MULTILINE)
    for folder in ("runtime", "kdb", "packager"):
        for path in (REPO / folder).rglob("*.py"):
            if path.name != "env.py":
                text = path.read_text()
                assert not direct.search(text) and not alias.search(text), path


# Accessor misuse, generic access, per-solver switches -----------------------------------------

def test_wrong_accessor_and_unknown_name_raise():
    with pytest.raises(TypeError, match="get_int"):
        env.get_bool("KDB_LOG_LEVEL")
    with pytest.raises(TypeError, match="get_pathlist"):
        env.get_path("KDB_SYSTEM_DB_PATH")
    with pytest.raises(KeyError, match="did you mean KDB_DISABLE_JIT"):
        env.get_bool("KDB_DISABLE_JITT")


def test_value_dispatches_on_kind(monkeypatch):
    monkeypatch.setenv("KDB_ENABLE_LOGGING", "yes")
    monkeypatch.setenv("KDB_LOG_LEVEL", "6")
    monkeypatch.setenv("KDB_DEBUG_FIND_ONLY_SOLVER", "ConvDirectNaive")
    assert env.value("KDB_ENABLE_LOGGING") is True
    assert env.value("KDB_LOG_LEVEL") == 6
    assert env.value("KDB_DEBUG_FIND_ONLY_SOLVER") == "ConvDirectNaive"


def test_environment_is_read_at_call_time(monkeypatch):
    monkeypatch.setenv("KDB_DISABLE_CACHE", "1")
    assert env.get_bool("KDB_DISABLE_CACHE") is True
    monkeypatch.setenv("KDB_DISABLE_CACHE", "0")
    assert env.get_bool("KDB_DISABLE_CACHE") is False


def test_a_switch_declared_elsewhere_uses_the_same_accessors(monkeypatch):
    switch = EnvVar("KDB_DEBUG_CONV_DIRECT_NAIVE", "bool", True, "Naive direct. Default: on.")
    assert env.get_bool(switch) is True
    monkeypatch.setenv(switch.name, "off")
    assert env.get_bool(switch) is False
    assert env.snapshot(extra=[switch])[-1] == (switch, "off", False, None)


# snapshot and typos --------------------------------------------------------------------------

def test_snapshot_covers_every_variable_with_raw_parsed_and_problem(monkeypatch, warnings_seen):
    monkeypatch.setenv("KDB_LOG_LEVEL", " 5")
    monkeypatch.setenv("KDB_BACKEND", "nonsense")
    rows = env.snapshot()
    assert warnings_seen() == []  # problems are returned for `kdb env` to show, not logged
    assert [row[0].name for row in rows] == [var.name for var in env.VARIABLES]
    assert sorted(row[0].name for row in rows) == sorted(EXPECTED)
    by_name = {var.name: (raw, parsed, problem) for var, raw, parsed, problem in rows}
    assert by_name["KDB_LOG_LEVEL"] == (" 5", 5, None)
    raw, parsed, problem = by_name["KDB_BACKEND"]
    assert (raw, parsed) == ("nonsense", ())  # bad value: raw shown, default used
    assert problem.startswith("KDB_BACKEND='nonsense' is not understood")
    assert by_name["KDB_DISABLE_JIT"] == (None, False, None)


def test_unknown_variables_are_listed_with_a_suggestion(monkeypatch):
    monkeypatch.setenv("KDB_DISABLE_JITT", "1")
    monkeypatch.setenv("KDB_LOG_LEVLE", "5")
    monkeypatch.setenv("KDB_SOMETHING_ELSE", "1")
    monkeypatch.setenv("KDB_DISABLE_JIT", "1")  # registered: not listed
    monkeypatch.setenv("MIOPEN_DISABLE_JITT", "1")  # not ours: not listed
    assert env.unknown_kdb_variables() == [
        "KDB_DISABLE_JITT (did you mean KDB_DISABLE_JIT?)",
        "KDB_LOG_LEVLE (did you mean KDB_LOG_LEVEL?)",
        "KDB_SOMETHING_ELSE",
    ]
    assert env.unknown_kdb_variables(known=["KDB_SOMETHING_ELSE"])[-1].startswith("KDB_LOG")


def test_nothing_listed_when_environment_is_clean():
    assert env.unknown_kdb_variables() == []


def test_import_reads_nothing_and_warns_nothing():
    # A bad value at import time must not warn: only reading the variable does.
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", "import kdbkit.runtime.env, kdbkit.runtime.handle"], cwd=REPO,
        env={**os.environ, "KDB_DISABLE_JIT": "maybe"}, capture_output=True, text=True, check=False)
    assert out.returncode == 0 and out.stderr == "", out.stderr


def test_raw_values_are_the_unparsed_text_or_none(monkeypatch):
    monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", " ~/x ")
    monkeypatch.delenv("KDB_DISABLE_CACHE", raising=False)
    assert env.raw_values("KDB_CUSTOM_CACHE_DIR", "KDB_DISABLE_CACHE") == (b" ~/x ", None) or \
        env.raw_values("KDB_CUSTOM_CACHE_DIR", "KDB_DISABLE_CACHE") == (" ~/x ", None)
    monkeypatch.setenv("KDB_DISABLE_CACHE", "1")
    assert env.raw_values("KDB_DISABLE_CACHE") in ((b"1",), ("1",))
    with pytest.raises(KeyError, match="did you mean KDB_DISABLE_CACHE"):
        env.raw_values("KDB_DISABLE_CACH")


@pytest.mark.parametrize("raw, size", [("4G", 4 << 30), ("4GiB", 4 << 30), ("512m", 512 << 20), ("1.5K", 1536),
                                       ("0", 0), ("100000", 100_000), (" 2T ", 2 << 40)])
def test_sizes_take_binary_suffixes(monkeypatch, raw, size):
    monkeypatch.setenv("KDB_CACHE_MAXSIZE", raw)
    assert env.get_size("KDB_CACHE_MAXSIZE") == size


@pytest.mark.parametrize("raw", ["-1", "lots", "nan", "inf", "9" * 30, "4Q", "G"])
def test_a_size_not_understood_warns_and_keeps_the_default(monkeypatch, warnings_seen, raw):
    monkeypatch.setenv("KDB_CACHE_MAXSIZE", raw)
    assert env.get_size("KDB_CACHE_MAXSIZE") == 4 << 30
    (line,) = warnings_seen()
    assert "KDB_CACHE_MAXSIZE" in line and "K, M, G or T" in line


def test_an_overlong_path_list_entry_is_skipped_with_one_warning(monkeypatch, tmp_path, warnings_seen):
    """Once ENAMETOOLONG out of the system bundle search and the kernel search path."""
    from kdbkit.runtime import paths
    from kdbkit.runtime.kernel_sources import KernelSearchPath

    overlong, too_long_a_name = "/tmp/" + "a" * 5000, str(tmp_path / ("b" * 300))
    monkeypatch.setenv("KDB_SYSTEM_DB_PATH", os.pathsep.join([overlong, str(tmp_path), too_long_a_name]))
    monkeypatch.setenv("KDB_KERNEL_PATH", os.pathsep.join([too_long_a_name, str(tmp_path)]))
    assert env.get_pathlist("KDB_SYSTEM_DB_PATH") == [tmp_path]
    assert [d.path for d in paths.system_db_dirs()][0] == tmp_path
    assert KernelSearchPath().read("activation.c").digest
    seen = warnings_seen()
    assert len(seen) == 3 and all("longer than any path" in line for line in seen)
    env.get_pathlist("KDB_SYSTEM_DB_PATH")
    assert warnings_seen() == []  # once per value
