# The two commands a newcomer runs (README): `make demo` and `make test`.
PY := .venv/bin/python
export VLLM_CPU_OMP_THREADS_BIND ?= all
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# Ray kills workers at 95% node memory by default; on a 24 GiB machine shared with a vLLM
# engine that is reached by page cache and other processes, not by our workers.
export RAY_memory_usage_threshold ?= 0.99

.PHONY: setup demo test test-fast clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) -m agent_rl.demo

test: setup
	$(PY) -m pytest -q -x --timeout=1800 -n 2 --dist loadgroup tests

test-fast: setup
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not slow" tests

clean:
	rm -rf artifacts runs
