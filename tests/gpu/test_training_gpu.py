"""The training side on CUDA: actor and critic updates in bf16 under FSDP2 (a process group of
one GPU), log-probs against fp32, checkpoints, weight export for the engine (CPU tensors and
CUDA IPC into another process), SFT steps. Two FSDP ranks on one GPU are tried by
scripts/gpu_check.sh (NCCL refuses two ranks on one device; docs/gpu.md)."""

from __future__ import annotations


import pytest
import torch
import torch.multiprocessing as mp

from agent_rl.config import ActorRolloutRefConfig, TrainConfig
from agent_rl.training.batch import TokenBatch
from agent_rl.training.workers import dist as wdist
from agent_rl.training.workers.actor import ActorWorker
from agent_rl.training.workers.critic import CriticWorker
from agent_rl.types import Trajectory

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module", autouse=True)
def group_of_one():
    """An NCCL process group of one rank, so strategy=fsdp shards (over one GPU) for real."""
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 references stay fp32
    torch.distributed.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{wdist.free_port()}",
                                         rank=0, world_size=1, device_id=torch.device("cuda", 0))
    yield
    torch.distributed.destroy_process_group()


def make_batch(n: int = 8, seed: int = 0, vocab: int = 49000, head: int = 0) -> TokenBatch:
    """Random sequences; with `head`, every prompt starts with the same `head` tokens."""
    g = torch.Generator().manual_seed(seed)
    common = torch.randint(3, vocab, (head,), generator=g).tolist()
    trajs = []
    for i in range(n):
        p, r = int(torch.randint(8, 32, (1,), generator=g)), int(torch.randint(16, 96, (1,), generator=g))
        mask = [0 if (i % 2 == 0 and 4 <= j < 12) else 1 for j in range(r)]
        ids = common + torch.randint(3, vocab, (p + r,), generator=g).tolist()
        p += head
        trajs.append(Trajectory(prompt_ids=ids[:p], response_ids=ids[p:], loss_mask=mask,
                                rollout_logprobs=[0.0] * r, reward=float(i % 2), group_id=i // 2))
    return TokenBatch.from_trajectories(trajs)


def with_rl_fields(batch: TokenBatch, old: torch.Tensor, seed: int = 1) -> TokenBatch:
    g = torch.Generator().manual_seed(seed)
    valid = batch.response_valid_mask()
    adv = torch.randn(len(batch), 1, generator=g).expand_as(valid) * valid
    return batch.with_fields(advantages=adv.contiguous(), old_logprobs=old, ref_logprobs=old.clone(),
                             rollout_logprobs=old * batch.loss_mask)


def actor_cfg(path, strategy: str = "fsdp", bf16: bool = True, n: int = 8) -> ActorRolloutRefConfig:
    cfg = ActorRolloutRefConfig()
    cfg.model.path = str(path)
    cfg.rollout.n = 1
    cfg.actor.ppo_mini_batch_size = n
    cfg.actor.ppo_max_token_len_per_gpu = 256  # several micro-batches
    cfg.actor.bf16_autocast = bf16
    cfg.actor.strategy = strategy
    cfg.actor.use_kl_loss = True
    cfg.actor.optim.lr = 1e-4
    cfg.actor.optim.lr_warmup_steps = 0
    return cfg


def valid_values(x: torch.Tensor, batch: TokenBatch) -> torch.Tensor:
    return x[batch.response_valid_mask().bool()]


def test_bf16_fsdp_log_probs_agree_with_fp32(tiny_policy):
    batch = make_batch()
    fp32 = ActorWorker(actor_cfg(tiny_policy, strategy="replicas", bf16=False), total_steps=4)
    bf16 = ActorWorker(actor_cfg(tiny_policy, strategy="fsdp", bf16=True), total_steps=4)
    assert bf16.fsdp and not fp32.fsdp and bf16.device.type == "cuda"
    a = valid_values(fp32.compute_log_probs(batch), batch)
    b = valid_values(bf16.compute_log_probs(batch), batch)
    err = (a - b).abs()
    # the CPU figure for this comparison is 0.034 nats mean on real text (agent_rl/training/workers/actor.py)
    assert err.mean() < 0.05 and err.max() < 0.5, f"mean {err.mean():.4f} max {err.max():.4f}"
    # and the fp32 GPU pass equals the fp32 CPU pass (summation order only)
    cpu = ActorWorker(actor_cfg(tiny_policy, strategy="replicas", bf16=False), total_steps=4)
    cpu.device = torch.device("cpu")
    cpu.model.to("cpu")
    c = valid_values(cpu.compute_log_probs(batch), batch)
    assert torch.allclose(a, c, atol=1e-3, rtol=1e-4), f"max |gpu - cpu| {(a - c).abs().max():.2e}"


def test_shared_prompt_head_equals_whole_packing_on_the_gpu(tiny_policy):
    """The common prompt head packed once (SDPA attention; flash-attn packs whole): under FSDP2
    on the GPU, the same log-probs (fp32) and the same update as every sequence packed whole."""
    batch = make_batch(head=40)
    w = ActorWorker(actor_cfg(tiny_policy, strategy="fsdp", bf16=False), total_steps=4)
    if not w.share_prefix:
        pytest.skip("flash-attn is installed: training packs whole sequences")
    w.cfg.ref.log_prob_max_token_len_per_gpu = 1024  # several sequences, one head, per forward
    shared = w.compute_log_probs(batch)
    w.share_prefix = False
    whole = w.compute_log_probs(batch)
    assert torch.allclose(shared, whole, atol=1e-4, rtol=1e-4), (shared - whole).abs().max()
    rb = with_rl_fields(batch, whole - 0.1 * batch.response_valid_mask())
    m_whole = w.update_policy(rb)
    w2 = ActorWorker(actor_cfg(tiny_policy, strategy="fsdp", bf16=False), total_steps=4)
    m_shared = w2.update_policy(rb)
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
        assert m_shared[key] == pytest.approx(m_whole[key], rel=1e-3, abs=1e-5), key
    a, b = dict(w.named_weights_for_sync()), dict(w2.named_weights_for_sync())
    for k, v in a.items():
        assert torch.allclose(b[k], v, atol=1e-5, rtol=0), k


def test_fsdp_update_equals_the_plain_update(tiny_policy):
    """One PPO step (fp32, so only summation order differs) under FSDP2 and without it: the
    same parameters after, the same metrics; FSDP's gradient averaging is undone correctly."""
    batch = make_batch()
    plain = ActorWorker(actor_cfg(tiny_policy, strategy="replicas", bf16=False), total_steps=4)
    sharded = ActorWorker(actor_cfg(tiny_policy, strategy="fsdp", bf16=False), total_steps=4)
    old = plain.compute_log_probs(batch) - 0.1 * batch.response_valid_mask()  # off-policy: ratios != 1
    before = {k: v.clone() for k, v in plain.named_weights_for_sync()}  # .cpu() does not copy on a CPU
    rb = with_rl_fields(batch, old)
    m1, m2 = plain.update_policy(rb), sharded.update_policy(rb)
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy"):
        assert m2[key] == pytest.approx(m1[key], rel=1e-3, abs=1e-5), key
    w1, w2 = dict(plain.named_weights_for_sync()), dict(sharded.named_weights_for_sync())
    assert w1.keys() == w2.keys() == before.keys()
    for k, v in w1.items():
        assert torch.allclose(w2[k], v, atol=1e-5, rtol=0), k
    assert sum(not torch.equal(before[k], w1[k]) for k in w1) > len(w1) // 2, "the update did not move the weights"


def test_bf16_fsdp_training_lowers_the_sft_loss_and_checkpoints(tiny_policy, tmp_path):
    batch = make_batch(seed=3)
    w = ActorWorker(actor_cfg(tiny_policy, strategy="fsdp", bf16=True), total_steps=20)
    losses = [w.update_sft(batch)["sft/loss"] for _ in range(8)]
    assert losses[-1] < 0.8 * losses[0], losses
    assert torch.cuda.max_memory_allocated() > 0

    w.save(str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "model.safetensors").is_file() and (tmp_path / "ckpt" / "actor_state.pt").is_file()
    resumed = ActorWorker(actor_cfg(tiny_policy, strategy="fsdp", bf16=True), total_steps=20)
    resumed.load(str(tmp_path / "ckpt"))
    assert resumed.num_updates == w.num_updates == 8
    a, b = w.compute_log_probs(batch), resumed.compute_log_probs(batch)
    assert torch.equal(a, b)
    # the next step is the same step: optimizer moments and scheduler restored
    n1, n2 = w.update_sft(batch), resumed.update_sft(batch)
    assert n2["sft/loss"] == pytest.approx(n1["sft/loss"], rel=1e-5)
    assert n2["sft/grad_norm"] == pytest.approx(n1["sft/grad_norm"], rel=1e-3)

    # the saved directory is what transformers (and vLLM) load
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    names = {k for k, _ in w.named_weights_for_sync()}
    assert names <= set(hf.state_dict())


def _ipc_reader(handles, expected_sums, out):
    """Another process, as the vLLM engine is: rebuild the tensors from CUDA IPC handles."""
    from agent_rl.training.weight_sync import get_transport

    named = get_transport("cuda_ipc").load(handles)
    sums = {k: float(t.cpu().double().sum()) for k, t in named}  # summed as the producer did, on the CPU
    devices = {t.device.type for _, t in named}
    out.put((sums == expected_sums, sorted(devices)))


def test_weights_export_for_the_engine(tiny_policy):
    from agent_rl.training.weight_sync import get_transport, unpack_weights

    w = ActorWorker(actor_cfg(tiny_policy, strategy="fsdp", bf16=True), total_steps=2)
    w.update_sft(make_batch())
    host = w.named_weights_for_sync()
    assert all(t.device.type == "cpu" for _, t in host)
    names = [k for k, _ in host]
    assert "lm_head.weight" not in names and any("embed_tokens" in k for k in names)  # tied head left out
    # object_store transport (CPU engines): exact round trip
    back = dict(unpack_weights(get_transport("object_store").export(w)))
    assert all(torch.equal(back[k], v) for k, v in host)
    # cuda_ipc transport: the GPU tensors (under FSDP, gathered temporaries that go out of
    # scope on export), opened by another process
    handles = get_transport("cuda_ipc").export(w)
    expected = {k: float(v.double().sum()) for k, v in host}
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_ipc_reader, args=(handles, expected, q))
    p.start()
    same, devices = q.get(timeout=300)
    p.join(60)
    assert p.exitcode == 0 and same and devices == ["cuda"]


def test_critic_bf16_fsdp_fits_returns(tiny_policy):
    cfg = TrainConfig()
    cfg.actor_rollout_ref.model.path = str(tiny_policy)
    cfg.actor_rollout_ref.rollout.n = 1
    cfg.critic.bf16_autocast = True
    cfg.critic.strategy = "fsdp"
    cfg.critic.ppo_mini_batch_size = 8
    cfg.critic.optim.lr = 1e-3
    c = CriticWorker(cfg, total_steps=20)
    assert c.fsdp
    batch = make_batch(seed=5)
    g = torch.Generator().manual_seed(0)
    returns = torch.randn(len(batch), 1, generator=g).expand_as(batch.loss_mask) * batch.response_valid_mask()
    losses = []
    for _ in range(10):
        b = batch.with_fields(values=c.compute_values(batch), returns=returns.contiguous())
        losses.append(c.update_critic(b)["critic/vf_loss"])
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("prefix", [0, 37])
def test_the_varlen_kernel_equals_the_loop_over_sequences(prefix, monkeypatch):
    """One flash varlen call per layer (the CUDA default) against one SDPA call per sequence,
    under bf16 autocast with fp32 query and key beside a bf16 value (as rotary embeddings leave
    them), grouped-query heads as in SmolLM2: outputs and gradients within bf16 rounding."""
    from agent_rl.training.workers import forward as fw

    g = torch.Generator().manual_seed(0)
    lens, hq, hkv, d = (50, 17, 90), 9, 3, 64
    t = prefix + sum(lens)
    leaves = [torch.randn(1, h, t, d, generator=g).cuda().requires_grad_() for h in (hq, hkv, hkv)]
    cu = torch.tensor([0, *([prefix] if prefix else []), *(prefix + torch.tensor(lens).cumsum(0)).tolist()]).cuda()
    w = torch.randn(1, t, hq, d, generator=g).cuda()
    outs = {}
    for kernel in (True, False):
        monkeypatch.setattr(fw, "VARLEN_KERNEL", kernel)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            q, k, v = leaves[0], leaves[1], leaves[2].to(torch.bfloat16)
            assert fw._kernel_applies(q, 0.0) is kernel
            out, _ = fw.varlen_sdpa_attention(None, q, k, v, None, cu_seq_lens_q=cu, shared_prefix_len=prefix)
        outs[kernel] = (out.float(), torch.autograd.grad((out.float() * w).sum(), leaves))
    (a, ga), (b, gb) = outs[True], outs[False]
    assert (a - b).abs().max() <= 2e-2, (a - b).abs().max()
    for x, y in zip(ga, gb):
        assert (x - y).abs().max() <= 5e-2 * y.abs().max(), ((x - y).abs().max(), y.abs().max())

