"""Imports third-party libraries make at start-up for features nothing here uses, skipped.

- transformers imports scikit-learn whenever it is installed (sentence-transformers, a
  dependency, brings it in), and with it scipy and pandas, for the dynamic confidence
  threshold of assisted decoding (`transformers.generation.candidate_generator`'s
  `roc_curve`); and scipy.optimize for the matching of object-detection losses
  (`transformers.loss.loss_for_object_detection`). Both happen as soon as a model class
  resolves (`AutoModelForCausalLM`).
- vLLM imports scipy.signal for one way of resampling audio (`vllm.multimodal.audio`).

So every process that loads a model or an engine paid seconds of CPU for them: the trainer's
Ray actors, the engines, each command and each test process. On a 2-core machine those
seconds are the test suite's and every run's start-up (measured on an AVX2 host: torch +
`AutoModelForCausalLM` 9.7-10.2 s with scikit-learn, 6.7-7.3 s without; by `-X importtime`,
scipy was 3.5 s of a vLLM engine's 28 s of imports).

`install()` makes transformers see scikit-learn and scipy as absent: it patches
`transformers.utils.import_utils.is_sklearn_available` and `is_scipy_available` right after
that module loads; and while `vllm.multimodal.audio` runs its own imports, scipy is absent
to that thread (vLLM falls back to its placeholder, which raises only if audio is resampled
with scipy). A meta-path finder wraps those modules' loaders, so nothing is imported early.
scikit-learn and scipy themselves stay importable: sentence-transformers and anything else
that imports them directly gets them. Both packages call `install()` when they are imported
(`data_prep/__init__.py`, `agent_rl/__init__.py`), so a Ray actor or a subprocess that runs
any of our code has it in place before transformers or vLLM loads, with no entry point in
between. `AGENT_RL_LEAN_IMPORTS=0` turns it off. tests/data_prep/test_lean_imports.py checks
both ways, so a release that stops importing them this way fails it.

Standard library only: it runs when `data_prep` is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import threading
from types import ModuleType
from typing import Any

SWITCH_ENV = "AGENT_RL_LEAN_IMPORTS"
"""0 / false / no: install() does nothing."""

TARGET = "transformers.utils.import_utils"
"""The module whose availability checks are patched once it has run."""

CHECKS = ("is_sklearn_available", "is_scipy_available")
"""transformers' checks that answer False."""

QUIET = {"vllm.multimodal.audio": "scipy"}
"""module -> a package that is absent to the module's own imports (the thread running them)."""


def _absent() -> bool:
    return False


def _patch(module: ModuleType) -> None:
    utils = sys.modules.get("transformers.utils")  # re-exports them, once its import of TARGET returns
    for name in CHECKS:
        setattr(module, name, _absent)
        if utils is not None and hasattr(utils, name):
            setattr(utils, name, _absent)


_blocked = threading.local()


class _Blocker(importlib.abc.MetaPathFinder):
    """Raises ImportError for `_blocked.package` (and its submodules) in the thread that set it."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        package = getattr(_blocked, "package", None)
        if package and (fullname == package or fullname.startswith(package + ".")):
            raise ModuleNotFoundError(f"{fullname} is skipped while a module that only may use it loads "
                                      "(data_prep/lean_imports.py)", name=fullname)
        return None


class _PatchingLoader(importlib.abc.Loader):
    """A module's own loader, with TARGET's patch after it runs or QUIET's package absent while
    it runs; anything else is asked of the original loader."""

    def __init__(self, inner: Any, fullname: str) -> None:
        self.inner, self.fullname = inner, fullname

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        quiet = QUIET.get(self.fullname)
        if quiet is None:
            self.inner.exec_module(module)
            _patch(module)
            return
        before = getattr(_blocked, "package", None)
        _blocked.package = quiet
        try:
            self.inner.exec_module(module)
        finally:
            _blocked.package = before

    def __getattr__(self, name: str) -> Any:  # get_source, get_data, ... for inspect and friends
        return getattr(self.inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != TARGET and fullname not in QUIET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, fullname)
        return spec


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "1").strip().lower() not in ("0", "false", "no")


def install() -> None:
    """Idempotent; cheap (no import). Where transformers' checks have already loaded, patch them
    now (what was imported because of them stays)."""
    if not enabled():
        return
    if TARGET in sys.modules:
        _patch(sys.modules[TARGET])
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path[:0] = [_Finder(), _Blocker()]
