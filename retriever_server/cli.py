"""`agent-rl-retriever --index DIR --corpus corpus.jsonl [--config YAML] [--host --port] ...`"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from retriever_server.settings import Settings, load_settings


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agent-rl-retriever", description=(
        "Serve a FAISS / BM25 / hybrid index over HTTP with Search-R1's POST /retrieve API. "
        "Settings come from --config (YAML, see configs/retriever/default.yaml); flags override it."))
    p.add_argument("--config", help="YAML settings file (default: none; built-in defaults)")
    p.add_argument("--index", action="append", help="index directory; twice (dense + bm25) for hybrid")
    p.add_argument("--corpus", help="corpus jsonl the index was built from")
    p.add_argument("--kind", choices=("auto", "dense", "bm25", "hybrid"))
    p.add_argument("--encoder", help="query encoder: 'minilm' or a local model dir (default: as indexed)")
    p.add_argument("--encoder-backend", choices=("torch", "onnx"))
    p.add_argument("--encoder-precision", choices=("auto", "fp32", "bf16", "fp16", "int8"))
    p.add_argument("--pooling", choices=("mean", "cls"))
    p.add_argument("--num-threads", type=int, help="encoder threads per search worker (default: cores / workers)")
    p.add_argument("--search-workers", type=int,
                   help="batches encoded and searched at once (default: 2 for a dense index on a 2+ core CPU, else 1)")
    p.add_argument("--no-mmap-index", dest="mmap_index", action="store_const", const=False,
                   help="copy the FAISS index into memory (default: map it from the file, shared between processes)")
    p.add_argument("--no-verify-corpus-hash", dest="verify_corpus_hash", action="store_const", const=False,
                   help="check the corpus size only (skip hashing a very large corpus at start-up)")
    p.add_argument("--topk", type=int)
    p.add_argument("--max-topk", type=int)
    p.add_argument("--max-queries", type=int)
    p.add_argument("--max-query-chars", type=int)
    p.add_argument("--max-body-bytes", type=int)
    p.add_argument("--body-timeout-s", type=float,
                   help="seconds a request body may take to arrive; then 408 and the connection closed (default 10)")
    p.add_argument("--header-timeout-s", type=float,
                   help="seconds a client may take to send a request's line and headers; then 408 and the "
                        "connection closed, before the API key is checked (default 10)")
    p.add_argument("--max-header-bytes", type=int,
                   help="largest request line + headers; above it 431 and the connection closed (default 16384)")
    p.add_argument("--max-headers", type=int, help="most header lines in a request; above it 431 (default 100)")
    p.add_argument("--max-batch-size", type=int)
    p.add_argument("--max-wait-ms", type=float)
    p.add_argument("--cache-size", type=int)
    p.add_argument("--max-queued-queries", type=int, help="queries waiting for a search worker before 503 (default 8192)")
    p.add_argument("--max-concurrent-requests", type=int, help="/retrieve requests at once before 503 (default 1024)")
    p.add_argument("--nprobe", type=int)
    p.add_argument("--ef-search", type=int)
    p.add_argument("--api-key-file", help="require header X-API-Key with the key in this file (first line)")
    p.add_argument("--api-key", help="require header X-API-Key with this key; visible in `ps`, so prefer env "
                                     "RETRIEVER_API_KEY or --api-key-file (default: env RETRIEVER_API_KEY if set)")
    p.add_argument("--host", help="bind address (default 127.0.0.1; another address needs an API key or --allow-no-key)")
    p.add_argument("--allow-no-key", action="store_const", const=True,
                   help="serve a non-loopback --host without an API key (anyone who reaches it may use it)")
    p.add_argument("--allowed-host", dest="allowed_hosts", action="append", metavar="NAME",
                   help="a Host header name to answer besides the bind address (repeat; '*': any). Default: "
                        "loopback names on a loopback --host, any host on 0.0.0.0")
    p.add_argument("--port", type=int)
    p.add_argument("--parent-pid", type=int, default=None,
                   help="exit when this process is gone (launchers pass their own pid: a killed launcher leaves no server)")
    p.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"))
    return p


def uses_torch(settings: Settings) -> bool:
    """Whether the server may load torch (a dense index's encoder, torch's GPU search): one over
    BM25 indexes alone does not, and its hardware line says `torch=unused`. An index dir that
    cannot be read counts as dense (loading it then says what is wrong)."""
    from data_prep.indexing import read_meta

    if settings.kind == "bm25":
        return False
    try:
        return any(read_meta(d)["kind"] != "bm25" for d in settings.index)
    except (OSError, ValueError, KeyError, TypeError):
        return True


def main(argv: list[str] | None = None) -> int:
    from data_prep.hardware import offline_env, passive_threads

    passive_threads()  # before faiss loads OpenMP: idle threads must not spin on shared cores
    offline_env()
    args = vars(build_parser().parse_args(argv))
    config = args.pop("config")
    parent_pid = args.pop("parent_pid")
    if args["api_key"] is not None:
        print("agent-rl-retriever: warning: --api-key is visible to every user in `ps`; "
              "use env RETRIEVER_API_KEY or --api-key-file", file=sys.stderr)
    elif args["api_key_file"] is None:
        args["api_key"] = os.environ.get("RETRIEVER_API_KEY") or None
    try:
        settings: Settings = load_settings(config, **args)
    except (OSError, ValueError) as e:
        from pydantic import ValidationError

        if isinstance(e, ValidationError):  # one line per problem, naming the setting
            e = "; ".join((f"{'.'.join(map(str, err['loc']))}: " if err["loc"] else "")
                          + err["msg"].removeprefix("Value error, ") for err in e.errors())
        print(f"agent-rl-retriever: bad settings: {e}", file=sys.stderr)
        return 2
    if not settings.index or not settings.corpus:
        print("agent-rl-retriever: --index and --corpus are required (or set them in --config)", file=sys.stderr)
        return 2
    from data_prep.hardware import announce

    announce(torch_facts=uses_torch(settings))
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import uvicorn

    from retriever_server.app import create_app
    from retriever_server.http_guard import server_config

    fatal: list[str] = []
    server: uvicorn.Server | None = None

    def on_fatal(msg: str) -> None:
        fatal.append(msg)
        if server is not None:
            server.should_exit = True

    app = create_app(settings, on_fatal=on_fatal)
    # the header limits live in uvicorn's protocol (http_guard): they run before the app
    config_ = server_config(app, settings.host, settings.port, log_level=settings.log_level,
                            access_log=False, loop="auto", timeout_keep_alive=30, backlog=4096)
    server = uvicorn.Server(config_)
    if parent_pid:
        from retriever_server.watchdog import exit_with

        exit_with(parent_pid, lambda: setattr(server, "should_exit", True))
    server.run()
    if fatal:
        print(f"agent-rl-retriever: refusing to start: {fatal[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
