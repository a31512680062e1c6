"""A request as the engine sees it: its tokens, sampling settings, KV placement and timings."""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

GREEDY_BELOW = 1e-5  # temperatures below this sample the argmax


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued, or preempted and waiting to be recomputed
    RUNNING = "running"  # holds KV memory and is computed every step
    FINISHED = "finished"


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token, and when to stop.

    Attributes:
        max_tokens: most new tokens to generate (>= 1).
        temperature: 0 means greedy (argmax); otherwise logits are divided by it before softmax.
            Below ``GREEDY_BELOW`` (1e-5, as vLLM) it is greedy too: dividing by 1e-300 would
            overflow every logit to infinity, and the most likely token is what it means anyway.
        top_k: keep only the k most likely tokens (0 = all).
        top_p: keep the smallest set of tokens whose probability sums to at least p (1.0 = all).
        seed: seed of this request's own ``torch.Generator`` (same seed, same samples).
        ignore_eos: keep generating past the end-of-sequence token (benchmarks use this).
        stop_token_ids: extra token ids that end the request (the EOS id always does unless ignored).
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def validate(self) -> None:
        """Raise ValueError with the offending field when a setting is out of range."""
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = no limit), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


@dataclass
class TokenEvent:
    """What a streaming callback receives: one new token, or the end of the request.

    ``token_id`` is None on a final event that carries no token (cancellation, error).
    ``finish_reason`` is set on the last event: ``"stop"`` (EOS or stop id), ``"length"``
    (max_tokens or the context limit), ``"cancelled"`` or ``"error"`` (``error`` says why).
    """

    request_id: str
    token_id: int | None
    index: int
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    time_s: float = 0.0


@dataclass
class Sequence:
    """One request inside the engine. Times are ``time.perf_counter()`` seconds."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival_s: float
    on_token: Callable[[TokenEvent], Any] | None = None
    output_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed: int = 0  # leading tokens whose K/V is in the cache
    block_table: list[int] = field(
        default_factory=list
    )  # paged mode: physical block per logical block
    region: int | None = None  # contiguous mode: index of the reserved max-length region
    num_cached_prompt_tokens: int = 0  # prompt tokens found in the prefix cache on (first) admission
    prefix_hit: int | None = None  # tokens a prefix lookup attached, until the request is admitted
    num_preemptions: int = 0
    prefill_done: bool = False
    first_token_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    generator: torch.Generator | None = None
    num_target_passes: int = 0  # forward passes that produced tokens for this request
    num_proposed: int = 0  # speculative guesses verified
    num_accepted: int = 0  # of which the target kept

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def token_at(self, position: int) -> int:
        """The token id at ``position`` of prompt + output (without building the joined list)."""
        n = len(self.prompt_ids)
        return self.prompt_ids[position] if position < n else self.output_ids[position - n]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def ttft_s(self) -> float | None:
        """Seconds from arrival to the first generated token."""
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def itl_s(self) -> list[float]:
        """Seconds between consecutive generated tokens."""
        t = self.token_times_s
        return [b - a for a, b in zip(t, t[1:], strict=False)]


@dataclass
class RequestOutput:
    """A finished request: its generated ids and timings (seconds)."""

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    finish_reason: str | None
    error: str | None
    ttft_s: float | None
    itl_s: list[float]
    e2e_s: float | None
    num_cached_prompt_tokens: int
    num_preemptions: int
    target_passes: int = 0
    proposed_tokens: int = 0
    accepted_tokens: int = 0

    @classmethod
    def from_sequence(cls, seq: Sequence) -> RequestOutput:
        end = seq.token_times_s[-1] if seq.token_times_s else None
        return cls(
            request_id=seq.request_id,
            prompt_ids=list(seq.prompt_ids),
            token_ids=list(seq.output_ids),
            finish_reason=seq.finish_reason,
            error=seq.error,
            ttft_s=seq.ttft_s,
            itl_s=seq.itl_s,
            e2e_s=None if end is None else end - seq.arrival_s,
            num_cached_prompt_tokens=seq.num_cached_prompt_tokens,
            num_preemptions=seq.num_preemptions,
            target_passes=seq.num_target_passes,
            proposed_tokens=seq.num_proposed,
            accepted_tokens=seq.num_accepted,
        )
