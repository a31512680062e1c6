"""The capstone: serve an engine made of your own parts, and measure it beside the reference.

Each build exercise replaces one part of the engine with a function you wrote: the block-table
lookup, the online-softmax tile, the admission rule, speculative verification... (its
:class:`~infer_lab.course.exercises.Exercise` says how, in ``install``). Here every part you
have written goes in at once::

    infer-lab serve --my-parts                 serve your engine (parts from ./exercises/)
    infer-lab check capstone                   your engine, the reference engine and HF, served one
                                               after another under the same load: one table
    infer-lab check capstone --solution        the same with the reference solutions as your parts

A part counts as written when its function no longer raises the starter's
``NotImplementedError``; the parts you have not written yet stay the library's. Chapter 06's int8
quantizer goes in only where the served engine quantizes its weights
(``infer-lab serve --my-parts --engine-option weight_quant=int8``): the table below serves fp32
weights, whose answers must be HF's fp32 greedy ones, so there it changes nothing.
"""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ...bench.served import serve_and_load
from ...hardware import cpu_features
from ...units import human
from . import DEFAULT_DIR, Exercise, default_file, exercises, load_file, numbers, solution_path

# Both of our engines run with these options, so the reference differs from yours only in the parts.
# The radix prefix cache and n-gram speculation are on, so that the radix match, verification and
# prompt lookup run too.
ENGINE_OPTIONS = {"block_size": 16, "max_num_seqs": 8, "prefix_cache": "radix", "speculative": "ngram:3",
                  "num_speculative_tokens": 4}
MAX_MODEL_LEN = 512
QUESTIONS = ("What is the capital of France?", "Write a haiku about the sea.",
             "Name three primary colors.", "hi")
ANSWER_TOKENS = 16  # greedy tokens per question in the identity check


@dataclass(frozen=True)
class LearnerPart:
    """One build exercise, and the file whose functions would fill it."""

    number: str  # chapter
    exercise: Exercise
    path: Path
    written: bool  # every function of the exercise is in the file and no longer a starter
    module: ModuleType | None

    @property
    def label(self) -> str:
        return f"{self.number} {self.exercise.name}"


def is_written(fn: Any) -> bool:
    """False for a starter: a function whose body, docstring aside, is ``raise NotImplementedError(...)``."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return callable(fn)
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.FunctionDef) else []
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]  # the docstring
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return True
    exc = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return not (isinstance(exc, ast.Name) and exc.id == "NotImplementedError")


def learner_parts(folder: str | Path = DEFAULT_DIR, solution: bool = False) -> list[LearnerPart]:
    """Every build exercise with an ``install``, and whether ``folder``'s files (or the solutions) fill it."""
    parts = []
    for number in numbers():
        builds = [e for e in exercises(number) if e.kind == "build" and e.install is not None]
        if not builds:
            continue
        path = solution_path(number) if solution else default_file(number, folder)
        module = load_file(path) if path.exists() else None
        for e in builds:
            fns = [getattr(module, name, None) for name in e.functions] if module is not None else []
            written = bool(fns) and all(f is not None and is_written(f) for f in fns)
            parts.append(LearnerPart(number, e, path, written, module))
    return parts


def plug_for(parts: Sequence[LearnerPart]) -> tuple[Callable[[Any], None], Callable[[], None]]:
    """``(plug, undo)``: ``plug(engine)`` installs every written part; ``undo()`` takes back what an
    install changed beyond that engine (the attention functions are the engine module's)."""
    undos: list[Callable[[], None]] = []

    def plug(engine: Any) -> None:
        for part in parts:
            if part.written:
                undo = part.exercise.install(engine, part.module)
                if undo is not None:
                    undos.append(undo)

    def undo_all() -> None:
        while undos:
            undos.pop()()

    return plug, undo_all


def parts_text(parts: Sequence[LearnerPart]) -> str:
    """Which parts are yours and which stay the library's, one line each."""
    lines = []
    for p in parts:
        state = "yours" if p.written else ("not written yet: the library's" if p.module is not None
                                           else f"no file {p.path}: the library's")
        lines.append(f"  {p.label:<22} {state:<34} -> {p.exercise.symbol}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Serving and measuring


def _answers(url: str, model: str) -> list[str]:
    """Greedy answers to :data:`QUESTIONS` over the server's chat API."""
    out = []
    for q in QUESTIONS:
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": q}],
                           "max_tokens": ANSWER_TOKENS, "temperature": 0}).encode()
        req = urllib.request.Request(f"{url}/v1/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as answer:
            out.append(json.load(answer)["choices"][0]["message"]["content"])
    return out


@dataclass(frozen=True)
class CapstoneRow:
    """One served engine under the capstone's load."""

    name: str
    answers: list[str]
    loadgen: dict[str, Any]  # loadgen's pooled row: output_tokens_per_s, ttft_ms_p50, itl_ms_p50, failed...


def serve_and_measure(lm: Any, name: str, engine: str, plug: Callable[[Any], None] | None = None,
                      concurrency: int = 4, requests: int = 8, output_tokens: int = 16) -> CapstoneRow:
    """Serve ``lm`` with one engine over HTTP, ask it :data:`QUESTIONS` greedily, then run the load
    generator's shared-prefix workload at ``concurrency`` against it (one warm-up request)."""
    results = serve_and_load(
        lm, engine, dict(ENGINE_OPTIONS) if engine == "ours" else {}, "shared-prefix", [concurrency],
        requests=requests, output_tokens=output_tokens, max_model_len=MAX_MODEL_LEN, timeout_s=600, plug=plug,
        before_load=lambda url: _answers(url, lm.name),
        workload_options={"input_words": 16, "prefix_words": 64, "turns": 1, "branches": 2})
    return CapstoneRow(name, results["before_load"], dict(results["pooled"][0]))


def run_capstone(lm: Any, parts: Sequence[LearnerPart], **load: Any) -> list[CapstoneRow]:
    """Your engine, the reference engine and HF (one request at a time), each served and measured
    in turn with the same questions and the same load (``load``: see :func:`serve_and_measure`)."""
    plug, undo = plug_for(parts)
    try:
        yours = serve_and_measure(lm, "your engine", "ours", plug, **load)
    finally:
        undo()
    return [yours, serve_and_measure(lm, "reference engine", "ours", **load),
            serve_and_measure(lm, "HF transformers", "hf", **load)]


def table_text(rows: Sequence[CapstoneRow]) -> str:
    """The capstone's table: answers identical to HF's greedy ones, tokens/s, TTFT and ITL medians."""
    hf = rows[-1].answers
    head = f"{'engine':<18} {'answers = HF':>12} {'output tok/s':>13} {'TTFT p50':>10} {'ITL p50':>9} {'failed':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        same = sum(a == b for a, b in zip(r.answers, hf, strict=True))
        g = r.loadgen
        lines.append(f"{r.name:<18} {f'{same} of {len(hf)}':>12} {human(g.get('output_tokens_per_s')):>13} "
                     f"{human(g.get('ttft_ms_p50')) + ' ms':>10} {human(g.get('itl_ms_p50')) + ' ms':>9} "
                     f"{g.get('failed', 0):>7}")
    return "\n".join(lines)


def machine_text(lm: Any) -> str:
    """What the table was measured on: the device, the CPU's flags, threads and dtype."""
    cpu = cpu_features()
    flags = ", ".join(cpu["flags"]) or "no AVX-512/AMX flags"
    where = f"CPU flags: {flags}, " if lm.device.type == "cpu" else ""
    return (f"Measured with {lm.describe()} ({where}{torch.get_num_threads()} torch threads); "
            f"ENGINE_OPTIONS {ENGINE_OPTIONS} for both of our engines; one run each, "
            "so the timings are one sample, not a median.")


def identical(rows: Sequence[CapstoneRow]) -> bool:
    """Every engine answered every question with HF's greedy tokens."""
    return all(r.answers == rows[-1].answers for r in rows)
