"""`python -m agent_rl.demo` (`make demo`)."""

import sys

from agent_rl.demo.pipeline import main

if __name__ == "__main__":  # vLLM and Ray start processes with spawn: guard the entry point
    sys.exit(main())
