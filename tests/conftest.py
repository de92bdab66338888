"""Fixtures shared by every test package."""

from __future__ import annotations

import pytest


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
