"""The demo's commands: their parsers and entry points; the work is in `pipeline` and `calibrate`.

    python -m agent_rl.demo [--budget-minutes M] ...     (main: the whole demo, `make demo`)
    python -m agent_rl.demo calibrate --model DIR ...    (calibrate_main: this host's speed)

`python -m agent_rl.demo.cli` is the same as `python -m agent_rl.demo`.
"""

from __future__ import annotations

import argparse
import sys


# ----------------------------------------------------------------------------- the demo
def demo_parser() -> argparse.ArgumentParser:
    from agent_rl.demo import pipeline
    from agent_rl.demo.budget import SIZES

    lo, hi = SIZES.budget_minutes
    ap = argparse.ArgumentParser(prog="python -m agent_rl.demo", description=pipeline.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="`python -m agent_rl.demo calibrate --help`: the calibration stage alone.")
    ap.add_argument("--workdir", default="artifacts", help="where artifacts go (default: artifacts/)")
    ap.add_argument("--port", type=int, default=0, help="retriever port (0: a free port)")
    ap.add_argument("--budget-minutes", type=float, default=None,
                    help="wall-time budget of the whole demo: after a short calibration the stages below are sized "
                         f"to end inside it on this host (default: {lo:g}; on a host without native bf16 up to "
                         f"{hi:g} where it needs that long for {SIZES.min_sft_steps} SFT and {SIZES.min_rl_steps} "
                         "GRPO steps)")
    ap.add_argument("--demos", type=int, default=None, help="training questions to build demonstrations from (default: budgeted)")
    ap.add_argument("--sft-minutes", type=float, default=None, help="SFT time budget (default: budgeted)")
    ap.add_argument("--rl-minutes", type=float, default=None,
                    help="GRPO time budget after SFT; 0 skips GRPO (default: what is left before the last evaluation)")
    ap.add_argument("--rl-steps", type=int, default=None, help="at most this many GRPO steps (default: the clock decides)")
    ap.add_argument("--eval-limit", type=int, default=None,
                    help=f"held-out questions on which SFT and SFT+RL are compared (default {SIZES.eval_limit})")
    ap.add_argument("--retrieval-only", action="store_true", help="stop after showing retrieval")
    ap.add_argument("--protocol", default="search_r1", choices=("search_r1", "hermes"),
                    help="how the model acts: search_r1 (<search> tags, default) or hermes (native <tool_call> JSON, "
                         "results as tool messages); demonstrations, SFT, GRPO and evaluation all use it")
    ap.add_argument("--plain-wording", action="store_true",
                    help="demonstrations in plain Search-R1 wording, without the knowledge base's phrasing (what the "
                         "question asks for, \"This needs N searches\", \"That was search i of n\"): what that "
                         "phrasing adds; its own demonstrations and runs, beside the default's")
    ap.add_argument("--grpo-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for the GRPO stage alone, in veRL's dotted names (e.g. "
                         "actor_rollout_ref.rollout.enforce_eager=false: CUDA graphs for the engine on a GPU); "
                         "repeat for more; checked against the GRPO config before anything runs")
    return ap


def main(argv: list[str] | None = None) -> int:
    """`python -m agent_rl.demo`: the whole demo (agent_rl.demo.pipeline.run_demo); with
    `calibrate` first, the calibration alone."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["calibrate"]:
        return calibrate_main(argv[1:])
    ap = demo_parser()
    args = ap.parse_args(argv)
    if args.grpo_set:  # a typo fails now, not when the GRPO stage starts twenty minutes in
        from agent_rl.config import TrainConfig, load_config
        from agent_rl.demo.stages import ROOT, TRAIN_CFG

        try:
            load_config(TrainConfig, ROOT / TRAIN_CFG, args.grpo_set)
        except ValueError as e:
            ap.error(f"--grpo-set: {e}")
    from data_prep.hardware import offline_env

    offline_env()
    from agent_rl.demo.pipeline import run_demo

    return run_demo(args)


# ----------------------------------------------------------------------------- calibrate
def calibrate_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m agent_rl.demo calibrate",
                                 description="Measure, in a few seconds, how fast this host updates and generates "
                                             "with a given model.")
    ap.add_argument("--model", required=True, help="HF model directory")
    ap.add_argument("--config", default=None, help="train config whose precisions and engine settings to use")
    ap.add_argument("--batch", type=int, default=32, help="sequences decoded together")
    ap.add_argument("--gen-tokens", type=int, default=32, help="tokens generated per sequence")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides")
    return ap


def calibrate_main(argv: list[str] | None = None) -> int:
    """Update and generation tok/s of this host (agent_rl.demo.calibrate), printed and as JSON."""
    args = calibrate_parser().parse_args(argv)
    from data_prep.hardware import offline_env

    offline_env(engine=True)  # calibration runs a vLLM engine here
    import json
    from pathlib import Path

    from agent_rl.config import TrainConfig, load_config
    from agent_rl.demo.calibrate import calibrate

    cfg = load_config(TrainConfig, args.config, args.overrides)
    res = calibrate(args.model, cfg, args.batch, args.gen_tokens)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=2))
    print(f"[calibrate] update {res['update_tok_s']:.0f} tok/s ({res['update_dtype']}), generation "
          f"{res['gen_tok_s']:.0f} tok/s ({res['engine_dtype']}, batch {args.batch}), engine load {res['engine_load_s']:.0f}s",
          flush=True)
    return 0


if __name__ == "__main__":  # vLLM and Ray start processes with spawn: guard the entry point
    sys.exit(main())
