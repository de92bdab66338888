"""``package_bundles`` and ``install_packages``: ``kdb package`` and ``kdb install`` as calls.

Packaging: bundles (files, or folders of them, as ``kdb build -o`` wrote them) and tuned
find-dbs -> one wheel per bundle and a ``SHA256SUMS`` (:mod:`kdbkit.packager.wheel`).
Installing: the candidates a folder holds (:func:`~kdbkit.packager.select.scan`), the best one
for each device (:func:`~kdbkit.packager.select.choose`), every chosen one verified before
any is installed (:mod:`kdbkit.packager.install`).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from kdbkit.kdb import Target, open_bundle
from kdbkit.kdb.file_hash import sha256_of
from kdbkit.kdb.signing import PublicKey, Signer
from kdbkit.kdb.verify import verify_bundle
from kdbkit.packager import install as installer
from kdbkit.packager.errors import PackageError
from kdbkit.packager.select import Candidate, Choice, choose, scan
from kdbkit.packager.targets import find_gpu
from kdbkit.packager.wheel import Split, manifest_sha256, package_name, package_target, write_package
from kdbkit.runtime.preflight import DeviceRuntime, runtime_of

_MAKE_PACKAGES = ("build bundles with `kdb build --target <arch>_<cu> -c <catalogue> -o DIR`, then wheels with "
                  "`kdb package DIR -o DIR`, and give that folder")


DEFAULT_MAX_WHEEL_BYTES = 1 << 30  # `kdb package --max-wheel-size`; PyPI's largest per-project file limit
# A wheel's bytes besides its bundle and find-db (manifest, provenance, signature, the zip's own):
# a guess that decides where to cut; the wheels written are measured.
PACKAGE_OVERHEAD = 16 << 10
_SPLIT_TRIES = 4


@dataclass(frozen=True)
class Packaged:
    """One wheel written, and what it holds."""

    wheel: Path
    bundle: Path
    find_db: Path | None
    size: int = 0  # the wheel's bytes
    part: int = 1  # of `parts` wheels the bundle was split into
    parts: int = 1


def bundle_files(paths: Sequence[Path]) -> list[Path]:
    """The bundles ``paths`` name, each once in order: a file as it is, a folder's ``*.kdb``
    files (searched recursively, as ``kdb install --from`` searches).

    Raises:
        PackageError: a path that does not exist, or a folder that holds no bundle.
    """
    found: dict[Path, Path] = {}
    for path in paths:
        if path.is_dir():
            inside = sorted(p for p in path.rglob("*.kdb") if p.is_file())
            if not inside:
                raise PackageError(f"{path} holds no bundle (.kdb)", "build some into it with `kdb build -o`")
            for bundle in inside:
                found.setdefault(bundle.resolve(), bundle)
        elif path.exists():
            found.setdefault(path.resolve(), path)
        else:
            raise PackageError(f"no such bundle file or folder: {path}", "give bundles as `kdb build -o` wrote them")
    return list(found.values())


def package_bundles(paths: Sequence[Path], out: Path, *, find_dbs: Sequence[Path] = (),
                    signer: Signer | None = None, provenance_host: bool = False,
                    max_wheel_bytes: int | None = DEFAULT_MAX_WHEEL_BYTES) -> tuple[list[Packaged], Path]:
    """Write the wheel of each bundle (with the tuned find-dbs of its arch) into ``out``.

    Args:
        paths: bundles, or folders of them; a bundle named twice is packaged once.
        find_dbs: system find-dbs (``<arch>_<cu>.fdb``), each shipped with the bundle of its arch.
        signer: sign each wheel's manifest with this key (``kdb package --sign``).
        provenance_host: record this machine's host name in each wheel's provenance.
        max_wheel_bytes: a bundle whose wheel would be larger is split into parts
            (:func:`package_in_parts`) whose wheels are not; None or 0: no limit.

    Returns:
        The wheels written, and the ``SHA256SUMS`` file listing them.

    Raises:
        PackageError: a path that names no bundle, a damaged bundle (as ``kdb db verify`` finds it;
            nothing is written then), a find-db that fits none of the bundles, a program alone
            larger than ``max_wheel_bytes``.
        BundleError: a bundle that does not open.
    """
    pairs: list[tuple[Path, Path | None]] = []
    unused = list(dict.fromkeys(find_dbs))
    for bundle in bundle_files(paths):
        _refuse_damaged(bundle)  # every bundle before any wheel is written
        with open_bundle(bundle) as opened:
            target = opened.metadata.target
        mine = [fdb for fdb in dict.fromkeys(find_dbs) if target is not None and _fits(target, fdb)]
        pairs += [(bundle, fdb) for fdb in mine] or [(bundle, None)]
        unused = [f for f in unused if f not in mine]
    if unused:
        raise PackageError(f"{unused[0]} fits none of the bundles given (a find-db ships with a bundle of its arch)",
                           "give the bundle it was tuned for, or leave it out")
    packaged = [p for bundle, fdb in pairs
                for p in package_in_parts(bundle, out, find_db=fdb, max_wheel_bytes=max_wheel_bytes, signer=signer,
                                          provenance_host=provenance_host)]
    return packaged, installer.write_sums(out, [p.wheel for p in packaged])


def package_in_parts(bundle: Path, out: Path, *, find_db: Path | None, max_wheel_bytes: int | None,
                     **options) -> list[Packaged]:
    """``bundle``'s wheel, or the wheels of its parts where one wheel would pass ``max_wheel_bytes``.

    Parts are cut by an estimate of their files' sizes (:func:`kdbkit.kdb.split.plan_parts`);
    the wheels themselves are measured, and a set with one over the limit is cut again finer,
    a few times, before giving up. The first part carries the find-db.

    Raises:
        PackageError: a program alone larger than the limit, or no cut that fits.
    """
    from kdbkit.kdb.split import SplitError, split_bundle

    fixed = (find_db.stat().st_size if find_db is not None else 0) + PACKAGE_OVERHEAD
    if not max_wheel_bytes or bundle.stat().st_size + fixed <= max_wheel_bytes:
        wheel = write_package(bundle, out, find_db=find_db, **options)
        if not max_wheel_bytes or wheel.stat().st_size <= max_wheel_bytes:
            return [Packaged(wheel, bundle, find_db, wheel.stat().st_size)]
        wheel.unlink()
    whole_sha256 = sha256_of(bundle)
    with open_bundle(bundle) as opened:
        target = package_target(opened.metadata.target, find_db)
    cap = max_wheel_bytes - fixed
    out.mkdir(parents=True, exist_ok=True)
    for _ in range(_SPLIT_TRIES):
        with tempfile.TemporaryDirectory(dir=out, prefix=".kdb-split-") as tmp:
            try:
                parts = split_bundle(bundle, Path(tmp), cap)
            except SplitError as exc:
                raise PackageError(f"{bundle}: its program {exc.program} alone needs a wheel of about "
                                   f"{exc.needed + fixed} bytes, more than --max-wheel-size {max_wheel_bytes}",
                                   f"raise --max-wheel-size to at least {exc.needed + fixed}") from None
            # the others first: the first part names their manifests' SHA-256
            others = {i: write_package(part.path, out, split=Split(i, len(parts), bundle, whole_sha256, target),
                                       **options) for i, part in enumerate(parts[1:], 2)}
            first = write_package(parts[0].path, out, find_db=find_db, **options, split=Split(
                1, len(parts), bundle, whole_sha256, target,
                {package_name(target, i): manifest_sha256(wheel) for i, wheel in others.items()}))
        written = [Packaged(wheel, bundle, find_db if i == 1 else None, wheel.stat().st_size, i, len(parts))
                   for i, wheel in sorted({1: first, **others}.items())]
        largest = max(p.size for p in written)
        if largest <= max_wheel_bytes:
            return written
        for p in written:
            p.wheel.unlink()
        cap = int(cap * max_wheel_bytes / largest * 0.97)
    raise PackageError(f"{bundle}: no split into parts of at most {max_wheel_bytes} bytes was found "
                       f"(the largest wheel took {largest})", "raise --max-wheel-size")


def _refuse_damaged(bundle: Path) -> None:
    """The checks of ``kdb db verify``: a damaged bundle is refused here, not on the machine that
    would install it."""
    report = verify_bundle(bundle)
    if not report.ok:
        more = f" (and {len(report.problems) - 1} more problems)" if len(report.problems) > 1 else ""
        raise PackageError(f"{bundle}: {report.problems[0]}{more}",
                           "the bundle is damaged: rebuild it with `kdb build` (`kdb db verify` lists every problem)")


def _fits(target: Target, find_db: Path) -> bool:
    try:
        package_target(target, find_db)
        return True
    except PackageError:
        return False


@dataclass
class InstallReport:
    """Per device, the choice (with each rejected candidate and why); what was installed."""

    source: Path
    dry_run: bool
    choices: list[Choice]
    installed: dict[Candidate, installer.Installed] = field(default_factory=dict)
    named: bool = False  # the devices were named (--target, --gpu), not found here

    @property
    def ok(self) -> bool:
        """Something was chosen, and for every named device."""
        chosen = [c.chosen for c in self.choices]
        return any(chosen) and not (self.named and None in chosen)


def install_packages(source: Path, *, targets: Sequence[str | Target] = (), gpus: Sequence[str] = (),
                     dry_run: bool = False, into: Path | None = None,
                     require_hashes: bool = False, trusted_keys: Sequence[PublicKey] | None = None) -> InstallReport:
    """Install the best package or bundle in ``source`` for each device, all verified first.

    Args:
        source: a folder of wheels and bundles, or a local package index (searched recursively).
        targets, gpus: the devices to install for (default: this machine's GPUs and OpenCL devices).
        dry_run: choose and verify, install nothing.
        into: the folder for bare bundles (default: this environment's ``share/kdbkit/db``).
        require_hashes: refuse a candidate that no ``SHA256SUMS`` in ``source`` lists (where
            there is one, an unlisted candidate is refused anyway).
        trusted_keys: refuse a chosen candidate whose manifest none of these keys signed (and
            every bare bundle); None accepts unsigned packages.

    Raises:
        PackageError: ``source`` is not a folder or holds no package or bundle; no device; a
            chosen candidate fails its verification (nothing is installed then); pip fails.
    """
    if not source.is_dir():
        raise PackageError(f"{source} is not a folder", "give --from the folder holding the wheels or bundles")
    named = [t if isinstance(t, Target) else Target.parse(t) for t in targets] + [find_gpu(g).target for g in gpus]
    # each device with its driver's runtime: a package whose binaries it cannot load is rejected
    # (a named target has no driver here; KDB_DEVICE_RUNTIME gives it one)
    runtimes = {t: runtime_of(t.backend, "") for t in named} if named else _local_runtimes()
    devices = list(runtimes)
    if not devices:
        raise PackageError("no GPU or OpenCL device found here",
                           "name the GPU to install for with --target or --gpu (kdb targets lists them)")
    candidates = scan(source)
    if not candidates:
        raise PackageError(f"{source} holds no kernel package or bundle (no kdbkit_kernels_*.whl, no *.kdb)",
                           _MAKE_PACKAGES)
    choices = [choose(device, candidates, runtime=runtimes[device]) for device in devices]
    chosen = list(dict.fromkeys(c.chosen for c in choices if c.chosen is not None))
    for candidate in chosen:  # every check before anything is installed
        installer.verify(candidate, root=source, require_hashes=require_hashes, trusted_keys=trusted_keys)
    report = InstallReport(source, dry_run, choices, named=bool(named))
    if not dry_run:
        report.installed = {c: installer.install(c, db_dir=into) for c in chosen}
    return report


def _local_runtimes() -> dict[Target, DeviceRuntime]:
    """This machine's devices' targets, each with its driver's runtime (the first device of a target says)."""
    from kdbkit.runtime.backends.registry import discover_devices

    runtimes: dict[Target, DeviceRuntime] = {}
    for d in discover_devices():
        runtimes.setdefault(d.target, runtime_of(d.backend, d.runtime))
    return runtimes
