"""The build track as a whole: eight stages, their files, the learner's function boundary, the assembled
engine and `infer-lab check engine` / `serve --engine mine`. Each stage's own check is tested in
tests/test_track_sN.py."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest

from infer_lab.cli import main
from infer_lab.course import track
from infer_lab.course.exercises import load_file
from infer_lab.course.track import assemble, boundary
from infer_lab.engine.parts import COMPONENTS

STAGES = track.stages()


def test_eight_stages_in_order_give_every_component_of_the_engine():
    assert [s.number for s in STAGES] == list(range(1, 9))
    assert len({s.key for s in STAGES}) == 8 and len({s.file for s in STAGES}) == 8
    given = [name for s in STAGES for name in s.components]
    assert sorted(given) == sorted((*COMPONENTS, "tp"))  # each component in exactly one stage
    for s in STAGES:
        assert s.file.startswith(f"{s.number:02d}_") and s.minutes > 0 and s.task.endswith(".")
        assert track.stage(s.key) is s and track.stage(s.number) is s


def _public(obj) -> dict[str, list[tuple[str, object]]]:
    """Public functions (and public methods of public classes, as Class.method): their parameters'
    names and defaults (a solution may annotate less than its starter)."""
    def params(fn) -> list[tuple[str, object]]:
        return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]

    out = {}
    for name, value in vars(obj).items():
        if name.startswith("_") or getattr(value, "__module__", None) != obj.__name__:
            continue
        if inspect.isclass(value):
            for attr, fn in vars(value).items():
                if inspect.isfunction(fn) and (not attr.startswith("_") or attr == "__init__"):
                    out[f"{name}.{attr}"] = params(fn)
        elif inspect.isfunction(value):
            out[name] = params(value)
    return out


@pytest.mark.parametrize("key", [s.key for s in STAGES])
def test_a_starter_is_the_solutions_signatures_with_docstrings_and_nothing_done(key):
    s = track.stage(key)
    starter, solution = load_file(track.starter_path(s)), load_file(track.solution_path(s))
    mine, theirs = _public(starter), _public(solution)
    assert mine == {k: v for k, v in theirs.items() if k in mine}, "the starter's signatures differ"
    assert track.unwritten(s, starter) and not track.unwritten(s, solution)
    assert f"infer-lab check engine {s.key}" in inspect.getdoc(starter), "the starter names the command that checks it"
    for name in mine:  # what help() shows a learner: each function and method says what to write
        owner, _, attr = name.rpartition(".")
        fn = getattr(getattr(starter, owner), attr) if owner else getattr(starter, name)
        assert attr == "__init__" or inspect.getdoc(fn), f"{name}: the starter says what to write"


def test_init_copies_every_starter_and_never_overwrites(tmp_path, capsys):
    folder = tmp_path / "my_engine"
    assert main(["check", "engine", "--init", "--dir", str(folder)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == sorted(s.file for s in STAGES)
    mine = folder / STAGES[1].file
    mine.write_text(mine.read_text() + "\n# my work\n")
    assert main(["check", "engine", "--init", "--dir", str(folder)]) == 0
    assert mine.read_text().endswith("# my work\n")
    assert "already exists" in capsys.readouterr().out


def test_an_unwritten_stage_is_the_librarys_and_the_report_says_so(tmp_path):
    folder = tmp_path / "my_engine"
    track.init_files(folder)
    blocks = track.stage("blocks")
    (folder / blocks.file).write_text(track.solution_path(blocks).read_text())
    engine = assemble.learner_parts(folder)
    assert engine.owners["block_manager"] == "yours" and engine.parts.block_manager is not None
    assert engine.reference_components == len(assemble.ALL_COMPONENTS) - 1
    assert all(getattr(engine.parts, c) is None for c in COMPONENTS if c != "block_manager")
    text = engine.text()
    assert "block_manager" in text and "yours" in text and "not written yet" in text


# ---------------------------------------------------------------------------------------------
# The learner's function boundary

BROKEN_GROW = '''
from infer_lab.engine.block_manager import BlockManager as Library


class BlockManager(Library):
    calls = 0

    def grow(self, block_table, num_tokens):
        BlockManager.calls += 1
        if BlockManager.calls == 3:
            free = []
            free.pop()  # the learner's bug
        super().grow(block_table, num_tokens)
'''


def test_an_error_inside_the_learners_code_during_a_step_names_the_function_its_inputs_and_the_line(tmp_path):
    from infer_lab.course.track import harness as h

    path = tmp_path / "02_block_manager.py"
    path.write_text(BROKEN_GROW)
    module = load_file(path)
    parts = track.component(track.stage("blocks"), module, path, "block_manager")
    from infer_lab.engine import EngineParts

    trace = h.random_trace(1, h.hidden().vocab, n=3, prompt_lens=(8, 12), new_tokens=(4, 6))
    result = h.run(h.hidden(), h.engine_config(), EngineParts(block_manager=parts), trace)
    errors = [e for e in result.errors if e]
    assert errors, result
    message = errors[0]
    line = BROKEN_GROW.splitlines().index("            free.pop()  # the learner's bug") + 1
    assert "your BlockManager.grow raised IndexError: pop from empty list" in message
    assert "block_table=[" in message and "num_tokens=" in message  # its inputs
    assert f"02_block_manager.py:{line}: free.pop()" in message  # the line of the learner's file
    assert "engine step failed" in message  # the requests of that step failed; the engine went on


def test_results_are_taken_as_the_engine_needs_them_or_refused_with_the_reason():
    assert boundary.as_count(2.0, (), {}) == 2 and type(boundary.as_count(2.0, (), {})) is int
    import numpy as np
    import torch

    assert boundary.as_count(np.int64(3), (), {}) == 3 and boundary.as_count(torch.tensor(4), (), {}) == 4
    for bad, why in ((2.5, "whole number"), (-1, "negative"), (True, "bool")):
        with pytest.raises(boundary.BadResult, match=why):
            boundary.as_count(bad, (), {})
    assert boundary.as_int_list((x for x in (1, 2.0)), (), {}) == [1, 2]
    q = torch.zeros(3, 2, 4)
    out = boundary.as_tensor_like(0)(torch.ones(3, 2, 4, dtype=torch.float64), (q,), {})
    assert out.dtype == torch.float32
    with pytest.raises(boundary.BadResult, match="expected shape"):
        boundary.as_tensor_like(0)(torch.ones(2, 2, 4), (q,), {})


COUNT_AS = '''
from infer_lab.engine.block_manager import BlockManager as Library, OutOfKVMemory, paged_blocks_needed


class BlockManager(Library):
    def blocks_needed(self, num_computed, num_new_tokens, blocks_held):
        return {extra} + float(paged_blocks_needed(num_computed, num_new_tokens, blocks_held, self.block_size))

    def grow(self, block_table, num_tokens):
        missing = paged_blocks_needed(num_tokens, 0, len(block_table), self.block_size)
        if missing > len(self.free_list):
            raise OutOfKVMemory("no room")
        for _ in range(missing):
            block = self.free_list.popleft()
            self.ref_counts[block] = 1
            block_table.append(block)
'''


@pytest.mark.parametrize("extra, fine", [("0.0", True), ("0.5", False)])
def test_a_count_of_2_point_0_runs_and_2_point_5_is_refused_naming_the_function(tmp_path, extra, fine):
    """The issue's case: a block count returned as 2.0 crashed the engine with a bare TypeError."""
    from infer_lab.course.track import harness as h
    from infer_lab.engine import EngineParts

    path = tmp_path / "02_block_manager.py"
    path.write_text(COUNT_AS.format(extra=extra))
    parts = EngineParts(block_manager=track.component(track.stage("blocks"), load_file(path), path, "block_manager"))
    trace = h.random_trace(2, h.hidden().vocab, n=2, prompt_lens=(8, 12), new_tokens=(3, 4))
    result = h.run(h.hidden(), h.engine_config(), parts, trace)
    if fine:
        assert result.finished and not any(result.errors), result.errors
    else:
        said = result.crash or next(e for e in result.errors if e)
        assert re.search(r"your BlockManager.blocks_needed returned \d+\.5: expected a whole number", said), said
        assert "num_computed=" in said  # the input it was called with


# ---------------------------------------------------------------------------------------------
# The whole engine from the reference solutions: no component the library's, tokens identical


@pytest.fixture(scope="module")
def solutions_report(track_solutions):
    return track_solutions


def test_the_engine_of_every_reference_solution_has_no_library_component_and_identical_tokens(solutions_report):
    report = solutions_report.as_dict()
    failures = [(s["key"], c) for s in report["stages"] for c in s["cases"] if not c["passed"]]
    failures += [("assembled", c) for c in report["assembled"]["cases"] if not c["passed"]]
    assert report["passed"], failures
    assert report["reference_components"] == 0 and report["tokens_identical"] is True
    assert all(c["owner"] == "yours" for c in report["components"].values())
    assert report["assembled"]["tokens_identical"] is True and len(report["assembled"]["cases"]) >= 4


def test_check_engine_json_on_the_command_line(capsys, monkeypatch, solutions_report):
    monkeypatch.setattr(assemble, "check_engine", lambda *a, **k: solutions_report)
    assert main(["check", "engine", "--solution", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["reference_components"] == 0 and printed["tokens_identical"] is True
    assert [s["key"] for s in printed["stages"]] == [s.key for s in STAGES]


# ---------------------------------------------------------------------------------------------
# Serving the learner's engine


@pytest.mark.slow
def test_serve_engine_mine_answers_the_openai_client_streaming_included(embedded):
    """The engine of every solution, over HTTP with the official client: the same text as transformers."""
    import openai

    from infer_lab.server import ServerThread, build_app

    engine = assemble.learner_parts(solution=True)
    app = build_app(embedded, "ours", max_model_len=512, parts=engine.parts, **assemble.SERVE_OPTIONS)
    hf = build_app(embedded, "hf", max_model_len=512)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    answers = []
    for served in (app, hf):
        with ServerThread(served) as srv:
            client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none")
            full = client.chat.completions.create(model=embedded.name, messages=question, max_tokens=12,
                                                  temperature=0).choices[0].message.content
            streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
                model=embedded.name, messages=question, max_tokens=12, temperature=0, stream=True) if chunk.choices)
            answers.append((full, streamed))
    (mine_full, mine_streamed), (hf_full, _) = answers
    assert mine_full == mine_streamed == hf_full and "Paris" in mine_full


@pytest.mark.slow
def test_the_serve_table_shows_the_learners_engine_beside_the_library_and_hf(embedded):
    from infer_lab.course.track import compare

    engine = assemble.learner_parts(solution=True)
    rows = compare.compare(embedded, engine.parts, rounds=1, concurrency=2, requests=2, output_tokens=4)
    assert [r.name for r in rows] == ["your engine", "library engine", "HF transformers"]
    assert compare.identical(rows)
    text = compare.table_text(rows)
    assert "your engine" in text and "4 of 4" in text and text.count("\n") == 4
    assert "interleaved" in compare.machine_text(embedded, 1)


def test_serve_engine_mine_without_any_written_stage_says_how_to_start(tmp_path, capsys):
    folder = tmp_path / "nothing"
    track.init_files(folder)
    assert main(["serve", "--engine", "mine", "--my-engine", str(folder)]) == 2
    assert "infer-lab check engine --init" in capsys.readouterr().err


def test_check_help_lists_every_stage_command():
    from infer_lab.commands import check

    for s in STAGES:
        assert f"infer-lab check engine {s.key}" in check.DESCRIPTION
    assert "infer-lab serve --engine mine" in check.DESCRIPTION


def test_the_library_components_are_files_a_learner_can_read_in_one_sitting():
    """nano-vllm's block manager is about 120 lines; each component the learner writes is a file of its own."""
    root = Path(track.__file__).parents[2] / "engine"
    for name in ("block_manager.py", "kv_store.py", "scheduler.py", "step_loop.py", "sampling.py", "parts.py"):
        assert len((root / name).read_text().splitlines()) <= 250, name


def test_the_hidden_model_depends_on_its_context_rarely_ties_and_sometimes_stops():
    """A hidden model whose greedy answers ignored the context would let a broken KV cache pass."""
    from infer_lab.course.track import harness as h

    stats = h.hidden_model_stats()
    assert stats["distinct"] >= 200 and stats["context"] >= 0.9, stats
    assert stats["near_ties"] <= 0.005 and 0.05 <= stats["eos"] <= 0.6, stats


def test_each_chapter_notebook_presents_its_stages_with_file_command_and_time():
    for s in STAGES:
        text = track.chapter_markdown(s.chapter)
        assert f"`my_engine/{s.file}`" in text and f"infer-lab check engine {s.key}" in text
        assert f"about {s.minutes} min" in text
    assert track.chapter_markdown("05") == ""  # a chapter without a stage shows none
