"""`python -m agent_rl.demo` (`make demo`): runs agent_rl.demo.cli."""

import sys

from agent_rl.demo.cli import main

if __name__ == "__main__":  # vLLM and Ray start processes with spawn: guard the entry point
    sys.exit(main())
