"""Which model `make demo` hands over: GRPO's last model only where it beats the SFT model it
started from on held-out selection questions by more than chance, else the SFT model.

GRPO from a few-step SFT either teaches the second search or does not, and a few GRPO steps
can lower EM as well as raise it (docs/real_data.md). The usual answer is model selection on
questions no reported figure uses: the GRPO run validates (greedy, agent mode) at step 0, i.e.
the SFT model, and at its last step, and writes each question's result
(trainer.validation_data_dir); the demo keeps the SFT model unless the last step's lead is
significant: of the questions on which the two disagree, GRPO's must win so many that two
equal models would split them at least that unevenly with a chance of at most `select_alpha`
(configs/demo.yaml: 0.05, the exact McNemar test, two-sided as usual). A lead of five questions
is never enough (5-0: 0.062), six can be (6-0: 0.031; 7-1: 0.070; 8-1: 0.039); on the dev KB a
five-question lead went with −4.5 on the compared questions, every lead of six or more with a
gain. The selection questions are the knowledge base's test questions outside the sample the
report compares on, so the choice never sees a reported question; the report still shows
GRPO's own last model on the compared questions, whichever is kept.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

VALIDATIONS = "validation"
"""The GRPO run's question-by-question validations: `<run_dir>/validation/<step>.jsonl`."""

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


def grpo_overrides(questions: Path, n: int, run_dir: Path) -> list[str]:
    """The GRPO run in `run_dir` validates on `questions` (all `n` decoded together) at step 0 and
    its last step, each question's result written where `choose` reads it."""
    return [f"data.val_files=[{questions}]", f"data.val_batch_size={n}", "data.val_data_num=null",
            "trainer.val_before_train=true", f"trainer.test_freq={VALIDATE_AT_ENDS}",
            f"trainer.validation_data_dir={run_dir / VALIDATIONS}"]


def mcnemar_p(wins: int, losses: int) -> float:
    """Exact McNemar test (two-sided): the chance that of `wins + losses` questions on which two
    equally good models disagree, one wins at least max(wins, losses) of them (a fair coin each)."""
    n, k = wins + losses, max(wins, losses)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n)


def choose(run_dir: Path, n: int, alpha: float) -> dict:
    """From the GRPO run's validations (metrics and `<run_dir>/validation/<step>.jsonl`): step 0
    (the SFT model) and the last step, question by question over the same `n` questions.
    Returns {"n", "alpha", "sft_em", "rl_em", "rl_step", "wins", "losses", "p", "chosen"}:
    "SFT+RL" when the last step leads and its lead is significant at `alpha` (`mcnemar_p` of the
    questions it alone answered, `wins`, against those only the SFT model answered, `losses`),
    else "SFT" (a lead that chance alone often gives keeps the model with less training behind
    it). A run without both validations (say `trainer.test_freq=-1` was passed) or their
    questions keeps the SFT model, and "unvalidated" says why."""
    from agent_rl.training.metrics import validation_points, validation_rows

    points = [(step, em) for step, _, em in validation_points(run_dir)]
    first = [em for step, em in points if step == 0]
    later = [(step, em) for step, em in points if step > 0]
    out = {"n": n, "alpha": alpha, "sft_em": first[-1] if first else None, "rl_em": None, "rl_step": None,
           "chosen": "SFT"}
    if not first or not later:
        return {**out, "unvalidated": f"the GRPO run in {run_dir} has no validation at step 0 and after a step "
                                      f"(val/em at steps {[s for s, _ in points]})"}
    rl_step, rl_em = max(later)
    out.update(rl_em=rl_em, rl_step=rl_step)
    try:
        sft, rl = (validation_rows(run_dir / VALIDATIONS, step) for step in (0, rl_step))
    except (OSError, ValueError) as e:
        return {**out, "unvalidated": f"the GRPO run's questions cannot be compared one by one: {e}"}
    if sft.keys() != rl.keys():
        return {**out, "unvalidated": f"the GRPO run validated different questions at step 0 ({len(sft)}) and "
                                      f"step {rl_step} ({len(rl)})"}
    wins = sum(rl[q] == 1.0 and sft[q] != 1.0 for q in sft)
    losses = sum(sft[q] == 1.0 and rl[q] != 1.0 for q in sft)
    p = mcnemar_p(wins, losses)
    return {**out, "wins": wins, "losses": losses, "p": p, "chosen": "SFT+RL" if wins > losses and p <= alpha else "SFT"}


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
           f"{100 * sel['sft_em']:.1f}%: GRPO's answered {sel['wins']} that SFT's missed and missed "
           f"{sel['losses']} that SFT's answered; two equally good models split so unevenly with a chance of "
           f"{sel['p']:.3f} (exact McNemar test)")
    if kept:
        return (f"## The model this demo hands over: SFT+RL\n\n{why}, at most {sel['alpha']:g}: GRPO's model is "
                f"kept.{where} On the compared questions it differs from SFT by **{100 * paired_diff:+.1f}** "
                f"agent EM (below).\n\n")
    because = ("GRPO's did not lead" if sel["wins"] <= sel["losses"]
               else f"more than {sel['alpha']:g}: the lead may be chance")
    return (f"## The model this demo hands over: the SFT model\n\n{why}; {because}, so the demo keeps the SFT "
            f"model (agent EM **+0.0** against SFT: the same model).{where} GRPO's own last model, not kept, is "
            f"still compared below: {100 * paired_diff:+.1f}.\n\n")
