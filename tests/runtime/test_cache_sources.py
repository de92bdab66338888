"""A cache tier added without editing kdbkit: a module written here, passed to Handle(sources=...)
or named in KDB_CACHE_SOURCES. The JIT writes through to it and holds its lease; a second
process is served by it; what it returns is loaded only when sealed for the key asked; a tier
that fails is a miss with one warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kdbkit.kdb import open_bundle
from kdbkit.runtime.samples import SAMPLES
from tests.runtime.chain_fixtures import child_env

ROOT = Path(__file__).resolve().parents[2]
RELU = SAMPLES[0]

TOY_TIER = '''
"""A toy cache tier: sealed entries as files in a folder (TOY_TIER_DIR unless given), with a lease of its own."""
import os
from contextlib import contextmanager
from pathlib import Path

from kdbkit.runtime.keyed_tier import KeyedTier
from kdbkit.runtime.lease import CompileLease, FileLease


class FolderLease(CompileLease):
    """A lock file per key in the tier's folder; notes each wait, hold, release."""

    def __init__(self, folder, events):
        self.files = FileLease(folder / "leases")
        self.events = events

    @contextmanager
    def hold(self, key):
        self.events.append(("wait", key.digest))
        with self.files.hold(key):
            self.events.append(("hold", key.digest))
            try:
                yield
            finally:
                self.events.append(("release", key.digest))


class FolderTier(KeyedTier):
    name = "toy"

    def __init__(self, folder=None):
        self.folder = Path(folder or os.environ["TOY_TIER_DIR"])
        (self.folder / "entries").mkdir(parents=True, exist_ok=True)
        self.events = []
        self.own_lease = FolderLease(self.folder, self.events)

    def load(self, name):
        path = self.folder / "entries" / name
        return path.read_bytes() if path.is_file() else None

    def save(self, name, data):
        self.events.append(("save", name))
        part = self.folder / "entries" / f".{name}.part"
        part.write_bytes(data)
        os.replace(part, self.folder / "entries" / name)

    def remove(self, name):
        (self.folder / "entries" / name).unlink(missing_ok=True)

    def searched(self):
        return f"the toy tier {self.folder}"

    def lease(self):
        return self.own_lease


class PlantedTier(FolderTier):
    """A store that mixes names up: whatever is asked, it returns the entry planted in it."""

    name = "planted"

    def load(self, name):
        path = self.folder / "planted"
        return path.read_bytes() if path.is_file() else None


class DownLease(CompileLease):
    def hold(self, key):
        raise ConnectionError("the toy lease server does not answer")


class DownTier(FolderTier):
    """A store whose server is down."""

    name = "down"

    def load(self, name):
        raise ConnectionError("the toy server does not answer")

    def save(self, name, data):
        raise ConnectionError("the toy server does not answer")

    def lease(self):
        return DownLease()
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy tier's module, importable as ``toy_tier`` (its folder on sys.path, as PYTHONPATH puts it)."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "toy_tier.py").write_text(TOY_TIER)
    monkeypatch.syspath_prepend(str(mods))
    monkeypatch.setenv("TOY_TIER_DIR", str(tmp_path / "toy"))
    sys.modules.pop("toy_tier", None)
    import toy_tier

    yield toy_tier
    sys.modules.pop("toy_tier", None)


def _entries(tier) -> list[Path]:
    return sorted(p for p in (tier.folder / "entries").iterdir() if not p.name.startswith("."))


def test_a_compile_is_written_through_to_the_tier_and_serves_another_process(make_handle, toy, isolated):
    tier = toy.FolderTier()
    handle = make_handle(sources=["system", "user", tier, "jit"])
    options = [*RELU.options, "-DSALT=toy"]
    assert handle.program(RELU.kernel_file, options).source == "jit"
    assert len(_entries(tier)) == 1  # written through to the toy tier ...
    assert open_bundle(handle.user_cache_path).count() == 1  # ... and to the user cache: every writable tier
    assert [(i.name, i.writable) for i in handle.describe_sources()] == [
        ("system", False), ("user", True), ("toy", True), ("jit", False)]

    script = ("import json, kdbkit\n"
              "with kdbkit.Handle() as h:\n"
              f"    p = h.program({RELU.kernel_file!r}, {options!r})\n"
              "    print(json.dumps([p.source, [s.name for s in p.steps], [s.name for s in h.sources]]))\n")
    env = child_env(isolated, KDB_DISABLE_JIT="1", KDB_DISABLE_CACHE="1", TOY_TIER_DIR=str(tier.folder),
                    KDB_CACHE_SOURCES="system,user,toy_tier:FolderTier,jit",
                    PYTHONPATH=os.pathsep.join([str(Path(toy.__file__).parent), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    source, steps, tiers = json.loads(done.stdout)
    assert tiers == ["system", "toy", "jit"]  # KDB_DISABLE_CACHE left the user cache out
    assert source == "toy" and steps == ["memory", "toy", "load"]  # no system bundle: no step


def test_the_jit_holds_the_tiers_own_lease_and_rechecks_it_under_the_lease(make_handle, toy, isolated):
    from kdbkit.runtime.program_key import ProgramRequest

    options = [*RELU.options, "-DSALT=lease"]
    tier = toy.FolderTier()
    handle = make_handle(sources=["system", tier, "jit"])
    assert handle.program(RELU.kernel_file, options).source == "jit"
    (entry,) = _entries(tier)
    assert [e[0] for e in tier.events] == ["wait", "hold", "save", "release"]  # compiled and put under the lease
    assert {e[1] for e in tier.events} == {entry.name}

    # Another holder (another machine) holds the lease while this process asks: the JIT waits,
    # then finds what the holder put there and compiles nothing.
    sealed = entry.read_bytes()
    entry.unlink()
    waiting = toy.FolderTier(isolated / "shared")
    later = make_handle(sources=["system", waiting, "jit"])
    key = waiting.context.key(ProgramRequest(RELU.kernel_file, options))
    assert key.digest == entry.name  # the name a tier stores under is the key function's digest
    found = {}
    with waiting.own_lease.hold(key):
        asker = threading.Thread(target=lambda: found.update(p=later.program(RELU.kernel_file, options)))
        asker.start()
        deadline = time.monotonic() + 60
        while [e[0] for e in waiting.events].count("wait") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # until the asker waits for the lease
        (waiting.folder / "entries" / key.digest).write_bytes(sealed)
    asker.join(timeout=120)
    program = found["p"]
    assert program.source == "jit" and [(s.name, s.outcome) for s in program.steps][-2] == (
        "jit", "built by another process")
    assert [e[0] for e in waiting.events].count("save") == 0


def test_an_entry_not_sealed_for_the_key_asked_is_refused_with_one_warning(make_handle, toy, isolated, capfd,
                                                                           fresh_log):
    a_options, b_options = [*RELU.options, "-DSALT=a"], [*RELU.options, "-DSALT=b"]
    planted = toy.PlantedTier()
    make_handle(sources=["system", planted, "jit"]).program(RELU.kernel_file, a_options)
    (a_entry,) = _entries(planted)
    (planted.folder / "planted").write_bytes(a_entry.read_bytes())  # program a's entry, a binary that loads
    capfd.readouterr()
    for _ in range(2):  # each handle is refused; the warning is given once
        program = make_handle(sources=["system", toy.PlantedTier(), "jit"]).program(RELU.kernel_file, b_options)
        assert program.source == "jit" and ("planted", "refused") in [(s.name, s.outcome) for s in program.steps]
    err = capfd.readouterr().err
    assert err.count("cache tier planted returned an entry") == 1 and "another key" in err

    tier = toy.FolderTier(isolated / "damaged")  # a damaged entry under the right name
    make_handle(sources=["system", tier, "jit"]).program(RELU.kernel_file, b_options)
    (b_entry,) = _entries(tier)
    data = bytearray(b_entry.read_bytes())
    data[-1] ^= 0x55
    b_entry.write_bytes(bytes(data))
    capfd.readouterr()
    program = make_handle(sources=["system", toy.FolderTier(tier.folder), "jit"]).program(RELU.kernel_file, b_options)
    assert program.source == "jit" and ("toy", "refused") in [(s.name, s.outcome) for s in program.steps]
    assert "its hash does not match" in capfd.readouterr().err
    assert make_handle(sources=["system", toy.FolderTier(tier.folder), "jit"]).program(
        RELU.kernel_file, b_options).source == "toy"  # the JIT's put replaced the damaged entry


def test_a_tier_that_raises_is_a_miss_with_one_warning(make_handle, toy, capfd, fresh_log):
    capfd.readouterr()
    handle = make_handle(sources=["system", "user", toy.DownTier(), "jit"])
    for salt in ("down1", "down2"):
        program = handle.program(RELU.kernel_file, [*RELU.options, f"-DSALT={salt}"])
        assert program.source == "jit" and ("down", "failed") in [(s.name, s.outcome) for s in program.steps]
    err = capfd.readouterr().err
    assert err.count("cache tier down failed (ConnectionError") == 1
    assert err.count("cache tier down cannot store") == 1 and "Traceback" not in err
    assert err.count("compile lease DownLease cannot be taken") == 1
    assert make_handle().program(RELU.kernel_file, [*RELU.options, "-DSALT=down1"]).source == "user"


def test_kdb_cache_sources_names_the_tiers(make_handle, toy, monkeypatch):
    monkeypatch.setenv("KDB_CACHE_SOURCES", "user, toy_tier:FolderTier ,jit")
    handle = make_handle()
    assert [s.name for s in handle.sources] == ["user", "toy", "jit"] and handle.system_trace == []
    assert handle.program(RELU.kernel_file, RELU.options).source == "jit"
    monkeypatch.setenv("KDB_DISABLE_CACHE", "1")
    assert [s.name for s in make_handle().sources] == ["toy", "jit"]


@pytest.mark.parametrize("value", ["system,nosuch,jit", "system,jit,user", "no_such_module_kdb:Tier", "system,,jit",
                                   "os.path:join", "system,system,jit", "toy_tier:DownTier,toy_tier:DownTier"])
def test_a_bad_kdb_cache_sources_warns_once_and_keeps_the_default(make_handle, toy, monkeypatch, capfd, fresh_log,
                                                                  value):
    monkeypatch.setenv("KDB_CACHE_SOURCES", value)
    capfd.readouterr()
    for _ in range(2):
        assert [s.name for s in make_handle().sources] == ["system", "user", "jit"]
    err = capfd.readouterr().err
    assert err.count("KDB_CACHE_SOURCES=") == 1 and "using the default chain (system,user,jit)" in err


def test_a_bad_sources_argument_is_an_error_with_a_remedy(make_handle, toy):
    from kdbkit.runtime.cache_sources import CacheSourcesError

    for bad in (["system", "jit", toy.FolderTier()], ["nosuch"], [42], ["toy_tier:FolderLease"]):
        with pytest.raises(CacheSourcesError) as caught:
            make_handle(sources=bad)
        assert caught.value.remedy


def test_kdb_resolve_and_kdb_doctor_list_a_tier_they_never_heard_of(toy, isolated, chain_device, monkeypatch, capsys):
    from kdbkit.runtime.cli.app import main

    monkeypatch.setenv("KDB_BACKEND", chain_device.backend)
    monkeypatch.setenv("KDB_CACHE_SOURCES", "system,user,toy_tier:FolderTier,jit")
    capsys.readouterr()
    assert main(["resolve", "activation.c", "-D", "KDB_DTYPE=float", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["sources"]
    assert [(t["name"], t["writable"]) for t in listed] == [("system", False), ("user", True), ("toy", True),
                                                            ("jit", False)]
    assert listed[2]["where"] == f"the toy tier {isolated / 'toy'}"
    main(["doctor", "--json"])
    rows = {r["item"]: r["value"] for r in json.loads(capsys.readouterr().out) if r["section"] == "cache sources"}
    assert rows["chain"].startswith("memory -> system -> user -> toy -> jit")
    assert rows["toy"] == f"the toy tier {isolated / 'toy'} (writable)"
