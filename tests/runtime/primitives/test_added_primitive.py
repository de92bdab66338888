"""A new primitive is one package folder (problem, solver, API, driver command) plus its kernel:
here a toy one, ``toyscale`` (y = a * x), written into a temporary folder and registered through
the entry-point group ``kdbkit.primitives`` (a ``.dist-info`` beside it on ``PYTHONPATH``, as
``pip install`` would leave one), with no kdbkit file edited. kdbkit then finds its solver, its
config string, its API (``kdbkit.toy_scale``), its programs for ``kdb build --all``, its driver
command in a catalogue, and ``kdb driver toyscale`` runs and verifies it on the embedded default
device (PoCL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from kdbkit.runtime.primitives import ENTRY_POINT_GROUP

from ..chain_fixtures import chain_backend_name, pick_device

FILES = {
    "toyscale/__init__.py": '''
        """A toy primitive added from outside kdbkit: y = a * x."""
        from toyscale import solvers  # noqa: F401  (registers the solver)
        from toyscale.api import toy_scale
        from toyscale.problem import ToyScaleProblem

        __all__ = ["ToyScaleProblem", "toy_scale"]
    ''',
    "toyscale/problem.py": '''
        from dataclasses import dataclass

        from kdbkit.runtime.problem import Problem, parse_float, require
        from kdbkit.runtime.tensor import DataType, TensorDesc


        @dataclass(frozen=True)
        class ToyScaleProblem(Problem):
            primitive = "toyscale"

            n: int
            a: float = 1.0
            dtype: DataType = DataType.FP32

            def fields(self):
                return [("type", self.dtype.label), ("n", str(self.n)), ("a", repr(self.a))]

            def tensors(self):
                desc = TensorDesc(self.dtype, (self.n,), (1,))
                return {"x": desc, "y": desc}

            @classmethod
            def from_fields(cls, fields):
                return cls(int(require(fields, "n", "toyscale")), parse_float(require(fields, "a", "toyscale"), "a"),
                           DataType.parse(require(fields, "type", "toyscale")))


        def catalogue():
            return [ToyScaleProblem(1)]
    ''',
    "toyscale/solvers.py": '''
        import numpy as np

        from kdbkit.runtime.program_key import ProgramRequest
        from kdbkit.runtime.solver import APPLIES, REGISTRY, Solution, Solver, launcher_1d

        PROGRAM = ProgramRequest("toyscale.c", ())


        class ToyScaleDirect(Solver):
            id = 9001
            name = "ToyScaleDirect"
            primitive = "toyscale"

            def is_applicable(self, problem, device):
                return APPLIES

            def solution(self, problem, device):
                def factory(programs, context):
                    kernel = programs[0].function("toy_scale")
                    run = launcher_1d(context, kernel, problem.n,
                                      [None, None, np.int32(problem.n), np.float32(problem.a)])
                    return lambda x, y: run(x, y)

                return Solution([PROGRAM], factory)


        REGISTRY.register(ToyScaleDirect())
    ''',
    "toyscale/api.py": '''
        from kdbkit.runtime.primitives.invoke import invoke
        from kdbkit.runtime.primitives.operands import Operands, device_default
        from toyscale.problem import ToyScaleProblem


        def toy_scale(handle, x, a=1.0, *, y=None):
            """y = a * x for a 1-D fp32 array."""
            with Operands(handle.backend) as ops:
                xb, xd = ops.input(x, None, "x")
                yb, yd, result = ops.output(device_default(handle, y, x, xd), xd, "y")
                invoke(handle, ToyScaleProblem(xd.shape[0], float(a), xd.dtype), None, {"x": (xb, xd)},
                       {"y": (yb, yd)})
            return result
    ''',
    "toyscale/driver.py": '''
        from kdbkit.runtime.driver.spec import DriverSpec, Flag
        from toyscale.problem import ToyScaleProblem


        class ToyScale(DriverSpec):
            command, label, log_label, primitive = "toyscale", "Toy Scale", "LogCmdToyScale", "toyscale"
            summary = "y = a * x (a toy primitive added from outside kdbkit)."
            example = "kdb driver toyscale --count 1000 -A 2.5 -t 1"
            shape_flags = directional = False
            flags = (Flag("count", ("--count",), int, 1000, "Elements.", minimum=1),
                     Flag("a", ("-A", "--alpha"), float, 2.0, "The scale."))

            def problem(self, o, direction, dtype):
                return ToyScaleProblem(o.count, o.a, dtype)

            def outputs(self, p):
                return ("y",)

            def reference(self, p, t):
                return {"y": p.a * t["x"]}


        SPEC = ToyScale()
    ''',
    "toyscale-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: toyscale\nVersion: 0.1\n",
    "toyscale-0.1.dist-info/entry_points.txt": f"[{ENTRY_POINT_GROUP}]\ntoyscale = toyscale\n",
    "kernels/toyscale.c": '''
        #include "kdb_compat.h"

        KDB_KERNEL void toy_scale(const KDB_GLOBAL float* x, KDB_GLOBAL float* y, int n, float a)
        {
            for (int i = KDB_GLOBAL_ID_X; i < n; i += KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X)
                y[i] = a * x[i];
        }
    ''',
}

PROBE = '''
import json
import numpy as np
import kdbkit
from kdbkit.packager.catalogue import parse_line
from kdbkit.runtime.driver.registry import command_modules
from kdbkit.runtime.primitives import primitive_modules
from kdbkit.runtime.primitives.catalogue import all_programs
from kdbkit.runtime.problem import parse_config
from kdbkit.runtime.solver import REGISTRY

problem = parse_config("toyscale,type=fp32,n=5,a=2.0")
with kdbkit.Handle() as handle:
    y = kdbkit.toy_scale(handle, np.arange(5, dtype=np.float32), 3.0)
print(json.dumps({
    "primitives": primitive_modules()[-1], "driver": command_modules()[-1],
    "solvers": [s.name for s in REGISTRY.for_primitive("toyscale")], "config": problem.config(),
    "api": "toy_scale" in kdbkit.__all__, "y": y.tolist(),
    "programs": [str(r) for r in all_programs() if r.kernel_file == "toyscale.c"],
    "catalogue": [p.config() for p in parse_line("kdb driver toyscale --count 7 -A 0.5")],
}))
'''


@pytest.fixture
def toy(tmp_path):
    pick_device()  # skips, with the reason, where the test backend (KDB_TEST_BACKEND) has no device
    for name, text in FILES.items():
        path = tmp_path / "site" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KDB_")}
    # kdbkit itself stays importable where it comes from PYTHONPATH (the GPU machine's installed wheel)
    path = os.pathsep.join(p for p in (str(tmp_path / "site"), os.environ.get("PYTHONPATH")) if p)
    return {**clean, "PYTHONPATH": path, "KDB_KERNEL_PATH": str(tmp_path / "site" / "kernels"),
            "KDB_CUSTOM_CACHE_DIR": str(tmp_path / "cache"), "KDB_USER_DB_PATH": str(tmp_path / "userdb"),
            "KDB_SYSTEM_DB_PATH": str(tmp_path / "no-bundles"), "KDB_BACKEND": chain_backend_name()}


def _run(args, env):
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)


def test_an_added_primitive_is_found_with_its_solver_api_programs_and_driver_command(toy):
    proc = _run([sys.executable, "-c", PROBE], toy)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["primitives"] == "toyscale" and found["driver"] == "toyscale.driver"
    assert found["solvers"] == ["ToyScaleDirect"] and found["config"] == "toyscale,type=fp32,n=5,a=2.0"
    assert found["api"] and found["y"] == [0.0, 3.0, 6.0, 9.0, 12.0]
    assert found["programs"] == ["toyscale.c []"]
    assert found["catalogue"] == ["toyscale,type=fp32,n=7,a=0.5"]


def test_kdb_driver_runs_an_added_primitive(toy):
    kdb = [sys.executable, "-m", "kdbkit.runtime.cli.app"]  # the console script may not be installed (PYTHONPATH)
    proc = _run([*kdb, "driver", "toyscale", "--count", "1000", "-A", "2.5", "-t", "1"], toy)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Solver: ToyScaleDirect (9001)" in proc.stdout
    assert "Toy Scale Verifies OK on CPU reference" in proc.stdout
    logged = _run([*kdb, "driver", "toyscale", "--count", "10"], {**toy, "KDB_ENABLE_LOGGING_CMD": "1"})
    assert "[LogCmdToyScale] kdb driver toyscale --config 'toyscale,type=fp32,n=10,a=2.0'" in logged.stderr
