"""The notebooks' rendering helpers: placeholders name their button, people tables line up."""

from __future__ import annotations

import marimo as mo
import pandas as pd

from infer_lab import nb


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
