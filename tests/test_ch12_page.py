"""Notebook 12's page is the experiment: ``count_passes`` and the other ``@app.function``s in the
notebook run the engine, the chapter module only shows what they return, the page shows the
engine's real acceptance rule, and changing ``k`` in the notebook's cell changes the count the way
the chapter says."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from page_helpers import (
    RecordingEngine,
    cell_call,
    chapter_call,
    edited_notebook,
    experiment_calls,
    shows_the_real_code,
    without_docstring,
)

from infer_lab.course import ch12_speculative_decoding as ch12
from infer_lab.course.notebook_code import notebook_function
from infer_lab.engine.acceptance import verify_greedy, verify_sampling

EXPERIMENTS = {"count_passes": "run_passes", "proposers_by_k": "run_sweep", "speedup_by_batch": "run_batch",
               "size_mechanisms": "run_variants"}


def _part(name: str):
    """The chapter package's module for one part (``passes``, ``sweep``, ...): where it looks up the
    notebook's experiment."""
    return importlib.import_module(f"{ch12.__name__}.{name}")


def test_the_chapter_runs_the_notebooks_experiments_with_its_sizes(monkeypatch, embedded):
    sizes = ch12.sizes("cpu", "quick")
    passes = _part("passes")
    (name, args), = experiment_calls(monkeypatch, passes, ch12.run_passes, embedded, sizes, stop_at="count_passes")
    assert name == "count_passes" and args["lm"] is embedded
    assert (args["proposer"], args["k"]) == (ch12.PASSES_PROPOSER, ch12.PASSES_K)
    assert args["prompt"] == ch12.grounded_prompt_ids(embedded, 1)[0]  # the copy task
    assert args["max_new_tokens"] == sizes.passes_new_tokens
    (_, args), = experiment_calls(monkeypatch, passes, ch12.run_passes, embedded, sizes, "ngram", 1,
                                  stop_at="count_passes")
    assert args["k"] == 1  # the k asked for, not the default
    (name, args), = experiment_calls(monkeypatch, _part("sweep"), ch12.run_sweep, embedded, sizes,
                                     stop_at="proposers_by_k")
    assert (args["workload"], args["n_prompts"]) == ("grounded", sizes.sweep_prompts)
    assert list(args["configs"]) == sizes.sweep_configs()
    (name, args), = experiment_calls(monkeypatch, _part("workloads"), ch12.run_workloads, embedded, sizes,
                                     stop_at="proposers_by_k")
    assert args["n_prompts"] == sizes.workload_prompts and list(args["configs"]) == list(sizes.workload_configs)
    (name, args), = experiment_calls(monkeypatch, _part("batch"), ch12.run_batch, embedded, sizes,
                                     stop_at="speedup_by_batch")
    assert (args["proposer"], args["k"]) == sizes.batch_config and tuple(args["batches"]) == sizes.batches
    (name, args), = experiment_calls(monkeypatch, _part("variants"), ch12.run_variants, sizes, stop_at="size_mechanisms")
    assert tuple(args["models"]) == sizes.variant_models
    assert not any(name.startswith("measure_") for name in vars(ch12))  # the old wrappers are gone


class _RecordingEngine(RecordingEngine):
    """The engine's stand-in; each output names how many engines were made before it."""

    def output(self, prompt):
        return f"output {len(self.made)}"


def test_count_passes_runs_plain_then_the_proposer_with_k_guesses(monkeypatch):
    count_passes = notebook_function("12", "count_passes")
    monkeypatch.setattr(_RecordingEngine, "made", [])
    monkeypatch.setitem(count_passes.__globals__, "Engine", _RecordingEngine)
    runs = count_passes(SimpleNamespace(eos_token_ids=[0]), [1, 2, 3], 8, "ngram", 3)
    assert runs == {"plain": ("output 1", ["step"]), "ngram": ("output 2", ["step"])}  # each engine's own counts
    plain, speculative = (engine.config for engine in _RecordingEngine.made)
    assert plain.speculative is None and speculative.speculative == "ngram" and speculative.num_speculative_tokens == 3
    assert speculative.max_model_len >= 3 + 8  # room for the prompt and the new tokens


def test_the_page_shows_the_engines_real_acceptance_rule():
    shown = ch12.acceptance_code()
    shows_the_real_code(shown, verify_greedy, verify_sampling)  # greedy's prefix rule, sampling's p/q rule
    assert len(shown.splitlines()) <= 36  # short enough for a slide


@pytest.fixture(scope="module")
def quick_passes(tour_runs) -> ch12.PassesResult:
    """The notebook's experiment as the tour runs it: quick sizes, the cell's proposer and k (the chapter's)."""
    return tour_runs.part("ch12_speculative_decoding", "passes")


def test_ngram_guesses_save_most_target_passes_on_a_copy_task(quick_passes):
    p = quick_passes
    assert (p.proposer, p.k) == (ch12.PASSES_PROPOSER, ch12.PASSES_K)  # what the cell and the tour both read
    assert p.identical and p.tokens == p.plain_tokens  # greedy: the same tokens, in fewer passes
    assert p.plain_passes == p.plain_tokens  # plain decoding: one target pass per token
    assert p.passes_saved >= 0.4  # at least 40% of the passes saved at quick size
    assert 2.0 <= p.decode_tokens_per_pass <= p.k + 1
    assert sum(p.per_pass) + 1 == p.tokens and len(p.per_pass) + 1 == p.passes  # the step records add up
    assert p.accepted == sum(n - 1 for n in p.per_pass) <= p.proposed
    text = ch12.passes_text(p, guess=2.5)
    assert f"**{p.passes} target passes**" in text and f"**{p.decode_tokens_per_pass:.2f} tokens**" in text
    assert "You guessed 2.5 tokens per pass" in text


@pytest.mark.slow
def test_changing_k_in_the_cell_changes_the_count_as_the_chapter_says(embedded, tmp_path, quick_passes):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    cell = edited_notebook("12", tmp_path, k=1).one_request
    _, defs = cell.run(ch12=ch12, lm=embedded, mo=mo, nb=nb, sizes=ch12.sizes("cpu", "quick"),
                       passes_button=SimpleNamespace(value=True), passes_guess=SimpleNamespace(value=2.0))
    one = defs["passes"]
    assert one.k == 1 and one.identical and one.tokens == quick_passes.tokens
    assert one.decode_tokens_per_pass <= 2.0 < quick_passes.decode_tokens_per_pass
    assert one.passes > quick_passes.passes  # fewer guesses per pass: more passes for the same tokens
    assert one.passes < one.plain_passes  # still fewer than plain decoding's one per token


def test_the_page_shows_the_lessons_columns_and_keeps_every_column_one_click_away(tour_runs):
    """Each measured section shows a table of the few columns its finding reads (no table the
    width of the page), and its full table sits in the section's closed details."""
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
    shows_the_real_code(greedy, verify_greedy)
    shows_the_real_code(sampling, verify_sampling)
    assert without_docstring(verify_sampling) not in greedy and without_docstring(verify_greedy) not in sampling
    with pytest.raises(ValueError, match="rule must be one of"):
        ch12.acceptance_code("typical")


def test_the_cell_as_shipped_makes_the_chapters_call(monkeypatch, embedded, tmp_path):
    """The page's cell and the chapter's runner read the proposer and k from one home (the chapter's
    scenario): the cell as shipped hands ``count_passes`` what the tour hands it."""
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    sizes = ch12.sizes("cpu", "quick")
    page = cell_call("12", tmp_path, "count_passes", dict(ch12=ch12, lm=embedded, mo=mo, nb=nb, sizes=sizes,
                                                           passes_button=SimpleNamespace(value=True),
                                                           passes_guess=SimpleNamespace(value=2.0)), "passes")
    assert page == chapter_call(monkeypatch, ch12.run_passes, embedded, sizes, experiment="count_passes")
