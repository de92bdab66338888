"""``KDB_CACHE_POLICY``: what a process may read, write and compile, and the stricter of it and
the older switches."""

from __future__ import annotations

import pytest

from kdbkit.kdb import open_bundle
from kdbkit.packager.device_build import build_bundle
from kdbkit.runtime.errors import JitDisabledError
from kdbkit.runtime.samples import SAMPLES

RELU, OTHER = SAMPLES[0], SAMPLES[1]


def _ukdb_entries(isolated) -> int:
    (path,) = (isolated / "cache").glob("*.ukdb")
    with open_bundle(path) as bundle:
        return bundle.count()


def _fill_user_cache(make_handle) -> None:
    assert make_handle().program(RELU.kernel_file, RELU.options).source == "jit"


def test_readonly_reads_the_user_cache_and_writes_nothing(make_handle, isolated, monkeypatch):
    _fill_user_cache(make_handle)
    monkeypatch.setenv("KDB_CACHE_POLICY", "readonly")
    handle = make_handle()
    assert handle.program(RELU.kernel_file, RELU.options).source == "user"
    assert handle.program(OTHER.kernel_file, OTHER.options).source == "jit"  # compiled, kept in memory only
    assert _ukdb_entries(isolated) == 1
    assert not handle.sources[1].writable and "user" == handle.sources[1].name


def test_readonly_creates_no_cache_file(make_handle, isolated, monkeypatch):
    monkeypatch.setenv("KDB_CACHE_POLICY", "readonly")
    assert make_handle().program(RELU.kernel_file, RELU.options).source == "jit"
    assert not list((isolated / "cache").glob("*.ukdb*"))


def test_off_neither_reads_nor_writes_the_user_cache(make_handle, isolated, monkeypatch):
    _fill_user_cache(make_handle)
    monkeypatch.setenv("KDB_CACHE_POLICY", "off")
    handle = make_handle()
    assert [t.name for t in handle.sources] == ["system", "jit"]
    assert handle.program(RELU.kernel_file, RELU.options).source == "jit"


def test_installed_only_serves_installed_bundles_and_refuses_the_rest(make_handle, isolated, chain_backend,
                                                                     monkeypatch):
    _fill_user_cache(make_handle)  # what the user cache holds does not count
    build_bundle(chain_backend.device.target, [(OTHER.kernel_file, OTHER.options)], isolated / "system")
    monkeypatch.setenv("KDB_CACHE_POLICY", "installed-only")
    handle = make_handle()
    assert handle.program(OTHER.kernel_file, OTHER.options).source == "system"
    with pytest.raises(JitDisabledError) as info:
        handle.program(RELU.kernel_file, RELU.options)
    assert "KDB_CACHE_POLICY=installed-only" in info.value.remedy
    assert handle.target.built_bundle_name() in info.value.remedy


@pytest.mark.parametrize("policy", ["readwrite", "readonly"])
def test_disable_jit_stays_stricter_than_the_policy(make_handle, monkeypatch, policy):
    monkeypatch.setenv("KDB_CACHE_POLICY", policy)
    monkeypatch.setenv("KDB_DISABLE_JIT", "1")
    with pytest.raises(JitDisabledError) as info:
        make_handle().program(RELU.kernel_file, RELU.options)
    assert "unset KDB_DISABLE_JIT" in info.value.remedy


def test_a_policy_not_understood_warns_once_and_reads_and_writes(make_handle, isolated, monkeypatch, capsys):
    monkeypatch.setenv("KDB_CACHE_POLICY", "read-only-please")
    make_handle().program(RELU.kernel_file, RELU.options)
    make_handle()
    warnings = [line for line in capsys.readouterr().err.splitlines() if "KDB_CACHE_POLICY" in line]
    assert len(warnings) == 1 and "readwrite, readonly, off, installed-only" in warnings[0]
    assert _ukdb_entries(isolated) == 1
