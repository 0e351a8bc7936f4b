#!/usr/bin/env bash
# The real-data recipe: the README's commands on ../shared/data.
#   wiki_35k corpus -> flat index -> retriever -> grounded demonstrations from NQ (AmbigQA
#   train), HotpotQA/2Wiki (R1-Searcher train), MuSiQue train and the official-schema
#   MuSiQue / HotpotQA train rows (decompositions, supporting titles), with two-search chains,
#   minus every question that is also in a test set -> a split by id (1 in RL_EVERY kept out of
#   SFT) -> cold-start SFT -> GRPO from the SFT model, on every demonstration's question and
#   1 in RL_HOTPOT_EVERY HotpotQA/2Wiki training questions (groups filtered on EM), for RL_MINUTES (trainer.max_time_s: stops cleanly with a
#   checkpoint) -> evaluation of the
#   base, SFT and SFT+RL models on NQ test and HotpotQA dev samples in agent / rag / direct
#   modes -> one table.
# Every step is skipped when its output exists (RL resumes from its checkpoint with the time
# left), so an interrupted run continues where it stopped.
#   bash scripts/real_data.sh   (EVAL_N=500 questions per set, SFT_MINUTES=50, RL_MINUTES=60,
#                                DEMOS_N=all, RL_REWARD=format: Search-R1 v0.3's format-aware
#                                reward; em: exact match only, EVAL_MODELS="base sft rl")
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
SHARED=${AGENT_RL_SHARED_DATA:-../shared/data}
OUT=${OUT:-artifacts/real}
INDEX=${INDEX:-artifacts/wiki35k_flat}
EVAL_N=${EVAL_N:-500}
DEMOS_N=${DEMOS_N:-}                 # empty: every training question is a candidate
SFT_MINUTES=${SFT_MINUTES:-50}      # one epoch of the 422 demonstrations took 47 min on a 2-core AVX2 host
RL_MINUTES=${RL_MINUTES:-60}
RL_REWARD=${RL_REWARD:-format}
RL_EVERY=${RL_EVERY:-5}                  # 1 demonstration in RL_EVERY (by id hash) is kept out of SFT
RL_HOTPOT_EVERY=${RL_HOTPOT_EVERY:-16}   # RL also draws 1 in 16 HotpotQA/2Wiki training questions (493)
EVAL_MODELS=${EVAL_MODELS:-base sft rl}  # which models to evaluate (the table shows every one evaluated so far)
PORT=${PORT:-8035}
CFG=configs/train/wiki35k_grpo_cpu.yaml
URL=http://127.0.0.1:$PORT
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_CPU_OMP_THREADS_BIND=all
# as the Makefile: Ray's default kill threshold (95% of node memory) is reached on 24 GiB by page cache
export RAY_memory_usage_threshold=${RAY_memory_usage_threshold:-0.99}
[ -f "$SHARED/corpus/wiki_35k.jsonl" ] || { echo "no $SHARED/corpus/wiki_35k.jsonl (set AGENT_RL_SHARED_DATA)" >&2; exit 2; }
mkdir -p "$OUT"
step() { echo; echo "[real] $*"; }

step "QA sets into the system's format"
TRAIN_SETS="nq_train hotpot_train musique_train musique_official hotpot_official"
for spec in "ambigqa/train.jsonl nq_train nq train" "r1searcher_train/train.jsonl hotpot_train hotpotqa_2wiki train" \
            "musique/train.jsonl musique_train musique train" \
            "multihop_train/musique_train_100.json musique_official musique train" \
            "multihop_train/hotpotqa_train_100.json hotpot_official hotpotqa train" \
            "nq/test.jsonl nq_test nq test" "hotpotqa/dev.jsonl hotpotqa_dev hotpotqa dev"; do
  set -- $spec
  [ -f "$OUT/$2.parquet" ] || $PY -m data_prep qa --input "$SHARED/qa/$1" --out "$OUT/$2.parquet" --source "$3" --split "$4"
done

step "train questions that are also test questions: counted, then dropped from training"
for tr in $TRAIN_SETS; do
  [ -f "$OUT/${tr}_clean.parquet" ] && continue
  cp "$OUT/$tr.parquet" "$OUT/${tr}_clean.tmp.parquet"
  for te in nq_test hotpotqa_dev; do
    echo "$tr vs $te:"
    $PY -m data_prep overlap --train "$OUT/${tr}_clean.tmp.parquet" --test "$OUT/$te.parquet" \
      --drop-from-train "$OUT/${tr}_clean.tmp.parquet"
  done
  mv "$OUT/${tr}_clean.tmp.parquet" "$OUT/${tr}_clean.parquet"
done

step "model and dense index of wiki_35k"
$PY -m data_prep model --out artifacts/model
[ -f "$INDEX/meta.json" ] || $PY -m data_prep index --corpus "$SHARED/corpus/wiki_35k.jsonl" --out "$INDEX" --kind flat

step "retriever on $URL"
$PY -m retriever_server --index "$INDEX" --corpus "$SHARED/corpus/wiki_35k.jsonl" --port "$PORT" --log-level warning \
  > "$OUT/retriever.log" 2>&1 &
SERVER=$!
trap 'rc=$?; kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true; exit $rc' EXIT  # keep the run's status
for _ in $(seq 300); do curl -sf "$URL/health" >/dev/null && break; sleep 1; done
curl -sf "$URL/health" >/dev/null || { echo "retriever did not come up: $OUT/retriever.log" >&2; exit 1; }

step "grounded demonstrations"
DEMO_SETS=""
for qa in $TRAIN_SETS; do
  rc=0
  [ -f "$OUT/demos_$qa.parquet" ] || $PY -m data_prep demos --qa "$OUT/${qa}_clean.parquet" --retriever-url "$URL" \
    --out "$OUT/demos_$qa.parquet" --config "$CFG" --model artifacts/model ${DEMOS_N:+--limit "$DEMOS_N"} \
    --dropped "$OUT/demos_$qa.dropped.jsonl" || rc=$?
  # exit status 3: the corpus grounds none of this set's questions; go on without the set
  if [ "$rc" = 3 ]; then echo "[real] $qa: no grounded demonstration, left out of SFT and RL" >&2; continue; fi
  [ "$rc" = 0 ] || exit "$rc"
  DEMO_SETS="$DEMO_SETS $qa"
done
[ -n "$DEMO_SETS" ] || { echo "no training set gave a grounded demonstration: nothing to train on" >&2; exit 1; }

step "demonstrations split by id: 1 in $RL_EVERY kept out of SFT"
# RL draws from every demonstration's question (the corpus can answer it); the config drops
# groups whose samples agree on EM (algorithm.filter_groups, filter_metric: acc), so a question
# SFT has fitted costs a rollout, not an update
SFT_FILES="" RL_FILES=""
for qa in $DEMO_SETS; do
  [ -f "$OUT/split/rl_$qa.parquet" ] || $PY -m data_prep split "$OUT/demos_$qa.parquet" --every "$RL_EVERY" \
    --out-rest "$OUT/split/sft_$qa.parquet" --out-held "$OUT/split/rl_$qa.parquet"
  SFT_FILES="$SFT_FILES,$OUT/split/sft_$qa.parquet"
  RL_FILES="$RL_FILES,$OUT/demos_$qa.parquet"
done
# RL also draws 1 in RL_HOTPOT_EVERY HotpotQA/2Wiki training questions, demonstration or not:
# their comparison ("A or B?") and yes/no questions (18%) are answerable from the question
# itself, which no grounded demonstration teaches (docs/results/real_data_wiki35k_fp32: the HotpotQA gain)
[ -f "$OUT/split/rl_hotpot_train_questions.parquet" ] || $PY -m data_prep split "$OUT/hotpot_train_clean.parquet" \
  --every "$RL_HOTPOT_EVERY" --out-rest "$OUT/split/hotpot_train_rest.parquet" \
  --out-held "$OUT/split/rl_hotpot_train_questions.parquet"
RL_FILES="$RL_FILES,$OUT/split/rl_hotpot_train_questions.parquet"

step "cold-start SFT ($SFT_MINUTES min budget)"
RUN=$(basename "$OUT")
SFT=runs/sft/$RUN
# resumes: a killed run continues from its last checkpoint, a finished one does nothing, and
# a larger SFT_MINUTES continues a finished run from the checkpoint saved when it stopped
$PY -m agent_rl.coldstart.cli sft --config configs/sft/wiki35k_cpu.yaml \
  "data.train_files=[${SFT_FILES#,}]" "trainer.total_training_steps=0" \
  "trainer.max_time_s=$((SFT_MINUTES * 60))" "trainer.default_local_dir=$SFT"

step "GRPO from the SFT model ($RL_MINUTES min budget, reward: $RL_REWARD) on the demonstrations' questions and HotpotQA's"
# groups whose samples agree on EM (most questions without a demonstration) cost a rollout,
# not an update (algorithm.filter_groups, filter_metric: acc)
RL=runs/rl/$RUN
REWARD_ARGS=""
[ "$RL_REWARD" = format ] && REWARD_ARGS="reward.structure_format_score=0.2 reward.final_format_score=0.1 reward.retrieval_score=0.1"
$PY -m agent_rl.training.cli --config "$CFG" "actor_rollout_ref.model.path=$SFT/model" \
  "data.train_files=[${RL_FILES#,}]" "retriever.url=[$URL/retrieve]" $REWARD_ARGS \
  "trainer.total_training_steps=100000" "trainer.max_time_s=$((RL_MINUTES * 60))" "trainer.save_freq=10" \
  "trainer.default_local_dir=$RL"

step "evaluation: $EVAL_N questions of NQ test and HotpotQA dev, agent / rag / direct"
for pair in "base artifacts/model" "sft $SFT" "rl $RL"; do
  set -- $pair
  case " $EVAL_MODELS " in *" $1 "*) ;; *) continue ;; esac
  $PY -m agent_rl.evaluation.cli eval --model "$2" --config "$CFG" --retriever-url "$URL" \
    --data "$OUT/nq_test.parquet" "$OUT/hotpotqa_dev.parquet" --mode agent rag direct --limit "$EVAL_N" \
    --out "runs/eval/${RUN}_$1" --no-progress
done
ROWS=""
for pair in "base base" "sft SFT" "rl SFT+RL"; do
  set -- $pair
  [ -f "runs/eval/${RUN}_$1/summary.json" ] && ROWS="$ROWS $2=runs/eval/${RUN}_$1"
done
{ for src in nq hotpotqa; do $PY -m agent_rl.evaluation.cli report $ROWS --source "$src"; done; } | tee "$OUT/report.md"
