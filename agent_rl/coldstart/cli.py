"""The cold-start commands: their parsers and entry points; the work is in `sft` and `demos`.

    agent-rl-sft --config configs/sft/demo_cpu.yaml trainer.max_time_s=300     (sft_main)
    agent-rl-prep demos --qa FILE --retriever-url URL --out demos.parquet ...    (demos_main)
    python -m agent_rl.coldstart.cli sft|demos ...                               (the same)

The working modules are imported once the arguments are parsed, so `--help` starts fast.
"""

from __future__ import annotations

import argparse
import sys

NONE_KEPT = 3
"""`demos`' exit status when no candidate was grounded: not a failure of the run, so a recipe
over several QA sets (scripts/real_data.sh) can leave that set out and go on."""


# ----------------------------------------------------------------------------- agent-rl-sft
def sft_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="agent-rl-sft",
                                 description="`agent-rl-sft --config configs/sft/X.yaml key=value ...`: cold-start "
                                             "supervised fine-tuning.",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=None, help="YAML config (configs/sft/*.yaml); defaults otherwise")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. actor_rollout_ref.actor.optim.lr=2e-5")
    return ap


def sft_main(argv: list[str] | None = None) -> int:
    """`agent-rl-sft`: SFT on demonstrations (agent_rl.coldstart.sft.run_sft)."""
    args = sft_parser().parse_args(argv)
    from data_prep.hardware import offline_env

    offline_env()
    from agent_rl.config import SFTConfig, check_paths, load_config

    try:  # every bad setting in one line, before the model loads
        cfg = load_config(SFTConfig, args.config, args.overrides)
        check_paths(cfg, ("actor_rollout_ref.model.path", "data.train_files", "data.val_files"))
    except (OSError, ValueError) as e:
        print(f"agent-rl-sft: error: {e}", file=sys.stderr)
        return 2
    from agent_rl.coldstart.sft import run_sft
    from agent_rl.precision import announce_run

    announce_run(cfg, engine=False)
    try:
        run_sft(cfg)
    except KeyboardInterrupt:
        print("\n[sft] interrupted (rerun the same command to resume from the last checkpoint, if any)", flush=True)
        return 130
    finally:
        if cfg.trainer.num_actor_workers > 1:
            import ray

            ray.shutdown()
    return 0


# ----------------------------------------------------------------------------- agent-rl-prep demos
def _kinds_arg(value: str) -> list[str]:
    """`--kinds single,bridge:40` -> ["single", "bridge:40"], each entry checked."""
    from agent_rl.coldstart.demos import kind_caps

    kinds = [k.strip() for k in value.split(",") if k.strip()]
    try:
        kind_caps(kinds)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return kinds


def demos_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="agent-rl-prep demos",
        description="Build grounded cold-start demonstration trajectories with the rollout's own template, "
                    "tags, observation formatting and tokenization, and real retriever observations.",
        epilog=f"Exit status: 0 written; 1 retriever unavailable; 2 bad arguments or input files; {NONE_KEPT} no "
               "question could be grounded in this corpus (nothing written; a recipe may go on without this set). "
               "Example: agent-rl-prep demos --qa artifacts/kb/train.parquet --retriever-url http://127.0.0.1:8000 "
               "--out artifacts/demos/kb_train.parquet --config configs/train/demo_grpo_cpu.yaml",
    )
    ap.add_argument("--qa", required=True, metavar="FILE", help="QA file (any format data_prep.qa.read_qa reads)")
    ap.add_argument("--retriever-url", required=True, metavar="URL", help="running retriever (base URL or .../retrieve)")
    ap.add_argument("--retriever-api-key-file", default=None, metavar="FILE",
                    help="file holding the retriever's API key (default: retriever.api_key_file, else env RETRIEVER_API_KEY)")
    ap.add_argument("--out", required=True, metavar="FILE", help="output .parquet (written atomically)")
    ap.add_argument("--max-searches", type=int, default=None, metavar="K",
                    help="most searches per demonstration (default: the config's max_turns)")
    ap.add_argument("--limit", type=int, default=None, metavar="N", help="use a seeded random sample of N QA rows")
    ap.add_argument("--rest", action="store_true",
                    help="use the QA rows outside the --limit sample instead: the questions a build with the same "
                         "--limit and --seed did not try (e.g. RL-only questions the corpus can answer)")
    ap.add_argument("--seed", type=int, default=0, help="seed for --limit and the reasoning wording (default 0)")
    ap.add_argument("--config", default=None, metavar="YAML",
                    help="the RL run's config (configs/train/*.yaml): template, lengths, topk, max_turns, model")
    ap.add_argument("--model", default=None, metavar="DIR",
                    help="tokenizer directory (default: actor_rollout_ref.model.path of the config)")
    ap.add_argument("--chains", type=int, default=4, metavar="K",
                    help="second searches tried per question whose own search retrieves no gold answer: its "
                         "supporting titles, then names its first observation mentions; the first that retrieves "
                         "a gold answer makes a two-search demonstration (default 4; 0: single searches only)")
    ap.add_argument("--plain-wording", action="store_true",
                    help="plain Search-R1 think / search / answer turns: leave out the knowledge base's phrasing (what "
                         "the question asks for, \"This needs N searches\", \"That was search i of n\")")
    ap.add_argument("--kinds", type=_kinds_arg, default=None, metavar="K1,K2:N",
                    help="build only from questions of these kinds (the QA file's `kind`, HotpotQA's `type`), e.g. "
                    "`--kinds single,comparison`; `K:N` keeps a seeded random N of kind K (a kind shown rarely), "
                    "e.g. `--kinds single,comparison,bridge:40`; the other sampled questions are left out and "
                    "counted (default: every kind)")
    ap.add_argument("--dropped", default=None, metavar="FILE", help="also write each dropped id and reason (jsonl)")
    ap.add_argument("overrides", nargs="*", help="config overrides, e.g. data.max_response_length=400")
    return ap


def demos_main(argv: list[str] | None = None) -> int:
    """`agent-rl-prep demos` (data_prep's CLI dispatches here by name): grounded demonstrations
    (agent_rl.coldstart.demos.build_demos) of a QA file, through a running retriever."""
    args = demos_parser().parse_args(argv)
    from data_prep.hardware import offline_env

    offline_env()
    import asyncio
    import json
    import time
    from pathlib import Path

    from agent_rl.config import TrainConfig, load_config

    try:  # a bad setting in one line, before the model and the retriever
        cfg = load_config(TrainConfig, args.config, args.overrides + (
            [f"retriever.api_key_file={args.retriever_api_key_file}"] if args.retriever_api_key_file else []))
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    max_searches = cfg.max_turns if args.max_searches is None else args.max_searches
    if args.rest and args.limit is None:
        print("error: --rest needs --limit (the sample whose complement to use)", file=sys.stderr)
        return 2
    if max_searches < 1:
        print(f"error: --max-searches must be >= 1, got {max_searches}", file=sys.stderr)
        return 2
    if max_searches > cfg.max_turns:
        print(f"error: --max-searches {max_searches} exceeds max_turns={cfg.max_turns} of the config "
              "(the rollout would not execute the extra searches); raise max_turns", file=sys.stderr)
        return 2

    from tqdm import tqdm
    from transformers import AutoTokenizer

    from agent_rl.coldstart.demo_file import settings_of, write_demos
    from agent_rl.coldstart.demos import BuildResult, build_demos, of_kinds, report_lines, select_rows
    from agent_rl.rollout.retrieval_client import (ApiKeyFileError, RetrieverAuthError, RetrieverClient,
                                                   RetrieverUnavailable)
    from data_prep.io import DataPrepError, Report
    from data_prep.qa import read_qa

    model = args.model or cfg.actor_rollout_ref.model.path
    if not Path(model).is_dir():  # else transformers reads it as a hub id: "couldn't connect to huggingface.co"
        given = "--model" if args.model else "the config's actor_rollout_ref.model.path"
        print(f"error: the tokenizer's directory {model} does not exist ({given}; the embedded model: "
              "`agent-rl-prep model --out artifacts/model`)", file=sys.stderr)
        return 2
    qa_report = Report()  # a malformed QA row is reported and skipped; the build goes on
    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
        rows = select_rows(read_qa(args.qa, qa_report).to_dict("records"), args.limit, args.seed, args.rest)
    except (OSError, DataPrepError) as e:  # missing files, unreadable QA files: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows, left_out = of_kinds(rows, args.kinds, args.seed)
    if args.kinds is not None:
        print(f"[demos] --kinds {','.join(args.kinds)}: {len(rows)} questions, {left_out} of other kinds left out",
              flush=True)
        if not rows:
            print(f"error: no question of kinds {args.kinds} in {args.qa}", file=sys.stderr)
            return 2
    if qa_report.problems:
        print(f"[demos] skipped {qa_report.skipped} malformed QA rows of {qa_report.read}:", file=sys.stderr)
        qa_report.print_problems()
    url = args.retriever_url  # base or Search-R1's .../retrieve form: the client accepts both

    async def run() -> BuildResult:
        client = RetrieverClient.from_config(cfg.retriever, [url])
        try:
            await client.wait_healthy(timeout=cfg.trainer.retriever_health_timeout_s)
            with tqdm(total=len(rows), desc="demos", unit="q", dynamic_ncols=True) as bar:
                return await build_demos(rows, client.search, tokenizer, cfg, max_searches, args.seed, bar.update,
                                         chains=args.chains, kb_phrasing=not args.plain_wording)
        finally:
            await client.aclose()

    t0 = time.time()
    try:
        res = asyncio.run(run())
    except RetrieverUnavailable as e:
        print(f"error: retriever at {url}: {e}", file=sys.stderr)
        return 1
    except (RetrieverAuthError, ApiKeyFileError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in report_lines(res, time.time() - t0):
        print(line, flush=True)
    settings = settings_of(cfg, model, qa=str(args.qa), retriever_url=url, seed=args.seed,
                           max_searches=max_searches, chains=args.chains, kb_phrasing=not args.plain_wording,
                           kinds=args.kinds, candidates=res.candidates, kept=len(res.rows),
                           dropped=dict(res.dropped))
    if args.dropped:
        Path(args.dropped).parent.mkdir(parents=True, exist_ok=True)
        Path(args.dropped).write_text("".join(json.dumps({"id": i, "reason": r}) + "\n" for i, r in res.dropped_ids))
    if not res.rows:
        print("error: no grounded demonstration was kept (see the reasons above); nothing written", file=sys.stderr)
        return NONE_KEPT
    write_demos(res.rows, args.out, settings)
    print(f"[demos] wrote {len(res.rows)} demonstrations to {args.out}", flush=True)
    return 0


# ----------------------------------------------------------------------------- python -m
COMMANDS = {"sft": (sft_main, "cold-start SFT on demonstrations (agent-rl-sft)"),
            "demos": (demos_main, "build grounded demonstrations (agent-rl-prep demos)")}


def main(argv: list[str] | None = None) -> int:
    """`python -m agent_rl.coldstart.cli COMMAND ...`: the cold-start commands by module path."""
    from data_prep.cli import dispatch

    return dispatch("python -m agent_rl.coldstart.cli", COMMANDS, argv)


if __name__ == "__main__":  # vLLM and Ray start processes with spawn: guard the entry point
    sys.exit(main())
