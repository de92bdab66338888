"""The last tier of the chain: compile once between all processes, threads and machines, then write through.

``JitSource.get`` is lease -> re-check -> compile -> put. The lease (``kdbkit.runtime.lease``)
is this process's per-key thread lock, then the lease of every tier that offers one, in chain
order: the user cache's is a lock file per program key in its folder; a tier shared by several
machines brings its own. Other keys are never blocked, and neither are readers of any tier:
compilation runs outside any database transaction, under the lease only. Under the lease the
JIT asks every tier that can change (not the immutable system bundles) again, since the holder
before it may have compiled the program; else it compiles and puts the binary into every
writable tier. When a lease cannot be taken each holder compiles for itself: slower, never wrong.

The source text is read once (:meth:`KernelSearchPath.read`): the key the binary is stored
under is made from the digest of the very bytes compiled, so an edit made since the handle
was made lands under its own key, never under the old one.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Callable, Sequence

from kdbkit.kdb.target import Target
from kdbkit.runtime.compilers import LazyCompiler
from kdbkit.runtime.errors import CompilerUnavailableError, JitDisabledError
from kdbkit.runtime.kernel_sources import KernelSearchPath
from kdbkit.runtime.lease import THREAD_LEASE, CompileLease, held
from kdbkit.runtime.logging_setup import get_logger
from kdbkit.runtime.lookup import Keys
from kdbkit.runtime.program import Steps
from kdbkit.runtime.program_key import ProgramKey, ProgramRequest, program_key
from kdbkit.runtime.tier import Source, SourceInfo, discard, lease_of, read, searched, write_all

_log = get_logger(__name__)


def build_once(key: ProgramKey, leases: Sequence[CompileLease], recheck: Callable[[], bytes | None],
               compile_fn: Callable[[], bytes], store: Callable[[bytes], None]) -> tuple[bytes, bool]:
    """Return the program's binary, compiling it only if nobody else has meanwhile.

    Args:
        key: the program's key.
        leases: held in order around the re-check, the compile and the store.
        recheck: the binary if a tier has it now, else None.
        compile_fn: the compiler call; runs at most once per key among the leases' holders.
        store: puts a freshly compiled binary into the writable tiers.

    Returns:
        (binary, True if this call compiled it; False if another process or thread stored it
        while this one waited for the lease).
    """
    with ExitStack() as holding:
        for lease in leases:
            holding.enter_context(held(lease, key))
        cached = recheck()  # the lease holder before us may have built it
        if cached is not None:
            return cached, False
        binary = compile_fn()
        store(binary)
        return binary, True


def _lift(forbidden_by: str) -> str:
    if forbidden_by.startswith("KDB_CACHE_POLICY"):
        return f"{forbidden_by} forbids compiling: set KDB_CACHE_POLICY=readwrite"
    return f"unset {forbidden_by}"


class JitSource(Source):
    """Compile (unless the cache policy forbids it) and put into every writable tier.

    Args:
        target: what to compile for.
        keys: the handle's keys; the digest of what is compiled replaces the remembered one.
        compiler: the local compiler, found on first use (CompilerUnavailableError, with
            the reason, when there is none).
        tiers: the chain's tiers before this one: their leases are held, those that can
            change are re-checked, the writable ones receive what is compiled.
        forbidden_by: the setting that forbids compiling (``KDB_DISABLE_JIT``,
            ``KDB_CACHE_POLICY=installed-only``), "" where compiling is allowed: a miss is then an
            error naming the program and that setting.
    """

    name = "jit"
    compiles = True

    def __init__(self, target: Target, keys: Keys, compiler: LazyCompiler, tiers: Sequence[Source],
                 forbidden_by: str = ""):
        self.target = target
        self.keys = keys
        self.compiler = compiler
        self.tiers = list(tiers)
        self.forbidden_by = forbidden_by

    @property
    def search_path(self) -> KernelSearchPath:
        return self.keys.search_path

    def _searched(self) -> str:
        return " or ".join(w for w in map(searched, self.tiers) if w)

    def get(self, request: ProgramRequest, steps: Steps) -> bytes | None:
        if self.forbidden_by:
            raise JitDisabledError(
                f"no program {request} for {self.target.full_arch} in {self._searched()}",
                f"{_lift(self.forbidden_by)} to compile it, or install the bundle {self.target.built_bundle_name()} "
                "(`kdb devices` shows the bundle each device would use)")
        compiler = self.compiler.get()
        identity = self.compiler.identity()  # the one the tiers' lookups keyed with
        reason = compiler.unsupported(self.target)
        if reason:
            raise CompilerUnavailableError(f"cannot compile {request}: {reason}", "use a device this compiler targets")
        source = self.search_path.read(request.kernel_file)  # one read: the key and the text agree
        self.keys.set_digest(request.kernel_file, source.digest)
        key = program_key(request, target=self.target, compiler=identity, source_digest=source.digest)
        # The tiers' leases in one order for every process whatever the order of its chain (by
        # tier name), so that two processes never each hold one the other waits for.
        leases = [THREAD_LEASE, *(lease for t in sorted(self.tiers, key=lambda t: t.name)
                                  if (lease := lease_of(t)) is not None)]
        # A binary that this very resolution found and could not load is not taken again from the
        # re-check: a tier that cannot forget it (no remove) would otherwise block every compile.
        unloadable = any(s.name == "load" and s.outcome == "unloadable" for s in steps)
        recheck = (lambda: None) if unloadable else (lambda: self._recheck(request, key, identity))
        with steps.time("jit") as t:
            binary, compiled = build_once(key, leases, recheck,
                                          lambda: compiler.compile(request, self.target, source),
                                          lambda binary: write_all(self.tiers, request, binary, key))
            t.outcome = "compiled" if compiled else "built by another process"
        if compiled:
            _log.info("%s compiled for %s by %s in %.1f ms", request, self.target, identity, steps[-1].ms)
        return binary

    def _recheck(self, request: ProgramRequest, key: ProgramKey, identity: str) -> bytes | None:
        """A tier's binary for ``request`` now, if one that can change has it (its steps are not
        the caller's: this resolution already asked each tier once), written through to the
        writable tiers before it, as the chain writes a hit through (another machine published
        it to the cluster tier while this one waited: the user cache keeps it for next time)."""
        for i, tier in enumerate(self.tiers):
            if not tier.immutable and (binary := read(tier, request, Steps())) is not None:
                # The tier keyed its read with the handle's digest of the kernel file; a thread that
                # read an edited file meanwhile changes it, and the binary must then not be stored
                # under this compile's key (it is the old text's).
                if self.keys.key(request, identity) == key:
                    write_all(self.tiers[:i], request, binary, key)
                return binary
        return None

    def describe(self) -> SourceInfo:
        if self.forbidden_by:
            return SourceInfo(self.name, f"compiling is off ({self.forbidden_by})", False)
        identity = self.compiler.identity()
        return SourceInfo(self.name, f"compiles with {identity}" if identity else "no local compiler", False)

    def discard(self, request: ProgramRequest) -> None:
        for tier in self.tiers:  # a binary just compiled (or re-checked) that does not load must not stay cached
            if tier.writable:
                discard(tier, request)
