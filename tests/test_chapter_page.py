"""A chapter's page is a list of parts (``infer_lab.course.chapter.Page``): the measured parts are its
PARTS in order, a part shows once it ran, and the summary, tables and figures follow page order."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from infer_lab.course.chapter import ChapterResult, Page, Part

LABELS = {"first": "Run the first part", "second": "Run the second part"}


@dataclass
class _Result(ChapterResult):
    first: int | None = None
    second: list[int] | None = None


def _page() -> Page:
    return Page(
        LABELS,
        Part("first", lambda lm, sizes: lm + sizes, text=lambda r: f"first is {r.first}",
             tables=lambda r: {"First": [r.first]}, figures=lambda r: {"first": ("fig", r.first)}),
        Part("background (analytic)", text=lambda r: ["always here", ""],
             tables=lambda r: {"Background": []}),
        Part("second", lambda lm, sizes: [lm] * sizes, text=lambda r: f"second has {len(r.second)}",
             figures=lambda r: {"second": ("fig", len(r.second))}),
    )


def test_only_the_chosen_parts_run_and_show_in_page_order():
    page = _page()
    result = page.measure(_Result(), 2, 3, ["second"])
    assert result.first is None and result.second == [2, 2, 2] and list(result.seconds) == ["second"]
    assert page.summary(result, "Header.") == "Header.\n\nalways here\n\nsecond has 3"
    assert list(page.tables(result)) == ["Background"] and list(page.figures(result)) == ["second"]
    everything = page.measure(_Result(), 2, 3)
    assert page.summary(everything, "H.").split("\n\n") == ["H.", "first is 5", "always here", "second has 3"]
    assert list(page.tables(everything)) == ["First", "Background"]
    assert list(page.figures(everything)) == ["first", "second"]


def test_a_part_that_returned_nothing_shows_nothing():
    page = _page()
    result = page.measure(_Result(), 2, 0, ["second"])  # an empty list: nothing to show
    assert "second" not in page.summary(result, "H.") and page.figures(result) == {}


def test_the_page_must_hold_every_measured_part_once_in_parts_order():
    run = lambda lm, sizes: None  # noqa: E731
    with pytest.raises(ValueError, match="must be PARTS"):
        Page(LABELS, Part("second", run), Part("first", run))
    with pytest.raises(ValueError, match="must be PARTS"):
        Page(LABELS, Part("first", run))
    with pytest.raises(ValueError, match="twice"):
        Page(LABELS, Part("first", run), Part("note"), Part("second", run), Part("note"))
    with pytest.raises(ValueError, match="unknown part"):
        _page().measure(_Result(), 1, 1, ["third"])
