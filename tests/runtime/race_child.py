"""One racer for the concurrency tests: resolve programs through the chain, print how each was found.

Prints, per program, ``compiled`` (this process compiled it), ``built by another process`` (the
JIT waited on the compile lock and found it stored) or the tier that had it (``user``).
"""

import json
import sys

from kdbkit.runtime.backends.registry import default_device
from kdbkit.runtime.handle import Handle


def how(program) -> str:
    return program.steps[-2].outcome if program.source == "jit" else program.source  # [-1] is the load


salts = sys.argv[1:]
with Handle(default_device()) as handle:
    found = [how(handle.program("activation.c", ["-DKDB_DTYPE=float", f"-DSALT={s}"])) for s in salts]
print(json.dumps(found))
