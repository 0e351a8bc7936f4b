"""`agent-rl-eval` (parsed in `agent_rl.evaluation.cli`): greedy evaluation of a model on
held-out QA in three modes, resumable.

    agent-rl-eval --model artifacts/model --retriever-url http://127.0.0.1:8000 \\
        --data artifacts/kb/test.parquet --mode agent rag direct --out runs/eval/base --limit 100

Modes (Search-R1's baselines, same model): `agent` (the model may search, up to `max_turns`),
`rag` (the top-k passages for the question are retrieved once and put in the prompt as a
search's observation holds them: neutralised, at most `data.max_obs_length` tokens; one
answer), `direct` (no retrieval). Every question runs through the training rollout manager
(`RolloutManager.rollout(..., greedy=True, mode=...)`: same templates, tokenization, turn
loop and observation formatting) and is scored with the training reward functions
(`agent_rl.rollout.reward`: EM, SubEM, F1 of the last `<answer>`, response only).

Writes into --out:
- `predictions.jsonl`: one record per (mode, data_source, question id), appended and flushed
  as soon as the question finishes: question, gold answers, prediction, em / subem / f1,
  reward, format flags, turns, searches, the prompt and the full trajectory text;
- `eval_config.json`: what produced the records (`eval_settings`: the model and tokenizer by
  content, protocol, tools, template, greedy sampling, turn and length limits, topk, dtype,
  reward); a rerun with other settings refuses to mix results;
- `summary.json` / `summary.md` (`agent_rl.evaluation.report`): per mode, overall and per data_source,
  EM with a Wilson 95% interval, SubEM, F1, mean searches and turns, invalid-format rate.

Resume: rerun the same command. Finished records are kept (a partial last line from a kill
mid-write is dropped), only missing questions run, and the summary covers all of them. A
record is reused only for the question it answered: one whose question text or gold answers
differ from the data's (a knowledge base generated again reuses its ids) is refused in one line
(`check_records`), as are other settings, never mixed.
Greedy decoding is deterministic per request, but batched kernels (bf16 especially) are not
batch-invariant, so a rerun from scratch can differ on a few questions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agent_rl.config import TrainConfig, to_dict
from agent_rl.evaluation.report import MODES, summarize, write_summary
from agent_rl.rollout.reward import DEFAULT_NORMALIZE, em, f1, is_valid_format, score_trajectory, subem
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
    norm = getattr(reward_cfg, "normalize", DEFAULT_NORMALIZE)  # the columns normalise as the reward does
    return {
        "key": record_key(mode, prompt.data_source, prompt.id),
        "id": prompt.id,
        "mode": mode,
        "data_source": prompt.data_source,
        "question": prompt.question,
        "golden_answers": golds,
        "prediction": pred,
        "em": em(pred, golds, norm) if pred is not None else 0.0,
        "subem": subem(pred, golds, norm) if pred is not None else 0.0,
        "f1": f1(pred, golds, norm) if pred is not None else 0.0,
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


def eval_settings(cfg: TrainConfig, model_dir: Path, dtype: str) -> dict:
    """Everything that changes a record: records made with other settings must not be mixed.
    The model and tokenizer are known by content as a training resume knows them
    (`training.identity`): retraining into the same directory changes them. Sampling is greedy
    whatever the config's temperature; the protocol sets the stop strings."""
    from agent_rl.training.identity import model_fingerprint, tokenizer_fingerprint

    r = cfg.actor_rollout_ref.rollout
    return {
        "model": str(model_dir),
        "model_fingerprint": model_fingerprint(model_dir),
        "tokenizer_fingerprint": tokenizer_fingerprint(model_dir),
        "dtype": dtype,
        "protocol": r.protocol,
        "tool_chat_template": r.tool_chat_template,
        "tools": [{"name": t.name, "mcp_command": t.mcp_command, "mcp_url": t.mcp_url, "include": t.include}
                  for t in r.tools],
        "chat_template": r.chat_template,
        "sampling": "greedy",
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
    if has_records and not overwrite and not path.is_file():
        raise EvalInputError(f"--out {out_dir} holds results but no {EVAL_CONFIG}: their settings are unknown; "
                             "use another --out, or --overwrite to discard them")
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


def check_records(out_dir: Path, done: dict[str, dict], prompts: Sequence[Prompt]) -> None:
    """Refuse, in one line, records of `done` made for another question under one of these
    prompts' (data_source, id), in any mode (the summary covers them all): ids are positions
    (`kb_test_N` in every generated KB, FlashRAG's `test_0`), so only the question text and
    the gold answers tell a record's question from this one."""
    want = {(p.data_source, p.id): (p.question, list(p.golden_answers)) for p in prompts}
    bad = []
    for rec in done.values():
        key = (rec.get("data_source"), rec.get("id"))
        if key in want and (rec.get("question"), rec.get("golden_answers")) != want[key]:
            bad.append(rec)
    if bad:
        rec = bad[0]
        q, golds = want[(rec["data_source"], rec["id"])]
        what = (f"question {rec.get('question')!r} -> {q!r}" if rec.get("question") != q
                else f"golden_answers {rec.get('golden_answers')!r} -> {golds!r}")
        more = f" (and {len(bad) - 1} more record(s))" if len(bad) > 1 else ""
        raise EvalInputError(
            f"--out {out_dir} holds a {rec.get('mode')} record of {rec['data_source']}/{rec['id']} for another "
            f"question ({what}){more}; use another --out, or --overwrite to discard them"
        )


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


def retriever_client(cfg: TrainConfig) -> Any:
    """The search client `cfg.retriever` describes (its URLs as base URLs)."""
    from agent_rl.rollout.retrieval_client import RetrieverClient

    return RetrieverClient.from_config(cfg.retriever, [base_url(u) for u in cfg.retriever.url])


async def close_owned(manager: Any, client: Any, engine: Any) -> None:
    """Close what a call made for itself (None: not made here): the rollout manager, then the
    search client and the engine it started."""
    if manager is not None:
        await manager.aclose()
    if client is not None:
        await client.aclose()
    if engine is not None:
        await engine.shutdown()


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
        check_records(out, done, prompts)
        missing = sum(not finished(done, record_key(m, p.data_source, p.id)) for m in modes for p in prompts)
        if engine is None and missing:  # a finished evaluation only rewrites its summary
            from agent_rl.rollout.engine import RolloutEngine

            engine = own_engine = await RolloutEngine.create(str(model_dir), cfg.actor_rollout_ref.rollout, max_model_len)
        if retriever is None and missing and any(m in NEEDS_RETRIEVER for m in modes):
            retriever = own_client = retriever_client(cfg)
        manager = RolloutManager(engine, retriever, cfg) if missing else None
        for mode in modes:
            result.reused[mode] = sum(finished(done, record_key(mode, p.data_source, p.id)) for p in prompts)
            result.computed[mode] = 0 if manager is None else await evaluate_mode(
                manager, prompts, mode, done, sink, cfg.reward, cfg.actor_rollout_ref.rollout.max_concurrent_trajectories, progress
            )
    finally:
        sink.close()
        await close_owned(manager, own_client, own_engine)
    # The summary covers this run's questions in every mode the directory holds for them.
    wanted = {(p.data_source, p.id) for p in prompts}
    records = [r for r in done.values() if (r["data_source"], r["id"]) in wanted]
    result.summary = summarize(records)
    write_summary(result.summary, out, title=f"Evaluation of {model_dir}")
    return result


# ----------------------------------------------------------------------------- explore
def question_kinds(files: Sequence[str], column: str) -> dict[str, str]:
    """{question text: its `column` value} over the QA files that have the column (the generated
    KB's `kind`); {} where none has it (real data): the pre-flight then reads no kinds."""
    from data_prep.qa import read_qa

    out: dict[str, str] = {}
    for f in files:
        df = read_qa(f, Report())
        if column in df.columns:
            out.update({str(q): str(k) for q, k in zip(df["question"], df[column]) if k is not None and str(k)})
    return out


async def sample_groups(cfg: TrainConfig, prompts: Sequence[Prompt], n: int, *, engine: Any = None,
                        retriever: Any = None, max_model_len: int = 4096) -> list[list[Any]]:
    """n sampled agent trajectories per prompt from `cfg.actor_rollout_ref.model.path` at the
    config's temperature and protocol, through the training rollout manager, scored with the
    training reward: the groups a training step of that start would see (`agent-rl-eval explore`).
    `engine` / `retriever`: as run_evaluation's."""
    from agent_rl.rollout.engine import RolloutEngine
    from agent_rl.rollout.manager import RolloutManager
    from agent_rl.training.groups import group_trajectories, score_trajectories

    own_engine = own_client = manager = None
    try:
        if engine is None:
            model_dir = resolve_model_dir(cfg.actor_rollout_ref.model.path)
            engine = own_engine = await RolloutEngine.create(str(model_dir), cfg.actor_rollout_ref.rollout, max_model_len)
        if retriever is None:
            retriever = own_client = retriever_client(cfg)
        manager = RolloutManager(engine, retriever, cfg)
        trajs, _ = await manager.rollout(list(prompts), n=n, greedy=False, mode="agent")
    finally:
        await close_owned(manager, own_client, own_engine)
    failed = sum(tr.num_tool_failures > 0 for tr in trajs)
    if failed:  # kept: the trainer keeps them too unless retriever.skip_failed_searches
        log.warning("explore: %d of %d trajectories saw a failed search (scored as they ended)", failed, len(trajs))
    score_trajectories(trajs, list(prompts), cfg.reward)
    return group_trajectories(trajs)
