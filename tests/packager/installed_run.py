"""A small program's primitives, for the install test: run in a fresh environment, it prints
JSON with where its programs came from, which system bundle and find-db served it, and its
errors against NumPy. Args: the catalogue log (its softmax problem's ranking is looked up)."""

import json
import sys

import numpy as np

import kdbkit
from kdbkit.runtime.find import recorded_solutions


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 32, 6, 6)).astype(np.float32)
    errors = {}
    with kdbkit.Handle() as handle:
        y = kdbkit.softmax_forward(handle, x)
        e = np.exp(x - x.max(axis=1, keepdims=True))
        errors["softmax"] = float(np.abs(y - e / e.sum(axis=1, keepdims=True)).max())
        y, _, _ = kdbkit.layernorm_forward(handle, x.reshape(4, -1))
        flat = x.reshape(4, -1).astype(np.float64)
        ref = (flat - flat.mean(1, keepdims=True)) / np.sqrt(flat.var(1, keepdims=True) + 1e-5)
        errors["layernorm"] = float(np.abs(y - ref).max())
        errors["relu"] = float(np.abs(kdbkit.activation_forward(handle, x, "relu") - np.maximum(x, 0)).max())
        if len(sys.argv) > 1:  # catalogue: the softmax problem's ranking and where it came from
            from kdbkit.packager.catalogue import read_catalogue

            softmax = [p for p in read_catalogue(sys.argv[1]).problems if p.primitive == "softmax"]
            rankings = [recorded_solutions(handle, p) for p in softmax]
            find_db = sorted({s[0].source for s in rankings if s})
        else:
            find_db = []
        accepted = [c for c in handle.system_trace if c.status == "accepted"]
        print(json.dumps({"target": str(handle.target), "resolved": handle.resolved_by_source, "errors": errors, "find_db": find_db,
                          "bundle": [(str(c.path), c.origin) for c in accepted]}))


if __name__ == "__main__":
    main()
