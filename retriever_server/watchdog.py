"""Exit when the process that started us is gone, so a killed launcher leaves no server behind.

A server started by a test fixture, a benchmark or the quickstart runs in its own session
(so Ctrl-C in a terminal reaches the launcher, which stops it cleanly); but when the launcher
is killed outright (SIGKILL, as CI's time limit does) nothing would stop the server. Linux's
PR_SET_PDEATHSIG would, but it fires when the *thread* that forked exits, not the process,
and exists only on Linux; polling is portable and costs nothing measurable.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


def process_alive(pid: int, was_parent: bool) -> bool:
    """Is `pid` still running? A parent that died reparents us at once, even while it is an
    unreaped zombie, so for our own parent getppid() is the reliable test."""
    if was_parent:
        return os.getppid() == pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def exit_with(pid: int, stop: Callable[[], None], every_s: float = 0.5, grace_s: float = 10.0) -> threading.Thread:
    """Watch `pid` from a daemon thread; when it is gone call `stop()` (a graceful shutdown) and,
    if the process is still alive `grace_s` later (e.g. still loading an index), exit hard."""
    was_parent = os.getppid() == pid

    def watch() -> None:
        while process_alive(pid, was_parent):
            time.sleep(every_s)
        log.warning("parent process %d is gone: shutting down", pid)
        stop()
        time.sleep(grace_s)
        os._exit(3)

    t = threading.Thread(target=watch, name="parent-watchdog", daemon=True)
    t.start()
    return t
