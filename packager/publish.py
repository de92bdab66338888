"""Warm a cluster's cache ahead of its jobs: ``kdb build --publish redis://...`` stores every
program the build compiled or reused in the cluster tier (:class:`~kdbkit.runtime.redis_tier.RedisTier`),
so that the first process of a job on each node finds it there instead of compiling.

Each program is read back from the bundle the build wrote (its hash checked) and stored with
``RedisTier.store`` (sealed to its key, and whatever else ``store`` adds, such as a signature),
under its program key as the build made it: :func:`~kdbkit.runtime.program_key.program_key` over
the kernel file, the options, the target's full arch (features included, never the compute-unit
count), the kernel source's digest and the builder's compiler identity. A node's user cache, cluster
tier and JIT key the same program the same way with *its* device's full arch and *its* compiler's
identity (``Keys.key`` in :mod:`kdbkit.runtime.lookup`), so a node hits exactly when:

- its device's full arch is the build target's: ``--target sm_90_132`` (or ``--gpu H100``) serves
  every sm_90 device; ``--target gfx90a`` serves a device that reports plain ``gfx90a``, not one
  reporting ``gfx90a:sramecc+:xnack-`` (build for the target ``kdb devices`` shows on the node);
- its JIT compiler has the builder's identity (``kdb doctor`` shows both): the same NVRTC and CUDA
  headers; for HIP the same compiler, so a build with clang-19 does not serve nodes that compile
  with ROCm's hiprtc; for OpenCL the same platform and driver (PoCL and its LLVM) on the same
  kind of device, since the target names the device;
- its kernel sources are the builder's (the same kdbkit, the same ``KDB_KERNEL_PATH`` files).

A binary is never published under another compiler's key: the key promises the bytes that
compiler makes. The summary names the arch and compiler each published program serves.

Publishing runs in the process that writes the bundles, after they are written (a Dask build's
workers need no access to Redis), and never fails the build: a server that does not answer or a
user that may not write is one line, and the summary counts what was not published and why.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence
from urllib.parse import urlsplit

from kdbkit.kdb import Target
from kdbkit.kdb.bundle import Bundle
from kdbkit.kdb.errors import KdbError
from kdbkit.packager.build import BuildResult, Job
from kdbkit.packager.errors import PublishError
from kdbkit.runtime.compilers import Compiler
from kdbkit.runtime.program_key import program_key
from kdbkit.runtime.redis_link import redacted
from kdbkit.runtime.redis_tier import MAX_ENTRY_BYTES, RedisTier  # neither imports redis until a tier is made

SCHEMES = ("redis", "rediss")  # rediss: Redis over TLS
PUBLISH_TIMEOUT_MS = 5000  # a builder storing large binaries may wait; a job's lookup may not
_URL_FORM = "give redis://[user:password@]host:port/db (rediss:// for TLS)"
READ_ONLY = "this user may not write there (a read-only user): publish as a user that may write"
STOPPED = "the server stopped answering while publishing (see the warning above)"
TOO_LARGE = f"larger than the cluster cache takes ({MAX_ENTRY_BYTES >> 20} MiB)"
UNREADABLE = "its entry could not be read back from the bundle"
NO_SIGNER = ("this machine trusts signing keys (KDB_REMOTE_TRUSTED_KEYS) but has none to sign with: readers would "
             "refuse what it published; set KDB_REMOTE_SIGNING_KEY")
UNKEYED = "its job was not keyed by this build's plan (made by hand), so its runtime key is unknown"


@dataclass
class PublishReport:
    """What a build published to the cluster cache at ``where`` (the URL without its password).

    Attributes:
        published: programs stored.
        not_published: programs not stored, by reason.
        serves: programs stored, by the (device full arch, compiler identity) of the nodes whose
            lookups they answer.
    """

    where: str
    published: int = 0
    not_published: Counter[str] = field(default_factory=Counter)
    serves: Counter[tuple[str, str]] = field(default_factory=Counter)

    def as_json(self) -> dict:
        return {"to": self.where, "published": self.published, "not_published": dict(self.not_published),
                "serves": [{"arch": arch, "compiler": compiler, "programs": n}
                           for (arch, compiler), n in sorted(self.serves.items())]}


def open_tier(url: str) -> RedisTier:
    """The cluster cache at ``url`` to publish to (no connection is made yet).

    Raises:
        PublishError: ``url`` is not ``redis://`` or ``rediss://``, does not parse, or the redis
            client (the ``cluster`` extra) is not installed. The message never shows a password.
    """
    try:
        shown, scheme = redacted(url), urlsplit(url).scheme
    except ValueError:  # urlsplit's own refusal (a broken IPv6 address, say): show none of it
        raise PublishError("the URL to publish to does not parse", _URL_FORM) from None
    if scheme not in SCHEMES:
        raise PublishError(f"{shown} is not a Redis URL to publish to", _URL_FORM)
    try:
        return RedisTier(url, timeout_ms=PUBLISH_TIMEOUT_MS)
    except ImportError as exc:
        raise PublishError(f"publishing to {shown} needs the redis client ({exc})",
                           "pip install 'kdbkit[cluster]'") from exc
    except ValueError:  # the client's own check of the URL, whose message may quote it whole
        raise PublishError(f"{shown} is not a Redis URL to publish to", _URL_FORM) from None


def publish(tier: RedisTier, jobs: Sequence[Job], result: BuildResult,
            compilers: dict[Target, Compiler]) -> PublishReport:
    """Store each of ``jobs`` that ``result`` wrote into a bundle in the cluster cache ``tier``.

    Args:
        tier: from :func:`open_tier`; left open.
        jobs: the build's jobs (from :func:`~kdbkit.packager.build.plan`: keyed, with their source digests).
        result: what the build wrote; its failures are not published.
        compilers: each bundle's compiler, as the build used it.

    Returns:
        The report. Never raises for the server, the user's rights or a bundle entry that does
        not read back: those are counted in ``not_published``.
    """
    report = PublishReport(tier.link.where)
    failed = {(f.job.bundle, f.job.kernel_name, f.job.kernel_args) for f in result.failures}
    by_bundle: dict[Target, list[Job]] = {}
    for job in jobs:
        if (job.bundle, job.kernel_name, job.kernel_args) not in failed and str(job.bundle) in result.bundles:
            by_bundle.setdefault(job.bundle, []).append(job)
    total = sum(map(len, by_bundle.values()))
    why_not = _cannot_write(tier) if total else None
    if why_not is not None:  # said once here, rather than once per program
        report.not_published[why_not] = total
        return report
    for target, target_jobs in by_bundle.items():
        identity = compilers[target].identity()
        try:
            bundle = Bundle.open(result.bundles[str(target)])
        except (KdbError, OSError):  # gone or damaged since it was written: its programs are not published
            report.not_published[UNREADABLE] += len(target_jobs)
            continue
        with bundle:
            for job in target_jobs:
                outcome = _publish_one(tier, bundle, job, identity)
                if outcome is None:
                    report.published += 1
                    report.serves[target.full_arch, identity] += 1
                else:
                    report.not_published[outcome] += 1
    return report


def _publish_one(tier: RedisTier, bundle: Bundle, job: Job, identity: str) -> str | None:
    """Store one job's binary under its runtime key; None when stored, else why not."""
    try:
        key = program_key(job.request, target=job.bundle, compiler=identity, source_digest=job.source_digest)
    except ValueError:  # no source digest: a job made by hand, not by plan()
        return UNKEYED
    if key.kernel_args != job.kernel_args:  # keyed otherwise than plan() keys: no key to vouch for
        return UNKEYED
    try:
        binary = bundle.get(job.kernel_name, job.kernel_args)
    except KdbError:
        binary = None
    if binary is None:
        return UNREADABLE
    link = tier.link
    failures, too_large = link.failures, tier.too_large
    try:
        tier.store(key.digest, binary)
    except KdbError as exc:  # kdbkit's own refusal to seal it (a signing key that does not load, say)
        return f"it could not be sealed ({exc.problem})"
    # store() answers nothing; what happened shows on the tier and its link (each failure there
    # is already said once, by the link's warning)
    if tier.too_large > too_large:
        return TOO_LARGE
    if not link.may_write:
        return READ_ONLY
    if link.failures > failures or not link.usable():
        return STOPPED
    return None


def _cannot_write(tier: RedisTier) -> str | None:
    """Why nothing can be published to ``tier`` now (no answer, a user that may not write, no usable
    signing key where keys are trusted), else None."""
    if not tier.signing.publishes:  # store() would keep nothing
        return (f"KDB_REMOTE_SIGNING_KEY cannot be used ({tier.signing.signer_problem})" if tier.signing.signer_problem
                else NO_SIGNER)
    link = tier.link
    try:
        link.client.ping()
        writable, _ = link.probe_write()
    except link.errors as exc:
        return f"the server is not answering ({type(exc).__name__}: {exc})"
    return None if writable else READ_ONLY
