"""Which model `make demo` hands over: GRPO's last model only where it beats the SFT model it
started from on held-out selection questions, else the SFT model.

GRPO from a few-step SFT either teaches the second search or does not, and a few GRPO steps
can lower EM as well as raise it (docs/real_data.md). The usual answer is model selection on
questions no reported figure uses: the GRPO run validates (greedy, agent mode) at step 0, i.e.
the SFT model, and at its last step; the demo keeps the SFT model unless the last step answered
at least `select_lead` more of them (configs/demo.yaml: 2 of 40; a one-question lead is the
smallest there is, and on the dev KB it carried no information). The selection questions are
the knowledge base's test questions outside the sample the report compares on, so the choice
never sees a reported question; the report still shows GRPO's own last model on the compared
questions, whichever is kept.
"""

from __future__ import annotations

import random
from pathlib import Path

VALIDATE_AT_ENDS = 1_000_000
"""trainer.test_freq for a run validated only before its first step and after its last one
(the trainer validates the step the run stops at, by step count or by the clock)."""


def write_selection_questions(test: Path, out: Path, compared_limit: int, n: int, seed: int = 1) -> int:
    """`n` of `test`'s questions outside the evaluation's seeded `--limit compared_limit` sample
    (agent_rl.evaluation.evaluate.load_questions, its default seed), a seeded sample kept in
    file order, written to `out`; returns how many (fewer when the rest holds fewer)."""
    import pandas as pd

    from agent_rl.evaluation.evaluate import load_questions
    from data_prep.atomic import atomic_path

    compared = {p.id for p in load_questions([str(test)], compared_limit)}
    rest = [p.id for p in load_questions([str(test)]) if p.id not in compared]
    chosen = set(random.Random(seed).sample(rest, min(n, len(rest))))
    df = pd.read_parquet(test)
    df = df[df["id"].astype(str).isin(chosen)]
    with atomic_path(out) as tmp:
        df.to_parquet(tmp)
    return len(df)


def grpo_overrides(questions: Path, n: int) -> list[str]:
    """The GRPO run validates on `questions` (all `n` decoded together) at step 0 and its last step."""
    return [f"data.val_files=[{questions}]", f"data.val_batch_size={n}", "data.val_data_num=null",
            "trainer.val_before_train=true", f"trainer.test_freq={VALIDATE_AT_ENDS}"]


def choose(run_dir: Path, n: int, lead: int) -> dict:
    """From the GRPO run's metrics: val/em at step 0 (the SFT model) and at the last step, each
    over the same `n` questions. Returns {"n", "lead", "sft_em", "rl_em", "rl_step", "chosen"}:
    "SFT+RL" when the last step answered at least `lead` more of them, else "SFT" (a smaller
    lead keeps the model with less training behind it). A run
    without both validations (say `trainer.test_freq=-1` was passed) keeps the SFT model, and
    "unvalidated" says why."""
    from agent_rl.training.metrics import validation_points

    points = [(step, em) for step, _, em in validation_points(run_dir)]
    first = [em for step, em in points if step == 0]
    later = [(step, em) for step, em in points if step > 0]
    if not first or not later:
        return {"n": n, "lead": lead, "sft_em": first[-1] if first else None, "rl_em": None, "rl_step": None,
                "chosen": "SFT",
                "unvalidated": f"the GRPO run in {run_dir} has no validation at step 0 and after a step "
                               f"(val/em at steps {[s for s, _ in points]})"}
    rl_step, rl_em = max(later)
    ahead = round((rl_em - first[-1]) * n)  # questions: both EMs are shares of the same n
    return {"n": n, "lead": lead, "sft_em": first[-1], "rl_em": rl_em, "rl_step": rl_step,
            "chosen": "SFT+RL" if ahead >= lead else "SFT"}


def selection_markdown(sel: dict, paired_diff: float) -> str:
    """The report's section on the model handed over, `paired_diff` being GRPO's last model minus
    SFT on the compared questions (agent EM)."""
    kept = sel["chosen"] == "SFT+RL"
    where = f" Its files: `{sel['model']}`." if sel.get("model") else ""
    if sel.get("unvalidated"):
        return (f"## The model this demo hands over: the SFT model\n\nGRPO's model could not be chosen over "
                f"it: {sel['unvalidated']}, so the demo keeps the SFT model (agent EM **+0.0** against SFT: "
                f"the same model).{where} GRPO's own last model, not kept, is still compared below: "
                f"{100 * paired_diff:+.1f}.\n\n")
    why = (f"GRPO's model after step {sel['rl_step']} scored {100 * sel['rl_em']:.1f}% agent EM on {sel['n']} "
           f"selection questions (held-out questions outside the compared ones), the SFT model "
           f"{100 * sel['sft_em']:.1f}%")
    if kept:
        return (f"## The model this demo hands over: SFT+RL\n\n{why}: GRPO's model is kept.{where} On the "
                f"compared questions it differs from SFT by **{100 * paired_diff:+.1f}** agent EM (below).\n\n")
    lead = sel["lead"]  # choose() always says it
    return (f"## The model this demo hands over: the SFT model\n\n{why}: GRPO did not beat it there by {lead} "
            f"question{'s' if lead != 1 else ''} or more, so the demo keeps the SFT model (agent EM **+0.0** "
            f"against SFT: the same model).{where} GRPO's own last model, not kept, is still compared below: "
            f"{100 * paired_diff:+.1f}.\n\n")
