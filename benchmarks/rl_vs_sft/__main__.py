"""`python -m benchmarks.rl_vs_sft ...` (from a checkout's root): the command of benchmarks/rl_vs_sft/cli.py."""

import sys

from data_prep.hardware import offline_env

offline_env()  # before torch, transformers, vLLM or Ray load

from benchmarks.rl_vs_sft.cli import main  # noqa: E402

if __name__ == "__main__":  # vLLM and Ray start processes with spawn: guard the entry point
    sys.exit(main())
