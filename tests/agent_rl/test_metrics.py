"""Metrics sinks (jsonl, TensorBoard, console), key checks, resume truncation, and the plot command."""

from __future__ import annotations

import math

import pytest

from agent_rl.evaluation.cli import plot_main
from agent_rl.training.metrics import MetricsLogger, check_metrics, read_jsonl


def _tb_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_jsonl_tensorboard_and_console(tmp_path, capsys):
    log = MetricsLogger(tmp_path, ["console", "tensorboard", "jsonl"])
    for step in (1, 2):
        log.log({"reward/mean": 0.5 * step, "actor/pg_loss": -0.1, "timing/step": 3.0}, step, extra={"prompt_ids": ["a", "b"]})
    log.close()
    rows = read_jsonl(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1]["reward/mean"] == 1.0 and rows[0]["prompt_ids"] == ["a", "b"]
    tb = _tb_scalars(tmp_path)
    assert tb["reward/mean"] == [(1, 0.5), (2, 1.0)] and "prompt_ids" not in tb
    out = capsys.readouterr().out
    assert "step 2 | reward/mean 1 | actor/pg_loss -0.1 | timing/step 3" in out


def test_keys_must_be_namespaced_numbers():
    with pytest.raises(ValueError, match="not namespaced"):
        check_metrics({"loss": 1.0})
    with pytest.raises(ValueError, match="must be a number"):
        check_metrics({"actor/x": "high"})
    import torch

    assert check_metrics({"actor/x": torch.tensor(2.0)}) == {"actor/x": 2.0}


def test_resume_drops_rows_logged_after_the_checkpoint(tmp_path):
    log = MetricsLogger(tmp_path, ["jsonl", "tensorboard"])
    for step in (1, 2, 3):
        log.log({"reward/mean": float(step)}, step)
    log.close()
    log = MetricsLogger(tmp_path, ["jsonl", "tensorboard"], resume_step=1)  # killed after step 3, ckpt at 1
    for step in (2, 3):
        log.log({"reward/mean": 10.0 * step}, step)
    log.close()
    assert [(r["step"], r["reward/mean"]) for r in read_jsonl(tmp_path)] == [(1, 1.0), (2, 20.0), (3, 30.0)]
    assert _tb_scalars(tmp_path)["reward/mean"] == [(1, 1.0), (2, 20.0), (3, 30.0)]


def _log_steps(run_dir, steps, prompt_ids=("a", "b")):
    log = MetricsLogger(run_dir, ["jsonl"])
    for step in steps:
        log.log({"reward/mean": float(step)}, step, extra={"prompt_ids": list(prompt_ids)})
    log.close()


def test_a_partial_last_line_is_skipped_on_read_and_dropped_on_resume(tmp_path, capsys):
    """A kill (or a full disk) mid-write leaves half a row: readers skip it with a warning
    naming file:line, and the resumed run neither fails nor glues its next row onto it."""
    _log_steps(tmp_path, (1, 2, 3))
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(path.read_bytes()[:-12])  # row 3 cut mid-line, no newline
    assert [r["step"] for r in read_jsonl(tmp_path)] == [1, 2]
    assert f"warning: {path}:3: invalid JSON" in capsys.readouterr().err
    log = MetricsLogger(tmp_path, ["jsonl"], resume_step=2)  # killed during step 3, checkpoint at 2
    assert f"{path}:3" in capsys.readouterr().err
    log.log({"reward/mean": 30.0}, 3)
    log.close()
    assert [(r["step"], r["reward/mean"]) for r in read_jsonl(tmp_path)] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    assert "warning" not in capsys.readouterr().err
    # without a checkpoint to resume from (resume_step None) the partial line goes too
    path.write_bytes(path.read_bytes() + b'{"step": 4, "rew')
    log = MetricsLogger(tmp_path, ["jsonl"])
    log.log({"reward/mean": 40.0}, 4)
    log.close()
    assert [r["step"] for r in read_jsonl(tmp_path)] == [1, 2, 3, 4]


def test_the_resume_rewrite_is_atomic_on_a_full_disk(tmp_path, small_disk):
    """The rewrite on resume goes to a temporary file that replaces the log only when
    complete: with the disk full, the log keeps every row it had and the error names it."""
    _log_steps(tmp_path, range(1, 41), prompt_ids=[f"id{i}" for i in range(40)])
    path = tmp_path / "metrics.jsonl"
    before = path.read_bytes()
    assert len(before) > 8192
    res = small_disk("from agent_rl.training.metrics import MetricsLogger\n"
                     f"MetricsLogger({str(tmp_path)!r}, ['jsonl'], resume_step=30)\n", 4096)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    assert res.returncode != 0 and "File too large" in res.stderr and f"{path} was not written" in res.stderr


def test_unknown_sink_and_missing_wandb(tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown sink"):
        MetricsLogger(tmp_path, ["jsonl", "mlflow"])
    try:
        import wandb  # noqa: F401
    except ImportError:
        MetricsLogger(tmp_path, ["wandb"]).close()
        assert "not installed" in capsys.readouterr().out


def test_plot_writes_png_of_reward_and_em(tmp_path, capsys):
    log = MetricsLogger(tmp_path, ["jsonl"])
    for step in range(1, 6):
        log.log({"reward/mean": step / 5, "reward/em": step / 10, "val/em": math.nan, "actor/pg_loss": 0.0}, step)
    log.close()
    plot_main([str(tmp_path)])
    png = tmp_path / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_plot_of_a_directory_without_metrics_is_a_clear_error(tmp_path, capsys):
    """`agent-rl-eval plot DIR` on a directory no run wrote (the README's run not made yet): one
    line and exit 2, not a traceback."""
    assert plot_main([str(tmp_path / "no_run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("plot: error: no metrics.jsonl in ") and "a run directory of agent-rl-train" in err


def test_plot_without_reward_metrics_says_so(tmp_path):
    log = MetricsLogger(tmp_path, ["jsonl"])
    log.log({"actor/pg_loss": 0.0}, 1)
    log.close()
    with pytest.raises(ValueError, match="no reward"):
        plot_main([str(tmp_path)])


def test_moving_average_by_hand():
    from agent_rl.evaluation.plot import moving_average

    assert moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert moving_average([1.0, 3.0, 5.0], 1) == [1.0, 3.0, 5.0]
    assert moving_average([2.0, 4.0, 9.0], 5) == [2.0, 3.0, 5.0]


def test_plot_compares_runs_side_by_side(tmp_path, capsys):
    for name, scale in (("a", 1.0), ("b", 0.5)):
        log = MetricsLogger(tmp_path / name, ["jsonl"])
        for step in range(1, 6):
            log.log({"reward/em": scale * step / 5, "rollout/searches_mean": 1.0 + step / 10}, step)
        log.close()
    out = tmp_path / "cmp.png"
    plot_main([f"EM-only={tmp_path / 'a'}", f"format={tmp_path / 'b'}", "--out", str(out),
               "--keys", "reward/em", "rollout/searches_mean", "--smooth", "2"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and str(out) in capsys.readouterr().out
    with pytest.raises(SystemExit):  # comparing needs --out
        plot_main([f"a={tmp_path / 'a'}", f"b={tmp_path / 'b'}"])


def test_rising_rate_warns_when_the_invalid_action_rate_doubles_over_its_running_mean():
    from agent_rl.training.metrics import RisingRate

    w = RisingRate("rollout/invalid_action_rate")
    seen = []
    for step, v in enumerate([0.10, 0.12, 0.08, 0.10, 0.19, 0.25, 0.02], start=1):
        m = {"rollout/invalid_action_rate": v}
        seen.append(w.update(m, step))
    # steps 1-3 build the mean; step 4: 0.10 vs 0.10; step 5: 0.19 < 2 x 0.10; step 6: 0.25 >= 2 x 0.118
    assert seen[:5] == [None] * 5 and seen[6] is None
    assert seen[5] is not None and "step 6" in seen[5] and "0.250" in seen[5] and "0.118" in seen[5]
    assert abs(m["rollout/invalid_action_rate_running_mean"] - sum([0.10, 0.12, 0.08, 0.10, 0.19, 0.25, 0.02]) / 7) < 1e-12
    quiet = RisingRate("rollout/invalid_action_rate")
    assert all(quiet.update({"rollout/invalid_action_rate": v}, i) is None for i, v in enumerate([0.001, 0.001, 0.001, 0.004]))
    assert quiet.update({}, 9) is None  # a step without the key (e.g. direct rollouts)
