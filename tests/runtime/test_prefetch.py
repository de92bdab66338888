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
        assert [s.outcome for s in second.prepare_steps
                if s.name == "start prefetch"] == [f"{len(SAMPLES)} programs, 0 problems"]
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


def test_the_problems_a_closed_handle_ran_are_set_up_again_by_the_next_one_s_worker(isolated, chain_backend):
    import numpy as np

    import kdbkit
    from kdbkit.packager.device_build import build_bundle

    x = np.random.default_rng(3).standard_normal((4, 33)).astype(np.float32)

    def run(handle):
        return (kdbkit.softmax_forward(handle, x), kdbkit.activation_forward(handle, x, "relu"))

    with Handle(backend=chain_backend) as jit:  # which programs the two calls use
        expected = run(jit)
        used = list(jit._asked)
    build_bundle(chain_backend.device.target, [(r.kernel_file, r.options) for r in used], isolated / "system")
    with Handle(backend=chain_backend) as first:
        run(first)
        configs = list(first.dispatcher.choices)
    assert len(configs) == 2 and _memo_entry(first) and \
        startup_memo.memo().section(prefetch.PROBLEMS_SECTION)[first._prefetch_key] == configs

    with Handle(backend=chain_backend) as second:  # the worker chooses and builds both before any call
        assert second._prefetch.listed == len(used) + 2
        second._prefetch._thread.join(10)
        assert list(second.dispatcher.choices) == configs and [config for config, _ in second.dispatcher.invokers] == configs
        choices, invokers = dict(second.dispatcher.choices), dict(second.dispatcher.invokers)
        results = run(second)  # the caller's calls take them: nothing chosen or built again
        assert second.dispatcher.choices == choices and all(second.dispatcher.invokers[k] is v for k, v in invokers.items())
        assert len(second.dispatcher.invokers) == len(invokers)
        for got, want in zip(results, expected):
            np.testing.assert_allclose(got, want, rtol=1e-6)
        assert second.resolved_by_source == {"system": len(used)} and list(second._problems) == configs


def test_a_problem_whose_program_the_bundle_lacks_is_left_to_the_caller_and_never_compiled(isolated, chain_backend):
    import numpy as np

    import kdbkit

    x = np.random.default_rng(4).standard_normal((3, 17)).astype(np.float32)
    with Handle(backend=chain_backend) as first:  # no bundle yet: its programs come from the JIT
        want = kdbkit.activation_forward(first, x, "relu")
    _system_bundle(isolated / "system", chain_backend, chain_backend.device.target, samples=SAMPLES[:1])
    with Handle(backend=chain_backend) as second:  # a bundle without the relu program: nothing listed yet
        kdbkit.activation_forward(second, x, "relu")
    memo = startup_memo.memo()
    (relu,) = memo.section(prefetch.PROBLEMS_SECTION).get(second._prefetch_key)  # the problem is listed
    memo.put(prefetch.PROBLEMS_SECTION, second._prefetch_key, [relu, "nonsense,x=1", 7])  # damaged ones skipped
    with Handle(backend=chain_backend) as third:
        third._prefetch._thread.join(10)
        assert list(third.dispatcher.choices) == [relu] and third.dispatcher.invokers == {}  # chosen; its invoker left to the caller
        assert third.resolved_by_source == {}  # the worker compiled nothing and loaded nothing from elsewhere
        np.testing.assert_allclose(kdbkit.activation_forward(third, x, "relu"), want)
        assert third.resolved_by_source == {"user": 1}


def test_bundle_only_is_the_resolver_a_call_passes_not_a_switch_on_the_thread(isolated, chain_backend):
    """The worker sets a problem up through the dispatcher with a resolver that reads the system
    bundle only; nothing about the thread changes what the handle's lookup does. The same call
    made from the caller's thread leaves a problem whose program the bundle lacks unresolved
    (nothing kept, nothing compiled, nothing loaded), and the caller's own call then compiles it."""
    import numpy as np
    import pytest

    import kdbkit
    from kdbkit.runtime.primitives.activation import ActivationMode, ActivationProblem
    from kdbkit.runtime.tensor import DataType

    x = np.random.default_rng(6).standard_normal((3, 17)).astype(np.float32)
    problem = ActivationProblem("fwd", ActivationMode.RELU, DataType.FP32, (3, 17), (17, 1), (17, 1))
    _system_bundle(isolated / "system", chain_backend, chain_backend.device.target, samples=SAMPLES[:1])
    with Handle(backend=chain_backend) as handle:  # a bundle without the relu program
        assert not any(isinstance(v, threading.local) for v in vars(handle).values())
        with pytest.raises(Exception, match="left to the caller"):
            handle.dispatcher.invoker(problem, resolver=handle._from_bundle)
        assert dict(handle.dispatcher.invokers) == {} and handle.resolved_by_source == {}
        np.testing.assert_allclose(kdbkit.activation_forward(handle, x, "relu"), np.maximum(x, 0))
        assert "system" not in handle.resolved_by_source and sum(handle.resolved_by_source.values()) == 1
        assert list(handle.dispatcher.invokers) == [(problem.config(), handle.dispatcher.choose(problem).solver.id)]


def test_the_worker_collects_garbage_once_after_its_list_unless_stopped(monkeypatch):
    collected, done = [], []
    monkeypatch.setattr(prefetch.gc, "collect", lambda *a: collected.append(list(done)))
    monkeypatch.setattr(prefetch, "SMALL_PROCESS_BLOCKS", 1 << 62)  # a small process (pytest's is not)
    worker = prefetch.Prefetch(done.append, ["a", "b"])
    worker._thread.join(10)
    assert collected == [["a", "b"]]  # after the work, so that its allocations' full collection happens then
    gate = threading.Event()
    stopped = prefetch.Prefetch(lambda item: gate.wait(10), ["c", "d"])
    stopped._stop.set()
    gate.set()
    stopped.close()
    assert collected == [["a", "b"]]  # a handle being closed does not wait for a collection
    gate = threading.Event()
    calling = prefetch.Prefetch(lambda item: gate.wait(10), ["x", "y"])
    calling.wait("y")  # the caller makes its calls: a collection now would stall them
    gate.set()
    calling._thread.join(10)
    assert collected == [["a", "b"]]
    monkeypatch.setattr(prefetch, "SMALL_PROCESS_BLOCKS", 0)  # a large process: a full collection costs too much
    prefetch.Prefetch(done.append, ["e"])._thread.join(10)
    assert collected == [["a", "b"]] and done[-1] == "e"


def test_a_worker_of_a_handle_never_closed_is_stopped_at_exit(tmp_path):
    import subprocess
    import sys

    marks = tmp_path / "marks"
    code = f"""
import time
from kdbkit.runtime import prefetch
marks = open({str(marks)!r}, "a", buffering=1)
def work(item):
    marks.write(f"start {{item}}\\n"); time.sleep(0.2); marks.write(f"end {{item}}\\n")
prefetch.Prefetch(work, ["a", "b", "c"])
time.sleep(0.05)
"""  # exits while "a" is in hand, without closing anything
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert marks.read_text().split("\n")[:-1] == ["start a", "end a"]  # finished in hand, the rest skipped
