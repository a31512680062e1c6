"""Your engine, assembled: every component you have written, the library's for the rest, checked as one.

:func:`learner_parts` reads ``./my_engine/`` (or the reference solutions) and returns the
:class:`~infer_lab.engine.EngineParts` of every stage whose file is written, each call guarded
(:mod:`.boundary`), and who owns each component. :func:`check_engine` runs every stage's check and
then the whole engine at once, on the embedded model's chat prompts and on a hidden trace of the
hidden model (a pool tight enough to preempt, chunked prefill, a radix prefix cache, n-gram
speculation, cancellations), token for token against transformers. ``infer-lab check engine``
prints it; ``--json`` gives, per component, whether it was yours, and whether the tokens were
identical; ``infer-lab serve --engine mine`` serves the same engine.
"""

from __future__ import annotations

import math
import platform
import random
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ...engine.parts import COMPONENTS, EngineParts
from ..exercises.checking import Outcome
from . import (
    DEFAULT_DIR,
    StageResult,
    TrackReport,
    check_stage,
    component,
    load,
    new_seed,
    parts_from,
    stages,
    unwritten,
)
from . import harness as h
from .boundary import LearnerCodeError

ALL_COMPONENTS = (*COMPONENTS, "tp")
QUESTIONS = ("What is the capital of France?", "Write a haiku about the sea.", "Name three primary colors.", "hi")
# The switches your engine is served and checked with, so that every component has work to do: the
# radix prefix cache (stage 7), n-gram speculation (stage 6) and chunked prefill (stage 4) are on.
SERVE_OPTIONS = {"prefix_cache": "radix", "speculative": "ngram", "num_speculative_tokens": 3,
                 "chunked_prefill": True}
ASSEMBLED_OPTIONS = {**SERVE_OPTIONS, "max_num_batched_tokens": 48}  # a small budget: prompts are chunked


@dataclass
class LearnerEngine:
    """What a folder of stage files gives the engine."""

    folder: str
    parts: EngineParts
    owners: dict[str, str]  # component -> "yours" or "library"
    files: dict[str, Path]  # component -> the file it came from
    modules: dict[int, ModuleType | None]  # stage number -> its loaded file (None: missing or not importing)
    problems: dict[int, str] = field(default_factory=dict)  # stage number -> why its file is not used

    @property
    def reference_components(self) -> int:
        return sum(owner == "library" for owner in self.owners.values())

    def text(self) -> str:
        """One line per component: yours (and from which file) or the library's, and why."""
        by_component = {name: s for s in stages() for name in s.components}
        lines = []
        for name in ALL_COMPONENTS:
            s = by_component[name]
            if self.owners[name] == "yours":
                state = f"yours   ({self.files[name]})"
            else:
                state = "library (" + self.problems.get(s.number, f"{s.file} not written yet") + ")"
            lines.append(f"  {name:<14} stage {s.number}  {state}")
        return "\n".join(lines)


def learner_parts(folder: str | Path = DEFAULT_DIR, solution: bool = False) -> LearnerEngine:
    """Every component written in ``folder`` (or the reference solutions), guarded; the rest the library's."""
    chosen: dict[str, Any] = {}
    owners = {name: "library" for name in ALL_COMPONENTS}
    files: dict[str, Path] = {}
    modules: dict[int, ModuleType | None] = {}
    problems: dict[int, str] = {}
    for s in stages():
        module, path, _, error = load(s, folder, solution)
        modules[s.number] = module
        if error:
            problems[s.number] = error
            continue
        if module is None:
            problems[s.number] = f"no file {path}"
            continue
        todo = unwritten(s, module)
        if todo:
            problems[s.number] = f"{path.name}: {', '.join(todo[:3])}{' ...' if len(todo) > 3 else ''} not written yet"
            continue
        for name in s.components:
            owners[name], files[name] = "yours", path
            if name in COMPONENTS:
                chosen[name] = component(s, module, path, name)
    return LearnerEngine(str(folder), parts_from(chosen), owners, files, modules, problems)


@dataclass
class EngineReport:
    """Every stage's check, and the assembled engine's."""

    engine: LearnerEngine
    stages: list[StageResult]
    assembled: list[Outcome]
    assembled_runs: list[bool]
    seed: int
    source: str

    @property
    def tokens_identical(self) -> bool:
        runs = self.assembled_runs + [ok for r in self.stages for ok in r.engine_runs]
        return bool(runs) and all(runs)

    @property
    def passed(self) -> bool:
        return (all(r.passed for r in self.stages) and bool(self.assembled)
                and all(o.passed for o in self.assembled))

    def as_dict(self) -> dict[str, Any]:
        """What ``infer-lab check engine --json`` prints."""
        stage_of = {name: s.number for s in stages() for name in s.components}
        return {
            "source": self.source,
            "seed": self.seed,
            "passed": self.passed,
            "components": {name: {"owner": self.engine.owners[name], "stage": stage_of[name],
                                  "file": str(self.engine.files[name]) if name in self.engine.files else None}
                           for name in ALL_COMPONENTS},
            "reference_components": self.engine.reference_components,
            "tokens_identical": self.tokens_identical,
            "stages": [r.as_dict() for r in self.stages],
            "assembled": {"passed": bool(self.assembled) and all(o.passed for o in self.assembled),
                          "tokens_identical": bool(self.assembled_runs) and all(self.assembled_runs),
                          "cases": [{"case": o.case, "passed": o.passed, "detail": o.detail} for o in self.assembled]},
            "machine": f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
                       f"{torch.get_num_threads()} threads",
        }

    def text(self, only_failures: bool = False) -> str:
        lines = [f"Your engine ({self.source}):", self.engine.text(), ""]
        for r in self.stages:
            lines += [r.text(only_failures), ""]
        ok = bool(self.assembled) and all(o.passed for o in self.assembled)
        mine = len(ALL_COMPONENTS) - self.engine.reference_components
        lines.append(f"{'PASS' if ok else 'FAIL'}  the whole engine: {mine} of {len(ALL_COMPONENTS)} components yours, "
                     "the rest the library's")
        for o in self.assembled:
            if o.passed and only_failures:
                continue
            detail = o.detail.replace("\n", "\n              ")
            lines.append(f"        {'PASS' if o.passed else 'FAIL'}  {o.case}: {detail}")
        done = sum(r.passed for r in self.stages)
        library = self.engine.reference_components
        owned = f"{library} component(s) still the library's" if library else "no component is the library's"
        same = "identical" if self.tokens_identical else "NOT identical"
        lines += ["", f"{done} of {len(self.stages)} stages pass; {owned}; tokens {same} to transformers."]
        if not self.passed:
            lines.append(f"(hidden seed {self.seed}: `--seed {self.seed}` replays these traces)")
        return "\n".join(lines)


def check_assembled(engine: LearnerEngine, seed: int, full: bool = False) -> tuple[list[Outcome], list[bool]]:
    """The whole engine at once: chat prompts on the embedded model, a hidden trace on the hidden model."""
    report = TrackReport()
    try:
        chat = h.chat_trace(QUESTIONS, max_tokens=12)
        result = h.run(h.embedded(), h.engine_config(block_size=16, max_model_len=256, **ASSEMBLED_OPTIONS),
                       engine.parts, chat)
        h.compare(report, f"{chat.describe()}, served the way `infer-lab serve --engine mine` serves "
                          "(radix prefix cache, n-gram speculation, chunked prefill)", result)
        if result.finished:
            h.pool_full(report, "the pool is full again after that run", result)
        model = h.hidden()
        rng = random.Random(f"{seed}:assembled")
        bs = rng.choice((3, 5, 7))
        trace = h.random_trace(rng.randrange(2**31), model.vocab, n=10 if full else 6, prompt_lens=(12, 30),
                               new_tokens=(8, 20), shared_prefix=10, arrival_steps=4,
                               name="a hidden trace on the hidden model")
        trace.cancel_at = {rng.randrange(len(trace.prompts)): rng.randint(2, 6)}
        config = h.engine_config(block_size=bs, max_model_len=64, num_blocks=math.ceil(64 / bs) + 6, max_num_seqs=4,
                                 **{**ASSEMBLED_OPTIONS, "max_num_batched_tokens": 24})
        result = h.run(model, config, engine.parts, trace)
        h.compare(report, f"{trace.describe()}, blocks of {bs}, a pool of {config.num_blocks} blocks (tight), "
                          "the same switches", result)
        if result.finished:
            h.pool_full(report, "the pool is full again after that run", result)
    except LearnerCodeError as exc:
        report.record("your code", False, str(exc))
    return report.outcomes, report.engine_runs


def check_engine(folder: str | Path = DEFAULT_DIR, solution: bool = False, seed: int | None = None,
                 full: bool = False) -> EngineReport:
    """Every stage's check on the learner's files (or the solutions), then the assembled engine's."""
    seed = seed if seed is not None else new_seed()
    engine = learner_parts(folder, solution)
    results = []
    for s in stages():
        module, path, label, error = load(s, folder, solution)
        if error:
            results.append(StageResult(s, "fail", label, [Outcome("import", False, error)], seed=seed))
            continue
        results.append(check_stage(s, module, path, label, seed, full))
    outcomes, runs = check_assembled(engine, seed, full)
    source = "the reference solutions" if solution else f"{folder}/"
    return EngineReport(engine, results, outcomes, runs, seed, source)
