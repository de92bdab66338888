"""A bundle writer that is killed leaves its temporary file; the next writer in the folder removes
it, and never the file of a writer that still runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kdbkit.kdb import Target, open_bundle
from kdbkit.kdb.codec import encode_for_bundle
from kdbkit.kdb.writer import write_stored_bundle

TARGET = Target("cuda", "sm_90")

# A writer that stores one batch-worth of entries, then stalls inside the write: its temporary
# bundle exists and is being filled, as in a `kdb build` killed while writing.
STALLED_WRITER = """
import os, sys, time
from pathlib import Path
from kdbkit.kdb import Target
from kdbkit.kdb.codec import encode_for_bundle
from kdbkit.kdb.writer import write_stored_bundle

def entries():
    for i in range(1500):
        yield (f"k{i}.o", "-DN=1", encode_for_bundle(f"k{i}.o", "-DN=1", os.urandom(4000)))
    time.sleep(600)

write_stored_bundle(Path(sys.argv[1]), Target("cuda", "sm_90"), entries(), compiler="nvrtc 13.0", binary_format="cubin")
"""


def _temps(folder: Path) -> set[str]:
    """The writers' temporary bundles; a journal counts as its bundle's (a live writer makes and
    drops its journal as it goes, so when it is seen is a matter of timing)."""
    return {p.name.removesuffix("-journal") for p in folder.iterdir() if p.name.startswith(".sm_90.kdb.")}


def _stalled_writer(out: Path) -> tuple[subprocess.Popen, set[str]]:
    before = _temps(out.parent)
    child = subprocess.Popen([sys.executable, "-c", STALLED_WRITER, str(out)])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        mine = _temps(out.parent) - before
        if mine and any(out.parent.joinpath(n).stat().st_size > 1_000_000 for n in mine):
            return child, mine
        assert child.poll() is None, "the writer ended before it stalled"
        time.sleep(0.05)
    child.kill()
    raise AssertionError("the writer never wrote its temporary bundle")


def test_a_killed_writers_temp_files_are_removed_by_the_next_write_and_a_live_ones_kept(tmp_path):
    out = tmp_path / "sm_90.kdb"
    killed, killed_temps = _stalled_writer(out)
    live, live_temps = _stalled_writer(out)  # it starts while the other runs: it removes nothing
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    try:
        assert killed_temps and live_temps and _temps(tmp_path) == killed_temps | live_temps
        write_stored_bundle(out, TARGET, [("k.o", "-DN=2", encode_for_bundle("k.o", "-DN=2", b"x" * 100))],
                            compiler="nvrtc 13.0", binary_format="cubin")
        assert _temps(tmp_path) == live_temps  # the live writer's file is untouched
        assert live.poll() is None
        with open_bundle(out) as b:
            assert b.stats().entries == 1
    finally:
        live.kill()
        live.wait()


def test_a_temp_file_without_a_writer_of_this_host_is_removed_only_once_old(tmp_path):
    out = tmp_path / "sm_90.kdb"
    other_host = tmp_path / ".sm_90.kdb.otherhost-123.abcd.tmp"
    old_kdbkit = tmp_path / ".sm_90.kdb.x1y2z3.tmp"
    for p in (other_host, old_kdbkit):
        p.write_bytes(b"half a bundle")
    os.utime(old_kdbkit, (time.time() - 2 * 86400,) * 2)
    write_stored_bundle(out, TARGET, [("k.o", "-DN=2", encode_for_bundle("k.o", "-DN=2", b"x"))], compiler="nvrtc 13.0",
                        binary_format="cubin")
    assert other_host.exists() and not old_kdbkit.exists()
