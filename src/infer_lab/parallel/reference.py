"""transformers' own greedy tokens: the reference a tensor-parallel run is held against.

A split model must pick the same greedy tokens as the unsplit one. :func:`hf_greedy_tokens` runs
``model.generate`` per prompt (greedy, no sampling), stopping at EOS and keeping it, as
:func:`infer_lab.parallel.runtime.greedy_generate` does, so the two lists compare directly.
"""

from __future__ import annotations

from typing import Any

import torch


@torch.inference_mode()
def hf_greedy_tokens(lm: Any, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """The new token ids transformers' greedy ``generate`` picks after each prompt (EOS kept)."""
    eos = lm.model.config.eos_token_id
    out = []
    for p in prompts:
        ids = lm.model.generate(torch.tensor([p], device=lm.device), max_new_tokens=max_new_tokens,
                                do_sample=False, eos_token_id=eos, pad_token_id=eos)
        out.append(ids[0, len(p):].tolist())
    return out
