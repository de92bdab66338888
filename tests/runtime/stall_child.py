"""A process for the stalled-lock tests: resolve one program through the chain and print how.

``hold SALT``: its compile stalls (prints ``compiling`` and sleeps) while it holds the program's
compile locks, as a hung compiler would. ``wait SALT``: resolves the program and prints
``{"source": ..., "seconds": ...}``. ``threads SALT``: two threads of this process, the first one's
compile stalled until the second has resolved the program; prints the second's result.
"""

import json
import sys
import threading
import time

from kdbkit.runtime.backends.registry import default_device
from kdbkit.runtime.compilers import compiler_for
from kdbkit.runtime.handle import Handle

mode, salt = sys.argv[1], sys.argv[2]
device = default_device()
compiler_class = type(compiler_for(device.target))
real = compiler_class.compile
stalled = threading.Event()
release = threading.Event()


def stalling(self, *args, **kwargs):
    if threading.current_thread().name == "stalled" or mode == "hold":
        print("compiling", flush=True)
        stalled.set()
        release.wait(120)
    return real(self, *args, **kwargs)


compiler_class.compile = stalling
options = ["-DKDB_DTYPE=float", f"-DSALT={salt}"]
with Handle(device) as handle:
    if mode == "threads":
        first = threading.Thread(target=handle.program, args=("activation.c", options), name="stalled")
        first.start()
        stalled.wait(120)
    start = time.monotonic()
    source = handle.program("activation.c", options).source
    print(json.dumps({"source": source, "seconds": time.monotonic() - start}), flush=True)
    if mode == "threads":
        release.set()
        first.join()
