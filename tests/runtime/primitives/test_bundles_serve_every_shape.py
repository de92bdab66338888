"""Shapes are launch arguments: a bundle of the catalogue's programs serves every new shape with no JIT."""

from __future__ import annotations

import numpy as np

import kdbkit
from kdbkit.runtime.primitives.activation import ActivationMode
from kdbkit.runtime.primitives.catalogue import all_programs, catalogue_problems
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.reference import activation as activation_ref
from kdbkit.runtime.reference import convolution as conv_ref
from kdbkit.runtime.reference import softmax as softmax_ref
from kdbkit.runtime.solver import REGISTRY
from kdbkit.runtime.tensor import DataType

from .conftest import TYPES


def _programs_of(solvers) -> set:
    """The catalogue's programs of these solvers."""
    return {r for problem in catalogue_problems() for s in solvers if s.primitive == problem.primitive
            for r in s.programs(problem)}


def test_the_catalogue_is_one_program_per_kernel_file_type_and_tile():
    # Counts come from the registry: a new solver or primitive changes them, not this test.
    programs = all_programs()
    assert len(programs) == len(set(programs)) and set(programs) == _programs_of(list(REGISTRY))
    portable = [s for s in REGISTRY if s.backends is None]  # the dialect: every backend builds them
    portable_files = {r.kernel_file for r in _programs_of(portable)}
    assert portable_files and all(f.endswith(".c") for f in portable_files)
    types = {dtype.options[0] if dtype.options else "" for dtype in DataType}
    for name in portable_files:
        # fp32, fp16 and bf16 of each: every mode and shape is an argument; a few more tiles
        # per type at most (the long rows of softmax's and layer norm's lanes kernels; the
        # implicit GEMM's 256 x 64 and 64 x 256 tiles, and its TF32 build of fp32)
        of_file = [r for r in programs if r.kernel_file == name]
        assert {next((o.split("=")[0] for o in r.options if o.startswith("-DKDB_TYPE_")), "") for r in of_file} \
            == types and len(of_file) <= 4 * len(types), name
    for backend in ("opencl", "cuda", "hip"):
        # a backend's bundle: the portable programs plus those of the solvers only it builds
        own = [s for s in REGISTRY if s.backends is not None and backend in s.backends]
        assert set(all_programs(backend)) == _programs_of(portable) | _programs_of(own), backend
    assert {r.kernel_file for r in all_programs("opencl")} == portable_files  # no vendor-only source


# The solvers the test below calls: every solver of the primitives it leaves to immediate mode
# (activation, softmax, and the GEMM that ConvIm2colGemm multiplies with), and the convolution
# solvers it names.
IMMEDIATE_PRIMITIVES = ("activ", "softmax", "gemm")
CONV_SOLVERS = ("ConvDirect", "ConvIm2colGemm")


def programs_of_the_solvers_called(target) -> set[ProgramRequest]:
    """The catalogue's programs of those solvers that build for ``target`` (from the registry, so
    a solver added to one of those primitives, such as CUDA's tensor-core GEMM, is in): the whole
    catalogue is many PoCL compiles, minutes on the 2-core CI machine, most for primitives this
    test never calls."""
    solvers = [*(s for p in IMMEDIATE_PRIMITIVES for s in REGISTRY.for_primitive(p)),
               *(REGISTRY.find(name) for name in CONV_SOLVERS)]
    requests = set()
    for problem in catalogue_problems():
        for solver in solvers:
            if (solver.primitive == problem.primitive and solver.builds_for(target)
                    and (solver.backends is None or target.backend in solver.backends)):
                requests.update(solver.programs(problem))
    return requests


def test_a_bundle_of_the_catalogue_serves_random_new_shapes_with_no_jit(isolated, chain_backend, monkeypatch):
    from kdbkit.packager.device_build import build_bundle
    from kdbkit.runtime.handle import Handle

    programs = programs_of_the_solvers_called(chain_backend.device.target)
    build_bundle(chain_backend.device.target, sorted(programs, key=str), isolated / "system")
    monkeypatch.setenv("KDB_DISABLE_JIT", "1")  # a miss would raise JitDisabledError
    monkeypatch.setenv("KDB_DISABLE_CACHE", "1")
    sources = []
    real_program = Handle.program

    def counting(self, *args, **kwargs):
        program = real_program(self, *args, **kwargs)
        sources.append((program.source, args[0], tuple(args[1]) if len(args) > 1 else ()))
        return program

    monkeypatch.setattr(Handle, "program", counting)
    rng = np.random.default_rng(11)
    with Handle(backend=chain_backend) as handle:
        for _ in range(5):
            for dtype, (store, read, tol) in TYPES.items():
                shape = tuple(int(s) for s in rng.integers(1, 30, size=rng.integers(1, 5)))
                mode = ActivationMode(int(rng.integers(0, 12)))
                x = store(rng.standard_normal(shape))
                y = kdbkit.activation_forward(handle, x, mode, dtype=dtype, alpha=0.5, beta=1.0, gamma=2.0)
                np.testing.assert_allclose(read(y), activation_ref.forward(read(x), int(mode), 0.5, 1.0, 2.0),
                                           rtol=tol, atol=tol)
                shape4 = tuple(int(s) for s in rng.integers(1, 12, size=4))
                algorithm, mode4 = ["fast", "accurate", "log"][_ % 3], ["instance", "channel"][_ % 2]
                x4 = store(rng.standard_normal(shape4))
                y4 = kdbkit.softmax_forward(handle, x4, algorithm=algorithm, mode=mode4, dtype=dtype)
                np.testing.assert_allclose(read(y4), softmax_ref.forward(read(x4), algorithm, mode4), rtol=tol,
                                           atol=tol)
                groups, pad = (1 if _ % 2 == 0 else int(rng.integers(1, 3))), int(rng.integers(0, 2))
                n, c, k = int(rng.integers(1, 3)), groups * int(rng.integers(1, 4)), groups * int(rng.integers(1, 4))
                fy, fx = (int(v) for v in rng.integers(1, 4, size=2))
                xc = store(rng.standard_normal((n, c, int(rng.integers(fy, 12)), int(rng.integers(fx, 12)))))
                wc = store(rng.standard_normal((k, c // groups, fy, fx)))
                for solver in CONV_SOLVERS if groups == 1 else ("ConvDirect",):
                    yc = kdbkit.convolution_forward(handle, xc, wc, pad=pad, groups=groups, dtype=dtype, solver=solver)
                    expected = conv_ref.forward(read(xc), read(wc), (pad, pad), groups=groups)
                    np.testing.assert_allclose(read(yc), expected, rtol=tol, atol=tol * max(1.0, abs(expected).max()))
    # Each program came from the bundle once; every later problem found it loaded. Activation,
    # softmax and both convolution solvers' (with their GEMM's) in every type.
    assert {source for source, *_ in sources} == {"system", "memory"}
    first = [ProgramRequest(name, options) for source, name, options in sources if source == "system"]
    assert len(first) == len(set(first)) and set(first) <= programs
    assert {p.kernel_file for p in first} >= {"activ.c", "softmax.c", "conv_direct.c", "conv_gemm.c"}
