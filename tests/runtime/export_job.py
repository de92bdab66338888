"""A small job for the export tests, run in-process or as a script in a fresh environment.

``warm`` runs it with the JIT: the sample programs, find for an activation problem (so the user
find-db holds a ranking) and a softmax. ``check`` runs it again on a handle that has resolved
nothing yet: first every program of the system bundle that serves the device, counted by the
tier that served it, then the job itself (immediate mode reading the shipped ranking). As a
script (``python export_job.py warm|check``) it prints the result as JSON.
"""

from __future__ import annotations

import collections
import json
import sys

import numpy as np

import kdbkit
from kdbkit.runtime.find import find_solutions, recorded_solutions
from kdbkit.runtime.primitives.activation import ActivationMode, ActivationProblem
from kdbkit.runtime.program_key import parse_key
from kdbkit.runtime.samples import run_samples
from kdbkit.runtime.tensor import DataType

# Contiguous, as activation_forward makes it for an array of this shape: the call reads its ranking.
RANKED = ActivationProblem("fwd", ActivationMode.GELU_ERF, DataType.FP32, (64, 33), (33, 1), (33, 1))


def _primitives(handle) -> dict[str, float]:
    """The primitives' errors against NumPy (activation through immediate mode, and softmax)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(RANKED.shape).astype(np.float32)
    from math import erf

    want = x * 0.5 * (1 + np.vectorize(erf)(x / np.sqrt(2)))
    errors = {"gelu": float(np.abs(kdbkit.activation_forward(handle, x, "gelu") - want).max())}
    s = rng.standard_normal((4, 32, 6, 6)).astype(np.float32)
    e = np.exp(s - s.max(axis=1, keepdims=True))
    errors["softmax"] = float(np.abs(kdbkit.softmax_forward(handle, s) - e / e.sum(axis=1, keepdims=True)).max())
    return errors


def warm(handle) -> dict:
    """The job with the JIT: what it compiled, and the ranking find recorded."""
    samples = run_samples(handle, seed=0)
    ranked = find_solutions(handle, RANKED)
    errors = _primitives(handle)
    return {"target": str(handle.target), "compiler": handle.compiler.identity(), "resolved": handle.resolved_by_source,
            "ok": all(r.ok for r in samples) and max(errors.values()) < 1e-5, "ranked": [s.solver for s in ranked]}


def check(handle) -> dict:
    """Every program of the device's system bundles (all of them: a package split by size has
    several) resolved on ``handle`` (which must have resolved none yet), counted by the tier that
    served each; then the job, and where its ranking came from."""
    from kdbkit.runtime import paths
    from kdbkit.runtime.system_bundles import find_system_bundles

    opened, _ = find_system_bundles(handle.target, handle.backend.binary_format, paths.iter_system_db_dirs())
    bundles = [str(b.path) for b in opened]
    keys = [parse_key(e.kernel_name, e.kernel_args) for b in opened for e in b.entries()]
    for b in opened:
        b.close()
    if not keys:
        handle.program("activation.c", ["-DKDB_DTYPE=float"])  # raises with JIT off and no bundle
    by_source = collections.Counter(handle.program(k.kernel_file, k.options).source for k in keys)
    samples = run_samples(handle, seed=0)
    errors = _primitives(handle)
    return {"target": str(handle.target), "bundle": bundles[0] if bundles else "", "bundles": bundles,
            "entries": len(keys), "by_source": dict(by_source),
            "resolved": handle.resolved_by_source, "samples": [r.source for r in samples],
            "ok": all(r.ok for r in samples) and max(errors.values()) < 1e-5,
            "ranking": sorted({s.source for s in recorded_solutions(handle, RANKED)}),
            "choice": handle.dispatcher.choose(RANKED).how}


if __name__ == "__main__":
    with kdbkit.Handle() as h:
        print(json.dumps({"warm": warm, "check": check}[sys.argv[1]](h)))
