#!/usr/bin/env bash
# The GPU paths, run for real on a CUDA machine, in one command (docs/gpu.md).
#
#   scripts/gpu_check.sh prepare   # here, with the project's .venv: what must travel -> .gpu/ and .whl/
#   scripts/gpu_check.sh prepare-ray   # here: Ray and its missing deps, unpacked, xz -> .gpu/ray.tar.xz
#                                      # (38 MB; travels in a call of its own: with the rest it
#                                      # passes 64 MiB)
#   scripts/gpu_check.sh run       # on the CUDA machine: install the carried wheels, run
#                                  # `pytest -m gpu tests/gpu` and benchmarks/gpu.py, print a table
#
# The whole loop with vLLM's CUDA engine (docs/gpu.md, "The loop on a GPU"):
#   scripts/gpu_check.sh prepare-vllm  # here: the kit (vLLM 0.24 trimmed, its missing deps, Ray,
#                                      # the policy's GGUF, the encoder) -> .kit/piece-NN.bin + manifest
#   scripts/gpu_check.sh kit           # there, once per piece as it arrives: check and unpack
#   scripts/gpu_check.sh loop-start    # there: stage c (`make demo`'s pipeline) started in the
#                                      # background, stages a+b (engine on CUDA, weight sync) beside it
#                                      # (AB=0 leaves them out); VARLEN_TEST=1 runs the varlen kernel's
#                                      # test first (the demo trains with the loop if it fails),
#                                      # ROLLOUT_BESIDE=1 the rollout benchmark beside the demo, WAIT_S=N
#                                      # waits for the demo until N s into the call
#   scripts/gpu_check.sh loop-finish   # there: wait for stage c, then stage d's figures, one table
#   scripts/gpu_check.sh rl-vs-sft-pack  # here, after the benchmark wrote $RVS_DIR's demonstrations
#                                      # (stop it then): its KB, demonstrations, settings -> .kit/rvs.tar.xz
#   scripts/gpu_check.sh rl-vs-sft     # there, instead of the loop: benchmarks.rl_vs_sft $RVS_ARGS
#                                      # in the background on the carried $RVS_DIR (KB and demonstrations
#                                      # made on a CPU host), waiting until WAIT_S s into the call
#   scripts/gpu_check.sh rl-vs-sft-finish  # there: waits for it (stops it WAIT_S s into the call)
#   scripts/gpu_check.sh modes         # there: trainer.mode sync / one_step_off / async side by side
#                                      # (benchmarks/async_modes.py) on the demo's SFT model, in the
#                                      # background until WAIT_S s into the call (the demo's stages up
#                                      # to SFT first where they have not run)
#   scripts/gpu_check.sh modes-finish  # there: waits for it (stops it WAIT_S s into the call)
#   scripts/gpu_check.sh vs-trl-pack   # here: TRL and what it imports beside the kit, as wheels for the
#                                      # lent image's Python -> .kit/trl.tar.xz (travels in a call of its own)
#   scripts/gpu_check.sh vs-trl        # there: our GRPO beside TRL's GRPOTrainer with vLLM colocate
#                                      # (benchmarks/vs_trl.py) from the demo's hermes SFT model, in the
#                                      # background until WAIT_S s into the call (the demo's stages up to
#                                      # SFT with --protocol hermes first where they have not run)
#   scripts/gpu_check.sh vs-trl-finish # there: waits for it (stops it WAIT_S s into the call)
#   scripts/gpu_check.sh probe         # there, instead of the loop: the varlen kernel's test, where
#                                      # the actor update's time goes (shared vs whole packing, varlen
#                                      # kernel vs per-sequence SDPA) and interleaved / plain
#                                      # generation, on the embedded policy, in one call (timeouts
#                                      # 120 + 200 + 200 s; not yet timed on a GPU)
#
# On a CUDA machine where the project is installed (`pip install -e .`), `run` alone works: it
# then uses the embedded model from `make setup` and the installed packages. `prepare` exists for
# a machine that has torch and CUDA but not this project's data or packages and cannot download
# (a lent GPU machine): it writes the policy's config and tokenizer (the weights are rebuilt
# there at random: 540 MB do not travel), the encoder with fp16 weights (xz), a 2,000-passage
# slice of the shared Wikipedia corpus, and the wheels that machine lacks (faiss-cpu, FastAPI,
# uvicorn, pydantic, bm25s) for its Python ($GPU_PYTHON_VERSION, default 3.12).
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=.gpu
WHEELS=.whl
PY=${PY:-.venv/bin/python}

prepare() {
    mkdir -p "$CARRY" "$WHEELS"
    "$PY" - <<'PYEOF'
import json, shutil, tarfile, lzma
from pathlib import Path
from data_prep.model import prepare_model
from data_prep.encoder import resolve_model_path

carry = Path(".gpu")
shutil.rmtree(carry, ignore_errors=True)
carry.mkdir()
model = prepare_model(Path("artifacts/model"))
skel = carry / "policy_skeleton"
shutil.rmtree(skel, ignore_errors=True)
skel.mkdir(parents=True)
for f in model.iterdir():
    if f.is_file() and not f.name.endswith(".safetensors") and not f.name.startswith("."):
        shutil.copy2(f, skel / f.name)

import torch
from safetensors.torch import load_file, save_file
enc = resolve_model_path("minilm")
tmp = carry / "encoder.tmp"
shutil.rmtree(tmp, ignore_errors=True)
shutil.copytree(enc, tmp, ignore=shutil.ignore_patterns("*.safetensors", "*.onnx", "README.md", ".git*"))
(tmp / "README.md").write_text("# " + "sentence-transformers/all-MiniLM-L6-v2 (fp16 copy)\n")
for f in enc.glob("*.safetensors"):
    save_file({k: v.half().contiguous() for k, v in load_file(f).items()}, tmp / f.name, metadata={"format": "pt"})
tmp.rename(carry / "encoder")

wiki = Path("../shared/data/corpus/wiki_35k.jsonl")
if wiki.is_file():
    with open(wiki) as f, open(carry / "passages.jsonl", "w") as out:
        for i, line in zip(range(2000), f):
            out.write(line)
# one xz archive: the fp16 weights and the text files squeeze into the 64 MiB a lent machine takes
with lzma.open(carry / "carry.tar.xz", "wb", preset=9 | lzma.PRESET_EXTREME) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
    for name in ("encoder", "policy_skeleton", "passages.jsonl"):
        if (carry / name).exists():
            tar.add(carry / name, arcname=name)
print("prepared:", sorted(p.name for p in carry.iterdir()))
PYEOF
    local pyv=${GPU_PYTHON_VERSION:-3.12}
    for pkg in faiss-cpu fastapi starlette uvicorn pydantic pydantic_core annotated-types typing-inspection bm25s; do
        ver=$("$PY" -c "import importlib.metadata as m; print(m.version('$pkg'))")
        "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyv" --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 -d "$WHEELS" "$pkg==$ver"
    done
    du -sh "$CARRY/carry.tar.xz" "$WHEELS"
    echo "carry to the GPU machine: $CARRY/carry.tar.xz and $WHEELS (the rest of $CARRY is unpacked from it there)"
}

prepare_ray() {
    # ray's wheel is 79 MB; without its Java jar and the dashboard's source map it packs to 38 MB
    local pyv=${GPU_PYTHON_VERSION:-3.12} site
    site=$(mktemp -d)
    local ver
    ver=$("$PY" -c "import importlib.metadata as m; print(m.version('ray'))")
    for pkg in "ray==$ver" jsonschema jsonschema-specifications referencing rpds-py; do
        "$PY" -m pip install -q --no-deps --only-binary=:all: --python-version "$pyv" --implementation cp \
            --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --target "$site" "$pkg"
    done
    rm -rf "$site/ray/jars" "$site/bin" "$site"/ray/dashboard/client/build/static/js/*.map
    mkdir -p "$CARRY"
    tar -C "$site" -cf - . | xz -T0 -6 > "$CARRY/ray.tar.xz"
    rm -rf "$site"
    du -sh "$CARRY/ray.tar.xz"
}

run() {
    local out=${OUT:-gpu_out}
    mkdir -p "$out"
    local py=${GPU_PY:-python3}
    if compgen -G "$WHEELS/*.whl" >/dev/null; then
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/agent-rl-site "$WHEELS"/*.whl
        export PYTHONPATH=/tmp/agent-rl-site${PYTHONPATH:+:$PYTHONPATH}
    fi
    if [ -f "$CARRY/ray.tar.xz" ]; then
        mkdir -p /tmp/agent-rl-ray && tar -xJf "$CARRY/ray.tar.xz" -C /tmp/agent-rl-ray
        export PYTHONPATH=/tmp/agent-rl-ray${PYTHONPATH:+:$PYTHONPATH}
    fi
    if [ -f "$CARRY/carry.tar.xz" ] && [ ! -d "$CARRY/encoder" ]; then
        tar -xJf "$CARRY/carry.tar.xz" -C "$CARRY"
    fi
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
    export PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    set +e
    "$py" -m pytest -m gpu tests/gpu -q -rA -p no:cacheprovider --junitxml="$out/gpu_tests.xml" 2>&1 | tee "$out/gpu_tests.log"
    local tests_rc=${PIPESTATUS[0]}
    "$py" benchmarks/gpu.py --json "$out/gpu_bench.json" ${GPU_BENCH_ARGS:-} 2>&1 | tee "$out/gpu_bench.log"
    local bench_rc=${PIPESTATUS[0]}
    set -e
    "$py" - "$out/gpu_tests.xml" <<'PYEOF'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
print(f"\n{'GPU test':72} result")
for case in root.iter("testcase"):
    status = "passed"
    for tag in ("failure", "error", "skipped"):
        el = case.find(tag)
        if el is not None:
            status = f"{tag}: {(el.get('message') or '')[:60]}"
    print(f"{case.get('classname').split('.')[-1] + '::' + case.get('name'):72} {status}")
PYEOF
    echo "pytest exit $tests_rc, benchmark exit $bench_rc"
    [ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
}

kit_env() {
    export PYTHONPATH=$PWD/.kit/root/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
    export RAY_memory_usage_threshold=0.99
    # the kit carries no FlashInfer (vLLM imports it for its sampler unless told not to)
    export VLLM_USE_FLASHINFER_SAMPLER=0
}

kit_ready() {  # PY: unpack the whole kit and use it (KIT=0: the current environment, a CPU rehearsal)
    [ "${KIT:-1}" = 0 ] && return 0
    "$1" scripts/gpu_kit.py unpack --require-all || return 1
    kit_env
}

# Stage c's command: `make demo`'s pipeline with GPU-sized stages (50 GRPO steps; the plan's
# CPU-calibrated sizes would give a 2-core host's few)
QUICKSTART_ARGS=${QUICKSTART_ARGS:---demos 160 --sft-minutes 2 --rl-minutes 8 --rl-steps 50 --eval-limit 200 --budget-minutes 20}

loop_start() {
    local out=${OUT:-gpu_out} py=${GPU_PY:-python3} vpid=
    mkdir -p "$out" artifacts
    kit_ready "$py" || return 1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    "$py" -c "import vllm, ray, faiss, torch; print(f'vllm {vllm.__version__}, ray {ray.__version__}, faiss {faiss.__version__}, torch {torch.__version__}')"
    # VARLEN_TEST=1: the varlen kernel's GPU test beside the policy's conversion; if it fails, the
    # demo trains with the per-sequence loop it replaces
    if [ "${VARLEN_TEST:-0}" = 1 ]; then
        timeout 150 "$py" -m pytest -m gpu tests/gpu/test_training_gpu.py -k varlen_kernel -q -rA -p no:cacheprovider \
            > "$out/varlen_test.log" 2>&1 &
        vpid=$!
    fi
    "$py" -m data_prep model --out artifacts/model 2>&1 | tail -2   # the real weights, from the GGUF
    if [ -n "$vpid" ]; then
        if wait "$vpid"; then echo "[loop] varlen kernel test passed: the demo trains with the kernel"
        else echo "[loop] varlen kernel test failed: the demo trains with the loop"; export AGENT_RL_VARLEN_KERNEL=0; fi
        tail -n 4 "$out/varlen_test.log"
    fi
    # stage c first, in its own session (it outlives this call; loop-finish waits for it): the
    # longest stage, so the checks below run beside it. The engines of stages a+b take 0.25 of
    # the GPU, the rollout benchmark's 0.2, the demo's 0.5 at most: they fit on an H100 or an H200.
    # shellcheck disable=SC2086
    setsid "$py" -m agent_rl.demo $QUICKSTART_ARGS > artifacts/gpu_quickstart.log 2>&1 < /dev/null &
    echo $! > artifacts/gpu_quickstart.pid
    # AB=0: leave out stages a+b (they passed in run 9), so stage c has the GPU and the CPUs alone
    if [ "${AB:-1}" != 0 ]; then
        set +e
        timeout "${AB_TIMEOUT_S:-300}" "$py" -m pytest -m gpu tests/gpu/test_vllm_gpu.py -q -rA -s -p no:cacheprovider \
            --junitxml="$out/stage_ab.xml" 2>&1 | tee "$out/stage_ab.log" | grep -v -E "^(INFO|DEBUG) "
        echo "[loop] stages a+b: pytest exit ${PIPESTATUS[0]}"
        set -e
    fi
    # ROLLOUT_BESIDE=1: interleaved / plain generation on the untrained policy (few-shot prompts)
    # beside the demo's stages before GRPO, so that a loan need not wait for the demo to measure it
    if [ "${ROLLOUT_BESIDE:-0}" = 1 ]; then
        rollout_benchmark "$py" "$out" --model artifacts/model --gpu-memory-utilization 0.2
        cp "$out/rollout.json" artifacts/gpu_rollout.json 2>/dev/null || true
    fi
    echo "[loop] stage c (pid $(cat artifacts/gpu_quickstart.pid)) so far:"; grep -E "^\[demo\]" artifacts/gpu_quickstart.log | tail -n 8
    # WAIT_S: wait for the demo in this call too, until WAIT_S seconds after it began (loop-finish
    # then waits for the rest)
    if [ -n "${WAIT_S:-}" ]; then wait_demo "$out" "$WAIT_S"; fi
}

rollout_benchmark() {  # PY OUT ARGS...: interleaved / plain generation of the same prompts
    local py=$1 out=$2; shift 2
    set +e
    timeout "${D_TIMEOUT_S:-200}" "$py" benchmarks/rollout.py "$@" --tool-latency-ms 0-0 --trajectories 128 \
        --max-num-seqs 128 --in-flight 128 --max-turns 2 --max-tokens-per-turn 96 \
        --json "$out/rollout.json" 2>&1 | tee "$out/rollout.log" | grep -v -E "^(INFO|DEBUG|WARNING) " | tail -n 14
    echo "[loop] rollout benchmark: exit ${PIPESTATUS[0]}"
    set -e
}

scale() {  # a policy of Qwen2.5-3B's shape, random weights made on the device: benchmarks/scale.py
    # (a CPU rehearsal: KIT=0 SCALE_SHAPE=tiny-qwen2 SCALE_ARGS=--quick scripts/gpu_check.sh scale)
    local out=${OUT:-gpu_out} py=${GPU_PY:-python3}
    mkdir -p "$out"
    kit_ready "$py" || return 1
    set +e
    # shellcheck disable=SC2086
    timeout "${SCALE_TIMEOUT_S:-420}" "$py" benchmarks/scale.py --shape "${SCALE_SHAPE:-qwen2.5-3b}" ${SCALE_ARGS:-} \
        --json "$out/scale.json" --record-dir "$out/scale_record" 2>&1 | tee "$out/scale.log" \
        | grep -v -E "^(INFO|DEBUG|WARNING) " | tail -n 20
    echo "[scale] exit ${PIPESTATUS[0]}"
    set -e
}

collect_demo() {  # OUT: the demo's log, report and GRPO metrics so far (also while it runs)
    local out=$1
    cp artifacts/gpu_quickstart.log "$out/" 2>/dev/null || true
    for f in report.md plan.json grpo_curves.png; do cp "artifacts/demo_runs/$f" "$out/" 2>/dev/null || true; done
    cp artifacts/demo_runs/grpo/metrics.jsonl "$out/grpo_metrics.jsonl" 2>/dev/null || true
}

wait_demo() {  # OUT SECONDS: wait for stage c until SECONDS after this call began
    wait_bg artifacts/gpu_quickstart.pid "$2" collect_demo "$1"
}

wait_bg() {  # PIDFILE SECONDS COLLECT OUT: wait for a background job until SECONDS after this call
             # began, running `COLLECT OUT` every 15 s (a call cut short by the loan still returns
             # what it wrote so far); STOP=1 stops the job if it still runs then
    local pid deadline=$2 collect=$3 out=$4 last=$SECONDS
    pid=$(cat "$1")
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
        sleep 3
        if [ $((SECONDS - last)) -ge 15 ]; then "$collect" "$out"; last=$SECONDS; fi
    done
    if kill -0 "$pid" 2>/dev/null && [ "${STOP:-0}" = 1 ]; then
        echo "[gpu_check] $1's job still running ${deadline} s into this call: stopped"; kill -TERM "$pid"; sleep 10
    fi
    "$collect" "$out"
}

start_bg() {  # DIR COLLECT CMD...: CMD in its own session in the background (DIR.log, DIR.pid), waited
              # for until WAIT_S s into this call, `COLLECT OUT` on the way (OUT made by the caller)
    local dir=$1 collect=$2
    shift 2
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    setsid "$@" > "$dir.log" 2>&1 < /dev/null &
    echo $! > "$dir.pid"
    wait_bg "$dir.pid" "${WAIT_S:-560}" "$collect" "${OUT:-gpu_out}"
}

finish_bg() {  # DIR COLLECT SECONDS: wait for start_bg's job until WAIT_S (default SECONDS) s into
               # this call, then stop it
    local out=${OUT:-gpu_out}
    mkdir -p "$out"
    kit_env
    STOP=1 wait_bg "$1.pid" "${WAIT_S:-$3}" "$2" "$out"
}

# RL against the same minutes of SFT on the GPU (benchmarks/rl_vs_sft): the workdir's knowledge
# base and demonstrations need no GPU, so they are made beforehand on a CPU host (the benchmark with
# the same arguments, stopped once its demonstrations are written) and carried with its
# settings.json; the benchmark reuses them and builds the rest there.
RVS_DIR=${RVS_DIR:-runs/gpu_rvs}
RVS_PACK=${RVS_PACK:-.kit/rvs.tar.xz}

rvs_start() {
    local out=${OUT:-gpu_out} py=${GPU_PY:-python3}
    mkdir -p "$out"
    kit_ready "$py" || return 1
    # the workdir's stages made on the CPU host, packed by `scripts/gpu_check.sh rl-vs-sft-pack`
    if [ -f "$RVS_PACK" ]; then mkdir -p "$(dirname "$RVS_DIR")" && tar -xJf "$RVS_PACK" -C "$(dirname "$RVS_DIR")"; fi
    # shellcheck disable=SC2086
    start_bg "$RVS_DIR" collect_rvs "$py" -m benchmarks.rl_vs_sft --workdir "$RVS_DIR" ${RVS_ARGS:-}
    grep -E "^\[rl_vs_sft\]|^\| |^GRPO|Error" "$RVS_DIR.log" | tail -n 30
}

collect_job() {  # DIR NAME OUT: a background job's log (DIR.log, our lines) -> OUT/NAME.log and its
                 # results so far -> OUT/NAME.tar.gz, weights and the carried inputs left out
    local dir=$1 name=$2 out=$3
    grep -v -E "^(INFO|DEBUG|WARNING)|it/s\]|s/it\]|step/s\]" "$dir.log" > "$out/$name.log" 2>/dev/null || true
    tar -C "$dir" -czf "$out/$name.tar.gz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' \
        --exclude=model --exclude=checkpoints --exclude=kb --exclude=demos --exclude=kb_index_flat . 2>/dev/null || true
}

collect_rvs() { collect_job "$RVS_DIR" rl_vs_sft "$1"; }

rvs_pack() {  # here: the workdir's KB, demonstrations and settings -> $RVS_PACK (~1 MB)
    tar -C "$(dirname "$RVS_DIR")" -cJf "$RVS_PACK" "$(basename "$RVS_DIR")"/{kb,demos,settings.json}
    du -h "$RVS_PACK"
}

# trainer.mode sync / one_step_off / async side by side (benchmarks/async_modes.py, issue 86 item 2):
# GRPO from the demo's SFT model on its knowledge base, with the engine and the trainer on the one
# GPU, as a user with one GPU places them. Where the demo's SFT model is absent, the demo's stages
# up to it run first (its GRPO left out: --rl-minutes 0). In the background, as rl-vs-sft: `modes`
# waits until WAIT_S s into its call, `modes-finish` for the rest. A CPU rehearsal:
#   KIT=0 QUICKSTART_ARGS="--demos 8 --sft-minutes 0.5 --eval-limit 4" MODES_ARGS="--search local --minutes 0.3 --val-every 1 --val-n 4" scripts/gpu_check.sh modes
MODES_DIR=${MODES_DIR:-runs/gpu_modes}
MODES_SFT=${MODES_SFT:-artifacts/demo_runs/sft}
# the two GRPO overrides the loop stage found to matter on a GPU (docs/gpu.md, "The loop on a GPU")
MODES_ARGS=${MODES_ARGS:---minutes 2 --search local --val-every 5 --val-n 60 actor_rollout_ref.rollout.enforce_eager=false actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192}

modes_job() {  # the demo's stages up to SFT where its model is absent, then the benchmark
    local py=${GPU_PY:-python3}
    if [ ! -e "$MODES_SFT" ]; then
        # shellcheck disable=SC2086
        "$py" -m agent_rl.demo $QUICKSTART_ARGS --rl-minutes 0 || return 1
    fi
    # shellcheck disable=SC2086
    "$py" benchmarks/async_modes.py --sft "$MODES_SFT" --workdir "$MODES_DIR" $MODES_ARGS
}

modes_start() {
    local out=${OUT:-gpu_out} py=${GPU_PY:-python3}
    mkdir -p "$out" "$MODES_DIR"
    kit_ready "$py" || return 1
    start_bg "$MODES_DIR" collect_modes bash "$0" modes-job
    modes_said
}

modes_said() {  # our lines of the job's log: the demo's stages, each arm's steps, the table
    grep -E "^\[demo\]|^\[async_modes\]|^\| |^CPU|^GPU|Error" "$MODES_DIR.log" | tail -n 30
}

collect_modes() { collect_job "$MODES_DIR" modes "$1"; }

modes_finish() {
    finish_bg "$MODES_DIR" collect_modes 400
    modes_said
}

# Our GRPO beside TRL's GRPOTrainer (benchmarks/vs_trl.py, issue 98 item 4): from the demo's hermes
# SFT model, the same minutes each on the one GPU, ours with its vLLM engine and TRL with vLLM colocate
# (`use_vllm=True, vllm_mode="colocate"`), then both final models evaluated on the same questions.
# Where the SFT model is absent, the demo's stages up to it run first (--protocol hermes, its GRPO left
# out). TRL, accelerate and datasets travel as wheels (`vs-trl-pack` here: the image has transformers
# and torch, not these), unpacked onto PYTHONPATH there (a wheel is a zip). In the background, as
# `modes`: `vs-trl` waits until WAIT_S s into its call, `vs-trl-finish` for the rest. A CPU rehearsal:
#   KIT=0 QUICKSTART_ARGS="--demos 8 --sft-minutes 0.5 --eval-limit 4" VSTRL_ARGS="--minutes 0.3 --eval-n 4 --no-start-eval --trl-generation transformers" scripts/gpu_check.sh vs-trl
VSTRL_DIR=${VSTRL_DIR:-runs/gpu_vs_trl}
VSTRL_SFT=${VSTRL_SFT:-artifacts/demo_runs_hermes/sft}
VSTRL_KB=${VSTRL_KB:-artifacts/kb}
VSTRL_INDEX=${VSTRL_INDEX:-artifacts/kb_index_flat}
VSTRL_PACK=${VSTRL_PACK:-.kit/trl.tar.xz}
VSTRL_ARGS=${VSTRL_ARGS:---minutes 3 --eval-n 100 --trl-generation vllm actor_rollout_ref.rollout.enforce_eager=false}

vs_trl_pack() {  # here: TRL and the packages it imports that the image lacks, wheels for its Python
    local tmp pins
    tmp=$(mktemp -d)
    pins=$("$PY" -c "import importlib.metadata as m; print(' '.join(f'{p}=={m.version(p)}' for p in
        ('trl', 'accelerate', 'datasets', 'multiprocess', 'xxhash', 'fsspec')))")
    # shellcheck disable=SC2086
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "${GPU_PYTHON_VERSION:-3.12}" \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$tmp" $pins
    mkdir -p "$(dirname "$VSTRL_PACK")"
    tar -C "$tmp" -cJf "$VSTRL_PACK" .
    rm -rf "$tmp"
    du -h "$VSTRL_PACK"
}

vs_trl_env() {  # PY: the carried wheels unpacked once into .kit/root/trl_site, first on PYTHONPATH
    local site=$PWD/.kit/root/trl_site w
    [ -f "$VSTRL_PACK" ] || return 0
    if [ ! -d "$site" ]; then
        rm -rf "$site.tmp" && mkdir -p "$site.tmp"
        tar -xJf "$VSTRL_PACK" -C "$site.tmp"
        for w in "$site.tmp"/*.whl; do "$1" -m zipfile -e "$w" "$site.tmp/" && rm "$w"; done
        mv "$site.tmp" "$site"
    fi
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
}

vs_trl_job() {  # the demo's hermes stages up to SFT where its model is absent, then the benchmark
    local py=${GPU_PY:-python3}
    if [ ! -e "$VSTRL_SFT" ]; then
        # shellcheck disable=SC2086
        "$py" -m agent_rl.demo --protocol hermes $QUICKSTART_ARGS --rl-minutes 0 || return 1
    fi
    "$py" -c "import trl, accelerate, datasets, transformers, torch; print(f'trl {trl.__version__}, accelerate \
{accelerate.__version__}, datasets {datasets.__version__}, transformers {transformers.__version__}, torch {torch.__version__}')" \
        || return 1
    # shellcheck disable=SC2086
    "$py" benchmarks/vs_trl.py --sft "$VSTRL_SFT" --kb "$VSTRL_KB" --index "$VSTRL_INDEX" --workdir "$VSTRL_DIR" \
        $VSTRL_ARGS
}

vs_trl_start() {
    local out=${OUT:-gpu_out} py=${GPU_PY:-python3}
    mkdir -p "$out" "$VSTRL_DIR"
    kit_ready "$py" || return 1
    vs_trl_env "$py"
    start_bg "$VSTRL_DIR" collect_vs_trl bash "$0" vs-trl-job
    vs_trl_said
}

vs_trl_said() {  # our lines of the job's log: the demo's stages, the sides, the table
    grep -E "^\[demo\]|^\[vs_trl\]|^\[hardware\]|^\| |^TRL |^first-turn|^trl |Error" "$VSTRL_DIR.log" | tail -n 40
}

collect_vs_trl() { collect_job "$VSTRL_DIR" vs_trl "$1"; }

vs_trl_finish() {
    finish_bg "$VSTRL_DIR" collect_vs_trl 400
    vs_trl_said
}

rvs_finish() {
    finish_bg "$RVS_DIR" collect_rvs 200
    grep -E "^\[rl_vs_sft\]|^\| |^GRPO|^Answered|Error" "$RVS_DIR.log" | tail -n 30
}

loop_finish() {
    local out=${OUT:-gpu_out} py=${GPU_PY:-python3}
    mkdir -p "$out"
    kit_env
    STOP=1 wait_demo "$out" "${WAIT_S:-400}"
    grep -E "^\[demo\]|^\$ |^# |^\| |step [0-9]+|Error|error" artifacts/gpu_quickstart.log | tail -n 60
    if [ -f artifacts/gpu_rollout.json ]; then   # measured beside the demo by loop-start
        cp artifacts/gpu_rollout.json "$out/rollout.json"
    else
        rollout_benchmark "$py" "$out" --model artifacts/demo_runs/sft/model --prompt chat
    fi
    # TRAIN_BENCH=0: skip the update / bare forward+backward figure (measured in run 8) when the
    # loan's minutes are better spent on GRPO steps
    if [ "${TRAIN_BENCH:-1}" != 0 ]; then
        timeout 150 "$py" benchmarks/gpu.py --only training --policy artifacts/model --json "$out/train.json" 2>&1 | tail -n 4
    fi
    "$py" benchmarks/gpu_loop.py --runs artifacts/demo_runs --rollout "$out/rollout.json" --train "$out/train.json" \
        --cpu-step-s 74.7 --json "$out/gpu_loop.json"
}

# The figures that need no demo, in one call: the actor update's packings on the worker's device
# (run 10's update ran at ~4,000 tok/s in the demo against 32,757 in benchmarks/gpu.py) and the
# rollout benchmark (interleaved / plain generation; the untrained policy with few-shot prompts).
# KIT=0 runs it with the current environment's packages (a rehearsal on the CPU, with QUICK=1).
probe() {
    local out=${OUT:-gpu_out} py=${GPU_PY:-python3} quick=()
    mkdir -p "$out" artifacts
    [ "${QUICK:-0}" = 1 ] && quick=(--quick)
    kit_ready "$py" || return 1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    [ -f artifacts/model/.complete ] || "$py" -m data_prep model --out artifacts/model 2>&1 | tail -2
    set +e
    # the varlen kernel (one flash call per layer, the CUDA default) against the loop it replaces
    timeout 120 "$py" -m pytest -m gpu tests/gpu/test_training_gpu.py -k varlen_kernel -q -rA -p no:cacheprovider 2>&1 \
        | tail -n 6
    echo "[probe] varlen kernel test: exit ${PIPESTATUS[0]}"
    timeout "${TRAIN_TIMEOUT_S:-200}" "$py" benchmarks/train.py --shared-prefix-only "${quick[@]}" --model artifacts/model \
        --json "$out/train_prefix.json" 2>&1 | tee "$out/train_prefix.log" | grep -v -E "^(INFO|DEBUG|WARNING) " | tail -n 20
    echo "[probe] update packings: exit ${PIPESTATUS[0]}"
    set -e
    rollout_benchmark "$py" "$out" "${quick[@]}" --model artifacts/model
}

case "${1:-run}" in
    prepare) prepare ;;
    prepare-ray) prepare_ray ;;
    prepare-vllm) "$PY" scripts/gpu_kit.py build ;;
    kit) "${GPU_PY:-python3}" scripts/gpu_kit.py unpack ;;
    loop-start) loop_start ;;
    loop-finish) loop_finish ;;
    rl-vs-sft) rvs_start ;;
    rl-vs-sft-finish) rvs_finish ;;
    rl-vs-sft-pack) rvs_pack ;;
    probe) probe ;;
    scale) scale ;;
    modes) modes_start ;;
    modes-job) modes_job ;;
    modes-finish) modes_finish ;;
    vs-trl-pack) vs_trl_pack ;;
    vs-trl) vs_trl_start ;;
    vs-trl-job) vs_trl_job ;;
    vs-trl-finish) vs_trl_finish ;;
    run) run ;;
    *) echo "usage: $0 prepare|prepare-ray|prepare-vllm|kit|loop-start|loop-finish|rl-vs-sft|rl-vs-sft-pack|rl-vs-sft-finish|probe|scale|modes|modes-finish|vs-trl-pack|vs-trl|vs-trl-finish|run" >&2; exit 2 ;;
esac
