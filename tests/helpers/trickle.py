"""A raw client that sends its request slowly: the retriever's header and body deadlines are
tested with it (tests/retriever_server/test_faults.py, test_headers.py)."""

from __future__ import annotations

import select
import socket
import threading
import time


class Trickle:
    """A raw socket that sends `head`, then one `byte` every `every_s` seconds (none when
    `every_s` is None: an idle connection) for as long as the server keeps the connection;
    `.received` is what the server answered, `.closed_after_s` when it closed the connection
    (None while it is open)."""

    def __init__(self, port: int, head: bytes, every_s: float | None = 0.2, byte: bytes = b" "):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(head)
        self.t0 = time.monotonic()
        self.every_s, self.byte = every_s, byte
        self.received = b""
        self.closed_after_s: float | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                if select.select([self.sock], [], [], self.every_s or 0.05)[0]:
                    chunk = self.sock.recv(65536)
                    if not chunk:
                        break
                    self.received += chunk
                elif self.every_s is not None:
                    self.sock.sendall(self.byte)
        except OSError:  # reset: closed by the server as well
            pass
        self.closed_after_s = time.monotonic() - self.t0

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()
