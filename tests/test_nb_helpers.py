"""The notebooks' rendering helpers: placeholders name their button, people tables line up."""

from __future__ import annotations

import marimo as mo
import pandas as pd

from infer_lab.course import nb


def test_placeholder_names_the_button_to_press():
    button = mo.ui.run_button(label="Measure KV memory")
    assert nb.button_label(button) == "Measure KV memory"
    assert "Measure KV memory" in nb.placeholder(button).text
    assert nb.button_label(object()) == ""
    assert "the run button above" in nb.placeholder(object()).text


def test_table_right_aligns_number_columns_and_escapes_text():
    frame = pd.DataFrame({"batch": ["1", "128"], "tokens/s": ["345", "1,367"],
                          "ITL (ms)": ["38.4", "—"], "note": ["a<b", "launch-bound"]})
    html = nb.table(frame).text
    assert html.count("text-align: right") == 3 * 3  # header + 2 rows, 3 number columns
    assert html.count("text-align: left") == 3
    assert "a&lt;b" in html and "a<b" not in html
    assert html.index("345") < html.index("1,367")  # rows keep their order
    assert isinstance(nb.table(frame, interactive=True), mo.ui.table)


def test_details_are_closed_accordions_of_text_tables_and_figures():
    frame = pd.DataFrame({"run": ["plain"], "tokens/s": ["1,367"]})
    shown = nb.details({"Why it is so": ["the **derivation**", frame], "One item alone": "just text"})
    html = shown.text
    assert html.startswith("<marimo-accordion") and "data-expanded='[]'" in html  # nothing open
    assert "Why it is so" in html and "One item alone" in html
    assert "<strong>derivation</strong>" in html  # text is markdown
    assert nb.table(frame).text in html  # a people table is shown as nb.table shows it
    assert html.index("derivation") < html.index("1,367") < html.index("just text")  # in order


def test_computed_markdown_keeps_its_dollars_as_dollars():
    """``$0.16 … **$249`` is two prices, not LaTeX: nb.md escapes each dollar, so marimo typesets no math
    and the words between the prices keep their spaces; plain mo.md pairs them."""
    text = "$0.00796 per million prompt tokens. Every token priced as output: **$249 million a month**"
    shown = nb.md(text).text
    assert "marimo-tex" not in shown and "<strong>$249 million a month</strong>" in shown
    assert "marimo-tex" in mo.md(text).text  # the trap nb.md avoids
