"""Config loading: defaults, YAML, dotted overrides, type coercion and errors that name the key."""

import re

import pytest

from agent_rl.config import TrainConfig, load_config, to_dict


def test_defaults_and_overrides(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text(
        "data:\n  train_batch_size: 16\nactor_rollout_ref:\n  actor:\n    optim:\n      lr: 2.0e-6\n"
        "trainer:\n  experiment_name: exp1\n"
    )
    cfg = load_config(
        TrainConfig,
        y,
        [
            "actor_rollout_ref.rollout.n=5",
            "actor_rollout_ref.actor.optim.lr=1e-6",  # override beats YAML
            "retriever.url=[http://a:1/retrieve,http://b:2/retrieve]",
            "algorithm.adv_estimator=gae",
            "max_turns=2",
            "+actor_rollout_ref.actor.use_kl_loss=true",  # Hydra-style '+' accepted
            "actor_rollout_ref.actor.tis_cap=2",
        ],
    )
    assert cfg.data.train_batch_size == 16
    assert cfg.actor_rollout_ref.rollout.n == 5
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-6)
    assert cfg.retriever.url == ["http://a:1/retrieve", "http://b:2/retrieve"]
    assert cfg.algorithm.adv_estimator == "gae"
    assert cfg.max_turns == 2
    assert cfg.actor_rollout_ref.actor.use_kl_loss is True
    assert cfg.actor_rollout_ref.actor.tis_cap == 2.0
    # ${...} interpolation resolved against the final tree
    assert cfg.trainer.default_local_dir == "runs/exp1"
    assert to_dict(cfg)["data"]["train_batch_size"] == 16


def test_unknown_key_is_rejected_with_valid_keys():
    with pytest.raises(ValueError, match=r"actor_rollout_ref.rollout.nn.*valid keys"):
        load_config(TrainConfig, None, ["actor_rollout_ref.rollout.nn=3"])


def test_type_errors_name_the_key():
    with pytest.raises(ValueError, match=r"data.train_batch_size: expected int"):
        load_config(TrainConfig, None, ["data.train_batch_size=abc"])
    with pytest.raises(ValueError, match=r"actor_rollout_ref.actor.use_kl_loss: expected a boolean"):
        load_config(TrainConfig, None, ["actor_rollout_ref.actor.use_kl_loss=maybe"])
    with pytest.raises(ValueError, match="must look like"):
        load_config(TrainConfig, None, ["max_turns"])


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="config file not found"):
        load_config(TrainConfig, tmp_path / "nope.yaml")


def test_yaml_file_bom_crlf_and_undecodable_bytes(tmp_path):
    """A BOM and CRLF line ends read like a plain file; a Latin-1 byte is a ValueError naming
    the file and line (the error every config caller reports), not a UnicodeDecodeError."""
    y = tmp_path / "c.yaml"
    y.write_bytes(b"\xef\xbb\xbfmax_turns: 3\r\ntrainer:\r\n  experiment_name: caf\xc3\xa9\r\n")
    cfg = load_config(TrainConfig, y)
    assert (cfg.max_turns, cfg.trainer.experiment_name) == (3, "café")
    y.write_bytes(b"max_turns: 3\ntrainer:\n  experiment_name: caf\xe9\n")
    with pytest.raises(ValueError, match=r"c\.yaml:3: invalid UTF-8 at byte 23 \(0xe9\)"):
        load_config(TrainConfig, y)


# ----------------------------------------------------------------------------- checks at load (issue 30)
def _bad_value(key: str, allowed=None, rng=None):
    if allowed is not None:
        return "not-a-choice"
    lo, hi, lo_inclusive = rng
    return hi + 1 if hi is not None else (lo - 1 if lo_inclusive else lo)


def _config_class(key: str):
    from agent_rl.config import SFTConfig, TrainConfig
    from agent_rl.config.checks import _get

    return TrainConfig if _get(TrainConfig(), key)[0] else SFTConfig


def test_every_fixed_set_and_range_is_checked_when_the_config_loads():
    """Each key of CHOICES and RANGES gets a bad value: refused at load, the key named."""
    from agent_rl.config import CHOICES, RANGES, ConfigError, load_config

    cases = [(k, _bad_value(k, allowed=v)) for k, v in CHOICES.items()] + \
            [(k, _bad_value(k, rng=v)) for k, v in RANGES.items()]
    for key, bad in cases:
        with pytest.raises(ConfigError, match=rf"{key}={bad!r}"):
            load_config(_config_class(key), None, [f"{key}={bad}"])
    with pytest.raises(ConfigError, match=r"trainer.logger has unknown sink\(s\) \['tensorbord'\]"):
        load_config(TrainConfig, None, ["trainer.logger=[console,tensorbord]"])
    with pytest.raises(ConfigError) as two:  # every problem at once
        load_config(TrainConfig, None, ["reward.kind=exact", "data.train_batch_size=0"])
    assert "reward.kind='exact'" in str(two.value) and "data.train_batch_size=0" in str(two.value)


@pytest.mark.parametrize("q, refused", [(0.0, True), (-0.1, True), (1.5, True), (0.2, False), (1.0, False)])
def test_top_entropy_quantile_is_a_share_of_the_tokens(q, refused):
    """actor.top_entropy_quantile keeps the top q of each response's tokens: q in (0, 1];
    0 would leave no token a policy gradient, and above 1 means nothing."""
    from agent_rl.config import ConfigError, load_config

    key = "actor_rollout_ref.actor.top_entropy_quantile"
    if refused:
        with pytest.raises(ConfigError, match=rf"{key}={q!r} is out of range \(0, 1\]"):
            load_config(TrainConfig, None, [f"{key}={q}"])
    else:
        assert load_config(TrainConfig, None, [f"{key}={q}"]).actor_rollout_ref.actor.top_entropy_quantile == q
    assert TrainConfig().actor_rollout_ref.actor.top_entropy_quantile == 1.0  # off by default


def test_the_fixed_sets_are_the_ones_the_code_uses():
    from agent_rl.config import AGG_MODES, CHOICES, KL_KINDS, SINKS, STRATEGIES
    from agent_rl.training import algos
    from agent_rl.training.algos.kl import _ALIASES
    from agent_rl.training.metrics import SINKS as METRIC_SINKS
    from agent_rl.training.workers.dist import STRATEGIES as DIST_STRATEGIES

    assert set(KL_KINDS) == set(algos.KL_KINDS) | set(_ALIASES) and AGG_MODES == algos.AGG_MODES
    assert STRATEGIES == DIST_STRATEGIES and SINKS == METRIC_SINKS
    assert set(CHOICES["algorithm.kl_ctrl.type"]) == {"fixed", "adaptive"}
    for kind in CHOICES["algorithm.kl_ctrl.type"]:  # each allowed value is one the code takes
        algos.make_kl_controller(type("C", (), {"type": kind, "kl_coef": 0.1, "target_kl": 0.1, "horizon": 10})())
    from agent_rl.config import OptimConfig
    from agent_rl.training.workers.step import lr_factor

    for style in CHOICES["actor_rollout_ref.actor.optim.warmup_style"]:
        lr_factor(3, OptimConfig(warmup_style=style), 10)
    with pytest.raises(ValueError, match="warmup_style"):
        lr_factor(3, OptimConfig(warmup_style="linear"), 10)


def test_train_cli_refuses_bad_settings_in_one_line_before_anything_starts(tmp_path, capsys):
    """A typo costs a second: no Ray, no engine, no traceback (it used to end in a traceback
    after Ray and the engine had started, or as a hub error for a missing model directory)."""
    import time

    from agent_rl.training.cli import main

    (tmp_path / "model").mkdir()
    (tmp_path / "qa.parquet").write_bytes(b"")
    paths = [f"actor_rollout_ref.model.path={tmp_path / 'model'}", f"data.train_files=[{tmp_path / 'qa.parquet'}]",
             f"data.val_files=[{tmp_path / 'qa.parquet'}]"]
    for args, said in ((["algorithm.adv_estimator=grpoo"], "algorithm.adv_estimator='grpoo' is not one of gae, grpo"),
                       (["actor_rollout_ref.actor.policy_loss=clip"], "policy_loss='clip' is not one of rft, vanilla"),
                       (["trainer.resume_mode=resume"], "trainer.resume_mode='resume' is not one of auto, disable"),
                       ([f"actor_rollout_ref.model.path={tmp_path / 'nope'}"], f"{tmp_path / 'nope'} does not exist")):
        t0 = time.monotonic()
        assert main([f"trainer.default_local_dir={tmp_path}", *paths, *args]) == 2
        err = capsys.readouterr().err
        assert time.monotonic() - t0 < 10
        assert err.startswith("agent-rl-train: error: ") and said in err and err.count("\n") == 1, err


def test_secrets_never_reach_a_logger_or_a_saved_config(tmp_path, monkeypatch):
    """retriever.api_key went to W&B with the config and into every checkpoint's config.yaml."""
    import sys
    import types

    import yaml

    from agent_rl.training.checkpoint import CheckpointManager
    from agent_rl.training.metrics import MetricsLogger

    secret = "s3cret-retriever-key"
    cfg = load_config(TrainConfig, None, [f"retriever.api_key={secret}"])
    handed: list[dict] = []
    fake_wandb = types.SimpleNamespace(init=lambda **kw: handed.append(kw["config"]) or types.SimpleNamespace(
        log=lambda *a, **k: None, finish=lambda: None))
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb)
    logger = MetricsLogger(tmp_path / "run", ["jsonl", "wandb"], to_dict(cfg))
    logger.log({"reward/mean": 1.0}, 1)
    logger.close()
    path = CheckpointManager(tmp_path / "run" / "checkpoints").save(1, {}, to_dict(cfg))

    assert len(handed) == 1 and secret not in repr(handed[0])
    assert handed[0]["retriever"]["api_key"] == "<redacted>"  # a key was set: shown as such, never its value
    saved = (path / "config.yaml").read_text()
    assert secret not in saved and yaml.safe_load(saved)["retriever"]["api_key"] == "<redacted>"
    assert not any(secret in p.read_text(errors="replace") for p in (tmp_path / "run").rglob("*") if p.is_file())
    assert cfg.retriever.api_key == secret  # the run itself still sends it
    assert to_dict(cfg)["retriever"]["api_key"] == secret  # the plain dict is the caller's; sinks redact


def test_every_field_that_holds_a_secret_is_redacted():
    """A new key, token or password field must be named in SECRETS, or it would reach the logs."""
    import dataclasses
    import re
    import typing

    from agent_rl.config import SECRETS, SFTConfig, redacted

    def fields(cls, prefix=""):
        for f in dataclasses.fields(cls):
            tp = typing.get_type_hints(cls)[f.name]
            if dataclasses.is_dataclass(tp):
                yield from fields(tp, f"{prefix}{f.name}.")
            else:
                yield f"{prefix}{f.name}"

    looks_secret = re.compile(r"(^|_)(api_key|key|token|password|secret)$")
    for cls in (TrainConfig, SFTConfig):
        secret = {k for k in fields(cls) if looks_secret.search(k.rsplit(".", 1)[-1])}
        assert secret <= set(SECRETS), secret - set(SECRETS)
    assert redacted({"retriever": {"api_key": None}})["retriever"]["api_key"] is None  # nothing set: nothing hidden
    # a proxy URL may carry user:password (retriever.proxy): hidden as a key is
    shown = str(redacted({"retriever": {"proxy": "http://user:hunter2@proxy.example:3128"}}))
    assert "hunter2" not in shown and "proxy" in shown


# ----------------------------------------------------------------------------- NaN, inf, ranges (issue 83 case 9)
def _override(key: str, value: str) -> str:
    """`key=value`; a list item (only optim.betas holds floats) as the whole list."""
    if "[" not in key:
        return f"{key}={value}"
    name, i = key[:-1].split("[")
    items = ["0.9", "0.999"]
    items[int(i)] = value
    return f"{name}=[{','.join(items)}]"


def test_nan_and_inf_are_refused_in_every_float_setting_and_named_in_one_error():
    """Comparisons with NaN are false, so every range check passed it: lr=nan, temperature=nan,
    search_cost=inf and tool_timeout_s=-5 all loaded, and the rewards or weights became nan."""
    from agent_rl.config import ConfigError, SFTConfig

    bad = {"actor_rollout_ref.actor.optim.lr": "nan", "actor_rollout_ref.rollout.temperature": "nan",
           "reward.search_cost": "inf", "actor_rollout_ref.rollout.tool_timeout_s": "-5"}
    with pytest.raises(ConfigError) as refused:
        load_config(TrainConfig, None, [f"{k}={v}" for k, v in bad.items()])
    said = str(refused.value)
    assert all(key in said for key in bad), said
    # every float setting of both configs, ranged or not, list items too
    from agent_rl.config.checks import _settings

    for cls in (TrainConfig, SFTConfig):
        floats = [key for key, value in _settings(cls()) if isinstance(value, float)]
        assert "actor_rollout_ref.actor.optim.betas[1]" in floats
        for key in floats:
            for value in ("nan", ".inf", "-inf"):
                with pytest.raises(ConfigError, match=re.escape(key) + r"=.* is not a finite number"):
                    load_config(cls, None, [_override(key, value)])
    with pytest.raises(ConfigError, match=r"tools\[0\]\.timeout_s=nan is not a finite number"):
        load_config(TrainConfig, None, ["actor_rollout_ref.rollout.tools=[{name: search, timeout_s: .nan}]"])


def test_every_timeout_and_every_reward_term_has_a_range():
    """tool_timeout_s and the format scores had none: -5 or 7.0 loaded."""
    import dataclasses
    import typing

    from agent_rl.config import RANGES

    def leaves(cls, prefix=""):
        for f in dataclasses.fields(cls):
            tp = typing.get_type_hints(cls)[f.name]
            yield from leaves(tp, f"{prefix}{f.name}.") if dataclasses.is_dataclass(tp) else [(f"{prefix}{f.name}", tp)]

    timeouts = [key for key, _ in leaves(TrainConfig) if key.endswith("_s")]
    assert "actor_rollout_ref.rollout.tool_timeout_s" in timeouts and "retriever.timeout_s" in timeouts
    assert not set(timeouts) - set(RANGES), set(timeouts) - set(RANGES)
    scores = [key for key, tp in leaves(TrainConfig) if key.startswith("reward.") and tp is float]
    assert {"reward.format_score", "reward.structure_format_score", "reward.final_format_score",
            "reward.retrieval_score", "reward.search_cost"} <= set(scores)
    assert not set(scores) - set(RANGES), set(scores) - set(RANGES)


# ----------------------------------------------------------------------------- interpolation (issue 83 case 13)
@pytest.mark.timed  # its refusal is bounded in seconds
def test_interpolation_resolves_each_value_once():
    """Each reference was expanded again at every use: 21 references that double took 5.6 s."""
    import time

    from agent_rl.config import ConfigError

    chain = ["+x.v0=ab"] + [f"+x.v{i}=${{x.v{i - 1}}}${{x.v{i - 1}}}" for i in range(1, 22)]
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"x\.v\d+: its references expand to more than \d+ characters"):
        load_config(TrainConfig, None, chain)
    assert time.monotonic() - t0 < 1.0
    cfg = load_config(TrainConfig, None, ["trainer.experiment_name=e", "trainer.validation_data_dir=${trainer.default_local_dir}/v",
                                          "trainer.project_name=${trainer.validation_data_dir}+${data.seed}"])
    assert (cfg.trainer.default_local_dir, cfg.trainer.validation_data_dir) == ("runs/e", "runs/e/v")
    assert cfg.trainer.project_name == "runs/e/v+1"


@pytest.mark.parametrize("override, said", [
    ("trainer.experiment_name=${trainer.nope}", r"trainer.experiment_name: \$\{trainer.nope\} names no setting"),
    ("trainer.experiment_name=${nope.x.y}", r"trainer.experiment_name: \$\{nope.x.y\} names no setting"),
    ("trainer.experiment_name=${data.seed.x}", r"trainer.experiment_name: \$\{data.seed.x\} names no setting"),
    ("trainer.experiment_name=${retriever}", r"trainer.experiment_name: \$\{retriever\} names a section"),
    ("trainer.experiment_name=${trainer.default_local_dir}", r"refers to itself \(trainer.experiment_name -> "
                                                             r"trainer.default_local_dir -> trainer.experiment_name\)"),
], ids=["missing", "missing_section", "through_a_value", "section", "cycle"])
def test_a_bad_reference_is_a_config_error_naming_it(override, said):
    """A missing reference raised a bare KeyError ('nope'), which no command reports in one line."""
    from agent_rl.config import ConfigError

    with pytest.raises(ConfigError, match=said):
        load_config(TrainConfig, None, [override])


def test_a_secret_is_never_copied_by_interpolation_and_redacted_wherever_it_was_written(tmp_path):
    """`trainer.experiment_name=${retriever.api_key}` named the run directory after the key and
    put it, unredacted, in every checkpoint's config.yaml and W&B's run config."""
    from agent_rl.config import REDACTED, ConfigError, redacted
    from agent_rl.training.checkpoint import CheckpointManager

    secret = "s3cret-retriever-key"
    for override in ("trainer.experiment_name=${retriever.api_key}", "trainer.default_local_dir=/r/${retriever.api_key}"):
        with pytest.raises(ConfigError, match=r"\$\{retriever.api_key\} would copy a secret"):
            load_config(TrainConfig, None, [f"retriever.api_key={secret}", override])
    # the value typed twice by hand: hidden in both places
    cfg = load_config(TrainConfig, None, [f"retriever.api_key={secret}", f"trainer.experiment_name=x-{secret}",
                                          f"retriever.url=[http://h/{secret}]"])
    shown = redacted(to_dict(cfg))
    assert secret not in repr(shown)
    assert shown["trainer"]["experiment_name"] == f"x-{REDACTED}" and shown["retriever"]["url"] == [f"http://h/{REDACTED}"]
    path = CheckpointManager(tmp_path / "checkpoints").save(1, {}, to_dict(cfg))
    assert secret not in (path / "config.yaml").read_text()
