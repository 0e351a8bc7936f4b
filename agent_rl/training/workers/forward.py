"""Packed forward pass for training: response-token log-probs (and entropy) of many sequences.

Sequences are packed end to end into one row with position ids restarting at 0 for each, and
attention is causal *within* each sequence (block-diagonal): no padding is computed at all.
On CPU the block-diagonal attention is one causal SDPA call per sequence
(`VARLEN_ATTN`, registered with transformers' attention interface). On CUDA in bf16/fp16 the
same attention is one call per layer to torch's flash-attention varlen kernel
(`torch.nn.attention.varlen`, `VARLEN_KERNEL`), shared prefix included; with the flash-attn
package installed transformers' own flash_attention_2 takes the position ids instead.

Shared prefix (`pack(..., share_prefix=True)`, `VARLEN_ATTN` only): the tokens every sequence of
a micro-batch starts with (the system prompt and instructions, ~145 of a demo sequence's ~500)
are packed once, at the row's start; each sequence's own tokens follow with their positions
continuing the prefix's, and attend to the prefix and causally to themselves. The prefix's
hidden states are the ones each sequence would compute (the same causal function of the same
tokens), and its gradient is the sum over the sequences that read it: the same log-probs and
gradient, up to summation order, for fewer tokens through the trunk.

Log-probs are taken only at response positions, chunk by chunk, by `token_logprobs`: the
fp32 softmax exists for one chunk of rows at a time (V = 49152 here), never as a full fp32
(T, V) tensor; the logits themselves are kept in the matmul dtype for the backward when they
fit `KEEP_LOGITS_BYTES`, else recomputed per chunk (the trick of Liger-Kernel's fused linear
cross-entropy, https://arxiv.org/abs/2410.10989).
"""

from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

VARLEN_ATTN = "varlen_sdpa"
"""attn_implementation name of the packed (block-diagonal causal) SDPA attention."""

VARLEN_KERNEL = os.environ.get("AGENT_RL_VARLEN_KERNEL", "1") != "0"
"""On CUDA in bf16/fp16: one flash-attention varlen call per layer for the whole packed row
instead of one SDPA call per sequence. The loop costs a few dozen kernel launches per sequence
and layer, and with a shared prefix its masked calls run SDPA's unfused math backend (flash
takes no mask; pytorch/pytorch#181528). With the loop a demo GRPO update took 4.4 s on an H200,
with the kernel 0.34 s (docs/gpu.md, runs 10 and 11). AGENT_RL_VARLEN_KERNEL=0 keeps the loop (A/B)."""

LOGIT_CHUNK = 1024
"""Tokens per chunk of the lm_head + log-softmax (bounds the (chunk, V) temporaries)."""


# ----------------------------------------------------------------------------- attention
def _segments(kwargs: dict, length: int) -> list[tuple[int, int]]:
    """[start, end) of each packed sequence, from cu_seq_lens_q or from position ids == 0."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        pos = kwargs.get("position_ids")
        if pos is None:
            return [(0, length)]
        starts = (pos[0] == 0).nonzero().flatten().tolist()
        if not starts or starts[0] != 0:
            starts = [0, *starts]
        cu = [*starts, length]
    else:
        cu = cu.tolist()
    return list(zip(cu[:-1], cu[1:]))


def varlen_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Causal attention restricted to each packed sequence of a single row.

    query (1, H, T, D), key/value (1, Hkv, T, D) -> (1, T, H, D), like transformers' sdpa.
    With a padding mask or several rows it is plain SDPA (generation, evaluation).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    prefix = int(kwargs.pop("shared_prefix_len", 0) or 0)
    if attention_mask is not None or query.shape[0] != 1 or query.shape[2] != key.shape[2]:
        if prefix:
            raise ValueError("varlen_sdpa_attention: a shared prefix needs one packed row and no padding mask")
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    gqa = query.shape[1] != key.shape[1]
    segments = _segments(kwargs, query.shape[2])
    if _kernel_applies(query, dropout):
        return varlen_kernel_attention(query, key, value, segments, prefix, scaling), None
    outs = []
    for s, e in segments:
        if prefix and s >= prefix:  # a sequence's own tokens: the shared prefix, then causal
            k = torch.cat([key[:, :, :prefix], key[:, :, s:e]], dim=2)
            v = torch.cat([value[:, :, :prefix], value[:, :, s:e]], dim=2)
            outs.append(F.scaled_dot_product_attention(
                query[:, :, s:e], k, v, attn_mask=_prefix_causal_mask(e - s, prefix, query.device),
                dropout_p=dropout, scale=scaling, enable_gqa=gqa))
        else:
            outs.append(F.scaled_dot_product_attention(
                query[:, :, s:e], key[:, :, s:e], value[:, :, s:e],
                dropout_p=dropout, scale=scaling, is_causal=True, enable_gqa=gqa))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.transpose(1, 2).contiguous(), None


def _prefix_causal_mask(n: int, prefix: int, device: torch.device) -> torch.Tensor:
    """(n, prefix + n) bool: every query sees the whole prefix, then keys up to its own position."""
    mask = torch.ones(n, prefix + n, dtype=torch.bool, device=device)
    mask[:, prefix:] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    return mask


def _kernel_applies(query: torch.Tensor, dropout: float) -> bool:
    """Whether the varlen kernel serves this call: CUDA, sm80+, bf16/fp16 (or autocast to one),
    no dropout, head size <= 256 (flash-attention's limits)."""
    if not (VARLEN_KERNEL and query.is_cuda and dropout == 0 and query.shape[-1] <= 256):
        return False
    half = (torch.float16, torch.bfloat16)
    if not (query.dtype in half or (torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") in half)):
        return False
    return torch.cuda.get_device_capability(query.device)[0] >= 8 and _flash_varlen() is not None


@functools.lru_cache(maxsize=16)
def varlen_layout(segments: tuple[tuple[int, int], ...], prefix: int):
    """One varlen call's layout of a packed row: (cu_q, cu_k, key_index, max_q, max_k). Queries
    stay where they are (the segments tile the row); a sequence after a shared prefix of
    `prefix` tokens reads the prefix's keys, then its own, so its keys are gathered by
    `key_index` (None without a prefix: the keys are the queries' positions). Causal attention
    aligned to the end of each key segment is then exactly `varlen_sdpa_attention`'s. Cached:
    the layers of one forward share it."""
    cu_q, cu_k, index = [0], [0], []
    for s, e in segments:
        keys = [*range(prefix), *range(s, e)] if prefix and s >= prefix else range(s, e)
        index.extend(keys)
        cu_q.append(e)
        cu_k.append(cu_k[-1] + len(keys))
    lens_q = [b - a for a, b in zip(cu_q, cu_q[1:])]
    lens_k = [b - a for a, b in zip(cu_k, cu_k[1:])]
    as_tensor = functools.partial(torch.tensor, dtype=torch.int32)
    return (as_tensor(cu_q), as_tensor(cu_k), torch.tensor(index, dtype=torch.long) if prefix else None,
            max(lens_q), max(lens_k))


def varlen_kernel_attention(query, key, value, segments, prefix: int, scaling, kernel=None) -> torch.Tensor:
    """`varlen_sdpa_attention` in one varlen call: query (1, H, T, D), key/value (1, Hkv, T, D)
    -> (1, T, H, D). `kernel` (default torch's flash varlen) takes (T, H, D) tensors, int32
    cumulative offsets and the longest segments, and attends causally aligned to each key
    segment's end."""
    cu_q, cu_k, index, max_q, max_k = varlen_layout(tuple(segments), prefix)
    dev = query.device
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (T, heads, D)
    if index is not None:
        idx = index.to(dev, non_blocking=True)
        k, v = k.index_select(0, idx), v.index_select(0, idx)  # backward sums the prefix's gradient
    if kernel is None:
        kernel = _flash_varlen()
        if torch.is_autocast_enabled(dev.type):  # rotary embeddings leave q, k in fp32 beside a bf16 v
            half = torch.get_autocast_dtype(dev.type)
            q, k, v = q.to(half), k.to(half), v.to(half)
    out = kernel(q.contiguous(), k.contiguous(), v.contiguous(), cu_q.to(dev), cu_k.to(dev), max_q, max_k, scaling)
    return out.unsqueeze(0)


@functools.lru_cache(maxsize=1)
def _flash_varlen():
    """torch's flash varlen attention as kernel(q, k, v, cu_q, cu_k, max_q, max_k, scale), causal
    aligned to the end of each key segment, across torch 2.10 (is_causal) and 2.11+ (window_size);
    grouped-query heads repeated where the function cannot take them. None without it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}

    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, scale):
        kw = dict(causal)
        if k.shape[1] != q.shape[1]:
            if "enable_gqa" in params:
                kw["enable_gqa"] = True
            else:
                k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, **kw)

    return kernel


def _varlen_mask(*args, attention_mask=None, **kwargs):
    """No (T, T) mask for packed rows (the attention restricts itself); sdpa's mask otherwise."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register_varlen_attention() -> str:
    """Register `VARLEN_ATTN` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN_ATTN, varlen_sdpa_attention)
    AttentionMaskInterface.register(VARLEN_ATTN, _varlen_mask)
    return VARLEN_ATTN


# ----------------------------------------------------------------------------- log-probs
KEEP_LOGITS_BYTES = 1 << 30
"""The forward keeps the (N, V) logits for the backward when they fit in this many bytes
(in the matmul dtype: bf16 under autocast); beyond, the backward recomputes them per chunk."""


@functools.cache
def _cpu_low_precision_fallback(dtype: torch.dtype) -> bool:
    """Whether CPU matmuls in `dtype` (bf16, fp16) fall back to ATen's own kernels (no oneDNN
    support on this CPU, e.g. AVX2 only). Those are fast only when both operands run along
    the reduced dimension, as the forward's h @ W^T does: the backward then computes dz @ W as
    dz @ (W^T contiguous)^T and dz^T @ h from contiguous transposes. On an AVX2 host a
    256 x 49152 x 576 bf16 dz @ W took 27.9 s, laid out so 1.0 s. Where oneDNN runs them
    (native bf16), the plain layout is kept."""
    if dtype == torch.bfloat16:
        return not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if dtype == torch.float16:
        return not torch.ops.mkldnn._is_mkldnn_fp16_supported()
    return False


class _TokenLogProb(torch.autograd.Function):
    """logp[i] = log_softmax(h[i] @ W^T)[t[i]] and entropy[i], in fp32, chunk by chunk.

    Fresh (chunk, V) temporaries per op cost about as much as the arithmetic here (page
    faults of 100-200 MB each), so each call reuses a few buffers and updates them in place.
    The backward writes the logit gradient in place: d logp_t / dz = onehot(t) - p and
    d H / dz = -p * (z - sum_k p_k z_k).
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, compute_dtype, with_entropy):
        n, vocab = hidden.shape[0], weight.shape[0]
        acc = torch.promote_types(compute_dtype, torch.float32)  # fp32 (fp64 in gradcheck)
        logp = torch.empty(n, dtype=acc, device=hidden.device)
        lse = torch.empty_like(logp)
        ent = torch.zeros_like(logp)
        w = weight.to(compute_dtype)
        keep = any(ctx.needs_input_grad[:2]) and n * vocab * w.element_size() <= KEEP_LOGITS_BYTES
        chunk = n if keep else min(n, LOGIT_CHUNK)
        logits_buf = torch.empty(chunk, vocab, dtype=compute_dtype, device=hidden.device)
        tmp_buf = torch.empty(min(n, LOGIT_CHUNK), vocab, dtype=acc, device=hidden.device)
        for s in range(0, n, LOGIT_CHUNK):
            e = min(s + LOGIT_CHUNK, n)
            z = logits_buf[s:e] if keep else logits_buf[: e - s]
            tmp = tmp_buf[: e - s]
            torch.mm(hidden[s:e].to(compute_dtype), w.T, out=z)
            m = z.amax(-1, keepdim=True).to(acc)
            torch.sub(z, m, out=tmp).exp_()  # unnormalised p, in fp32
            total = tmp.sum(-1, keepdim=True)
            lse_c = (m + total.log()).squeeze(1)
            lse[s:e] = lse_c
            logp[s:e] = z.gather(1, targets[s:e, None]).squeeze(1).to(acc) - lse_c
            if with_entropy:  # H = lse - sum_k p_k z_k
                ent[s:e] = lse_c - tmp.mul_(z).sum(-1) / total.squeeze(1)
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        ctx.save_for_backward(hidden, weight, targets, lse, ent, logits_buf if keep else lse.new_empty(0))
        ctx.keep = keep
        ctx.compute_dtype = compute_dtype
        ctx.with_entropy = with_entropy
        # unused outputs get None gradients instead of zero tensors (skips the entropy term)
        ctx.set_materialize_grads(False)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, targets, lse, ent, kept = ctx.saved_tensors
        cd, acc = ctx.compute_dtype, lse.dtype
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        use_ent = ctx.with_entropy and g_ent is not None
        if g_logp is None:
            g_logp = torch.zeros_like(lse)
        n, vocab = hidden.shape[0], weight.shape[0]
        w = weight.to(cd)
        nt = hidden.device.type == "cpu" and _cpu_low_precision_fallback(cd)
        w_k = w.T.contiguous() if nt and need_h else None
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = None
        rows = min(n, LOGIT_CHUNK)
        p_buf = torch.empty(rows, vocab, dtype=acc, device=hidden.device)
        z_buf = torch.empty_like(p_buf) if use_ent else None
        low_buf = None if ctx.keep else torch.empty(rows, vocab, dtype=cd, device=hidden.device)
        for s in range(0, n, LOGIT_CHUNK):
            e = min(s + LOGIT_CHUNK, n)
            p = p_buf[: e - s]
            h = hidden[s:e].to(cd)
            if ctx.keep:
                low = kept[s:e]
            else:
                low = low_buf[: e - s]
                torch.mm(h, w.T, out=low)
            torch.sub(low, lse[s:e, None], out=p).exp_()
            if use_ent:
                z = z_buf[: e - s]
                mean_z = (lse[s:e] - ent[s:e])[:, None]  # sum_k p_k z_k
                torch.sub(low, mean_z, out=z).mul_(p).mul_(-g_ent[s:e, None])  # g_ent * dH/dz
                p.mul_(-g_logp[s:e, None]).add_(z)
            else:
                p.mul_(-g_logp[s:e, None])
            p.scatter_add_(1, targets[s:e, None], g_logp[s:e, None])
            dz = p if cd == acc else low.copy_(p)  # the logits are not needed any more
            if need_h:
                grad_h[s:e] = (dz @ w_k.T if nt else dz @ w).to(hidden.dtype)
            if need_w:
                part = dz.T.contiguous() @ h.T.contiguous().T if nt else dz.T @ h
                grad_w = part.to(acc) if grad_w is None else grad_w.add_(part)
        return grad_h, (grad_w.to(weight.dtype) if need_w else None), None, None, None


def token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    compute_dtype: torch.dtype = torch.float32,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of `targets` under `softmax(hidden @ weight.T)`, and the entropy.

    hidden (N, d), weight (V, d) (the lm_head), targets (N,) long -> logp (N,), entropy (N,),
    both fp32 (entropy is zeros unless `with_entropy`). The matmul runs in `compute_dtype`,
    log-softmax in fp32. Gradients flow to hidden and weight (if it requires grad).
    """
    with torch.autocast(hidden.device.type, enabled=False):
        return _TokenLogProb.apply(hidden, weight, targets, compute_dtype, with_entropy)


# ----------------------------------------------------------------------------- packing
@dataclass
class Packed:
    """Sequences packed into one row, plus where their response log-probs come from.

    `input_ids`/`position_ids` (1, T); `cu_seqlens` (S+1,) segment boundaries (with a shared
    prefix, the prefix is the first segment); `pred_index` (N,) positions whose next-token
    distribution scores a response token; `targets` (N,) those tokens; `resp_lens` (S,) response
    tokens per sequence (sum = N); `shared_prefix_len` tokens at the row's start that every
    sequence begins with, packed once (0: none).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    pred_index: torch.Tensor
    targets: torch.Tensor
    resp_lens: torch.Tensor
    shared_prefix_len: int = 0


def shared_prefix_len(input_ids: torch.Tensor, prompt_lens: torch.Tensor) -> int:
    """Leading tokens that every row of `input_ids` (B, L) has in common, within the shortest
    prompt; 0 for fewer than two rows."""
    if len(input_ids) < 2:
        return 0
    head = input_ids[:, : int(prompt_lens.min())]
    differs = (head != head[:1]).any(dim=0).nonzero()
    return int(differs[0]) if len(differs) else head.shape[1]


def pack(input_ids: torch.Tensor, seq_lens: torch.Tensor, prompt_lens: torch.Tensor,
         share_prefix: bool = False) -> Packed:
    """Pack rows of right-padded `input_ids` (B, L) with their `seq_lens`, `prompt_lens` (B,);
    with `share_prefix`, their common leading tokens once (see the module docstring)."""
    shared = shared_prefix_len(input_ids, prompt_lens) if share_prefix else 0
    seqs, pos, pred, tgt = [input_ids[0, :shared]], [torch.arange(shared)], [], []
    bounds = [0, shared] if shared else [0]
    offset = shared
    for ids, n, p in zip(input_ids, seq_lens.tolist(), prompt_lens.tolist()):
        if p < 1 or n <= p:
            raise ValueError(f"pack: need prompt_len >= 1 and a non-empty response, got prompt {p}, total {n}")
        seqs.append(ids[shared:n])
        pos.append(torch.arange(shared, n))
        # token j (p <= j < n) is predicted from position j - 1: in the shared prefix when
        # j - 1 < shared (the whole prompt shared), else in this sequence's own segment
        src = torch.arange(p - 1, n - 1)
        pred.append(torch.where(src < shared, src, src - shared + offset))
        tgt.append(ids[p:n])
        offset += n - shared
        bounds.append(offset)
    dev = input_ids.device
    return Packed(
        input_ids=torch.cat(seqs)[None].to(dev),
        position_ids=torch.cat(pos)[None].to(dev),
        cu_seqlens=torch.tensor(bounds, dtype=torch.long, device=dev),
        pred_index=torch.cat(pred).to(dev),
        targets=torch.cat(tgt).to(dev),
        resp_lens=(seq_lens - prompt_lens).to(torch.long),
        shared_prefix_len=shared,
    )


def unpack_responses(flat: torch.Tensor, resp_lens: torch.Tensor, width: int) -> torch.Tensor:
    """Flat per-response-token values (N,) -> right-padded (S, width), zeros in padding."""
    out = flat.new_zeros(len(resp_lens), width)
    mask = torch.arange(width, device=flat.device)[None] < resp_lens.to(flat.device)[:, None]
    out[mask] = flat
    return out


def packed_hidden(model: torch.nn.Module, packed: Packed) -> torch.Tensor:
    """Final hidden states (1, T, d) of a decoder-only HF model on a packed row."""
    extra = {}
    if packed.shared_prefix_len:
        if not shares_prefixes(model):
            raise ValueError(f"packed_hidden: a shared prefix needs attn_implementation={VARLEN_ATTN!r}, "
                             f"the model has {getattr(model.config, '_attn_implementation', None)!r}")
        extra["shared_prefix_len"] = packed.shared_prefix_len
    out = model(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        cu_seq_lens_q=packed.cu_seqlens,
        cu_seq_lens_k=packed.cu_seqlens,
        max_length_q=int(packed.cu_seqlens.diff().max()),
        max_length_k=int(packed.cu_seqlens.diff().max()),
        use_cache=False,
        **extra,
    )
    return out.last_hidden_state


def shares_prefixes(model: torch.nn.Module) -> bool:
    """Whether `model`'s attention takes shared-prefix packed rows (`VARLEN_ATTN`; not flash-attn)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == VARLEN_ATTN
