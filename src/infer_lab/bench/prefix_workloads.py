"""Workloads whose prompts share prefixes: what a prefix cache can reuse (chapter 10).

Each workload is a list of *waves* (:class:`Wave`); the requests of a wave arrive together once
the previous wave has finished, so what the earlier waves computed is in the cache when the next
one asks. Prompts are random token ids (a prefix cache compares ids only; no tokenizer needed),
except where a prompt quotes what the model generated earlier: a :class:`Reply` in a prompt stands
for the tokens the engine generated for one request of an earlier wave, filled in once that wave
has run (:meth:`Wave.prompts_with`). That is what a real chat or agent loop sends back, and the
K/V of those generated tokens is what real engines keep and reuse (vLLM hashes the full blocks a
request filled while decoding; SGLang inserts a finished request's tokens, generated ones included,
into its radix tree), and so does this course's engine (``Engine`` offers a finished request's
computed tokens, prompt and output, to its prefix cache).

* **shared system prompt**: one user first (it fills the cache), then the others together, each
  with the same system prompt and a short question of its own;
* **multi-turn chat**: a few conversations; turn t's prompt is turn t-1's prompt + the reply the
  model generated for it + a new question;
* **agentic branching** (propose, then review): a shared history, several proposal requests
  branching from it, then a review of each proposal: the proposal request's prompt + the proposal
  the model generated + a review instruction (a tree of shared prefixes).

These are :mod:`infer_lab.loadgen.workloads`' ``shared-prefix``, ``multiturn`` and ``agentic``
shapes in token ids, for the engine run directly instead of through a server. Deterministic: the
random ids are seeded, and the replies are whatever the (greedy, EOS-ignoring) engine generates.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PREFIX_WORKLOADS = {
    "shared_system_prompt": "shared system prompt",
    "multi_turn_chat": "multi-turn chat",
    "agentic_branching": "agentic branching",
}


@dataclass(frozen=True)
class Reply:
    """Stands, in a prompt, for the tokens the model generated for request ``request`` of wave ``wave``."""

    wave: int
    request: int


Piece = tuple[int, ...] | Reply  # token ids, or a reply filled in once its wave has run
Generated = Mapping[tuple[int, int], Sequence[int]]  # (wave, request) -> generated token ids


@dataclass(frozen=True)
class Wave:
    """Requests that arrive together: each prompt is a sequence of pieces, and each request
    generates ``output_lens[i]`` tokens (EOS ignored, so exactly that many)."""

    prompts: tuple[tuple[Piece, ...], ...]
    output_lens: tuple[int, ...]

    def prompts_with(self, generated: Generated) -> list[list[int]]:
        """The prompts in token ids, every :class:`Reply` filled from ``generated``
        ((wave, request) -> the token ids the engine generated for that request)."""
        return [[t for piece in prompt for t in (generated[(piece.wave, piece.request)]
                                                 if isinstance(piece, Reply) else piece)]
                for prompt in self.prompts]


def prompt_lengths(waves: Sequence[Wave]) -> list[list[int]]:
    """Each request's prompt length in tokens, wave by wave, before anything runs: a reply is as
    long as the request it quotes generates (EOS is ignored)."""
    def length(piece: Piece) -> int:
        return waves[piece.wave].output_lens[piece.request] if isinstance(piece, Reply) else len(piece)

    return [[sum(length(piece) for piece in prompt) for prompt in w.prompts] for w in waves]


def longest_request(waves: Sequence[Wave]) -> int:
    """Tokens of the longest request, prompt plus output: what the engine's ``max_model_len`` must hold."""
    return max(n + out for w, lens in zip(waves, prompt_lengths(waves), strict=True)
               for n, out in zip(lens, w.output_lens, strict=True))


def prefix_sharing_workloads(vocab_size: int, system_len: int, users: int, conversations: int, turns: int,
                             branches: int, output_len: int, seed: int = 0) -> dict[str, list[Wave]]:
    """The three workloads of :data:`PREFIX_WORKLOADS`, each as waves (lengths in tokens).

    ``system_len`` is the shared system prompt; the other pieces a learner or an agent writes
    (questions, review instructions) are about a quarter of it (at least 4 tokens). Multi-turn
    chats start from the first third of the system prompt; the agentic history is the system
    prompt plus half as much again. Every request generates ``output_len`` tokens, and the chat's
    replies and the agent's proposals are those generated tokens (:class:`Reply`). Seeded: the same
    arguments give the same waves.
    """
    rng = random.Random(seed)
    piece = max(4, system_len // 4)

    def toks(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(100, vocab_size) for _ in range(n))

    def wave(prompts: list[tuple[Piece, ...]]) -> Wave:
        return Wave(tuple(prompts), (output_len,) * len(prompts))

    system = toks(system_len)
    asking = [(system, toks(rng.randint(piece // 2, piece))) for _ in range(users)]
    chats = [(system[: system_len // 3], toks(piece)) for _ in range(conversations)]
    chat_waves = []
    for turn in range(turns):
        chat_waves.append(wave(chats))
        # the next turn: this turn's prompt, the reply the model generates for it, a new question
        chats = [(*c, Reply(turn, i), toks(piece // 2 + 1)) for i, c in enumerate(chats)]
    history = system + toks(system_len // 2)
    proposals = [(history, toks(piece)) for _ in range(branches)]  # "propose a change to ..."
    reviews = [(*p, Reply(1, i), toks(piece // 2)) for i, p in enumerate(proposals)]  # + the proposal + "review it"
    return {
        "shared_system_prompt": [wave(asking[:1]), wave(asking[1:])],
        "multi_turn_chat": chat_waves,
        "agentic_branching": [wave([(history, toks(piece // 2))]), wave(proposals), wave(reviews)],
    }
