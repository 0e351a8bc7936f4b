"""Policy models in and out: load an HF directory (optionally with LoRA adapters via peft),
export HF-named (merged) weights for the rollout engine, save an HF directory that
transformers and vLLM load, and restore it.

With LoRA the trainable model is a `peft.PeftModel` around the HF model; everything else in
the workers goes through `causal_lm(model)` / `decoder(model)` so both cases share one path.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from agent_rl.training.workers.forward import register_varlen_attention

_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
    "generation_config.json",
)
ADAPTER_DIR = "adapter"
"""Sub-directory of a saved policy holding the peft adapter (LoRA runs only)."""


def default_attn_implementation() -> str:
    """flash-attention-2 on GPUs that have it, otherwise the packed SDPA of `forward.py`."""
    if torch.cuda.is_available():
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            pass
    return register_varlen_attention()


DUMMY_SEED = 0
"""The seed of `load_policy`'s random weights (load_format dummy)."""


def load_policy(
    path: str | Path,
    dtype: str = "float32",
    lora_rank: int = 0,
    lora_alpha: int = 32,
    target_modules: list[str] | None = None,
    gradient_checkpointing: bool = False,
    load_format: str = "auto",
) -> nn.Module:
    """An HF causal LM from `path`, wrapped with LoRA adapters when `lora_rank > 0`.

    With LoRA only the adapters require grad (the base is frozen, which is what lets the
    reference policy be the same module with adapters disabled). `load_format` dummy: the
    architecture of `path`'s config.json with random weights seeded by DUMMY_SEED (every load
    the same: the reference policy equals the policy's start), no weight files read.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"load_policy: {path} is not an HF model directory (no config.json)")
    if load_format == "dummy":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(DUMMY_SEED)
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=getattr(torch, dtype),
                                                     attn_implementation=default_attn_implementation())
    else:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype), attn_implementation=default_attn_implementation()
        )
    model.config.use_cache = False
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora_rank > 0:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=lora_rank, lora_alpha=lora_alpha, target_modules=list(target_modules or []),
            lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora)
    model.train()
    return model


def is_lora(model: nn.Module) -> bool:
    """A peft-wrapped model. Without peft loaded no model can be one, so the question does not
    import it (0.3-0.4 s of every full-weight actor's start)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def causal_lm(model: nn.Module) -> nn.Module:
    """The HF `*ForCausalLM` module (inside the peft wrapper when there is one)."""
    return model.get_base_model() if is_lora(model) else model


def decoder(model: nn.Module) -> nn.Module:
    """The transformer trunk (returns hidden states, not logits)."""
    return causal_lm(model).get_decoder()


def lm_head_weight(model: nn.Module) -> torch.Tensor:
    return causal_lm(model).get_output_embeddings().weight


def load_reference(path: str | Path, dtype: str, linear_dtype: torch.dtype, load_format: str = "auto") -> nn.Module:
    """A gradient-free policy from `path` for reference log-probs (full fine-tuning).

    Linear weights are stored in `linear_dtype`: with bf16 autocast the policy's matmuls see
    exactly these bf16 values, so this is as accurate as the policy's own forward at about
    half the memory. Embeddings (tied to the lm_head here) and norms keep `dtype`.
    """
    ref = load_policy(path, dtype, load_format=load_format).eval().requires_grad_(False)
    embed = ref.get_input_embeddings().weight
    for mod in ref.modules():
        if isinstance(mod, nn.Linear) and mod.weight is not embed:
            mod.to(linear_dtype)
    return ref


# ----------------------------------------------------------------------------- export
def _lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    from peft.tuners.lora import LoraLayer

    return {name: mod for name, mod in causal_lm(model).named_modules() if isinstance(mod, LoraLayer)}


@torch.no_grad()
def named_weights(model: nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) as in the model's own checkpoint; LoRA deltas merged in.

    Merging is functional (W + scale * B @ A computed per layer), so the trainable model is
    never modified and no merge/unmerge round-off accumulates. A tied lm_head is skipped, as
    in the HF checkpoint (the engine re-ties it to the embedding).
    """
    lm = causal_lm(model)
    lora = _lora_layers(model) if is_lora(model) else {}
    skip = tied_head_names(model)
    for name, tensor in lm.state_dict(keep_vars=True).items():
        if ".lora_" in name or name in skip:
            continue
        hf_name = name.replace(".base_layer.", ".")
        out = tensor.detach()
        owner = hf_name.rsplit(".", 1)[0]
        if owner in lora and name.endswith(".base_layer.weight"):
            layer = lora[owner]
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    out = out + layer.get_delta_weight(adapter).to(out.dtype)
        if hasattr(out, "full_tensor"):  # FSDP2 DTensor shard -> full tensor (collective)
            out = out.full_tensor()
        yield hf_name, (out.to(dtype) if dtype is not None else out)


def save_hf(model: nn.Module, out_dir: str | Path, source_dir: str | Path,
            weights: dict[str, torch.Tensor] | None = None) -> Path:
    """Write `model` (LoRA merged) as an HF directory: config, safetensors, tokenizer files.

    `source_dir` is where tokenizer / chat-template / generation-config files are copied from.
    `weights` (HF names) replaces `named_weights(model)`, e.g. a gathered FSDP state.
    For LoRA runs the adapter is saved too, under `ADAPTER_DIR`, for resuming.
    """
    from huggingface_hub import save_torch_state_dict

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lm = causal_lm(model)
    named = weights.items() if weights is not None else named_weights(model)
    state = {k: v.contiguous().cpu() for k, v in named}
    save_torch_state_dict(state, out_dir)
    lm.config.save_pretrained(out_dir)
    # training turns the KV cache off; the saved model is for generation
    config = json.loads((out_dir / "config.json").read_text())
    config["use_cache"] = True
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for name in _TOKENIZER_FILES:
        src = Path(source_dir) / name
        if src.is_file():
            shutil.copy2(src, out_dir / name)
    if is_lora(model):
        model.save_pretrained(out_dir / ADAPTER_DIR)
    return out_dir


def read_hf_weights(hf_dir: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of the *.safetensors files of an HF directory, by name."""
    from safetensors.torch import load_file

    files = sorted(Path(hf_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {hf_dir}")
    loaded: dict[str, torch.Tensor] = {}
    for f in files:
        loaded.update(load_file(f))
    return loaded


def tied_head_names(model: nn.Module) -> set[str]:
    """State-dict names of an lm_head tied to the input embedding (absent from checkpoints)."""
    lm = causal_lm(model)
    if not getattr(lm.config, "tie_word_embeddings", False):
        return set()
    head = lm.get_output_embeddings()
    return {f"{n}.weight" for n, m in lm.named_modules() if m is head}


@torch.no_grad()
def load_hf_weights(model: nn.Module, hf_dir: str | Path) -> None:
    """Restore what `save_hf` wrote: the adapter for LoRA, all weights otherwise.

    Names and shapes are checked first; a mismatch raises before anything is copied.
    """
    hf_dir = Path(hf_dir)
    if is_lora(model):
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        adapter = hf_dir / ADAPTER_DIR
        if not adapter.is_dir():
            raise FileNotFoundError(f"load_hf_weights: LoRA model but {adapter} does not exist")
        result = set_peft_model_state_dict(model, load_peft_weights(str(adapter)))
        bad = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
        if bad:
            raise ValueError(f"load_hf_weights: adapter in {adapter} has unexpected keys {bad[:5]}")
        return
    loaded = read_hf_weights(hf_dir)
    params = dict(named_weights(model))
    missing = sorted(set(params) - set(loaded))
    unexpected = sorted(set(loaded) - set(params))
    wrong = [k for k in params.keys() & loaded.keys() if params[k].shape != loaded[k].shape]
    if missing or unexpected or wrong:
        raise ValueError(
            f"load_hf_weights: {hf_dir} does not match the model: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}, wrong shape {wrong[:5]}"
        )
    for k, v in params.items():
        v.copy_(loaded[k])


def truncated_copy(src: str | Path, dst: str | Path, num_layers: int) -> Path:
    """HF directory with the first `num_layers` blocks of `src` (real weights, same
    tokenizer): a small model of the same architecture for fast tests and smoke runs."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging

    config = AutoConfig.from_pretrained(src)
    config.num_hidden_layers = num_layers
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # the dropped layers are reported as "unexpected" keys
    try:
        model = AutoModelForCausalLM.from_pretrained(src, config=config, dtype=torch.float32)
    finally:
        logging.set_verbosity(verbosity)
    return save_hf(model, dst, src)


SHAPES: dict[str, dict] = {
    "qwen2.5-3b": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=2048,
                       intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                       max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False),
    "tiny-qwen2": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=512, intermediate_size=1376,
                       num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=1, max_position_embeddings=4096,
                       rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu",
                       use_sliding_window=False),
}
"""Architectures a policy can take without its weights (`shaped_copy`): Qwen2.5-3B's (its
config.json on the Hub: hidden 2048, 36 layers, 16 query and 2 KV heads, MLP 11008, tied
embeddings) and a tiny one of the same kind and head ratio (8:1 query to KV heads, head size 64
as vLLM's CPU attention takes) for the CPU."""


def shaped_copy(src: str | Path, dst: str | Path, shape: str) -> Path:
    """HF directory with `src`'s tokenizer (its vocabulary, special tokens and chat template) and
    the architecture SHAPES[`shape`], no weights: load it with `load_format` dummy (engine and
    trainer make their random weights where they run). The vocabulary is the tokenizer's, not
    the shape's own (Qwen2.5-3B's 151,936 rows: 2.9B parameters here against its 3.1B)."""
    from transformers import AutoConfig

    if shape not in SHAPES:
        raise ValueError(f"shaped_copy: shape {shape!r} unknown; known: {sorted(SHAPES)}")
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        # not src's weights, config or provenance (source.json): this directory is another model
        if f.is_file() and f.name not in ("config.json", "source.json") and f.suffix not in (".safetensors", ".bin", ".pt", ".onnx"):
            shutil.copy2(f, dst / f.name)
    base = json.loads((src / "config.json").read_text())
    tokens = {k: base[k] for k in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id") if k in base}
    config = AutoConfig.for_model(**{**SHAPES[shape], **tokens})
    config.save_pretrained(dst)
    return dst


def random_copy(src: str | Path, dst: str | Path, seed: int = 0, num_layers: int | None = None) -> Path:
    """HF directory with `src`'s architecture (its config.json, optionally `num_layers` blocks)
    and tokenizer, and seeded random weights (the model's own initialisation). For checks that
    depend on shapes and kernels, not on what the model knows: speed, memory and precision
    agreement on a machine the real weights cannot travel to (scripts/gpu_check.sh)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(src)
    if num_layers is not None:
        config.num_hidden_layers = num_layers
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return save_hf(model, dst, src)
