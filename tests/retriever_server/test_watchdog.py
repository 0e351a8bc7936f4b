"""A server whose launcher is killed outright (SIGKILL, as CI's time limit does) stops by itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import httpx
import pytest


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie still answers kill(0); it has exited all the same
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True


def test_exit_with_calls_stop_when_watched_process_dies():
    from retriever_server.watchdog import exit_with

    watched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stopped = threading.Event()
    exit_with(watched.pid, stopped.set, every_s=0.05, grace_s=3600)
    time.sleep(0.3)
    assert not stopped.is_set(), "stop() called while the watched process is alive"
    watched.kill()
    watched.wait()
    assert stopped.wait(5), "stop() not called after the watched process died"


@pytest.mark.slow
def test_server_exits_when_its_launcher_is_killed(flat_index, tiny_corpus, tmp_path):
    """The launcher (a separate Python process) starts a real server with start_server and is
    then SIGKILLed: no `finally` runs in it, yet the server must exit within seconds."""
    info = tmp_path / "server.txt"
    launcher = textwrap.dedent(f"""
        import time
        from retriever_server.launch import start_server, wait_healthy
        proc, url = start_server({str(flat_index)!r}, {str(tiny_corpus)!r}, extra_args=["--log-level", "warning"])
        wait_healthy(url, timeout=180, proc=proc)
        open({str(info)!r}, "w").write(f"{{proc.pid}} {{url}}")
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", launcher])
    try:
        deadline = time.monotonic() + 240
        while not info.exists() or not info.read_text().strip():
            assert parent.poll() is None, "launcher died before the server was healthy"
            assert time.monotonic() < deadline, "server not healthy in time"
            time.sleep(0.2)
        pid_s, url = info.read_text().split()
        pid = int(pid_s)
        assert httpx.get(f"{url}/health").status_code == 200
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 20
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _gone(pid), f"server {pid} still running 20 s after its launcher was killed"
    finally:
        if parent.poll() is None:
            parent.kill()
        if info.exists() and info.read_text().strip():
            pid = int(info.read_text().split()[0])
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
