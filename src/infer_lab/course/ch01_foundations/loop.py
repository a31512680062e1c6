"""Section 1 of chapter 01: the autoregressive loop, one token at a time (the notebook's ``generate_step_by_step``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER

if TYPE_CHECKING:
    from .scenario import Sizes


@dataclass(frozen=True)
class LoopResult:
    """The loop's steps (shapes and the chosen token of each forward pass) and the engine's tokens."""

    model: str
    prompt: str
    prompt_ids: tuple[int, ...]
    steps: list[dict[str, Any]]  # {"input": (tokens,), "hidden": (tokens, hidden), "logits": (vocab,), "token": id}
    engine_tokens: tuple[int, ...]
    pieces: tuple[str, ...] | None  # each chosen token as text; None without a tokenizer
    random_weights: bool

    @property
    def tokens(self) -> tuple[int, ...]:
        return tuple(s["token"] for s in self.steps)

    @property
    def same_as_engine(self) -> bool:
        return self.tokens == self.engine_tokens

    @property
    def first_difference(self) -> int | None:
        """The first step (0-based) where the loop and the engine chose different tokens."""
        return next((i for i, (a, b) in enumerate(zip(self.tokens, self.engine_tokens, strict=False)) if a != b),
                    None if len(self.tokens) == len(self.engine_tokens) else min(len(self.tokens), len(self.engine_tokens)))


NO_TOKENIZER = ("**This model has no tokenizer** (random weights): the prompt's words were mapped to fixed token ids, "
                "one per word (`lm.word_ids`), and the loop shows token ids instead of text. Random weights also "
                "choose meaningless tokens; the loop, the shapes and the passes are the same.")


def prompt_ids(lm: Any, prompt: str) -> list[int]:
    """Tokenize ``prompt``; without a tokenizer, one fixed id per word (what the notebook's cell does)."""
    return lm.tokenizer.encode(prompt) if lm.tokenizer else lm.word_ids(prompt)[0].tolist()


def loop_question(lm: Any, prompt: str) -> str:
    """Part 1's prediction question, with the prompt's length counted by ``lm``'s own tokenizer
    (without one, one id per word), so the learner can answer it before running the cell."""
    count = len(prompt_ids(lm, prompt))
    unit = "tokens for this model's tokenizer" if lm.tokenizer else "token ids (no tokenizer: one per word)"
    return (f"**Predict first:** the cell below writes `new_tokens` tokens (set in the cell) after the prompt "
            f"\"{prompt}\", which is **{count} {unit}**. In its last pass, how many tokens go through every "
            "layer? How long is each pass's logits vector, for this model?")


def loop_result(lm: Any, prompt: str, ids: list[int], steps: list[dict[str, Any]], engine_tokens: list[int]) -> LoopResult:
    """The notebook's loop and engine outputs, with the chosen tokens as text where there is a tokenizer."""
    tokens = [s["token"] for s in steps]
    pieces = tuple(lm.tokenizer.decode([t]) for t in tokens) if lm.tokenizer is not None else None
    return LoopResult(lm.describe(), prompt, tuple(ids), [dict(s) for s in steps], tuple(engine_tokens), pieces,
                      bool(lm.is_random))


def run_loop(lm: Any, sizes: Sizes) -> LoopResult:
    """Run the notebook's own loop (``generate_step_by_step``) and the engine's greedy tokens."""
    loop, engine = notebook_function(NUMBER, "generate_step_by_step"), notebook_function(NUMBER, "engine_greedy")
    ids = prompt_ids(lm, sizes.loop_prompt)
    return loop_result(lm, sizes.loop_prompt, ids, loop(lm, ids, sizes.loop_new_tokens),
                       engine(lm, ids, sizes.loop_new_tokens))


def _shape(s: tuple[int, ...]) -> str:
    return "(" + ", ".join(f"{n:,}" for n in s) + ")"


def loop_rows(loop: LoopResult) -> list[dict[str, Any]]:
    rows = []
    for i, s in enumerate(loop.steps):
        rows.append({"step": i + 1, "input": _shape(s["input"]), "hidden": _shape(s["hidden"]),
                     "logits": _shape(s["logits"]), "token": s["token"],
                     "text": repr(loop.pieces[i]) if loop.pieces is not None else "— (no tokenizer)",
                     "engine": loop.engine_tokens[i] if i < len(loop.engine_tokens) else None})
    return rows


LOOP_COLUMNS = [
    Column("step", "pass", "int"), Column("input", "token ids in (shape)", "text"),
    Column("hidden", "after the layers (shape)", "text"), Column("logits", "logits (shape)", "text"),
    Column("token", "chosen token id", "int"), Column("text", "as text", "text"),
    Column("engine", "the engine's token", "int"),
]


def loop_table(loop: LoopResult):
    return people_table(loop_rows(loop), LOOP_COLUMNS)


def loop_text(loop: LoopResult) -> str:
    """How many passes, how much text each re-read, what was written, and whether the engine agrees."""
    n, first, last = len(loop.steps), loop.steps[0]["input"][0], loop.steps[-1]["input"][0]
    vocab = loop.steps[0]["logits"][0]
    wrote = (f"It wrote {''.join(loop.pieces)!r} after {loop.prompt!r}." if loop.pieces is not None
             else f"It chose the token ids {list(loop.tokens)}.")
    lines = [] if loop.pieces is not None else [NO_TOKENIZER]
    lines += [f"**{n} tokens took {n} forward passes.** Each pass ran the whole text through every layer again: "
             f"{first} tokens in the first, {last} in the last. Each pass's logits hold {vocab:,} scores, one per "
             f"vocabulary entry, and only the last position's are needed. {wrote}"]
    if loop.same_as_engine:
        lines.append(f"The engine, with its KV cache and one decode step per token, chose **the same {n} tokens**: "
                     "the plain loop is the real computation; the cache only avoids redoing the earlier tokens.")
    else:
        i = loop.first_difference
        why = (" On random weights the top two scores are often nearly tied, so a different order of additions "
               "(the engine's cached, fused kernels) can pick the other one." if loop.random_weights else
               " With real weights this should not happen: report it.")
        lines.append(f"The engine's greedy tokens **differ from pass {i + 1} on** ({list(loop.engine_tokens)})." + why)
    return " ".join(lines)
