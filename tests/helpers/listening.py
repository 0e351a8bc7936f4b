"""A server process the tests start and wait for: `listening(cmd, port, what, within_s)`."""

from __future__ import annotations

import socket
import subprocess
import time
from contextlib import contextmanager
from typing import Iterator


def free_port() -> int:
    """A port nothing listens on now (the OS's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def listening(cmd: list[str], port: int, what: str, within_s: float) -> Iterator[subprocess.Popen]:
    """Run `cmd` until the block ends (then kill it), once it accepts connections on `port`;
    fails naming `what` if it exits first or does not listen within `within_s` seconds."""
    proc = subprocess.Popen(cmd)
    try:
        deadline = time.monotonic() + within_s
        while True:
            assert proc.poll() is None, f"{what} exited with {proc.returncode}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"{what} did not listen within {within_s:g} s"
                time.sleep(0.05)
        yield proc
    finally:
        proc.kill()
        proc.wait(10)
