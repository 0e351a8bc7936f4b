"""One run's lifecycle (agent_rl/training/run.py) where it meets an earlier run: a resume that
must continue the checkpoint's run (the same model, tokenizer, rollout.n and trainer.mode, and
its in-flight rollouts whole), and a new run that must not rewrite an earlier one's history.

The checks are end to end through `agent-rl-train`'s entry point where they stop a command:
one line, before the retriever, Ray or the engine (no retriever listens on the configured
port, so a command that got past them would fail there instead)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agent_rl.config import TrainConfig, TrainerConfig, load_config, to_dict
from agent_rl.training.checkpoint import CheckpointManager
from agent_rl.training.metrics import MetricsLogger, read_jsonl
from agent_rl.training.run import Run


# ----------------------------------------------------------------------------- helpers
def fake_model(path: Path) -> Path:
    """What the checks read of an HF model directory: config, tokenizer files, weights."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8,
                                                  "transformers_version": "4.50.0"}))
    (path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0, "b": 1}}}))
    (path / "tokenizer_config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(bytes(range(256)) * 4096)
    return path


def train_args(tmp_path: Path, *extra: str) -> list[str]:
    qa = tmp_path / "qa.parquet"
    qa.write_bytes(b"")
    return [f"trainer.default_local_dir={tmp_path / 'run'}", f"actor_rollout_ref.model.path={tmp_path / 'model'}",
            f"data.train_files=[{qa}]", f"data.val_files=[{qa}]", "trainer.total_training_steps=10",
            "retriever.url=[http://127.0.0.1:9/retrieve]", "trainer.retriever_health_timeout_s=1",
            "actor_rollout_ref.actor.tis_cap=2.0", *extra]


def in_flight(n: int, groups: int = 2) -> dict:
    """rollouts.json of an ahead mode: `groups` groups of n members (one finished, one in
    flight, the rest not started)."""
    from agent_rl.rollout.manager import _State
    from agent_rl.rollout.stream import SavedGroup
    from agent_rl.training.data import Prompt
    from agent_rl.types import Trajectory

    done = Trajectory([1, 2], [5, 6, 7], [1, 0, 1], [-0.1, 0.0, -0.3], policy_versions=[0, -1, 0])
    live = _State([1, 2], [5, 6], [1, 1], [-0.1, -0.2], [0, 0], [("sampled", "ab")], turns=1)
    saved = [SavedGroup(k, Prompt(f"p{k}", f"q{k}", ["x"]), [done], [live], n - 2) for k in range(groups)]
    return {"next_key": groups, "groups": [g.to_dict() for g in saved]}


def save_checkpoint(args: list[str], rollouts: dict | None = None) -> Path:
    """Step 1 of a run under the config of `args`, saved as the trainer saves it."""
    from agent_rl.training.identity import train_identity
    from agent_rl.training.collect import ROLLOUTS

    cfg = load_config(TrainConfig, None, args)
    run = Run(cfg.trainer, cfg.trainer.default_local_dir, 10, "train", identity=train_identity(cfg))
    run.begin_step()
    run.end_step()

    def workers(d: Path) -> None:
        if rollouts is not None:
            (d / ROLLOUTS).write_text(json.dumps(rollouts))

    return run.save({"data": {"epoch": 0, "index": 2}, "kl_ctrl": {}}, to_dict(cfg), workers)


def train_cli(args: list[str], capsys) -> tuple[int, str]:
    from agent_rl.training.cli import main

    t0 = time.monotonic()
    rc = main(args)
    assert time.monotonic() - t0 < 15  # refused before anything started
    return rc, capsys.readouterr().err


# ----------------------------------------------------------------------------- resume: the same run
def _change_tokenizer(tmp_path: Path) -> list[str]:
    (tmp_path / "model" / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0, "c": 1}}}))
    return []


def _change_weights(tmp_path: Path) -> list[str]:
    weights = tmp_path / "model" / "model.safetensors"
    weights.write_bytes(bytes(reversed(weights.read_bytes())))  # the same size: another fine-tune
    return []


@pytest.mark.parametrize("change, said", [
    (lambda p: ["actor_rollout_ref.rollout.n=2"], "actor_rollout_ref.rollout.n=2, the checkpoint's is 4"),
    (lambda p: ["trainer.mode=one_step_off"], "trainer.mode=one_step_off, the checkpoint's is async"),
    (lambda p: ["trainer.mode=sync"], "the checkpoint's is async: it holds 2 prompts in flight that sync would skip"),
    (_change_tokenizer, "the tokenizer of actor_rollout_ref.model.path="),
    (_change_weights, "is not the model the checkpoint was trained from"),
], ids=["n", "mode", "async_to_sync", "tokenizer", "model"])
def test_a_resume_that_does_not_match_its_checkpoint_stops_in_one_line(tmp_path, capsys, change, said):
    """Saved with rollout.n=4 in async mode, resumed with n=2: take() hung or a ValueError came
    mid-step; resumed in sync mode: the prompts in flight were skipped without a word."""
    fake_model(tmp_path / "model")
    ckpt = save_checkpoint(train_args(tmp_path, "actor_rollout_ref.rollout.n=4", "trainer.mode=async"), in_flight(4))
    extra = change(tmp_path)
    rc, err = train_cli(train_args(tmp_path, "actor_rollout_ref.rollout.n=4", "trainer.mode=async", *extra), capsys)
    assert rc == 2 and err.startswith(f"agent-rl-train: error: cannot resume {ckpt}: ") and err.count("\n") == 1, err
    assert said in err, err


def test_a_matching_resume_passes_the_check(tmp_path):
    from agent_rl.training.identity import check_resume

    fake_model(tmp_path / "model")
    args = train_args(tmp_path, "actor_rollout_ref.rollout.n=4", "trainer.mode=async")
    save_checkpoint(args, in_flight(4))
    check_resume(load_config(TrainConfig, None, args))  # nothing to say
    moved = tmp_path / "moved"
    (tmp_path / "model").rename(moved)  # the same model elsewhere: its contents are what count
    check_resume(load_config(TrainConfig, None, [*args, f"actor_rollout_ref.model.path={moved}"]))
    check_resume(load_config(TrainConfig, None, [*args, "trainer.resume_mode=disable", "actor_rollout_ref.rollout.n=2",
                                                 f"actor_rollout_ref.model.path={moved}"]))  # not a resume


def test_a_checkpoint_saved_before_identities_were_recorded_is_checked_on_its_config(tmp_path, capsys):
    """Checkpoints written by the code before this check hold config.yaml: its n and mode count."""
    fake_model(tmp_path / "model")
    saved = load_config(TrainConfig, None, train_args(tmp_path, "actor_rollout_ref.rollout.n=4", "trainer.mode=async"))
    ckpt = CheckpointManager(tmp_path / "run" / "checkpoints").save(1, {"data": {}, "kl_ctrl": {}}, to_dict(saved))
    rc, err = train_cli(train_args(tmp_path, "actor_rollout_ref.rollout.n=2", "trainer.mode=async"), capsys)
    assert rc == 2 and f"cannot resume {ckpt}: actor_rollout_ref.rollout.n=2, the checkpoint's is 4" in err, err


ROWS = ('{"id": "q1", "question": "capital of France?", "golden_answers": ["Paris"]}\n'
        '{"id": "q2", "question": "capital of Italy?", "golden_answers": ["Rome"]}\n')


def _other_rows_of_the_same_size(tmp_path: Path) -> list[str]:
    (tmp_path / "train.jsonl").write_text(ROWS.replace("Paris", "Lyons"))
    return []


@pytest.mark.parametrize("change, said", [
    (_other_rows_of_the_same_size, "data.train_files do not hold the rows the checkpoint was trained on"),
    (lambda p: ["data.max_prompt_length=256"], "data.max_prompt_length=256, the checkpoint's is 512"),
    (lambda p: ["data.train_batch_size=4"], "data.train_batch_size=4, the checkpoint's is 8"),
    (lambda p: ["actor_rollout_ref.rollout.protocol=hermes"],
     "actor_rollout_ref.rollout.protocol=hermes, the checkpoint's is search_r1"),
    (lambda p: ["data.seed=2"], "data.seed=2, the checkpoint's is 1"),
    (lambda p: ["data.train_data_num=1"], "data.train_data_num=1, the checkpoint's is None"),
], ids=["rows", "max_prompt_length", "batch_size", "protocol", "seed", "train_data_num"])
def test_a_resume_on_other_data_or_batch_settings_stops_in_one_line(tmp_path, capsys, change, said):
    """Another train file of the same size, another max_prompt_length, batch size or protocol
    resumed silently: the loader's position went on in other prompts, the rollouts in flight
    under another action protocol."""
    fake_model(tmp_path / "model")
    train = tmp_path / "train.jsonl"
    train.write_text(ROWS)
    ckpt = save_checkpoint(train_args(tmp_path, f"data.train_files=[{train}]"))
    extra = change(tmp_path)
    assert train.stat().st_size == len(ROWS)
    rc, err = train_cli(train_args(tmp_path, f"data.train_files=[{train}]", *extra), capsys)
    assert rc == 2 and err.startswith(f"agent-rl-train: error: cannot resume {ckpt}: ") and err.count("\n") == 1, err
    assert said in err, err


def test_the_same_rows_elsewhere_resume(tmp_path):
    """The data is known by content: the same file moved, or read again, is the same data."""
    from agent_rl.training.identity import check_resume

    fake_model(tmp_path / "model")
    train = tmp_path / "train.jsonl"
    train.write_text(ROWS)
    save_checkpoint(train_args(tmp_path, f"data.train_files=[{train}]"))
    moved = train.rename(tmp_path / "elsewhere.jsonl")
    check_resume(load_config(TrainConfig, None, train_args(tmp_path, f"data.train_files=[{moved}]")))


@pytest.mark.parametrize("damage, said", [
    (lambda g: g["live"][0]["loss_mask"].pop(), "groups[1].live[0].loss_mask has 1 entries, response_ids has 2"),
    (lambda g: g["done"][0]["rollout_logprobs"].append(0.0),
     "groups[1].done[0].rollout_logprobs has 4 entries, response_ids has 3"),
    (lambda g: g.update(pending=5), "groups[1] holds 7 members (1 done, 1 in flight, 5 pending), rollout.n is 4"),
    (lambda g: g["live"][0].pop("versions"), "groups[1].live[0] has no versions"),
], ids=["live", "done", "members", "missing"])
def test_rollouts_json_is_checked_when_it_is_loaded_naming_the_file_and_field(tmp_path, capsys, damage, said):
    """A damaged or edited rollouts.json failed only when its trajectory ended, mid-step."""
    fake_model(tmp_path / "model")
    args = train_args(tmp_path, "actor_rollout_ref.rollout.n=4", "trainer.mode=async")
    rollouts = in_flight(4)
    damage(rollouts["groups"][1])
    ckpt = save_checkpoint(args, rollouts)
    rc, err = train_cli(args, capsys)
    assert rc == 2 and f"{ckpt / 'rollouts.json'}: {said}" in err and err.count("\n") == 1, err


# ----------------------------------------------------------------------------- a new run: history kept
def _earlier_run(run_dir: Path) -> dict[Path, bytes]:
    """Three logged steps (jsonl, TensorBoard) and the checkpoint of step 3; returns its files."""
    logger = MetricsLogger(run_dir, ["jsonl", "tensorboard"])
    for step in (1, 2, 3):
        logger.log({"reward/mean": float(step)}, step)
    logger.close()
    CheckpointManager(run_dir / "checkpoints").save(3, {"data": {}}, {})
    return {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def test_resume_mode_disable_moves_the_earlier_run_aside_and_never_rewrites_it(tmp_path, capsys):
    """It cut the earlier run's metrics.jsonl to step <= 0, purged its TensorBoard events and
    mixed the two runs' checkpoints, so a later auto-resume took the earlier run's step 3."""
    run_dir = tmp_path / "run"
    earlier = _earlier_run(run_dir)
    capsys.readouterr()
    run = Run(TrainerConfig(default_local_dir=str(run_dir), resume_mode="disable"), run_dir, 2, "train")
    assert run.start() is None and run.step == 0
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.prev-")]
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and f"moved the earlier run in {run_dir} to {aside}" in out, out
    assert {p.relative_to(aside): p.read_bytes() for p in aside.rglob("*") if p.is_file()} == earlier
    # the new run, as the trainer goes on: its logger, one step, its checkpoint
    logger = MetricsLogger(run_dir, ["jsonl", "tensorboard"], resume_step=run.step)
    run.begin_step()
    logger.log({"reward/mean": 0.5}, run.step)
    logger.close()
    run.end_step()
    run.save({"data": {}}, {}, None)
    assert [r["step"] for r in read_jsonl(run_dir)] == [1]
    assert {p.relative_to(aside): p.read_bytes() for p in aside.rglob("*") if p.is_file()} == earlier
    later = Run(TrainerConfig(default_local_dir=str(run_dir)), run_dir, 2, "train")  # resume_mode=auto
    assert later.start() == run_dir / "checkpoints" / "global_step_1"


def test_a_directory_that_holds_the_command_or_the_runs_model_is_refused_not_moved(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    earlier = _earlier_run(run_dir)
    tr = TrainerConfig(default_local_dir=str(run_dir), resume_mode="disable")
    model = run_dir / "checkpoints" / "global_step_3"  # a new run from the earlier run's weights
    with pytest.raises(ValueError, match="actor_rollout_ref.model.path .* is inside it"):
        Run(tr, run_dir, 2, "train", inputs={"actor_rollout_ref.model.path": str(model)}).start()
    monkeypatch.chdir(run_dir / "checkpoints")
    with pytest.raises(ValueError, match="the current directory is inside it"):
        Run(tr, run_dir, 2, "train").start()
    assert {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == earlier


def test_a_new_run_in_an_empty_or_absent_directory_moves_nothing(tmp_path, capsys):
    for run_dir in (tmp_path / "absent", tmp_path / "empty"):
        if run_dir.name == "empty":
            run_dir.mkdir()
        Run(TrainerConfig(default_local_dir=str(run_dir), resume_mode="disable"), run_dir, 2, "train").start()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"] and capsys.readouterr().out == ""


# ----------------------------------------------------------------------------- a resume from an earlier step: no lost branch
def _run_to(run_dir: Path, last: int, saves: tuple[int, ...], keep: int | None = None) -> None:
    """Steps 1..last logged (jsonl, TensorBoard, one validation file each), checkpoints at `saves`."""
    logger = MetricsLogger(run_dir, ["jsonl", "tensorboard"])
    ckpts = CheckpointManager(run_dir / "checkpoints", keep)
    for step in range(1, last + 1):
        logger.log({"reward/mean": float(step)}, step)
        (run_dir / "validation").mkdir(exist_ok=True)
        (run_dir / "validation" / f"{step}.jsonl").write_text(f'{{"id": "q", "metric": {step}}}\n')
        if step in saves:
            ckpts.save(step, {"data": {}, "branch": "old"}, {})
    logger.close()


def _resume_and_train(run_dir: Path, tr: TrainerConfig, steps: int) -> Run:
    """What the trainer does on a resume: start, restore, its logger, `steps` steps each saved."""
    run = Run(tr, run_dir, 100, "train")
    path = run.start()
    if path is not None:
        run.restore(path)
    logger = MetricsLogger(run_dir, ["jsonl", "tensorboard"], resume_step=run.step)
    for _ in range(steps):
        run.begin_step()
        logger.log({"reward/mean": -1.0}, run.step)
        run.end_step()
        run.save({"data": {}, "branch": "new"}, {}, None)
    logger.close()
    return run


def test_a_resume_from_an_earlier_checkpoint_moves_the_later_branch_aside(tmp_path, capsys):
    """Resumed from step 10 with checkpoints 15 and 20 saved: metrics rows 11-20 were cut but
    checkpoints 15 and 20 kept; keep=2 then pruned the branch point, and the next automatic
    resume took the old branch's step 20 under the new branch's metrics."""
    run_dir = tmp_path / "run"
    _run_to(run_dir, 20, (5, 10, 15, 20))
    (run_dir / "model").mkdir()  # SFT's final model of the old branch
    (run_dir / "model" / ".complete").write_text("")
    old_rows = (run_dir / "metrics.jsonl").read_text()
    capsys.readouterr()
    tr = TrainerConfig(default_local_dir=str(run_dir), max_ckpt_to_keep=2, validation_data_dir=str(run_dir / "validation"),
                       resume_from_path=str(run_dir / "checkpoints" / "global_step_10"))
    run = _resume_and_train(run_dir, tr, 2)
    assert run.step == 12
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.prev-")]
    out = capsys.readouterr().out
    assert f"resuming from {run_dir / 'checkpoints' / 'global_step_10'} at step 10: moved the run's later steps in " \
           f"{run_dir} to {aside}" in out, out
    # the old branch, whole, aside: its checkpoints past 10, its metrics from step 1, its validations past 10
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == ["global_step_15", "global_step_20"]
    assert (aside / "metrics.jsonl").read_text() == old_rows
    assert sorted(int(p.stem) for p in (aside / "validation").iterdir()) == list(range(11, 21))
    assert (aside / "tensorboard").is_dir() and (aside / "model" / ".complete").is_file()
    assert not (run_dir / "model").exists()
    # the run: one story, the new branch on top of steps 1-10
    assert [r["step"] for r in read_jsonl(run_dir)] == list(range(1, 13))
    assert [r["reward/mean"] for r in read_jsonl(run_dir)][9:] == [10.0, -1.0, -1.0]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("global_step_*")) == ["global_step_11", "global_step_12"]
    assert (run_dir / "checkpoints" / "latest").read_text() == "global_step_12"
    assert sorted(int(p.stem) for p in (run_dir / "validation").iterdir()) == list(range(1, 11))
    # the next automatic resume takes the new branch
    later = Run(TrainerConfig(default_local_dir=str(run_dir)), run_dir, 100, "train")
    assert later.start() == run_dir / "checkpoints" / "global_step_12"
    assert later.restore(later.start())["branch"] == "new"


def test_a_resume_from_the_last_checkpoint_moves_nothing(tmp_path, capsys):
    """A killed run's steps logged past its last checkpoint are cut as on any resume: no branch was saved."""
    run_dir = tmp_path / "run"
    _run_to(run_dir, 12, (5, 10))
    tr = TrainerConfig(default_local_dir=str(run_dir), resume_from_path=str(run_dir / "checkpoints" / "global_step_10"))
    _resume_and_train(run_dir, tr, 1)
    assert [p.name for p in tmp_path.iterdir()] == ["run"] and "moved" not in capsys.readouterr().out
    assert [r["step"] for r in read_jsonl(run_dir)] == list(range(1, 12))


def test_a_branch_holding_the_runs_model_is_refused_not_moved(tmp_path):
    run_dir = tmp_path / "run"
    _run_to(run_dir, 20, (10, 20))
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    tr = TrainerConfig(default_local_dir=str(run_dir), resume_from_path=str(run_dir / "checkpoints" / "global_step_10"))
    model = run_dir / "checkpoints" / "global_step_20" / "actor"
    with pytest.raises(ValueError, match="actor_rollout_ref.model.path .* is among them"):
        Run(tr, run_dir, 100, "train", inputs={"actor_rollout_ref.model.path": str(model)}).start()
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_the_budget_counts_the_time_between_steps_under_max_time_counts_all(tmp_path, monkeypatch):
    """10-s steps with 5 s of validation, checkpoint and logging after each, a 40-s budget:
    counting the steps alone, 4 steps (40 s of steps in 55 s of wall time); counting all, 3, and
    the time trained is the wall time from the first step's start to the last one's end."""
    import types

    from agent_rl.training import run as run_module

    clock = [0.0]
    monkeypatch.setattr(run_module, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    def train(counts: str) -> tuple[int, float, float]:
        clock[0] = 0.0
        r = Run(TrainerConfig(max_time_s=40.0, max_time_counts=counts), tmp_path / counts, 100, "train")
        while r.running():
            r.begin_step()
            clock[0] += 10.0
            r.end_step()
            clock[0] += 5.0
        return r.step, r.trained_s, r.longest_step_s

    assert train("steps") == (4, 40.0, 10.0)
    assert train("all") == (3, 40.0, 15.0)  # steps 2 and 3 count from the end of the one before


def test_a_run_checks_its_resume_once(monkeypatch):
    """agent-rl-train checks the checkpoint it would resume before the retriever and Ray, and
    hands its identity to the trainer, which then does not check (or hash the train files)
    again; a trainer started in-process checks once itself."""
    from agent_rl.config import TrainConfig
    from agent_rl.training import trainer

    class Built(Exception):
        """Raised by the step after the check: nothing else of the trainer is built."""

    calls = []
    monkeypatch.setattr(trainer, "check_resume", lambda *args: calls.append("check"))
    monkeypatch.setattr(trainer, "train_identity", lambda cfg: calls.append("identity") or {"id": 1})
    monkeypatch.setattr(trainer, "PromptLoader", lambda *a, **k: (_ for _ in ()).throw(Built()))
    monkeypatch.setattr(trainer, "load_train_prompts", lambda cfg: [])
    with pytest.raises(Built):
        trainer.RayTrainer(TrainConfig(), identity={"id": 1})
    assert calls == []
    with pytest.raises(Built):
        trainer.RayTrainer(TrainConfig())
    assert calls == ["identity", "check"]


def test_fewer_training_prompts_than_a_batch_stop_in_one_line(tmp_path, monkeypatch, capsys):
    """The README's your-data commands on a QA set that grounded one demonstration: the loader
    says how many prompts there are against data.train_batch_size, and agent-rl-train prints it
    in one line (exit 2) instead of a traceback; Ray, started by then, is left by ray_trainer."""
    from contextlib import contextmanager

    from agent_rl.training import data, trainer

    with pytest.raises(data.TooFewPrompts, match=r"data.train_batch_size 8 exceeds the 1 training prompts"):
        data.PromptLoader([data.Prompt(id="q0", question="q", golden_answers=["a"])], 8)

    assert issubclass(data.TooFewPrompts, data.TrainDataError)  # what agent-rl-train says in one line

    @contextmanager
    def too_few(cfg, identity=None):
        raise data.TooFewPrompts("data.train_batch_size 8 exceeds the 1 training prompts (...)")
        yield  # pragma: no cover

    fake_model(tmp_path / "model")
    monkeypatch.setattr(trainer, "ray_trainer", too_few)
    rc, err = train_cli(["--no-wait-retriever", *train_args(tmp_path)], capsys)
    assert rc == 2 and "\nagent-rl-train: error: data.train_batch_size 8 exceeds" in err and "Traceback" not in err
