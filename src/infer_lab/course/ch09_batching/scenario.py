"""Chapter 09's identity (number, title, parts) and the sizes each part runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...bench.predicted import CPU_BATCHES, GPU_BATCHES
from ..chapter import choose_size

NUMBER = "09"
SLUG = "batching"
TITLE = "09 · Batching: static vs continuous, the Pareto frontier, the decode step"
NEEDS_MODEL = True
PARTS = {
    "steps": "Run static and continuous batching, step by step",
    "batching": "Serve the workload with every contender",
    "sweep": "Run the max_num_seqs sweep",
    "predicted": "Measure predicted vs measured decode steps",
    "paths": "Run every decode path",
}


@dataclass(frozen=True)
class Sizes:
    """Requests and tokens of the four measurements."""

    size: str
    requests: int  # the contenders' workload
    max_num_seqs: int  # batch slots (the engine's max_num_seqs) of every contender
    prompt_len: int
    max_output: int  # the longest output (tokens): one in four answers this long, the rest 2 .. max_output // 4
    sweep_max_num_seqs: tuple[int, ...]  # the frontier's points: requests at once
    sweep_waves: int  # each sweep point serves max_num_seqs × waves requests
    sweep_output_len: int
    predicted_batches: tuple[int, ...]
    predicted_steps: int
    paths_batch: int
    paths_prompt_len: int
    paths_output_len: int
    seed: int = 0
    steps_requests: int = 16  # the step-by-step part: requests, all at t = 0
    steps_max_output: int = 24  # one in four answers this long, the rest 2 .. max // 4 tokens
    steps_slots: int = 4  # the step-by-step part's batch slots (max_num_seqs); the notebook's cell reads it


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick`` fits a 2-core CPU in a few seconds per part; ``full`` is what a GPU gets."""
    size = choose_size(device, size)
    on_gpu = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    if on_gpu:
        if size == "quick":
            return Sizes(size, requests=64, max_num_seqs=16, prompt_len=128, max_output=128,
                         sweep_max_num_seqs=(1, 4, 16, 64), sweep_waves=2, sweep_output_len=64,
                         predicted_batches=(1, 4, 16, 64), predicted_steps=8,
                         paths_batch=1, paths_prompt_len=128, paths_output_len=32)
        return Sizes(size, requests=256, max_num_seqs=64, prompt_len=512, max_output=256,
                     sweep_max_num_seqs=(1, 2, 4, 8, 16, 32, 64, 128, 256), sweep_waves=2, sweep_output_len=128,
                     predicted_batches=GPU_BATCHES, predicted_steps=16,
                     paths_batch=1, paths_prompt_len=128, paths_output_len=64)
    if size == "quick":
        return Sizes(size, requests=8, max_num_seqs=4, prompt_len=16, max_output=16,
                     sweep_max_num_seqs=(1, 2, 4, 8), sweep_waves=2, sweep_output_len=8,
                     predicted_batches=(1, 4, 16), predicted_steps=3,
                     paths_batch=1, paths_prompt_len=16, paths_output_len=6)
    return Sizes(size, requests=32, max_num_seqs=8, prompt_len=16, max_output=64,
                 sweep_max_num_seqs=(1, 2, 4, 8, 16), sweep_waves=2, sweep_output_len=32,
                 predicted_batches=CPU_BATCHES, predicted_steps=8,
                 paths_batch=1, paths_prompt_len=128, paths_output_len=64,
                 steps_requests=32, steps_max_output=48)
