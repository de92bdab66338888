"""The library's comments and docstrings say why the code is as it is, never how fast it ran once.

A figure measured on one machine at one commit goes stale as the code and the hardware change,
and nobody re-measures a comment; the project keeps such figures in docs/performance.md, with
the file they concerned. This test reads every comment (``tokenize``) and docstring (``ast``)
of the Python files under runtime/, kdb/ and packager/ and fails, naming file:line, where one
quotes a timing (a number and a time unit), a rate (GB/s, TFLOP/s), a speed ratio (``1.9x``,
``4x faster``) or a number beside the machine it was measured on (``on the H100``, ``this
machine``). Limits and settings that are part of the behaviour (a ``600 s`` lock timeout) are
not figures of speed and pass; strings and messages in code are not read at all.
"""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("runtime", "kdb", "packager")

# Genuine non-timing uses, as (file, phrase the flagged line contains): each must still be
# found and flagged (test_every_allowance_is_still_needed), so a stale entry cannot linger.
ALLOWED = {
    # The MIOpen driver's output line that runtime/driver reproduces, quoted as its format.
    ("runtime/driver/lines.py", "Elapsed: 0.123456 ms (average)"),
    # The log line's format: its time field is the milliseconds since the previous line.
    ("runtime/logging_setup.py", "12.345 ms [runtime.handle] message"),
}

_NUMBER = r"(?<![\w.])\d[\d.,]*(?:\s?[-–]\s?\d[\d.,]*)?"
_TIME = re.compile(
    _NUMBER + r"\s?(?:ns|µs|μs|us|ms|(?:nano|micro|milli)?seconds?|secs?|minutes?|mins?|hours?)\b"
    r"|" + _NUMBER + r"\s(?:s)\b"
)
_WORD_TIME = re.compile(
    r"(?i)\b(?:a|an|one|two|three|four|five|six|seven|eight|nine|ten|half a)\s+"
    r"(?:nanosecond|microsecond|millisecond)s?\b"
)
_RATE = re.compile(_NUMBER + r"\s?(?:[KMGTP]i?B/s(?:ec)?|[GTP]FLOP/?s|[GTP]FLOPS|[GT]OP/s|[GT]OPS)\b")
_RATIO = re.compile(
    r"(?i)" + _NUMBER + r"\s?(?:x|×|times|%)\s+(?:faster|slower|quicker|cheaper|dearer|the speed|as fast|as slow)\b"
    r"|(?<![\w.])\d+\.\d+[x×](?![\w])"
    r"|(?i:speed-?up)\D{0,20}\d[\d.]*\s?[x×](?![\w])"
)
# Where a figure was measured: a number on the same line as one of these is a figure of that machine.
_MACHINE = re.compile(
    r"(?i)\b(?:on|at|with)\s+(?:the|an?|this|one|our)\s+(?:lent\s+)?(?:H100|H200|A100|MI\d{3}X?)\b"
    r"|\b(?:lent|CI|GPU|CPU|H100|H200|this)\s+machine\b"
)
_STANDALONE_NUMBER = re.compile(r"(?<![\w.])\d[\d.,]*(?![\w])")
# A limit or setting: the time it names is behaviour, not a measurement.
_SETTING = re.compile(r"(?i)time-?out|deadline|limit|interval|sleep|wait|poll|retr(?:y|ies)|expir|ttl|lease|grace")


def timing_quotes(text: str) -> list[str]:
    """The phrases of ``text`` (one line of a comment or docstring) that quote a timing or speed."""
    found = []
    for m in _TIME.finditer(text):
        window = text[max(0, m.start() - 30):m.end() + 25]
        if not _SETTING.search(window):
            found.append(m.group())
    found += [m.group() for m in _WORD_TIME.finditer(text)]
    found += [m.group() for m in _RATE.finditer(text)]
    found += [m.group() for m in _RATIO.finditer(text)]
    machine = _MACHINE.search(text)
    if machine:
        rest = text[:machine.start()] + " " + text[machine.end():]
        if _STANDALONE_NUMBER.search(rest):
            found.append(machine.group())
    return found


def commentary(source: str) -> list[tuple[int, str]]:
    """(line number, text) of every comment and every docstring line of a module's ``source``."""
    lines = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            lines.append((tok.start[0], tok.string))
    source_lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = node.body[0] if node.body else None
        if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)):
            for number in range(first.value.lineno, first.value.end_lineno + 1):
                lines.append((number, source_lines[number - 1]))
    return sorted(lines)


def library_files() -> list[Path]:
    return sorted(p for top in LIBRARY for p in (ROOT / top).rglob("*.py"))


def _flagged() -> list[tuple[str, int, str, list[str]]]:
    flagged = []
    for path in library_files():
        name = path.relative_to(ROOT).as_posix()
        for number, text in commentary(path.read_text(encoding="utf-8")):
            quotes = timing_quotes(text)
            if quotes:
                flagged.append((name, number, text.strip(), quotes))
    return flagged


def _allowed(name: str, text: str) -> bool:
    return any(name == file and phrase in text for file, phrase in ALLOWED)


def test_no_library_comment_quotes_a_timing():
    offenders = [f"{name}:{number}: {text}   <- {quotes}"
                 for name, number, text, quotes in _flagged() if not _allowed(name, text)]
    assert not offenders, (
        f"{len(offenders)} comment or docstring lines quote a timing; say why the code is as it is and move "
        "the figure, if it matters, to docs/performance.md:\n" + "\n".join(offenders))


def test_every_allowance_is_still_needed():
    flagged = _flagged()
    for file, phrase in ALLOWED:
        assert any(name == file and phrase in text for name, _, text, _ in flagged), (file, phrase)


@pytest.mark.parametrize("text", [
    "# about 20 us per kernel",
    "# 0.4 ms on a user-cache hit",
    "# 41.4-42.1 us against 43.3-44.0 at 8",
    "importlib.metadata, whose import alone costs 30 ms: this runs",
    "# 0.1 s to import: only verification needs it",
    "# 4-5 µs per repeat call",
    "a first build in 351 seconds",
    "# cost a millisecond per handle on PoCL",
    "# streams at 3.1 TB/s",
    "# 600 GFLOP/s in fp32",
    "# Asking is about 4x cheaper than setting",
    "# fp16 0.988x -> 1.000x PyTorch's speed",
    "# 16-way build's speed-up near 6x",
    "# 3 times faster than the loop",
    "# 1.5 on this project's CI machine",
    "# 12 launches on the H100 were enough",
    "# costs 2 on the lent machine",
])
def test_a_timing_quote_is_caught(text):
    assert timing_quotes(text)


@pytest.mark.parametrize("text", [
    "# a 600 s lock timeout",
    "# wait up to 30 seconds for the lock",
    "# 256 MiB of pinned memory",
    "# 16 KiB pages pack several compressed kernels per page",
    "# leading 1s added to b's shape",
    "# 0x hex is accepted",
    "# 128 x 128 tiles, 8 x 8 per thread",
    "# Winograd's F(2 x 2, 3 x 3): 2.25 times fewer multiplies",
    "# a second time, after the lock",
    "# the milliseconds since the previous line",
    "# its CU count; 132, an H100's, when unknown",
    "# marketing name (NVIDIA H100 80GB HBM3)",
    "# this machine's keys",
    "# sm_90 (H100) and sm_13x",
    "# a 50 ms interval between polls",
])
def test_a_setting_or_shape_is_not_a_timing(text):
    assert not timing_quotes(text)


def test_commentary_reads_comments_and_docstrings_not_code():
    source = (
        '"""Module: 3 ms."""\n'
        "x = f'{t:.1f} ms'  # 5 ms\n"
        "def f():\n"
        '    """Function: 7 ms."""\n'
        "    return '9 ms'\n"
        "class C:\n"
        '    """Class\n    over two lines: 11 ms."""\n'
    )
    flagged = [number for number, text in commentary(source) if timing_quotes(text)]
    assert flagged == [1, 2, 4, 8]
