"""Start / wait for / stop a retriever server in its own process (tests, benchmarks, demo)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_server(index_dir: str | os.PathLike | Sequence[str | os.PathLike], corpus: str | os.PathLike,
                 port: int | None = None, extra_args: Sequence[str] = (), log_path: str | os.PathLike | None = None,
                 host: str = "127.0.0.1") -> tuple[subprocess.Popen, str]:
    """Run `python -m retriever_server` on `host:port` (a free port if None); returns (process, base_url).

    index_dir may be a list (dense + bm25 for hybrid). Output goes to log_path (a temp file by
    default, which `stop_server` removes when the server ends cleanly; its path is
    `proc.log_path`)."""
    port = port or free_port(host)
    dirs = [index_dir] if isinstance(index_dir, (str, os.PathLike)) else list(index_dir)
    # --parent-pid: the server exits when this process dies, even by SIGKILL (retriever_server.watchdog)
    cmd = [sys.executable, "-m", "retriever_server", "--corpus", str(corpus), "--host", host, "--port", str(port),
           "--parent-pid", str(os.getpid())]
    for d in dirs:
        cmd += ["--index", str(d)]
    cmd += [str(a) for a in extra_args]
    temp_log = log_path is None
    if temp_log:
        fd, log_path = tempfile.mkstemp(prefix="retriever-", suffix=".log")
        os.close(fd)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    root = str(Path(__file__).resolve().parent.parent)  # importable without an installed package
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    log = open(log_path, "ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    log.close()
    proc.log_path = str(log_path)  # type: ignore[attr-defined]
    proc.temp_log = temp_log  # type: ignore[attr-defined]
    return proc, f"http://{host}:{port}"


def log_tail(proc: subprocess.Popen, chars: int = 3000) -> str:
    path = getattr(proc, "log_path", None)
    if not path or not os.path.exists(path):
        return ""
    return Path(path).read_text(errors="replace")[-chars:]


def wait_healthy(base_url: str, timeout: float = 120.0, proc: subprocess.Popen | None = None) -> dict:
    """Poll GET /health until 200 (returns its JSON). Raises RuntimeError if `proc` exits first
    (with the end of its log) and TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    with httpx.Client(timeout=5.0, trust_env=False) as client:  # a local server: never via HTTP_PROXY
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"retriever exited with code {proc.returncode} before it was healthy:\n"
                                   + log_tail(proc))
            try:
                r = client.get(f"{base_url}/health")
                if r.status_code == 200:
                    return r.json()
                last = f"{r.status_code} {r.text[:200]}"
            except httpx.TransportError as e:
                last = f"{type(e).__name__}"
            time.sleep(0.2)
    raise TimeoutError(f"retriever at {base_url} not healthy after {timeout:.0f}s (last: {last})")


def stop_server(proc: subprocess.Popen, timeout: float = 15.0) -> int:
    """SIGTERM (graceful), then SIGKILL after `timeout`; returns the exit code. The temp log
    start_server made goes with a server that ended cleanly (0 or our SIGTERM); any other end
    keeps it for its reader."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    if getattr(proc, "temp_log", False) and proc.returncode in (0, -signal.SIGTERM):
        Path(proc.log_path).unlink(missing_ok=True)
    return proc.returncode


class ServerThread:
    """An app served by uvicorn on a thread of this process (tests and benchmarks that give the
    app their own backend): real sockets and HTTP, `loop` reachable for fault injection."""

    def __init__(self, app, host: str = "127.0.0.1", port: int | None = None):
        import threading

        import uvicorn

        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        options = dict(log_level="warning", access_log=False, lifespan="on")
        if hasattr(app.state, "rs"):  # create_app's: served with its header limits, as the CLI serves it
            from retriever_server.http_guard import server_config

            config = server_config(app, host, self.port, **options)
        else:
            config = uvicorn.Config(app, host=host, port=self.port, **options)
        self.server = uvicorn.Server(config)
        self.loop = None
        self._thread = threading.Thread(target=self._serve, name="uvicorn", daemon=True)

    def _serve(self) -> None:
        import asyncio

        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.server.serve())

    def __enter__(self) -> "ServerThread":
        self._thread.start()
        wait_healthy(self.url, timeout=30)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self._thread.join(15)
