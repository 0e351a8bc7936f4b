"""The demo's stage sizing: fits the budget, shrinks on a slow host, grows on a fast one."""

from __future__ import annotations

import pytest

from agent_rl.quickstart import plan_stages

# calibrated speeds (update tok/s, generation tok/s, engine load s): an AVX2 host in fp32 and
# an AVX512-BF16 host in bf16, as measured by `python -m agent_rl.calibrate`
SLOW = (130.0, 100.0, 8.0)
FAST = (236.0, 800.0, 10.0)


@pytest.mark.parametrize("speeds", [SLOW, FAST])
@pytest.mark.parametrize("remaining_s", [600.0, 900.0, 1500.0])
def test_plan_fits_the_time_left(speeds, remaining_s):
    plan = plan_stages(remaining_s, *speeds)
    total = sum(plan.estimate_s.values())
    assert total <= remaining_s + 1, plan.describe()
    assert 30 <= plan.eval_limit <= 100 and plan.sft_steps >= 1 and plan.rl_steps in (0, 2, 3, 4)
    assert ("grpo" in plan.estimate_s) == (plan.rl_steps > 0)


def test_slow_host_does_less_but_keeps_sft_and_both_evaluations():
    slow, fast = plan_stages(900, *SLOW), plan_stages(900, *FAST)
    assert slow.sft_steps < fast.sft_steps and slow.eval_limit <= fast.eval_limit
    assert slow.rl_steps <= fast.rl_steps
    # SFT is what the demo shows (base 0 -> SFT): it gets the largest share on any host
    assert slow.estimate_s["sft"] >= max(v for k, v in slow.estimate_s.items() if k != "sft")
    assert slow.sft_steps >= 5


def test_sft_steps_follow_the_update_speed():
    # SFT's training time is the time left after evaluation (and GRPO); steps = time / step cost
    plan = plan_stages(900, 100.0, 10_000.0, 0.0)
    sft_train_s = plan.sft_minutes * 60
    assert plan.sft_steps == int(sft_train_s / (8 * 500 / 100.0))
