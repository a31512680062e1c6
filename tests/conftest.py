"""Shared fixtures. The embedded model loads once per test session (about 1 s from cache)."""

from __future__ import annotations

import os

import machine_speed
import pytest

import infer_lab  # noqa: F401 - sets the OpenMP wait policy (PASSIVE) before any test module imports torch

# Notebooks and the tour size themselves down in CI.
os.environ.setdefault("INFER_LAB_QUICK", "1")
# Tests are hermetic: nothing may reach a model hub (CI has no network for it anyway).
os.environ.setdefault("HF_HUB_OFFLINE", "1")



@pytest.fixture(scope="session")
def slowness() -> machine_speed.Slowness:
    """This run's slowness factor (>= 1, tests/machine_speed.py), probed once when a test first asks:
    settle timeouts and latency bounds of the browser, Jupyter and server tests are written for a quiet
    2-core reference machine and multiplied by it (``slowness.scale(60)``); their failure messages
    carry ``slowness.explain(...)``: the factor, the probe, the load average and the elapsed time."""
    return machine_speed.session()


def pytest_terminal_summary(terminalreporter) -> None:
    if machine_speed.session.cache_info().currsize:  # some test asked for it
        terminalreporter.write_line(f"timeouts scaled by the {machine_speed.session().text()}")


@pytest.fixture(scope="session")
def embedded():
    """The real SmolLM2-135M-Instruct (fp32, CPU): the model every engine path is checked against."""
    from infer_lab.models import load_model

    return load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="session")
def prompts(embedded) -> list[list[int]]:
    """The 20-prompt set every engine mode is checked on (see ``engine_helpers.chat_prompts``)."""
    from engine_helpers import chat_prompts

    return chat_prompts(embedded)


@pytest.fixture(scope="session")
def reference(embedded, prompts) -> list[list[int]]:
    """transformers greedy ``generate`` on the 20 prompts: what every engine mode must reproduce."""
    from engine_helpers import greedy_reference

    return greedy_reference(embedded, prompts)


# The chapters as the tour runs them (quick sizes), once per test session: tests/test_chapters.py
# checks every run, and the page tests (tests/test_chNN_page.py) read their parts' results from the
# same runs instead of running the same experiments again.
# The tests that read every chapter's run (test_chapters.py, test_page_output.py): the chapters any of them
# selected run together, in one pool, on first use.
TOUR_TESTS = ("test_chapter_runs_on_the_cpu_at_quick_sizes", "test_every_page_output_is_written_for_people")
LONGEST_FIRST = ("ch12", "ch09", "ch02", "ch14", "ch13", "ch10", "ch06", "ch15")  # so two workers end together


class TourRuns:
    """Chapter name -> its :class:`infer_lab.course.tour.ChapterRun`, run on first use.

    The first use runs every chapter that :data:`TOUR_TESTS` selected (and the one asked for) in two
    worker processes of one torch thread each (on CI's 2 cores that is faster than one process of
    two threads); a chapter asked for later runs alone.
    """

    def __init__(self, session: pytest.Session, out_dir) -> None:
        self.session, self.out_dir, self.runs = session, out_dir, {}

    def _run(self, names: list[str]) -> None:
        import multiprocessing
        import sys
        from concurrent.futures import ProcessPoolExecutor

        import chapter_runner

        order = sorted(names, key=lambda n: (LONGEST_FIRST.index(n[:4]) if n[:4] in LONGEST_FIRST
                                             else len(LONGEST_FIRST), n))
        for n in order:
            (self.out_dir / n).mkdir(exist_ok=True)
        with ProcessPoolExecutor(max_workers=min(2, len(order)), mp_context=multiprocessing.get_context("spawn"),
                                 initializer=chapter_runner.init_worker, initargs=(list(sys.path),)) as pool:
            futures = {n: pool.submit(chapter_runner.run_one, n, str(self.out_dir / n)) for n in order}
            self.runs.update({n: f.result() for n, f in futures.items()})

    def __getitem__(self, name: str):
        if name not in self.runs:
            selected = {item.callspec.params["name"] for item in self.session.items
                        if getattr(item, "originalname", "") in TOUR_TESTS}
            self._run(sorted((selected if not self.runs else set()) | {name}))
        return self.runs[name]

    def part(self, name: str, part: str):
        """One part's result from the chapter's tour run (it must have run cleanly)."""
        run = self[name]
        assert run.ok, run.traceback
        return getattr(run.result, part)


@pytest.fixture(scope="session")
def tour_runs(request, tmp_path_factory) -> TourRuns:
    return TourRuns(request.session, tmp_path_factory.mktemp("chapters"))


@pytest.fixture(scope="session")
def track_solutions():
    """``infer-lab check engine --solution`` once per session (CI's seed): every stage's check on its
    reference solution, then the engine they make together (tests/test_track*.py read it)."""
    from track_helpers import SEED

    from infer_lab.course.track import assemble

    return assemble.check_engine(solution=True, seed=SEED)
