"""Section 1 of chapter 12: one request counted, plain and speculative (the notebook's ``count_passes``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...bench.speculative import (
    load_prompts,
    prompt_ids,
)
from ...engine.acceptance import (
    verify_greedy,
    verify_sampling,
)
from ...figures import finish, subplots
from ..library_code import code_block
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER, PASSES_K, PASSES_PROPOSER, SECTIONS

if TYPE_CHECKING:
    from .scenario import Sizes


@dataclass(frozen=True)
class PassesResult:
    """One greedy request decoded plain and with ``proposer`` at ``k``: the engine's own counts.

    ``tokens`` are output tokens, ``passes`` target forward passes (prefill included),
    ``per_pass`` the tokens each speculative decode pass appended (kept drafts + 1).
    """

    proposer: str
    k: int
    plain_tokens: int
    plain_passes: int
    tokens: int
    passes: int
    proposed: int
    accepted: int
    per_pass: tuple[int, ...]
    identical: bool

    @property
    def decode_tokens_per_pass(self) -> float:
        """Tokens per target pass after the prefill pass (plain decoding: exactly 1)."""
        return (self.tokens - 1) / (self.passes - 1) if self.passes > 1 else 1.0

    @property
    def passes_saved(self) -> float:
        """Share of plain decoding's target passes that speculation did not need."""
        return 1 - self.passes / self.plain_passes


def grounded_prompt_ids(lm: Any, n: int) -> list[list[int]]:
    """Token ids of the first ``n`` grounded prompts (copy, edit, quote)."""
    return prompt_ids(lm, load_prompts("grounded", n))


def passes_result(runs: dict[str, tuple[Any, list[Any]]], proposer: str, k: int) -> PassesResult:
    """What ``count_passes`` of the notebook returned ({name: (RequestOutput, step records)}), counted."""
    (plain, _), (spec, steps) = runs["plain"], runs[proposer]
    per_pass = tuple(s.accepted + 1 for s in steps if s.prefill_tokens == 0 and not s.failed)
    return PassesResult(proposer, k, len(plain.token_ids), plain.target_passes, len(spec.token_ids),
                        spec.target_passes, spec.proposed_tokens, spec.accepted_tokens, per_pass,
                        plain.token_ids == spec.token_ids)


def run_passes(lm: Any, sizes: Sizes, proposer: str = PASSES_PROPOSER, k: int = PASSES_K) -> PassesResult:
    """Run the notebook's ``count_passes`` on the first grounded prompt (the copy task)."""
    count = notebook_function(NUMBER, "count_passes")
    runs = count(lm, grounded_prompt_ids(lm, 1)[0], sizes.passes_new_tokens, proposer, k)
    return passes_result(runs, proposer, k)


def acceptance_code(rule: str = "both") -> str:
    """The engine's acceptance rules, its real code (docstrings left out: the words on the page say
    the same), as a markdown code block: ``rule`` is "greedy", "sampling" or "both"."""
    rules = {"greedy": (verify_greedy,), "sampling": (verify_sampling,), "both": (verify_greedy, verify_sampling)}
    if rule not in rules:
        raise ValueError(f"rule must be one of {', '.join(rules)}, got {rule!r}")
    return code_block(*rules[rule])


LOSSLESS_SOURCE = ("vLLM's docs (v0.17.0, 'Lossless guarantees of Speculative Decoding'): \"theoretically lossless "
                   "up to the precision limits of hardware numerics\"")


def identical_text(identical: bool) -> str:
    """Whether greedy speculation reproduced plain decoding token for token, and, when it did not, why it
    can differ: the guarantee holds with exact arithmetic, and a (k+1)-token verification adds in a
    different floating-point order than a one-token decode, which can flip a near-tie."""
    if identical:
        return "**yes**"
    return ("**NO**. Greedy speculation is token-identical with exact arithmetic; in floating point, verifying "
            "k + 1 tokens in one pass can add the same products in a different order than decoding one token (and "
            "run different kernels), so a near-tie between two tokens can flip, and the outputs part from there ("
            + LOSSLESS_SOURCE + ")")


def passes_text(p: PassesResult, guess: float | None = None) -> str:
    """The counted request in words; ``guess`` (the learner's tokens per pass) beside the measurement."""
    lines = [
        f"Plain decoding: **{p.plain_tokens} tokens in {p.plain_passes} target passes** (one per token, the "
        f"first being the prefill). With **{p.proposer} at k = {p.k}**: {p.tokens} tokens in **{p.passes} target "
        f"passes**, {100 * p.passes_saved:.0f}% of the passes saved. After the prefill pass each pass yielded "
        f"**{p.decode_tokens_per_pass:.2f} tokens** on average (at most k + 1 = {p.k + 1}); the proposer guessed "
        f"{p.proposed} tokens and the target kept {p.accepted}. Output token-identical to plain decoding: "
        f"{identical_text(p.identical)}.",
    ]
    if guess is not None:
        lines.append(f"You guessed {guess:.1f} tokens per pass; measured {p.decode_tokens_per_pass:.2f}.")
    lines.append("A copy task is the best case: the text to produce is already in the prompt. Fewer passes is not "
                 "yet less time, because each pass verifies k + 1 tokens and the proposer runs too: section "
                 f"{SECTIONS['sweep']} times it. Change `k` or `proposer` in the cell above and press the button again.")
    return "\n\n".join(lines)


def passes_table(p: PassesResult):
    rows_ = [{"decoding": "plain", "tokens": p.plain_tokens, "passes": p.plain_passes, "proposed": 0, "accepted": 0,
              "tokens_per_pass": 1.0},
             {"decoding": f"{p.proposer}, k = {p.k}", "tokens": p.tokens, "passes": p.passes, "proposed": p.proposed,
              "accepted": p.accepted, "tokens_per_pass": p.decode_tokens_per_pass}]
    return people_table(rows_, PASSES_COLUMNS)


def passes_figure(p: PassesResult, source: str):
    """Output tokens against target passes, plain and speculative (the engine's own step records)."""
    fig, ax = subplots(figsize=(8, 3.4))
    ax.step(range(p.plain_passes + 1), range(p.plain_passes + 1), where="post", color="tab:gray",
            label="plain: 1 token per pass")
    made = [0, 1]  # the prefill pass makes the first token
    for n in p.per_pass:
        made.append(made[-1] + n)
    ax.step(range(len(made)), made, where="post", color="tab:blue", lw=2,
            label=f"{p.proposer}, k = {p.k}: kept drafts + 1 per pass")
    ax.set(xlabel="target forward passes", ylabel="output tokens", xlim=(0, None), ylim=(0, None),
           title=f"{p.tokens} tokens in {p.passes} passes instead of {p.plain_passes}")
    ax.legend(fontsize=8)
    fig.suptitle(f"One greedy request, copy task: {source}", fontsize=10)
    finish(fig)
    return fig


PASSES_COLUMNS = [
    Column("decoding", "decoding", "text"), Column("tokens", "output tokens", "int"),
    Column("passes", "target passes", "int"), Column("proposed", "drafts proposed", "int"),
    Column("accepted", "drafts kept", "int"), Column("tokens_per_pass", "tokens per pass after the prefill"),
]
