"""A long prompt that arrives while other requests decode: the workload of chunked prefill (chapter 11).

``decoders`` short requests start at engine step 0; one long prompt arrives at step
``arrive_at_step``, when they are all decoding. Without chunked prefill the step that admits it
computes the whole prompt, and every decoder waits for that step; with it the prompt is split
under the step's token budget. Prompts are random token ids (seeded), lengths in tokens.
"""

from __future__ import annotations

from typing import Any

from .baselines import Workload


def long_prompt_among_decoders(lm: Any, decoders: int, long_prompt: int, arrive_at_step: int,
                               decoder_prompt: int = 16, decode_tokens: int = 16,
                               long_output: int = 4) -> Workload:
    """``decoders`` requests of ``decoder_prompt`` tokens generating ``decode_tokens`` each from step 0,
    then a ``long_prompt``-token request (the last one) generating ``long_output`` from ``arrive_at_step``."""
    if min(decoders, long_prompt, decoder_prompt, decode_tokens, long_output) < 1 or arrive_at_step < 0:
        raise ValueError("every count must be at least 1 and the arrival step at least 0")
    prompts = (lm.random_ids(decoders, decoder_prompt, seed=11).tolist()
               + lm.random_ids(1, long_prompt, seed=12).tolist())
    return Workload("long prompt among decoders", prompts, [decode_tokens] * decoders + [long_output],
                    arrival_steps=[0] * decoders + [arrive_at_step])
