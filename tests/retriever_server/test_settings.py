"""Settings: YAML + overrides, validation, and the CLI's refusal of bad settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from retriever_server.cli import main
from retriever_server.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]


def test_default_yaml_matches_the_defaults():
    s = load_settings(ROOT / "configs" / "retriever" / "default.yaml")
    assert s == Settings()
    assert (s.host, s.port, s.topk, s.max_topk, s.max_queries, s.cache_size) == ("127.0.0.1", 8000, 3, 100, 512, 10000)


def test_overrides_win_and_none_is_ignored(tmp_path):
    cfg = tmp_path / "r.yaml"
    cfg.write_text("topk: 5\nmax_batch_size: 16\nindex: some/dir\n")
    s = load_settings(cfg, topk=7, port=None, corpus="c.jsonl")
    assert (s.topk, s.max_batch_size, s.index, s.corpus, s.port) == (7, 16, ["some/dir"], "c.jsonl", 8000)


@pytest.mark.parametrize("bad", [{"topk": 0}, {"topk": 200}, {"max_queries": 0}, {"kind": "vector"},
                                 {"unknown_knob": 1}, {"max_wait_ms": -1}])
def test_invalid_settings_are_refused(bad):
    with pytest.raises(ValidationError):
        Settings(**bad)


def test_cli_refuses_bad_settings_and_missing_paths(tmp_path, capsys):
    assert main(["--topk", "0", "--index", "x", "--corpus", "y"]) == 2
    assert "bad settings" in capsys.readouterr().err
    assert main([]) == 2
    assert "--index and --corpus are required" in capsys.readouterr().err
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    assert main(["--config", str(tmp_path / "list.yaml")]) == 2
    assert "expected a mapping" in capsys.readouterr().err
    (tmp_path / "latin1.yaml").write_bytes(b"# r\xe9glages\ntopk: 5\n")
    assert main(["--config", str(tmp_path / "latin1.yaml")]) == 2
    assert "latin1.yaml:1: invalid UTF-8 at byte 4 (0xe9)" in capsys.readouterr().err
