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

# --max-worker-restart=0: a test that kills its worker (a native abort) fails once and ends the
# run; xdist would otherwise hand its lane to fresh workers that rebuild the session's engines
# and run it again, up to 8 times (a crashing run of the suite idled there instead of ending).
test: setup
	$(PY) -m pytest -q -x --timeout=1800 -n 2 --dist loadgroup --max-worker-restart=0 tests

test-fast: setup
	$(PY) -m pytest -q -n 2 --dist loadgroup --max-worker-restart=0 -m "not slow" tests

clean:
	rm -rf artifacts runs
