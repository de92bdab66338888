"""A real ``redis-server`` for the cluster-tier tests: started on a free loopback port in a
temporary folder, with an ACL user that may only read, and stopped at the end."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.prerequisites import require_redis_server

READER, READER_PASSWORD = "reader", "reader-secret"
BUILDER, BUILDER_PASSWORD = "builder", "builder-secret"
# README's ACL lines for a deployment's jobs and builders, verbatim
READER_RIGHTS = ("~kdb:*", "-@all", "+@read", "+ping")
BUILDER_RIGHTS = ("~kdb:*", "-@all", "+@read", "+@write", "+ping", "+eval", "+evalsha")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, executable: str, folder: Path, port: int | None = None):
        self.executable, self.folder = executable, folder
        self.port = port or free_port()
        folder.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [executable, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(folder), "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self._wait_then_add_the_reader()
        except BaseException:
            self.stop()
            raise

    def _wait_then_add_the_reader(self) -> None:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {self.port}")
                time.sleep(0.05)
        # jobs' user: reads programs, writes nothing (a builder or trusted node uses the default user)
        self.client().execute_command("ACL", "SETUSER", READER, "on", f">{READER_PASSWORD}", *READER_RIGHTS)
        self.client().execute_command("ACL", "SETUSER", BUILDER, "on", f">{BUILDER_PASSWORD}", *BUILDER_RIGHTS)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def reader_url(self) -> str:
        return f"redis://{READER}:{READER_PASSWORD}@127.0.0.1:{self.port}/0"

    @property
    def builder_url(self) -> str:
        return f"redis://{BUILDER}:{BUILDER_PASSWORD}@127.0.0.1:{self.port}/0"

    def client(self):
        import redis

        return redis.Redis.from_url(self.url)

    def kill(self) -> None:
        """Stop it as a crash would (SIGKILL: no shutdown, every entry lost)."""
        self.process.kill()
        self.process.wait()

    def restart(self) -> "RedisServer":
        """A new, empty server on the same port (after kill or stop)."""
        return RedisServer(self.executable, self.folder, self.port)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A redis-server for the test module (import this fixture into it)."""
    running = RedisServer(require_redis_server(), tmp_path_factory.mktemp("redis"))
    yield running
    running.stop()
