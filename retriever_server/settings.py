"""Retriever settings: one typed object, loaded from YAML (configs/retriever/*.yaml) + CLI overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from data_prep.io import load_yaml, read_key_file


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    index: list[str] = Field(default_factory=list)
    """Index directories (meta.json inside). Hybrid: one dense and one bm25 directory."""
    corpus: str = ""
    """Corpus jsonl the index was built from (checked against meta.json: size and sha256)."""
    kind: Literal["auto", "dense", "bm25", "hybrid"] = "auto"
    """Backend; auto: from the index kinds (dense+bm25 dirs -> hybrid)."""
    encoder: str | None = None
    """Query encoder spec ('minilm' or a local dir); None: the one recorded in the index."""
    encoder_backend: Literal["torch", "onnx"] | None = None
    """Query encoder runtime; None: onnx on CPU, torch on GPU (data_prep.encoder)."""
    encoder_precision: Literal["auto", "fp32", "bf16", "fp16", "int8"] | None = None
    """Query encoder precision; None/auto: int8 ONNX where the CPU has VNNI, fp16 on CUDA, else fp32."""
    pooling: Literal["mean", "cls"] | None = None
    """Pooling override; None: the one recorded in the index."""
    num_threads: int | None = None
    """Encoder threads per search worker; None: the cores this process may use / search_workers."""
    search_workers: int | None = None
    """Batches encoded and searched at once, each on its own thread; None: 2 for a dense index
    with its encoder on a CPU of 2+ cores (one batch encodes while the event loop answers the last
    and reads the next: 862 -> 1,276 q/s at 64 clients on 2 cores), else 1 (a GPU runs one
    batch at a time; BM25's tokenizer is not shared across threads)."""
    mmap_index: bool = True
    """Map the FAISS index from its file instead of copying it into the process: start-up is
    instant and processes serving one index on a machine share one copy in the page cache."""
    verify_corpus_hash: bool = True
    """Hash the corpus at start-up (~1 s per GB) besides checking its size."""

    topk: int = 3
    """Passages per query when a request omits topk (Search-R1's default)."""
    max_topk: int = 100
    """Largest topk a request may ask for."""
    max_queries: int = 512
    """Most queries in one request."""
    max_query_chars: int = 2048
    """Longest query string accepted."""
    max_body_bytes: int = 4 * 1024 * 1024
    """Largest request body accepted (413 above)."""
    body_timeout_s: float = 10.0
    """Seconds a request's body may take to arrive after its headers; past it the answer is
    408 and the connection is closed (a slow or stalled client, or a slowloris, would
    otherwise hold its connection and a max_concurrent_requests slot for good). A 4 MiB body
    at 1 MB/s takes 4 s."""
    header_timeout_s: float = 10.0
    """Seconds a client has, from connecting (or from the first byte of its next request on a
    kept-alive connection), to send the request line and headers; past it the answer is 408
    and the connection is closed, before any API key is checked (uvicorn has no such limit:
    a connection trickling a header byte now and then was held for good)."""
    max_header_bytes: int = 16384
    """Largest request line and headers accepted (431 and the connection closed above; h11's
    and Node's default). Clients of this API send a few hundred bytes."""
    max_headers: int = 100
    """Most header lines in one request (431 above; Apache's LimitRequestFields). httptools
    kept every line it was sent: a flood of `a: b` lines grew the server ~150 MB per million."""
    allow_empty_queries: bool = True
    """Answer "" queries like any other (Search-R1 sends them for `<search></search>`)."""

    max_batch_size: int = 64
    """Queries gathered from concurrent requests into one encode+search call."""
    max_wait_ms: float = 2.0
    """While another search worker is busy, how long a free one holds its batch open for more
    queries (an idle server starts at once: a fixed 3 ms wait added 4.5 ms to a lone query)."""
    max_queued_queries: int = 8192
    """Queries that may wait for a search worker; past it /retrieve answers 503 with
    Retry-After (~6 s of work at 1,300 q/s: a client should rather fail over or back off)."""
    max_concurrent_requests: int = 1024
    """/retrieve requests answered at once (reading, waiting, writing); past it 503 with
    Retry-After, before the body is read."""
    cache_size: int = 10000
    """LRU entries keyed by (query, topk); 0 disables the cache."""

    nprobe: int = 32
    """IVF lists probed per query (ivfpq)."""
    ef_search: int = 128
    """HNSW search breadth; kept >= max_topk so a smaller topk is a prefix of a larger one."""
    hybrid_depth: int = 100
    """Candidates each side contributes to reciprocal-rank fusion."""
    rrf_k: int = 60
    """Reciprocal-rank-fusion constant (Cormack et al. 2009)."""
    use_gpu: bool = True
    """Search the dense index on all GPUs (sharded) when there are any (gpu_search says how)."""
    gpu_search: Literal["auto", "faiss", "torch"] = "auto"
    """auto: faiss-gpu when it is installed and sees GPUs, else a flat index is searched exactly
    in torch on the CUDA GPUs (retriever_server/torch_search.py: where faiss-gpu cannot install);
    torch: that search even without a GPU (on the CPU: tests)."""
    gpu_search_dtype: Literal["float16", "bfloat16", "float32"] = "float16"
    """Precision of the passage vectors held on the GPUs by the torch search (the top
    candidates are scored again in fp32)."""

    api_key: str | None = None
    """When set, /retrieve, /stats and /metrics need header X-API-Key with this value. Give it
    by env RETRIEVER_API_KEY or api_key_file rather than on a command line (visible in `ps`)."""
    api_key_file: str | None = None
    """A file holding the API key (first line); read at start-up."""
    host: str = "127.0.0.1"
    """Bind address (loopback unless exposed on purpose: another address needs an API key, or
    allow_no_key)."""
    allow_no_key: bool = False
    """Serve a non-loopback address without an API key (anyone who reaches it may search and
    read /stats)."""
    allowed_hosts: list[str] | None = None
    """Host header names answered besides the bind address's own ('*': any; the port is not
    checked). A server on loopback answers only localhost and loopback IPs unless a name is
    listed: a web page that rebinds its own DNS name to 127.0.0.1 sends that name, and is
    refused (421). None on 0.0.0.0 or :: (every interface) answers any host; a list there
    answers its names and the loopback ones."""
    port: int = 8000
    """Bind port."""
    log_level: str = "info"
    """uvicorn log level."""

    @field_validator("index", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, (str, Path)) else v

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else [h.strip().lower().rstrip(".") for h in v]

    @model_validator(mode="after")
    def _check(self) -> "Settings":
        for name in ("topk", "max_topk", "max_queries", "max_query_chars", "max_body_bytes", "max_batch_size",
                     "search_workers", "num_threads", "max_queued_queries", "max_concurrent_requests",
                     "max_header_bytes", "max_headers"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not 1 <= self.topk <= self.max_topk:
            raise ValueError(f"topk={self.topk} must be within 1..max_topk={self.max_topk}")
        for name in ("body_timeout_s", "header_timeout_s"):
            if not getattr(self, name) > 0:  # also NaN
                raise ValueError(f"{name} must be > 0")
        if self.max_wait_ms < 0 or self.cache_size < 0:
            raise ValueError("max_wait_ms and cache_size must be >= 0")
        if self.api_key_file and not self.api_key:
            self.api_key = read_key_file(self.api_key_file, "api_key_file")
        if not self.api_key and not self.allow_no_key and not is_loopback(self.host):
            raise ValueError(f"host {self.host!r} is not a loopback address and no API key is set: set env "
                             "RETRIEVER_API_KEY or --api-key-file (or --allow-no-key to serve it to anyone)")
        return self


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


WILDCARD_HOSTS = ("0.0.0.0", "::", "")
"""Bind addresses that listen on every interface."""


def host_name(header: str) -> str:
    """The name of a Host header, lower case, without port or trailing dot ("[::1]:80" -> "::1")."""
    h = header.strip().lower()
    if h.startswith("["):
        h = h[1:].split("]", 1)[0]
    elif h.count(":") == 1:
        h = h.split(":", 1)[0]
    return h.rstrip(".")


def host_allowed(settings: Settings, header: str | None) -> bool:
    """Whether a request with this Host header is answered (Settings.allowed_hosts): the bind
    address's own name, loopback names on a loopback or wildcard bind, the listed names; any
    host on a wildcard bind with no list. A request without a Host header is refused unless
    any host is."""
    allowed = settings.allowed_hosts
    bind = host_name(settings.host)
    if "*" in (allowed or ()) or (allowed is None and bind in WILDCARD_HOSTS):
        return True
    if header is None:
        return False
    name = host_name(header)
    if name == bind or name in (allowed or ()):
        return True
    return (bind in WILDCARD_HOSTS or is_loopback(bind)) and is_loopback(name)


def load_settings(config: str | Path | None = None, **overrides: Any) -> Settings:
    """YAML file (optional) then keyword overrides (None values are ignored)."""
    data: dict[str, Any] = {}
    if config:
        loaded = load_yaml(config) or {}  # a ValueError naming file:line for bad bytes or YAML
        if not isinstance(loaded, dict):
            raise ValueError(f"{config}: expected a mapping of settings, got {type(loaded).__name__}")
        data.update(loaded)
    data.update({k: v for k, v in overrides.items() if v is not None})
    return Settings(**data)
