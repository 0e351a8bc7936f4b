"""The demo's calibration stage as a process (a real vLLM engine, torch, transformers): its output
holds our line and none of the third-party notices data_prep.quiet lists, no other warning line
and no vLLM INFO line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from data_prep import quiet

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_calibration_prints_our_lines_and_no_third_party_notices(tiny_policy, tmp_path):
    # the 2-block copy of the embedded policy: the same loads, engine, update and libraries
    # print what they print for any model; the subject is the log, not the model
    # the child's own entry point must do the quieting: nothing of it is inherited from this process
    env = {k: v for k, v in os.environ.items() if k not in {*quiet.ENV, *quiet.ENGINE_ENV, quiet.SWITCH_ENV}}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env["VLLM_DIST_IDENT"] = "29500"  # what a parent that hosted a CPU engine passes on (vLLM sets it there)
    cmd = [sys.executable, "-m", "agent_rl.demo", "calibrate", "--model", str(tiny_policy), "--config",
           "configs/train/demo_grpo_cpu.yaml", "--batch", "2", "--gen-tokens", "4", "--out",
           str(tmp_path / "calibration.json"), "actor_rollout_ref.rollout.kv_cache_space_gb=0.25"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert re.search(r"^\[calibrate\] update .* tok/s .* generation .* tok/s", out, re.MULTILINE), out[-3000:]

    lines = out.splitlines()
    listed = [line for line in lines if any(re.search(n.text, line) for n in quiet.NOTICES)]
    assert not listed, "listed notices still printed:\n" + "\n".join(listed)
    assert "Loading weights" not in out  # transformers' bar at every model load (quiet.ENV)
    assert "NUMA binding" not in out  # torch's C++ log in an engine process (quiet.ENGINE_ENV)
    warned = [line for line in lines if re.search(r"(?i)\bwarn", line)]
    if bf16_forced_without_hardware():  # AGENT_RL_NATIVE_BF16=1 on a CPU without bf16: vLLM says, truly, that
        warned = [w for w in warned if "Failed to create oneDNN linear, fallback to torch linear" not in w]
    assert not warned, "a warning to judge (a real problem, or a row of data_prep.quiet):\n" + "\n".join(warned)
    info = [line for line in lines if re.search(r"\bINFO\b", line)]
    assert not info, "vLLM INFO lines (quiet.ENV's VLLM_LOGGING_LEVEL):\n" + "\n".join(info)


def bf16_forced_without_hardware() -> bool:
    """AGENT_RL_NATIVE_BF16=1 (checking the other host kind's choices) on a CPU without native bf16."""
    from data_prep import hardware

    with pytest.MonkeyPatch.context() as mp:
        chosen = hardware.native_bf16()[0]  # what this run uses, the override included
        mp.delenv(hardware.OVERRIDE_ENV, raising=False)
        return chosen and not hardware.native_bf16()[0]
