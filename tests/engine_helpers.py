"""What the engine tests share: the 20-prompt set, its transformers reference, and the leak check."""

from __future__ import annotations

import torch

from infer_lab.engine import Engine

NEW_TOKENS = 10
SYSTEM = "You are a concise assistant who answers questions about computers, cooking and travel in plain words."
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "hi",
    "Explain a KV cache in one sentence.",
    "Give me three prime numbers.",
    "How do I boil an egg?",
    "Why is the sky blue? Answer briefly.",
    "Translate 'good morning' into Spanish.",
    "What does a CPU do?",
    "Name a famous painting.",
    "List the planets of the solar system in order from the sun, and say one fact about each of them.",
    "What is 12 times 12?",
]


def chat_prompts(embedded) -> list[list[int]]:
    """20 prompts from 5 to about 100 tokens; half share a long system prompt (prefix-cache hits)."""
    out = [embedded.chat_ids(q)[0].tolist() for q in QUESTIONS[:6]]
    out += [embedded.chat_ids(q, system=SYSTEM)[0].tolist() for q in QUESTIONS[6:]]
    out += [embedded.chat_ids(q, system=SYSTEM)[0].tolist() for q in QUESTIONS[:2]]
    out += [embedded.random_ids(1, n, seed=n)[0].tolist() for n in (5, 17, 33, 48, 70, 96)]
    assert len(out) == 20 and len({len(p) for p in out}) >= 10
    return out


def greedy_reference(embedded, prompts) -> list[list[int]]:
    """transformers greedy ``generate`` per prompt (it stops at EOS id 2 and keeps it, as the engine does)."""
    refs = []
    with torch.inference_mode():
        for p in prompts:
            out = embedded.model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)
            refs.append(out[0, len(p) :].tolist())
    return refs


def assert_pool_clean(engine: Engine) -> None:
    """No request holds a block; after dropping the prefix cache every block is free with count 0."""
    assert engine.blocks_in_use_by_requests() == 0
    assert not engine.has_unfinished()
    engine.reset_prefix_cache()
    if engine.config.kv_mode == "paged":
        assert engine.kv.pool.all_free()
    if engine.config.kv_mode == "contiguous":
        assert len(engine.kv.free_regions) == engine.kv.max_seqs


