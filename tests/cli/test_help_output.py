"""What ``--help`` and a bare group print: the help once, flags without a value placeholder."""

from __future__ import annotations

import pytest

from kdbkit.runtime.cli.app import app
from tests.cli.test_db_cli import _commands


@pytest.mark.parametrize("group", [(), ("db",), ("cache",), ("driver",)], ids=["kdb", "db", "cache", "driver"])
def test_a_group_alone_prints_its_help_once_and_exits_2(kdb, group):
    code, out, err = kdb(*group)
    assert code == 2, "typer's no_args_is_help exits 2 (as a usage error does)"
    assert out.count("Usage: kdb") == 1, out
    assert "Commands" in out and not err


def _every_command_path():
    groups = {(), ("db",), ("cache",), ("driver",)}
    return sorted(groups | {path for path, _ in _commands(app)})


@pytest.mark.parametrize("path", _every_command_path(), ids=lambda p: " ".join(("kdb", *p)))
def test_flags_show_no_value_placeholder(kdb, path):
    code, out, _ = kdb(*path, "--help")
    assert code == 0 and "--help" in out
    assert "<bool>" not in out, f"`kdb {' '.join(path)} --help` shows a flag as taking a value:\n{out}"
