"""`python -m agent_rl.demo --workdir DIR` reads and writes DIR's files only.

The demo is driven end to end for a second workdir with its expensive parts faked: `run_stage`
records each stage's command instead of starting it (writing only the calibration figures the
plan reads), and the retriever, the retrieval preview and the report are stand-ins that record
their paths. Every path a command names, and every path-valued field of the config it loads
(with the command's own overrides, through `load_config`), must lie under that workdir.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from agent_rl.demo import cli, pipeline, stages
from agent_rl.demo.budget import SIZES
from agent_rl.config import SFTConfig, TrainConfig, load_config
from agent_rl.training.metrics import write_validation

PATH_FIELDS = {"data.train_files", "data.val_files", "actor_rollout_ref.model.path", "critic.model_path",
               "retriever.api_key_file", "trainer.default_local_dir", "trainer.resume_from_path"}
"""The config fields that name files or directories (the others that hold a "/" are caught too)."""


def _leaves(obj, key: str = ""):
    """(dotted key, value) of every leaf of a config; list items keep their list's key."""
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _leaves(getattr(obj, f.name), f"{key}.{f.name}" if key else f.name)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _leaves(v, key)
    else:
        yield key, obj


def config_paths(cfg) -> list[tuple[str, str]]:
    return [(k, v) for k, v in _leaves(cfg) if isinstance(v, str) and v
            and (k in PATH_FIELDS or ("/" in v and "://" not in v))]


def command(cmd: list[str]) -> tuple[str, list[str]]:
    """(`python -m` module and its subcommand, if any; the options): [PY, "-m", "data_prep",
    "model", "--out", d] -> ("data_prep model", ["--out", d])."""
    sub = not cmd[3].startswith("-")
    return " ".join(cmd[2:3 + sub]), cmd[3 + sub:]


def loaded_config(cmd: list[str]):
    """The config `cmd` loads, as the command loads it: its --config with its overrides."""
    name, argv = command(cmd)
    if "--config" not in argv:
        return None
    if name == "agent_rl.evaluation.cli eval":  # adds --model and its flags to the overrides
        from agent_rl.evaluation.cli import config_from_args, eval_parser

        return config_from_args(eval_parser().parse_args(argv))
    path = argv[argv.index("--config") + 1]
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    return load_config(SFTConfig if name == "agent_rl.coldstart.cli sft" else TrainConfig, stages.ROOT / path,
                       overrides)


def named_paths(cmd: list[str]) -> list[str]:
    """The paths a command names on its command line (its --config, a recipe file, left out)."""
    argv, out = command(cmd)[1], []
    for prev, a in zip(["", *argv], argv):
        if a.startswith("-") or prev in ("--config", "--retriever-url") or "=" in a:
            continue  # overrides are checked in the config they produce
        if "/" in a:
            out.append(a)
    return out


def under(path: str | Path, work: Path) -> bool:
    return (stages.ROOT / path).resolve().is_relative_to(work.resolve())


GRPO_SET = ["--grpo-set", "actor_rollout_ref.rollout.enforce_eager=false", "--grpo-set", "algorithm.kl_ctrl.kl_coef=0.01"]


def fake_stages(monkeypatch, speeds: tuple = (900.0, 800.0, 10.0),
                kb_entities: int = 60) -> tuple[list[list[str]], dict[str, list], list[dict]]:
    """The demo's stages replaced by stand-ins that write only what the next stage reads (the
    calibration: `speeds`, update and generation tok/s and engine load s; a knowledge base of
    `kb_entities`); returns the commands
    run, the paths the report, the retriever and the preview were given, and the report's
    chosen model."""
    from retriever_server import launch

    cmds: list[list[str]] = []
    seen: dict[str, list] = {}
    choices: list[dict] = []

    def fake_run(cmd, what, tag="demo", on_start=None):
        from data_prep.synthetic import generate_kb

        cmd = [str(c) for c in cmd]
        cmds.append(cmd)
        if "calibrate" in cmd:  # the figures the budget reads
            out = stages.ROOT / cmd[cmd.index("--out") + 1]
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(dict(zip(("update_tok_s", "gen_tok_s", "engine_load_s"), speeds))))
        if "synthetic" in cmd:  # the test questions the selection questions are drawn from
            generate_kb(stages.ROOT / cmd[cmd.index("--out") + 1], seed=0, n_entities=kb_entities)
        if "agent_rl.training.cli" in cmd:  # the validations the model is chosen on, where the config asks
            cfg = loaded_config(cmd)
            run_dir = Path(cfg.trainer.default_local_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            rows = ([{"step": 0, "val/em": 0.5}] if cfg.trainer.val_before_train else []) + (
                [{"step": 1, "val/em": 0.6}] if cfg.trainer.test_freq > 0 else [{"step": 1, "reward/mean": 0.2}])
            (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            for row in rows:  # each question's result, where the config writes them: 5 then 6 of 10 right
                if "val/em" in row and cfg.trainer.validation_data_dir:
                    right = round(10 * row["val/em"])
                    write_validation(cfg.trainer.validation_data_dir, row["step"],
                                     [{"id": f"q{i}", "metric": float(i < right)} for i in range(10)])
        return 0.0

    def fake_report(runs, evals, rl_dir, budget=None, test_parquet=None, stage_s=None, chosen=None, skipped=None):
        seen["report"] = [runs, *evals.values(), rl_dir, test_parquet, chosen and chosen["model"]]
        fake_report.skipped = skipped  # why GRPO did not run (not a path: kept apart from `seen`)
        choices.append(chosen)
        return Path(runs) / "report.md"

    def fake_server(index, corpus, port=None, log_path=None):
        seen["retriever"] = [index, corpus, log_path]
        return object(), "http://127.0.0.1:9"

    monkeypatch.setattr(stages, "run_stage", fake_run)
    monkeypatch.setattr(pipeline, "write_report", fake_report)
    monkeypatch.setattr(pipeline, "show_retrieval", lambda url, qa: seen.setdefault("preview", [qa]))
    monkeypatch.setattr(stages, "stop_on_sigterm", lambda: None)
    monkeypatch.setattr(launch, "start_server", fake_server)
    monkeypatch.setattr(launch, "wait_healthy", lambda *a, **k: {})
    monkeypatch.setattr(launch, "stop_server", lambda proc: 0)
    return cmds, seen, choices


@pytest.mark.parametrize("extra", [[], ["--protocol", "hermes"], ["--plain-wording"], GRPO_SET],
                         ids=["search_r1", "hermes", "plain_wording", "grpo_set"])
def test_every_stage_reads_and_writes_the_workdir_only(tmp_path, monkeypatch, extra):
    work = tmp_path / "second"
    cmds, seen, _ = fake_stages(monkeypatch)

    assert cli.main(["--workdir", str(work), "--budget-minutes", "60", "--rl-minutes", "2",
                            "--eval-limit", "10", *extra]) == 0
    modules = [command(c)[0] for c in cmds]
    for stage in ("data_prep model", "data_prep synthetic", "data_prep index", "agent_rl.demo calibrate", "data_prep demos",
                  "agent_rl.coldstart.cli sft", "agent_rl.evaluation.cli eval", "agent_rl.training.cli"):
        assert stage in modules, (stage, modules)
    assert modules.count("agent_rl.evaluation.cli eval") == 3  # base, SFT, SFT+RL
    demos = cmds[modules.index("data_prep demos")]
    # the plain wording reaches the demonstrations, which go beside the default's
    assert ("--plain-wording" in demos) == ("--plain-wording" in extra)
    assert demos[demos.index("--out") + 1].endswith("_plain.parquet") == ("--plain-wording" in extra)

    # --grpo-set reaches the GRPO stage's config and no other stage's command
    grpo = loaded_config(cmds[modules.index("agent_rl.training.cli")])
    # GRPO validates on the workdir's selection questions at its start and its last step
    assert [Path(f).name for f in grpo.data.val_files] == ["selection_questions.parquet"]
    assert grpo.trainer.val_before_train and grpo.trainer.test_freq > 1000
    # it keeps a few rollouts in its run directory, where the report points `agent-rl-eval show`
    assert Path(grpo.trainer.rollout_data_dir) == Path(grpo.trainer.default_local_dir) / stages.ROLLOUTS
    assert grpo.actor_rollout_ref.rollout.enforce_eager is (GRPO_SET[1] not in extra)
    assert (grpo.algorithm.kl_ctrl.kl_coef == 0.01) == (GRPO_SET[3] in extra)
    assert not [m for c, m in zip(cmds, modules) if m != "agent_rl.training.cli" and "kl_coef=0.01" in " ".join(c)]

    outside = []
    for cmd, module in zip(cmds, modules):
        outside += [f"{module}: {p}" for p in named_paths(cmd) if not under(p, work)]
        cfg = loaded_config(cmd)
        if cfg is not None:
            outside += [f"{module}: config {k}={v}" for k, v in config_paths(cfg) if not under(v, work)]
    for what, paths in seen.items():
        outside += [f"{what}: {p}" for p in paths if p is not None and not under(p, work)]
    assert not outside, "\n".join(outside)


def test_a_grpo_run_told_not_to_validate_hands_over_the_sft_model_with_a_report(tmp_path, monkeypatch, capsys):
    # `--grpo-set trainer.test_freq=-1`: no validation after a step, so GRPO's model cannot be chosen
    work = tmp_path / "w"
    cmds, _, choices = fake_stages(monkeypatch)
    assert cli.main(["--workdir", str(work), "--budget-minutes", "60", "--rl-minutes", "2", "--eval-limit", "10",
                     "--grpo-set", "trainer.test_freq=-1"]) == 0
    (chosen,) = choices
    assert chosen["chosen"] == "SFT" and chosen["sft_em"] == 0.5 and chosen["rl_em"] is None
    assert Path(chosen["model"]) == stages.Workdir(work).sft_dir  # the SFT model's files, in the workdir
    assert "no validation at step 0 and after a step" in capsys.readouterr().out
    assert sum("agent_rl.evaluation.cli" in " ".join(c) for c in cmds) == 3  # GRPO's own model is still compared


def test_the_model_is_chosen_on_the_grpo_runs_own_question_by_question_validations(tmp_path, monkeypatch, capsys):
    work = tmp_path / "w"
    _, _, choices = fake_stages(monkeypatch)
    assert cli.main(["--workdir", str(work), "--budget-minutes", "60", "--rl-minutes", "2", "--eval-limit", "10"]) == 0
    (chosen,) = choices  # one question won, none lost: a lead chance gives half the time, so SFT's is kept
    assert (chosen["wins"], chosen["losses"], chosen["p"], chosen["chosen"]) == (1, 0, 1.0, "SFT")
    assert Path(chosen["model"]) == stages.Workdir(work).sft_dir
    assert "1 won and 0 lost (McNemar p=1.000" in capsys.readouterr().out


def test_an_avx2_host_runs_grpo_in_the_small_shape(tmp_path, monkeypatch, capsys):
    """The calibration `make demo` measured on a 2-core AVX2 host (record demo_fp32_avx2), where
    the standard shape fit no GRPO step in 33 minutes: the small shape's choices reach the
    stages' commands, and the plan printed says it chose them."""
    cmds, _, _ = fake_stages(monkeypatch, speeds=(84.0, 57.0, 15.5), kb_entities=800)  # 435 test questions
    assert cli.main(["--workdir", str(tmp_path / "w"), "--budget-minutes", "33"]) == 0
    out = capsys.readouterr().out
    assert "the small shape, as this host is too slow for GRPO in the standard one" in out
    modules = [command(c)[0] for c in cmds]
    evals = [c for c, m in zip(cmds, modules) if m == "agent_rl.evaluation.cli eval"]
    modes = [c[c.index("--mode") + 1:c.index("--limit")] for c in evals]
    limits = [int(c[c.index("--limit") + 1]) for c in evals]
    assert modes == [list(stages.MODES), ["agent"], ["agent"]]  # base as ever, SFT in agent mode only
    assert limits[0] == 10 and limits[1] == limits[2] < 200
    grpo = loaded_config(cmds[modules.index("agent_rl.training.cli")])
    assert grpo.data.train_batch_size == grpo.actor_rollout_ref.actor.ppo_mini_batch_size == 4
    assert "validated on 20 selection questions" in out
    sft = loaded_config(cmds[modules.index("agent_rl.coldstart.cli sft")])
    assert sft.trainer.total_training_steps < SIZES.sft_steps  # stops at its planned steps


@pytest.mark.parametrize("slow", ["base", "SFT"])
def test_grpo_is_charged_for_the_sft_evaluations_overrun_not_the_bases(slow, tmp_path, monkeypatch, capsys):
    # the stage the demo times is the one its charge reads: an SFT evaluation that ran far past its
    # estimate leaves GRPO no time; the base model's evaluation, however slow, is not charged
    cmds, _, _ = fake_stages(monkeypatch)
    fake_run = stages.run_stage

    def timed(cmd, what, **kw):
        fake_run(cmd, what, **kw)
        return 1e6 if what.startswith(f"evaluate {slow} (") else 0.0

    monkeypatch.setattr(stages, "run_stage", timed)
    assert cli.main(["--workdir", str(tmp_path / "w"), "--budget-minutes", "60", "--eval-limit", "10"]) == 0
    out = capsys.readouterr().out
    grpo_ran = any("agent_rl.training.cli" in " ".join(c) for c in cmds)
    if slow == "SFT":
        assert "the SFT evaluation took" in out and "GRPO skipped" in out and not grpo_ran
        # the report is told why, with the budget that fits min_rl_steps (more than the 60 given)
        skipped = pipeline.write_report.skipped
        assert skipped["steps"] == 3 and skipped["budget_to_run"] > 60
        assert f"--budget-minutes {skipped['budget_to_run']} runs about 3 steps" in out
    else:
        assert "the SFT evaluation took" not in out and "GRPO skipped" not in out and grpo_ran
        assert pipeline.write_report.skipped is None


@pytest.mark.parametrize("bad, says", [("actor_rollout_ref.rollout.enforce_eagre=false",
                                        "unknown config key(s) ['actor_rollout_ref.rollout.enforce_eagre']"),
                                       ("no_equals_sign", "'no_equals_sign' must look like key.sub=value")])
def test_a_bad_grpo_override_fails_before_any_stage_runs(bad, says, tmp_path, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(stages, "run_stage", lambda *a, **k: ran.append(a))
    with pytest.raises(SystemExit) as e:
        cli.main(["--workdir", str(tmp_path / "w"), "--grpo-set", bad])
    assert e.value.code == 2 and not ran and not (tmp_path / "w").exists()
    assert f"--grpo-set: {'override ' if '=' not in bad else ''}{says}" in capsys.readouterr().err


def test_the_demonstrations_command_keeps_each_option_with_its_value(tmp_path):
    """Options before the config overrides, each with its value; overrides (`key=value`) last,
    after the workdir's own, whatever order `extra` gives them in."""
    w = stages.Workdir(tmp_path / "w")
    extra = ["actor_rollout_ref.rollout.protocol=native", "--kinds", "single,comparison", "--plain-wording",
             "--max-searches", "1"]
    cmd = [str(c) for c in stages.demonstrations(w, "http://127.0.0.1:1", 30, extra)]
    i = cmd.index("--kinds")
    assert cmd[i + 1] == "single,comparison" and cmd[cmd.index("--max-searches") + 1] == "1"
    own = [str(o) for o in w.train_overrides()]
    assert cmd[-len(own) - 1:] == [*own, "actor_rollout_ref.rollout.protocol=native"]
    assert max(cmd.index(o) for o in ("--kinds", "--plain-wording", "--max-searches")) < cmd.index(own[0])
