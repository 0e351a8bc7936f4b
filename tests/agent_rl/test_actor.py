"""ActorWorker on the real embedded model.

Exactness checks that only run forward passes use the full 30-layer model. Checks that need
gradients or updates use `tiny_policy`: a copy of the real model truncated to its first 2
blocks (real config and weights, `model_io.truncated_copy`), which keeps this file to about a
minute on 2 cores. Gradient comparisons run in fp32 (bf16_autocast=False) so that only
summation order differs.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math

import pytest
import torch

from agent_rl.config import ActorRolloutRefConfig, TrainConfig, load_config
from agent_rl.training.algos import agg_loss, entropy_from_logits, entropy_mask, get_policy_loss, kl_loss, ppo_policy_loss
from agent_rl.training.batch import TokenBatch
from agent_rl.training.workers import forward as fw
from agent_rl.training.workers.actor import ActorWorker
from agent_rl.training.workers.step import Normalizers, combine_metrics
from agent_rl.types import Trajectory


# ----------------------------------------------------------------------------- helpers
def make_trajs(n: int = 6, seed: int = 0, max_len: int = 40) -> list[Trajectory]:
    """Random-token trajectories with an observation span (loss_mask 0) in most responses."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = int(torch.randint(4, 20, (1,), generator=g))
        r = int(torch.randint(6, max_len, (1,), generator=g))
        mask = [1] * r
        if i % 3 != 2:
            start = int(torch.randint(1, r - 3, (1,), generator=g))
            for j in range(start, min(r - 1, start + 4)):
                mask[j] = 0
        ids = torch.randint(3, 49000, (p + r,), generator=g).tolist()
        out.append(Trajectory(prompt_ids=ids[:p], response_ids=ids[p:], loss_mask=mask,
                              rollout_logprobs=[-1.0 * m for m in mask], reward=float(i % 2), group_id=i // 2))
    return out


def shared_head_trajs(n: int = 6, head: int = 12, seed: int = 0) -> list[Trajectory]:
    """`make_trajs` whose prompts all start with the same `head` tokens (a system prompt), and
    whose first two share the whole prompt (a GRPO group)."""
    g = torch.Generator().manual_seed(seed + 100)
    common = torch.randint(3, 49000, (head,), generator=g).tolist()
    out = []
    for t in make_trajs(n, seed=seed):
        out.append(dataclasses.replace(t, prompt_ids=common + t.prompt_ids))
    if n > 1:
        out[1] = dataclasses.replace(out[1], prompt_ids=list(out[0].prompt_ids))
    return out


def make_cfg(path, lora_rank: int = 0, **actor) -> ActorRolloutRefConfig:
    cfg = ActorRolloutRefConfig()
    cfg.model.path = str(path)
    cfg.model.lora_rank = lora_rank
    cfg.model.lora_alpha = 8
    cfg.rollout.n = 2
    cfg.actor.ppo_mini_batch_size = 4
    cfg.actor.bf16_autocast = False
    cfg.actor.optim.lr = 1e-3
    cfg.actor.optim.weight_decay = 0.0
    for k, v in actor.items():
        setattr(cfg.actor, k, v)
    return cfg


def rl_batch(worker: ActorWorker, trajs: list[Trajectory], seed: int = 1) -> TokenBatch:
    b = TokenBatch.from_trajectories(trajs)
    g = torch.Generator().manual_seed(seed)
    adv = torch.randn(len(b), 1, generator=g).expand_as(b.loss_mask) * b.response_valid_mask()
    old = worker.compute_log_probs(b)
    ref = old + 0.05 * torch.randn(old.shape, generator=g) * b.response_valid_mask()
    rollout = (old + 0.05 * torch.randn(old.shape, generator=g)) * b.loss_mask  # 0 where not sampled
    return b.with_fields(advantages=adv.contiguous(), old_logprobs=old, ref_logprobs=ref, rollout_logprobs=rollout)


def grads(worker: ActorWorker, batch: TokenBatch, loss_fn=None) -> torch.Tensor:
    """This batch's accumulated gradient (one flat fp32 vector), without an optimizer step."""
    loss_fn = loss_fn or functools.partial(worker._ppo_loss, reuse_old=False)
    worker.optim.optimizer.zero_grad(set_to_none=True)
    worker._backward(batch, loss_fn)
    flat = torch.cat([p.grad.flatten() for p in worker.optim.params])
    worker.optim.optimizer.zero_grad(set_to_none=True)
    return flat


# Two fp32 computations of the same log-probs (packed varlen attention + chunked head vs a plain
# transformers forward) sum in different orders, and the order depends on the CPU's kernels
# (AVX-512 vs AVX2 tile sizes): on an AVX2 EPYC a value near -21 came out -21.0836 vs -21.0835.
# The error grows with the magnitude (logit - logsumexp, both ~|20-40|), so the tolerance is
# relative: 1e-5 of the value plus 1e-5 absolute. A real mismatch (other weights, a missed
# update, a wrong token) moves log-probs by 1e-3 or more.
LOGP_TOL = dict(atol=1e-5, rtol=1e-5)


def close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-4) -> bool:
    return bool((a - b).norm() <= rtol * b.norm())


def hf_logprobs(model, batch: TokenBatch, temperature: float = 1.0) -> list[torch.Tensor]:
    """Reference: one plain transformers forward per sequence, log-softmax over the vocab
    of the logits divided by `temperature`."""
    out = []
    with torch.no_grad():
        for i in range(len(batch)):
            n, p = int(batch.seq_lens[i]), int(batch.prompt_lens[i])
            ids = batch.input_ids[i : i + 1, :n]
            lp = torch.log_softmax(model(ids).logits[0].float() / temperature, -1)
            out.append(lp[p - 1 : n - 1].gather(1, ids[0, p:n, None]).squeeze(1))
    return out


@pytest.fixture(scope="module")
def tiny_worker(tiny_policy):
    """Shared fp32 worker for gradient-only tests (they leave no gradients behind)."""
    return ActorWorker(make_cfg(tiny_policy, use_kl_loss=True, entropy_coeff=0.01, tis_cap=2.0), total_steps=4)


# ----------------------------------------------------------------------------- log-probs
@pytest.mark.parametrize("keep_bytes", [1 << 30, 0], ids=["keep-logits", "recompute-logits"])
def test_fused_logprob_and_entropy_gradients(monkeypatch, keep_bytes):
    monkeypatch.setattr(fw, "KEEP_LOGITS_BYTES", keep_bytes)
    monkeypatch.setattr(fw, "LOGIT_CHUNK", 3)  # several chunks on a tiny problem
    g = torch.Generator().manual_seed(0)
    h = torch.randn(7, 5, dtype=torch.double, generator=g, requires_grad=True)
    w = torch.randn(11, 5, dtype=torch.double, generator=g, requires_grad=True)
    t = torch.randint(0, 11, (7,), generator=g)

    def f(h, w):
        lp, ent = fw.token_logprobs(h, w, t, torch.double, with_entropy=True)
        return 1.3 * lp + 0.7 * ent

    assert torch.autograd.gradcheck(f, (h, w))
    # log-prob gradient alone (the entropy term skipped in backward)
    assert torch.autograd.gradcheck(lambda h, w: fw.token_logprobs(h, w, t, torch.double, True)[0], (h, w))
    lp, ent = fw.token_logprobs(h, w, t, torch.double, with_entropy=True)
    ref = torch.log_softmax(h @ w.T, -1)
    assert torch.allclose(lp, ref.gather(1, t[:, None]).squeeze(1))
    assert torch.allclose(ent, -(ref.exp() * ref).sum(-1))


@pytest.mark.parametrize("fallback", [True, False], ids=["aten-layout", "plain-layout"])
@pytest.mark.parametrize("keep_bytes", [1 << 30, 0], ids=["keep-logits", "recompute-logits"])
def test_bf16_logprob_gradients_match_the_fp64_reference(monkeypatch, keep_bytes, fallback):
    """The bf16 backward gives fp64 autograd's gradients within bf16 rounding, with its CPU
    matmuls laid out for ATen's fallback kernels (reduced dimension contiguous in both
    operands: hosts without oneDNN bf16) and in the plain layout (oneDNN's hosts)."""
    monkeypatch.setattr(fw, "_cpu_low_precision_fallback", lambda dtype: fallback)
    monkeypatch.setattr(fw, "KEEP_LOGITS_BYTES", keep_bytes)
    monkeypatch.setattr(fw, "LOGIT_CHUNK", 3)
    g = torch.Generator().manual_seed(1)
    h = torch.randn(7, 16, generator=g, requires_grad=True)
    w = torch.randn(50, 16, generator=g, requires_grad=True)
    t = torch.randint(0, 50, (7,), generator=g)
    lp, ent = fw.token_logprobs(h, w, t, torch.bfloat16, with_entropy=True)
    (1.3 * lp + 0.7 * ent).sum().backward()
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = torch.log_softmax(h64 @ w64.T, -1)
    (1.3 * ref.gather(1, t[:, None]).squeeze(1) - 0.7 * (ref.exp() * ref).sum(-1)).sum().backward()
    for got, want in ((h.grad, h64.grad), (w.grad, w64.grad)):
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert (got.double() - want).abs().max() <= 0.03 * want.abs().max(), (got, want)


@pytest.fixture(scope="module")
def plain_model(model_dir):
    """The full model through plain transformers (default attention), fp32."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def full_worker(model_dir):
    return ActorWorker(make_cfg(model_dir), total_steps=1)


def test_log_probs_equal_plain_transformers(full_worker, plain_model):
    """Packing (any grouping) and the chunked head give a plain fp32 forward's log-probs."""
    batch = TokenBatch.from_trajectories(make_trajs(3, seed=3, max_len=40))
    ref = hf_logprobs(plain_model, batch)
    full_worker.cfg.ref.log_prob_max_token_len_per_gpu = 10_000  # all sequences in one row
    packed = full_worker.compute_log_probs(batch)
    full_worker.cfg.ref.log_prob_max_token_len_per_gpu = 1  # one sequence per forward
    alone = full_worker.compute_log_probs(batch)
    for i, r in enumerate(ref):
        n = len(r)
        assert torch.allclose(packed[i, :n], r, **LOGP_TOL), (packed[i, :n] - r).abs().max()
        assert torch.allclose(alone[i, :n], r, **LOGP_TOL)
        assert (packed[i, n:] == 0).all()
    # the reference model (a frozen fp32 copy here) starts equal to the policy, on the same
    # micro-batches (one sequence per forward, as `alone`): another packing changes the GEMMs'
    # shapes and with them the summation order, which AVX-512 kernels show at ~1e-5
    assert torch.allclose(full_worker.compute_ref_log_probs(batch), alone, atol=1e-5, rtol=0)


def test_pack_shares_the_common_prompt_head_once():
    """The common head is packed once; every scored position holds the token before its
    target at that token's position, and segments cover the row."""
    batch = TokenBatch.from_trajectories(shared_head_trajs(6, head=12))
    plain = fw.pack(batch.input_ids, batch.seq_lens, batch.prompt_lens)
    shared = fw.pack(batch.input_ids, batch.seq_lens, batch.prompt_lens, share_prefix=True)
    head = fw.shared_prefix_len(batch.input_ids, batch.prompt_lens)
    assert head >= 12 and shared.shared_prefix_len == head and plain.shared_prefix_len == 0
    assert shared.input_ids.shape[1] == plain.input_ids.shape[1] - (len(batch) - 1) * head
    assert shared.cu_seqlens[1] == head and shared.cu_seqlens[-1] == shared.input_ids.shape[1]
    assert torch.equal(shared.targets, plain.targets) and torch.equal(shared.resp_lens, plain.resp_lens)
    assert torch.equal(shared.input_ids[0, shared.pred_index], plain.input_ids[0, plain.pred_index])
    assert torch.equal(shared.position_ids[0, shared.pred_index], plain.position_ids[0, plain.pred_index])
    # the whole prompt shared (two samples of one prompt): the first response token is scored
    # from the prefix's last position
    two = TokenBatch.from_trajectories(shared_head_trajs(2, head=12))
    both = fw.pack(two.input_ids, two.seq_lens, two.prompt_lens, share_prefix=True)
    assert both.shared_prefix_len == int(two.prompt_lens[0]) and both.pred_index[0] == both.shared_prefix_len - 1
    one = TokenBatch.from_trajectories(shared_head_trajs(1))
    assert fw.pack(one.input_ids, one.seq_lens, one.prompt_lens, share_prefix=True).shared_prefix_len == 0


def test_shared_prefix_attention_equals_a_slow_reference():
    """One packed row: a shared prefix of 5 tokens, then sequences of 4 and 3 tokens, grouped
    query heads (4 query, 2 key/value). A prefix token attends causally within the prefix; a
    sequence's token attends to the whole prefix and causally within its own sequence; scored
    here query by query with an explicit softmax."""
    g = torch.Generator().manual_seed(0)
    prefix, lens, hq, hkv, d = 5, (4, 3), 4, 2, 8
    t = prefix + sum(lens)
    q, k, v = (torch.randn(1, h, t, d, generator=g) for h in (hq, hkv, hkv))
    cu = torch.tensor([0, prefix, prefix + lens[0], t])
    out, _ = fw.varlen_sdpa_attention(None, q, k, v, None, cu_seq_lens_q=cu, shared_prefix_len=prefix)
    ref = torch.empty(1, t, hq, d)
    for i in range(t):
        start = 0 if i < prefix else (prefix if i < prefix + lens[0] else prefix + lens[0])
        keys = [*range(min(prefix, start)), *range(start, i + 1)]
        for h in range(hq):
            kh = h // (hq // hkv)
            w = torch.softmax(q[0, h, i] @ k[0, kh, keys].T / math.sqrt(d), dim=-1)
            ref[0, i, h] = w @ v[0, kh, keys]
    assert torch.allclose(out, ref, atol=1e-5), (out - ref).abs().max()


def end_aligned_causal_reference(q, k, v, cu_q, cu_k, max_q, max_k, scale):
    """A varlen kernel's contract, segment by segment: (T, H, D) tensors, query i of a segment of
    n queries and m keys sees keys 0 .. m - n + i (flash-attention's causal alignment)."""
    outs = []
    for qs, qe, ks, ke in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), cu_k[:-1].tolist(), cu_k[1:].tolist()):
        n, m = qe - qs, ke - ks
        mask = torch.ones(n, m, dtype=torch.bool).tril(m - n)
        outs.append(torch.nn.functional.scaled_dot_product_attention(
            q[qs:qe].transpose(0, 1), k[ks:ke].transpose(0, 1), v[ks:ke].transpose(0, 1), attn_mask=mask,
            scale=scale, enable_gqa=True).transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("prefix", [0, 5])
def test_one_varlen_call_equals_the_loop_over_sequences(prefix):
    """The GPU's layout (one varlen kernel call per layer: keys of a sequence after the shared
    prefix gathered as prefix + its own) gives the per-sequence loop's output and gradients, the
    prefix's gradient summed over the sequences that read it. The kernel here is a slow
    reference of flash-attention's contract; on a GPU, tests/gpu/test_training_gpu.py runs the
    real one."""
    g = torch.Generator().manual_seed(1)
    lens, hq, hkv, d = (4, 3, 6), 4, 2, 8
    t = prefix + sum(lens)
    leaves = [torch.randn(1, h, t, d, generator=g, requires_grad=True) for h in (hq, hkv, hkv)]
    cu = torch.tensor([0, *([prefix] if prefix else []), *(prefix + torch.tensor(lens).cumsum(0)).tolist()])
    segs = list(zip(cu[:-1].tolist(), cu[1:].tolist()))
    loop, _ = fw.varlen_sdpa_attention(None, *leaves, None, cu_seq_lens_q=cu, shared_prefix_len=prefix)
    one = fw.varlen_kernel_attention(*leaves, segs, prefix, None, kernel=end_aligned_causal_reference)
    assert one.shape == loop.shape and torch.allclose(one, loop, atol=1e-6), (one - loop).abs().max()
    w = torch.randn(loop.shape, generator=g)
    grads = [torch.autograd.grad((x * w).sum(), leaves) for x in (loop, one)]
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    cu_q, cu_k, index, max_q, max_k = fw.varlen_layout(tuple(segs), prefix)
    if prefix:  # the prefix attends to itself; each sequence to the prefix and then to itself
        assert cu_k.tolist() == [0, 5, 14, 22, 33] and max_k == 11 and index[5:9].tolist() == [0, 1, 2, 3]
    else:
        assert index is None and torch.equal(cu_q, cu_k) and max_q == 6


def test_shared_prefix_log_probs_equal_plain_transformers(full_worker, plain_model):
    """Sequences that share their prompts' head, packed with it once, score as a plain fp32
    forward of each sequence alone."""
    batch = TokenBatch.from_trajectories(shared_head_trajs(4, head=12, seed=6))
    ref = hf_logprobs(plain_model, batch)
    assert full_worker.share_prefix
    full_worker.cfg.ref.log_prob_max_token_len_per_gpu = 10_000  # all sequences in one row
    shared = full_worker.compute_log_probs(batch)
    for i, r in enumerate(ref):
        assert torch.allclose(shared[i, : len(r)], r, **LOGP_TOL), (shared[i, : len(r)] - r).abs().max()


def test_log_probs_at_the_rollout_temperature(full_worker, plain_model):
    """With rollout.temperature T the policy and reference log-probs are those of
    softmax(logits / T), the distribution the engine sampled from (not the raw model's)."""
    batch = TokenBatch.from_trajectories(make_trajs(3, seed=4, max_len=40))
    raw = hf_logprobs(plain_model, batch)
    full_worker.cfg.rollout.temperature = 0.6
    try:
        ref = hf_logprobs(plain_model, batch, temperature=0.6)
        tempered = full_worker.compute_log_probs(batch)
        reference = full_worker.compute_ref_log_probs(batch)
    finally:
        full_worker.cfg.rollout.temperature = 1.0
    for i, r in enumerate(ref):
        n = len(r)
        assert torch.allclose(tempered[i, :n], r, **LOGP_TOL), (tempered[i, :n] - r).abs().max()
        assert torch.allclose(reference[i, :n], r, **LOGP_TOL)
        assert (tempered[i, :n] - raw[i]).abs().max() > 0.1  # the temperature did change them


def test_bf16_log_probs_close_to_fp32(full_worker):
    """bf16 autocast (the CPU default) stays close to fp32: measured ~0.03-0.04 nats mean
    (0.034 on real text; the bf16 rollout engine differs from fp32 by ~0.04)."""
    batch = TokenBatch.from_trajectories(make_trajs(3, seed=5, max_len=40))
    fp32 = full_worker.compute_log_probs(batch)
    full_worker.policy.autocast = torch.bfloat16
    try:
        bf16 = full_worker.compute_log_probs(batch)
    finally:
        full_worker.policy.autocast = None
    m = batch.response_valid_mask().bool()
    diff = (bf16 - fp32)[m].abs()
    assert diff.mean() < 0.05 and diff.max() < 1.0, (diff.mean(), diff.max())


# ----------------------------------------------------------------------------- gradients
def test_on_policy_reuse_equals_recomputed_old_logprobs(tiny_worker):
    """One epoch, one mini-batch: reusing the update's own log-probs as old ones is exact,
    and at ratio 1 the PPO gradient is the plain policy gradient -agg(A * logp)."""
    w = tiny_worker
    batch = rl_batch(w, make_trajs(6))
    recomputed = grads(w, batch)
    reused = grads(w, batch, functools.partial(w._ppo_loss, reuse_old=True))
    assert close(reused, recomputed, 1e-5)

    a = w.cfg.actor
    saved = (a.use_kl_loss, a.entropy_coeff, a.tis_cap)
    a.use_kl_loss, a.entropy_coeff, a.tis_cap = False, 0.0, None
    try:
        ppo = grads(w, batch)

        def plain_pg(mb, norm):
            logp, _ = w._forward(w.policy, mb, with_entropy=False)
            mask = mb.mask(True)
            loss = agg_loss(-mb.advantages * logp, mask, "token-mean", global_tokens=norm.tokens)
            return loss, {"loss": loss.item()}

        assert close(ppo, grads(w, batch, plain_pg), 1e-5)
        metrics = w._backward(batch, functools.partial(w._ppo_loss, reuse_old=False))[0][1]
        w.optim.optimizer.zero_grad(set_to_none=True)
        assert abs(metrics["ppo_kl"]) < 1e-6 and metrics["pg_clipfrac"] == 0.0
    finally:
        a.use_kl_loss, a.entropy_coeff, a.tis_cap = saved


def test_masked_positions_contribute_nothing(tiny_worker):
    """Garbage (huge values, NaN) in every per-token input at observation positions leaves
    the gradient unchanged; with state_masking off the same edit does change it."""
    w = tiny_worker
    batch = rl_batch(w, make_trajs(6))
    obs = (batch.response_valid_mask() - batch.loss_mask).bool()
    assert obs.any()
    base = grads(w, batch)

    def spoil(x: torch.Tensor, value: float) -> torch.Tensor:
        return torch.where(obs, torch.full_like(x, value), x)

    spoiled = batch.with_fields(
        advantages=spoil(batch.advantages, 1e3), old_logprobs=spoil(batch.old_logprobs, float("nan")),
        ref_logprobs=spoil(batch.ref_logprobs, -1e4), rollout_logprobs=spoil(batch.rollout_logprobs, float("nan")),
    )
    assert torch.equal(grads(w, spoiled), base)

    w.cfg.actor.state_masking = False
    try:
        changed = batch.with_fields(advantages=spoil(batch.advantages, 5.0))
        assert not close(grads(w, changed), grads(w, batch), 1e-3)
    finally:
        w.cfg.actor.state_masking = True


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batches_give_the_whole_batch_gradient(tiny_worker, mode):
    w = tiny_worker
    a = w.cfg.actor
    batch = rl_batch(w, make_trajs(6))
    saved = (a.loss_agg_mode, a.use_dynamic_bsz, a.ppo_max_token_len_per_gpu, a.ppo_micro_batch_size_per_gpu)
    try:
        a.loss_agg_mode = mode
        a.use_dynamic_bsz, a.ppo_max_token_len_per_gpu = True, 100_000
        whole = grads(w, batch)
        a.ppo_max_token_len_per_gpu = 60  # several packed micro-batches
        dynamic = grads(w, batch)
        a.use_dynamic_bsz, a.ppo_micro_batch_size_per_gpu = False, 1
        single = grads(w, batch)
    finally:
        a.loss_agg_mode, a.use_dynamic_bsz, a.ppo_max_token_len_per_gpu, a.ppo_micro_batch_size_per_gpu = saved
    assert close(dynamic, whole) and close(single, whole)
    assert whole.norm() > 0


def test_shared_prefix_gives_the_same_gradient(tiny_worker):
    """Packing the common head once sums its gradient over the sequences that read it: the
    PPO gradient equals the one of every sequence packed whole (fp32, summation order only)."""
    w = tiny_worker
    batch = rl_batch(w, shared_head_trajs(6, head=12, seed=2))
    a = w.cfg.actor
    saved = (a.use_dynamic_bsz, a.ppo_max_token_len_per_gpu, w.share_prefix)
    try:
        a.use_dynamic_bsz, a.ppo_max_token_len_per_gpu = True, 100_000
        w.share_prefix = True
        shared = grads(w, batch)
        w.share_prefix = False
        whole = grads(w, batch)
    finally:
        a.use_dynamic_bsz, a.ppo_max_token_len_per_gpu, w.share_prefix = saved
    assert close(shared, whole, 1e-5), (shared - whole).norm() / whole.norm()
    assert whole.norm() > 0


def test_bf16_gradient_agrees_with_fp32(tiny_worker):
    w = tiny_worker
    batch = rl_batch(w, make_trajs(6))
    fp32 = grads(w, batch)
    w.policy.autocast = torch.bfloat16
    try:
        bf16 = grads(w, batch)
    finally:
        w.policy.autocast = None
    cos = torch.nn.functional.cosine_similarity(bf16, fp32, dim=0)
    assert cos > 0.99, cos
    assert abs(bf16.norm() / fp32.norm() - 1) < 0.05


# ----------------------------------------------------------------------------- exploration controls
def loss_path_worker(cfg: ActorRolloutRefConfig, forward=None, policy=None) -> ActorWorker:
    """An ActorWorker without a model, for the loss path on hand-made numbers: `forward(mb)` ->
    (logp, entropy) stands for `_forward`, or `policy(packed, with_entropy, temperature)` for
    the LogProbModel under the real `_forward`. `_ppo_loss` runs as it is: config -> policy
    loss, entropy and KL terms."""
    w = ActorWorker.__new__(ActorWorker)
    w.cfg, w.device, w.share_prefix, w.policy = cfg, torch.device("cpu"), False, policy
    w.policy_loss = get_policy_loss(cfg.actor.policy_loss)
    if forward is not None:
        w._forward = lambda model, mb, with_entropy, temperature=None: forward(mb)
    return w


def hand_batch(masks: list[list[int]], **fields) -> TokenBatch:
    """One response per mask (prompt [1], response tokens 2, no rollout log-probs), with `fields`."""
    trajs = [Trajectory([1], [2] * len(m), m, [0.0] * len(m), group_id=i) for i, m in enumerate(masks)]
    return TokenBatch.from_trajectories(trajs).with_fields(**fields)


def settings(*overrides: str) -> ActorRolloutRefConfig:
    """The actor's settings as a user sets them: by their dotted names."""
    return load_config(TrainConfig, None, list(overrides)).actor_rollout_ref


def test_clip_ratio_high_set_in_the_config_reaches_the_policy_loss():
    """DAPO's clip-higher through the actor's loss call. Ratios 1.5 1.1 0.7 0.9 0.5 1.0 1.25 5.0,
    advantages + + + - - - + -, clip_ratio 0.2, dual-clip c 3 (per token -A*r, clipped):
    clip_ratio_high unset (0.2): t0 and t6 are cut at 1.2: -1.2 -1.1 -0.7 +0.9 +0.8 +1.0 -1.2
      +3.0 = 1.5 over 8 tokens, clipped-high share 2/8, no gradient at t6;
    clip_ratio_high 0.28: t0 at 1.28, t6 (1.25) inside: -1.28 ... -1.25 ... = 1.37 over 8,
      share 1/8, t6's gradient -A*r/8 = -1.25/8."""
    r = torch.tensor([[1.5, 1.1, 0.7, 0.9, 0.5, 1.0, 1.25, 5.0]])
    old = torch.full_like(r, -1.0)
    batch = hand_batch([[1] * 8], old_logprobs=old, advantages=torch.tensor([[1.0, 1, 1, -1, -1, -1, 1, -1]]))
    seen = {}
    for high in (None, 0.28):
        cfg = settings(*([] if high is None else [f"actor_rollout_ref.actor.clip_ratio_high={high}"]))
        logp = (old + r.log()).requires_grad_(True)
        w = loss_path_worker(cfg, lambda mb: (logp, torch.zeros_like(logp)))
        loss, metrics = w._ppo_loss(batch, Normalizers(tokens=8, seqs=1), reuse_old=False)
        loss.backward()
        seen[high] = (loss.item(), metrics["pg_clipfrac_ratio_high"], logp.grad[0, 6].item())
    assert seen[None] == pytest.approx((1.5 / 8, 2 / 8, 0.0))
    assert seen[0.28] == pytest.approx((1.37 / 8, 1 / 8, -1.25 / 8))


def test_entropy_coeff_adds_minus_coeff_times_the_entropy_and_its_gradient_raises_it():
    """Two sampled tokens over a 2-word vocabulary, logits (0, 0) and (0, ln 3), and an
    observation token: entropies ln 2 and ln 4 - (3/4) ln 3 (p = 1/4, 3/4); token-mean
    H = (ln 2 + ln 4 - 0.75 ln 3) / 2. entropy_coeff 0.01 adds exactly -0.01 * H to the loss;
    a gradient step on the entropy term alone (advantages 0) raises the second token's entropy
    (the first is already at its maximum) and leaves the observation token alone."""
    mask = [[1, 1, 0]]

    def run(coeff: float, advantages: list[float]):
        logits = torch.tensor([[[0.0, 0.0], [0.0, math.log(3.0)], [0.0, 0.0]]], requires_grad=True)
        w = loss_path_worker(settings(f"actor_rollout_ref.actor.entropy_coeff={coeff}"),
                             lambda mb: (torch.log_softmax(logits, -1)[..., 0], entropy_from_logits(logits)))
        batch = hand_batch(mask, advantages=torch.tensor([advantages]))
        loss, metrics = w._ppo_loss(batch, Normalizers(tokens=2, seqs=1), reuse_old=True)
        loss.backward()
        return loss, metrics, logits

    entropy = (math.log(2) + math.log(4) - 0.75 * math.log(3)) / 2
    with_bonus, metrics, _ = run(0.01, [0.5, -1.0, 0.0])
    without, _, _ = run(0.0, [0.5, -1.0, 0.0])
    assert without.item() == pytest.approx(0.25)  # ratio 1: -(0.5 - 1) / 2
    assert with_bonus.item() - without.item() == pytest.approx(-0.01 * entropy, rel=1e-5)
    assert metrics["entropy"] == pytest.approx(entropy, rel=1e-6)

    _, _, logits = run(0.01, [0.0, 0.0, 0.0])
    before = entropy_from_logits(logits.detach())
    after = entropy_from_logits(logits.detach() - 10.0 * logits.grad)
    assert after[0, 1] > before[0, 1] + 1e-3  # a step of 0.1 * dH/dz on the lower logit
    assert after[0, 0] == pytest.approx(before[0, 0].item())  # uniform: the maximum already
    assert torch.equal(logits.grad[0, 2], torch.zeros(2))  # not sampled: no entropy term


def test_rollout_temperature_reaches_the_sampler_and_the_actor(model_dir):
    """One setting, actor_rollout_ref.rollout.temperature=0.7: the rollout manager samples with
    it (greedy evaluation with 0), and the actor takes the old / reference and the update's
    log-probs of those same trajectories at 0.7; SFT at 1 (the model's own distribution).
    That the log-probs at T are the plain model's softmax(z / T): test_log_probs_at_the_rollout_temperature."""
    import asyncio

    from rollout_fakes import FakeRetriever, Q, ScriptedEngine
    from transformers import AutoTokenizer

    from agent_rl.rollout.manager import RolloutManager

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    cfg = load_config(TrainConfig, None, ["actor_rollout_ref.rollout.temperature=0.7",
                                          "actor_rollout_ref.rollout.chat_template=false"])
    engine = ScriptedEngine(tok, ["<answer> x </answer>", "<answer> y </answer>"])
    manager = RolloutManager(engine, FakeRetriever(), cfg, tokenizer=tok)
    trajs, _ = asyncio.run(manager.rollout([Q("who?")]))
    sampled = [s.temperature for _, s in engine.calls]
    asyncio.run(manager.rollout([Q("who?")], greedy=True))
    greedy = [s.temperature for _, s in engine.calls[len(sampled):]]
    assert set(sampled) == {0.7} and set(greedy) == {0.0}

    temperatures = []

    def policy(packed, with_entropy, temperature):
        temperatures.append(temperature)
        n = int(packed.resp_lens.sum())
        return torch.zeros(n), torch.zeros(n)

    w = loss_path_worker(cfg.actor_rollout_ref, policy=policy)
    batch = TokenBatch.from_trajectories(trajs)
    norm = Normalizers(tokens=int(batch.loss_mask.sum()), seqs=1)
    w._forward(w.policy, batch, with_entropy=False)  # old and reference log-probs
    w._ppo_loss(batch.with_fields(advantages=torch.zeros_like(batch.loss_mask)), norm, reuse_old=True)
    w._sft_loss(batch, norm)
    assert temperatures == [0.7, 0.7, 1.0]


def forking_batch() -> tuple[TokenBatch, torch.Tensor]:
    """Two responses, 5 sampled tokens each (row 0 has an observation token, entropy 5.0), and
    the entropies of algos.entropy_mask's test: at q = 0.4 row 0 keeps t1, t5 and row 1 t1, t3."""
    ent = torch.tensor([[0.1, 0.9, 0.5, 0.3, 5.0, 0.7], [0.01, 0.05, 0.02, 0.04, 0.03, 0.0]])
    logp = torch.tensor([[-1.0, -0.5, -2.0, -0.3, -4.0, -1.2], [-0.2, -0.9, -1.5, -0.6, -0.1, 0.0]])
    batch = hand_batch([[1, 1, 1, 1, 0, 1], [1, 1, 1, 1, 1]],
                       advantages=torch.tensor([[1.0, 2, 3, 4, 5, 6], [1.0, 1, 1, 1, 1, 0]]),
                       ref_logprobs=logp - 0.1)
    return batch, ent


def test_top_entropy_quantile_gives_the_policy_gradient_to_the_forking_tokens_only():
    """At ratio 1 each sampled token adds -A / N (N = 10 sampled tokens, also at q < 1: the
    others count in the normaliser, as in TRL). q = 1: -(1+2+3+4+6 + 5*1) / 10 = -2.1;
    q = 0.4: forking tokens only, -(2+6 + 1+1) / 10 = -1.0. The KL and entropy terms keep every
    sampled token; q = 1 is bit-identical to the loss before the setting existed."""
    batch, ent0 = forking_batch()
    mask = batch.loss_mask
    keep = torch.tensor([[0, 1, 0, 0, 0, 1], [0, 1, 0, 1, 0, 0]]).bool()
    out = {}
    for q in (1.0, 0.4):
        cfg = settings(f"actor_rollout_ref.actor.top_entropy_quantile={q}", "actor_rollout_ref.actor.entropy_coeff=0.01",
                       "actor_rollout_ref.actor.use_kl_loss=true")
        logp = batch.ref_logprobs.clone().add_(0.1).requires_grad_(True)
        ent = ent0.clone().requires_grad_(True)
        w = loss_path_worker(cfg, lambda mb: (logp, ent))
        loss, metrics = w._ppo_loss(batch, Normalizers(tokens=10, seqs=2), reuse_old=True)
        loss.backward()
        out[q] = loss, metrics, logp.grad, ent.grad
    a = cfg.actor
    (loss1, m1, glogp1, gent1), (loss_q, m_q, glogp_q, gent_q) = out[1.0], out[0.4]
    assert m_q["pg_loss"] == pytest.approx(-1.0) and m1["pg_loss"] == pytest.approx(-2.1)
    assert (loss_q - loss1).item() == pytest.approx(1.1, rel=1e-5)
    # the policy gradient -A/N left the other sampled tokens; nothing else moved
    assert torch.allclose(glogp_q - glogp1, torch.where(mask.bool() & ~keep, batch.advantages / 10, 0.0))
    assert torch.equal(gent_q, gent1) and m_q["kl_loss"] == m1["kl_loss"] and m_q["entropy"] == m1["entropy"]
    assert m_q["pg_token_frac"] == pytest.approx(4 / 10) and "pg_token_frac" not in m1

    # q = 1: the loss as computed before top_entropy_quantile existed (fd3a1b5), bit for bit
    logp = batch.ref_logprobs.clone().add_(0.1)
    g = dict(global_tokens=10, global_seqs=2)
    before, _ = ppo_policy_loss(logp, logp, batch.advantages, mask, a, rollout_logp=logp, **g)
    before = before - a.entropy_coeff * agg_loss(ent0, mask, a.loss_agg_mode, **g)
    before = before + a.kl_loss_coef * kl_loss(logp, batch.ref_logprobs, mask, a.kl_loss_type, a.loss_agg_mode, **g)[0]
    assert torch.equal(loss1.detach(), before)


def test_top_entropy_quantile_on_the_real_forward(tiny_worker):
    """The policy's own entropies choose the tokens: the gradient at q = 0.5 is the q = 1
    gradient of the batch whose advantages are 0 outside `entropy_mask` of those entropies
    (the KL and entropy terms of tiny_worker unchanged), and not the q = 1 gradient itself.
    Same forward, same packing: only the selected tokens differ, so the match is to fp32
    summation order (1e-6)."""
    w = tiny_worker
    a = w.cfg.actor
    batch = rl_batch(w, make_trajs(6))
    with torch.no_grad():
        _, ent = w._forward(w.policy, batch, with_entropy=True)
    keep = entropy_mask(ent, batch.mask(True), 0.5)
    zeroed = batch.with_fields(advantages=torch.where(keep, batch.advantages, 0.0))
    full = grads(w, batch)
    a.top_entropy_quantile = 0.5
    try:
        forking = grads(w, batch)
    finally:
        a.top_entropy_quantile = 1.0
    assert close(forking, grads(w, zeroed), 1e-6)
    assert not close(forking, full, 1e-2)
    assert 0.45 < float(keep.sum() / batch.mask(True).sum()) < 0.65  # about half, per row


# ----------------------------------------------------------------------------- updates
def test_update_policy_changes_weights_with_finite_metrics(tiny_policy):
    cfg = make_cfg(tiny_policy, use_kl_loss=True, entropy_coeff=0.01, ppo_epochs=2, bf16_autocast=True)
    cfg.actor.optim.lr_warmup_steps = 2
    w = ActorWorker(cfg, total_steps=10)
    batch = rl_batch(w, make_trajs(12))  # 12 sequences, mini-batches of 4 x n=2: 2 per epoch
    # the bf16-stored reference reproduces the autocast policy exactly before any update
    assert w._ref_policy is None  # loaded on first use only
    assert torch.equal(w.compute_ref_log_probs(batch), batch.old_logprobs)
    assert next(m for m in w.ref_policy.modules() if isinstance(m, torch.nn.Linear)).weight.dtype == torch.bfloat16
    before = [p.detach().clone() for p in w.optim.params]
    metrics = w.update_policy(batch)
    for key in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "actor/kl_loss",
                "actor/grad_norm", "actor/lr"):
        assert key in metrics and math.isfinite(metrics[key]), key
    assert metrics["actor/lr"] == pytest.approx(1e-3 / 2)  # warm-up step 1 of 2
    assert w.num_updates == 1 and w.optim.lr == pytest.approx(1e-3)
    assert any(not torch.equal(b, p) for b, p in zip(before, w.optim.params))
    assert metrics["actor/ppo_kl"] != 0.0  # later mini-batches/epochs are off-policy
    assert w.needs_old_log_probs(8)  # two epochs: the second one is off-policy


def test_update_without_old_logprobs(tiny_policy):
    """Single on-policy step: old log-probs may be omitted (no extra forward pass)."""
    w = ActorWorker(make_cfg(tiny_policy), total_steps=1)
    batch = rl_batch(w, make_trajs(6))
    assert not w.needs_old_log_probs(len(batch))
    metrics = w.update_policy(dataclass_replace(batch, old_logprobs=None))
    assert metrics["actor/ppo_kl"] == 0.0 and metrics["actor/pg_clipfrac"] == 0.0
    with pytest.raises(ValueError, match="advantages"):
        w.update_policy(dataclass_replace(batch, advantages=None))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_zero_advantage_sequences_are_skipped_without_changing_the_update(tiny_policy, mode):
    """Without KL and entropy terms, a sequence whose advantages are all 0 adds nothing to the
    policy gradient: the update skips its forward and backward and the gradient is the one of
    the whole mini-batch (the normalisers still count its tokens). Reference: `_backward` with
    every sequence active."""
    cfg = make_cfg(tiny_policy, use_kl_loss=False, entropy_coeff=0.0, loss_agg_mode=mode, tis_cap=2.0)
    w = ActorWorker(cfg, total_steps=2)
    batch = rl_batch(w, make_trajs(8))
    zero = torch.tensor([0, 1, 0, 1, 1, 0, 0, 1], dtype=torch.bool)  # 4 of 8 with all-zero advantages
    batch = batch.with_fields(advantages=batch.advantages.masked_fill(zero[:, None], 0.0))
    loss_fn = functools.partial(w._ppo_loss, reuse_old=False)
    full = grads(w, batch, loss_fn)
    w.optim.optimizer.zero_grad(set_to_none=True)
    w._backward(batch, loss_fn, active=~zero)
    skipped = torch.cat([p.grad.flatten() for p in w.optim.params])
    w.optim.optimizer.zero_grad(set_to_none=True)
    assert full.norm() > 0 and close(skipped, full, 1e-5)
    # the per-token metrics are means over the sequences that ran, not scaled down by the
    # skipped share (tis_weight_mean read 0.32 in a demo step that skipped two thirds)
    run = combine_metrics(w._backward(batch, loss_fn, active=~zero))
    alone = combine_metrics(w._backward(batch.select((~zero).nonzero().flatten()), loss_fn))
    w.optim.optimizer.zero_grad(set_to_none=True)
    for k in ("tis_weight_mean", "entropy", "ppo_kl", "pg_clipfrac"):
        assert run[k] == pytest.approx(alone[k], rel=1e-5, abs=1e-7), k
    assert 0.5 < run["tis_weight_mean"] <= 2.0
    # through update_policy: the step skips them and says so
    metrics = w.update_policy(batch)
    assert metrics["actor/skipped_sequences"] == 4.0 and metrics["actor/no_signal_steps"] == 0.0


def test_a_mini_batch_without_signal_takes_no_optimizer_step(tiny_policy):
    """Every advantage 0 (an RFT batch with no right answer, GRPO groups that all agree): no
    sequence is active, so the mini-batch takes no optimizer step. A step on its zero gradient
    would still move the weights (AdamW's decay, the moments of the step before) and age Adam's
    state; the weights and the optimizer state stay bit-identical, and the update counts it."""
    cfg = make_cfg(tiny_policy, use_kl_loss=False, entropy_coeff=0.0, tis_cap=2.0)
    cfg.actor.optim.weight_decay = 0.01  # the default: decay alone would move every weight
    w = ActorWorker(cfg, total_steps=3)
    batch = rl_batch(w, make_trajs(8))
    w.update_policy(batch)  # a real step first: Adam's moments are not zero
    before = [p.detach().clone() for p in w.optim.params]
    state = copy.deepcopy(w.optim.optimizer.state_dict()["state"])
    metrics = w.update_policy(batch.with_fields(advantages=torch.zeros_like(batch.advantages)))
    assert all(torch.equal(b, p) for b, p in zip(before, w.optim.params))
    after = w.optim.optimizer.state_dict()["state"]
    assert state.keys() == after.keys() and all(
        torch.equal(state[i][k], after[i][k]) for i in state for k in ("step", "exp_avg", "exp_avg_sq"))
    assert int(state[0]["step"]) == 1  # the real step's count, not aged by the empty one
    assert metrics["actor/skipped_sequences"] == 8.0 and metrics["actor/no_signal_steps"] == 1.0
    assert metrics["actor/skipped_steps"] == 0.0 and "actor/grad_norm" not in metrics  # nothing was computed
    assert w.num_updates == 2  # the trainer step still counts (the lr schedule follows steps)


def test_a_step_with_a_non_finite_gradient_is_skipped_counted_and_warned(caplog):
    """The update loop on a 4-weight linear model: a mini-batch whose loss is NaN (its gradient
    norm too) takes no step, is counted in actor/skipped_steps and warned on the console once
    per update, whatever the number of such mini-batches; a finite one still steps."""
    from agent_rl.config import OptimConfig
    from agent_rl.training.workers.step import Optim, UpdateLoop

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False)
    optim = Optim(list(model.parameters()), OptimConfig(lr=0.1), total_steps=3, grad_clip=1.0)
    loop = UpdateLoop(model, optim, fsdp=False, world_size=1, state_masking=True, use_dynamic_bsz=False,
                      max_token_len=1 << 20, micro_batch_size=64)
    batch = TokenBatch.from_trajectories(make_trajs(4))
    losses = iter([float("nan"), float("nan"), 1.0, float("nan")])  # one per mini-batch, in order

    def loss_fn(mb, norm):
        loss = model.weight.sum() * next(losses)
        return loss, {"loss": loss.item()}

    before = model.weight.detach().clone()
    with caplog.at_level("WARNING", logger="agent_rl.training.workers.step"):
        first = loop.epochs(batch, loss_fn, "actor", epochs=1, mini_size=2, shuffle=False)  # NaN, NaN
        assert torch.equal(model.weight, before) and not optim.optimizer.state  # no step, no Adam state
        second = loop.epochs(batch, loss_fn, "actor", epochs=1, mini_size=2, shuffle=False)  # 1.0, NaN
    assert first["actor/skipped_steps"] == 2.0 and second["actor/skipped_steps"] == 1.0
    assert int(optim.optimizer.state[model.weight]["step"]) == 1  # the finite mini-batch's step alone
    assert not torch.equal(model.weight, before)
    warned = [r.getMessage() for r in caplog.records if "non-finite gradient norm" in r.getMessage()]
    assert warned == ["actor update 1: 2 of 2 optimizer steps skipped for a non-finite gradient norm; "
                      "their mini-batches left the weights unchanged",
                      "actor update 2: 1 of 2 optimizer steps skipped for a non-finite gradient norm; "
                      "their mini-batches left the weights unchanged"]


def dataclass_replace(batch, **kw):
    import dataclasses

    return dataclasses.replace(batch, **kw)


def test_sft_step_trains_sampled_tokens(tiny_policy):
    """SFT's NLL is the model's own (temperature 1), whatever the config's rollout temperature."""
    w = ActorWorker(make_cfg(tiny_policy), total_steps=3)
    batch = TokenBatch.from_trajectories(make_trajs(4))
    logp = w.compute_log_probs(batch)
    w.cfg.rollout.temperature = 0.5
    nll = -(logp * batch.loss_mask).sum() / batch.loss_mask.sum()
    first = w.update_sft(batch)
    assert first["sft/loss"] == pytest.approx(nll.item(), rel=1e-5)
    losses = [w.update_sft(batch)["sft/loss"] for _ in range(2)]
    assert losses[-1] < first["sft/loss"]


def test_save_load_round_trip(tiny_policy, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = make_cfg(tiny_policy)
    w = ActorWorker(cfg, total_steps=5)
    batch = rl_batch(w, make_trajs(6))
    w.update_policy(batch)
    w.save(str(tmp_path / "actor"))
    # an HF directory transformers loads as it is, with the trained weights
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "actor", dtype=torch.float32)
    mine = w.compute_log_probs(batch)
    for i, r in enumerate(hf_logprobs(hf, batch)):
        assert torch.allclose(mine[i, : len(r)], r, **LOGP_TOL)
    assert (tmp_path / "actor" / "tokenizer.json").is_file()
    # a fresh worker resumes: same weights, optimizer moments, counters -> same next update
    w2 = ActorWorker(cfg, total_steps=5)
    w2.load(str(tmp_path / "actor"))
    assert w2.num_updates == 1 and w2.optim.lr == w.optim.lr
    for p, q in zip(w.optim.params, w2.optim.params):
        assert torch.equal(p, q)
    nxt = rl_batch(w, make_trajs(6, seed=9))
    w.update_policy(nxt)
    w2.update_policy(nxt)
    for p, q in zip(w.optim.params, w2.optim.params):
        assert torch.allclose(p, q, atol=1e-6)
    # the reference stayed the initial model, not the loaded one
    assert not torch.allclose(w2.compute_ref_log_probs(batch), w2.compute_log_probs(batch))
    # a final model without optimizer state still loads (weights and counters only)
    w.save(str(tmp_path / "final"), include_optimizer=False)
    w3 = ActorWorker(cfg, total_steps=5)
    w3.load(str(tmp_path / "final"))
    assert len(w3.optim.optimizer.state) == 0 and w3.num_updates == 2
    assert all(torch.equal(p, q) for p, q in zip(w.optim.params, w3.optim.params))


def test_named_weights_for_sync_match_checkpoint_names(tiny_policy):
    from safetensors import safe_open

    w = ActorWorker(make_cfg(tiny_policy), total_steps=1)
    named = dict(w.named_weights_for_sync())
    with safe_open(str(tiny_policy / "model.safetensors"), "pt") as f:
        assert set(named) == set(f.keys())
        for k in named:
            assert torch.equal(named[k], f.get_tensor(k))
    assert "lm_head.weight" not in named  # tied: the engine re-ties it


# ----------------------------------------------------------------------------- LoRA
@pytest.fixture(scope="module")
def lora_worker(tiny_policy):
    w = ActorWorker(make_cfg(tiny_policy, lora_rank=4), total_steps=2)
    w.update_policy(rl_batch(w, make_trajs(6)))  # adapters are non-zero from here on
    return w


def test_lora_reference_is_the_base_model_without_a_copy(lora_worker, tiny_policy):
    from transformers import AutoModelForCausalLM

    w = lora_worker
    assert w.ref_policy is w.policy  # adapters off, same modules
    base = AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=torch.float32)
    n_base = sum(p.numel() for p in base.parameters())
    n_lora = sum(p.numel() for n, p in w.model.named_parameters() if "lora_" in n)
    assert sum(p.numel() for p in w.model.parameters()) == n_base + n_lora  # one copy of the base
    assert all("lora_" in n for n, p in w.model.named_parameters() if p.requires_grad)
    batch = TokenBatch.from_trajectories(make_trajs(4, seed=7))
    ref = w.compute_ref_log_probs(batch)
    for i, r in enumerate(hf_logprobs(base, batch)):
        assert torch.allclose(ref[i, : len(r)], r, **LOGP_TOL)
    assert not torch.allclose(w.compute_log_probs(batch), ref, atol=1e-4)


def test_lora_merged_weights_are_base_plus_scaled_ba(lora_worker, tiny_policy):
    from safetensors.torch import load_file

    w = lora_worker
    base = load_file(str(tiny_policy / "model.safetensors"))
    merged = dict(w.named_weights_for_sync())
    assert set(merged) == set(base)
    scale = 8 / 4  # lora_alpha / rank
    layers = dict(w.model.named_modules())
    n_adapted = 0
    for name, tensor in merged.items():
        mod = layers.get("base_model.model." + name.rsplit(".", 1)[0])
        if mod is not None and hasattr(mod, "lora_A"):
            a, b = mod.lora_A["default"].weight, mod.lora_B["default"].weight
            assert b.abs().max() > 0
            assert torch.allclose(tensor, base[name] + scale * b @ a, atol=1e-6)
            n_adapted += 1
        else:
            assert torch.equal(tensor, base[name])
    assert n_adapted == 2 * 7  # 2 blocks x (q, k, v, o, gate, up, down)


def test_a_full_weight_model_is_not_lora_without_importing_peft(lora_worker):
    """is_lora answers from peft only when peft is loaded (no model can be a PeftModel before):
    a full-weight actor's start does not import it. The LoRA worker above is one."""
    from fresh import run_fresh

    from agent_rl.training.workers import model_io

    assert model_io.is_lora(lora_worker.model)
    out = run_fresh("import sys, torch; from agent_rl.training.workers import model_io; "
                    "assert not model_io.is_lora(torch.nn.Linear(2, 2)); assert 'peft' not in sys.modules, 'peft imported'")
    assert out.returncode == 0, out.stderr[-2000:]


def test_lora_save_load(lora_worker, tiny_policy, tmp_path):
    from transformers import AutoModelForCausalLM

    w = lora_worker
    w.save(str(tmp_path / "actor"))
    batch = TokenBatch.from_trajectories(make_trajs(4, seed=8))
    mine = w.compute_log_probs(batch)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "actor", dtype=torch.float32)
    for i, r in enumerate(hf_logprobs(merged, batch)):
        # W + BA merged vs applied separately: fp32 round-off on log-probs of about -40 (LOGP_TOL)
        assert torch.allclose(mine[i, : len(r)], r, **LOGP_TOL)
    w2 = ActorWorker(make_cfg(tiny_policy, lora_rank=4), total_steps=2)
    w2.load(str(tmp_path / "actor"))
    assert torch.allclose(w2.compute_log_probs(batch), mine, atol=1e-6, rtol=0)
    assert w2.num_updates == 1
    with pytest.raises(ValueError, match="lora"):
        ActorWorker(make_cfg(tiny_policy), total_steps=1).load(str(tmp_path / "actor"))


def test_lr_schedule_warmup_then_cosine_to_the_floor():
    """Hand-computed: 2 warm-up steps, then a half cosine from lr to 0.1 * lr over steps 2..10."""
    from agent_rl.config import OptimConfig
    from agent_rl.training.workers.step import Optim, lr_factor

    cfg = OptimConfig(lr=1e-3, lr_warmup_steps=2, warmup_style="cosine", min_lr_ratio=0.1)
    want = {0: 0.5, 1: 1.0, 2: 1.0, 4: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)), 6: 0.55, 10: 0.1, 25: 0.1}
    for step, factor in want.items():
        assert lr_factor(step, cfg, total_steps=10) == pytest.approx(factor), step
    cfg.warmup_style = "constant"
    assert [lr_factor(k, cfg, 10) for k in (0, 1, 6, 25)] == [0.5, 1.0, 1.0, 1.0]
    cfg.warmup_style = "cosine"
    optim = Optim([torch.nn.Parameter(torch.zeros(2))], cfg, total_steps=10, grad_clip=1.0)
    seen = []
    for _ in range(11):  # the optimizer's lr follows the factor, one trainer step at a time
        seen.append(optim.lr)
        optim.end_update()
    assert seen == pytest.approx([1e-3 * lr_factor(k, cfg, 10) for k in range(11)])
    assert seen[-1] == pytest.approx(1e-4)
