"""The build track: write every component of a serving engine yourself, then serve your engine.

Eight stages, in order, each a file of your own in ``./my_engine/`` that starts as a starter of
signatures and docstrings (units, shapes, invariants) and implements the same small interface as
the library's component (:mod:`infer_lab.engine.parts`):

====  ===========  ==========================  =================================================
 #    key          your file                   what you write
====  ===========  ==========================  =================================================
 1    forward      ``01_forward.py``           the model's forward pass on real weights
 2    blocks       ``02_block_manager.py``     KV blocks: free list, reference counts, tables
 3    paged        ``03_paged_kv.py``          K/V written and attended through block tables
 4    scheduler    ``04_scheduler.py``         admission, preemption, chunked prefill
 5    steploop     ``05_step_loop.py``         schedule -> forward -> sample -> postprocess
 6    sampling     ``06_sampling.py``          sampling, and speculative decoding's two rules
 7    radix        ``07_radix_cache.py``       the radix prefix cache: match, insert, evict
 8    tp           ``08_tensor_parallel.py``   tensor parallelism on 2 real processes
====  ===========  ==========================  =================================================

::

    infer-lab check engine --init            copy every starter to ./my_engine/ (never overwrites)
    infer-lab check engine blocks            check one stage: your component inside the real engine
    infer-lab check engine                   every stage, then your whole engine at once
    infer-lab check engine --json            per component: yours or the library's; tokens identical?
    infer-lab serve --engine mine            serve the engine your files make

A stage's check runs your component inside the real engine (every other component the
library's) on hidden traces and on a second, hidden model shape, and compares every token with
transformers' greedy output; it also checks what the stage's lesson is about (blocks held, steps
taken, the token budget, the numerics of large scores). A component you have not written yet is
the library's, so an engine can be assembled, and served, after any stage.
"""

from __future__ import annotations

import ast
import inspect
import os
import random
import shutil
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module, resources
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from ...engine.parts import COMPONENTS, EngineParts
from ..exercises import ExerciseTimeout, _time_limit, load_file
from ..exercises.checking import CaseAborted, Outcome, Report
from .boundary import Adapter, LearnerCodeError, guard_class, guard_function

DEFAULT_DIR = "my_engine"
STAGE_MODULES = ("s1_forward", "s2_block_manager", "s3_paged_kv", "s4_scheduler", "s5_step_loop", "s6_sampling",
                 "s7_radix_cache", "s8_tensor_parallel")
TIME_LIMIT_S = 900.0  # per stage: loading both models and a few engine runs on a busy 2-core machine


@dataclass(frozen=True)
class Stage:
    """One stage of the track: the file you write, the component(s) it gives the engine, its check.

    ``components`` maps an engine component (:data:`~infer_lab.engine.parts.COMPONENTS`, or ``"tp"``)
    to the name of the function or class in your file that is it (``None``: the file itself, for the
    step loop). ``adapters`` say, per method of a class, how the engine takes its result
    (:mod:`.boundary`). ``requires`` are further names the file must define and write (the guided
    first functions).
    """

    number: int
    key: str
    title: str
    file: str
    components: dict[str, str | None]
    chapter: str
    minutes: int
    task: str
    check: Callable[[StageContext], None]
    requires: tuple[str, ...] = ()
    adapters: dict[str, Adapter] = field(default_factory=dict)
    symbol: str = ""  # the library's component: file::name
    reads: tuple[str, ...] = ()  # the chapters to have read first (default: ``chapter``)

    @property
    def chapters(self) -> tuple[str, ...]:
        return self.reads or (self.chapter,)

    @property
    def names(self) -> tuple[str, ...]:
        """Every name the file must define: the guided functions, then the components."""
        own = tuple(n for n in self.components.values() if n)
        return self.requires + tuple(n for n in own if n not in self.requires)


def stages() -> list[Stage]:
    """The eight stages, in order."""
    return [import_module(f"{__name__}.{name}").STAGE for name in STAGE_MODULES]


def stage(key: str | int) -> Stage:
    """A stage by its key (``"blocks"``), number (``2``) or file stem (``"02_block_manager"``)."""
    text = str(key).strip().lower().removesuffix(".py")
    for s in stages():
        if text in (s.key, str(s.number), f"{s.number:02d}", s.file.removesuffix(".py")):
            return s
    known = ", ".join(f"{s.key} ({s.number})" for s in stages())
    raise KeyError(f"no stage {key!r}; the stages are {known}")


def chapter_markdown(number: str) -> str:
    """The stages that go with chapter ``number`` (its notebook's exercise section): what to write, where,
    how to check it; empty for a chapter with none."""
    own = [s for s in stages() if s.chapter == number]
    if not own:
        return ""
    lines = ["**The build track** (you write the serving engine itself, one component per stage, in "
             f"`./{DEFAULT_DIR}/`; `infer-lab check engine --init` copies the starters):", ""]
    for s in own:
        lines.append(f"- Stage {s.number}, **{s.title}** (about {s.minutes} min; read chapter "
                     f"{', '.join(s.chapters)} first): {s.task} Write `{DEFAULT_DIR}/{s.file}`, check it with "
                     f"`infer-lab check engine {s.key}`; the library's version is `{s.symbol}`.")
    lines += ["", "After the last stage, `infer-lab check engine` checks your whole engine and "
              "`infer-lab serve --engine mine` serves it (workshop/SELF_PACED.md has the whole track)."]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Files


def starter_path(s: Stage) -> Path:
    return Path(str(resources.files(__name__) / "starters" / s.file))


def solution_path(s: Stage) -> Path:
    return Path(str(resources.files(__name__) / "solutions" / s.file))


def learner_path(s: Stage, folder: str | Path = DEFAULT_DIR) -> Path:
    return Path(folder) / s.file


def init_files(folder: str | Path = DEFAULT_DIR) -> list[tuple[Path, bool]]:
    """Copy every stage's starter into ``folder`` unless the file is there; ``(path, created)`` each."""
    out = []
    Path(folder).mkdir(parents=True, exist_ok=True)
    for s in stages():
        dest = learner_path(s, folder)
        created = not dest.exists()
        if created:
            shutil.copyfile(starter_path(s), dest)
        out.append((dest, created))
    return out


def is_written(fn: Any) -> bool:
    """False for a starter: a function whose body, docstring aside, is ``raise NotImplementedError(...)``."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return callable(fn)
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) else []
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]  # the docstring
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return True
    exc = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return not (isinstance(exc, ast.Name) and exc.id == "NotImplementedError")


def unwritten(s: Stage, module: ModuleType | None) -> list[str]:
    """The names of ``s`` that ``module`` lacks or leaves as the starter's stub (methods as Class.method)."""
    if module is None:
        return list(s.names)
    missing = []
    for name in s.names:
        obj = getattr(module, name, None)
        if obj is None:
            missing.append(name)
        elif inspect.isclass(obj):
            for attr, value in vars(obj).items():
                if (inspect.isfunction(value) and (not attr.startswith("_") or attr == "__init__")
                        and not is_written(value)):
                    missing.append(f"{name}.{attr}")
        elif callable(obj) and not is_written(obj):
            missing.append(name)
    return missing


# ---------------------------------------------------------------------------------------------
# Components through the boundary


def component(s: Stage, module: ModuleType, path: Path, name: str) -> Any:
    """The learner's ``name`` component of stage ``s``, every call guarded (:mod:`.boundary`).

    A class becomes a factory of guarded instances, a function a guarded function, and the step
    loop (``None`` in ``components``) a namespace of the file's guarded ``step`` and ``finish``.
    """
    attr = s.components[name]
    path = Path(path).resolve()
    if attr is None:  # the step loop: the file's functions
        return SimpleNamespace(**{fn: guard_function(getattr(module, fn), f"your {fn}", path, s.adapters.get(fn))
                                  for fn in ("step", "finish") if callable(getattr(module, fn, None))})
    obj = getattr(module, attr)
    if inspect.isclass(obj):
        return guard_class(obj, attr, path, s.adapters)
    return guard_function(obj, f"your {attr}", path, s.adapters.get(attr))


def parts_from(chosen: dict[str, Any]) -> EngineParts:
    """An :class:`EngineParts` from ``{component: replacement}`` (the engine's components only)."""
    return EngineParts(**{k: v for k, v in chosen.items() if k in COMPONENTS})


class TrackReport(Report):
    """A stage's report; with ``fail_fast``, the first failing case ends the check (CI's near misses)."""

    def __init__(self, fail_fast: bool = False):
        super().__init__()
        self.fail_fast = fail_fast

    def record(self, case: str, passed: bool, detail: str = "") -> bool:
        super().record(case, passed, detail)
        if not passed and self.fail_fast:
            raise CaseAborted
        return passed


@dataclass
class StageContext:
    """What a stage's check gets: the learner's file, the report to fill, the hidden seed, the size."""

    stage: Stage
    module: ModuleType
    path: Path
    report: Report
    seed: int
    full: bool = False

    def part(self, name: str) -> Any:
        """The learner's component ``name`` of this stage, guarded."""
        return component(self.stage, self.module, self.path, name)

    def parts(self, **extra: Any) -> EngineParts:
        """Every engine component of this stage the learner's (guarded), the rest the library's;
        ``extra`` adds or overrides components."""
        chosen = {name: self.part(name) for name in self.stage.components if name in COMPONENTS}
        chosen.update(extra)
        return parts_from(chosen)

    def fn(self, name: str) -> Callable[..., Any]:
        """A function of the learner's file, guarded (a failing call raises LearnerCodeError)."""
        return guard_function(getattr(self.module, name), f"your {name}", self.path.resolve(),
                              self.stage.adapters.get(name))

    def call(self, name: str, *args: Any, case: str, **kwargs: Any) -> Any:
        """Call the learner's ``name``; an exception is recorded as a failed ``case`` (and aborts the check)."""
        try:
            return self.fn(name)(*args, **kwargs)
        except LearnerCodeError as exc:
            self.report.record(case, False, str(exc))
            raise CaseAborted from exc

    def rng(self, salt: str) -> random.Random:
        """A random generator for one trace of this check: the hidden seed and ``salt``."""
        return random.Random(f"{self.seed}:{self.stage.key}:{salt}")

    def subseed(self, salt: str) -> int:
        return self.rng(salt).randrange(2**31)


# ---------------------------------------------------------------------------------------------
# Checking


@dataclass(frozen=True)
class StageResult:
    stage: Stage
    status: str  # "pass", "fail", "todo" (not written yet), "missing" (no file)
    source: str
    outcomes: list[Outcome] = field(default_factory=list)
    engine_runs: list[bool] = field(default_factory=list)
    seed: int = 0

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def tokens_identical(self) -> bool | None:
        return all(self.engine_runs) if self.engine_runs else None

    def as_dict(self) -> dict[str, Any]:
        s = self.stage
        return {"stage": s.number, "key": s.key, "title": s.title, "file": s.file, "source": self.source,
                "status": self.status, "passed": self.passed, "components": list(s.components),
                "ran_engine": bool(self.engine_runs), "tokens_identical": self.tokens_identical, "seed": self.seed,
                "cases": [{"case": o.case, "passed": o.passed, "detail": o.detail} for o in self.outcomes]}

    def text(self, only_failures: bool = False) -> str:
        s = self.stage
        lines = [f"{self.status.upper():<5} stage {s.number} · {s.title} ({self.source})"]
        for o in self.outcomes:
            if o.passed and only_failures:
                continue
            detail = o.detail.replace("\n", "\n              ")
            lines.append(f"        {'PASS' if o.passed else 'FAIL'}  {o.case}: {detail}".rstrip(": "))
        if self.status == "fail" and self.seed:
            lines.append(f"        (hidden seed {self.seed}: `--seed {self.seed}` replays these traces)")
        return "\n".join(lines)


def new_seed() -> int:
    """A hidden seed: fresh each run, so a check cannot be passed by fitting one trace."""
    return int.from_bytes(os.urandom(4), "little") % 1_000_000 or 1


def check_stage(s: Stage, module: ModuleType | None, path: Path, source: str, seed: int | None = None,
                full: bool = False, time_limit_s: float = TIME_LIMIT_S, fail_fast: bool = False) -> StageResult:
    """Run stage ``s``'s check on ``module`` (the learner's file, loaded); ``fail_fast``: stop at the
    first failing case."""
    seed = seed if seed is not None else new_seed()
    if module is None:
        return StageResult(s, "missing", source, [Outcome("setup", False, f"no file {path}: run `infer-lab check "
                                                                         f"engine --init` to copy the starters")])
    todo = unwritten(s, module)
    if todo:
        return StageResult(s, "todo", source, [Outcome("not written yet", False, "still the starter: write "
                                                       + ", ".join(f"{n}()" for n in todo))], seed=seed)
    report = TrackReport(fail_fast)
    ctx = StageContext(s, module, Path(path), report, seed, full)
    try:
        with _time_limit(time_limit_s):
            s.check(ctx)
    except ExerciseTimeout:
        report.record("time", False, f"the check did not finish within {time_limit_s:g} s: is there a loop that "
                                     "never ends?")
    except CaseAborted:
        pass  # the case that raised is recorded
    except LearnerCodeError as exc:
        report.record("your code", False, str(exc))
    return StageResult(s, "pass" if report.passed else "fail", source, report.outcomes, report.engine_runs, seed)


def load(s: Stage, folder: str | Path = DEFAULT_DIR, solution: bool = False
         ) -> tuple[ModuleType | None, Path, str, str | None]:
    """``(module, path, source label, load error)`` for stage ``s``: the learner's file or the solution."""
    path = solution_path(s) if solution else learner_path(s, folder)
    label = "the reference solution" if solution else str(path)
    if not path.exists():
        return None, path, label, None
    try:
        return load_file(path), path, label, None
    except Exception as exc:  # noqa: BLE001  (a syntax error or failing import in the learner's file)
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
        return None, path, label, f"{path} does not import{where}: {type(exc).__name__}: {exc}"


def check_one(key: str | int, folder: str | Path = DEFAULT_DIR, solution: bool = False, seed: int | None = None,
              full: bool = False) -> StageResult:
    """Check one stage of the learner's folder (or of the reference solutions)."""
    s = stage(key)
    module, path, label, error = load(s, folder, solution)
    if error:
        return StageResult(s, "fail", label, [Outcome("import", False, error)])
    return check_stage(s, module, path, label, seed, full)


def check_file(key: str | int, path: str | Path, seed: int | None = None, full: bool = False,
               fail_fast: bool = False) -> StageResult:
    """Check one stage on any file (a near miss, a variant)."""
    s = stage(key)
    path = Path(path)
    try:
        module = load_file(path)
    except Exception as exc:  # noqa: BLE001
        return StageResult(s, "fail", str(path), [Outcome("import", False, f"{path} does not import: {exc}")])
    return check_stage(s, module, path, str(path), seed, full, fail_fast=fail_fast)
