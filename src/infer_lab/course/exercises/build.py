"""Chapter 06's build exercise: the learner's int8 quantizer makes the weights of the real engine.

Its check generates greedily on the embedded SmolLM2-135M (fp32, CPU) with the learner's weights
and compares every token with a reference (transformers' greedy ``generate``, or the engine with the
library's own int8 weights), and the engine's invariants after the run. A failure names the first
diverging token with its prompt. The engine's own components are written in the build track
(:mod:`infer_lab.course.track`), whose checks share the same idea on hidden traces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch

from ...engine import Engine, EngineConfig, SamplingParams
from ...models import load_model

CHECK_MODEL = "smollm2-135m"
NEW_TOKENS = 8  # per prompt: short, so a check runs in seconds on a CPU
QUESTIONS = ("hi", "What is the capital of France?", "Write a haiku about the sea.",
             "Give me three prime numbers.")
STALL_STEPS = 8  # steps in a row that compute and emit nothing: the engine is stuck
BUILD_TIMEOUT_S = 900.0  # loading the model, its transformers reference and a few engine runs, on a busy 2-core machine


@lru_cache(maxsize=1)
def loaded() -> Any:
    """The embedded model (real weights, fp32, CPU), loaded once per process."""
    return load_model(CHECK_MODEL, device="cpu")


@lru_cache(maxsize=1)
def chat_prompts() -> tuple[tuple[int, ...], ...]:
    """The chat-formatted token ids of :data:`QUESTIONS` (about 30 tokens each)."""
    lm = loaded()
    return tuple(tuple(lm.chat_ids(q)[0].tolist()) for q in QUESTIONS)


@lru_cache(maxsize=8)
def reference(prompts: tuple[tuple[int, ...], ...], new_tokens: int = NEW_TOKENS) -> tuple[tuple[int, ...], ...]:
    """transformers greedy ``generate`` of each prompt (stops at EOS and keeps it, as the engine does)."""
    model = loaded().model
    out = []
    with torch.inference_mode():
        for p in prompts:
            ids = model.generate(torch.tensor([p]), max_new_tokens=new_tokens, do_sample=False)
            out.append(tuple(ids[0, len(p):].tolist()))
    return tuple(out)


def describe(ids: Sequence[int], limit: int = 60) -> str:
    """A prompt or token as text, for failure messages (``'What is the capi...'``)."""
    tok = loaded().tokenizer
    text = tok.decode(list(ids)) if tok is not None else str(list(ids))
    text = text.replace("\n", "\\n")
    return repr(text if len(text) <= limit else "..." + text[-(limit - 3):])


@dataclass
class EngineRun:
    """One generation of the engine with the learner's part plugged in."""

    engine: Any
    prompts: tuple[tuple[int, ...], ...]
    outputs: list[list[int]]
    errors: list[str | None]
    steps: int
    finished: bool
    crash: str | None = None  # an exception outside the engine's own per-request handling
    step_tokens: list[int] = field(default_factory=list)  # tokens scheduled in each step
    target_passes: int = 0
    preemptions: int = 0


def engine_config(**overrides: Any):
    """The checks' engine: paged KV in blocks of 4 (several blocks per prompt), plain weights, CPU."""
    base = dict(kv_mode="paged", block_size=4, num_blocks=96, max_model_len=128, max_num_seqs=4,
                static_decode=False, prepack_weights=False)
    base.update(overrides)
    return EngineConfig(**base)


def run_engine(config: Any, prompts: Sequence[Sequence[int]], plug: Callable[[Any], None] | None = None,
               new_tokens: int = NEW_TOKENS, max_steps: int | None = None) -> EngineRun:
    """Greedy generation of ``prompts`` on the embedded model with ``plug(engine)`` applied first.

    Steps one at a time (at most ``max_steps``, so a part that stops the engine making progress
    is reported instead of hanging), and records the tokens scheduled per step.
    """
    prompts = tuple(tuple(p) for p in prompts)
    engine = Engine.from_loaded(loaded(), config)
    if plug is not None:
        plug(engine)
    params = SamplingParams(max_tokens=new_tokens)
    ids = [engine.add_request(list(p), params) for p in prompts]
    limit = max_steps or 4 * (sum(len(p) for p in prompts) + len(prompts) * new_tokens)
    steps, crash, step_tokens = 0, None, []
    progress, still = None, 0

    def state() -> tuple[int, int]:
        seqs = list(engine.requests.values())
        return sum(len(s.output_ids) for s in seqs), sum(s.num_computed for s in seqs)

    try:
        while engine.has_unfinished() and steps < limit:
            logged = len(engine.step_log)
            engine.step()
            if len(engine.step_log) > logged:
                step_tokens.append(engine.step_log[-1].num_tokens)
            steps += 1
            now = state()
            still = still + 1 if now == progress else 0
            progress = now
            if still >= STALL_STEPS:
                break  # nothing computed, nothing emitted: the engine is stuck
    except Exception as exc:  # the scheduler runs outside the engine's per-request error handling
        crash = f"{type(exc).__name__}: {exc}"
    outputs, errors = [], []
    for rid in ids:
        seq = engine.requests.get(rid)
        outputs.append(list(seq.output_ids) if seq is not None else [])
        errors.append(seq.error if seq is not None else None)
    seqs = [engine.requests[rid] for rid in ids if rid in engine.requests]
    return EngineRun(engine, prompts, outputs, errors, steps, not engine.has_unfinished() and crash is None, crash,
                     step_tokens, sum(s.num_target_passes for s in seqs), sum(s.num_preemptions for s in seqs))


def compare(r: Any, case: str, run: EngineRun, expected: Sequence[Sequence[int]] | None = None,
            hint: str = "", against: str = "transformers greedy") -> bool:
    """Record whether every request finished with transformers' greedy tokens (or ``expected``, the
    tokens of what ``against`` names); name the first difference."""
    expected = reference(run.prompts) if expected is None else expected
    tail = f". Hint: {hint}" if hint else ""
    if run.crash:
        r.engine_runs.append(False)
        return r.record(case, False, f"the engine stopped at step {run.steps + 1}: {run.crash}{tail}")
    if not run.finished:
        stuck = [i for i, out in enumerate(run.outputs) if len(out) < len(expected[i])]
        i = stuck[0] if stuck else 0
        r.engine_runs.append(False)
        return r.record(case, False, f"after {run.steps} steps request {i} (prompt {describe(run.prompts[i])}) "
                                     f"still has {len(run.outputs[i])} of {len(expected[i])} tokens: the engine "
                                     f"stopped making progress{tail}")
    for i, (got, want) in enumerate(zip(run.outputs, expected, strict=True)):
        if run.errors[i]:
            r.engine_runs.append(False)
            return r.record(case, False, f"request {i} (prompt {describe(run.prompts[i])}) failed: "
                                         f"{run.errors[i]}{tail}")
        if list(got) != list(want):
            j = next((k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
            what = (f"expected token {want[j]} {describe([want[j]])}, got {got[j]} {describe([got[j]])}"
                    if j < len(got) and j < len(want) else f"{len(got)} tokens instead of {len(want)}")
            r.engine_runs.append(False)
            return r.record(case, False, f"request {i} (prompt {describe(run.prompts[i])}): first different token "
                                         f"at output position {j} (the {j} before it agree): {what}{tail}")
    r.engine_runs.append(True)
    n = sum(len(o) for o in run.outputs)
    return r.record(case, True, f"{len(run.outputs)} requests, {n} tokens identical to {against} "
                                f"({run.steps} engine steps)")
