"""Every error the CLI can meet is a kdbkit error, printed as one line with its remedy, never a traceback."""

from __future__ import annotations

import ast
import re
import shlex
import sqlite3
from pathlib import Path

import pytest

from kdbkit.kdb import KdbError, Target, write_bundle
from kdbkit.kdb.bundle import _db_error
from kdbkit.kdb.errors import BundleBusyError, BundleWriteError, CorruptBundleError, NotABundleError
from kdbkit.runtime.cli.app import app
from tests.runtime.cli.test_db_commands import _commands
from tests.kdb.conftest import fake_binary
from tests.runtime.chain_fixtures import chain_device, isolated  # noqa: F401

ROOT = Path(__file__).resolve().parents[3]


def _one_error_line(err: str) -> str:
    """The error line; kdbkit's own warning lines may come before it."""
    lines = [line for line in err.strip().splitlines() if not line.startswith("kdbkit warning: ")]
    assert lines and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def pocl(isolated, monkeypatch, chain_device):
    monkeypatch.setenv("KDB_BACKEND", chain_device.backend)
    return isolated


@pytest.mark.parametrize("defines, problem", [
    (["=3"], "malformed define '-D=3': no valid macro name"),
    ([""], "-D at the end of the options names no macro"),
    (["A=1", "A=2"], "macro A is defined twice ('1' and '2')"),
    (["1X=2"], "malformed define '-D1X=2'"),
])
def test_bad_options_are_one_line(kdb, pocl, defines, problem):
    code, _, err = kdb("resolve", "activation.c", *[a for d in defines for a in ("-D", d)])
    line = _one_error_line(err)
    assert code == 1 and len(err.strip().splitlines()) == 1  # the error alone: nothing was looked up
    assert problem in line and "write each define as -DNAME or -DNAME=VALUE" in line or "keep one" in line


def test_a_compile_failure_is_one_line_then_the_compilers_log(kdb, pocl, tmp_path):
    (tmp_path / "broken.c").write_text('#include "kdb_compat.h"\nKDB_KERNEL void broken(KDB_GLOBAL float* x)'
                                       ' { x[0] = not_declared; }\n')
    code, _, err = kdb("resolve", "broken.c", "--kernel-path", tmp_path)
    line = _one_error_line(err)
    assert code == 1 and "broken.c failed to compile" in line and "not_declared" in line
    assert "the compiler's log follows" in line
    assert "not_declared" in err.split(line, 1)[1]  # the log, below the one line


@pytest.mark.parametrize("define, refused", [("X=1 -fbogus", "-fbogus"), ("A=1 2", "2")])
def test_options_the_opencl_compiler_refuses_are_said_once_with_the_fix(kdb, isolated, monkeypatch, opencl_backend,
                                                                         define, refused):
    monkeypatch.setenv("KDB_BACKEND", "opencl")  # PoCL's refusal, whichever backend the suite runs
    code, _, err = kdb("resolve", "activation.c", "-D", define)
    line = _one_error_line(err)
    assert code == 1 and f"refused the options '-D{define}' (Invalid build option: {refused})" in line
    assert "fix the option" in line and "fix the source" not in line
    assert err.count("INVALID_BUILD_OPTIONS") == 1, err  # pyopencl's log says it three times


@pytest.fixture
def bundle(tmp_path):
    return write_bundle(tmp_path / "sm_90_132.kdb", Target.parse("sm_90_132"),
                        [("k.c.o", "-DN=1 -mcpu=sm_90", fake_binary(1)), ("k.c.o", "-DN=2 -mcpu=sm_90", fake_binary(2))],
                        compiler="nvrtc 13.0", binary_format="cubin", dictionary=False)


def _tamper(path, sql, *params):
    conn = sqlite3.connect(path)
    conn.execute(sql, params)
    conn.commit()
    conn.close()


@pytest.mark.parametrize("sql, params, problem", [
    ("UPDATE kern_db SET kernel_blob = ? WHERE kernel_args LIKE '-DN=1%'", (b"\x28\xb5\x2f\xfd not zstd at all",),
     "is corrupt"),  # a codec failure
    ("UPDATE kern_db SET kernel_hash = ? WHERE kernel_args LIKE '-DN=1%'", ("0" * 32,),
     "does not match kernel_hash"),  # a hash failure
])
def test_codec_and_hash_failures_are_one_line(kdb, bundle, tmp_path, sql, params, problem):
    _tamper(bundle, sql, *params)
    code, _, err = kdb("db", "extract", bundle, "k.c.o", "--args", "-DN=1 -mcpu=sm_90", "-o", tmp_path / "x.bin")
    line = _one_error_line(err)
    assert code == 1 and problem in line and f"kdb db verify {bundle}" in line


def test_an_unknown_hash_in_the_metadata_is_one_line(kdb, bundle):
    _tamper(bundle, "UPDATE kdb_meta SET value = 'crc7' WHERE key = 'hash'")
    code, _, err = kdb("db", "info", bundle)
    assert code == 1 and "unknown codec 'zstd' or hash 'crc7'" in _one_error_line(err)


@pytest.mark.parametrize("damage, problem", [
    (lambda p: p.write_bytes(p.read_bytes()[:1000]), "not a bundle|damaged"),  # truncated inside the header page
    (lambda p: p.write_bytes(b"garbage" * 1000), "not a bundle"),
])
def test_sqlite_errors_are_one_line(kdb, bundle, damage, problem):
    damage(bundle)
    code, _, err = kdb("db", "ls", bundle)
    assert code == 1 and re.search(problem, _one_error_line(err))


def test_verify_on_a_truncated_file_does_not_send_the_user_back_to_verify(kdb, bundle):
    data = bundle.read_bytes()
    bundle.write_bytes(data[: len(data) // 2])
    code, out, err = kdb("db", "verify", bundle)
    assert code == 1 and "FAIL" in out
    assert "kdb db verify" not in out + err  # the advice to run the very command that is running
    assert "rebuild them, or reinstall the package" in err


def test_writing_where_nothing_can_be_written_is_one_line(kdb, bundle):
    code, _, err = kdb("db", "merge", "/proc/kdbkit-test/merged.kdb", bundle)
    assert code == 1 and "/proc/kdbkit-test" in _one_error_line(err)


def test_a_bug_is_still_one_line_and_says_how_to_see_more(kdb, monkeypatch):
    from kdbkit.runtime import doctor

    monkeypatch.setattr(doctor, "report", lambda: 1 / 0)
    code, _, err = kdb("doctor")
    line = _one_error_line(err)
    assert code == 1 and "internal error (ZeroDivisionError" in line and "KDB_CLI_TRACEBACK=1" in line


def test_an_unknown_option_is_one_line(kdb):
    code, _, err = kdb("db", "ls", "x.kdb", "--frobnicate")
    assert code == 2 and _one_error_line(err) == "error: No such option: --frobnicate (see `kdb db ls --help`)"


# -- classification by code, and calls that fail ----------------------------------------------


def _sqlite_error(code: int, text: str) -> sqlite3.Error:
    exc = sqlite3.OperationalError(text)
    exc.sqlite_errorcode, exc.sqlite_errorname = code, "CODE"
    return exc


@pytest.mark.parametrize("code, text, kind", [
    (sqlite3.SQLITE_BUSY, "database disk image is malformed", BundleBusyError),  # the code wins, not the words
    (sqlite3.SQLITE_CORRUPT, "database is locked", CorruptBundleError),
    (sqlite3.SQLITE_NOTADB, "some other text", NotABundleError),
    (sqlite3.SQLITE_FULL, "x", BundleWriteError), (sqlite3.SQLITE_READONLY, "x", BundleWriteError),
    (sqlite3.SQLITE_CANTOPEN, "x", BundleWriteError), (sqlite3.SQLITE_IOERR | (3 << 8), "x", BundleWriteError),
    (sqlite3.SQLITE_LOCKED, "x", BundleBusyError),
])
def test_sqlite_errors_are_classified_by_their_code(code, text, kind):
    error = _db_error(Path("/x/sm_90.kdb"), _sqlite_error(code, text))
    assert type(error) is kind and error.remedy


def test_a_failed_cuda_call_is_a_device_call_error_not_backend_unavailable():
    from kdbkit.runtime.backends import cuda
    from kdbkit.runtime.errors import BackendUnavailableError, DeviceCallError

    class Err:
        name = "CUDA_ERROR_OUT_OF_MEMORY"

    class Driver:
        class CUresult:
            CUDA_SUCCESS = object()

        @staticmethod
        def cuGetErrorString(err):
            return None, b"out of memory"

    with pytest.raises(DeviceCallError) as info:
        cuda._check((Err(),), "cuMemAlloc", Driver)
    assert not isinstance(info.value, BackendUnavailableError)
    assert "cuMemAlloc failed (CUDA_ERROR_OUT_OF_MEMORY: out of memory)" in info.value.problem
    assert info.value.remedy == "free device memory, or use smaller tensors"


def test_every_error_class_is_a_kdbkit_error_exported_by_kdbkit():
    import kdbkit
    from kdbkit.kdb import errors as kdb_errors
    from kdbkit.runtime import errors as runtime_errors

    for module in (kdb_errors, runtime_errors):
        for name, value in vars(module).items():
            if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == module.__name__:
                assert issubclass(value, KdbError) and getattr(kdbkit, name) is value, name


# -- remedies name commands that exist ----------------------------------------------------------


def _kdb_commands_in_strings() -> list[tuple[Path, str]]:
    found = []
    for folder in ("kdb", "runtime", "packager"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    found += [(path, m) for m in re.findall(r"`(kdb [^`]*)`", node.value)]
    return found


def test_every_command_a_message_names_exists():
    known = {path: cmd for path, cmd in _commands(app)}
    groups = {path[:1] for path in known}
    commands = _kdb_commands_in_strings()
    assert len(commands) >= 5
    for path, text in commands:
        words = shlex.split(text.replace("{", "").replace("}", ""))[1:]
        command = tuple(w for w in words[:2] if not w.startswith("-"))
        while command and command not in known and command not in groups:
            command = command[:-1]
        assert command in known or command in groups, f"{path}: `{text}` names no kdb command"
        if command in groups:
            continue
        options = {o for p in known[command].params for o in p.opts}
        for word in words:
            if word.startswith("-") and "=" not in word and not word.startswith("-D"):
                assert word in options, f"{path}: `{text}`: {command} has no option {word}"


# -- config strings: each bad field named as what it is -------------------------------------------

GEMM = "gemm,type=fp32,m={m},n=4,k=4,ta=0,tb=0,batch=1,lda=4,ldb=4,ldc=4,sa=0,sb=0,sc=0,a=1.0,b=0.0"


@pytest.mark.parametrize("config, problem", [
    (GEMM.format(m=-2), "must be positive"),
    ("gemm,type=fp32,m=-2,n=4,k=4", "m=-2; m is a size: it must be positive"),  # said "a size is not an integer"
    ("gemm,type=fp32,m=2,n=4,k=4", "has no batch=; add batch=<value>"),  # said "a size is not an integer"
    (GEMM.format(m="2.5"), "m='2.5' is not an integer; write m as a whole number"),
    ("layernorm,dir=fwd,type=fp32,shape=2x8", "has no dim=; add dim=<value>"),  # said "dim is not an integer"
])
def test_a_bad_config_field_is_named_for_what_it_is(kdb, config, problem):
    command = "lnorm" if config.startswith("layernorm") else "gemm"
    code, _, err = kdb("driver", command, "--config", config)
    line = _one_error_line(err)
    assert code == 2 and problem in line and "not an integer" not in line.replace("'2.5' is not an integer", "")
