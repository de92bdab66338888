"""Tests of runtime.logging_setup: MIOpen levels, prefixes, channels, one handler, warn_once, laziness."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from kdbkit.runtime import env, logging_setup as ls

REPO = Path(__file__).resolve().parents[2]
# One record per MIOpen level it belongs to: (KDB level, Python level, word printed).
RECORDS = [(2, logging.CRITICAL, "fatal:"), (3, logging.ERROR, "error:"),
           (4, logging.WARNING, "warning:"), (5, logging.INFO, "info:"), (6, ls.INFO2, "info2:"),
           (7, ls.TRACE, "trace:")]


@pytest.fixture(autouse=True)
def clean_logging(monkeypatch):
    """Each test starts from an environment without KDB_* and leaves default logging behind."""
    for name in [n for n in os.environ if n.startswith("KDB_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(env, "_warned", set())
    yield
    for name in [n for n in os.environ if n.startswith("KDB_")]:
        monkeypatch.delenv(name)
    ls.configure_logging(force=True)


@pytest.fixture
def configure(monkeypatch):
    """Set KDB_* variables, then re-read them as a fresh process would."""
    def apply(**variables: str) -> logging.Logger:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        return ls.configure_logging(force=True)
    return apply


def _owned(logger: logging.Logger) -> list[logging.Handler]:
    return [h for h in logger.handlers if getattr(h, ls._OWNED, False)]


def _lines(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


# Levels --------------------------------------------------------------------------------------

@pytest.mark.parametrize("level", range(1, 8))
def test_each_level_shows_exactly_its_records_and_above(configure, capsys, level):
    configure(KDB_LOG_LEVEL=str(level))
    log = ls.get_logger("runtime.levels")
    for _, python_level, word in RECORDS:
        log.log(python_level, "%s message", word)
    shown = {line.split()[1] for line in _lines(capsys)}
    assert shown == {word for kdb_level, _, word in RECORDS if kdb_level <= level}


def test_debug_sits_between_info2_and_trace(configure, capsys):
    configure(KDB_LOG_LEVEL="6")
    ls.get_logger("x").debug("hidden at 6")
    configure(KDB_LOG_LEVEL="7")
    ls.get_logger("x").debug("shown at 7")
    assert _lines(capsys) == ["kdbkit debug: [x] shown at 7"]


@pytest.mark.parametrize("variables, expected", [
    ({}, 4), ({"KDB_LOG_LEVEL": "0"}, 4), ({"KDB_ENABLE_LOGGING": "1"}, 5),
    ({"KDB_ENABLE_LOGGING": "1", "KDB_LOG_LEVEL": "3"}, 3), ({"KDB_LOG_LEVEL": "6"}, 6),
    ({"KDB_ENABLE_LOGGING": "off", "KDB_LOG_LEVEL": "0"}, 4),
])
def test_effective_level(monkeypatch, variables, expected):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert ls.effective_log_level() == expected
    assert ls.configure_logging(force=True).level == ls.PYTHON_LEVELS[expected]


@pytest.mark.parametrize("bad", ["9", "verbose", "-2"])
def test_bad_log_level_warns_once_in_one_line_and_uses_the_default(configure, capsys, bad):
    # Met while logging configures itself: the line waits for the handler, then comes out once.
    logger = configure(KDB_LOG_LEVEL=bad)
    assert logger.level == logging.WARNING
    ls.configure_logging(force=True)
    assert _lines(capsys) == [f"kdbkit warning: KDB_LOG_LEVEL={bad!r} is not understood (accepted: an integer "
                              "from 0 to 7); using the default (0)"]


def test_custom_level_names_are_registered(configure):
    configure()
    assert logging.getLevelName(ls.INFO2) == "INFO2"
    assert logging.getLevelName(ls.TRACE) == "TRACE"
    assert logging.DEBUG > ls.TRACE and logging.INFO > ls.INFO2 > logging.DEBUG


# Format and prefixes -------------------------------------------------------------------------

def test_plain_format(configure, capsys):
    configure()
    ls.get_logger("runtime.handle").warning("disk %s", "full")
    ls.get_logger().error("top level")
    ls.get_logger("kdbkit.kdb.bundle").warning("already prefixed")
    assert _lines(capsys) == ["kdbkit warning: [runtime.handle] disk full",
                              "kdbkit error: top level",
                              "kdbkit warning: [kdb.bundle] already prefixed"]


def test_exception_traceback_follows_the_line(configure, capsys):
    configure()
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        ls.get_logger("x").exception("failed")
    err = capsys.readouterr().err
    assert err.startswith("kdbkit error: [x] failed\nTraceback")
    assert "RuntimeError: boom" in err


def test_mpmt_prefix_has_pid_and_thread_id(configure, capsys):
    configure(KDB_ENABLE_LOGGING_MPMT="1")
    log = ls.get_logger("mt")
    log.warning("main")
    worker_tid = []

    def work():
        worker_tid.append(threading.get_native_id())
        log.warning("worker")
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    pid = os.getpid()
    assert _lines(capsys) == [f"kdbkit warning: [{pid} {threading.get_native_id()}] [mt] main",
                              f"kdbkit warning: [{pid} {worker_tid[0]}] [mt] worker"]
    assert worker_tid[0] != threading.get_native_id()


def test_elapsed_prefix_counts_ms_since_previous_line(configure, capsys):
    configure(KDB_ENABLE_LOGGING_ELAPSED_TIME="yes")
    log = ls.get_logger("t")
    log.warning("first")
    time.sleep(0.03)
    log.warning("second")
    first, second = _lines(capsys)
    pattern = re.compile(r"^kdbkit warning: (\d+\.\d{3}) ms \[t\] (first|second)$")
    assert float(pattern.match(first).group(1)) == 0.0
    assert 25.0 <= float(pattern.match(second).group(1)) < 5000.0


def test_both_prefixes_in_order(configure, capsys):
    configure(KDB_ENABLE_LOGGING_MPMT="1", KDB_ENABLE_LOGGING_ELAPSED_TIME="1")
    ls.get_logger("both").warning("m")
    (line,) = _lines(capsys)
    assert re.fullmatch(rf"kdbkit warning: \[{os.getpid()} \d+\] \d+\.\d{{3}} ms \[both\] m", line)


# Channels independent of the level ------------------------------------------------------------

def test_log_command_only_when_enabled(configure, capsys):
    configure()
    assert ls.log_command("kdb driver softmax -n 4") is False
    configure(KDB_ENABLE_LOGGING_CMD="1", KDB_LOG_LEVEL="1")  # quiet does not silence it
    assert ls.log_command("kdb driver softmax -n 4") is True
    assert _lines(capsys) == ["kdbkit command: kdb driver softmax -n 4"]


def test_log_api_call_follows_enable_logging_not_level(configure, capsys):
    configure(KDB_LOG_LEVEL="5")
    assert ls.log_api_call("softmax(x)") is False
    configure(KDB_ENABLE_LOGGING="1", KDB_LOG_LEVEL="3")
    assert ls.log_api_call("softmax(x)", logger=ls.get_logger("runtime.api")) is True
    ls.get_logger("runtime.api").info("ordinary info stays filtered at level 3")
    assert _lines(capsys) == ["kdbkit API: [runtime.api] softmax(x)"]


def test_enable_logging_shows_info_records(configure, capsys):
    configure(KDB_ENABLE_LOGGING="1")
    ls.get_logger("runtime.resolve").info("softmax.cl from gfx942_304.kdb")
    assert _lines(capsys) == ["kdbkit info: [runtime.resolve] softmax.cl from gfx942_304.kdb"]


# One handler, host logging untouched, nothing at import -----------------------------------------

def test_handlers_are_not_duplicated(configure, capsys):
    logger = configure()
    ls.configure_logging()
    ls.configure_logging()
    for _ in range(3):
        ls.get_logger("dup")
    assert len(_owned(logger)) == 1
    ls.configure_logging(force=True)
    assert len(_owned(logger)) == 1
    ls.get_logger("dup").warning("once")
    assert _lines(capsys) == ["kdbkit warning: [dup] once"]


def test_force_keeps_handlers_the_application_added(configure):
    logger = configure()
    mine = logging.NullHandler()
    logger.addHandler(mine)
    try:
        ls.configure_logging(force=True)
        assert mine in logger.handlers and len(_owned(logger)) == 1
    finally:
        logger.removeHandler(mine)


def test_root_logger_is_left_alone(configure, capsys):
    root = logging.getLogger()
    before = list(root.handlers)
    seen: list[logging.LogRecord] = []
    spy = logging.Handler()
    spy.emit = seen.append  # type: ignore[method-assign]
    root.addHandler(spy)
    try:
        logger = configure(KDB_LOG_LEVEL="7")
        ls.get_logger("quiet.neighbour").warning("to stderr only")
        assert logger.propagate is False
        assert seen == []
        assert [h for h in root.handlers if h is not spy] == before
    finally:
        root.removeHandler(spy)
    assert _lines(capsys) == ["kdbkit warning: [quiet.neighbour] to stderr only"]


def test_import_configures_nothing():
    # Importing every module (each takes its logger at import) configures nothing.
    code = ("import logging, kdbkit, kdbkit.runtime.handle, kdbkit.runtime.backends.cuda, kdbkit.runtime.cli.app, "
            "kdbkit.runtime.compilers.opencl; "
            "print(len(logging.getLogger('kdbkit').handlers), len(logging.getLogger().handlers), "
            "logging.getLevelName(15))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "0", "Level", "15"]


def test_the_first_record_configures(monkeypatch):
    code = ("import logging; from kdbkit.runtime.logging_setup import get_logger; log = get_logger('kdbkit.x'); "
            "print(len(logging.getLogger('kdbkit').handlers)); log.info2('detail %d', 6); "
            "print(len(logging.getLogger('kdbkit').handlers))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "KDB_LOG_LEVEL": "6"})
    assert out.stdout.split() == ["0", "1"]
    assert out.stderr == "kdbkit info2: [x] detail 6\n"


def test_every_module_logs_below_the_kdbkit_logger():
    # No module takes a logger of its own outside the tree (logging.getLogger("kdb...") was the
    # backends' way): the level and the prefixes apply to every record.
    for folder in ("runtime", "kdb", "packager"):
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text()
            assert "logging.getLogger(" not in text or path.name == "logging_setup.py", path


# warn_once -----------------------------------------------------------------------------------

def test_warn_once_emits_once(configure, capsys):
    configure()
    key = f"missing-system-db:{uuid.uuid4()}"
    message = "Missing system database file: sm_90_132.kdb Performance may degrade"
    assert ls.warn_once(key, message) is True
    assert ls.warn_once(key, message) is False
    assert ls.warn_once(key, "a different text, same key") is False
    assert _lines(capsys) == [f"kdbkit warning: {message}"]


def test_warn_once_across_threads(configure, capsys):
    configure()
    key = f"race:{uuid.uuid4()}"
    barrier = threading.Barrier(16)
    results: list[bool] = []
    lock = threading.Lock()

    def race():
        barrier.wait()
        emitted = ls.warn_once(key, "only one of sixteen", logger=ls.get_logger("race"))
        with lock:
            results.append(emitted)
    threads = [threading.Thread(target=race) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 15 + [True]
    assert _lines(capsys) == ["kdbkit warning: [race] only one of sixteen"]
