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


def test_server_sets_passive_threads_before_faiss_loads():
    """OpenMP reads OMP_WAIT_POLICY once, when faiss loads it: the CLI module must not import
    faiss (or torch) before main() has set it."""
    from fresh import run_fresh

    out = run_fresh("import os, sys; os.environ.pop('OMP_WAIT_POLICY', None); import retriever_server.cli as c; "
                    "assert 'faiss' not in sys.modules and 'torch' not in sys.modules; "
                    "rc = c.main(['--index', '/nonexistent', '--corpus', '/nonexistent', '--port', '0']); "
                    "print(os.environ.get('OMP_WAIT_POLICY'))")
    assert out.stdout.strip().splitlines()[-1] == "PASSIVE", out.stdout + out.stderr


def test_a_bm25_server_names_torch_unused_and_a_dense_or_unreadable_one_asks_torch(tmp_path):
    """The hardware line asks torch only where the server may load it (cli.uses_torch)."""
    import json

    from retriever_server.cli import uses_torch

    for name, kind in (("bm25", "bm25"), ("flat", "flat")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "meta.json").write_text(json.dumps({"kind": kind}))
    corpus = tmp_path / "c.jsonl"

    def settings(*dirs: str, kind: str = "auto") -> Settings:
        return Settings(index=[str(tmp_path / d) for d in dirs], corpus=str(corpus), kind=kind)

    assert not uses_torch(settings("bm25")) and not uses_torch(settings("flat", "bm25", kind="bm25"))
    assert uses_torch(settings("flat")) and uses_torch(settings("flat", "bm25"))
    assert uses_torch(settings("missing"))  # loading it says what is wrong, with the full line


def test_mmap_index_is_the_default_and_can_be_turned_off():
    from retriever_server.cli import build_parser

    assert Settings().mmap_index is True
    args = vars(build_parser().parse_args(["--no-mmap-index"]))
    assert args["mmap_index"] is False and load_settings(None, mmap_index=args["mmap_index"]).mmap_index is False


def test_a_non_loopback_bind_needs_a_key_or_an_explicit_yes(tmp_path, capsys, monkeypatch):
    """Issue 30: the retriever served any host without an API key."""
    monkeypatch.delenv("RETRIEVER_API_KEY", raising=False)
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert Settings(host=host).host == host
    for host in ("0.0.0.0", "::", "10.1.2.3", "retriever.internal"):
        with pytest.raises(ValidationError, match="not a loopback address and no API key"):
            Settings(host=host)
    assert Settings(host="0.0.0.0", api_key="k").api_key == "k"
    key = tmp_path / "key"
    key.write_text("from-a-file\n")
    assert Settings(host="0.0.0.0", api_key_file=str(key)).api_key == "from-a-file"
    assert Settings(host="0.0.0.0", allow_no_key=True).api_key is None
    (tmp_path / "empty").write_text("")
    with pytest.raises(ValidationError, match="the file is empty"):
        Settings(api_key_file=str(tmp_path / "empty"))
    assert main(["--index", "x", "--corpus", "y", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("agent-rl-retriever: bad settings: host '0.0.0.0' is not a loopback") and "\n" not in err


@pytest.mark.parametrize("bind,allowed,answered,refused", [
    ("127.0.0.1", None, ["localhost", "LocalHost.:8000", "127.0.0.1:8000", "127.0.0.2", "[::1]:1"],
     ["rebind.example", "rebind.example:8000", "0.0.0.0", "10.0.0.5", "", None]),
    ("localhost", ["retriever.lan"], ["localhost", "127.0.0.1", "retriever.lan:8000", "RETRIEVER.LAN"],
     ["rebind.example", "lan", None]),
    ("0.0.0.0", None, ["rebind.example", "10.0.0.5:8000", "", None], []),
    ("::", None, ["anything.example"], []),
    ("0.0.0.0", ["retriever.lan"], ["retriever.lan", "localhost:1", "127.0.0.1"], ["rebind.example", "10.0.0.5", None]),
    ("10.0.0.5", None, ["10.0.0.5:8000"], ["localhost", "127.0.0.1", "rebind.example"]),
    ("10.0.0.5", ["*"], ["rebind.example", None], []),
])
def test_host_header_checked_against_the_bind_address_and_allowed_hosts(bind, allowed, answered, refused):
    """Issue 83 case 12: loopback names on a loopback bind, the bind address's own name, the
    listed names; any host on 0.0.0.0 / :: unless a list is set. The port is not checked."""
    from retriever_server.settings import host_allowed

    s = Settings(host=bind, allowed_hosts=allowed, allow_no_key=True)
    assert [h for h in answered if not host_allowed(s, h)] == []
    assert [h for h in refused if host_allowed(s, h)] == []


def test_cli_takes_allowed_hosts():
    from retriever_server.cli import build_parser

    args = vars(build_parser().parse_args(["--allowed-host", "a.lan", "--allowed-host", "B.lan."]))
    args.pop("config"), args.pop("parent_pid")
    assert load_settings(None, **args).allowed_hosts == ["a.lan", "b.lan"]


def test_header_limits_are_settings_with_flags_in_help(capsys):
    """header_timeout_s, max_header_bytes and max_headers (issue 100 cases 6-7): defaults,
    overrides, refusal of values that would disable them, and the CLI's flags in --help."""
    from retriever_server.cli import build_parser

    d = Settings()
    assert (d.header_timeout_s, d.max_header_bytes, d.max_headers) == (10.0, 16384, 100)
    s = load_settings(None, header_timeout_s=2.5, max_header_bytes=4096, max_headers=20)
    assert (s.header_timeout_s, s.max_header_bytes, s.max_headers) == (2.5, 4096, 20)
    for bad in ({"header_timeout_s": 0}, {"header_timeout_s": float("nan")}, {"max_header_bytes": 0},
                {"max_headers": 0}):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            Settings(**bad)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for flag in ("--header-timeout-s", "--max-header-bytes", "--max-headers"):
        assert flag in help_text
    assert "before the API key is checked" in help_text
    args = vars(build_parser().parse_args(["--header-timeout-s", "3", "--max-header-bytes", "8192",
                                           "--max-headers", "50"]))
    assert (args["header_timeout_s"], args["max_header_bytes"], args["max_headers"]) == (3.0, 8192, 50)
