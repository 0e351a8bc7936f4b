"""Rollout fixtures: real vLLM engines on the embedded model, a transformers reference, a tiny
real retriever server. All session-scoped (an engine loads in ~20 s).

The engine lives in one asyncio loop running in a background thread for the whole session
(no pytest-asyncio needed); tests submit coroutines with `aio(coro)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from loop_thread import LoopThread

MAX_MODEL_LEN = 2048


@pytest.fixture(scope="session")
def aio():
    lt = LoopThread()
    yield lt
    lt.close()


def _make_engine(aio: LoopThread, model_dir: Path, dtype: str):
    from agent_rl.config import RolloutConfig
    from agent_rl.rollout.engine import RolloutEngine

    cfg = RolloutConfig(dtype=dtype, max_num_seqs=32, kv_cache_space_gb=1, seed=0)
    return aio(RolloutEngine.create(str(model_dir), cfg, max_model_len=MAX_MODEL_LEN), timeout=600)


@pytest.fixture(scope="session")
def engine(aio, model_dir):
    """fp32 engine: its logprobs equal an fp32 transformers pass (exactness tests)."""
    eng = _make_engine(aio, model_dir, "float32")
    yield eng
    aio(eng.shutdown())


@pytest.fixture(scope="session")
def engine_bf16(aio, model_dir):
    """bf16 engine (the CPU default for speed): only for the logprob-agreement figure."""
    eng = _make_engine(aio, model_dir, "bfloat16")
    yield eng
    aio(eng.shutdown())


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="session")
def hf_model(model_dir):
    """fp32 transformers model: the reference forward pass."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    m.eval()
    return m


def _hf_logprobs(model: Any, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0) -> list[float]:
    """log p(response_ids[i] | prompt + response[:i]) from one fp32 forward pass, under
    softmax(logits / temperature)."""
    import torch

    ids = list(prompt_ids) + list(response_ids)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits / temperature, -1)
    p = len(prompt_ids)
    return [lp[p + i - 1, t].item() for i, t in enumerate(response_ids)]


@pytest.fixture(scope="session")
def hf_logprobs():
    """`(model, prompt_ids, response_ids) -> logprobs`: the transformers reference scorer."""
    return _hf_logprobs


def _serve(kb: Path, index_dir: Path, kind: str):
    """Build a `kind` index of the KB and run a real retriever server over it; yields its URL."""
    try:
        from data_prep.indexing import build_index
        from retriever_server.launch import start_server, stop_server, wait_healthy
    except ImportError as e:
        pytest.skip(f"retriever server not available yet: {e}")
    build_index(kb / "corpus.jsonl", index_dir, kind=kind, progress=False)
    proc, base_url = start_server(index_dir, kb / "corpus.jsonl")
    try:
        wait_healthy(base_url, timeout=300, proc=proc)
        yield base_url
    finally:
        stop_server(proc)


@pytest.fixture(scope="session")
def retriever_url(tiny_kb, tmp_path_factory):
    """A real retriever server (BM25 index over the tiny KB) in its own process."""
    yield from _serve(tiny_kb, tmp_path_factory.mktemp("index") / "bm25", "bm25")


@pytest.fixture(scope="session")
def dense_retriever_url(tiny_kb, tmp_path_factory):
    """A real retriever server over a flat FAISS index of the tiny KB (the encoder path too)."""
    yield from _serve(tiny_kb, tmp_path_factory.mktemp("index") / "flat", "flat")


# ----------------------------------------------------------------------------- a policy that searches
SEARCH_TURN = " <search> birth year </search>"
"""What `searching_policy` writes as its first turn, whatever the question."""


@pytest.fixture(scope="session")
def searching_policy(tiny_policy, tiny_kb, tmp_path_factory) -> Path:
    """tiny_policy taught to open every answer with SEARCH_TURN (a few AdamW steps on the tiny
    KB's train questions in the trainer's prompt, the search_r1 protocol's chat template): a
    2-block model whose rollouts search on every prompt, for runs whose subject is what the
    trainer does with searches (the untrained model searches only with few-shot prompts on the
    full model). Checked here: greedy decoding writes the turn for held-out questions."""
    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_rl.rollout.protocol import get_protocol
    from agent_rl.training.workers import model_io

    tok = AutoTokenizer.from_pretrained(tiny_policy)
    model = AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=torch.float32)
    protocol = get_protocol("search_r1")
    target = tok.encode(SEARCH_TURN, add_special_tokens=False)
    prompts = [protocol.prompt_ids(tok, q) for q in pd.read_parquet(tiny_kb / "train.parquet").question[:8]]
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(8):
        loss = 0.0
        for p in prompts[step % 2 * 4:step % 2 * 4 + 4]:  # logits for the target's positions only
            logits = model(torch.tensor([p + target]), logits_to_keep=len(target) + 1).logits[0, :-1]
            loss = loss + torch.nn.functional.cross_entropy(logits, torch.tensor(target)) / 4
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    for q in pd.read_parquet(tiny_kb / "test.parquet").question[:2]:
        p = protocol.prompt_ids(tok, q)
        with torch.no_grad():
            out = model.generate(torch.tensor([p]), max_new_tokens=len(target), do_sample=False,
                                 pad_token_id=tok.eos_token_id)
        assert tok.decode(out[0, len(p):]) == SEARCH_TURN, (tok.decode(out[0, len(p):]), float(loss))
    return model_io.save_hf(model, tmp_path_factory.mktemp("searching_policy") / "model", tiny_policy)


# ----------------------------------------------------------------------------- few-shot prompts
FEW_SHOT = [
    ("In which city was Tomas Verlin born?", "Tomas Verlin", "Tomas Verlin was born in Kradholt in 1901.", "Kradholt"),
    ("Who founded Brelmar Labs?", "Brelmar Labs", "Brelmar Labs was founded by Ana Quist in 1950.", "Ana Quist"),
    ("When was Soreth Press founded?", "Soreth Press", "Soreth Press is a publishing house founded in 1820.", "1820"),
]


def _few_shot_prompt(question: str) -> str:
    """Examples in the exact observation format make even the untrained model search."""
    from agent_rl.rollout import observation as O

    shots = "".join(
        f"Question: {q}\n<search> {s} </search>{O.format_observation(f'Doc 1(Title: {s}) {d}')}<answer> {a} </answer>\n\n"
        for q, s, d, a in FEW_SHOT
    )
    return shots + f"Question: {question}\n"


@pytest.fixture(scope="session")
def few_shot_examples() -> list[tuple[str, str, str, str]]:
    """(question, search query, passage, answer) examples for steering the untrained model."""
    return FEW_SHOT


@pytest.fixture(scope="session")
def few_shot_prompt():
    """question -> a prompt whose examples make the untrained 135M model search."""
    return _few_shot_prompt
