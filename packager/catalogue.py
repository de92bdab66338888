"""What a build compiles: the programs the solvers ask for, for the problems of a catalogue.

A catalogue is every program (``--all``: every compile-time specialisation of every
primitive, finite because shapes are launch arguments), a built-in network's problems (a name
such as ``resnet50``: :data:`kdbkit.runtime.models.MODELS` at batch 1 and 32, fp16 and fp32,
both layouts), a find-db's problems, or a user's file with one problem per line, in any of
these spellings:

- a config string: ``softmax,dir=fwd,...`` or a MIOpen convolution key
  ``64-56-56-3x3-64-56-56-32-1x1-1x1-1x1-0-NCHW-FP16-F``;
- a driver command, as ``KDB_ENABLE_LOGGING_CMD=1`` prints it (``kdb driver conv -n 32 ...``)
  or as MIOpen logs it (``MIOpenDriver convfp16 -n 32 ...``, with any path and prefix such as
  ``MIOpen(HIP): Command [LogCmdConvolution] ./bin/MIOpenDriver ...``).

Blank lines and ``#`` comments are skipped, and so are a log's other lines (kdbkit's and
MIOpen's warnings and information), so that a whole captured log can be given. A line that does
not parse is kept as a :class:`LineError` with its number and reason, and the rest of the file
still builds.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from kdbkit.kdb.errors import KdbError
from kdbkit.kdb.find_db import SYSTEM_SUFFIX, USER_SUFFIX, configs_in
from kdbkit.packager.errors import CatalogueError
from kdbkit.runtime.primitives import load_all
from kdbkit.runtime.problem import Problem, parse_config
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import REGISTRY

_DRIVER_RE = re.compile(r"(?:^|[\s/])(?:kdb\s+driver|MIOpenDriver)\s+(?P<rest>.*)$")
_LOG_LINE = re.compile(r"^(?:kdbkit(?: \w+)?:|kdbkit (?:warning|info|error|debug)\b|MIOpen\(\w+\):)")


@dataclass(frozen=True)
class LineError:
    """A catalogue line that names no problem: where, what, and why."""

    path: str
    line: int
    text: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason} (in {self.text!r})"


@dataclass
class Catalogue:
    """Problems to build for, each once in file order, and the lines that did not parse."""

    problems: list[Problem]
    errors: list[LineError]
    log_lines: int = 0  # a log's lines that name no command, skipped


def parse_line(text: str) -> list[Problem]:
    """The problems one catalogue line names (a driver command may name several directions).

    Raises:
        KdbError: the line is neither a config string nor a driver command that parses.
    """
    from kdbkit.runtime.driver.commands import problems_of_command

    command = _DRIVER_RE.search(text)
    if command:
        return problems_of_command(shlex.split(command["rest"]))
    return [parse_config(text)]


def builtin_names() -> list[str]:
    """The built-in catalogues: one per network of :mod:`kdbkit.runtime.models`."""
    from kdbkit.runtime.models import MODELS

    return list(MODELS)


def read_catalogue(path: str | Path) -> Catalogue:
    """Every problem ``path`` names, and the lines that name none. A find-db (``.fdb``,
    ``.ufdb``: what find recorded) gives its problems, its rows counted as lines; a built-in
    network's name (``resnet50``), where no such file exists, gives that network's problems.

    Raises:
        OSError: the file cannot be read (for a missing file, the message lists the built-in names).
        CatalogueError: the file is not UTF-8 text.
        NotABundleError: a ``.fdb`` or ``.ufdb`` file that is not a find-db.
    """
    if not Path(path).exists() and str(path) in builtin_names():
        from kdbkit.runtime.models import builtin_catalogue

        return Catalogue(builtin_catalogue(str(path)), [])
    if not Path(path).exists():
        raise FileNotFoundError(f"no catalogue file {path} (nor a built-in catalogue: {', '.join(builtin_names())})")
    problems: dict[str, Problem] = {}
    errors, log_lines = [], 0
    if Path(path).suffix in (SYSTEM_SUFFIX, USER_SUFFIX):
        lines = configs_in(path)
    else:
        lines = _text_lines(Path(path))
    for number, raw in enumerate(lines, 1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        if _LOG_LINE.match(text) and not _DRIVER_RE.search(text):
            log_lines += 1
            continue
        try:
            for problem in parse_line(text):
                problems.setdefault(problem.config(), problem)
        except (KdbError, ValueError) as exc:  # a KdbError reads "problem; remedy"
            errors.append(LineError(str(path), number, text, str(exc)))
    return Catalogue(list(problems.values()), errors, log_lines)


def _text_lines(path: Path) -> list[str]:
    """The lines of a text catalogue.

    Raises:
        CatalogueError: the file is not UTF-8 text (a binary file given by mistake, say).
    """
    data = path.read_bytes()
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise CatalogueError(f"{path} is not a text catalogue (byte {exc.start} is not UTF-8)",
                             "give a text file of config strings or driver commands, a find-db (.fdb, .ufdb) or "
                             f"a built-in network ({', '.join(builtin_names())})") from None


def read_catalogues(paths: Iterable[str | Path]) -> Catalogue:
    """:func:`read_catalogue` of each path, joined: their problems (each once) and bad lines."""
    problems: dict[str, Problem] = {}
    errors, log_lines = [], 0
    for path in paths:
        read = read_catalogue(path)
        for problem in read.problems:
            problems.setdefault(problem.config(), problem)
        errors += read.errors
        log_lines += read.log_lines
    return Catalogue(list(problems.values()), errors, log_lines)


def programs_for(problems: Iterable[Problem], backend: str, target=None) -> list[ProgramRequest]:
    """Every program a solver of ``backend`` (that builds for ``target``, when given) may ask
    for to serve ``problems``, each once, sorted: what a bundle for that backend must hold so
    that these problems never need a compiler."""
    load_all()  # every solver registered, whichever primitives the problems came from
    requests = set()
    for problem in problems:
        for solver in REGISTRY.for_primitive(problem.primitive):
            if (solver.backends is None or backend in solver.backends) and (target is None or solver.builds_for(target)):
                requests.update(solver.programs(problem))
    return sorted(requests, key=str)
