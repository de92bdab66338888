"""The background prefetch of the programs a system bundle served the last closed handle (PoCL in CI)."""

from __future__ import annotations

import threading

from kdbkit.runtime import prefetch, startup_memo
from kdbkit.runtime.handle import Handle
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.samples import SAMPLES

from .test_resolution import _system_bundle


def _asked_in_order(handle, samples):
    return [handle.program(s.kernel_file, s.options) for s in samples]


def _memo_entry(handle):
    return startup_memo.memo().section(prefetch.SECTION).get(handle._prefetch_key)


def test_a_closed_handle_notes_its_programs_and_the_next_one_loads_them_in_the_background(
        isolated, chain_backend, monkeypatch):
    _system_bundle(isolated / "system", chain_backend, chain_backend.device.target)
    with Handle(backend=chain_backend) as first:
        assert [p.source for p in _asked_in_order(first, reversed(SAMPLES))] == ["system"] * len(SAMPLES)
        first.program(SAMPLES[0].kernel_file, SAMPLES[0].options)  # asked again: listed once
    assert _memo_entry(first) == [[s.kernel_file, list(ProgramRequest(s.kernel_file, s.options).options)]
                                  for s in reversed(SAMPLES)]  # in the order first asked

    with Handle(backend=chain_backend) as second:  # the worker starts with the handle, before any call
        assert second._prefetch is not None and second._prefetch.listed == len(SAMPLES)
        assert [s.outcome for s in second.prepare_steps if s.name == "start prefetch"] == [f"{len(SAMPLES)} programs"]
        second._prefetch._thread.join(10)
        assert [p.source for p in _asked_in_order(second, reversed(SAMPLES))] == ["memory"] * len(SAMPLES)
        assert second.resolved_by_source == {"system": len(SAMPLES)}  # each loaded once, by the worker
        from kdbkit.runtime.samples import run_samples

        assert all(r.ok for r in run_samples(second, seed=5))  # the prefetched programs compute


def test_a_program_the_worker_has_not_reached_is_loaded_at_once_by_the_caller(isolated, chain_backend, monkeypatch):
    from kdbkit.runtime.lookup import LookupChain

    _system_bundle(isolated / "system", chain_backend, chain_backend.device.target)
    with Handle(backend=chain_backend) as first:
        _asked_in_order(first, SAMPLES)
    gate, given, real = threading.Event(), [], LookupChain.preload

    def gated(chain, request, source):
        given.append(request)
        gate.wait(10)
        return real(chain, request, source)

    monkeypatch.setattr(LookupChain, "preload", gated)
    with Handle(backend=chain_backend) as second:
        held, *_, last = [ProgramRequest(s.kernel_file, s.options) for s in SAMPLES]
        assert second.program(last.kernel_file, last.options).source == "system"  # not behind the held one
        assert not gate.is_set() and given == [held]
        gate.set()
        assert second.program(held.kernel_file, held.options).source == "memory"  # waited for, not loaded twice
        second._prefetch._thread.join(10)
        assert last not in given  # the worker skipped the one the caller took
        assert second.resolved_by_source == {"system": len(SAMPLES)}


def test_the_worker_never_compiles_and_a_damaged_list_prefetches_nothing(isolated, chain_backend):
    _system_bundle(isolated / "system", chain_backend, chain_backend.device.target, samples=SAMPLES[:1])
    with Handle(backend=chain_backend) as first:
        first.program(SAMPLES[0].kernel_file, SAMPLES[0].options)
    key = first._prefetch_key
    listed = _memo_entry(first) + [[s.kernel_file, list(s.options)] for s in SAMPLES[1:]]  # not in the bundle
    startup_memo.memo().put(prefetch.SECTION, key, listed + [["relu.c", ["-D"]], "junk", [1, 2]])
    with Handle(backend=chain_backend) as second:
        second.program(SAMPLES[1].kernel_file, SAMPLES[1].options)  # JIT: the bundle lacks it
        second._prefetch.close()
        assert second.resolved_by_source == {"system": 1, "jit": 1}  # the worker compiled nothing
    assert prefetch.remembered({"not": "a list"}) == [] and prefetch.remembered([["a.c", "-DX"]]) == []
    assert prefetch.remembered([["a.c", ["-DX", "-D"]], ["b.c", ["-DY"]]]) == [ProgramRequest("b.c", ("-DY",))]


def test_prefetch_can_be_switched_off_and_close_stops_the_worker(isolated, chain_backend, monkeypatch):
    _system_bundle(isolated / "system", chain_backend, chain_backend.device.target)
    with Handle(backend=chain_backend) as first:
        _asked_in_order(first, SAMPLES)
    monkeypatch.setenv("KDB_DISABLE_PREFETCH", "1")
    with Handle(backend=chain_backend) as off:
        _asked_in_order(off, SAMPLES)  # (the memo then lists what this handle used: the same)
        assert off._prefetch is None
    monkeypatch.delenv("KDB_DISABLE_PREFETCH")
    from kdbkit.runtime.lookup import LookupChain

    gate, real = threading.Event(), LookupChain.preload
    monkeypatch.setattr(LookupChain, "preload", lambda chain, request, source: gate.wait(5) and real(chain, request, source))
    handle = Handle(backend=chain_backend)
    assert handle._prefetch._thread.is_alive()
    gate.set()
    handle.close()  # waits for the program in hand, skips the rest
    assert not handle._prefetch._thread.is_alive()
