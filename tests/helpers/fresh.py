"""`run_fresh(code)`: Python `code` in a new interpreter (what a process of ours imports at start,
unaffected by what the test process already loaded), from the project root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_fresh(code: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """The finished process (stdout, stderr as text); raises nothing on a non-zero exit."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          **kwargs)
