"""The lookup chain end to end on PoCL: memory, system bundle, user cache, JIT, with real kernels."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from kdbkit.kdb import Target, open_bundle
from kdbkit.packager.device_build import build_bundle
from kdbkit.runtime.errors import JitDisabledError
from kdbkit.runtime.samples import SAMPLES, run_samples

RELU = SAMPLES[0]


def _system_bundle(folder, backend, target: Target, samples=SAMPLES, name=None, bundle_target=None):
    return build_bundle(backend.device.target, [(s.kernel_file, s.options) for s in samples], folder,
                        bundle_target=bundle_target or target, file_name=name)


def test_jit_then_user_cache_then_memory(make_handle, isolated):
    first = make_handle()
    results = run_samples(first, seed=1)
    assert [r.source for r in results] == ["jit"] * len(SAMPLES)
    assert all(r.ok for r in results), [(r.name, r.rel_error) for r in results]
    again = first.program(RELU.kernel_file, RELU.options)
    assert again.source == "memory"

    second = make_handle()  # a new handle has an empty memory cache: the user cache serves
    results = run_samples(second, seed=2)
    assert [r.source for r in results] == ["user"] * len(SAMPLES)
    assert all(r.ok for r in results)
    ukdb = isolated / "cache" / second.target.arch_wide().bundle_name(".ukdb")
    assert open_bundle(ukdb).count() == len(SAMPLES)


def test_system_bundle_comes_first(make_handle, isolated, chain_backend):
    _system_bundle(isolated / "system", chain_backend, chain_backend.device.target)
    handle = make_handle()
    results = run_samples(handle, seed=3)
    assert [r.source for r in results] == ["system"] * len(SAMPLES) and all(r.ok for r in results)
    assert not (isolated / "cache").exists()  # nothing compiled, nothing written
    assert [(s[0], s[2]) for s in results[0].steps] == [
        ("memory", "miss"), (f"system {handle.target.bundle_name()}", "hit"), ("load", "loaded")]


def test_a_handle_prepares_so_that_a_hit_reads_no_kernel_source(make_handle, isolated, chain_backend, monkeypatch):
    from kdbkit.runtime import kernel_sources

    _system_bundle(isolated / "system", chain_backend, chain_backend.device.target)
    handle = make_handle()
    assert [(s.name, s.outcome) for s in handle.prepare_steps] == [
        ("open system bundle", chain_backend.device.target.bundle_name()),
        ("digest kernel sources", f"{len({s.kernel_file for s in SAMPLES})} sources")]  # the bundle's manifest
    assert [c.status for c in handle.system_trace] == ["accepted"]  # opened before any program
    touched = []
    monkeypatch.setattr(kernel_sources, "_file_info", lambda path: touched.append(path))
    results = run_samples(handle, seed=4)
    assert [r.source for r in results] == ["system"] * len(SAMPLES) and all(r.ok for r in results)
    assert touched == []


@pytest.mark.parametrize("extra_files", [5, 500])
def test_making_a_handle_reads_only_the_bundles_sources_however_many_there_are(
        make_handle, isolated, chain_backend, monkeypatch, tmp_path, extra_files):
    from kdbkit.runtime import kernel_sources
    from kdbkit.runtime.handle import Handle

    _system_bundle(isolated / "system", chain_backend, chain_backend.device.target)
    library = tmp_path / "library_kernels"
    library.mkdir()
    for i in range(extra_files):
        (library / f"extra_{i}.c").write_text(f"__kernel void extra_{i}(__global float *x) {{ x[0] = {i}; }}\n")
    read = []
    real = kernel_sources._file_info
    monkeypatch.setattr(kernel_sources, "_file_info", lambda path: read.append(path) or real(path))
    with Handle(backend=chain_backend, kernel_path=[library]) as handle:
        assert handle.prepare_steps[-1].outcome == f"{len({s.kernel_file for s in SAMPLES})} sources"
        assert not [p for p in read if "extra_" in p]  # the library's own files wait for their first use
        assert handle.program(RELU.kernel_file, RELU.options).source == "system"


def test_a_bundle_built_from_other_sources_is_named_once_and_its_programs_compile(
        make_handle, isolated, chain_backend, private_kernels, capfd):
    _system_bundle(isolated / "system", chain_backend, chain_backend.device.target)
    source = private_kernels / RELU.kernel_file
    source.write_text(source.read_text() + "\n/* edited after the bundle was built */\n")
    handle = make_handle()
    assert handle.prepare_steps[-1].outcome.endswith("1 differ from the bundle's")
    err = capfd.readouterr().err
    assert f"was built from other versions of 1 kernel source(s) ({RELU.kernel_file})" in err
    assert handle.program(RELU.kernel_file, RELU.options).source == "jit"  # never the stale binary
    make_handle()
    assert "other versions" not in capfd.readouterr().err  # once per process


def test_a_handle_opens_an_existing_user_cache_but_creates_none(make_handle, isolated):
    first = make_handle()
    assert (first.prepare_steps[-1].name, first.prepare_steps[-1].outcome) == ("open user cache", "none yet")
    assert not (isolated / "cache").exists()  # making a handle writes nothing
    assert first.program(RELU.kernel_file, RELU.options).source == "jit"
    second = make_handle()
    assert second.prepare_steps[-1].outcome == "opened"
    assert second.program(RELU.kernel_file, RELU.options).source == "user"


def test_an_edit_made_after_the_handle_is_compiled_under_its_own_key(make_handle, private_kernels):
    handle = make_handle()  # sees the sources as they are now
    source = private_kernels / RELU.kernel_file
    source.write_text(source.read_text() + "\n/* edited after the handle was made */\n")
    assert handle.program(RELU.kernel_file, RELU.options).source == "jit"
    # Stored under the edited source's key, so a handle that sees the edit finds it.
    assert make_handle().program(RELU.kernel_file, RELU.options).source == "user"


def test_arch_wide_bundle_serves_when_the_exact_one_is_missing(make_handle, isolated, chain_backend):
    target = chain_backend.device.target
    _system_bundle(isolated / "system", chain_backend, target, samples=SAMPLES[:1], bundle_target=target.arch_wide())
    handle = make_handle()
    assert handle.program(RELU.kernel_file, RELU.options).source == "system"
    assert handle.program(SAMPLES[1].kernel_file, SAMPLES[1].options).source == "jit"  # not in the bundle


def test_missing_system_bundle_warns_once(make_handle, isolated, capfd, monkeypatch):
    from kdbkit.runtime import logging_setup

    monkeypatch.setattr(logging_setup, "_once_keys", set())
    logging_setup.configure_logging(force=True)
    h = make_handle()
    h.program(RELU.kernel_file, RELU.options)
    make_handle().program(RELU.kernel_file, RELU.options)
    err = capfd.readouterr().err
    line = f"Missing system database file: {h.target.built_bundle_name()} Performance may degrade"
    assert err.count(line) == 1


def test_wrong_target_bundle_is_never_loaded(make_handle, isolated, chain_backend):
    # A bundle whose file name matches the device but whose metadata names another arch.
    mine = chain_backend.device.target
    other_arch = {"cuda": "sm_10" if mine.arch != "sm_10" else "sm_11", "hip": "gfx000",
                  "opencl": "ocl-000000000000"}[mine.backend]
    other = Target(mine.backend, other_arch, (), mine.cu)
    _system_bundle(isolated / "system", chain_backend, chain_backend.device.target, samples=SAMPLES[:1],
                   name=chain_backend.device.target.bundle_name(), bundle_target=other)
    handle = make_handle()
    assert handle.program(RELU.kernel_file, RELU.options).source == "jit"
    assert any(c.status == "rejected" and "arch" in c.reason for c in handle.system_trace)


def test_corrupt_system_entry_is_skipped(make_handle, isolated, chain_backend):
    path = _system_bundle(isolated / "system", chain_backend, chain_backend.device.target, samples=SAMPLES[:1])
    conn = sqlite3.connect(path)
    conn.execute("UPDATE kern_db SET kernel_hash = 'bad'")
    conn.commit()
    conn.close()
    program = make_handle().program(RELU.kernel_file, RELU.options)
    assert program.source == "jit"
    assert any(s.outcome == "corrupt" for s in program.steps)


def test_disable_jit_names_the_program_and_the_bundle(make_handle, monkeypatch):
    monkeypatch.setenv("KDB_DISABLE_JIT", "1")
    handle = make_handle()
    with pytest.raises(JitDisabledError) as info:
        handle.program(RELU.kernel_file, RELU.options)
    msg = str(info.value)
    assert "activation.c" in msg and handle.target.built_bundle_name() in msg and "the user cache" in msg
    assert "unset KDB_DISABLE_JIT" in info.value.remedy and "`kdb devices`" in info.value.remedy


def test_disable_jit_still_uses_the_user_cache(make_handle, monkeypatch):
    make_handle().program(RELU.kernel_file, RELU.options)
    monkeypatch.setenv("KDB_DISABLE_JIT", "1")
    assert make_handle().program(RELU.kernel_file, RELU.options).source == "user"


def test_disable_cache_neither_reads_nor_writes(make_handle, isolated, monkeypatch):
    monkeypatch.setenv("KDB_DISABLE_CACHE", "yes")
    assert make_handle().program(RELU.kernel_file, RELU.options).source == "jit"
    assert make_handle().program(RELU.kernel_file, RELU.options).source == "jit"
    assert not (isolated / "cache").exists()


def test_option_order_does_not_change_the_key(make_handle):
    make_handle().program("matmul_tiled.c", ["-DTILE=16", "-DUNUSED=1"])
    assert make_handle().program("matmul_tiled.c", "-DUNUSED=1 -D TILE=16").source == "user"


def test_editing_an_included_header_invalidates(make_handle, private_kernels):
    make_handle().program(RELU.kernel_file, RELU.options)
    assert make_handle().program(RELU.kernel_file, RELU.options).source == "user"
    header = private_kernels / "kdb_compat.h"
    header.write_text(header.read_text() + "\n/* edited */\n")
    assert make_handle().program(RELU.kernel_file, RELU.options).source == "jit"


def test_another_compiler_version_is_never_used(make_handle, monkeypatch, chain_backend):
    from kdbkit.runtime.compilers import compiler_for

    make_handle().program(RELU.kernel_file, RELU.options)
    compiler = compiler_for(chain_backend.device.target)
    real = compiler.identity()
    monkeypatch.setattr(type(compiler), "identity", lambda self: real + " (upgraded)")
    assert make_handle().program(RELU.kernel_file, RELU.options).source == "jit"


def test_parallel_resolution_of_many_programs(make_handle, monkeypatch):
    monkeypatch.setenv("KDB_COMPILE_PARALLEL_LEVEL", "4")
    handle = make_handle()
    reqs = [("activation.c", [f"-DSALT={i}"]) for i in range(6)]
    programs = handle.programs(reqs)
    assert [p.source for p in programs] == ["jit"] * 6
    assert len({id(p.module) for p in programs}) == 6


def test_resolution_is_logged_with_source_and_time(make_handle, monkeypatch, capfd):
    from kdbkit.runtime import logging_setup

    monkeypatch.setenv("KDB_ENABLE_LOGGING", "1")
    logging_setup.configure_logging(force=True)
    try:
        make_handle().program(RELU.kernel_file, RELU.options)
        err = capfd.readouterr().err
        assert "resolve activation.c" in err and ": jit in " in err and " ms" in err
    finally:
        monkeypatch.delenv("KDB_ENABLE_LOGGING")
        logging_setup.configure_logging(force=True)


def test_results_are_right_for_random_inputs(make_handle):
    for seed in range(3):
        assert all(r.ok for r in run_samples(make_handle(), seed=seed))
    assert np.isfinite(run_samples(make_handle(), seed=9)[2].rel_error)
