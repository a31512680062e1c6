"""Workloads for the load generator: what the simulated users send.

A workload is a list of *sessions*. A session is a chain of chat calls made one after another
by the same simulated user; each call sees the history so far (including the answers the
server gave to the earlier calls). Single-shot workloads have one call per session.

Text is built from a fixed word list, so no tokenizer is needed and the same workload works
against any OpenAI-compatible server. Lengths are therefore given in *words*; the true token
counts always come from the server's ``usage`` field. The random workload can instead send
prompts as token ids (``token_prompts``, completions endpoint), so the input length is exact
in tokens on every server that takes token-id prompts (ours, vLLM, SGLang), as other tools'
random datasets are.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..units import require_positive

WORKLOADS = ("random", "shared-prefix", "multiturn", "agentic", "sharegpt:FILE")

# Common English words: each is one or two tokens in most tokenizers.
_WORDS = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government number "
    "night point home water room mother area money story fact month lot right study book eye job word "
    "business issue side kind head house service friend father power hour game line end member law car "
    "city community name president team minute idea kid body information back parent face others level "
    "office door health person art war history party result change morning reason research girl guy "
    "moment air teacher force education foot boy age policy process music market sense nation plan "
    "college interest death experience effect use class control care field development role effort rate"
).split()


# Token ids for token-id prompts: ordinary tokens in every common tokenizer (special and
# control tokens sit below 1000 or far above 30000: Llama 3, Qwen, Mistral, SmolLM).
TOKEN_ID_RANGE = (1000, 30000)


@dataclass
class Turn:
    """One call of a session: the new user message and how many tokens to ask for.

    ``prompt_ids``, when set, is sent instead of the text as a completions prompt of token ids.
    """

    user: str
    max_tokens: int
    prompt_ids: list[int] | None = None


@dataclass
class Session:
    """A chain of calls by one simulated user. ``system`` is sent first on every call."""

    session_id: str
    turns: list[Turn]
    system: str | None = None
    history: list[dict[str, str]] = field(default_factory=list)
    kind: str = ""

    def messages_for(self, turn_index: int, answers: list[str]) -> list[dict[str, str]]:
        """Chat messages of call ``turn_index``, given the server's answers to the earlier calls."""
        msgs: list[dict[str, str]] = []
        if self.system:
            msgs.append({"role": "system", "content": self.system})
        msgs.extend(self.history)
        for i in range(turn_index):
            msgs.append({"role": "user", "content": self.turns[i].user})
            msgs.append({"role": "assistant", "content": answers[i] if i < len(answers) else ""})
        msgs.append({"role": "user", "content": self.turns[turn_index].user})
        return msgs


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, n_words)))


def _around(rng: random.Random, mean: int, spread: float) -> int:
    """An integer uniformly within ``mean * (1 ± spread)``, at least 1."""
    low, high = int(mean * (1 - spread)), int(mean * (1 + spread))
    return max(1, rng.randint(max(1, low), max(1, high)))


def random_workload(
    n: int,
    input_words: int = 256,
    output_tokens: int = 128,
    spread: float = 0.5,
    seed: int = 0,
    token_prompts: bool = False,
) -> list[Session]:
    """``n`` independent single calls with lengths uniform within ``× (1 ± spread)`` of the means.

    ``spread=0`` gives fixed lengths (vLLM's ``--random-range-ratio 0``). With ``token_prompts``
    the input length counts tokens (sent as ids), else words.
    """
    if not 0.0 <= spread < 1.0:
        raise ValueError(f"the range ratio must be in [0, 1), got {spread}")
    require_positive("input length", input_words)
    require_positive("output length", output_tokens)
    rng = random.Random(seed)
    sessions = []
    for i in range(n):
        n_in, n_out = _around(rng, input_words, spread), _around(rng, output_tokens, spread)
        ids = [rng.randrange(*TOKEN_ID_RANGE) for _ in range(n_in)] if token_prompts else None
        text = f"<{n_in} token ids>" if token_prompts else _text(rng, n_in)
        sessions.append(Session(f"random-{i}", [Turn(text, n_out, ids)], kind="random"))
    return sessions


def shared_prefix_workload(
    n: int, prefix_words: int = 512, input_words: int = 32, output_tokens: int = 128, seed: int = 0
) -> list[Session]:
    """``n`` chats that share one long system prompt (the prefix a prefix cache can reuse)."""
    rng = random.Random(seed)
    system = "You are a helpful assistant. Background: " + _text(rng, prefix_words)
    return [
        Session(
            f"prefix-{i}",
            [Turn(f"Question {i}: " + _text(rng, input_words), output_tokens)],
            system=system,
            kind="shared-prefix",
        )
        for i in range(n)
    ]


def multiturn_workload(
    n_sessions: int, turns: int = 4, input_words: int = 64, output_tokens: int = 64, seed: int = 0
) -> list[Session]:
    """Conversations of ``turns`` calls each; every call resends the whole growing history."""
    require_positive("turns", turns)
    rng = random.Random(seed)
    return [
        Session(
            f"chat-{s}",
            [Turn(f"Turn {t}: " + _text(rng, input_words), output_tokens) for t in range(turns)],
            system="You are a concise assistant.",
            kind="multiturn",
        )
        for s in range(n_sessions)
    ]


def agentic_workload(
    n_tasks: int,
    branches: int = 4,
    prefix_words: int = 1024,
    output_tokens: int = 64,
    seed: int = 0,
) -> list[Session]:
    """Agentic branching: per task, a long shared context, then ``branches`` propose-then-review chains.

    Every call of a task starts with the same long context (tools, documents, task); each branch
    proposes an answer, then a second call reviews that proposal with the proposal in the
    history. This is the tree-shaped reuse where a radix prefix cache shines.
    """
    require_positive("branches", branches)
    rng = random.Random(seed)
    sessions = []
    for task in range(n_tasks):
        context = f"Agent context for task {task}. Tools and documents: " + _text(rng, prefix_words)
        for b in range(branches):
            sessions.append(
                Session(
                    f"agent-{task}-{b}",
                    [
                        Turn(
                            f"Propose approach number {b} for the task in a few steps.",
                            output_tokens,
                        ),
                        Turn(
                            "Review the proposal above: list its flaws, then give a verdict.",
                            output_tokens,
                        ),
                    ],
                    system=context,
                    kind="agentic",
                )
            )
    return sessions


def sharegpt_workload(
    path: str | Path, n: int, max_output_tokens: int = 256, seed: int = 0
) -> list[Session]:
    """The first human turn of ``n`` conversations from a ShareGPT-format JSON file.

    The file is a list of ``{"conversations": [{"from": "human"|"gpt", "value": str}, ...]}``.
    The answer budget is the recorded reply's word count (×1.3 for tokens), capped.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"ShareGPT file not found: {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, list):
        raise ValueError(
            f"{path}: expected a JSON list of conversations, got {type(data).__name__}"
        )
    pairs: list[tuple[str, int]] = []
    for conv in data:
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not turns or len(turns) < 2:
            continue
        first, second = turns[0], turns[1]
        if first.get("from") not in ("human", "user") or not first.get("value"):
            continue
        reply_words = len(str(second.get("value", "")).split())
        pairs.append((str(first["value"]), max(1, min(max_output_tokens, int(reply_words * 1.3)))))
    if not pairs:
        raise ValueError(
            f"{path} holds no usable conversations (need a human turn followed by a reply)"
        )
    rng = random.Random(seed)
    chosen = (
        [pairs[rng.randrange(len(pairs))] for _ in range(n)]
        if n > len(pairs)
        else rng.sample(pairs, n)
    )
    return [
        Session(f"sharegpt-{i}", [Turn(text, out)], kind="sharegpt")
        for i, (text, out) in enumerate(chosen)
    ]


def build_workload(
    name: str,
    n_requests: int,
    seed: int = 0,
    input_words: int = 256,
    output_tokens: int = 128,
    prefix_words: int = 512,
    turns: int = 4,
    branches: int = 4,
    range_ratio: float = 0.5,
    token_prompts: bool = False,
) -> list[Session]:
    """Sessions for a workload name (see :data:`WORKLOADS`) totalling about ``n_requests`` calls.

    Multi-call workloads round the number of sessions up so at least ``n_requests`` calls are made.
    ``range_ratio`` and ``token_prompts`` apply to the random workload (see :func:`random_workload`).
    """
    require_positive("requests", n_requests)
    if token_prompts and name != "random":
        raise ValueError("token-id prompts are for the random workload only")
    if name == "random":
        return random_workload(
            n_requests, input_words, output_tokens, range_ratio, seed, token_prompts
        )
    if name == "shared-prefix":
        return shared_prefix_workload(
            n_requests, prefix_words, min(input_words, 64), output_tokens, seed=seed
        )
    if name == "multiturn":
        return multiturn_workload(
            -(-n_requests // turns), turns, min(input_words, 128), output_tokens, seed=seed
        )
    if name == "agentic":
        return agentic_workload(
            -(-n_requests // (2 * branches)), branches, prefix_words, output_tokens, seed=seed
        )
    if name.startswith("sharegpt:"):
        return sharegpt_workload(name.split(":", 1)[1], n_requests, output_tokens, seed=seed)
    raise ValueError(f"unknown workload {name!r}; use one of {', '.join(WORKLOADS)}")


def count_calls(sessions: list[Session]) -> int:
    """Total number of calls (requests) the sessions will make."""
    return sum(len(s.turns) for s in sessions)


def describe(sessions: list[Session]) -> dict[str, Any]:
    """Shape of a workload for the results JSON: sessions, calls, kinds."""
    return {
        "sessions": len(sessions),
        "calls": count_calls(sessions),
        "kinds": sorted({s.kind for s in sessions}),
    }
