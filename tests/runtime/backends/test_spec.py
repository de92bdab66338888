"""The backend specs: one per backend, in discovery order, agreeing with the arch spellings of
kdbkit.kdb.arch, with the backend classes (name, binary format, capabilities they really have),
with the compilers, ``KDB_BACKEND`` and discovery; capabilities are declared, never guessed."""

from __future__ import annotations

import pytest

from kdbkit.kdb import arch
from kdbkit.kdb.target import Target
from kdbkit.packager.build import refuse_local_only
from kdbkit.runtime import env
from kdbkit.runtime.backends import registry
from kdbkit.runtime.backends.spec import BACKEND_NAMES, BACKENDS, CAPABILITIES, BackendSpec, spec_for
from kdbkit.runtime.compilers import compilers_for
from kdbkit.packager.errors import TargetError
from kdbkit.runtime.errors import BackendUnavailableError, ProblemError

# What each capability promises a backend class has (see spec.CAPABILITIES).
METHODS = {"occupancy": "resident_groups", "wrap": "wrap", "tensor_maps": "tensor_map"}


def test_one_spec_per_arch_spelling_in_discovery_order():
    assert BACKEND_NAMES == arch.BACKENDS == tuple(registry.DISCOVERERS)
    for spec in BACKENDS:
        assert spec.arch_spelling.backend == spec.name and spec_for(spec.name) is spec
    with pytest.raises(BackendUnavailableError, match="unknown backend 'tpu' for a device"):
        spec_for("tpu", "a device")


@pytest.mark.parametrize("spec", BACKENDS, ids=BACKEND_NAMES)
def test_each_backend_class_is_what_its_spec_declares(spec):
    cls = spec.load_backend_class()
    assert (cls.name, cls.binary_format, cls.capabilities) == (spec.name, spec.binary_format, spec.capabilities)
    assert registry.binary_format_of(spec.name) == spec.binary_format
    for capability, method in METHODS.items():
        assert callable(getattr(cls, method, None)) is spec.has(capability), (spec.name, capability)
    assert callable(spec.arch_spelling.regex.fullmatch) and spec.install_remedy and spec.compiler_remedy
    if not spec.machine_local:
        assert [type(c) for c in compilers_for(spec.name)] == spec.compiler_classes()


def test_capabilities_and_specs_refuse_unknown_names():
    assert set(CAPABILITIES) == {"streams", "occupancy", "wrap", "param_blocks", "tensor_maps"}
    with pytest.raises(ValueError, match="unknown backend capability 'stream'"):
        spec_for("cuda").has("stream")
    with pytest.raises(ValueError, match="unknown capabilities"):
        BackendSpec("x", "y", "m:f", "m:C", (), False, "", "", frozenset({"teleport"}))


def test_only_machine_local_targets_are_refused_for_a_build_elsewhere():
    assert [s.name for s in BACKENDS if s.machine_local] == ["opencl"]
    refuse_local_only([Target.parse("sm_90a_132"), Target.parse("gfx942:xnack-")])
    with pytest.raises(TargetError, match="cannot be built on a cluster"):
        refuse_local_only([Target.parse("ocl-3f9a1c2b7d10_2")])


def test_kdb_backend_takes_every_backend_name(monkeypatch):
    monkeypatch.setenv("KDB_BACKEND", ",".join(reversed(BACKEND_NAMES)))
    assert env.get_choices("KDB_BACKEND") == BACKEND_NAMES  # in discovery order, whatever the order given
    assert registry.selected_backends() == BACKEND_NAMES


def test_the_default_device_is_a_gpu_before_a_machine_local_one():
    def dev(backend: str, text: str):
        from kdbkit.runtime.backends.base import DeviceInfo

        return DeviceInfo(backend, 0, backend, Target.parse(text), 1)

    ocl, hip = dev("opencl", "ocl-3f9a1c2b7d10_2"), dev("hip", "gfx942_304")
    assert registry.default_device([ocl, hip]) is hip and registry.default_device([ocl]) is ocl


def test_set_stream_follows_the_declared_capability(make_handle):
    handle = make_handle()
    if spec_for(handle.backend.name).has("streams"):
        handle.set_stream(None)
        assert handle.backend.stream == 0
    else:
        with pytest.raises(ProblemError, match="takes no stream"):
            handle.set_stream(None)
