"""Notebook 05's page calls the library's planner directly: the cell "One plan by hand" runs
``analysis.capacity.plan`` with a context the learner changes, and the page shows ``memory.fit``."""

from __future__ import annotations

import importlib.util
import inspect
import sys

import pytest

from infer_lab.analysis import memory
from infer_lab.course import ch05_capacity_planner as ch05
from infer_lab.course.notebook_code import notebook_path

CONTEXT_LINE = "    context = 4096  # tokens per user"


def _edited_notebook(tmp_path, old: str, new: str):
    source = notebook_path("05").read_text()
    assert source.count(old) == 1
    path = tmp_path / "nb04_edited.py"
    path.write_text(source.replace(old, new))
    spec = importlib.util.spec_from_file_location("nb04_edited", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["nb04_edited"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("nb04_edited", None)
    return module


def test_the_page_shows_fit_and_calls_the_planner():
    source = notebook_path("05").read_text()
    assert 'one = plan("mistral-7b", "H100-SXM", n_gpus=1, context=context' in source
    shown = ch05.fit_code()
    assert "max_users=max(0, budget // per_user)" in shown and '"""' not in shown
    assert inspect.getsource(memory.fit).splitlines()[0] in shown


def test_quadrupling_the_context_in_the_cell_leaves_a_quarter_of_the_users(tmp_path):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab import nb

    users = {}
    for context in (4096, 16384):
        cell = _edited_notebook(tmp_path, CONTEXT_LINE, f"    context = {context}  #").by_hand
        _, defs = cell.run(ch05=ch05, mo=mo, nb=nb)
        users[context] = defs["one"].max_users_memory
        assert f"**{users[context]:,} users**" in ch05.plan_line(defs["one"])
    assert users[4096] >= 100  # an H100 holds many Mistral-7B users at 4k
    assert 4 * users[16384] <= users[4096] < 4 * (users[16384] + 1)  # a quarter, rounded down
