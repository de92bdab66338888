"""kdbkit's logging: MIOpen's levels and switches on top of Python's ``logging``, to stderr.

``KDB_LOG_LEVEL`` takes MIOpen's MIOPEN_LOG_LEVEL values: 1 quiet, 2 fatal, 3 error, 4 warning,
5 info, 6 info2 (detailed), 7 trace, with 0 or unset meaning 4 (MIOpen's release default), or
5 when ``KDB_ENABLE_LOGGING`` asks for API calls and resolutions. They map to Python levels in
``PYTHON_LEVELS``, with two added ones: ``INFO2`` between INFO and DEBUG, ``TRACE`` below DEBUG.
As in MIOpen, the API-call channel (``log_api_call``, ``KDB_ENABLE_LOGGING``) and the command
channel (``log_command``, ``KDB_ENABLE_LOGGING_CMD``) are independent of the level. Each line
reads ``kdbkit warning: [pid tid] 12.345 ms [runtime.handle] message``: the ids with
``KDB_ENABLE_LOGGING_MPMT``, the milliseconds since the previous line with
``KDB_ENABLE_LOGGING_ELAPSED_TIME``, the logger's name below ``kdbkit`` when there is one.

Every module, backends included, logs through :func:`get_logger`, so one tree below
``kdbkit`` carries every record and the level and prefixes apply everywhere. One handler sits
on the ``kdbkit`` logger, which does not propagate, so the host application's root logger is
never touched. Nothing happens at import, nor when a module takes its logger: the first record
configures, reading the environment then and again only on ``configure_logging(force=True)``.
What the levels add: 5 (info) one line per program resolved and per device or bundle opened;
6 (info2) each step of a resolution with its time, every bundle considered and why it was
rejected; 7 (trace) the keys looked up, compiler command lines and compile-lock waits.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from types import MappingProxyType

from kdbkit.runtime.env import get_bool, get_int, read_quietly

ROOT_NAME = "kdbkit"
INFO2 = 15  # MIOpen's Info2 (level 6): between INFO and DEBUG
TRACE = 5  # MIOpen's Trace (level 7): below DEBUG
DEFAULT_LEVEL = 4  # what KDB_LOG_LEVEL 0/unset means, as in MIOpen's release builds
PYTHON_LEVELS = MappingProxyType({
    1: logging.CRITICAL + 1,  # quiet: above every level, so nothing passes
    2: logging.CRITICAL, 3: logging.ERROR, 4: logging.WARNING, 5: logging.INFO, 6: INFO2, 7: TRACE,
})
_WORDS = {logging.CRITICAL: "fatal", logging.ERROR: "error", logging.WARNING: "warning",
          logging.INFO: "info", INFO2: "info2", logging.DEBUG: "debug", TRACE: "trace"}
_OWNED = "_kdbkit_owned"  # marks the handler configure_logging installed, to replace only it


@dataclass(frozen=True)
class _Settings:
    level: int  # KDB level, 1..7
    api_calls: bool
    commands: bool
    mpmt: bool
    elapsed: bool


_settings: _Settings | None = None
_config_lock = threading.RLock()
_once_keys: set[str] = set()
_once_lock = threading.Lock()
# Bad settings met while configuring (reading KDB_LOG_LEVEL, say) wait here until the handler
# exists; per thread, so that another thread's report is never held back by this one.
_configuring = threading.local()
# Before the first record, whether anything would be emitted is read from the two variables
# that decide it, without configuring: a process that never logs never pays for the handler.
_early: tuple[int, bool] | None = None  # (Python threshold, API calls on)


def effective_log_level() -> int:
    """The KDB log level (1..7) the environment asks for now.

    Returns:
        ``KDB_LOG_LEVEL`` when set to 1..7; else 5 if ``KDB_ENABLE_LOGGING`` is on, else 4.
        An invalid ``KDB_LOG_LEVEL`` warns once and counts as unset.
    """
    level = get_int("KDB_LOG_LEVEL") or 0
    if level:
        return level
    return 5 if get_bool("KDB_ENABLE_LOGGING") else DEFAULT_LEVEL


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at emit time (a redirect, pytest's capture)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)  # StreamHandler's would pin today's sys.stderr

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr


class _Formatter(logging.Formatter):
    """``kdbkit <Level> [pid tid] <ms> ms [logger] message``, prefixes as configured."""

    def __init__(self, mpmt: bool, elapsed: bool) -> None:
        super().__init__()
        self._mpmt, self._elapsed = mpmt, elapsed
        self._previous: float | None = None

    def format(self, record: logging.LogRecord) -> str:
        word = getattr(record, "kdb_label", None) or _WORDS.get(record.levelno)
        parts = [f"{ROOT_NAME} {word or logging.getLevelName(record.levelno).lower()}:"]
        if self._mpmt:
            # The native thread id (the LWP MIOpen prints) matches `top -H` and debuggers; the
            # handler is synchronous, so the formatting thread is the one that logged.
            parts.append(f"[{record.process or os.getpid()} {threading.get_native_id()}]")
        if self._elapsed:
            # Handler.handle() holds the handler's lock around format(): no race on _previous.
            now = time.perf_counter()
            elapsed_ms = 0.0 if self._previous is None else (now - self._previous) * 1e3
            self._previous = now
            parts.append(f"{elapsed_ms:.3f} ms")
        if record.name != ROOT_NAME:
            parts.append(f"[{record.name.removeprefix(ROOT_NAME + '.')}]")
        parts.append(record.getMessage())
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


def configure_logging(force: bool = False) -> logging.Logger:
    """Install kdbkit's one stderr handler on the ``kdbkit`` logger, from the environment.

    Calling it again does nothing unless ``force``, which re-reads the KDB_* variables and
    replaces the handler it installed before (handlers the application added stay).

    Args:
        force: re-read the environment even if logging is already configured.
    Returns:
        The ``kdbkit`` logger: level set from ``KDB_LOG_LEVEL``, ``propagate`` False.
    """
    global _settings, _early
    logger = logging.getLogger(ROOT_NAME)
    if _settings is not None and not force:  # the common path takes no lock
        return logger
    with _config_lock:
        if _settings is not None and not force:
            return logger
        logging.addLevelName(INFO2, "INFO2")
        logging.addLevelName(TRACE, "TRACE")
        _configuring.pending = []
        try:
            settings = _Settings(
                level=effective_log_level(), api_calls=get_bool("KDB_ENABLE_LOGGING"),
                commands=get_bool("KDB_ENABLE_LOGGING_CMD"), mpmt=get_bool("KDB_ENABLE_LOGGING_MPMT"),
                elapsed=get_bool("KDB_ENABLE_LOGGING_ELAPSED_TIME"))
            pending = _configuring.pending
        finally:
            _configuring.pending = None
        for old in [h for h in logger.handlers if getattr(h, _OWNED, False)]:
            logger.removeHandler(old)
            old.close()
        handler = _StderrHandler()
        setattr(handler, _OWNED, True)
        handler.setFormatter(_Formatter(settings.mpmt, settings.elapsed))
        logger.addHandler(handler)
        logger.setLevel(PYTHON_LEVELS[settings.level])
        logger.propagate = False  # kdbkit's records never reach the application's root logger
        _settings = settings
        _early = None
    for message in pending:
        logger.warning(message)
    return logger


def _early_settings() -> tuple[int, bool]:
    """(Python threshold, API calls on) as the environment asks, read without configuring.

    A bad value there must be reported, which needs the handler: then logging is configured.
    """
    global _early
    if _early is None:
        problems, (level, api_calls) = read_quietly(lambda: (effective_log_level(), get_bool("KDB_ENABLE_LOGGING")))
        if problems:
            configure_logging()
            return PYTHON_LEVELS[_settings.level], _settings.api_calls
        _early = (PYTHON_LEVELS[level], api_calls)
    return _early


class KdbLogger(logging.LoggerAdapter):
    """A logger below ``kdbkit`` that configures logging when it first has a record to emit.

    Modules take theirs at import (``_log = get_logger(__name__)``) without configuring
    anything; ``info2`` and ``trace`` log at MIOpen's levels 6 and 7.
    """

    def isEnabledFor(self, level: int) -> bool:
        if _settings is None:
            # _early read directly when set: every program lookup asks, a call costs more than the check
            if level < (_early or _early_settings())[0]:
                return False
            configure_logging()
        return self.logger.isEnabledFor(level)

    def process(self, msg, kwargs):
        return msg, kwargs

    def info2(self, msg, *args, **kwargs) -> None:
        self.log(INFO2, msg, *args, **kwargs)

    def trace(self, msg, *args, **kwargs) -> None:
        self.log(TRACE, msg, *args, **kwargs)


def get_logger(name: str | None = None) -> KdbLogger:
    """A logger below ``kdbkit``; nothing is configured until it first logs.

    Args:
        name: a module path such as ``runtime.handle`` or ``kdbkit.runtime.handle``
            (``__name__`` works); ``kdbkit.`` is prepended unless present. None gives the
            ``kdbkit`` logger itself.
    Returns:
        The logger, e.g. for ``kdbkit.runtime.handle``.
    """
    if not name or name == ROOT_NAME:
        return KdbLogger(logging.getLogger(ROOT_NAME), {})
    prefix = ROOT_NAME + "."
    return KdbLogger(logging.getLogger(name if name.startswith(prefix) else prefix + name), {})


def report_bad_setting(message: str) -> None:
    """Warn (one line) that a KDB_* variable holds a value kdbkit cannot use.

    Called by :mod:`kdbkit.runtime.env`; a report made while logging is being configured (a
    bad ``KDB_LOG_LEVEL``) is emitted once the handler exists.
    """
    pending = getattr(_configuring, "pending", None)
    if pending is not None:
        pending.append(message)
    else:
        get_logger().warning(message)


def _emit(logger: logging.Logger | KdbLogger | None, label: str, message: str) -> bool:
    logger = logger or get_logger()
    if isinstance(logger, KdbLogger):
        logger = logger.logger
    if logging.root.manager.disable >= logging.INFO:  # the application's logging.disable()
        return False
    caller = sys._getframe(2)
    record = logger.makeRecord(logger.name, logging.INFO, caller.f_code.co_filename,
                               caller.f_lineno, message, None, None, caller.f_code.co_name,
                               extra={"kdb_label": label})
    # handle() skips the level check that info() makes: these channels have their own switch.
    logger.handle(record)
    return True


def api_logging_enabled() -> bool:
    """Whether :func:`log_api_call` would emit (lets hot paths skip building the message)."""
    if _settings is None:
        if not (_early or _early_settings())[1]:
            return False
        configure_logging()
    return bool(_settings and _settings.api_calls)


def log_api_call(message: str, *, logger: logging.Logger | None = None) -> bool:
    """Log an API call or program resolution when ``KDB_ENABLE_LOGGING`` is on, at any level.

    Args:
        message: the call with its arguments, e.g. ``softmax(x: 4x1000 f32, axis=-1)``.
        logger: the logger to use; the ``kdbkit`` logger by default.
    Returns:
        True if the line was emitted (labelled ``API``).
    """
    return api_logging_enabled() and _emit(logger, "API", message)


def log_command(line: str, *, logger: logging.Logger | None = None) -> bool:
    """Log the driver command line reproducing a call, when ``KDB_ENABLE_LOGGING_CMD`` is on.

    Like MIOpen's MIOPEN_ENABLE_LOGGING_CMD, this does not depend on ``KDB_LOG_LEVEL``.

    Args:
        line: the command line that reproduces the call (the driver's, once there is one).
        logger: the logger to use; the ``kdbkit`` logger by default.
    Returns:
        True if the line was emitted (labelled ``Command``).
    """
    configure_logging()
    return bool(_settings and _settings.commands) and _emit(logger, "command", line)


def warn_once(key: str, message: str, *, logger: logging.Logger | None = None) -> bool:
    """Log a warning the first time ``key`` is seen in this process; later calls are silent.

    Thread-safe: of many threads racing with the same key, exactly one logs.

    Args:
        key: what makes the warning unique, e.g. ``missing-system-db:sm_90_132.kdb``.
        message: e.g. ``Missing system database file: sm_90_132.kdb Performance may degrade``.
        logger: the logger to use; the ``kdbkit`` logger by default.
    Returns:
        True if this call logged (subject to the level), False if the key was seen before.
    """
    with _once_lock:
        if key in _once_keys:
            return False
        _once_keys.add(key)
    (logger or get_logger()).warning(message)
    return True
