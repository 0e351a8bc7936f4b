"""Does RL beat the simple ways to spend the same minutes? Arms from one start, every second counted (not in CI).

    python -m benchmarks.rl_vs_sft --kb-seed 101 --seeds 1 2 3 [--arms sft_more rft grpo sft_all]
                                   [--kb-kind standard] [--start-steps N] [--minutes 10]
                                   [--sft-lr LR] [--sft-epochs E] [--rft-lr LR] [--eval-limit 200]
                                   [--workdir DIR] [--json PATH] [key=value ...]

On a knowledge base generated with `--kb-seed` and `--kb-kind` (`agent-rl-prep synthetic --seed
--kind`; each kind's dev KB, DEV_KB_SEEDS, is where design decisions are made: report on any
other), for each cell (a KB seed x a run seed: several `--kb-seed` values run every seed on each):

1. start: cold-start SFT for `--start-steps` steps on `--demos` of the KB's grounded
   demonstrations (data order follows the seed; default START_STEPS: 60 on both host kinds);
2. from that model, each arm of `--arms` (default all four), with the same minutes on one clock
   rule (`trainer.max_time_s` with `trainer.max_time_counts=all`: every second from the arm's
   first step, its generation, running evaluations, checkpoints and logging included; start-up,
   the step-0 evaluation of the start and the save after the last step are in no arm's minutes):
   - sft_more: SFT continued on the same demonstrations (another order, same seed family) at
     `--sft-lr` for `--sft-epochs` epochs (defaults: the SFT config's lr, until the clock);
   - rft: rejection sampling fine-tuning, the GRPO arm's run with
     `algorithm.adv_estimator=rejection_sampling` (the samples whose answer is right, trained by
     their NLL) at `--rft-lr` (default: the GRPO config's lr, or the lr of the overrides);
   - grpo: GRPO on the KB's training questions (configs/train/demo_grpo_cpu.yaml; data order and
     sampling follow the seed);
   - sft_all, a reference line: SFT on demonstrations for every training question (what gold
     search chains would give; real data has none) at the SFT config's lr, until the clock;
3. SFT at GRPO's minutes (with sft_more and grpo): each arm's last step ends before the budget
   by up to a step, and GRPO's steps are long, so GRPO may train fewer minutes than the SFT arm.
   The same SFT run (same seed, order and lr: the same steps) is taken again to the last step
   that had ended within GRPO's minutes, by the SFT arm's own step times (the table warns where a
   replayed step's loss differs: then it was not the same run);
4. the start and every trained model are evaluated greedily in agent mode on the same held-out
   questions (a seeded sample of the KB's test questions, the first `--val-n` of which are kept
   apart for the running evaluation): agent EM, searches per question and how often the searches
   follow the better strategy (`query_strategy`: name + attribute, the lookalike kind's headroom
   in benchmarks/kb_headroom.py, against the demonstrations' name only; n/a where no query can be
   told), each by question kind (single / bridge / comparison), with the agent EM of the questions
   searched each way (`em_by_strategy`: does the better strategy pay for this policy); strict
   format; and the paired differences GRPO - SFT more, GRPO - RFT and RFT - SFT more with their
   95% intervals over questions. Over cells: mean, median, worst and best, and a t interval
   across KB x seed (df = cells - 1; n/a with one cell).

Best checkpoints (`--best-of-val`): with few demonstrations an SFT arm's last step can sit past
its best (it overfits), a weak control. Then every arm also keeps a checkpoint (SFT arms every
`--sft-val-every` steps, RL arms every `--val-every`, all at their last step; the saves are on
the clock), every one of them and the start (step 0) is scored by the evaluation command on the
`--val-n` running-evaluation questions, and each arm's best (ties go to fewer steps) is scored on
the report questions: the arms' bests against each other, each chosen on questions the report
does not hold.

Time to gain: `time_to_gain_min` is an RL arm's training minutes until its EM on the `--val-n`
questions first passes the SFT arm's (at the end of its minutes, by the evaluation command) by
`--gain`. With `--best-of-val` the RL arm's EM there is the evaluation command's at each
checkpoint, the scorer of the SFT arm's; without it, the trainer's running evaluation every
`--val-every` steps, whose scores differ from the command's by about a question in 40
(`time_to_gain_by`).

It prints each cell's row and the summary over cells, and writes JSON and a PNG (the KB's workdir,
default runs/rl_vs_sft/kb<K>, <kind>_kb<K> for another kind; with several KB seeds each KB has its
own and the whole run's go to --workdir, default runs/rl_vs_sft/<kind>_kbs<K1>_<K2>...), and for
each cell `seed<S>/per_question.json` in its KB's workdir: every model's EM on each report
question, by id, and every checkpoint's running-evaluation EM. A re-run with the same workdir
reuses every finished stage (an arm added later runs alone), and refuses a workdir made with
other settings (its settings.json). Extra `key=value` arguments override the GRPO config of both
RL arms (veRL names).

Cells run in several sittings (or on several hosts of one kind) count together:

    python -m benchmarks.rl_vs_sft --kb-seed 101 --seeds 3 --with runs/rl_vs_sft/kb101/rl_vs_sft.json

runs seed 3 and reports it beside the rows of the earlier run's JSON; an earlier file made with
other settings (one from before the clock counted every second among them), on another host kind
or holding one of this run's cells is refused before anything runs. Each row keeps its own
hardware line.

Choosing `--start-steps` (a design decision: make it on the dev KB, seed 0):

    python -m benchmarks.rl_vs_sft --kb-seed 0 --seeds 1 2 --start-curve 20 100

trains each seed's start SFT once to 100 steps, saving every 20 (the lr is constant after its
warm-up, so the checkpoint at step k is the k-step start), and evaluates every checkpoint on the
report questions: agent EM by question kind and searches per question against steps
(`start_curve.{md,json,png}`). The fair start is where that curve has stopped rising: more SFT
from there gains nothing, and what RL adds is RL's.

What the start's own searches earn each way (designing a change on the lookalike kind's dev KB):

    python -m benchmarks.rl_vs_sft --kb-kind lookalike --kb-seed 7 --seeds 1 --start-curve 60 60 --demos 50

scores the benchmark's start alone, and on the lookalike kind each point also gives the better
strategy's share of searches and, over all questions and by kind, the agent EM and the retrieval
hit of the questions searched with the attribute against by name only (`strategy_by_kind`).

What GRPO's advantage sees of the strategies (the same design work, with the arms):

    python -m benchmarks.rl_vs_sft --kb-kind lookalike --kb-seed 7 --seeds 1 --arms grpo --log-batches ...

has each RL arm write every step's whole batch (`<arm>/rollouts`, trainer.rollout_data_dir) and
gives per arm the better strategy's share of its trajectories step by step and, in the groups that
sampled both strategies (the only place an outcome reward can move the policy between them), each
strategy's mean reward, EM and GRPO advantage (`group_strategy`).
"""

# The package (its docstring above is `--help`'s description): `settings` (what a command runs,
# one dataclass that `cli` builds once), `compat` (a workdir's or an earlier run's settings
# against this run's, with what old ones lacked), `runs` (a stage, an evaluation, what a run
# left), `arms` (each arm's command), `best` (best checkpoints, time to gain), `by_strategy` (what
# the searches each way earned), `cell` (a cell's start, arms, evaluations and row), `modes` (the
# arms, the start curve, the choice), `cli`. The tables and the choice's rule are
# benchmarks/rl_vs_sft_tables.py and benchmarks/rl_vs_sft_choice.py (benchmarks/records.py reads them).
