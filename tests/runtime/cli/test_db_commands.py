import json

import pytest

from kdbkit.kdb import Target, open_bundle, write_bundle
from kdbkit.runtime.cli.app import app
from tests.kdb.conftest import fake_binary, write_miopen_file

ENTRIES = [(f"kernel{i}.cl.o", f"-DTILE={i} -mcpu=sm_90", fake_binary(i)) for i in range(12)]


@pytest.fixture
def bundle(tmp_path):
    return write_bundle(tmp_path / "sm_90_132.kdb", Target.parse("sm_90_132"), ENTRIES, compiler="nvrtc 13.0",
                        binary_format="cubin")


@pytest.fixture
def miopen(tmp_path):
    return write_miopen_file(tmp_path / "gfx906_60.kdb", ENTRIES)


def test_version(kdb):
    code, out, _ = kdb("--version")
    assert code == 0 and out.startswith("kdbkit ")


@pytest.mark.parametrize("which", ["bundle", "miopen"])
def test_ls_info_verify(kdb, request, which):
    path = request.getfixturevalue(which)
    code, out, _ = kdb("db", "ls", path, "--json")
    assert code == 0
    rows = json.loads(out)
    assert [(r["kernel_name"], r["kernel_args"]) for r in rows] == sorted((n, a) for n, a, _ in ENTRIES)
    code, out, _ = kdb("db", "info", path, "--json")
    info = json.loads(out)
    assert code == 0 and info["entries"] == len(ENTRIES)
    assert info["codec"] == ("zstd" if which == "bundle" else "bzip2")
    code, out, _ = kdb("db", "verify", path)
    assert code == 0 and "ok" in out
    code, out, _ = kdb("db", "ls", path)
    assert code == 0 and "kernel3.cl.o" in out


def test_verify_exits_1_on_any_bad_file(kdb, bundle, tmp_path):
    junk = tmp_path / "junk.kdb"
    junk.write_bytes(b"\x00" * 5000)
    code, out, err = kdb("db", "verify", bundle, junk)
    assert code == 1 and "FAIL" in out and "junk.kdb" in out and "1 of 2" in err


@pytest.mark.parametrize("args,needle", [
    (("db", "info", "/nonexistent/x.kdb"), "no such bundle file"),
    (("db", "ls", "__TEXT__"), "not a bundle"),
])
def test_errors_are_one_line_not_a_traceback(kdb, tmp_path, args, needle):
    text = tmp_path / "t.kdb"
    text.write_text("plain text")
    code, out, err = kdb(*[str(text) if a == "__TEXT__" else a for a in args])
    assert code == 1 and needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["ls", "info"])
def test_ls_and_info_on_a_folder_say_it_is_one_and_what_to_run(kdb, bundle, tmp_path, command):
    code, out, err = kdb("db", command, tmp_path)
    assert code == 1 and not out and len(err.strip().splitlines()) == 1
    assert f"{tmp_path} is a folder, not a bundle file" in err and "sm_90_132.kdb" in err
    assert f"`kdb db verify {tmp_path}`" in err and "no such bundle file" not in err
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = kdb("db", command, empty)
    assert code == 1 and f"{empty} is a folder with no bundle files (.kdb, .ukdb)" in err


def test_verify_checks_every_bundle_of_a_folder(kdb, bundle, miopen, tmp_path):
    code, out, err = kdb("db", "verify", tmp_path)
    assert code == 0 and f"ok   {bundle} ({len(ENTRIES)} entries" in out and f"ok   {miopen} (" in out and not err
    (tmp_path / "junk.kdb").write_bytes(b"\x00" * 5000)
    code, out, err = kdb("db", "verify", tmp_path, "--json")
    assert code == 1 and "2 of 3 bundle(s)" not in err and "1 of 3 bundle(s) have problems" in err
    by_file = {r["file"]: r for r in json.loads(out)}
    assert by_file[str(bundle)]["ok"] and not by_file[str(tmp_path / "junk.kdb")]["ok"]
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, _ = kdb("db", "verify", empty)
    assert code == 1 and "FAIL" in out and "a folder with no bundle files" in out


def test_merge_into_a_folder_names_the_folder(kdb, bundle, tmp_path):
    (tmp_path / "out").mkdir()
    code, _, err = kdb("db", "merge", tmp_path / "out", bundle)
    assert code == 1 and f"error: {tmp_path / 'out'} is a folder; name the bundle file to write" in err
    code, _, err = kdb("db", "merge", tmp_path / "missing" / "m.kdb", bundle)
    assert code == 1 and str(tmp_path / "missing" / "m.kdb") in err and ".tmp" not in err


def test_merge_reports_in_json(kdb, bundle, tmp_path):
    changed = write_bundle(tmp_path / "c.kdb", Target.parse("sm_90_132"), [(*ENTRIES[0][:2], b"z" * 300)],
                           compiler="nvrtc 13.0", binary_format="cubin")
    code, out, err = kdb("db", "merge", tmp_path / "m.kdb", bundle, bundle, changed, "--json")
    assert code == 0 and not err and json.loads(out) == {
        "file": str(tmp_path / "m.kdb"), "entries": len(ENTRIES), "duplicates": len(ENTRIES),
        "conflicts": [{"kernel_name": ENTRIES[0][0], "kernel_args": ENTRIES[0][1]}]}


def test_merge_and_extract(kdb, bundle, tmp_path):
    other = write_bundle(tmp_path / "b.kdb", Target.parse("sm_90_132"), [("extra.cl.o", "-mcpu=sm_90", b"x" * 300)],
                         compiler="nvrtc 13.0", binary_format="cubin")
    out_path = tmp_path / "merged.kdb"
    code, out, _ = kdb("db", "merge", out_path, bundle, other)
    assert code == 0 and f"{len(ENTRIES) + 1} entries" in out
    name, args, data = ENTRIES[2]
    dest = tmp_path / "k.bin"
    code, _, _ = kdb("db", "extract", out_path, name, "--args", args, "-o", dest)
    assert code == 0 and dest.read_bytes() == data
    code, _, err = kdb("db", "extract", out_path, name, "--args", "-nope")
    assert code == 1 and "no entry" in err and "kdb db ls" in err
    assert open_bundle(out_path).count() == len(ENTRIES) + 1


def test_merge_of_different_targets_is_refused(kdb, bundle, tmp_path):
    other = write_bundle(tmp_path / "sm_80_108.kdb", Target.parse("sm_80_108"), [("e.o", "-x", b"x" * 300)],
                         compiler="nvrtc 13.0", binary_format="cubin")
    code, _, err = kdb("db", "merge", tmp_path / "m.kdb", bundle, other)
    assert code == 1 and "different targets" in err


def test_unknown_option_is_a_usage_error(kdb, bundle):
    assert kdb("db", "ls", bundle, "--frobnicate")[0] == 2


def test_env_lists_every_variable(kdb, monkeypatch):
    monkeypatch.setenv("KDB_DISABLE_JIT", "yes")
    monkeypatch.setenv("KDB_DISABL_CACHE", "1")
    code, out, _ = kdb("env", "--json")
    data = json.loads(out)
    by_name = {v["name"]: v for v in data["variables"]}
    assert code == 0 and by_name["KDB_DISABLE_JIT"]["effective"] is True
    for name in ("KDB_ENABLE_LOGGING", "KDB_LOG_LEVEL", "KDB_CUSTOM_CACHE_DIR", "KDB_SYSTEM_DB_PATH",
                 "KDB_COMPILE_PARALLEL_LEVEL", "KDB_DEBUG_FIND_ONLY_SOLVER", "KDB_CHECK_NUMERICS"):
        assert by_name[name]["meaning"]
    assert any("KDB_DISABLE_CACHE" in u for u in data["unknown"])


def _commands(group, prefix=()):
    import typer.main

    click_group = typer.main.get_command(group)
    stack = [(prefix, click_group)]
    while stack:
        path, cmd = stack.pop()
        subs = getattr(cmd, "commands", None)
        if subs:
            stack.extend((path + (name,), sub) for name, sub in subs.items())
        else:
            yield path, cmd


def test_every_command_has_help_with_an_example():
    seen = 0
    for path, cmd in _commands(app):
        seen += 1
        assert cmd.help and "Example:" in cmd.help, f"kdb {' '.join(path)} lacks an example in its help"
    assert seen >= 6
