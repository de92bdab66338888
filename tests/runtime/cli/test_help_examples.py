"""Every command's help example runs, as written, and succeeds.

The examples name bundles by their usual file names (``sm_90_132.kdb``, ``gfx942_304.kdb``,
...): the test builds those for real, with NVRTC and clang for amdgcn (no GPU needed), in a
folder it runs the examples from, with a private cache and the embedded default device.
"""

from __future__ import annotations

import os
import shlex

import pytest

from kdbkit.kdb import Target
from kdbkit.packager.device_build import build_bundle
from kdbkit.runtime.cli.app import app, main
from kdbkit.runtime.compilers import AmdgcnClangCompiler, NvrtcCompiler
from kdbkit.runtime.errors import CompilerUnavailableError
from tests.runtime.cli.test_db_commands import _commands
from tests.runtime.chain_fixtures import chain_device  # noqa: F401

PROGRAMS = [("activation.c", "-DKDB_DTYPE=float"), ("reduce_sum.c", "-DBLOCK=256")]
# `kdb build --all` compiles every program of the catalogue with NVRTC and clang: the full suite runs it.
SLOW_EXAMPLES = {"build"}
# What an example needs done first, as its user would have done it: `cache export` exports what a job compiled.
BEFORE = {"cache export": ["resolve", "activation.c", "-D", "KDB_DTYPE=float"]}


def _examples() -> list[tuple[str, str]]:
    found = []
    for path, cmd in _commands(app):
        for line in (cmd.help or "").splitlines():
            if line.strip().startswith("Example:"):
                found.append((" ".join(path), line.split("Example:", 1)[1].strip()))
    return sorted(found)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("examples")
    builds = [("sm_90_132", NvrtcCompiler), ("gfx942_304", AmdgcnClangCompiler), ("gfx90a_104", AmdgcnClangCompiler),
              ("gfx90a_110", AmdgcnClangCompiler)]
    for name, compiler in builds:
        try:
            build_bundle(Target.parse(name), PROGRAMS, folder, compiler=compiler())
        except CompilerUnavailableError as exc:
            pytest.skip(f"the examples' bundles need NVRTC and clang-19: {exc.problem} "
                        "(pip install 'kdbkit[cuda]'; apt-get install clang-19 lld-19)")
    (folder / "system").mkdir()
    (folder / "calls.log").write_text(  # a catalogue, as KDB_ENABLE_LOGGING_CMD=1 logs it
        "kdbkit command: [LogCmdActivation] kdb driver activ --config 'activ,dir=fwd,mode=relu,type=fp32,"
        "shape=4x32x6x6,xs=1152x36x6x1,ys=1152x36x6x1,a=0.0,b=0.0,g=0.0' -F 1\n")
    return folder


def test_every_command_has_an_example_that_names_it():
    examples = _examples()
    assert {cmd for cmd, _ in examples} == {" ".join(path) for path, _ in _commands(app)}
    for command, example in examples:
        words = [w for w in shlex.split(example) if "=" not in w or w.startswith("-")]
        assert words[0] == "kdb" and " ".join(words[1:]).startswith(command), (command, example)


@pytest.mark.parametrize("command, example", [
    pytest.param(c, e, id=c, marks=pytest.mark.slow if c in SLOW_EXAMPLES else ()) for c, e in _examples()])
def test_the_example_runs(workdir, monkeypatch, capsys, chain_device, command, example):
    for name in [n for n in os.environ if n.startswith("KDB_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("HOME", str(workdir))
    monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(workdir / "cache"))
    monkeypatch.setenv("KDB_SYSTEM_DB_PATH", str(workdir / "system"))
    monkeypatch.setenv("KDB_BACKEND", chain_device.backend)
    words = shlex.split(example)
    while "=" in words[0]:  # VAR=value before the command, as a shell reads it
        name, value = words.pop(0).split("=", 1)
        monkeypatch.setenv(name, value)
    assert words[0] == "kdb"
    if command in BEFORE:
        assert main(BEFORE[command]) == 0, capsys.readouterr()
        capsys.readouterr()
    code = main(words[1:])
    out, err = capsys.readouterr()
    assert code == 0, f"`{example}` exited {code}:\n{out}\n{err}"
    assert "error:" not in err and "Traceback" not in err
