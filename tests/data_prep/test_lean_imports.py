"""data_prep.lean_imports: a process of ours loads a transformers model without scikit-learn or
scipy and vLLM's audio module without scipy, and both stay importable; with the switch off
transformers and vLLM import them again (so a release that stops doing so fails here)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from fresh import run_fresh

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import agent_rl  # a Ray actor or a subprocess of ours imports our code before transformers
from transformers import AutoModelForCausalLM
AutoModelForCausalLM.from_pretrained  # resolving the class loads transformers.generation
before = "sklearn" in sys.modules
scipy_transformers = "scipy" in sys.modules
if scipy_transformers:  # switched off: loaded already, so vLLM's own import of it cannot show (nor cost vLLM's import)
    scipy_vllm = True
else:
    import vllm.multimodal.audio  # resamples audio with scipy.signal where it loads
    scipy_vllm = "scipy" in sys.modules
import inspect, transformers.utils.import_utils as iu
source = len(inspect.getsource(iu)) > 0  # the wrapped loader still answers inspect
import sklearn.metrics, scipy.signal  # still importable for whoever imports them directly
print(json.dumps({"sklearn_before": before, "scipy_transformers": scipy_transformers, "scipy_vllm": scipy_vllm,
                  "source": source, "sklearn_after": "sklearn" in sys.modules}))
"""


def _probe(switch: str) -> dict:
    env = {**os.environ, "AGENT_RL_LEAN_IMPORTS": switch, "PYTHONPATH": str(ROOT)}
    out = run_fresh(PROBE, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("switch, imported", [("1", False), ("0", True)])
def test_a_model_class_and_vllm_load_without_scikit_learn_or_scipy_unless_switched_off(switch, imported):
    assert _probe(switch) == {"sklearn_before": imported, "scipy_transformers": imported, "scipy_vllm": imported,
                              "source": True, "sklearn_after": True}


def test_install_after_transformers_loaded_patches_it_in_place(monkeypatch):
    """A process that loaded transformers' check first (a test importing transformers before
    our code) gets the patch at once; installing twice adds one finder."""
    import types

    from data_prep import lean_imports

    fake = types.ModuleType(lean_imports.TARGET)
    fake.is_sklearn_available = lambda: True
    monkeypatch.setitem(sys.modules, lean_imports.TARGET, fake)
    lean_imports.install()
    assert fake.is_sklearn_available() is False and fake.is_scipy_available() is False
    monkeypatch.delitem(sys.modules, lean_imports.TARGET)
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, lean_imports._Finder)])
    lean_imports.install()
    lean_imports.install()
    assert sum(isinstance(f, lean_imports._Finder) for f in sys.meta_path) == 1


def test_a_package_is_absent_only_to_the_thread_loading_the_module():
    """Another thread importing scipy while vLLM's audio module loads gets it."""
    import threading

    from data_prep import lean_imports

    blocker = lean_imports._Blocker()
    lean_imports._blocked.package = "scipy"
    try:
        with pytest.raises(ModuleNotFoundError, match="scipy.signal is skipped"):
            blocker.find_spec("scipy.signal", None)
        assert blocker.find_spec("scipyx", None) is None
        other: list = []
        thread = threading.Thread(target=lambda: other.append(blocker.find_spec("scipy.signal", None)))
        thread.start()
        thread.join()
        assert other == [None]
    finally:
        lean_imports._blocked.package = None
    assert blocker.find_spec("scipy.signal", None) is None
