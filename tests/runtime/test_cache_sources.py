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


class ForgetfulTier(FolderTier):
    """A store that cannot remove (KeyedTier's default remove does nothing)."""

    name = "forgetful"

    def remove(self, name):
        pass


class FailingTier(FolderTier):
    """A store whose remove, lease() and searched() raise."""

    name = "failing"

    def remove(self, name):
        raise ConnectionError("the toy server does not answer")

    def lease(self):
        raise ConnectionError("the toy lease server does not answer")

    def searched(self):
        raise ConnectionError("the toy server does not answer")


class BadReleaseLease(CompileLease):
    """A lease whose release fails, or (swallow=True) one whose release swallows the block's error."""

    def __init__(self, swallow=False):
        self.swallow = swallow

    @contextmanager
    def hold(self, key):
        try:
            yield
        except Exception:
            if not self.swallow:
                raise
        if not self.swallow:
            raise ConnectionError("the toy lease server went away")


class OrderedTier(FolderTier):
    """Notes, in a list shared by all its instances, the order its leases are taken in."""

    taken = []

    def __init__(self, folder=None, name="ordered"):
        super().__init__(folder)
        self.name = name

    def lease(self):
        tier = self

        class Noted(CompileLease):
            @contextmanager
            def hold(self, key):
                OrderedTier.taken.append(tier.name)
                yield

        return Noted()


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


def _plant_unloadable(tier, options) -> None:
    """Put into ``tier``'s folder an entry sealed for its key that no device loads."""
    from kdbkit.runtime.keyed_tier import seal
    from kdbkit.runtime.program_key import ProgramRequest

    key = tier.context.key(ProgramRequest(RELU.kernel_file, options))
    (tier.folder / "entries" / key.digest).write_bytes(seal(key.digest, b"not a binary of this device"))


def test_a_sealed_binary_that_does_not_load_is_compiled_over_even_where_the_tier_cannot_forget_it(
        make_handle, toy, isolated, capfd, fresh_log):
    options = [*RELU.options, "-DSALT=unloadable"]
    tier = toy.ForgetfulTier(isolated / "forgetful")
    handle = make_handle(sources=["system", tier, "jit"])
    _plant_unloadable(tier, options)
    program = handle.program(RELU.kernel_file, options)  # refused at load, then compiled
    assert program.source == "jit" and ("load", "unloadable") in [(s.name, s.outcome) for s in program.steps]
    assert make_handle(sources=["system", toy.ForgetfulTier(tier.folder), "jit"]).program(
        RELU.kernel_file, options).source == "forgetful"  # the compile's put replaced it


def test_one_tier_instance_serves_one_handle(make_handle, toy):
    from kdbkit.runtime.cache_sources import CacheSourcesError

    tier = toy.FolderTier()
    make_handle(sources=["system", tier, "jit"])
    with pytest.raises(CacheSourcesError, match="already serves another handle") as caught:
        make_handle(sources=["system", tier, "jit"])  # it would key with the first handle's context
    assert "new instance" in caught.value.remedy


def test_a_tier_whose_remove_lease_and_searched_raise_never_crashes_a_lookup(make_handle, toy, isolated, capfd,
                                                                            fresh_log, monkeypatch):
    from kdbkit.runtime.errors import JitDisabledError

    options = [*RELU.options, "-DSALT=failing"]
    tier = toy.FailingTier(isolated / "failing")
    handle = make_handle(sources=["system", tier, "jit"])
    _plant_unloadable(tier, options)
    capfd.readouterr()
    assert handle.program(RELU.kernel_file, options).source == "jit"  # discard and lease() raised
    err = capfd.readouterr().err
    assert "cache tier failing cannot forget" in err and "cache tier failing offers no compile lease" in err
    assert "Traceback" not in err
    monkeypatch.setenv("KDB_DISABLE_JIT", "1")
    with pytest.raises(JitDisabledError, match="the tier failing"):  # its searched() raised: the message says so
        make_handle(sources=["system", toy.FailingTier(isolated / "failing2"), "jit"]).program(
            RELU.kernel_file, [*RELU.options, "-DSALT=failing2"])


def test_a_lease_that_fails_on_release_never_replaces_or_swallows_the_compiles_outcome(toy):
    from kdbkit.runtime.errors import CompileError
    from kdbkit.runtime.jit import build_once
    from kdbkit.runtime.program_key import ProgramRequest, program_key

    key = program_key(ProgramRequest("activation.c", ()), target=__import__("kdbkit.kdb", fromlist=["Target"])
                      .Target.parse("sm_90"), compiler="toy 1", source_digest="0" * 64)

    def broken():
        raise CompileError("the toy source does not compile", "fix it")

    for lease in (toy.BadReleaseLease(), toy.BadReleaseLease(swallow=True)):
        with pytest.raises(CompileError, match="does not compile"):  # not the lease's ConnectionError, not None
            build_once(key, [lease], lambda: None, broken, lambda binary: None)
        assert build_once(key, [lease], lambda: None, lambda: b"bits", lambda binary: None) == (b"bits", True)


def test_the_jit_takes_the_tiers_leases_in_one_order_whatever_the_chains(make_handle, toy, isolated):
    toy.OrderedTier.taken.clear()
    chain = [toy.OrderedTier(isolated / "b", "b_tier"), toy.OrderedTier(isolated / "a", "a_tier")]
    make_handle(sources=["system", *chain, "jit"]).program(RELU.kernel_file, [*RELU.options, "-DSALT=order"])
    assert toy.OrderedTier.taken == ["a_tier", "b_tier"]  # by name: two processes never hold one the other waits for


def test_a_missing_kernel_file_is_the_requests_error_not_a_tiers(make_handle, toy, capfd, fresh_log):
    from kdbkit.runtime.errors import KernelSourceError

    capfd.readouterr()
    with pytest.raises(KernelSourceError):
        make_handle(sources=["system", "user", toy.FolderTier(), "jit"]).program("no_such_kernel.c", [])
    assert "failed (KernelSourceError" not in capfd.readouterr().err


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
