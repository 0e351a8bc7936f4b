"""The evaluation commands: their parsers and entry points; the work is in `evaluate`, `report`
and `plot`. The installed `agent-rl-eval` takes them all:

    agent-rl-eval --model DIR --retriever-url URL --data FILE --mode agent rag direct  (evaluate_main)
    agent-rl-eval report base=runs/eval/base SFT=runs/eval/sft                         (report_main)
    agent-rl-eval plot runs/demo                                                       (plot_main)
    agent-rl-eval show runs/demo/rollouts                                              (show_main)
    agent-rl-eval explore sft=runs/sft run=runs/grpo --data FILE --retriever-url URL   (explore_main)
    python -m agent_rl.evaluation.cli eval|report|plot|show|explore ...                (the same)

The heavier working modules are imported once the arguments are parsed, so `--help` starts fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from agent_rl.evaluation.report import ALL, MODES

if TYPE_CHECKING:
    from agent_rl.config import TrainConfig


# ----------------------------------------------------------------------------- agent-rl-eval
def eval_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="agent-rl-eval", description="`agent-rl-eval`: greedy evaluation of a model on held-out QA in three modes, "
                                          "resumable.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Other settings: --config a training YAML (lengths, template, reward) and/or dotted overrides, "
               "e.g. data.max_response_length=512 actor_rollout_ref.rollout.max_tokens_per_turn=64 "
               "(put them before the options, or after `--`).\n\nOther commands (`agent-rl-eval COMMAND --help`: "
               "their options):\n" + "".join(f"  agent-rl-eval {name:<7} {what}\n"
                                             for name, (_, what) in COMMANDS.items() if name != "eval"),
    )
    ap.add_argument("--model", required=True, help="HF model dir, run checkpoint dir, or run dir (its latest checkpoint)")
    ap.add_argument("--retriever-url", nargs="+", default=None,
                    help="retriever base URL(s) (http://host:port, /retrieve optional); needed for agent and rag")
    ap.add_argument("--data", nargs="+", default=None, help="QA files (parquet/jsonl); default: the config's data.val_files")
    ap.add_argument("--mode", nargs="+", default=["agent"], choices=MODES, help="one or more of agent rag direct (default agent)")
    ap.add_argument("--out", default=None, help="output directory (default runs/eval/<model name>)")
    ap.add_argument("--limit", type=int, default=None, help="a seeded random sample of N questions per data file")
    ap.add_argument("--seed", type=int, default=0, help="seed of the --limit sample and of the engine (default 0)")
    ap.add_argument("--max-turns", type=int, default=None, help="turns with search in agent mode (default: config max_turns)")
    ap.add_argument("--topk", type=int, default=None, help="passages per search / rag prompt (default: config retriever.topk)")
    ap.add_argument("--dtype", default=None, choices=("auto", "bfloat16", "float32", "float16"),
                    help="engine dtype (default: config; auto: bfloat16 where native, else float32)")
    ap.add_argument("--config", default=None, help="training YAML to take lengths, template and reward settings from")
    ap.add_argument("--concurrency", type=int, default=None, help="questions in flight (default: rollout.max_concurrent_trajectories)")
    ap.add_argument("--max-model-len", type=int, default=4096, help="engine context length (default 4096)")
    ap.add_argument("--retriever-api-key-file", default=None, metavar="FILE",
                    help="file holding the retriever's API key (default: retriever.api_key_file, else env RETRIEVER_API_KEY)")
    ap.add_argument("--retriever-wait", type=float, default=30.0, help="seconds to wait for the retriever's /health (default 30)")
    ap.add_argument("--overwrite", action="store_true", help="discard earlier results in --out instead of resuming")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides (veRL names)")
    return ap


def _default_out(model: str) -> str:
    p = Path(model).resolve()
    name = f"{p.parent.name}_{p.name}" if p.name == "actor" else p.name
    return str(Path("runs") / "eval" / name)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The training config the rollout manager needs: YAML, then dotted overrides, then flags."""
    from agent_rl.config import TrainConfig, load_config
    from agent_rl.evaluation.evaluate import EvalInputError, base_url

    over = list(args.overrides)
    over.append(f"actor_rollout_ref.model.path={args.model}")
    if args.retriever_url:
        over.append("retriever.url=[" + ",".join(base_url(u) for u in args.retriever_url) + "]")
    for flag, key in ((args.max_turns, "max_turns"), (args.topk, "retriever.topk"),
                      (args.retriever_api_key_file, "retriever.api_key_file"),
                      (args.dtype, "actor_rollout_ref.rollout.dtype"),
                      (args.concurrency, "actor_rollout_ref.rollout.max_concurrent_trajectories")):
        if flag is not None:
            over.append(f"{key}={flag}")
    over.append(f"actor_rollout_ref.rollout.seed={args.seed}")
    try:
        cfg = load_config(TrainConfig, args.config, over)
    except (OSError, ValueError) as e:
        raise EvalInputError(str(e)) from None
    return cfg  # --max-turns, --topk, --concurrency out of range: refused by load_config, naming the key


def eval_main(argv: list[str] | None = None) -> int:
    """The installed `agent-rl-eval`: `agent-rl-eval report|plot|show|eval ...` runs that command,
    anything else is an evaluation. An evaluation's own arguments never start with a command's name
    (options start with `-`, overrides hold `=`), so the two readings cannot overlap."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        return COMMANDS[argv[0]][0](argv[1:])
    return evaluate_main(argv)


def evaluate_main(argv: list[str] | None = None) -> int:
    """`agent-rl-eval --model ...`: greedy evaluation in each mode, resumable (agent_rl.evaluation.evaluate)."""
    args = eval_parser().parse_args(argv)
    from data_prep.hardware import offline_env

    offline_env(engine=True)  # evaluation runs a vLLM engine here
    import asyncio
    import logging

    from agent_rl.evaluation.evaluate import (NEEDS_RETRIEVER, EvalInputError, check_retriever, load_questions,
                                              resolve_model_dir, run_evaluation)
    from agent_rl.evaluation.report import summary_markdown

    logging.basicConfig(level=logging.WARNING, format="[eval] %(levelname)s %(name)s: %(message)s")
    modes = list(dict.fromkeys(args.mode))
    try:
        resolve_model_dir(args.model)
        cfg = config_from_args(args)
        from agent_rl.precision import announce_run

        announce_run(cfg)
        prompts = load_questions(args.data or cfg.data.val_files, args.limit, args.seed)
        if any(m in NEEDS_RETRIEVER for m in modes):
            if not args.retriever_url:
                raise EvalInputError(f"--retriever-url is required for mode(s) {[m for m in modes if m in NEEDS_RETRIEVER]}")
            asyncio.run(check_retriever(cfg.retriever, args.retriever_wait))
        out = args.out or _default_out(args.model)
        print(f"[eval] {len(prompts)} questions x modes {modes} -> {out}", flush=True)
        result = asyncio.run(run_evaluation(cfg, prompts, modes, out, overwrite=args.overwrite,
                                            progress=not args.no_progress, max_model_len=args.max_model_len))
    except EvalInputError as e:
        print(f"agent-rl-eval: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\n[eval] interrupted: finished questions are saved; rerun the same command to resume", file=sys.stderr)
        return 130
    print(f"[eval] ran {sum(result.computed.values())}, reused {sum(result.reused.values())} -> {out}")
    for mode, block in result.summary["modes"].items():
        if block["all"]["failed_retrieval"]:
            print(f"[eval] WARNING: {block['all']['failed_retrieval']} {mode} question(s) saw a failed retrieval "
                  "(an error text instead of passages); rerun the same command to retry them", file=sys.stderr)
    print(summary_markdown(result.summary), end="")
    return 0


# ----------------------------------------------------------------------------- report
def report_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="agent-rl-eval report",
                                 description="`agent-rl-eval report LABEL=EVAL_DIR ... [--json PATH]`: "
                                             "print the model x mode table.")
    ap.add_argument("runs", nargs="+", help="LABEL=EVAL_DIR pairs in row order, e.g. base=runs/eval/base")
    ap.add_argument("--source", default=ALL, help="data_source to show (default: all)")
    ap.add_argument("--json", default=None, help="also write the table as JSON here")
    return ap


def report_main(argv: list[str] | None = None) -> int:
    """The model x mode table of several evaluation directories (agent_rl.evaluation.report.comparison)."""
    args = report_parser().parse_args(argv)
    from data_prep.hardware import offline_env

    offline_env()
    import json

    from agent_rl.evaluation.report import comparison, comparison_markdown

    pairs = []
    for item in args.runs:
        label, sep, d = item.partition("=")
        if not sep or not label or not d:
            print(f"report: expected LABEL=EVAL_DIR, got {item!r}", file=sys.stderr)
            return 2
        pairs.append((label, d))
    try:
        table = comparison(pairs, source=args.source)
    except (OSError, ValueError) as e:
        print(f"report: error: {e}", file=sys.stderr)
        return 2
    print(comparison_markdown(table), end="")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1) + "\n")
    return 0


# ----------------------------------------------------------------------------- plot
def plot_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="agent-rl-eval plot",
                                 description="Plot a run's reward and EM curves from its metrics.jsonl to a PNG, or "
                                             "several runs side by side.")
    ap.add_argument("runs", nargs="+", help="a run directory containing metrics.jsonl, or LABEL=DIR pairs to compare")
    ap.add_argument("--out", default=None, help="PNG path (default RUN_DIR/curves.png; required to compare)")
    ap.add_argument("--keys", nargs="*", default=None, help="metric keys (default: reward/mean and EM curves)")
    ap.add_argument("--smooth", type=int, default=1, help="moving average over this many steps (comparisons)")
    return ap


def plot_main(argv: list[str] | None = None) -> int:
    """One run's curves (agent_rl.evaluation.plot.plot_run), or several runs compared (plot_runs)."""
    ap = plot_parser()
    args = ap.parse_args(argv)
    from data_prep.hardware import offline_env

    offline_env()
    from agent_rl.evaluation.plot import plot_run, plot_runs

    pairs = [r.split("=", 1) if "=" in r else (Path(r).name, r) for r in args.runs]
    if len(pairs) > 1 and not args.out:
        ap.error("--out is required to compare runs")
    try:
        if len(args.runs) == 1 and "=" not in args.runs[0]:
            print(plot_run(args.runs[0], args.out, args.keys))
        else:
            print(plot_runs(dict(pairs), args.out, args.keys or ["reward/mean", "reward/em"], max(1, args.smooth)))
    except FileNotFoundError as e:  # a run directory without its metrics: a user's path, not a bug
        print(f"plot: error: {e} (a run directory of agent-rl-train or agent-rl-sft)", file=sys.stderr)
        return 2
    return 0


# ----------------------------------------------------------------------------- show
def show_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="agent-rl-eval show",
                                 description="Render the sampled rollouts a run wrote (trainer.rollout_data_dir): each "
                                             "trajectory's reward breakdown and its response, the loss-masked context "
                                             "(observations, feedback, template) shaded, or in [[...]] without a terminal.")
    ap.add_argument("path", help="a rollout_data_dir, or one of its <step>.jsonl files")
    ap.add_argument("--step", type=int, default=None, help="only this step's file")
    ap.add_argument("--html", default=None, metavar="FILE", help="also write one static HTML page there")
    ap.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                    help="shade with terminal colours (auto: when stdout is a terminal)")
    return ap


def show_main(argv: list[str] | None = None) -> int:
    """Print (and optionally write as HTML) the records of `agent_rl.training.rollout_data`."""
    args = show_parser().parse_args(argv)
    from agent_rl.training.rollout_data import read_rollout_data, render_html, render_text

    if not Path(args.path).exists():
        print(f"show: error: {args.path} does not exist", file=sys.stderr)
        return 2
    records = read_rollout_data(args.path, args.step)
    if not records:
        print(f"show: no rollout records in {args.path}" + (f" for step {args.step}" if args.step is not None else ""),
              file=sys.stderr)
        return 2
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    print(render_text(records, color=color), end="")
    if args.html:
        Path(args.html).write_text(render_html(records, title=f"rollouts of {args.path}"), encoding="utf-8")
        print(f"[show] wrote {args.html}")
    return 0


# ----------------------------------------------------------------------------- explore
def explore_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="agent-rl-eval explore",
        description="`agent-rl-eval explore MODEL... --data FILE --retriever-url URL`: the exploration pre-flight "
                    "(docs/explore.md) of several checkpoints side by side: each samples --n answers to the same "
                    "--limit questions at --temperature through the training rollout, and the table says whether "
                    "RL can still learn from it.")
    ap.add_argument("models", nargs="+", metavar="MODEL",
                    help="model, run or checkpoint directories, or LABEL=DIR pairs (column order)")
    ap.add_argument("--data", nargs="+", required=True, help="QA files (parquet/jsonl): the training questions")
    ap.add_argument("--retriever-url", nargs="+", required=True, help="retriever base URL(s)")
    ap.add_argument("--n", type=int, default=None, help="samples per question (default: the config's rollout.n)")
    ap.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the config's)")
    ap.add_argument("--limit", type=int, default=32, help="a seeded random sample of K questions per file (default 32)")
    ap.add_argument("--protocol", default=None, help="action protocol (default: the config's rollout.protocol)")
    ap.add_argument("--by", default="kind", help="QA column to break the figures down by, where present (default kind)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the --limit sample and of the engine (default 0)")
    ap.add_argument("--config", default=None, help="training YAML to take lengths, template, reward and sampling from")
    ap.add_argument("--dtype", default=None, choices=("auto", "bfloat16", "float32", "float16"), help="engine dtype")
    ap.add_argument("--max-model-len", type=int, default=4096, help="engine context length (default 4096)")
    ap.add_argument("--retriever-wait", type=float, default=30.0, help="seconds to wait for the retriever's /health")
    ap.add_argument("--json", default=None, help="also write each model's explore/* figures and verdict here")
    ap.add_argument("--choose", action="store_true",
                    help="MODELs are SFT checkpoints in training order: name the RL start the handover rule picks "
                         "(the latest that passes every floor; docs/explore.md)")
    return ap


def explore_main(argv: list[str] | None = None) -> int:
    """Sample each model on the same questions (evaluate.sample_groups) and print the pre-flight
    of each side by side (agent_rl.training.explore.comparison)."""
    args = explore_parser().parse_args(argv)
    from data_prep.hardware import offline_env

    offline_env(engine=True)
    import asyncio
    import json

    from agent_rl.config import TrainConfig, load_config
    from agent_rl.evaluation.evaluate import (EvalInputError, base_url, check_retriever, load_questions,
                                              question_kinds, resolve_model_dir, sample_groups)
    from agent_rl.training import explore
    from agent_rl.training.groups import GroupRules

    pairs = [m.split("=", 1) if "=" in m else (Path(m).name, m) for m in args.models]
    try:
        over = ["retriever.url=[" + ",".join(base_url(u) for u in args.retriever_url) + "]",
                f"actor_rollout_ref.rollout.seed={args.seed}"]
        for flag, key in ((args.n, "actor_rollout_ref.rollout.n"),
                          (args.temperature, "actor_rollout_ref.rollout.temperature"),
                          (args.protocol, "actor_rollout_ref.rollout.protocol"),
                          (args.dtype, "actor_rollout_ref.rollout.dtype")):
            if flag is not None:
                over.append(f"{key}={flag}")
        dirs = {label: resolve_model_dir(d) for label, d in pairs}  # every model checked before any engine starts
        if len(dirs) < len(pairs):
            raise EvalInputError(f"two models share a label: {[label for label, _ in pairs]}")
        try:
            cfgs = {label: load_config(TrainConfig, args.config, [*over, f"actor_rollout_ref.model.path={d}"])
                    for label, d in dirs.items()}
        except (OSError, ValueError) as e:
            raise EvalInputError(str(e)) from None
        first = next(iter(cfgs.values()))
        prompts = load_questions(args.data, args.limit, args.seed)
        kinds = question_kinds(args.data, args.by)
        asyncio.run(check_retriever(first.retriever, args.retriever_wait))
    except EvalInputError as e:
        print(f"agent-rl-eval explore: error: {e}", file=sys.stderr)
        return 2
    rules = GroupRules.from_config(first)
    r = first.actor_rollout_ref.rollout
    print(f"[explore] {len(prompts)} questions x n {r.n} at temperature {r.temperature}, protocol {r.protocol}, "
          f"for {len(cfgs)} model(s)", flush=True)
    kind_of = (lambda tr: kinds.get(tr.question)) if kinds else None
    results = {}
    for label, cfg in cfgs.items():
        groups = asyncio.run(sample_groups(cfg, prompts, r.n, max_model_len=args.max_model_len))
        results[label] = explore.preflight(groups, kind_of, None, rules.filter_metric, rules.filter_on)
    print(explore.comparison(results), end="")
    out = {label: {"verdict": res.verdict, **res.metrics()} for label, res in results.items()}
    if args.choose:
        start, why = explore.choose_start(results)
        print(f"\nstart: {start} = {dirs[start]} ({why})")
        out["start"] = {"label": start, "model": str(dirs[start]), "why": why}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


# ----------------------------------------------------------------------------- the commands
COMMANDS = {"eval": (evaluate_main, "greedy evaluation in agent / rag / direct modes (agent-rl-eval --model ...)"),
            "report": (report_main, "the model x mode table of several evaluation directories"),
            "plot": (plot_main, "a run's reward and EM curves as PNG, or several runs compared"),
            "show": (show_main, "sampled rollouts a run wrote (trainer.rollout_data_dir), context shaded"),
            "explore": (explore_main, "the exploration pre-flight of several checkpoints side by side: can RL learn?")}


def main(argv: list[str] | None = None) -> int:
    """`python -m agent_rl.evaluation.cli COMMAND ...`: the evaluation commands by module path
    (`eval` named; the installed `agent-rl-eval` is `eval_main`)."""
    from data_prep.cli import dispatch

    return dispatch("python -m agent_rl.evaluation.cli", COMMANDS, argv)


if __name__ == "__main__":  # vLLM may start worker processes with spawn: guard the entry point
    sys.exit(main())
