"""Imports a third-party library makes at start-up for a feature nothing here uses, skipped.

transformers imports scikit-learn whenever it is installed (sentence-transformers, a
dependency, brings it in), and with it scipy and pandas, for one feature: the dynamic
confidence threshold of assisted decoding (`transformers.generation.candidate_generator`'s
`roc_curve`), which no code here uses. The import happens as soon as a model class resolves
(`AutoModelForCausalLM`), so every process that loads a model pays a few seconds of CPU for
it: the trainer's Ray actors, the engines, each command and each test process. On a 2-core
machine those seconds are the test suite's and every run's start-up.

`install()` makes transformers see scikit-learn as absent: it patches
`transformers.utils.import_utils.is_sklearn_available` right after that module loads (a
meta-path finder wraps its loader, so nothing is imported early). scikit-learn itself stays
importable: sentence-transformers and anything else that imports it directly gets it. Both
packages call `install()` when they are imported (`data_prep/__init__.py`,
`agent_rl/__init__.py`), so a Ray actor or a subprocess that runs any of our code has it in
place before transformers loads, with no entry point in between. `AGENT_RL_LEAN_IMPORTS=0`
turns it off. tests/data_prep/test_lean_imports.py checks both ways, so a transformers release
that stops importing scikit-learn this way fails it and this module can go.

Standard library only: it runs when `data_prep` is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any

SWITCH_ENV = "AGENT_RL_LEAN_IMPORTS"
"""0 / false / no: install() does nothing."""

TARGET = "transformers.utils.import_utils"
"""The module whose availability check is patched once it has run."""


def _no_sklearn() -> bool:
    return False


def _patch(module: ModuleType) -> None:
    module.is_sklearn_available = _no_sklearn
    utils = sys.modules.get("transformers.utils")  # re-exports it, once its import of TARGET returns
    if utils is not None and hasattr(utils, "is_sklearn_available"):
        utils.is_sklearn_available = _no_sklearn


class _PatchingLoader(importlib.abc.Loader):
    """TARGET's own loader, then the patch; anything else is asked of the original loader."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _patch(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_data, ... for inspect and friends
        return getattr(self.inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader)
        return spec


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "1").strip().lower() not in ("0", "false", "no")


def install() -> None:
    """Idempotent; cheap (no import). Where transformers' check has already loaded, patch it now
    (what was imported because of it stays)."""
    if not enabled():
        return
    if TARGET in sys.modules:
        _patch(sys.modules[TARGET])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
