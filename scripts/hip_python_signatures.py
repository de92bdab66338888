#!/usr/bin/env python3
"""Write docs/hip_python_calls.md: each hip-python call kdbkit makes, with its signature per release line.

The calls are read from kdbkit's HIP sources (every ``hip.hipX`` / ``rtc.hiprtcX`` they
name); the signatures from each installed line's binding (``inspect.signature`` and the first
docstring line, which Cython's embedsignature writes). Each line is read in a child process
with that line first on ``sys.path``, as the stand-in tests run it. Needs the lines installed
by ``scripts/install_hip_python_lines.sh``; no ROCm and no GPU.

    python scripts/hip_python_signatures.py [--out docs/hip_python_calls.md]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCES = ["runtime/backends/hip.py", "runtime/backends/hip_binding.py", "runtime/compilers/hiprtc.py"]
_CALL = re.compile(r"\.(hip(?:rtc)?[A-Z]\w+)\b")
_NOT_CALLS = {"hipDeviceProp_t", "hipMemcpyKind", "hipMemcpyHostToDevice", "hipMemcpyDeviceToHost"}  # types the code names, not functions

_CHILD = r"""
import inspect, json, sys
from hip import hip, hiprtc
out = {}
for name in json.loads(sys.argv[1]):
    fn = getattr(hiprtc if name.startswith("hiprtc") else hip, name, None)
    if fn is None:
        out[name] = None
        continue
    try:
        sig = str(inspect.signature(fn))
    except (TypeError, ValueError):
        sig = "?"
    doc = (fn.__doc__ or "").strip().split("\n", 1)[0]
    returns = ""
    m = __import__("re").search(r"tuple`? of size (\d+)", fn.__doc__ or "")
    if m:
        returns = f"tuple of {m.group(1)}"
    out[name] = {"signature": sig, "doc": doc, "returns": returns}
print(json.dumps(out))
"""


def calls_kdbkit_makes() -> list[str]:
    names = set()
    for source in SOURCES:
        names |= set(_CALL.findall((REPO / source).read_text()))
    return sorted(names - _NOT_CALLS)


def read_line(folder: Path, names: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(folder)}
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(names)], capture_output=True, text=True,
                          env=env, check=True)
    return json.loads(proc.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "hip_python_calls.md"))
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from tests.hip_standin import hip_python_folder, hip_python_lines

    names = calls_kdbkit_makes()
    lines = {}
    for line in hip_python_lines():
        folder = hip_python_folder(line)
        if folder is None:
            sys.exit(f"hip-python {line} is not installed: run scripts/install_hip_python_lines.sh")
        lines[line] = read_line(folder, names)

    rows = ["# The hip-python calls kdbkit makes, per release line", "",
            "Written by `python scripts/hip_python_signatures.py` from each line's own binding "
            "(`inspect.signature`, and the return tuple its docstring states). Every call returns a "
            "tuple whose first element is the error; kdbkit checks it through "
            "`runtime/backends/hip_binding.py`. Each is exercised against the stand-in HIP runtime "
            "(`tests/runtime/backends/test_hip_standin.py`) for every line below.", ""]
    header = "| call | " + " | ".join(f"hip-python {v}" for v in lines) + " |"
    rows += [header, "|" + "---|" * (len(lines) + 1)]
    for name in names:
        cells = []
        for info in lines.values():
            entry = info.get(name)
            cells.append("missing" if entry is None else
                         f"`{entry['signature']}`" + (f" → {entry['returns']}" if entry["returns"] else " (undocumented)"))
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    differing = [n for n in names
                 if len({(info.get(n) or {}).get("signature") for info in lines.values()}) > 1]
    rows += ["", "Calls whose signature differs between lines: "
             + (", ".join(f"`{n}`" for n in differing) or "none") + "."]
    Path(args.out).write_text("\n".join(rows) + "\n")
    print(f"wrote {args.out}: {len(names)} calls x {len(lines)} lines; differing: {differing}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
