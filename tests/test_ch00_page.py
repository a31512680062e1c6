"""Notebook 00's page is the experiment: ``ceilings_here`` and ``ask`` are ``@app.function`` s of the
notebook calling ``hardware.measure_ceilings`` and the harness; the chapter module runs the same
functions (its hello answer is checked in tests/test_course_ch00_to_04.py)."""

from __future__ import annotations

import inspect

from infer_lab.course import ch00_setup as ch00
from infer_lab.course.notebook_code import notebook_function, notebook_path


def test_the_experiments_run_from_the_notebook_file():
    source = notebook_path("00").read_text()
    assert "ch00.measure" not in source  # no visible cell calls a chapter wrapper
    for name, calls, runner in (("ceilings_here", "measure_ceilings(device", ch00.run_ceilings),
                                ("ask", "timed_generate(lm, prompt, max_tokens)", ch00.run_hello)):
        function = notebook_function("00", name)
        assert inspect.getsourcefile(function) == str(notebook_path("00"))
        code = inspect.getsource(function)
        assert calls in code and len(code.splitlines()) <= 15
        assert f'notebook_function(NUMBER, "{name}")' in inspect.getsource(runner)
    assert "    question = ch00.QUESTION  #" in source and "    quick = sizes.quick_ceilings  #" in source
