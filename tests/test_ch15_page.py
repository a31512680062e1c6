"""Notebook 15's page is the experiment: the simulator and the engine check run from the notebook's
``@app.function`` definitions, the chapter module only shows them, the effects go the way the
chapter says, and changing the slots in the check's cell changes the steps both sides take."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from page_helpers import cell_call, chapter_call, edited_notebook, experiment_calls, without_args

from infer_lab.analysis.plausibility import line_fit_flags
from infer_lab.course import ch15_cluster as ch15

EXPERIMENTS = ("serve_cluster", "throughput_ceiling", "heterogeneous", "attention_ffn_split", "plan_cluster",
               "simulator_vs_engine")


def _part(name: str):
    """The chapter package's module for one part (``cluster``, ``hetero``, ...): where it looks up the
    notebook's experiment."""
    return importlib.import_module(f"{ch15.__name__}.{name}")


def test_the_chapter_runs_the_notebooks_experiments_not_copies_of_them(monkeypatch, embedded):
    sizes = ch15.sizes("cpu", "quick")
    calls = experiment_calls(monkeypatch, _part("cluster"), ch15.run_cluster, None, sizes, stop_at="throughput_ceiling")
    assert [name for name, _ in calls] == ["serve_cluster"] * len(ch15.WORKLOADS) + ["throughput_ceiling"]
    assert all(args["model"] == sizes.cluster_model for _, args in calls)
    calls = experiment_calls(monkeypatch, _part("hetero"), ch15.run_hetero, None, sizes, stop_at="attention_ffn_split")
    assert [name for name, _ in calls] == ["heterogeneous", "attention_ffn_split"]
    assert calls[0][1]["model"] == sizes.cluster_model and calls[0][1]["requests"] == sizes.cluster_requests
    (name, args), = experiment_calls(monkeypatch, _part("plan"), ch15.run_plan, None, sizes, stop_at="plan_cluster")
    assert name == "plan_cluster" and args["model"] == sizes.plan_model
    (name, args), = experiment_calls(monkeypatch, _part("check"), ch15.run_check, embedded, sizes, 4, stop_at="simulator_vs_engine")
    assert name == "simulator_vs_engine" and args["slots"] == 4 and args["new_tokens"] == sizes.check_new_tokens
    assert not hasattr(ch15, "compare_with_engine")  # the check itself lives in the notebook and the library


def test_the_cluster_effects_go_the_way_the_chapter_says():
    c = ch15.run_cluster(None, ch15.sizes("cpu", "quick"))
    summ, story = c.workload("summarize"), c.workload("story")
    col, dis = summ.mode("colocated"), summ.mode("disaggregated (best P:D)")
    assert col.itl_ms_p99 > 3 * dis.itl_ms_p99  # prefill interference is the tail, and the split removes it
    p_summ, p_story = ch15._pd_counts(summ.best_pd), ch15._pd_counts(story.best_pd)
    assert p_summ[0] > p_story[0]  # summaries want more prefill GPUs than stories
    assert c.colocated_over_best_disaggregated > 1.0  # disaggregation does not raise the ceiling


@pytest.fixture(scope="module")
def quick_check(tour_runs):
    return tour_runs.part("ch15_cluster", "check")


def test_the_simulator_replays_the_engines_steps_exactly(quick_check):
    c = quick_check
    assert c.max_num_seqs == ch15.CHECK_SLOTS < c.requests  # requests wait for a slot
    assert c.same_schedule and c.sim_step_tokens == c.engine_step_tokens
    assert len(c.engine_step_tokens) > c.requests  # prefill steps and decode steps
    assert abs(c.busy_ratio - 1) < 0.01  # a least-squares fit's residuals sum to zero over the same steps
    text = ch15.check_text(c)
    assert "the same steps as the engine's, step for step" in text
    readable = not line_fit_flags("step", c.fit.a_s, c.fit.b_s_per_token, c.fit.r2)
    assert ("they **agree**" in text) == (c.within() and readable)
    assert ("no verdict on times" in text) == (not readable)


def test_the_check_gives_no_verdict_on_times_from_a_fit_that_explains_nothing(quick_check):
    import dataclasses

    fit = quick_check.fit
    good = dataclasses.replace(quick_check, fit=dataclasses.replace(fit, a_s=abs(fit.a_s), r2=0.95,
                                                                     b_s_per_token=abs(fit.b_s_per_token)))
    bad = dataclasses.replace(quick_check, fit=dataclasses.replace(quick_check.fit, r2=0.03))
    assert ("they **agree**" in ch15.check_text(good)) == good.within()
    assert "**agree**" not in ch15.check_text(bad) and "no verdict on times" in ch15.check_text(bad)
    other = dataclasses.replace(good, sim_step_tokens=good.sim_step_tokens[:-1])
    assert "**DIFFERENT steps" in ch15.check_text(other) and "they **DO NOT agree**" in ch15.check_text(other)
    # the busy time matches "by construction" only over the same steps
    assert "by construction" in ch15.check_text(good) and "by construction" not in ch15.check_text(other)
    assert "even its busy time tests the fit" in ch15.check_text(other)


def test_more_slots_in_the_cell_take_fewer_steps_on_both_sides(embedded, tmp_path, quick_check):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    sizes = ch15.sizes("cpu", "quick")
    cell = edited_notebook("15", tmp_path, slots=sizes.check_prompts - 1).check_run  # one slot fewer than the prompts
    _, defs = cell.run(ch15=ch15, lm=embedded, mo=mo, nb=nb, sizes=sizes, check_button=SimpleNamespace(value=True))
    wide = defs["check"]
    assert wide.max_num_seqs == sizes.check_prompts - 1 and wide.same_schedule
    assert len(wide.engine_step_tokens) < len(quick_check.engine_step_tokens)
    assert len(wide.sim_step_tokens) == len(wide.engine_step_tokens)


def test_the_check_says_what_its_totals_can_and_cannot_test(tmp_path):
    """The busy time agrees by construction; the per-request times test the fitted line only above the R² floor."""
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.analysis.plausibility import R2_FLOOR
    from infer_lab.course import nb

    output, _ = edited_notebook("15", tmp_path).check_intro.run(ch15=ch15, mo=mo, nb=nb)
    text = " ".join(output.text.split())
    assert "the total busy time agrees by construction" in text
    assert f"test the line only when it explains the steps (R² above the floor of {R2_FLOOR})" in text


@pytest.mark.parametrize(("runner", "experiment", "defining"), [
    ("run_cluster", "serve_cluster", "n_gpus"), ("run_hetero", "heterogeneous", "hetero_result"),
    ("run_plan", "plan_cluster", "plan"), ("run_check", "simulator_vs_engine", "slots")])
def test_each_cell_as_shipped_makes_the_chapters_call(monkeypatch, embedded, tmp_path, runner, experiment, defining):
    """The page's cells and the chapter's runners read their numbers from one home (the chapter's
    scenario and sizes): each cell as shipped hands its experiment what the tour hands it."""
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    sizes, pressed = ch15.sizes("cpu", "quick"), SimpleNamespace(value=True)
    page = cell_call("15", tmp_path, experiment, dict(ch15=ch15, lm=embedded, mo=mo, nb=nb, sizes=sizes,
                                                      cluster_button=pressed, check_button=pressed), defining)
    chapter = chapter_call(monkeypatch, getattr(ch15, runner), embedded, sizes, experiment=experiment)
    assert without_args(page, "lm") == without_args(chapter, "lm")  # the check's model: a CPU copy on each side
