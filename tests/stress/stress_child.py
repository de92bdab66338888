"""One process of the stress tests: threads resolving programs through the whole chain and
checking what each binary computes.

Every program is ``stress_add.c`` built with ``-DKDB_ADD=<k>``: its kernel adds k, so a binary
served under another key gives a wrong result and is counted. Each thread makes a fresh handle
per round (a handle keeps what it resolved in memory, and the point is the tiers below it).
Prints one JSON object: how each key was found each time, errors and wrong results.

    python stress_child.py THREADS ROUNDS KEY [KEY ...]
"""

from __future__ import annotations

import json
import random
import sys
import threading
from collections import Counter

import numpy as np

from kdbkit.runtime.backends.registry import default_device, open_backend
from kdbkit.runtime.handle import Handle

N = 256


def how(program) -> str:
    return program.steps[-2].outcome if program.source == "jit" else program.source  # [-1] is the load


def run_thread(backend, keys: list[str], rounds: int, seed: int, found: Counter, errors: list, wrong: list) -> None:
    rng = random.Random(seed)
    x = np.arange(N, dtype=np.float32)
    for _ in range(rounds):
        order = keys[:]
        rng.shuffle(order)
        try:
            with Handle(backend=backend) as handle:
                for k in order:
                    program = handle.program("stress_add.c", [f"-DKDB_ADD={k}"])
                    found[(k, how(program))] += 1
                    dx, dy = backend.to_device(x), backend.alloc(x.nbytes)
                    backend.launch(program.function("add_const"), (2, 1, 1), (64, 1, 1), [dx, dy, np.int32(N)])
                    y = backend.to_host(dy, np.empty_like(x))
                    if not np.array_equal(y, x + np.float32(k)):
                        wrong.append(f"KDB_ADD={k} from {program.source}: y[1] = {y[1]}")
        except Exception as exc:  # counted, not raised: the parent reports every process's errors
            errors.append(f"{type(exc).__name__}: {exc}")


def main() -> None:
    threads, rounds, keys = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    backend = open_backend(default_device())
    found: Counter = Counter()
    errors: list[str] = []
    wrong: list[str] = []
    workers = [threading.Thread(target=run_thread, args=(backend, keys, rounds, i, found, errors, wrong))
               for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print(json.dumps({"found": [[k, h, n] for (k, h), n in found.items()], "errors": errors, "wrong": wrong}))


if __name__ == "__main__":
    main()
