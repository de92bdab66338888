"""Shared output helpers for the CLI: rich consoles, sizes, one-line errors."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)
if not out.is_terminal and "COLUMNS" not in os.environ:
    out.width = 140  # piped or captured output: rich would assume 80 columns and fold tables



def size(n: int) -> str:
    """Human size: 1.2 MiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def fail(message: str, code: int = 1) -> "typer.Exit":
    """Print one line naming what went wrong and the remedy; return the Exit to raise."""
    err.print("[bold red]error:[/] " + escape(message), soft_wrap=True)
    return typer.Exit(code)
