"""`agent-rl-eval`: greedy evaluation of a model on held-out QA in three modes, resumable.

    agent-rl-eval --model artifacts/model --retriever-url http://127.0.0.1:8000 \\
        --data artifacts/kb/test.parquet --mode agent rag direct --out runs/eval/base --limit 100

Modes (Search-R1's baselines, same model): `agent` (the model may search, up to `max_turns`),
`rag` (the top-k passages for the question are retrieved once and put in the prompt, one
answer), `direct` (no retrieval). Every question runs through the training rollout manager
(`RolloutManager.rollout(..., greedy=True, mode=...)`: same templates, tokenization, turn
loop and observation formatting) and is scored with the training reward functions
(`agent_rl.rollout.reward`: EM, SubEM, F1 of the last `<answer>`, response only).

Writes into --out:
- `predictions.jsonl`: one record per (mode, data_source, question id), appended and flushed
  as soon as the question finishes: question, gold answers, prediction, em / subem / f1,
  reward, format flags, turns, searches, the prompt and the full trajectory text;
- `eval_config.json`: what produced the records (model weights identity, turn and length
  limits, topk, dtype, template, reward); a rerun with other settings refuses to mix results;
- `summary.json` / `summary.md` (`agent_rl.evaluation.report`): per mode, overall and per data_source,
  EM with a Wilson 95% interval, SubEM, F1, mean searches and turns, invalid-format rate.

Resume: rerun the same command. Finished records are kept (a partial last line from a kill
mid-write is dropped), only missing questions run, and the summary covers all of them.
Greedy decoding is deterministic per request, but batched kernels (bf16 especially) are not
batch-invariant, so a rerun from scratch can differ on a few questions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agent_rl.config import TrainConfig, load_config, to_dict
from agent_rl.evaluation.report import MODES, summarize, summary_markdown, write_summary
from agent_rl.rollout.reward import score_trajectory
from agent_rl.rollout.reward import em, f1, is_valid_format, subem
from agent_rl.training.data import Prompt, load_prompts
from data_prep.atomic import atomic_write
from data_prep.io import DataPrepError, Report

log = logging.getLogger(__name__)

PREDICTIONS = "predictions.jsonl"
EVAL_CONFIG = "eval_config.json"
NEEDS_RETRIEVER = ("agent", "rag")
_SPLIT_NAMES = {"train", "dev", "test", "val", "validation"}


class EvalInputError(Exception):
    """Bad input (paths, URLs, settings): reported in one line, exit code 2, no traceback."""


# ----------------------------------------------------------------------------- inputs
def resolve_model_dir(path: str | os.PathLike) -> Path:
    """An HF model directory from `path`: the directory itself (config.json + *.safetensors),
    an SFT run directory (its final `model/`), an RL run directory (its newest complete
    checkpoint's `actor/`, verified as a resume would), or a run checkpoint `global_step_K/`
    (its `actor/`)."""
    p = Path(path)
    if not p.exists():
        raise EvalInputError(f"--model {path}: no such directory")
    if not (p / "config.json").is_file() and (p / "model" / "config.json").is_file():
        p = p / "model"
    elif (p / "checkpoints").is_dir():
        from agent_rl.training.checkpoint import CheckpointManager

        latest = CheckpointManager(p / "checkpoints").latest()  # verified, unlike the `latest` pointer
        if latest is None:
            raise EvalInputError(f"--model {path}: no complete checkpoint in {p / 'checkpoints'}")
        p = latest
    if (p / "actor" / "config.json").is_file():
        p = p / "actor"
    if not (p / "config.json").is_file():
        raise EvalInputError(f"--model {path}: not an HF model directory (no config.json), nor a run or checkpoint directory")
    if not any(p.glob("*.safetensors")):
        raise EvalInputError(f"--model {path}: no *.safetensors weights in {p}")
    return p.resolve()


def load_questions(files: Sequence[str], limit: int | None = None, seed: int = 0) -> list[Prompt]:
    """Questions of every file; `limit`: a seeded random sample of that many per file (kept
    in file order, the same sample for the same seed, so models are compared on the same
    questions). A repeated (data_source, id) keeps its first occurrence. A malformed row is
    logged with its line and left out (the same rows on every run, so a rerun resumes)."""
    if limit is not None and limit < 1:
        raise EvalInputError(f"--limit must be >= 1, got {limit}")
    out: list[Prompt] = []
    seen: set[tuple[str, str]] = set()
    for f in files:
        if not Path(f).is_file():
            raise EvalInputError(f"--data {f}: no such file")
        report = Report()
        try:
            prompts = load_prompts([f], report=report)
        except (OSError, ValueError, DataPrepError) as e:  # read_qa names the file and the bad rows
            raise EvalInputError(str(e) if str(f) in str(e) else f"--data {f}: {e}") from None
        if report.problems:
            log.warning("%s: skipped %d malformed question(s) of %d:\n  %s%s", f, report.skipped, report.read,
                        "\n  ".join(report.problems[:20]), "\n  ..." if len(report.problems) > 20 else "")
        if limit is not None and limit < len(prompts):
            keep = sorted(random.Random(seed).sample(range(len(prompts)), limit))
            prompts = [prompts[i] for i in keep]
        # FlashRAG's layout is <dataset>/<split>.jsonl without a data_source field, and read_qa
        # then names the source after the file ("test"): name it after the dataset ("nq").
        stem, parent = Path(f).stem, Path(f).resolve().parent.name
        if stem.lower() in _SPLIT_NAMES and parent:
            prompts = [replace(p, data_source=parent) if p.data_source == stem else p for p in prompts]
        dups = 0
        for p in prompts:
            k = (p.data_source, p.id)
            if k in seen:
                dups += 1
                continue
            seen.add(k)
            out.append(p)
        if dups:
            log.warning("%s: %d question(s) repeat an earlier (data_source, id); kept the first", f, dups)
    return out


def base_url(url: str) -> str:
    """Server base URL from either form in use: `http://h:p` or Search-R1's `http://h:p/retrieve`
    (the client appends /retrieve itself)."""
    from agent_rl.rollout.retrieval_client import server_base_url

    try:
        return server_base_url(url)
    except ValueError as e:
        raise EvalInputError(f"--retriever-url: {e}") from None


async def check_retriever(rcfg: Any, wait_s: float) -> None:
    """Fail fast (before the engine loads) when no retriever answers /health or it refuses the key."""
    from agent_rl.rollout.retrieval_client import (ApiKeyFileError, RetrieverAuthError, RetrieverClient,
                                                   RetrieverUnavailable)

    urls = list(rcfg.url)
    try:
        client = RetrieverClient.from_config(rcfg, timeout=5.0, connect_timeout=2.0, max_retries=0)
    except ApiKeyFileError as e:
        raise EvalInputError(str(e)) from None
    try:
        await client.wait_healthy(timeout=wait_s, interval=0.5)
    except RetrieverUnavailable as e:
        raise EvalInputError(f"--retriever-url {', '.join(urls)}: unreachable ({e}); start it with agent-rl-retriever") from None
    except RetrieverAuthError as e:
        raise EvalInputError(str(e)) from None
    finally:
        await client.aclose()


# ----------------------------------------------------------------------------- records
def record_key(mode: str, data_source: str, qid: str) -> str:
    """Resume key: ids repeat across datasets (FlashRAG's `test_0` is in NQ and HotpotQA alike)."""
    return json.dumps([mode, data_source, qid])


def finished(done: dict[str, dict], key: str) -> bool:
    """A question needs no re-run: it has a record, and no retrieval failed in it (a failed
    retrieval is the service's fault, not the model's: a resume tries it again)."""
    rec = done.get(key)
    return rec is not None and not rec.get("tool_failures")


def valid_format(response_text: str, mode: str) -> bool:
    """Agent: Search-R1's structure rule (`reward.is_valid_format`) on the protocol's reward
    view of the response. rag / direct prompts do not ask for `<think>`, so there the same rule
    applies with the think block optional."""
    if is_valid_format(response_text):
        return True
    return mode != "agent" and is_valid_format("<think></think>" + response_text)


def make_record(traj: Any, prompt: Prompt, mode: str, reward_cfg: Any, prompt_text: str, seconds: float) -> dict:
    """One jsonl record: scores from the training reward functions, plus what produced them."""
    text = traj.response_text
    golds = list(prompt.golden_answers)
    res = score_trajectory(traj, golds, reward_cfg)  # the training reward, as training computes it
    view = traj.reward_text if traj.reward_text is not None else text
    pred = res.answer
    return {
        "key": record_key(mode, prompt.data_source, prompt.id),
        "id": prompt.id,
        "mode": mode,
        "data_source": prompt.data_source,
        "question": prompt.question,
        "golden_answers": golds,
        "prediction": pred,
        "em": em(pred, golds) if pred is not None else 0.0,
        "subem": subem(pred, golds) if pred is not None else 0.0,
        "f1": f1(pred, golds) if pred is not None else 0.0,
        "reward": res.score,
        "valid_format": valid_format(view, mode),
        "retrieval_hit": res.retrieval_hit,
        "turns": traj.num_turns,
        "searches": traj.num_searches,
        "invalid_actions": traj.num_invalid,
        "tool_failures": traj.num_tool_failures,
        "finish_reason": traj.finish_reason,
        "prompt_tokens": len(traj.prompt_ids),
        "response_tokens": len(traj.response_ids),
        "seconds": round(seconds, 3),
        "prompt": prompt_text,
        "trajectory": text,
    }


class PredictionsFile:
    """Append-only jsonl of records, one flush per record, exclusive to one process.

    `open()` returns the finished records by key. A last line without its newline (the
    process died mid-write) is cut off before appending; an unreadable line elsewhere is
    an error naming it (it cannot come from an interruption)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fh = None

    def open(self) -> dict[str, dict]:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+b")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise EvalInputError(f"{self.path}: another evaluation is writing to it") from None
        fh.seek(0)
        data = fh.read()
        done: dict[str, dict] = {}
        good_end = 0
        lines = data.split(b"\n")
        for i, line in enumerate(lines):
            last = i == len(lines) - 1
            if last:  # after the final newline: empty, or a partial record
                if line.strip():
                    log.warning("%s: dropping a partial last line (%d bytes) from an interrupted run", self.path, len(line))
                break
            if line.strip():
                try:
                    rec = json.loads(line)
                    done[rec["key"]] = rec
                except (ValueError, KeyError, TypeError):
                    fh.close()
                    raise EvalInputError(f"{self.path}:{i + 1}: unreadable record; delete that line (or the file) and rerun") from None
            good_end += len(line) + 1
        if good_end < len(data):
            fh.truncate(good_end)
        fh.seek(0, os.SEEK_END)
        self._fh = fh
        return done

    def clear(self) -> None:
        """Discard every record (--overwrite)."""
        self._fh.seek(0)
        self._fh.truncate(0)

    def append(self, record: dict) -> None:
        self._fh.write((json.dumps(record, ensure_ascii=False) + "\n").encode())
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()  # releases the lock
            self._fh = None


def _weights_identity(model_dir: Path) -> list:
    """Names, sizes and mtimes of the weight files: retraining into the same directory changes them."""
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(model_dir.glob("*.safetensors"))]


def eval_settings(cfg: TrainConfig, model_dir: Path, dtype: str) -> dict:
    """Everything that changes a record: records made with other settings must not be mixed."""
    r = cfg.actor_rollout_ref.rollout
    return {
        "model": str(model_dir),
        "weights": _weights_identity(model_dir),
        "dtype": dtype,
        "chat_template": r.chat_template,
        "max_turns": cfg.max_turns,
        "topk": cfg.retriever.topk,
        "max_tokens_per_turn": r.max_tokens_per_turn,
        "max_response_length": cfg.data.max_response_length,
        "max_obs_length": cfg.data.max_obs_length,
        "reward": to_dict(cfg.reward),
    }


def check_settings(out_dir: Path, settings: dict, has_records: bool, overwrite: bool) -> None:
    """Write eval_config.json, or refuse when the directory holds records made with other
    settings (unless `overwrite`: the caller then discards them)."""
    path = out_dir / EVAL_CONFIG
    if path.is_file() and has_records and not overwrite:
        old = json.loads(path.read_text())
        diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        if diff:
            shown = "; ".join(f"{k}: {old.get(k)!r} -> {settings.get(k)!r}" for k in diff[:4])
            raise EvalInputError(
                f"--out {out_dir} holds results made with other settings ({shown}); "
                "use another --out, or --overwrite to discard them"
            )
    with atomic_write(path) as f:
        f.write(json.dumps(settings, indent=1) + "\n")


# ----------------------------------------------------------------------------- running
@dataclass
class EvalResult:
    """What one `run_evaluation` call did."""

    out_dir: Path
    summary: dict
    computed: dict[str, int] = field(default_factory=dict)
    """Questions run now, per mode."""
    reused: dict[str, int] = field(default_factory=dict)
    """Questions taken from an earlier (interrupted) run, per mode."""


async def evaluate_mode(manager: Any, prompts: Sequence[Prompt], mode: str, done: dict[str, dict],
                        sink: PredictionsFile, reward_cfg: Any, concurrency: int, progress: bool = True) -> int:
    """Run the questions of `prompts` missing from `done` in `mode`; each record is appended
    (and added to `done`) as soon as its question finishes. Returns the number run."""
    from tqdm import tqdm

    todo = [p for p in prompts if not finished(done, record_key(mode, p.data_source, p.id))]
    mine = [done[k] for k in (record_key(mode, p.data_source, p.id) for p in prompts) if finished(done, k)]
    retry = sum(record_key(mode, p.data_source, p.id) in done for p in todo)
    if retry:
        log.warning("%s: re-running %d question(s) whose retrieval failed in an earlier run", mode, retry)
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(p: Prompt) -> dict:
        async with sem:
            t0 = time.perf_counter()
            # One question per call: the engine batches across concurrent calls, and each
            # record can be flushed the moment its question ends.
            trajs, metrics = await manager.rollout([p], n=1, greedy=True, mode=mode)
            tr = trajs[0]
            text = manager.tokenizer.decode(tr.prompt_ids, skip_special_tokens=False)
            rec = make_record(tr, p, mode, reward_cfg, text, time.perf_counter() - t0)
            # a failed rag retrieval is counted in the metrics only (the trajectory holds the
            # searches it made itself); one question per call, so the metric is this record's
            rec["tool_failures"] = int(metrics.get("rollout/tool_failures", rec["tool_failures"]))
            return rec

    bar = tqdm(total=len(prompts), initial=len(prompts) - len(todo), desc=f"eval {mode}", unit="q",
               dynamic_ncols=True, disable=not progress)
    tasks = [asyncio.ensure_future(one(p)) for p in todo]
    try:
        for fut in asyncio.as_completed(tasks):
            rec = await fut
            sink.append(rec)
            done[rec["key"]] = rec
            mine.append(rec)
            bar.update(1)
            bar.set_postfix(em=f"{sum(r['em'] for r in mine) / len(mine):.3f}", refresh=False)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        bar.close()
    return len(todo)


async def run_evaluation(cfg: TrainConfig, prompts: Sequence[Prompt], modes: Sequence[str], out_dir: str | os.PathLike,
                         *, engine: Any = None, retriever: Any = None, overwrite: bool = False,
                         progress: bool = True, max_model_len: int = 4096) -> EvalResult:
    """Evaluate `cfg.actor_rollout_ref.model.path` on `prompts` in each mode into `out_dir`.

    `engine` / `retriever`: reuse a running `RolloutEngine` / search client (tests, the
    learning benchmark); created from `cfg` otherwise (and shut down at the end)."""
    from agent_rl.rollout.engine import engine_dtype
    from agent_rl.rollout.manager import RolloutManager

    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise EvalInputError(f"--mode must be among {MODES}, got {list(modes)}")
    if not prompts:
        raise EvalInputError("no questions to evaluate")
    out = Path(out_dir)
    model_dir = resolve_model_dir(engine.model_path if engine is not None else cfg.actor_rollout_ref.model.path)
    dtype = engine.cfg.dtype if engine is not None else engine_dtype(cfg.actor_rollout_ref.rollout.dtype)[0]
    sink = PredictionsFile(out / PREDICTIONS)
    done = sink.open()  # takes the directory's lock before anything in it changes
    own_engine = own_client = manager = None
    result = EvalResult(out_dir=out, summary={})
    try:
        check_settings(out, eval_settings(cfg, model_dir, dtype), bool(done), overwrite)
        if overwrite:
            sink.clear()
            done = {}
        missing = sum(not finished(done, record_key(m, p.data_source, p.id)) for m in modes for p in prompts)
        if engine is None and missing:  # a finished evaluation only rewrites its summary
            from agent_rl.rollout.engine import RolloutEngine

            engine = own_engine = await RolloutEngine.create(str(model_dir), cfg.actor_rollout_ref.rollout, max_model_len)
        if retriever is None and missing and any(m in NEEDS_RETRIEVER for m in modes):
            from agent_rl.rollout.retrieval_client import RetrieverClient

            retriever = own_client = RetrieverClient.from_config(cfg.retriever, [base_url(u) for u in cfg.retriever.url])
        manager = RolloutManager(engine, retriever, cfg) if missing else None
        for mode in modes:
            result.reused[mode] = sum(finished(done, record_key(mode, p.data_source, p.id)) for p in prompts)
            result.computed[mode] = 0 if manager is None else await evaluate_mode(
                manager, prompts, mode, done, sink, cfg.reward, cfg.actor_rollout_ref.rollout.max_concurrent_trajectories, progress
            )
    finally:
        sink.close()
        if manager is not None:
            await manager.aclose()
        if own_client is not None:
            await own_client.aclose()
        if own_engine is not None:
            await own_engine.shutdown()
    # The summary covers this run's questions in every mode the directory holds for them.
    wanted = {(p.data_source, p.id) for p in prompts}
    records = [r for r in done.values() if (r["data_source"], r["id"]) in wanted]
    result.summary = summarize(records)
    write_summary(result.summary, out, title=f"Evaluation of {model_dir}")
    return result


# ----------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="agent-rl-eval", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Other settings: --config a training YAML (lengths, template, reward) and/or dotted overrides, "
               "e.g. data.max_response_length=512 actor_rollout_ref.rollout.max_tokens_per_turn=64 "
               "(put them before the options, or after `--`).",
    )
    ap.add_argument("--model", required=True, help="HF model dir, run checkpoint dir, or run dir (its latest checkpoint)")
    ap.add_argument("--retriever-url", nargs="+", default=None,
                    help="retriever base URL(s) (http://host:port, /retrieve optional); needed for agent and rag")
    ap.add_argument("--data", nargs="+", default=None, help="QA files (parquet/jsonl); default: the config's data.val_files")
    ap.add_argument("--mode", nargs="+", default=["agent"], choices=MODES, help="one or more of agent rag direct (default agent)")
    ap.add_argument("--out", default=None, help="output directory (default runs/eval/<model name>)")
    ap.add_argument("--limit", type=int, default=None, help="a seeded random sample of N questions per data file")
    ap.add_argument("--seed", type=int, default=0, help="seed of the --limit sample and of the engine (default 0)")
    ap.add_argument("--max-turns", type=int, default=None, help="turns with search in agent mode (default: config max_turns)")
    ap.add_argument("--topk", type=int, default=None, help="passages per search / rag prompt (default: config retriever.topk)")
    ap.add_argument("--dtype", default=None, choices=("auto", "bfloat16", "float32", "float16"),
                    help="engine dtype (default: config; auto: bfloat16 where native, else float32)")
    ap.add_argument("--config", default=None, help="training YAML to take lengths, template and reward settings from")
    ap.add_argument("--concurrency", type=int, default=None, help="questions in flight (default: rollout.max_concurrent_trajectories)")
    ap.add_argument("--max-model-len", type=int, default=4096, help="engine context length (default 4096)")
    ap.add_argument("--retriever-api-key-file", default=None, metavar="FILE",
                    help="file holding the retriever's API key (default: retriever.api_key_file, else env RETRIEVER_API_KEY)")
    ap.add_argument("--retriever-wait", type=float, default=30.0, help="seconds to wait for the retriever's /health (default 30)")
    ap.add_argument("--overwrite", action="store_true", help="discard earlier results in --out instead of resuming")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides (veRL names)")
    return ap


def _default_out(model: str) -> str:
    p = Path(model).resolve()
    name = f"{p.parent.name}_{p.name}" if p.name == "actor" else p.name
    return str(Path("runs") / "eval" / name)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The training config the rollout manager needs: YAML, then dotted overrides, then flags."""
    over = list(args.overrides)
    over.append(f"actor_rollout_ref.model.path={args.model}")
    if args.retriever_url:
        over.append("retriever.url=[" + ",".join(base_url(u) for u in args.retriever_url) + "]")
    for flag, key in ((args.max_turns, "max_turns"), (args.topk, "retriever.topk"),
                      (args.retriever_api_key_file, "retriever.api_key_file"),
                      (args.dtype, "actor_rollout_ref.rollout.dtype"),
                      (args.concurrency, "actor_rollout_ref.rollout.max_concurrent_trajectories")):
        if flag is not None:
            over.append(f"{key}={flag}")
    over.append(f"actor_rollout_ref.rollout.seed={args.seed}")
    try:
        cfg = load_config(TrainConfig, args.config, over)
    except (OSError, ValueError) as e:
        raise EvalInputError(str(e)) from None
    return cfg  # --max-turns, --topk, --concurrency out of range: refused by load_config, naming the key


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from data_prep.hardware import offline_env

    offline_env(engine=True)  # evaluation runs a vLLM engine here
    logging.basicConfig(level=logging.WARNING, format="[eval] %(levelname)s %(name)s: %(message)s")
    modes = list(dict.fromkeys(args.mode))
    try:
        resolve_model_dir(args.model)
        cfg = config_from_args(args)
        from agent_rl.precision import announce_run

        announce_run(cfg)
        prompts = load_questions(args.data or cfg.data.val_files, args.limit, args.seed)
        if any(m in NEEDS_RETRIEVER for m in modes):
            if not args.retriever_url:
                raise EvalInputError(f"--retriever-url is required for mode(s) {[m for m in modes if m in NEEDS_RETRIEVER]}")
            asyncio.run(check_retriever(cfg.retriever, args.retriever_wait))
        out = args.out or _default_out(args.model)
        print(f"[eval] {len(prompts)} questions x modes {modes} -> {out}", flush=True)
        result = asyncio.run(run_evaluation(cfg, prompts, modes, out, overwrite=args.overwrite,
                                            progress=not args.no_progress, max_model_len=args.max_model_len))
    except EvalInputError as e:
        print(f"agent-rl-eval: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\n[eval] interrupted: finished questions are saved; rerun the same command to resume", file=sys.stderr)
        return 130
    print(f"[eval] ran {sum(result.computed.values())}, reused {sum(result.reused.values())} -> {out}")
    for mode, block in result.summary["modes"].items():
        if block["all"]["failed_retrieval"]:
            print(f"[eval] WARNING: {block['all']['failed_retrieval']} {mode} question(s) saw a failed retrieval "
                  "(an error text instead of passages); rerun the same command to retry them", file=sys.stderr)
    print(summary_markdown(result.summary), end="")
    return 0


if __name__ == "__main__":  # vLLM may start worker processes with spawn: guard the entry point
    sys.exit(main())
