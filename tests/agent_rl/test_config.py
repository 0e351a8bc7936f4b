"""Config loading: defaults, YAML, dotted overrides, type coercion and errors that name the key."""

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
