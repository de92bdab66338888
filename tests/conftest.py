"""Fixtures shared by every test package."""

from __future__ import annotations

import faulthandler
import os
from pathlib import Path

import pytest

_crash_report = None  # KDB_TEST_CRASH_REPORT's file, while the session runs


def pytest_configure(config):
    """One PoCL kernel cache for the whole session, whatever HOME a test or its child processes
    run with, and on even in `kdb demo` (which turns it off unless told): the tests compile the
    same kernels in many fresh kdbkit caches, and on a slow CPU PoCL's compiles were most of
    the suite's time. Set before anything loads PoCL, which reads these once."""
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    os.environ.setdefault("POCL_CACHE_DIR", str(Path(xdg) / "pocl" / "kcache"))
    os.environ.setdefault("POCL_KERNEL_CACHE", "1")
    Path(os.environ["POCL_CACHE_DIR"]).mkdir(parents=True, exist_ok=True)  # PoCL takes only a folder that exists
    # hypothesis keeps its example database beside the user's caches, not as a .hypothesis folder
    # in the checkout (whose top level holds only what the design card lists)
    try:
        from hypothesis.configuration import set_hypothesis_home_dir
    except ImportError:  # the dev extra brings it; without it the fuzz tests say so themselves
        return
    set_hypothesis_home_dir(Path(xdg) / "kdbkit-tests" / "hypothesis")


def pytest_sessionstart(session):  # after pytest_configure, where pytest's faulthandler plugin reports to stderr
    """With KDB_TEST_CRASH_REPORT set (CI sets it), a crash inside a native library reports to that
    file: the test it happened in, then every thread's Python stack. `.ci/run` prints it last,
    where a log cut in the middle still shows it (stderr's report starts with other threads)."""
    global _crash_report
    path = os.environ.get("KDB_TEST_CRASH_REPORT")
    if path:
        _crash_report = open(path, "w")
        faulthandler.enable(_crash_report, all_threads=True)


def pytest_runtest_logstart(nodeid, location):
    if _crash_report is not None:
        _crash_report.seek(0)
        _crash_report.truncate()
        _crash_report.write(f"crashed in {nodeid}\n")
        _crash_report.flush()


def pytest_sessionfinish(session, exitstatus):
    global _crash_report
    if _crash_report is not None:
        faulthandler.disable()  # pytest's plugin puts its own back after
        _crash_report.close()
        os.unlink(_crash_report.name)  # no crash: nothing to report
        _crash_report = None


@pytest.fixture
def fresh_log(monkeypatch):
    """kdbkit's logging configured anew from the environment, with no warning seen yet.

    Call the fixture's value after changing KDB_* logging variables to re-read them.
    """
    from kdbkit.runtime import env, logging_setup

    monkeypatch.setattr(logging_setup, "_once_keys", set())
    monkeypatch.setattr(env, "_warned", set())

    def reconfigure():
        logging_setup.configure_logging(force=True)

    reconfigure()
    yield reconfigure
    monkeypatch.undo()
    logging_setup.configure_logging(force=True)


@pytest.fixture
def amdgcn_clang():
    """A clang that builds AMD code objects; skips without one (fails where CI requires it)."""
    from tests.prerequisites import require_amdgcn_clang

    require_amdgcn_clang()


@pytest.fixture
def logging_cmd(monkeypatch):
    """KDB_ENABLE_LOGGING_CMD=1 for the test; logging is configured again after it."""
    from kdbkit.runtime.logging_setup import configure_logging

    monkeypatch.setenv("KDB_ENABLE_LOGGING_CMD", "1")
    configure_logging(force=True)
    yield
    monkeypatch.delenv("KDB_ENABLE_LOGGING_CMD")
    configure_logging(force=True)


@pytest.fixture
def kdb(capsys):
    """Run ``kdb ARGS...`` in-process; returns (exit code, stdout, stderr)."""
    from kdbkit.runtime.cli.app import main

    def run(*args):
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err
    return run
