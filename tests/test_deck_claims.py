"""The deck and the instructor's README say what holds (audit findings I.1, I.2, I.5): the no-network
deck carries chapters 09 and 10, each section marks what fits its minutes, and the README lists only
buttons the notebooks have."""

from __future__ import annotations

import builtins
import importlib.util
import sys
from pathlib import Path

import pytest
from page_helpers import imported_notebook

from infer_lab.course import chapter, chapters
from infer_lab.course.slides import deck
from infer_lab.course.slides.deck import BuildContext, Slide, assign_roles, show_budget

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------
# I.2: show vs backup, from the agenda's minutes


def test_the_budget_is_the_minutes_at_the_planned_pace():
    pace = deck.MINUTES_PER_SHOWN_SLIDE
    for minutes in (pace, 7, 12, 23, 60):
        n = show_budget(minutes)
        assert n * pace <= minutes < (n + 1) * pace
    assert show_budget(0) == 1  # a section always shows its intro
    assert [show_budget(m) for m in range(1, 40)] == sorted(show_budget(m) for m in range(1, 40))


def _slides() -> list[Slide]:
    p = deck.PRIORITY
    return [Slide("deck title", kind="title"), Slide("intro", kind="section", priority=p["intro"]),
            Slide("A", kind="section", priority=p["chapter"], chapter="A"),
            Slide("A table", kind="table", priority=p["detail"], chapter="A"),
            Slide("A figure 1", kind="figure", priority=p["figure"], chapter="A"),
            Slide("A figure 2", kind="figure", priority=p["figure"], chapter="A"),
            Slide("B", kind="section", priority=p["chapter"], chapter="B"),
            Slide("B figure 1", kind="figure", priority=p["figure"], chapter="B")]


def _shown(minutes: float) -> list[str]:
    return [s.title for s in assign_roles(_slides(), minutes) if s.role == "show"]


def test_a_short_section_shows_its_most_important_slides_and_each_chapters_first_figure():
    pace = deck.MINUTES_PER_SHOWN_SLIDE
    # three slides: the intro and both chapters' titles; the deck's title is never counted
    assert _shown(3 * pace) == ["deck title", "intro", "A", "B"]
    # five: each chapter's first figure before any chapter's second
    assert _shown(5 * pace) == ["deck title", "intro", "A", "A figure 1", "B", "B figure 1"]
    # inverted: a long section shows everything
    assert _shown(60) == [s.title for s in _slides()]
    roles = assign_roles(_slides(), 3 * pace)
    assert [s.title for s in roles] == [s.title for s in _slides()]  # the order never changes
    assert "show 3 of 7 slides; 4 are backup" in deck.roles_note(roles, 3 * pace)


def test_backup_slides_are_tagged_in_the_page():
    from infer_lab.course.slides.render import render

    slides = tuple(assign_roles(_slides(), 3 * deck.MINUTES_PER_SHOWN_SLIDE))
    built = deck.Deck("t", "2026-12-05", "cpu", "saved-only", (deck.Section("s", "S", 0, 5, "chapters", slides),))
    html = render(built)
    assert html.count('data-role="backup"') == 4 and html.count('data-role="show"') == 4
    assert html.count('<span class="role-badge">backup</span>') == 2 * 4  # the slide's bar and the overview


# ---------------------------------------------------------------------------------------------
# I.1: the saved-only deck carries chapters 09 and 10, counted on token ids


@pytest.mark.parametrize("number, part", [("09", "steps"), ("10", "granularity")])
def test_the_saved_only_deck_counts_batching_and_prefix_caching(number, part):
    mod = chapter(number)
    ctx = BuildContext(saved_only=True, built="2026-12-05")
    slides, failure = deck.chapter_slides(mod, ctx)
    assert failure is None
    counted = [s for s in slides if s.title.endswith(", counted")]
    assert counted and counted[0].images and all(s.images or s.tables for s in counted)
    for caption in [i.caption for s in counted for i in s.images] + [t.caption for s in counted for t in s.tables]:
        assert caption.startswith("Analytic: counted on token ids") and "2026-12-05" in caption
    skipped = " ".join(s.body for s in slides if "measured live in the workshop" in s.title)
    assert mod.PARTS[part] not in skipped  # that part's counts are on the slide, not "not run"


def test_the_saved_only_deck_counts_prefix_caching_on_its_three_workloads():
    """I.1: the hit rates of chapter 10's workloads are counts, so the saved-only deck carries them, without
    the stand-in's meaningless TTFT."""
    mod = chapter("10")
    slides = deck.prefix_count_slides(mod, BuildContext(saved_only=True, built="2026-12-05"))
    [workloads] = [s for s in slides if "three workloads" in s.title]
    [shown] = workloads.tables
    assert "hit rate" in shown.columns and not any("TTFT" in c for c in shown.columns)
    assert len(shown.rows) == len(mod.WORKLOADS) * 3  # every workload through no cache, hash and radix
    assert workloads.body.startswith("- ") and "radix" in workloads.body
    assert "predicted vs measured" in workloads.notes  # the verdict, spoken beside the table


def test_the_batching_counts_are_the_chapters_own():
    ch09 = chapter("09")
    lm = deck.stand_in_model()
    steps = ch09.run_steps(lm, ch09.sizes("cpu", "quick"))
    [slide] = deck.batching_count_slides(ch09, BuildContext(saved_only=True))
    assert slide.body == ch09.steps_text(steps.runs, steps.slots)
    assert len(steps.runs["static"]) > len(steps.runs["continuous"])  # the chapter's point, on ids alone


# ---------------------------------------------------------------------------------------------
# I.5: the README's buttons are the notebooks' buttons


def _notebook_buttons(mod, lm) -> set[str]:
    """The labels of the run buttons notebook ``mod.NUMBER`` creates, found by running its hidden cells
    (the text and controls) through marimo; measurement cells are not run."""
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb
    from infer_lab.course.notebook_code import notebook_path

    module = imported_notebook(notebook_path(mod.NUMBER), f"infer_lab_notebook_{mod.NUMBER}_buttons")
    alias = f"ch{mod.NUMBER}"
    known = {"mo": mo, "nb": nb, alias: mod, "sizes": mod.sizes("cpu", "quick"), "lm": lm}
    labels = set()
    for data in module.app._cell_manager.cell_data():
        cell = data.cell
        refs = set(cell.refs) - set(dir(builtins)) if cell is not None else set()
        if cell is None or not data.config.hide_code or not refs <= set(known):
            continue
        _, defs = cell.run(**{k: known[k] for k in refs})
        labels |= {nb.button_label(v) for v in defs.values() if type(v).__name__ == "run_button"}
    return labels


# Notebooks whose button cells this machine runs in the fast suite; the rest run in the slow one.
FAST_BUTTON_CHECKS = ("14", "15", "16")


@pytest.mark.parametrize("number", [pytest.param(m.NUMBER, marks=() if m.NUMBER in FAST_BUTTON_CHECKS
                                                 else pytest.mark.slow) for m in chapters()])
def test_each_listed_button_is_a_button_of_its_notebook(number, embedded):
    build = _script("build_workshop")
    mod = chapter(number)
    listed = {mod.PARTS[k] for k in build.button_parts(mod)}
    found = _notebook_buttons(mod, embedded)
    assert listed == {label for label in found if label in mod.PARTS.values()}
    listed_rows = [line for line in build.block().splitlines()
                   if line.startswith(f"| {number} {mod.SLUG.replace('_', ' ')} |")]
    assert {row.split(" | ")[1] for row in listed_rows} == listed  # the README's rows are exactly those


def test_the_readme_says_how_many_slides_each_section_shows():
    build = _script("build_workshop")
    text = build.block()
    for entry in deck.load_agenda():
        if entry.kind != "break":
            row = next(line for line in text.splitlines() if f"| {entry.title} |" in line)
            assert f"| {show_budget(entry.end - entry.start)} |" in row, entry.key


def test_the_stand_in_serves_the_pages_own_prompts():
    """The saved-only deck's counts are the page's: the stand-in shares the embedded model's vocabulary,
    from which the workloads draw their prompt ids."""
    from infer_lab.models import load_model

    assert deck.STAND_IN_CONFIG["vocab_size"] == load_model("smollm2-135m").config.vocab_size
