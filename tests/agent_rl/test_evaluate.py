"""agent-rl-eval: records scored with the training reward, resume without recomputation, the
three modes through the real rollout manager on a real vLLM engine and a real retriever
server (flat dense index over a small generated knowledge base), and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_rl.config import TrainConfig, load_config
from agent_rl.evaluation import cli
from agent_rl.evaluation import evaluate as ev
from agent_rl.rollout.protocol import FEEDBACK_INVALID
from agent_rl.training.data import Prompt
from agent_rl.types import Trajectory

ROOT = Path(__file__).resolve().parents[2]


def traj(text: str, turns: int = 1, searches: int = 0) -> Trajectory:
    return Trajectory(prompt_ids=[1, 2], response_ids=[3, 4, 5], loss_mask=[1, 1, 1], rollout_logprobs=[0.0] * 3,
                      num_turns=turns, num_searches=searches, finish_reason="answer", response_text=text)


def small_cfg(**over) -> TrainConfig:
    """Short turns: the engine runs on 2 shared cores."""
    items = {"max_turns": 1, "retriever.topk": 2, "data.max_response_length": 64, "data.max_obs_length": 128,
             "actor_rollout_ref.rollout.max_tokens_per_turn": 16, "actor_rollout_ref.rollout.dtype": "float32", **over}
    return load_config(TrainConfig, None, [f"{k}={v}" for k, v in items.items()])


# ----------------------------------------------------------------------------- records
def test_record_scores_with_training_reward():
    p = Prompt(id="q1", question="Capital of France?", golden_answers=["Paris", "Paris, France"], data_source="nq")
    text = "<think>I know.</think><search> france </search>\n\n<information>Doc 1 Paris</information>\n\n" \
           "<think>ok</think><answer> the Paris </answer>"
    r = ev.make_record(traj(text, turns=2, searches=1), p, "agent", TrainConfig().reward, "PROMPT", 1.5)
    assert r["prediction"] == "the Paris"
    assert (r["em"], r["subem"], r["f1"], r["reward"]) == (1.0, 1.0, 1.0, 1.0)  # "the" is an article
    assert r["valid_format"] and r["retrieval_hit"]
    assert (r["turns"], r["searches"], r["mode"], r["data_source"]) == (2, 1, "agent", "nq")
    assert r["key"] == ev.record_key("agent", "nq", "q1") and r["trajectory"] == text and r["prompt"] == "PROMPT"
    # partial credit: F1 of "Paris Texas" vs "Paris" = 2*(1/2*1)/(1/2+1) = 2/3; SubEM 1; EM 0
    r = ev.make_record(traj("<answer>Paris Texas</answer>"), p, "direct", TrainConfig().reward, "", 0.0)
    assert (r["em"], r["subem"]) == (0.0, 1.0) and r["f1"] == pytest.approx(2 / 3)
    assert r["valid_format"]  # direct: the think block is optional


def test_feedback_text_is_not_the_models_answer():
    # The rollout's invalid-action feedback quotes "<answer> and </answer>".
    p = Prompt(id="q", question="q?", golden_answers=["and"])
    r = ev.make_record(traj("no tags here" + FEEDBACK_INVALID + "still none"), p, "agent", TrainConfig().reward, "", 0.0)
    assert r["prediction"] is None and r["em"] == 0.0
    assert not r["valid_format"]


def test_valid_format_by_mode():
    assert ev.valid_format("<think>a</think><answer>b</answer>", "agent")
    assert not ev.valid_format("<answer>b</answer>", "agent")
    assert ev.valid_format(" <answer>b</answer>\n", "rag")
    assert ev.valid_format("<think>a</think><answer>b</answer>", "direct")
    assert not ev.valid_format("The answer is <answer>b</answer>", "direct")


# ----------------------------------------------------------------------------- the jsonl
def test_predictions_file_drops_partial_tail(tmp_path):
    path = tmp_path / "p.jsonl"
    full = [json.dumps({"key": f"k{i}", "v": i}) for i in range(3)]
    path.write_text(full[0] + "\n" + full[1] + "\n" + full[2][:7])
    f = ev.PredictionsFile(path)
    done = f.open()
    assert sorted(done) == ["k0", "k1"]
    f.append({"key": "k2", "v": 2})
    f.close()
    assert path.read_text() == full[0] + "\n" + full[1] + "\n" + json.dumps({"key": "k2", "v": 2}) + "\n"


def test_predictions_file_errors(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"key": "a"}\n{not json\n{"key": "b"}\n')
    with pytest.raises(ev.EvalInputError, match=r"p.jsonl:2: unreadable record"):
        ev.PredictionsFile(path).open()
    path.write_text('{"key": "a"}\n')
    first = ev.PredictionsFile(path)
    first.open()
    with pytest.raises(ev.EvalInputError, match="another evaluation"):
        ev.PredictionsFile(path).open()
    first.close()
    again = ev.PredictionsFile(path)
    assert list(again.open()) == ["a"]  # the lock went with the first
    again.clear()  # --overwrite
    again.append({"key": "b"})
    again.close()
    assert path.read_text() == '{"key": "b"}\n'


# ----------------------------------------------------------------------------- inputs
def _qa(path: Path, ids: list[str], source: str = "nq") -> Path:
    rows = [{"id": i, "question": f"question {i}?", "golden_answers": [f"a{i}"], "data_source": source} for i in ids]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_load_questions_sample_per_file_and_duplicates(tmp_path):
    a = _qa(tmp_path / "a.jsonl", [str(i) for i in range(20)])
    b = _qa(tmp_path / "b.jsonl", ["0", "1"], source="hq")
    qs = ev.load_questions([a, b, a])  # a file given twice: its questions count once
    assert [(q.data_source, q.id) for q in qs[-2:]] == [("hq", "0"), ("hq", "1")]
    assert len(qs) == 22  # same ids in another data_source are other questions
    s1 = ev.load_questions([a, b], limit=5, seed=3)
    assert len(s1) == 5 + 2 and [q.id for q in s1[:5]] == sorted((q.id for q in s1[:5]), key=int)
    assert [q.id for q in s1] == [q.id for q in ev.load_questions([a, b], limit=5, seed=3)]
    assert [q.id for q in s1[:5]] != [q.id for q in ev.load_questions([a], limit=5, seed=4)]
    with pytest.raises(ev.EvalInputError, match="no such file"):
        ev.load_questions([tmp_path / "missing.jsonl"])
    with pytest.raises(ev.EvalInputError, match="--limit"):
        ev.load_questions([a], limit=0)
    # FlashRAG layout without data_source: named after the dataset directory, not the split
    (tmp_path / "nq").mkdir()
    flash = tmp_path / "nq" / "test.jsonl"
    flash.write_text(json.dumps({"id": "test_0", "question": "q?", "golden_answers": ["x"]}) + "\n")
    assert [q.data_source for q in ev.load_questions([flash, a])] == ["nq"] + ["nq"] * 20

def test_load_questions_skips_malformed_rows_and_logs_them(tmp_path, caplog):
    """A long job fed bad rows: each is logged with its line and left out, the rest is run;
    the same rows are left out on every run, so positional ids (and a resume) stay stable."""
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"id": "1", "golden_answers": ["x"]}\n{"question": "caf\xe9?", "golden_answers": ["x"]}\n'
                    b'{"question": "kept?", "golden_answers": ["y"]}\n')
    with caplog.at_level("WARNING", logger="agent_rl.evaluation.evaluate"):
        qs = ev.load_questions([bad])
    assert [(q.id, q.question) for q in qs] == [("unknown_2", "kept?")]
    assert "skipped 2 malformed question(s) of 3" in caplog.text
    assert f"{bad}:1: missing field 'question'" in caplog.text and f"{bad}:2: invalid UTF-8 at byte 18 (0xe9)" in caplog.text
    bad.write_text('{"id": "1", "golden_answers": ["x"]}\n')
    with pytest.raises(ev.EvalInputError, match=r"no QA rows"):
        ev.load_questions([bad])


def test_resolve_model_dir(tmp_path):
    hf = tmp_path / "run" / "checkpoints" / "global_step_4" / "actor"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"")
    (hf.parent / "trainer_state.json").write_text('{"step": 4}')
    (tmp_path / "run" / "checkpoints" / "latest").write_text("global_step_4\n")
    assert ev.resolve_model_dir(hf) == hf.resolve()
    assert ev.resolve_model_dir(hf.parent) == hf.resolve()
    assert ev.resolve_model_dir(tmp_path / "run") == hf.resolve()
    sft = tmp_path / "sft_run" / "model"  # agent-rl-sft's run directory
    sft.mkdir(parents=True)
    (sft / "config.json").write_text("{}")
    (sft / "model.safetensors").write_bytes(b"")
    assert ev.resolve_model_dir(sft.parent) == sft.resolve()
    with pytest.raises(ev.EvalInputError, match="no such directory"):
        ev.resolve_model_dir(tmp_path / "nope")
    with pytest.raises(ev.EvalInputError, match="not an HF model directory"):
        ev.resolve_model_dir(tmp_path)
    (hf / "model.safetensors").unlink()
    with pytest.raises(ev.EvalInputError, match="no \\*.safetensors"):
        ev.resolve_model_dir(hf)


def test_resolve_model_dir_skips_a_damaged_newest_checkpoint(tmp_path, capsys):
    """A power loss left the newest checkpoint's weights empty: evaluating the run evaluates
    the checkpoint a resume would use, whatever the `latest` pointer names."""
    from agent_rl.training.checkpoint import CheckpointManager

    mgr = CheckpointManager(tmp_path / "run" / "checkpoints")
    for step in (4, 6):
        def actor(d):
            (d / "actor").mkdir()
            (d / "actor" / "config.json").write_text("{}")
            (d / "actor" / "model.safetensors").write_bytes(b"weights")

        mgr.save(step, {}, {}, actor)
    (tmp_path / "run" / "checkpoints" / "global_step_6" / "actor" / "model.safetensors").write_bytes(b"")
    assert ev.resolve_model_dir(tmp_path / "run") == (tmp_path / "run" / "checkpoints" / "global_step_4" / "actor").resolve()
    assert "skipping" in capsys.readouterr().out and "global_step_6" in (tmp_path / "run" / "checkpoints" / "latest").read_text()
    (tmp_path / "run" / "checkpoints" / "global_step_4" / "rng.pt").write_bytes(b"")
    with pytest.raises(ev.EvalInputError, match="no complete checkpoint in"):
        ev.resolve_model_dir(tmp_path / "run")


def test_base_url():
    assert ev.base_url("http://h:1/retrieve") == "http://h:1"
    assert ev.base_url("http://h:1/") == "http://h:1"
    with pytest.raises(ev.EvalInputError, match="http://"):
        ev.base_url("h:1")


def test_config_from_args_maps_flags():
    args = cli.eval_parser().parse_args(
        ["data.max_response_length=200", "--model", "m", "--retriever-url", "http://a:1/retrieve", "http://b:2",
         "--max-turns", "3", "--topk", "5", "--dtype", "float32", "--seed", "7", "--mode", "agent", "rag"])
    cfg = cli.config_from_args(args)
    assert cfg.retriever.url == ["http://a:1", "http://b:2"]
    assert (cfg.max_turns, cfg.retriever.topk, cfg.data.max_response_length) == (3, 5, 200)
    assert (cfg.actor_rollout_ref.rollout.dtype, cfg.actor_rollout_ref.rollout.seed) == ("float32", 7)
    assert args.mode == ["agent", "rag"]
    with pytest.raises(ev.EvalInputError, match=r"retriever.topk=0 is out of range \[1, inf\]"):
        cli.config_from_args(cli.eval_parser().parse_args(["--model", "m", "--topk", "0"]))
    with pytest.raises(ev.EvalInputError, match="unknown config key"):
        cli.config_from_args(cli.eval_parser().parse_args(["--model", "m", "--", "nosuch.key=1"]))


def test_settings_mismatch_refuses_to_mix(tmp_path, model_dir):
    out = tmp_path / "ev"
    s = ev.eval_settings(small_cfg(), Path(model_dir).resolve(), "float32")
    ev.check_settings(out, s, has_records=False, overwrite=False)
    ev.check_settings(out, s, has_records=True, overwrite=False)  # same settings: resume
    s2 = ev.eval_settings(small_cfg(max_turns=3), Path(model_dir).resolve(), "float32")
    with pytest.raises(ev.EvalInputError, match="max_turns: 1 -> 3"):
        ev.check_settings(out, s2, has_records=True, overwrite=False)
    assert json.loads((out / ev.EVAL_CONFIG).read_text())["max_turns"] == 1
    ev.check_settings(out, s2, has_records=False, overwrite=False)  # nothing to mix with
    assert json.loads((out / ev.EVAL_CONFIG).read_text())["max_turns"] == 3
    ev.check_settings(out, s, has_records=True, overwrite=True)
    assert json.loads((out / ev.EVAL_CONFIG).read_text())["max_turns"] == 1


def test_mismatch_refused_before_the_engine_loads(tmp_path, aio, model_dir):
    """Settings are checked under the directory's lock before the engine loads: a refused
    run leaves the records untouched."""
    out = tmp_path / "ev"
    cfg = small_cfg(**{"actor_rollout_ref.model.path": str(model_dir)})
    ev.check_settings(out, ev.eval_settings(cfg, Path(model_dir).resolve(), "float32"), False, False)
    (out / ev.PREDICTIONS).write_text('{"key": "x", "id": "1", "data_source": "nq", "mode": "direct"}\n')
    other = small_cfg(**{"actor_rollout_ref.model.path": str(model_dir), "max_turns": 3})
    prompts = [Prompt(id="1", question="q?", golden_answers=["x"], data_source="nq")]
    with pytest.raises(ev.EvalInputError, match="other settings"):
        aio(ev.run_evaluation(other, prompts, ["direct"], out, progress=False))
    assert (out / ev.PREDICTIONS).read_text().count("\n") == 1


def test_record_of_another_question_is_not_reused(aio, tmp_path, model_dir, monkeypatch):
    """Issue 83 case 5: ids are positions (`kb_test_N` in every generated KB), so a record is
    reused only for the question and gold answers it answered; another is refused in one line
    before the engine loads, the records untouched (EM 1.0 of France/Paris was counted for
    Germany/Berlin)."""
    from agent_rl.rollout.engine import RolloutEngine

    async def refuse(*a, **k):
        raise AssertionError("engine loaded")

    monkeypatch.setattr(RolloutEngine, "create", refuse)
    cfg = small_cfg(**{"actor_rollout_ref.model.path": str(model_dir)})
    out = tmp_path / "ev"
    ev.check_settings(out, ev.eval_settings(cfg, Path(model_dir).resolve(), "float32"), False, False)
    france = Prompt(id="kb_test_0", question="What is the capital of France?", golden_answers=["Paris"], data_source="kb")
    rec = ev.make_record(traj("<answer>Paris</answer>"), france, "direct", cfg.reward, "", 0.0)
    (out / ev.PREDICTIONS).write_text(json.dumps(rec) + "\n")
    before = (out / ev.PREDICTIONS).read_bytes()
    germany = Prompt(id="kb_test_0", question="What is the capital of Germany?", golden_answers=["Berlin"], data_source="kb")
    with pytest.raises(ev.EvalInputError, match=r"direct record of kb/kb_test_0 for another question \(question "
                                                r"'What is the capital of France\?' -> 'What is the capital of Germany\?'\)"):
        aio(ev.run_evaluation(cfg, [germany], ["direct"], out, progress=False))
    france_lyon = Prompt(id="kb_test_0", question=france.question, golden_answers=["Lyon"], data_source="kb")
    with pytest.raises(ev.EvalInputError, match=r"golden_answers \['Paris'\] -> \['Lyon'\]"):
        aio(ev.run_evaluation(cfg, [france_lyon], ["agent"], out, progress=False))  # any mode: the summary covers all
    assert (out / ev.PREDICTIONS).read_bytes() == before
    res = aio(ev.run_evaluation(cfg, [france], ["direct"], out, progress=False))  # its own question: reused
    assert res.reused == {"direct": 1} and res.summary["modes"]["direct"]["all"]["em"] == 1.0
    (out / ev.EVAL_CONFIG).unlink()  # records whose settings are unknown are not reused either
    with pytest.raises(ev.EvalInputError, match=f"no {ev.EVAL_CONFIG}"):
        aio(ev.run_evaluation(cfg, [france], ["direct"], out, progress=False))


@pytest.mark.parametrize("case", ["regenerated_kb", "hermes"])
def test_cli_refuses_to_mix_evaluations(case, tmp_path, model_dir):
    """Issue 83 case 5 through `agent-rl-eval`: an --out holding a finished evaluation of KB
    seed 0 under search_r1, rerun on KB seed 1 (the same ids, other questions) or with
    protocol=hermes, exits 2 with one line naming what differs, and changes no record."""
    from agent_rl.rollout.engine import engine_dtype
    from data_prep.synthetic import generate_kb

    generate_kb(tmp_path / "kb0", seed=0, n_entities=60)
    out = tmp_path / "ev"
    first = ["--model", str(model_dir), "--data", str(tmp_path / "kb0" / "test.parquet"), "--mode", "direct",
             "--dtype", "float32", "--out", str(out), "--no-progress"]
    cfg = cli.config_from_args(cli.eval_parser().parse_args(first))
    ev.check_settings(out, ev.eval_settings(cfg, ev.resolve_model_dir(model_dir), engine_dtype("float32")[0]), False, False)
    prompts = ev.load_questions([tmp_path / "kb0" / "test.parquet"])
    sink = ev.PredictionsFile(out / ev.PREDICTIONS)  # the first run, every question answered right
    sink.open()
    for p in prompts:
        sink.append(ev.make_record(traj(f"<answer>{p.golden_answers[0]}</answer>"), p, "direct", cfg.reward, "", 0.0))
    sink.close()
    before = (out / ev.PREDICTIONS).read_bytes()
    if case == "regenerated_kb":
        generate_kb(tmp_path / "kb1", seed=1, n_entities=60)
        again = [*first, "--data", str(tmp_path / "kb1" / "test.parquet")]
        regenerated = ev.load_questions([tmp_path / "kb1" / "test.parquet"])
        old = {p.id: p.question for p in prompts}
        assert all(p.id in old for p in regenerated) and any(old[p.id] != p.question for p in regenerated)
        want = "for another question (question "
    else:
        again = [*first, "--", "actor_rollout_ref.rollout.protocol=hermes"]
        want = "protocol: 'search_r1' -> 'hermes'"
    r = _cli(*again)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if "agent-rl-eval: error:" in line]
    assert len(errors) == 1 and want in errors[0] and "--overwrite" in errors[0], r.stderr
    assert "Traceback" not in r.stderr
    assert (out / ev.PREDICTIONS).read_bytes() == before


# ----------------------------------------------------------------------------- CLI, bad input
def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent_rl.evaluation.cli", "eval", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("case", ["model", "data", "retriever", "no_url"])
def test_cli_bad_input(case, tmp_path, model_dir):
    qa = _qa(tmp_path / "qa.jsonl", ["1", "2"])
    args = {"model": ["--model", str(tmp_path / "no_model"), "--data", str(qa), "--mode", "direct"],
            "data": ["--model", str(model_dir), "--data", str(tmp_path / "no.parquet"), "--mode", "direct"],
            "retriever": ["--model", str(model_dir), "--data", str(qa), "--retriever-url", "http://127.0.0.1:9",
                          "--retriever-wait", "1", "--mode", "agent"],
            "no_url": ["--model", str(model_dir), "--data", str(qa), "--mode", "rag"]}[case]
    want = {"model": "no_model: no such directory", "data": "no.parquet: no such file",
            "retriever": "127.0.0.1:9: unreachable", "no_url": "--retriever-url is required"}[case]
    r = _cli(*args, "--out", str(tmp_path / "out"))
    assert r.returncode == 2, r.stderr
    assert "agent-rl-eval: error:" in r.stderr and want in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out" / ev.PREDICTIONS).exists()


# ----------------------------------------------------------------------------- real engine + retriever
@pytest.fixture
def spy_rollout(monkeypatch):
    """Records the question ids each RolloutManager.rollout call ran (the real call still runs)."""
    from agent_rl.rollout.manager import RolloutManager

    calls: list[tuple[str, str]] = []
    real = RolloutManager.rollout

    async def spy(self, prompts, n=None, greedy=False, mode="agent"):
        assert greedy and n == 1
        calls.extend((mode, p.id) for p in prompts)
        return await real(self, prompts, n=n, greedy=greedy, mode=mode)

    monkeypatch.setattr(RolloutManager, "rollout", spy)
    return calls


@pytest.mark.slow
def test_resume_computes_only_missing_questions(aio, engine, tiny_kb, tmp_path, spy_rollout):
    n, k = 5, 2
    prompts = ev.load_questions([tiny_kb / "test.parquet"], limit=n, seed=0)
    out = tmp_path / "ev"
    run = lambda: aio(ev.run_evaluation(small_cfg(), prompts, ["direct"], out, engine=engine, progress=False), timeout=600)
    first = run()
    assert first.computed == {"direct": n} and first.reused == {"direct": 0}
    lines = (out / ev.PREDICTIONS).read_text().splitlines(keepends=True)
    assert len(lines) == n and all(json.loads(x)["mode"] == "direct" for x in lines)
    assert sorted(json.loads(x)["id"] for x in lines) == sorted(p.id for p in prompts)

    # interrupted run: k finished records and half of the next one
    (out / ev.PREDICTIONS).write_text("".join(lines[:k]) + lines[k][: len(lines[k]) // 2])
    spy_rollout.clear()
    second = run()
    kept = {json.loads(x)["id"] for x in lines[:k]}
    assert second.computed == {"direct": n - k} and second.reused == {"direct": k}
    assert sorted(spy_rollout) == sorted(("direct", p.id) for p in prompts if p.id not in kept)
    after = (out / ev.PREDICTIONS).read_text().splitlines(keepends=True)
    assert after[:k] == lines[:k] and len(after) == n
    assert len({json.loads(x)["key"] for x in after}) == n
    summary = json.loads((out / "summary.json").read_text())
    assert summary == second.summary and summary["modes"]["direct"]["all"]["n"] == n
    assert "| direct | all | 5 |" in (out / "summary.md").read_text()

    spy_rollout.clear()  # complete: nothing left to run
    assert run().computed == {"direct": 0} and spy_rollout == []


def test_finished_evaluation_loads_no_engine(aio, tmp_path, model_dir, monkeypatch):
    """Rerunning a finished evaluation (e.g. the learning benchmark resumed) rewrites the
    summary without loading a model."""
    from agent_rl.rollout.engine import RolloutEngine

    async def refuse(*a, **k):
        raise AssertionError("engine loaded for a finished evaluation")

    monkeypatch.setattr(RolloutEngine, "create", refuse)
    cfg = small_cfg(**{"actor_rollout_ref.model.path": str(model_dir)})
    out = tmp_path / "ev"
    ev.check_settings(out, ev.eval_settings(cfg, Path(model_dir).resolve(), "float32"), False, False)
    p = Prompt(id="1", question="q?", golden_answers=["x"], data_source="nq")
    traj_ = traj("<answer>x</answer>")
    rec = ev.make_record(traj_, p, "direct", cfg.reward, "", 0.0)
    (out / ev.PREDICTIONS).write_text(json.dumps(rec) + "\n")
    res = aio(ev.run_evaluation(cfg, [p], ["direct"], out, progress=False))
    assert res.computed == {"direct": 0} and res.reused == {"direct": 1}
    assert res.summary["modes"]["direct"]["all"]["em"] == 1.0


@pytest.mark.slow
def test_rag_and_agent_modes_with_real_retriever(aio, engine, tiny_kb, dense_retriever_url, tmp_path, spy_rollout):
    from agent_rl.rollout.observation import format_passages, tool_observation
    from agent_rl.rollout.retrieval_client import RetrieverClient, SyncRetrieverClient

    prompts = ev.load_questions([tiny_kb / "test.parquet"], limit=2, seed=1)
    cfg = small_cfg(**{"retriever.url": f"[{dense_retriever_url}]"})

    async def go():
        client = RetrieverClient([dense_retriever_url])
        try:
            return await ev.run_evaluation(cfg, prompts, ["rag", "agent"], tmp_path / "ev", engine=engine,
                                           retriever=client, progress=False)
        finally:
            await client.aclose()

    res = aio(go(), timeout=600)
    assert res.computed == {"rag": 2, "agent": 2}
    recs = [json.loads(x) for x in (tmp_path / "ev" / ev.PREDICTIONS).read_text().splitlines()]
    by = {(r["mode"], r["id"]): r for r in recs}
    with SyncRetrieverClient([dense_retriever_url]) as sync:
        for p in prompts:
            # rag: the prompt holds exactly the top-k passages the server returns for the question,
            # as a search's observation holds them (neutralised, cut to data.max_obs_length=128)
            passages = format_passages(sync.search([p.question], topk=2)[0])
            docs = tool_observation(engine.get_tokenizer(), passages, 128, ("", "")).text
            rag = by[("rag", p.id)]
            assert docs in rag["prompt"] and p.question in rag["prompt"] and rag["turns"] == 1
            agent = by[("agent", p.id)]
            assert "<search>" in agent["prompt"] and docs not in agent["prompt"]
            assert 1 <= agent["turns"] <= 2 and agent["searches"] <= 1
            assert agent["golden_answers"] == p.golden_answers
    summary = res.summary["modes"]
    assert list(summary) == ["agent", "rag"] and summary["rag"]["all"]["n"] == 2
    assert summary["agent"]["all"]["searches_mean"] == pytest.approx(sum(by[("agent", p.id)]["searches"] for p in prompts) / 2)


@pytest.mark.slow
def test_rag_retrieval_failure_is_recorded(aio, engine, tiny_kb, tmp_path):
    """A retriever that dies mid-run: the question still gets an answer attempt, and the
    failure is in its record and the summary (a silent failure would flatter no baseline)."""
    from agent_rl.rollout.retrieval_client import RetrieverClient

    prompts = ev.load_questions([tiny_kb / "test.parquet"], limit=1, seed=2)

    async def go():
        dead = RetrieverClient(["http://127.0.0.1:9"], max_retries=0, connect_timeout=0.5)
        try:
            return await ev.run_evaluation(small_cfg(), prompts, ["rag"], tmp_path / "ev", engine=engine,
                                           retriever=dead, progress=False)
        finally:
            await dead.aclose()

    res = aio(go(), timeout=600)
    (rec,) = [json.loads(x) for x in (tmp_path / "ev" / ev.PREDICTIONS).read_text().splitlines()]
    assert rec["tool_failures"] == 1 and "Search failed" in rec["prompt"]
    assert res.summary["modes"]["rag"]["all"]["tool_failures"] == 1
    assert res.summary["modes"]["rag"]["all"]["failed_retrieval"] == 1
    assert "1 of 1 rag questions saw a failed retrieval" in (tmp_path / "ev" / "summary.md").read_text()

    # issue 33: the resume re-runs the question whose retrieval failed (it used to count as finished, EM 0)
    async def search(queries, topk):
        return [[{"document": {"id": "p1", "contents": '"Glimmerfen"\nA passage.'}, "score": 1.0}] for _ in queries]

    again = aio(ev.run_evaluation(small_cfg(), prompts, ["rag"], tmp_path / "ev", engine=engine, retriever=search,
                                  progress=False), timeout=600)
    assert again.computed == {"rag": 1} and again.reused == {"rag": 0}
    recs = [json.loads(x) for x in (tmp_path / "ev" / ev.PREDICTIONS).read_text().splitlines()]
    assert len(recs) == 2 and recs[-1]["tool_failures"] == 0 and "Glimmerfen" in recs[-1]["prompt"]
    assert again.summary["modes"]["rag"]["all"]["n"] == 1 and again.summary["modes"]["rag"]["all"]["failed_retrieval"] == 0
