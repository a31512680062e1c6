"""Notebook 05's page calls the library's planner directly: the cell "One plan by hand" runs
``analysis.capacity.plan`` with a context the learner changes, and the page shows ``memory.fit``'s real code."""

from __future__ import annotations

import pytest
from page_helpers import edited_notebook, shows_the_real_code

from infer_lab.analysis import memory
from infer_lab.analysis.capacity import plan
from infer_lab.course import ch05_capacity_planner as ch05


def test_the_page_shows_fit():
    shows_the_real_code(ch05.fit_code(), memory.fit)


def test_quadrupling_the_context_in_the_cell_leaves_a_quarter_of_the_users(tmp_path):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    users = {}
    for context in (4096, 16384):
        cell = edited_notebook("05", tmp_path, context=context).by_hand
        _, defs = cell.run(ch05=ch05, mo=mo, nb=nb)
        one = defs["one"]
        assert one.context == context  # the cell's plan is the library's planner at the learner's context
        assert one == plan(one.model, one.gpu, n_gpus=one.n_gpus, context=context, itl_slo_ms=one.itl_slo_ms)
        users[context] = one.max_users_memory
        assert f"**{users[context]:,} users**" in ch05.plan_line(defs["one"])
    assert users[4096] >= 100  # an H100 holds many Mistral-7B users at 4k
    assert 4 * users[16384] <= users[4096] < 4 * (users[16384] + 1)  # a quarter, rounded down
