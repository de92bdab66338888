"""The chain's shape: a list of sources, one read per compile, closing, and what each log level adds."""

from __future__ import annotations

import re

from kdbkit.kdb import open_bundle
from kdbkit.runtime.program import Steps
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.samples import SAMPLES
from kdbkit.runtime.tier import Source

RELU = SAMPLES[0]


class SharedCache(Source):
    """A remote tier shared by a cluster, in its smallest form: a dict of binaries by request."""

    name = "remote"

    def __init__(self, store: dict[ProgramRequest, bytes]):
        self.store = store
        self.asked = 0

    def get(self, request: ProgramRequest, steps: Steps) -> bytes | None:
        self.asked += 1
        with steps.time("remote") as t:
            binary = self.store.get(request)
            t.outcome = "hit" if binary is not None else "miss"
        return binary


def test_a_new_tier_is_one_source_added_to_the_list(make_handle):
    first = make_handle()
    program = first.program(RELU.kernel_file, RELU.options)
    binary = open_bundle(first.user_cache_path).get(*next((e.kernel_name, e.kernel_args)
                                                           for e in open_bundle(first.user_cache_path).entries()))
    remote = SharedCache({program.request: binary})
    handle = make_handle(sources=[remote, "system", "user", "jit"])  # before the system bundles, say
    assert handle.sources[0] is remote and [s.name for s in handle.sources] == ["remote", "system", "user", "jit"]
    found = handle.program(RELU.kernel_file, RELU.options)
    assert found.source == "remote" and [s.name for s in found.steps] == ["memory", "remote", "load"]
    assert handle.program(RELU.kernel_file, RELU.options).source == "memory" and remote.asked == 1


def test_a_binary_that_does_not_load_is_discarded_and_the_next_tier_serves(make_handle):
    make_handle().program(RELU.kernel_file, RELU.options)  # the user cache now has it
    remote = SharedCache({ProgramRequest(RELU.kernel_file, RELU.options): b"\x7fELF not a binary for this device"})
    handle = make_handle(sources=[remote, "system", "user", "jit"])
    found = handle.program(RELU.kernel_file, RELU.options)
    steps = [(s.name, s.outcome) for s in found.steps]
    assert found.source == "user"
    assert steps[1:3] == [("remote", "hit"), ("load", "unloadable")] and steps[-2:] == [("user", "hit"), ("load", "loaded")]


def test_what_is_compiled_is_stored_under_the_key_of_that_very_text(make_handle, private_kernels, monkeypatch):
    # An edit lands while the compiler runs. What was compiled is the text read before it, so
    # it must be stored under that text's key: a handle that sees the edit must not get it.
    from kdbkit.runtime.compilers import compiler_for

    handle = make_handle()
    compiler_class = type(compiler_for(handle.target))
    real = compiler_class.compile
    source = private_kernels / RELU.kernel_file

    def compile_then_edit(self, request, target, read):
        binary = real(self, request, target, read)
        source.write_text(source.read_text() + "\n/* edited during the compile */\n")
        return binary

    monkeypatch.setattr(compiler_class, "compile", compile_then_edit)
    assert handle.program(RELU.kernel_file, RELU.options).source == "jit"
    monkeypatch.setattr(compiler_class, "compile", real)
    later = make_handle()  # sees the edited file: another key
    assert later.program(RELU.kernel_file, RELU.options).source == "jit"


def test_closing_a_handle_closes_the_backend_it_opened_and_only_that(isolated, chain_device, chain_backend):
    import numpy as np

    from kdbkit.runtime.handle import Handle

    with Handle(chain_device) as owned:
        owned.program(RELU.kernel_file, RELU.options)
        backend = owned.backend
    assert backend is not chain_backend
    released = {"opencl": lambda b: b._queue is None, "cuda": lambda b: b._ctx is None}
    assert released[backend.name](backend)
    with Handle(backend=chain_backend) as shared:
        shared.program(RELU.kernel_file, RELU.options)
    x = np.arange(3, dtype=np.float32)  # a backend the caller lent stays open for the caller
    assert (chain_backend.to_host(chain_backend.to_device(x), np.empty_like(x)) == x).all()


def _resolve_at_level(level: str, monkeypatch, capfd, fresh_log, make_handle) -> list[str]:
    monkeypatch.setenv("KDB_LOG_LEVEL", level)
    fresh_log()
    capfd.readouterr()
    handle = make_handle()
    options = [*RELU.options, f"-DSALT=level{level}"]  # compiled afresh at each level
    handle.program(RELU.kernel_file, options)
    handle.program(RELU.kernel_file, options)
    return [line for line in capfd.readouterr().err.splitlines() if line.startswith("kdbkit ")]


def test_levels_6_and_7_add_detail_that_5_does_not_show(make_handle, monkeypatch, capfd, fresh_log):
    at = {level: _resolve_at_level(level, monkeypatch, capfd, fresh_log, make_handle) for level in ("5", "6", "7")}
    words = {level: {line.split(":", 1)[0] for line in lines} for level, lines in at.items()}
    assert words["5"] == {"kdbkit info", "kdbkit warning"}
    assert "kdbkit info2" in words["6"] and "kdbkit trace" not in words["6"]
    assert "kdbkit trace" in words["7"]
    # 5: the handle and the compile; 6: each step with its time and every bundle considered;
    # 7: the key looked up in each tier and the compiler's command.
    assert any("compiled for" in line for line in at["5"])
    assert any(re.search(r"activation\.c \[.*\]: memory miss .* ms, user miss", line) for line in at["6"])
    assert not any("info2" in line for line in at["5"])
    assert any("--kdb-key=" in line and "miss" in line for line in at["7"])
    assert len(at["5"]) < len(at["6"]) < len(at["7"])
