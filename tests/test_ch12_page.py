"""Notebook 12's page is the experiment: ``count_passes`` and the other ``@app.function``s in the
notebook run the engine, the chapter module only shows what they return, the page shows the
engine's real acceptance rule, and changing ``k`` in the notebook's cell changes the count the way
the chapter says."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
from types import SimpleNamespace

import pytest

from infer_lab.course import ch12_speculative_decoding as ch12
from infer_lab.course.notebook_code import notebook_function, notebook_path
from infer_lab.engine.acceptance import verify_greedy, verify_sampling

CELL_NUMBER = "    k = 4  # guesses per target pass (1..8)"
EXPERIMENTS = {"count_passes": "run_passes", "proposers_by_k": "run_sweep", "speedup_by_batch": "run_batch",
               "size_mechanisms": "run_variants"}


def test_the_experiments_run_from_the_notebook_file():
    for name, runner in EXPERIMENTS.items():
        function = notebook_function("12", name)
        assert inspect.getsourcefile(function) == str(notebook_path("12"))
        assert len(inspect.getsource(function).splitlines()) <= 15, name
        # the chapter module executes the notebook's function; it builds no engines of its own for it
        assert f'notebook_function(NUMBER, "{name}")' in inspect.getsource(getattr(ch12, runner)), name
    code = inspect.getsource(notebook_function("12", "count_passes"))
    assert "EngineConfig(speculative=spec, num_speculative_tokens=k" in code
    assert "Engine.from_loaded(lm, config)" in code and "engine.step_log" in code
    assert 'notebook_function(NUMBER, "proposers_by_k")' in inspect.getsource(ch12.run_workloads)
    assert CELL_NUMBER in notebook_path("12").read_text()
    assert not any(name.startswith("measure_") for name in vars(ch12))  # the old wrappers are gone


def test_no_visible_cell_runs_an_experiment_through_the_chapter_module():
    tree = ast.parse(notebook_path("12").read_text())
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        calls = {f"{c.func.value.id}.{c.func.attr}" for c in ast.walk(node) if isinstance(c, ast.Call)
                 and isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name)}
        assert not {c for c in calls if c.startswith(("ch12.measure", "ch12.run_"))}, node.name
        visible = any(isinstance(d, ast.Attribute) and d.attr == "cell" for d in node.decorator_list)
        if visible and "mo.stop" in calls:  # an experiment cell behind a run button
            assert node.end_lineno - node.lineno <= 16, node.name


def test_the_page_shows_the_engines_real_acceptance_rule():
    shown = ch12.acceptance_code()
    for rule in (verify_greedy, verify_sampling):
        assert inspect.getsource(rule).splitlines()[0] in shown
    assert "drafts[accepted] == target_argmax[accepted]" in shown  # greedy: the longest agreeing prefix
    assert "min(1.0, float(p[token]) / max(float(q[token]), 1e-30))" in shown  # sampling: keep w.p. p/q
    assert "(p - q).clamp_min(0)" in shown  # ... else sample the residual
    assert '"""' not in shown and len(shown.splitlines()) <= 36


@pytest.fixture(scope="module")
def quick_passes(tour_runs) -> ch12.PassesResult:
    """The notebook's experiment as the tour runs it: quick sizes, the cell's n-gram proposer at k = 4."""
    return tour_runs.part("ch12_speculative_decoding", "passes")


def test_ngram_guesses_save_most_target_passes_on_a_copy_task(quick_passes):
    p = quick_passes
    assert (p.proposer, p.k) == ("ngram", 4)
    assert p.identical and p.tokens == p.plain_tokens  # greedy: the same tokens, in fewer passes
    assert p.plain_passes == p.plain_tokens  # plain decoding: one target pass per token
    assert p.passes_saved >= 0.4  # at least 40% of the passes saved at quick size
    assert 2.0 <= p.decode_tokens_per_pass <= p.k + 1
    assert sum(p.per_pass) + 1 == p.tokens and len(p.per_pass) + 1 == p.passes  # the step records add up
    assert p.accepted == sum(n - 1 for n in p.per_pass) <= p.proposed
    text = ch12.passes_text(p, guess=2.5)
    assert f"**{p.passes} target passes**" in text and f"**{p.decode_tokens_per_pass:.2f} tokens**" in text
    assert "You guessed 2.5 tokens per pass" in text


def _edited_notebook(tmp_path, k: int):
    """Notebook 12 with its counting cell's ``k`` changed, imported as a module (marimo's own API)."""
    source = notebook_path("12").read_text()
    assert source.count(CELL_NUMBER) == 1
    path = tmp_path / "nb11_edited.py"
    path.write_text(source.replace(CELL_NUMBER, CELL_NUMBER.replace("= 4", f"= {k}")))
    spec = importlib.util.spec_from_file_location("nb11_edited", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["nb11_edited"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("nb11_edited", None)
    return module


@pytest.mark.slow
def test_changing_k_in_the_cell_changes_the_count_as_the_chapter_says(embedded, tmp_path, quick_passes):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab import nb

    cell = _edited_notebook(tmp_path, 1).one_request  # k = 1: at most 2 tokens per pass
    _, defs = cell.run(ch12=ch12, lm=embedded, mo=mo, nb=nb, sizes=ch12.sizes("cpu", "quick"),
                       passes_button=SimpleNamespace(value=True), passes_guess=SimpleNamespace(value=2.0))
    one = defs["passes"]
    assert one.k == 1 and one.identical and one.tokens == quick_passes.tokens
    assert one.decode_tokens_per_pass <= 2.0 < quick_passes.decode_tokens_per_pass
    assert one.passes > quick_passes.passes  # fewer guesses per pass: more passes for the same tokens
    assert one.passes < one.plain_passes  # still fewer than plain decoding's one per token


def _columns_shown_by_the_notebook() -> dict[str, tuple[str, ...]]:
    source = notebook_path("12").read_text()
    return {name: getattr(ch12, name) for name in ("SWEEP_LESSON", "WORKLOAD_LESSON", "BATCH_LESSON")
            if f"ch12.{name}" in source}


def test_the_page_shows_the_lessons_columns_and_keeps_every_column_one_click_away(tour_runs):
    """Each measured section shows a table of the few columns its finding reads (no table the
    width of the page), and its full table sits in the section's closed details."""
    assert set(_columns_shown_by_the_notebook()) == {"SWEEP_LESSON", "WORKLOAD_LESSON", "BATCH_LESSON"}
    name = "ch12_speculative_decoding"
    sweep, workloads, batch = (tour_runs.part(name, p) for p in ("sweep", "workloads", "batch"))
    variants = ch12.run_variants(ch12.sizes("cpu", "quick"))
    cases = [(ch12.sweep_table(sweep), ch12.SWEEP_LESSON,
              ch12.sweep_details(sweep, "test", notebook_function("12", "size_mechanisms")(("llama-3-8b",)))),
             (ch12.workloads_table(workloads), ch12.WORKLOAD_LESSON, ch12.workloads_details(workloads)),
             (ch12.batch_table(batch), ch12.BATCH_LESSON, ch12.batch_details(batch)),
             (ch12.mechanisms_table(variants), ch12.MECHANISM_LESSON, ch12.variants_details(variants))]
    for full, lesson, details in cases:
        shown = ch12.lesson_columns(full, lesson)
        assert list(shown.columns) == list(lesson) and len(lesson) <= 7 < len(full.columns)
        assert shown.equals(full[list(lesson)])  # the same rows and values, fewer columns
        kept = [item for items in details.values() for item in items if hasattr(item, "columns")]
        assert any(item.equals(full) for item in kept), lesson  # every column one click away
    # the derivations moved behind the details, not off the page: lead + details = the whole text
    assert ch12.batch_text(batch) == "\n\n".join(ch12.batch_paragraphs(batch).values())
    lead, derivation = ch12.batch_lead(batch), ch12.batch_derivation(batch)
    assert all(p in lead or p in derivation for p in ch12.batch_paragraphs(batch).values())
    assert "ridge point" in derivation and "ridge point" not in lead
    assert ch12.cited_table(variants).equals(ch12.variants_details(variants)[
        "What the papers report (cited, not measured here)"][0])


def test_the_acceptance_rules_can_be_shown_one_at_a_time():
    greedy, sampling = ch12.acceptance_code("greedy"), ch12.acceptance_code("sampling")
    assert "def verify_greedy" in greedy and "def verify_sampling" not in greedy
    assert "def verify_sampling" in sampling and "def verify_greedy" not in sampling
    with pytest.raises(ValueError, match="rule must be one of"):
        ch12.acceptance_code("typical")
