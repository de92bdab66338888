"""One "node" of the cluster tests: resolve and run a mix of the sample programs through a handle
whose chain has the cluster tier, and print, as JSON, how each was found and whether it computed
the right result.

Arguments: seed, how many programs, seconds to pause after each (so that a test can act mid-run).
Each program is a sample kernel with a ``-DSALT=n`` define, so twelve distinct programs exist.
"""

import json
import random
import sys
import time

import numpy as np

from kdbkit.runtime.backends.registry import default_device
from kdbkit.runtime.handle import Handle
from kdbkit.runtime.samples import SAMPLES, TOLERANCE

PROGRAMS = [(sample, salt) for sample in SAMPLES for salt in range(4)]


def how(program) -> str:
    """``compiled`` (this node compiled it), ``built by another process`` (found under the lease), or the tier."""
    return program.steps[-2].outcome if program.source == "jit" else program.source  # [-1] is the load


seed, count, pause = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
chosen = random.Random(seed).sample(PROGRAMS, count)
rng = np.random.default_rng(seed)
results = []
with Handle(default_device()) as handle:
    for sample, salt in chosen:
        program = handle.program(sample.kernel_file, (*sample.options, f"-DSALT={salt}"))
        error = sample.run(handle, program, rng)
        handle.backend.synchronize()
        results.append({"program": f"{sample.name}/{salt}", "how": how(program), "ok": bool(error <= TOLERANCE)})
        time.sleep(pause)
print(json.dumps(results))
