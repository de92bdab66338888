"""``kdb demo``: the main job, the whole story on the local device (the embedded default is PoCL
on the CPU): build a bundle for a small network's problems with the offline builder, install
it, then run the network twice in fresh processes, with an empty cache (JIT) and with the
installed bundle, and print each run's time to first result and where its programs came from."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from kdbkit.runtime.cli.output import fail, out


def demo(device: Optional[int] = typer.Option(None, "--device", help="Device index from `kdb devices`."),
         workdir: Optional[Path] = typer.Option(None, "--workdir", help="Keep the bundle, the installed copy and "
                                                "the runs' caches here (default: a new folder, removed after).")
         ) -> None:
    """Build a bundle for a small network, install it, and run the network from an empty cache (JIT), then from the bundle.

    PoCL's and the CUDA driver's own caches are off while it runs (set POCL_KERNEL_CACHE or
    CUDA_CACHE_DISABLE yourself to keep yours), but for the bundle run on PoCL: it is timed with
    PoCL's kernel cache cold, then warm.

    Example: kdb demo --workdir demo-files
    """
    with _driver_caches_off():
        _run_demo(device, workdir)


@contextlib.contextmanager
def _driver_caches_off():
    """The driver caches off while the demo builds (``DRIVER_CACHES_OFF``; a caller's own setting
    stays), and put back after, because `kdb` may run inside a caller's process (PoCL without its
    cache unpacks every loaded binary into one folder named by the binary, which concurrent
    processes then remove under each other)."""
    from kdbkit.runtime.demo import DRIVER_CACHES_OFF

    unset = [name for name in DRIVER_CACHES_OFF if name not in os.environ]
    os.environ.update({name: DRIVER_CACHES_OFF[name] for name in unset})
    try:
        yield
    finally:
        for name in unset:
            os.environ.pop(name, None)


def _build_and_install(target, problems, folder: Path, *, progress=None):
    """The demo's first two steps through the packager's API, as ``kdb build`` and ``kdb install``
    run them: ``problems``' programs built for ``target`` into ``folder/bundles``, the bundle
    chosen, verified and installed into ``folder/db``. Returns (the build's report, what was installed)."""
    from kdbkit.packager import build_bundles, install_packages

    report = build_bundles([target], problems=problems, out=folder / "bundles", progress=progress)
    failures = report.result.failures
    if failures:
        raise fail(f"{len(failures)} program(s) did not compile, the first {failures[0].job.request}: "
                   f"{failures[0].message}")
    installed = install_packages(folder / "bundles", targets=[target], into=folder / "db")
    choice = installed.choices[0]
    if choice.chosen is None:
        raise fail(f"the bundle just built does not fit {target}: {choice.rejected[0][1]}")
    return report, installed.installed[choice.chosen]


def _run_demo(device: Optional[int], workdir: Optional[Path]) -> None:
    from kdbkit.runtime import demo as runs
    from kdbkit.runtime.backends.registry import pick_device
    from kdbkit.runtime.cli.build_command import progress_bar

    picked = pick_device(device)  # fails before anything when there is no device (only the base install, say)
    net = runs.demo_network()
    problems = net.problems()
    out.print(f"device: [bold]{escape(picked.name)}[/] ({picked.backend}, target {picked.target})")
    out.print(f"network: {runs.NETWORK}, input {'x'.join(map(str, net.input_shape))} {net.dtype.label} "
              f"{net.layout}: {len(problems)} primitive problems")
    with contextlib.ExitStack() as stack:
        folder = workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kdbkit-demo-")))
        folder.mkdir(parents=True, exist_ok=True)

        out.print("[bold]1. build[/] the bundle of the programs its solvers ask for (kdb build)")
        t0 = time.perf_counter()
        with progress_bar() as step:
            built, done = _build_and_install(picked.target, problems, folder, progress=step)
        (name, path), = built.result.bundles.items()
        out.print(f"   {built.result.compiled} programs compiled in {time.perf_counter() - t0:.1f} s: "
                  f"{escape(str(path))}")

        out.print("[bold]2. install[/] it for this device (kdb install: chosen, verified, copied)")
        out.print(f"   {escape(', '.join(done.files))} -> {escape(done.where)}")

        out.print("[bold]3. run[/] the network twice, each in a fresh process")
        jit = runs.jit_run(device, folder)
        bundle = runs.bundle_run(device, folder, folder / "db")
    table = Table(title=f"{runs.NETWORK} forward, time to first result")
    for col in ("run", "programs from", "time to first result", "rel. error vs NumPy"):
        table.add_column(col, justify="right" if col.startswith(("time", "rel")) else "left")
    bad = 0
    for label, run in (("empty cache (JIT)", jit), ("installed bundle, JIT off", bundle)):
        sources = ", ".join(f"{source} {count}" for source, count in sorted(run["resolved"].items())) or "-"
        bad += not run["ok"]
        table.add_row(label, sources, f"{run['first_ms']:.1f} ms",
                      f"{run['rel_error']:.1e} {'[green]ok[/]' if run['ok'] else '[red]WRONG[/]'}")
    out.print(table)
    if bad:
        raise fail(f"{bad} run(s) gave wrong results")
    out.print(f"the installed bundle gave the first result {jit['first_ms'] / bundle['first_ms']:.0f}x sooner; "
              "all results match NumPy")
    for note in runs.pocl_notes(bundle):
        out.print(note)
