"""What ``--help`` and a bare group print: the help once, flags without a value placeholder."""

from __future__ import annotations

import pytest

from kdbkit.runtime.cli.app import app
from tests.runtime.cli.test_db_commands import _commands


@pytest.mark.parametrize("group", [(), ("db",), ("cache",), ("driver",), ("keys",)],
                         ids=["kdb", "db", "cache", "driver", "keys"])
def test_a_group_alone_prints_its_help_once_and_exits_2(kdb, group):
    code, out, err = kdb(*group)
    assert code == 2, "typer's no_args_is_help exits 2 (as a usage error does)"
    assert out.count("Usage: kdb") == 1, out
    assert "Commands" in out and not err


def _every_command_path():
    groups = {(), ("db",), ("cache",), ("driver",), ("keys",)}
    return sorted(groups | {path for path, _ in _commands(app)})


@pytest.mark.parametrize("path", _every_command_path(), ids=lambda p: " ".join(("kdb", *p)))
def test_flags_show_no_value_placeholder(kdb, path):
    code, out, _ = kdb(*path, "--help")
    assert code == 0 and "--help" in out
    assert "<bool>" not in out, f"`kdb {' '.join(path)} --help` shows a flag as taking a value:\n{out}"


# Commands whose output is no report for a script: a binary written to a file, a walk-through
# for people, and MIOpenDriver's lines (a format of their own that its users already parse).
WITHOUT_JSON = {("db", "extract"), ("demo",)}


def test_every_command_a_script_would_parse_has_json():
    """README: `--json` where a script would parse the output."""
    lacking = [" ".join(path) for path, cmd in _commands(app)
               if path[0] != "driver" and path not in WITHOUT_JSON
               and "--json" not in {o for p in cmd.params for o in p.opts}]
    assert lacking == []
