"""The strongest fair baselines: transformers itself, three ways, on exactly the engine's requests.

* **HF sequential**: ``model.generate`` one request after another (what a naive server does).
* **HF padded batch**: ``model.generate`` on groups of up to ``max_num_seqs`` requests, left
  padded, each group running until its longest request is done.
* **HF continuous batching**: transformers' own continuous-batching manager (the engine behind
  ``generate_batch``): paged KV, requests join and leave every step.
* **HF padded batch, prepacked GEMMs** (CPU only): the padded batch with every ``nn.Linear``
  multiplying by the same oneDNN-prepacked weights the engine uses on a CPU
  (:mod:`infer_lab.engine.cpu.prepack`). Not something transformers offers; it is here so the
  engine's lead can be split into what the GEMM backend buys and what scheduling buys.
* **HF compiled, one at a time** (one user): ``model.generate`` with a static KV cache and a
  ``torch.compile``d forward, transformers' own recipe for fast single-user decoding; what the
  engine's compiled one-token steps (``compiled_decode``) are compared with. It compiles one
  graph per prompt length and cache size, so it runs only on equal-length workloads.

Every contender generates exactly each request's output length (EOS ignored) from the same
prompts, greedy, so their outputs can be compared with the engine's token for token.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..engine import prepack
from ..engine.cpu import cpu_decode
from ..timing import synchronize

WORKLOADS = ("uniform", "mixed")


@dataclass(frozen=True)
class Workload:
    """Requests of one benchmark: prompt token ids and how many tokens each must generate.

    ``arrival_steps``, when set, is the engine step at which each request arrives (staggered
    arrivals, :meth:`~infer_lab.engine.Engine.generate`); ``None``: all at step 0.
    """

    name: str
    prompts: list[list[int]]
    output_lens: list[int]
    arrival_steps: list[int] | None = None

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)

    def describe(self) -> str:
        p = [len(x) for x in self.prompts]
        return (f"{self.name}: {len(p)} requests, prompts {min(p)}-{max(p)} tokens, "
                f"outputs {min(self.output_lens)}-{max(self.output_lens)} tokens")


def make_workload(lm: Any, kind: str, requests: int, prompt_len: int, output_len: int, seed: int = 0,
                  shared_prefix_len: int = 0) -> Workload:
    """``uniform``: every request ``prompt_len`` in / ``output_len`` out. ``mixed``: seeded lengths,
    prompts uniform in [prompt_len / 4, 2 * prompt_len], outputs in [output_len / 4, output_len]."""
    if kind not in WORKLOADS:
        raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}, got {kind!r}")
    if shared_prefix_len > prompt_len:
        raise ValueError(f"shared_prefix_len ({shared_prefix_len}) cannot exceed prompt_len ({prompt_len})")
    rng = random.Random(seed)
    if kind == "uniform":
        prompt_lens, output_lens = [prompt_len] * requests, [output_len] * requests
    else:
        prompt_lens = [rng.randint(max(1, prompt_len // 4), 2 * prompt_len) for _ in range(requests)]
        output_lens = [rng.randint(max(1, output_len // 4), output_len) for _ in range(requests)]
    ids = lm.random_ids(requests, max(prompt_lens), seed=seed).cpu()
    if shared_prefix_len:
        ids[:, :shared_prefix_len] = ids[0, :shared_prefix_len]
    prompts = [ids[i, : max(n, shared_prefix_len)].tolist() for i, n in enumerate(prompt_lens)]
    return Workload(kind, prompts, output_lens)


@dataclass
class ContenderRun:
    """One timed run of one contender over the whole workload."""

    name: str
    elapsed_s: float
    output_tokens: int
    outputs: list[list[int]] = field(repr=False)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s


def _timed(name: str, lm: Any, workload: Workload, fn: Callable[[], list[list[int]]]) -> ContenderRun:
    synchronize(lm.device)
    t0 = time.perf_counter()
    outputs = fn()
    synchronize(lm.device)
    return ContenderRun(name, time.perf_counter() - t0, workload.output_tokens, outputs)


def _generate_kwargs(n: int) -> dict[str, Any]:
    return {"max_new_tokens": n, "min_new_tokens": n, "do_sample": False, "eos_token_id": None,
            "pad_token_id": 0}


@torch.inference_mode()
def hf_sequential(lm: Any, workload: Workload) -> ContenderRun:
    """transformers ``generate``, one request after another."""
    def run() -> list[list[int]]:
        outs = []
        for prompt, n in zip(workload.prompts, workload.output_lens, strict=True):
            out = lm.model.generate(torch.tensor([prompt], device=lm.device), **_generate_kwargs(n))
            outs.append(out[0, len(prompt):].tolist())
        return outs

    return _timed("hf-sequential", lm, workload, run)


@torch.inference_mode()
def hf_padded(lm: Any, workload: Workload, group: int) -> ContenderRun:
    """transformers ``generate`` on left-padded groups of ``group`` requests, in arrival order."""
    def run() -> list[list[int]]:
        outs = []
        for start in range(0, len(workload.prompts), group):
            prompts = workload.prompts[start : start + group]
            lens = workload.output_lens[start : start + group]
            width = max(len(p) for p in prompts)
            ids = torch.zeros(len(prompts), width, dtype=torch.long)
            mask = torch.zeros(len(prompts), width, dtype=torch.long)
            for i, p in enumerate(prompts):
                ids[i, width - len(p):] = torch.tensor(p)
                mask[i, width - len(p):] = 1
            out = lm.model.generate(ids.to(lm.device), attention_mask=mask.to(lm.device),
                                    **_generate_kwargs(max(lens)))
            outs += [out[i, width : width + n].tolist() for i, n in enumerate(lens)]
        return outs

    return _timed("hf-padded", lm, workload, run)


@contextlib.contextmanager
def prepacked_linears(model: torch.nn.Module) -> Iterator[int]:
    """Inside the block, every ``nn.Linear`` of ``model`` multiplies by a oneDNN-prepacked copy
    of its weight; yields how many were swapped. Outside, the model is exactly as before."""
    swapped = []
    try:
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                packed, bias = prepack.prepack(module.weight), module.bias
                module.forward = lambda x, packed=packed, bias=bias: prepack.linear(x, packed, bias)
                swapped.append(module)
        yield len(swapped)
    finally:
        for module in swapped:
            del module.forward  # back to nn.Linear.forward


def hf_padded_prepacked(lm: Any, workload: Workload, group: int) -> ContenderRun:
    """:func:`hf_padded` with every linear layer on prepacked weights (a CPU with oneDNN only)."""
    with prepacked_linears(lm.model):  # prepack.prepack refuses what it cannot pack
        run = hf_padded(lm, workload, group)
    return dataclasses.replace(run, name="hf-padded-prepacked")


@contextlib.contextmanager
def compiled_static_generate(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block, ``model.generate`` keeps a static KV cache and runs a ``torch.compile``d
    forward (a fixed shape per graph: one for the prompt, one for each decode step). Outside, the
    model is exactly as before. The compiled forward is kept on the model, so a second block
    reuses its graphs."""
    config = model.generation_config
    before = config.cache_implementation
    compiled = model.__dict__.get("_infer_lab_compiled_forward")
    if compiled is None:
        compiled = model._infer_lab_compiled_forward = torch.compile(model.forward, dynamic=False)
    config.cache_implementation = "static"
    model.forward = compiled
    try:
        yield
    finally:
        del model.forward  # back to the class's forward
        config.cache_implementation = before


def hf_compiled(lm: Any, workload: Workload) -> ContenderRun:
    """:func:`hf_sequential` through :func:`compiled_static_generate`; equal lengths only (each new
    prompt length or cache size would compile anew, tens of seconds each)."""
    if len({len(p) for p in workload.prompts}) > 1 or len(set(workload.output_lens)) > 1:
        raise ValueError("hf-compiled runs equal-length requests only (the uniform workload): every other "
                         "length would compile a graph of its own")
    if lm.device.type == "cpu":
        if (why := cpu_decode.verdict().refusal()) is not None:
            raise ValueError(f"hf-compiled cannot run here: {why}")
    with compiled_static_generate(lm.model):
        run = hf_sequential(lm, workload)
    return dataclasses.replace(run, name="hf-compiled")


def hf_continuous(lm: Any, workload: Workload, max_num_seqs: int, block_size: int = 16) -> ContenderRun:
    """transformers' continuous-batching manager: every request submitted at t = 0."""
    from transformers import GenerationConfig  # defers transformers
    from transformers.generation.configuration_utils import (  # defers transformers
        ContinuousBatchingConfig,
    )

    total = sum(len(p) + n for p, n in zip(workload.prompts, workload.output_lens, strict=True))
    config = ContinuousBatchingConfig(
        page_size=block_size,
        num_blocks=math.ceil(total / block_size) + len(workload.prompts) + 1,
        max_batch_tokens=max(512, max(len(p) for p in workload.prompts)),
        max_requests_per_batch=max_num_seqs,
    )
    generation = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0,  # -1: EOS off, no warning
                                  max_new_tokens=max(workload.output_lens))

    def run() -> list[list[int]]:
        results: dict[str, list[int]] = {}
        with lm.model.continuous_batching_context_manager(
            generation, continuous_batching_config=config, warmup=False
        ) as manager:
            for i, (prompt, n) in enumerate(zip(workload.prompts, workload.output_lens, strict=True)):
                manager.add_request(prompt, request_id=f"r{i}", max_new_tokens=n)
            while len(results) < len(workload.prompts):
                result = manager.get_result(timeout=60)
                if result is None:
                    if not manager.is_running():
                        raise RuntimeError("transformers' continuous batching stopped before finishing")
                    continue
                if result.is_finished():
                    if result.error:
                        raise RuntimeError(f"transformers' continuous batching failed: {result.error}")
                    results[result.request_id] = list(result.generated_tokens)
        return [results[f"r{i}"] for i in range(len(workload.prompts))]

    return _timed("hf-continuous", lm, workload, run)


CONTENDERS = ("hf-sequential", "hf-padded", "hf-continuous")
PREPACKED_CONTENDER = "hf-padded-prepacked"
EXTRA_CONTENDERS = (PREPACKED_CONTENDER, "hf-compiled")


def default_contenders(lm: Any) -> tuple[str, ...]:
    """The contenders a comparison runs on ``lm``'s device: the three HF ones, and on a CPU
    (where the engine prepacks its weights) HF padded with the same prepacked GEMMs."""
    return CONTENDERS + ((PREPACKED_CONTENDER,) if prepack.supported(lm.device, lm.dtype) else ())


def run_contender(name: str, lm: Any, workload: Workload, max_num_seqs: int) -> ContenderRun:
    """One HF contender by name, over the whole workload."""
    if name == "hf-sequential":
        return hf_sequential(lm, workload)
    if name == "hf-padded":
        return hf_padded(lm, workload, max_num_seqs)
    if name == "hf-continuous":
        return hf_continuous(lm, workload, max_num_seqs)
    if name == "hf-padded-prepacked":
        return hf_padded_prepacked(lm, workload, max_num_seqs)
    if name == "hf-compiled":
        return hf_compiled(lm, workload)
    raise ValueError(f"unknown contender {name!r}; known: {', '.join(CONTENDERS + EXTRA_CONTENDERS)}")
