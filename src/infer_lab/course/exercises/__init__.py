"""Exercises for every chapter: predict-then-measure tasks and small implement-it tasks, with checks.

Chapter ``NN`` has a module ``exNN_<slug>.py`` here whose ``EXERCISES`` list says what the
learner writes (one function each, sometimes two) and how it is checked; the learner's file
starts as a copy of ``starters/NN_<slug>.py`` and the reference answers are in
``solutions/NN_<slug>.py`` (package data, shown only on request). The checks compare the
learner's numbers with the library the chapter runs on (the memory equation, the roofline,
the engine's scheduler, block tables and caches, the quantizers, the tiled attention), so a
check restates nothing: it measures.

    infer-lab check 03 --init       copy the starter to ./exercises/03_memory_equation.py
    infer-lab check 03              check that file, case by case (exit 1 while any fails)
    infer-lab check 03 --solution   the same checks on the reference solution

In a notebook cell: ``check("03", kv_bytes_per_token=my_function)`` returns the same report.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import pkgutil
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from .. import chapter
from .checking import CaseAborted, NotDoneYet, Outcome, Report

KINDS = {"predict": "predict, then measure", "implement": "implement it",
         "build": "build it: runs inside the engine"}
DEFAULT_DIR = "exercises"
TIMEOUT_S = 60.0  # per exercise: every reference solution takes well under a second


@dataclass(frozen=True)
class Exercise:
    """One task: the function(s) the learner writes, and the check that measures them."""

    name: str  # the function the learner writes (the first of ``functions``)
    title: str
    kind: str  # "predict" or "implement"
    task: str  # one sentence: what to write and what it is checked against
    check: Callable[[Any, Report], None]
    functions: tuple[str, ...] = ()
    symbol: str = ""  # build tier: the engine's file::symbol the learner's code replaces
    timeout_s: float | None = None  # None: TIMEOUT_S

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not self.functions:
            object.__setattr__(self, "functions", (self.name,))


@dataclass(frozen=True)
class ExerciseResult:
    exercise: Exercise
    status: str  # "pass", "fail", "todo" (still the starter) or "missing" (no such function)
    outcomes: list[Outcome] = field(default_factory=list)
    engine_runs: list[bool] = field(default_factory=list)  # per engine run: tokens identical to HF greedy?

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def ran_engine(self) -> bool:
        """True when the check ran the real engine with the learner's code plugged in."""
        return bool(self.engine_runs)

    @property
    def tokens_identical(self) -> bool | None:
        """Every engine run token-identical to transformers greedy, or to the reference its check names
        (chapter 06: the engine with the library's own int8 weights); None: no engine run."""
        return all(self.engine_runs) if self.engine_runs else None

    def as_dict(self) -> dict[str, Any]:
        ex = self.exercise
        return {"name": ex.name, "kind": ex.kind, "functions": list(ex.functions), "symbol": ex.symbol or None,
                "status": self.status, "passed": self.passed, "ran_engine": self.ran_engine,
                "tokens_identical": self.tokens_identical,
                "cases": [{"case": o.case, "passed": o.passed, "detail": o.detail} for o in self.outcomes]}


@dataclass(frozen=True)
class ChapterReport:
    """Every exercise of one chapter checked against one source (a file, the solution, a cell)."""

    number: str
    title: str
    source: str
    results: list[ExerciseResult]
    load_error: str | None = None

    @property
    def passed(self) -> bool:
        return self.load_error is None and all(r.passed for r in self.results)

    def as_dict(self) -> dict[str, Any]:
        """What ``infer-lab check NN --json`` prints."""
        return {"chapter": self.number, "title": self.title, "source": self.source, "passed": self.passed,
                "load_error": self.load_error, "exercises": [r.as_dict() for r in self.results]}

    @property
    def cases(self) -> tuple[int, int]:
        """(passed, total) cases over all exercises."""
        outcomes = [o for r in self.results for o in r.outcomes]
        return sum(o.passed for o in outcomes), len(outcomes)

    def text(self, only_failures: bool = False) -> str:
        """What ``infer-lab check`` prints: one line per exercise, one per case below it."""
        lines = [f"{self.title}", f"checking {self.source}", ""]
        if self.load_error:
            return "\n".join(lines + [f"FAIL  {self.load_error}"])
        for i, r in enumerate(self.results, 1):
            ex = r.exercise
            lines.append(f"{r.status.upper():<5} {i}. {ex.name}: {ex.title} ({KINDS[ex.kind]})")
            for o in r.outcomes:
                if o.passed and only_failures:
                    continue
                lines.append(f"        {'PASS' if o.passed else 'FAIL'}  {o.case}: {o.detail}".rstrip(": "))
        done = sum(r.passed for r in self.results)
        ok, total = self.cases
        lines += ["", f"{done} of {len(self.results)} exercises pass ({ok} of {total} cases)."]
        return "\n".join(lines)

    def markdown(self) -> str:
        """The same report for a notebook cell."""
        if self.load_error:
            return f"**{self.title}**: {self.load_error}"
        rows = [f"**{self.title}** ({self.source})", ""]
        for r in self.results:
            mark = "✅" if r.passed else ("⏳" if r.status == "todo" else "❌")
            rows.append(f"- {mark} `{r.exercise.name}`: {r.exercise.title}")
            rows += [f"    - {'✔' if o.passed else '✘'} {o.case}: {o.detail}" for o in r.outcomes]
        return "\n".join(rows)


# ---------------------------------------------------------------------------------------------
# The registry


def _module_names() -> dict[str, str]:
    names = [i.name for i in pkgutil.iter_modules(__path__) if i.name[:2] == "ex" and i.name[2:4].isdigit()]
    return {n[2:4]: n for n in sorted(names)}


def numbers() -> list[str]:
    """Chapter numbers that have exercises, in course order (``["00", "02", ...]``)."""
    return list(_module_names())


def exercise_module(number: str | int) -> ModuleType:
    """The exercise module of chapter ``number``; a clear error for a chapter without one."""
    key = str(number).zfill(2)
    names = _module_names()
    if key not in names:
        raise KeyError(f"chapter {key} has no exercises; chapters with exercises: {', '.join(names)}")
    return importlib.import_module(f"{__name__}.{names[key]}")


def exercises(number: str | int) -> list[Exercise]:
    return list(exercise_module(number).EXERCISES)


def chapter_title(number: str | int) -> str:
    """The chapter module's TITLE when the chapter exists, else the exercise module's own."""
    mod = exercise_module(number)
    try:
        return chapter(mod.NUMBER).TITLE
    except KeyError:
        return mod.TITLE


def file_name(number: str | int) -> str:
    """``03_memory_equation.py``: the starter's, the solution's and the learner's file name."""
    mod = exercise_module(number)
    return f"{mod.NUMBER}_{mod.SLUG}.py"


def starter_path(number: str | int) -> Path:
    return Path(str(resources.files(__name__) / "starters" / file_name(number)))


def solution_path(number: str | int) -> Path:
    return Path(str(resources.files(__name__) / "solutions" / file_name(number)))


def solution_source(number: str | int) -> str:
    return solution_path(number).read_text()


def default_file(number: str | int, directory: str | Path = DEFAULT_DIR) -> Path:
    """Where a learner's file lives by default: ``./exercises/NN_slug.py``."""
    return Path(directory) / file_name(number)


def init_file(number: str | int, path: str | Path | None = None) -> tuple[Path, bool]:
    """Copy the starter to ``path`` (default ``./exercises/NN_slug.py``); never overwrite.

    Returns ``(path, created)``: ``created`` is False when the file was already there.
    """
    dest = Path(path) if path is not None else default_file(number)
    if dest.exists():
        return dest, False
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(starter_path(number), dest)
    return dest, True


# ---------------------------------------------------------------------------------------------
# Running the checks


def load_file(path: Path) -> ModuleType:
    """Import a Python file as a module of its own (a learner's file, a starter, a solution)."""
    name = f"infer_lab_exercise_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module


class ExerciseTimeout(BaseException):  # not an Exception: neither the checks nor the learner may swallow it
    """The learner's code ran past the time limit (most likely a loop that never ends)."""


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Interrupt the block after ``seconds`` (POSIX, main thread); elsewhere no limit."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable or not seconds:
        yield
        return

    def expire(signum, frame):
        raise ExerciseTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_exercise(ex: Exercise, functions: Any, timeout_s: float = TIMEOUT_S) -> ExerciseResult:
    """Check one exercise against ``functions`` (a module or a namespace holding the learner's code)."""
    missing = [f for f in ex.functions if not callable(getattr(functions, f, None))]
    if missing:
        names = ", ".join(f"{f}()" for f in missing)
        return ExerciseResult(ex, "missing", [Outcome("setup", False, f"no function {names} found: keep "
                                                      "the starter's function names")])
    report = Report()
    if timeout_s == TIMEOUT_S and ex.timeout_s is not None:
        timeout_s = ex.timeout_s
    try:
        with _time_limit(timeout_s):
            ex.check(functions, report)
    except ExerciseTimeout:
        report.record("time", False, f"the checks did not finish within {timeout_s:g} s: is there a loop that never "
                      "ends (a binary search whose bounds stop moving)?")
    except NotDoneYet as exc:
        return ExerciseResult(ex, "todo", [Outcome("not started", False, f"{exc}: replace the raise "
                                                   "with your code")])
    except CaseAborted:
        pass  # the case that raised is recorded; the rest are skipped
    except Exception as exc:  # a result of the wrong type or shape reaches the check's own code
        report.record("result", False, f"your result could not be checked ({type(exc).__name__}: {exc}); "
                      "return what the docstring says")
    return ExerciseResult(ex, "pass" if report.passed else "fail", report.outcomes, report.engine_runs)


def check_functions(number: str | int, functions: Any, source: str, only: list[str] | None = None) -> ChapterReport:
    """Every exercise of chapter ``number`` (or those named in ``only``) against ``functions``."""
    mod = exercise_module(number)
    chosen = [ex for ex in mod.EXERCISES if not only or ex.name in only]
    if only and not chosen:
        known = ", ".join(ex.name for ex in mod.EXERCISES)
        raise KeyError(f"chapter {mod.NUMBER} has no exercise {', '.join(only)}; its exercises: {known}")
    return ChapterReport(mod.NUMBER, chapter_title(number), source, [run_exercise(ex, functions) for ex in chosen])


def check_file(number: str | int, path: str | Path | None = None, only: list[str] | None = None) -> ChapterReport:
    """Import the learner's file (default ``./exercises/NN_slug.py``) and run the chapter's checks."""
    path = Path(path) if path is not None else default_file(number)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist yet: run `infer-lab check {exercise_module(number).NUMBER} "
                                f"--init` to copy the starter there (or pass --file PATH)")
    try:
        module = load_file(path)
    except Exception as exc:  # a syntax error or a failing import in the learner's file
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
        mod = exercise_module(number)
        return ChapterReport(mod.NUMBER, chapter_title(number), str(path), [],
                             load_error=f"{path} does not import{where}: {type(exc).__name__}: {exc}")
    return check_functions(number, module, str(path), only)


def check_solution(number: str | int, only: list[str] | None = None) -> ChapterReport:
    """The chapter's checks on the reference solution (they must all pass)."""
    return check_functions(number, load_file(solution_path(number)), "the reference solution", only)


def check(number: str | int, **functions: Callable[..., Any]) -> ChapterReport:
    """Check functions defined in a notebook cell: ``check("03", kv_bytes_per_token=f)``.

    Only the exercises whose functions are all given are run.
    """
    given = SimpleNamespace(**functions)
    only = [ex.name for ex in exercises(number) if all(f in functions for f in ex.functions)]
    if not only:
        names = ", ".join(f for ex in exercises(number) for f in ex.functions)
        raise KeyError(f"none of chapter {str(number).zfill(2)}'s functions given; they are: {names}")
    return check_functions(number, given, "your cell", only)


# ---------------------------------------------------------------------------------------------
# For people: the list in each notebook, the solutions behind a closed accordion


def commands_markdown(number: str | int) -> str:
    n = exercise_module(number).NUMBER
    return (
        "```\n"
        f"infer-lab check {n} --init          # copies the starter to ./{default_file(n).as_posix()}\n"
        f"infer-lab check {n}                 # checks your file, case by case\n"
        f"infer-lab check {n} --show-solution # prints the reference solution (try first)\n"
        "```"
    )


def exercises_markdown(number: str | int, heading: str = "## Exercises") -> str:
    """The chapter's exercises as a list, with the commands that start and check them."""
    mod = exercise_module(number)
    def item(i: int, ex: Exercise) -> str:
        text = f"{i}. **{ex.title}** ({KINDS[ex.kind]}): {ex.task} Write `{'()`, `'.join(ex.functions)}()`."
        if ex.kind == "build":
            text += (f" They replace `{ex.symbol}` in the engine; check with "
                     f"`infer-lab check {mod.NUMBER} --only {ex.name}`.")
        return text

    items = [item(i, ex) for i, ex in enumerate(mod.EXERCISES, 1)]
    return "\n".join([
        heading,
        "",
        "Work in a file of your own: the starter has each function's signature and a docstring with "
        "the task and its units. The checks measure your answer against the library this chapter runs "
        "on and say which case failed and by how much.",
        "",
        *items,
        "",
        commands_markdown(number),
        "",
        f"In a cell instead: `from infer_lab.course.exercises import check; "
        f"check(\"{mod.NUMBER}\", {mod.EXERCISES[0].name}=your_function)`.",
    ])


def solution_markdown(number: str | int) -> str:
    """The reference solution as a fenced code block (for a closed ``mo.accordion``)."""
    return f"```python\n{solution_source(number).rstrip()}\n```"
