"""The capstone: every build part a learner wrote goes into one served engine, and the answers stay
transformers' greedy tokens."""

from __future__ import annotations

import shutil

import pytest

from infer_lab.course import exercises as ex
from infer_lab.course.exercises import capstone
from infer_lab.engine import Engine, SamplingParams


def test_starters_are_not_written_and_solutions_are():
    from_starters = {p.label: p.written for p in capstone.learner_parts(solution=False, folder="/nonexistent")}
    assert from_starters and not any(from_starters.values())
    solved = capstone.learner_parts(solution=True)
    assert {p.number for p in solved} >= {"07", "08", "09", "10", "12"}
    assert all(p.written for p in solved)
    for number in {p.number for p in solved}:
        starter = ex.load_file(ex.starter_path(number))
        for p in solved:
            if p.number == number:
                assert not any(capstone.is_written(getattr(starter, f)) for f in p.exercise.functions)


def test_a_half_written_file_plugs_in_only_what_is_written(tmp_path):
    number = "09"
    path = ex.default_file(number, tmp_path)
    shutil.copyfile(ex.starter_path(number), path)
    parts = [p for p in capstone.learner_parts(tmp_path) if p.number == number]
    assert parts and not any(p.written for p in parts)
    shutil.copyfile(ex.solution_path(number), path)
    parts = [p for p in capstone.learner_parts(tmp_path) if p.number == number]
    assert all(p.written for p in parts)
    assert "yours" in capstone.parts_text(parts)


def test_the_learners_parts_run_inside_the_engine_token_for_token(embedded, prompts, reference):
    """The solutions' parts, wrapped to count their calls, serve greedy requests exactly as transformers."""
    parts = capstone.learner_parts(solution=True)
    calls: dict[str, int] = {}

    class Counting:
        def __init__(self, module):
            self.module = module

        def __getattr__(self, name):
            fn = getattr(self.module, name)

            def counted(*a, **k):
                calls[name] = calls.get(name, 0) + 1
                return fn(*a, **k)
            return counted

    counted = [capstone.LearnerPart(p.number, p.exercise, p.path, p.written, Counting(p.module)) for p in parts]
    plug, undo = capstone.plug_for(counted)
    from infer_lab.engine import EngineConfig

    engine = Engine.from_loaded(embedded, EngineConfig(**capstone.ENGINE_OPTIONS, max_model_len=256))
    try:
        plug(engine)
        out = engine.generate([list(p) for p in prompts[:4]], [SamplingParams(max_tokens=len(r)) for r in reference[:4]])
    finally:
        undo()
    assert [list(o.token_ids) for o in out] == [list(r) for r in reference[:4]]
    for name in ("slots", "blocks_needed", "admit_tokens", "split_budget", "verify_greedy", "online_softmax_update", "radix_match"):
        assert calls.get(name, 0) > 0, f"{name} never ran inside the engine"
    assert engine.blocks_in_use_by_requests() == 0


@pytest.mark.slow
def test_served_with_the_learners_parts_answers_like_hf(embedded):
    """Over HTTP: the engine with every solution part answers the capstone's questions as HF does."""
    plug, undo = capstone.plug_for(capstone.learner_parts(solution=True))
    try:
        yours = capstone.serve_and_measure(embedded, "your engine", "ours", plug, concurrency=2, requests=2,
                                           output_tokens=4)
    finally:
        undo()
    hf = capstone.serve_and_measure(embedded, "HF transformers", "hf", concurrency=1, requests=1, output_tokens=4)
    assert capstone.identical([yours, hf])
    assert yours.loadgen["failed"] == 0 and yours.loadgen["output_tokens"] > 0
    text = capstone.table_text([yours, hf])
    assert "4 of 4" in text and "your engine" in text
