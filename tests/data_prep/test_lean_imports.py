"""data_prep.lean_imports: a process of ours loads a transformers model without scikit-learn,
which stays importable; with the switch off transformers imports it again (so a release that
stops doing so fails here, and the module can go)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import agent_rl  # a Ray actor or a subprocess of ours imports our code before transformers
from transformers import AutoModelForCausalLM
AutoModelForCausalLM.from_pretrained  # resolving the class loads transformers.generation
before = "sklearn" in sys.modules
import inspect, transformers.utils.import_utils as iu
source = len(inspect.getsource(iu)) > 0  # the wrapped loader still answers inspect
import sklearn.metrics  # still importable for whoever imports it directly
print(json.dumps({"sklearn_before": before, "source": source, "sklearn_after": "sklearn" in sys.modules}))
"""


def _probe(switch: str) -> dict:
    env = {**os.environ, "AGENT_RL_LEAN_IMPORTS": switch, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("switch, imported", [("1", False), ("0", True)])
def test_a_model_class_loads_without_scikit_learn_unless_switched_off(switch, imported):
    assert _probe(switch) == {"sklearn_before": imported, "source": True, "sklearn_after": True}


def test_install_after_transformers_loaded_patches_it_in_place(monkeypatch):
    """A process that loaded transformers' check first (a test importing transformers before
    our code) gets the patch at once; installing twice adds one finder."""
    import types

    from data_prep import lean_imports

    fake = types.ModuleType(lean_imports.TARGET)
    fake.is_sklearn_available = lambda: True
    monkeypatch.setitem(sys.modules, lean_imports.TARGET, fake)
    lean_imports.install()
    assert fake.is_sklearn_available() is False
    monkeypatch.delitem(sys.modules, lean_imports.TARGET)
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, lean_imports._Finder)])
    lean_imports.install()
    lean_imports.install()
    assert sum(isinstance(f, lean_imports._Finder) for f in sys.meta_path) == 1
