"""Your engine served beside the library's engine and transformers, under the same load: one table.

``infer-lab check engine --serve`` serves the engine your files make (:func:`.assemble.learner_parts`),
the library's engine with the same switches, and transformers one request at a time, each over the
same OpenAI-compatible server, in interleaved rounds. Each is asked the same chat questions
greedily (their answers compared with transformers') and then driven by the load generator's
shared-prefix workload. The table gives the answers that equal transformers', and the median over
rounds of each round's output tokens/s, TTFT p50 and ITL p50.
"""

from __future__ import annotations

import json
import statistics
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ...bench.served import serve_and_load
from ...engine.parts import EngineParts
from ...hardware import cpu_features
from ...units import human
from .assemble import SERVE_OPTIONS

QUESTIONS = ("What is the capital of France?", "Write a haiku about the sea.", "Name three primary colors.", "hi")
ANSWER_TOKENS = 16  # greedy tokens per question in the identity check
MAX_MODEL_LEN = 512


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


@dataclass
class Row:
    """One served engine over every round."""

    name: str
    answers: list[str] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)  # loadgen's pooled row per round

    def median(self, key: str) -> float | None:
        values = [r[key] for r in self.rounds if r.get(key) is not None]
        return statistics.median(values) if values else None


def serve_once(lm: Any, engine: str, parts: EngineParts | None, concurrency: int, requests: int,
               output_tokens: int, answer: bool) -> tuple[list[str] | None, dict[str, Any]]:
    """Serve ``lm`` once (``engine`` ``"ours"`` with ``parts``, or ``"hf"``), maybe ask :data:`QUESTIONS`,
    then run the shared-prefix load at ``concurrency``; the answers and loadgen's pooled row."""
    results = serve_and_load(
        lm, engine, dict(SERVE_OPTIONS) if engine == "ours" else {}, "shared-prefix", [concurrency],
        requests=requests, output_tokens=output_tokens, max_model_len=MAX_MODEL_LEN, timeout_s=600, parts=parts,
        before_load=(lambda url: _answers(url, lm.name)) if answer else None,
        workload_options={"input_words": 16, "prefix_words": 64, "turns": 1, "branches": 2})
    return results.get("before_load"), dict(results["pooled"][0])


def compare(lm: Any, parts: EngineParts, rounds: int = 2, concurrency: int = 4, requests: int = 8,
            output_tokens: int = 16) -> list[Row]:
    """Your engine, the library's and transformers', served in ``rounds`` interleaved rounds."""
    rows = [Row("your engine"), Row("library engine"), Row("HF transformers")]
    setups = (("ours", parts), ("ours", None), ("hf", None))
    for i in range(rounds):
        for row, (engine, p) in zip(rows, setups, strict=True):
            answers, pooled = serve_once(lm, engine, p, concurrency, requests, output_tokens, answer=i == 0)
            if answers is not None:
                row.answers = answers
            row.rounds.append(pooled)
    return rows


def table_text(rows: Sequence[Row]) -> str:
    """Answers identical to transformers' greedy ones, output tok/s, TTFT and ITL medians, failures."""
    hf = rows[-1].answers
    head = f"{'engine':<16} {'answers = HF':>12} {'output tok/s':>13} {'TTFT p50':>10} {'ITL p50':>9} {'failed':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        same = sum(a == b for a, b in zip(r.answers, hf, strict=True))
        failed = sum(int(x.get("failed", 0)) for x in r.rounds)
        lines.append(f"{r.name:<16} {f'{same} of {len(hf)}':>12} {human(r.median('output_tokens_per_s')):>13} "
                     f"{human(r.median('ttft_ms_p50')) + ' ms':>10} {human(r.median('itl_ms_p50')) + ' ms':>9} "
                     f"{failed:>7}")
    return "\n".join(lines)


def machine_text(lm: Any, rounds: int) -> str:
    """What the table was measured on: the device, the CPU's flags, threads, dtype, rounds."""
    cpu = cpu_features()
    flags = ", ".join(cpu["flags"]) or "no AVX-512/AMX flags"
    where = f"CPU flags: {flags}, " if lm.device.type == "cpu" else ""
    return (f"Measured with {lm.describe()} ({where}{torch.get_num_threads()} torch threads); both of our engines "
            f"with {SERVE_OPTIONS}; {rounds} interleaved round(s), tok/s and latencies are medians over rounds.")


def identical(rows: Sequence[Row]) -> bool:
    """Every engine answered every question with transformers' greedy tokens."""
    return all(r.answers == rows[-1].answers for r in rows)
