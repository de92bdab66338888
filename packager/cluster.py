"""Builds on a Dask distributed cluster: ``kdb build --cluster ADDRESS``.

Dask, not a protocol of kdbkit's own: :func:`connect` opens a ``distributed.Client`` to a
running scheduler, :func:`check_workers` asks every worker (``Client.run``) for its kdbkit
version and the identity of each compiler the build needs, and :func:`executor` gives the
client's ``concurrent.futures`` executor, which :func:`kdbkit.packager.build.build` fills
like its local process pool. The plan, the keys and the bundles stay on this machine; each
task carries its compiler, job and kernel source, so a worker needs kdbkit (the same
version) and the compilers, nothing else. A worker that joins after the check is still
safe: each task checks its worker's kdbkit and compiler before compiling
(:func:`kdbkit.packager.build.builder_identity`).

Every failure to build on the cluster (no scheduler, no workers, a worker lacking kdbkit or a
compiler) is a :class:`~kdbkit.runtime.errors.CompilerUnavailableError`: the cluster is where
the build's compilers are, and a caller that catches it may build here instead. Importing this
module does not import Dask; ``pip install 'kdbkit[cluster]'`` installs it.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from kdbkit.kdb.version import __version__
from kdbkit.runtime.compilers import Compiler
from kdbkit.runtime.errors import CompilerUnavailableError

if TYPE_CHECKING:
    import concurrent.futures

    from distributed import Client

CONNECT_TIMEOUT_S = 10.0  # to reach the scheduler, then again for a first worker
_HOST_PORT = re.compile(r"(?:[\w.\-]+|\[[0-9a-fA-F:]+\]):\d+")
_START = ("start one with `dask scheduler`, and workers with `dask worker tcp://HOST:8786` where kdbkit and the "
          "compilers are installed; give its tcp://HOST:PORT, HOST:PORT, or the file that "
          "`dask scheduler --scheduler-file FILE` writes")


def connect(address: str, *, timeout: float | None = None) -> "Client":
    """A Dask client of the scheduler at ``address``, once at least one worker is there.

    Args:
        address: ``tcp://host:port`` (or another Dask protocol), ``host:port``, or the path of
            a scheduler file (``dask scheduler --scheduler-file FILE``).
        timeout: seconds to wait for the scheduler, then again for a first worker (default
            :data:`CONNECT_TIMEOUT_S`).

    Raises:
        CompilerUnavailableError: Dask is not installed, nothing answers at ``address``, or
            the scheduler has no worker.
    """
    timeout = CONNECT_TIMEOUT_S if timeout is None else timeout
    try:
        from distributed import Client
    except ImportError as exc:
        raise CompilerUnavailableError(f"building on a cluster needs Dask distributed ({exc})",
                                       "pip install 'kdbkit[cluster]'") from exc
    if "://" in address or _HOST_PORT.fullmatch(address):
        where = {"address": address}
    elif Path(address).is_file():
        where = {"scheduler_file": address}
    else:
        raise CompilerUnavailableError(f"no Dask scheduler at {address}: neither an address nor a scheduler file",
                                       _START)
    try:
        client = Client(**where, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:  # refused, timed out, unknown protocol, bad file
        raise CompilerUnavailableError(f"no Dask scheduler at {address} ({' '.join(str(exc).split())})",
                                       _START) from exc
    try:
        client.wait_for_workers(1, timeout=timeout)
    except (OSError, TimeoutError) as exc:
        scheduler = client.scheduler_info().get("address", address)
        client.close()
        raise CompilerUnavailableError(f"the Dask scheduler at {address} has no worker after {timeout:g} s",
                                       f"start some with `dask worker {scheduler}` where kdbkit and the "
                                       "compilers are installed") from exc
    return client


def check_workers(client: "Client", compilers: Iterable[Compiler]) -> list[str]:
    """The workers' addresses, once each has this kdbkit version and every compiler the build needs.

    Raises:
        CompilerUnavailableError: a worker lacks kdbkit or a compiler, or has another version
            of either; the message names the worker and the remedy (the first such worker,
            and how many more there are).
    """
    wanted = list({c.identity(): c for c in compilers}.values())  # one of each
    facts = client.run(_worker_facts, wanted, on_error="return")
    problems = worker_problems(facts, [c.identity() for c in wanted])
    if problems:
        (worker, problem, remedy), more = problems[0], len({w for w, _, _ in problems}) - 1
        raise CompilerUnavailableError(f"worker {worker} {problem}" + (f" (and {more} more workers)" if more else ""),
                                       remedy)
    return sorted(facts)


def executor(client: "Client") -> "concurrent.futures.Executor":
    """The client's executor for :func:`kdbkit.packager.build.build` (tasks not deduplicated by
    their arguments' hash: each is a distinct job)."""
    return client.get_executor(pure=False)


def worker_problems(facts: Mapping[str, object], identities: Sequence[str]) -> list[tuple[str, str, str]]:
    """(worker, problem, remedy) for each way a worker cannot build: a pure function of what
    :func:`_worker_facts` reported (or the exception it raised there) per worker.

    Args:
        facts: worker address -> ``{"kdbkit": version, "host": name, "compilers": [(identity
            or None, problem, remedy), ...]}`` in the order of ``identities``, or an exception.
        identities: this machine's identity of each compiler, in that order.
    """
    same = f"pip install 'kdbkit=={__version__}' on it"
    problems = []
    for worker, fact in sorted(facts.items()):
        if isinstance(fact, ModuleNotFoundError) and "kdbkit" in str(fact):
            problems.append((worker, "has no kdbkit", f"{same}, or stop that worker"))
        elif isinstance(fact, BaseException):
            problems.append((worker, f"failed the check ({type(fact).__name__}: {fact})",
                             f"{same}, or stop that worker"))
        elif fact["kdbkit"] != __version__:
            problems.append((worker, f"on {fact['host']} has kdbkit {fact['kdbkit']}, this machine {__version__}",
                             f"{same}, or build here"))
        else:
            for expected, (identity, problem, remedy) in zip(identities, fact["compilers"], strict=True):
                if identity is None:
                    problems.append((worker, f"on {fact['host']} cannot compile for this build: {problem}",
                                     f"{remedy} on that worker, or stop it"))
                elif identity != expected:
                    problem = f"on {fact['host']} has {identity}, this machine {expected} (a key names its compiler)"
                    problems.append((worker, problem, "install the same compiler version on both"))
    return problems


def _worker_facts(compilers: Sequence[Compiler]) -> dict:
    """Runs on each worker: its kdbkit version, host name, and each compiler's identity or
    why it has none."""
    found = []
    for compiler in compilers:
        try:
            found.append((compiler.identity(), "", ""))
        except CompilerUnavailableError as exc:
            found.append((None, exc.problem, exc.remedy))
    return {"kdbkit": __version__, "host": socket.gethostname(), "compilers": found}
