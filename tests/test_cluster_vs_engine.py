"""The simulator's colocated mode against our engine's measured continuous-batching run."""

from __future__ import annotations

import pytest

from infer_lab.cluster.engine_check import TOLERANCES, compare_with_engine


@pytest.fixture(scope="module")
def check(embedded, prompts):
    # 8 requests (5 to 100 tokens), 4 slots: requests wait, then join as others finish
    return compare_with_engine(embedded, prompts[:8], max_new_tokens=8, max_num_seqs=4)


def test_the_simulator_runs_the_engines_schedule_step_for_step(check):
    assert check.same_schedule, (check.engine_step_tokens, check.sim_step_tokens)
    assert len(check.engine_step_tokens) > 8  # more than one wave of requests
    assert max(check.engine_step_tokens) > 4  # some steps mix whole prompts with decodes


def test_simulated_times_agree_with_the_measured_run_within_the_stated_tolerance(check):
    # identical schedules + a least-squares fit with an intercept: the busy time agrees exactly
    assert check.busy_ratio == pytest.approx(1.0, rel=1e-9)
    assert check.fit.samples == len(check.engine_step_tokens) and check.fit.b_s_per_token > 0
    assert check.within(), (check.ratios(), TOLERANCES)


def test_too_few_prompts_to_queue_is_refused(embedded, prompts):
    with pytest.raises(ValueError, match="more prompts than slots"):
        compare_with_engine(embedded, prompts[:4], max_num_seqs=4)
