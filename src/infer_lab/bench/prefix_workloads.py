"""Workloads whose prompts share prefixes: what a prefix cache can reuse (chapter 10).

Each workload is a list of *waves*; a wave is a :class:`~infer_lab.bench.baselines.Workload`
(prompt token ids, output lengths in tokens) whose requests arrive together once the previous
wave has finished, so what the earlier waves computed is in the cache when the next one asks.
Prompts are random token ids (a prefix cache compares ids only; no tokenizer needed):

* **shared system prompt**: one user first (it fills the cache), then the others together, each
  with the same system prompt and a short question of its own;
* **multi-turn chat**: a few conversations; turn t's prompt is turn t-1's prompt + a reply + a new
  question;
* **agentic branching** (propose, then review): a shared history, several proposals branching
  from it, then a review of each proposal that extends its branch (a tree of shared prefixes).

These are :mod:`infer_lab.loadgen.workloads`' ``shared-prefix``, ``multiturn`` and ``agentic``
shapes in token ids, for the engine run directly instead of through a server.
"""

from __future__ import annotations

import random

from .baselines import Workload

PREFIX_WORKLOADS = {
    "shared_system_prompt": "shared system prompt",
    "multi_turn_chat": "multi-turn chat",
    "agentic_branching": "agentic branching",
}


def prefix_sharing_workloads(vocab_size: int, system_len: int, users: int, conversations: int, turns: int,
                             branches: int, output_len: int, seed: int = 0) -> dict[str, list[Workload]]:
    """The three workloads of :data:`PREFIX_WORKLOADS`, each as waves (lengths in tokens).

    ``system_len`` is the shared system prompt; the other pieces (questions, replies, proposals)
    are about a quarter of it (at least 4 tokens). Multi-turn chats start from the first third of
    the system prompt; the agentic history is the system prompt plus half as much again. Every
    request generates ``output_len`` tokens. Seeded: the same arguments give the same ids.
    """
    rng = random.Random(seed)
    piece = max(4, system_len // 4)

    def toks(n: int) -> list[int]:
        return [rng.randrange(100, vocab_size) for _ in range(n)]

    def wave(prompts: list[list[int]]) -> Workload:
        return Workload("wave", [list(p) for p in prompts], [output_len] * len(prompts))

    system = toks(system_len)
    asking = [system + toks(rng.randint(piece // 2, piece)) for _ in range(users)]
    chats = [system[: system_len // 3] + toks(piece) for _ in range(conversations)]
    chat_waves = []
    for _ in range(turns):
        chat_waves.append(wave(chats))
        chats = [c + toks(piece) + toks(piece // 2 + 1) for c in chats]  # the reply, the next question
    history = system + toks(system_len // 2)
    proposals = [history + toks(piece) for _ in range(branches)]
    reviews = [p + toks(piece) + toks(piece // 2) for p in proposals]
    return {
        "shared_system_prompt": [wave(asking[:1]), wave(asking[1:])],
        "multi_turn_chat": chat_waves,
        "agentic_branching": [wave([history + toks(piece // 2)]), wave(proposals), wave(reviews)],
    }
