"""One process's connection to the cluster's Redis server: short time-outs, a circuit breaker, and
the rights the server grants, shared by everything kdbkit keeps there (programs, rankings, leases).

It never makes a job wait on an outage: connecting and reading time out in milliseconds, and the
first failure switches the link off for ``KDB_REMOTE_BACKOFF`` seconds with one warning (the process goes on
with its local tiers and the JIT), after which it is tried again. A server that refuses writes
(a read-only ACL user: jobs read, builders write) is read all the same, and said once. Every
method answers None or False instead of raising when the server fails or refuses.
"""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
import threading
import time
from urllib.parse import urlsplit, urlunsplit

from kdbkit.kdb.errors import KdbError
from kdbkit.runtime import env
from kdbkit.runtime.logging_setup import get_logger, warn_once

_log = get_logger("runtime.redis_tier")
# A lease is renewed, or released, only by the holder that took it (its token): a holder that
# stalled past the lease's expiry must not extend or free the lease someone else took since.
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


def redacted(url: str) -> str:
    """``url`` without its password (in the address or in the query: redis-py takes ``?password=``),
    for messages; a URL that does not parse is not shown at all."""
    try:
        parts = urlsplit(url)
        password, port = parts.password, parts.port
    except ValueError:
        return "(a URL that does not parse)"
    if parts.query:
        parts = parts._replace(query="&".join("password=***" if q.lower().startswith("password=") else q
                                              for q in parts.query.split("&")))
    if password is None:
        return urlunsplit(parts)
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{port}" if port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class RemoteCredentialsError(KdbError):
    """The file meant to hold the cluster cache's password cannot be used."""


MAX_PASSWORD_FILE_BYTES = 4096


def _password_from_file() -> dict[str, str]:
    """``{"password": ...}`` from ``KDB_REMOTE_PASSWORD_FILE`` (a URL without one uses it), or nothing.

    The file must be the user's (or root's) and unreadable by others, as ssh wants of a key: a
    password others can read is not a secret, and one they can write lets them choose the server's user.
    """
    path = env.get_path("KDB_REMOTE_PASSWORD_FILE")
    if path is None:
        return {}
    fix = f"keep the password alone in a file of yours: chmod 600 {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise RemoteCredentialsError(f"KDB_REMOTE_PASSWORD_FILE {path} cannot be read ({exc.strerror})", fix) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RemoteCredentialsError(f"KDB_REMOTE_PASSWORD_FILE {path} is not a file", fix)
        if st.st_uid not in (os.getuid(), 0) or st.st_mode & 0o077:
            raise RemoteCredentialsError(f"KDB_REMOTE_PASSWORD_FILE {path} is open to other users "
                                         f"(mode {stat.S_IMODE(st.st_mode):o}, owner {st.st_uid})", fix)
        text = os.read(fd, MAX_PASSWORD_FILE_BYTES + 1)
    finally:
        os.close(fd)
    password = text.decode("utf-8", "replace").strip() if len(text) <= MAX_PASSWORD_FILE_BYTES else ""
    if not password or "\n" in password:
        raise RemoteCredentialsError(f"KDB_REMOTE_PASSWORD_FILE {path} holds no password of one line", fix)
    return {"password": password}


_preload_started = False


def preload() -> None:
    """Import the redis client in a background thread (once a process): a link made later finds it
    imported, or waits for the rest of the import only."""
    global _preload_started
    if _preload_started or "redis" in sys.modules:
        return
    _preload_started = True

    def load() -> None:
        try:
            importlib.import_module("redis")
        except Exception:  # the link made later says what is wrong with the installation
            pass

    threading.Thread(target=load, daemon=True, name="kdb-redis-import").start()


class RemoteSetupError(KdbError):
    """The redis client could not be made for the URL (raised where the link is used)."""


SCHEMES = ("redis", "rediss", "unix")


class RedisLink:
    """The Redis server at ``url``, as kdbkit uses it.

    The redis client is imported and made in a background thread (importing it costs tens of
    milliseconds, which a handle's creation should not wait for): the first command waits for it,
    by which time a job has usually set up its model. What can be checked at once is checked here.

    Args:
        url: ``redis://[user:password@]host:port/db`` (``rediss://`` for TLS).
        timeout_ms: the read time-out (a quarter of it to connect); default ``KDB_REMOTE_TIMEOUT_MS``.

    Raises:
        ImportError: no redis client (the ``cluster`` extra).
        ValueError: ``url`` is no Redis URL.
        RemoteCredentialsError: ``KDB_REMOTE_PASSWORD_FILE`` cannot be used.
    """

    def __init__(self, url: str, timeout_ms: int | None = None):
        if importlib.util.find_spec("redis") is None:
            raise ImportError("No module named 'redis'")
        parts = urlsplit(url)  # a broken address raises ValueError, as the client's own check would
        if parts.scheme not in SCHEMES or (parts.scheme != "unix" and (not parts.hostname or parts.port == 0)):
            raise ValueError(f"not a Redis URL: {redacted(url)}")
        self.url = url
        timeout_s = (timeout_ms or env.get_int("KDB_REMOTE_TIMEOUT_MS") or 200) / 1000
        has_password = parts.password is not None or "password=" in parts.query.lower()
        options = dict(socket_connect_timeout=timeout_s / 4, socket_timeout=timeout_s, retry_on_timeout=False,
                       **({} if has_password else _password_from_file()))
        self.backoff_s = float(env.get_int("KDB_REMOTE_BACKOFF") or 30)
        self._off_until = 0.0
        self.may_write = True  # False once the server refused a write: this user only reads
        self.failures = 0  # calls that met an outage (each one a miss or a write not made)
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._client = None  # made by the background thread, with the redis module it came from
        self._redis = None
        self._failed = ""
        threading.Thread(target=self._make, args=(url, options), daemon=True, name="kdb-redis-client").start()

    def _make(self, url: str, options: dict) -> None:
        try:
            import redis  # the cluster extra; imported only where a remote cache is configured

            self._client, self._redis = redis.Redis.from_url(url, **options), redis
        except Exception as exc:  # the client's own refusal of the URL, or a broken installation
            self._failed = f"{type(exc).__name__}: {redacted(str(exc)) if '://' in str(exc) else exc}"
        finally:
            self._ready.set()

    def _module(self):
        """The redis module once the client is made (waits for it); None if it could not be."""
        self._ready.wait()
        return self._redis

    @property
    def client(self):
        """The redis client (waits for it to be made; RemoteSetupError, one of :attr:`errors`, if it could not)."""
        if self._module() is None:
            raise RemoteSetupError(f"the redis client cannot be made for {self.where} ({self._failed})",
                                   "set KDB_REMOTE_CACHE to redis://[user:password@]host:port/db")
        return self._client

    @property
    def errors(self) -> tuple[type[Exception], ...]:
        """What the server or the client raise: a failure of the link, never of the request."""
        redis = self._module()
        return (RemoteSetupError,) if redis is None else (redis.RedisError, RemoteSetupError)

    @property
    def refused(self) -> tuple[type[Exception], ...]:
        """What a server raises at a command it will not run: a write out of memory under
        noeviction, say (the server is up and reads still work, so it is no outage)."""
        redis = self._module()
        return () if redis is None else (redis.exceptions.ResponseError,)

    @property
    def denied(self) -> tuple[type[Exception], ...]:
        """What a server raises at a user without the right."""
        redis = self._module()
        return () if redis is None else (redis.exceptions.NoPermissionError, redis.exceptions.ReadOnlyError)

    @property
    def where(self) -> str:
        return redacted(self.url)

    def usable(self) -> bool:
        return time.monotonic() >= self._off_until

    def _switch_off(self, exc: Exception) -> None:
        with self._lock:
            self.failures += 1
            self._off_until = time.monotonic() + self.backoff_s
        # once a process: a server that stays down, or goes down again, is not news after each back-off
        warn_once(f"remote-down:{self.url}", f"cluster cache {self.where} is not "
                  f"answering ({type(exc).__name__}: {exc}); going on without it for {self.backoff_s:.0f} s at a time "
                  "(local caches and the JIT serve meanwhile)", logger=_log)

    def read(self, command: str, *args, **kwargs):
        """The answer to the command named ``command``; None while the link is off or when the server fails."""
        if not self.usable():
            return None
        try:
            return getattr(self.client, command)(*args, **kwargs)
        except self.errors as exc:
            self._switch_off(exc)
            return None

    def write(self, command: str, *args, **kwargs):
        """Run the writing command named ``command``, unless this user may not write or the link is off (then None)."""
        return self._attempt(command, *args, **kwargs)[1]

    def _attempt(self, command: str, *args, **kwargs) -> tuple[bool, object]:
        """(whether the server ran ``command``, its answer): False where this user may not write,
        the link is off, or the server failed or refused."""
        if not self.may_write or not self.usable():
            return False, None
        try:
            return True, getattr(self.client, command)(*args, **kwargs)
        except self.denied as exc:
            self.may_write = False
            _log.info("cluster cache %s is read-only for this user (%s): reading only", self.where, exc)
        except self.refused as exc:
            warn_once(f"remote-refused:{self.url}:{str(exc).split()[0] if str(exc) else ''}", f"cluster cache "
                      f"{self.where} refused a write ({exc}); what this process compiles may stay out of it "
                      "(a server full under maxmemory-policy noeviction: see README for an LRU policy)", logger=_log)
        except self.errors as exc:
            self._switch_off(exc)
        return False, None

    def get(self, name: str) -> bytes | None:
        return self.read("get", name)

    def get_capped(self, name: str, cap: int) -> bytes | None:
        """``name``'s value, or None when absent or unreachable; at most ``cap + 1`` bytes are read,
        so a value longer than ``cap`` (a planted giant) comes back one byte too long, costing no
        memory or network: the caller refuses it. GETRANGE of a missing name is empty."""
        return self.read("getrange", name, 0, cap) or None

    def set(self, name: str, data: bytes, **options) -> bool:
        return bool(self.write("set", name, data, **options))

    def delete(self, *names: str) -> int:
        return (self.write("delete", *names) or 0) if names else 0

    def take(self, name: str, token: str, ttl_ms: int) -> bool | None:
        """Set ``name`` to ``token`` for ``ttl_ms`` if nobody holds it: True taken, False held by
        another, None when the link cannot write (down, off, or a read-only user)."""
        ran, done = self._attempt("set", name, token, nx=True, px=ttl_ms)  # done None: held by another
        return bool(done) if ran else None

    def renew(self, name: str, token: str, ttl_ms: int) -> bool | None:
        """Extend ``name``'s expiry if ``token`` still holds it: True; False when it does not;
        None when the link cannot say now (off: the next renewal tries again)."""
        ran, done = self._attempt("eval", _RENEW, 1, name, token, ttl_ms)
        return bool(done) if ran else None

    def release(self, name: str, token: str) -> None:
        """Free ``name`` if ``token`` holds it (else it expires by itself)."""
        self.write("eval", _RELEASE, 1, name, token)

    def probe_write(self) -> tuple[bool, str]:
        """Whether this user may write, found by writing and deleting a short-lived probe key."""
        import socket

        try:
            self.client.set(f"kdb:probe:{socket.gethostname()}:{os.getpid()}", b"1", px=2000)
            self.client.delete(f"kdb:probe:{socket.gethostname()}:{os.getpid()}")
            return True, "yes"
        except self.denied as exc:
            self.may_write = False
            return False, f"no: read-only user ({exc})"

    def close(self) -> None:
        redis = self._module()
        if redis is not None:
            try:
                self._client.close()
            except redis.RedisError:
                pass
