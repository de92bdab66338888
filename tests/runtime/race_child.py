"""One racer for the concurrency tests: resolve programs through the chain, print the sources."""

import json
import sys

from kdbkit.runtime.backends.registry import default_device
from kdbkit.runtime.handle import Handle

salts = sys.argv[1:]
handle = Handle(default_device())
sources = [handle.program("activation.c", ["-DKDB_DTYPE=float", f"-DSALT={s}"]).source for s in salts]
print(json.dumps(sources))
