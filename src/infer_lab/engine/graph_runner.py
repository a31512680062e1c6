"""Decode steps in fixed shapes, replayed from CUDA graphs: where a GPU's decode time goes.

At batch 1 a 7B decode step is 32 layers of small work; in eager PyTorch each of its hundreds
of kernels is launched from Python, and the GPU waits on the CPU between them (in the saved
H200 anchor run, ``infer_lab/results/h200-hf-baseline-*.json``, the HF eager step takes about ten
times the weight-streaming time). A CUDA graph records the kernels of one step once and
replays them with a single launch. That needs fixed shapes and fixed memory addresses, so this
runner:

1. pads the batch up to a *bucket* (1, 2, 4, 8, ... up to ``max_num_seqs``) and the block
   tables up to a bucket of context (powers of two blocks up to ``max_model_len``);
2. keeps every input in a preallocated buffer (token ids, positions, slots, block tables,
   context lengths) and copies each step's values into it;
3. points padding rows at a scratch KV block outside the pool, so their writes are harmless;
4. captures :meth:`EngineModel.decode_step` once per (batch, context) bucket, all graphs
   sharing one memory pool, and replays the smallest bucket that fits.

On a CPU there is nothing to capture; the same padded static path runs eagerly, which is how
the tests check it token for token against transformers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from .kv_cache import PagedKVCache
from .layers import LayerFunctions
from .model import EngineModel


def buckets_up_to(limit: int) -> list[int]:
    """1, 2, 4, ... doubling, and ``limit`` itself last: the padded sizes that get a graph."""
    sizes, b = [], 1
    while b < limit:
        sizes.append(b)
        b *= 2
    return [*sizes, limit]


@dataclass
class DecodeBatch:
    """One pure-decode step: a new token for each of ``len(input_ids)`` sequences (host lists)."""

    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    block_tables: list[list[int]]
    context_lens: list[int]


class Replayable(Protocol):
    def replay(self) -> None: ...


Capture = Callable[[Callable[[], torch.Tensor]], tuple[Replayable, torch.Tensor]]


class CudaGraphCapture:
    """Records the kernels one call of ``fn`` launches (``torch.cuda.graph``) for replay.

    All graphs of one runner share a memory pool: they never run at the same time, so their
    intermediate buffers can overlap.
    """

    def __init__(self) -> None:
        self.pool: Any = None

    def __call__(self, fn: Callable[[], torch.Tensor]) -> tuple[Replayable, torch.Tensor]:
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        # Warm up on a side stream first, as torch requires (lazy init, cuBLAS workspaces).
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        return graph, out


class StaticDecodeRunner:
    """Runs pure-decode steps of an engine through fixed-shape, optionally graph-captured, buffers.

    Args:
        model: the engine's model.
        kv: the engine's paged cache, built with ``scratch_block=True``.
        max_num_seqs: the largest batch it will be asked to run.
        max_model_len: the longest context (tokens).
        use_cuda_graphs: capture and replay CUDA graphs (only on a CUDA device).
        capture: how a step is captured (default :class:`CudaGraphCapture`); tests pass a
            stand-in that replays by re-running, to check the buffer bookkeeping on a CPU.
        layer_fns: how the engine runs each layer (fused GEMMs, torch.compile).
    """

    def __init__(
        self,
        model: EngineModel,
        kv: PagedKVCache,
        max_num_seqs: int,
        max_model_len: int,
        use_cuda_graphs: bool = False,
        capture: Capture | None = None,
        layer_fns: LayerFunctions | None = None,
    ):
        if use_cuda_graphs and capture is None and model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; the model is on {model.device}")
        self.model, self.kv = model, kv
        self.layer_fns = layer_fns or LayerFunctions()
        self.block_size = kv.block_size
        self.batch_buckets = buckets_up_to(max_num_seqs)
        self.block_buckets = buckets_up_to(math.ceil(max_model_len / self.block_size))
        self.use_cuda_graphs = use_cuda_graphs
        if kv.scratch_block is None:
            raise ValueError("the paged cache needs scratch_block=True for padded decode batches")
        self.scratch_block = kv.scratch_block
        device, n, w = model.device, self.batch_buckets[-1], self.block_buckets[-1]
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.zeros(n, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(n, w, dtype=torch.long, device=device)
        self.context_lens = torch.ones(n, dtype=torch.long, device=device)
        self.capture: Capture = capture or CudaGraphCapture()
        self.graphs: dict[tuple[int, int], Replayable] = {}
        self.graph_logits: dict[tuple[int, int], torch.Tensor] = {}
        self.steps = 0  # decode steps run through the runner
        self.replays = 0  # of which replayed from a CUDA graph

    def bucket(self, batch: int, blocks: int) -> tuple[int, int]:
        """The smallest (batch, blocks) bucket that holds ``batch`` sequences of ``blocks`` blocks."""
        if batch > self.batch_buckets[-1] or blocks > self.block_buckets[-1]:
            raise ValueError(
                f"a decode batch of {batch} x {blocks} blocks exceeds the runner's "
                f"{self.batch_buckets[-1]} x {self.block_buckets[-1]}"
            )
        b = next(x for x in self.batch_buckets if x >= batch)
        w = next(x for x in self.block_buckets if x >= blocks)
        return b, w

    def run(self, step: DecodeBatch) -> torch.Tensor:
        """Logits ``(B, vocab)`` fp32 for the ``B`` sequences of ``step``."""
        n = len(step.input_ids)
        width = max(len(t) for t in step.block_tables)
        b, w = self.bucket(n, width)
        self._fill(step, b, w)
        self.steps += 1
        if not self.use_cuda_graphs:
            return self._eager(b, w)[:n]
        if (b, w) not in self.graphs:
            self._capture(b, w)
        self.graphs[(b, w)].replay()
        self.replays += 1
        return self.graph_logits[(b, w)][:n]

    def _fill(self, step: DecodeBatch, b: int, w: int) -> None:
        """Copy the step into the static buffers; rows ``n..b`` become padding on the scratch block."""
        n, scratch = len(step.input_ids), self.scratch_block
        pad = b - n
        host = torch.empty(4, b, dtype=torch.long)
        host[0, :n] = torch.tensor(step.input_ids)
        host[1, :n] = torch.tensor(step.positions)
        host[2, :n] = torch.tensor(step.slot_mapping)
        host[3, :n] = torch.tensor(step.context_lens)
        if pad:
            host[:, n:] = torch.tensor([0, 0, scratch * self.block_size, 1])[:, None]
        tables = torch.full((b, w), scratch, dtype=torch.long)
        for i, row in enumerate(step.block_tables):
            tables[i, : len(row)] = torch.tensor(row[:w])
        device = self.input_ids.device
        host = host.to(device, non_blocking=True)
        self.input_ids[:b].copy_(host[0])
        self.positions[:b].copy_(host[1])
        self.slot_mapping[:b].copy_(host[2])
        self.context_lens[:b].copy_(host[3])
        self.block_tables[:b, :w].copy_(tables.to(device, non_blocking=True))

    def _eager(self, b: int, w: int) -> torch.Tensor:
        return self.model.decode_step(
            self.input_ids[:b],
            self.positions[:b],
            self.slot_mapping[:b],
            self.block_tables[:b, :w],
            self.context_lens[:b],
            self.kv,
            self.block_size,
            self.layer_fns,
        )

    def _capture(self, b: int, w: int) -> None:
        """Record the (b, w) step once; replays read the same input buffers and write the same output."""
        graph, logits = self.capture(lambda: self._eager(b, w))
        self.graphs[(b, w)], self.graph_logits[(b, w)] = graph, logits

    def capture_all(self) -> float:
        """Capture every bucket now (instead of on first use); returns the seconds it took."""
        t0 = time.perf_counter()
        if self.use_cuda_graphs:
            for b in self.batch_buckets:
                for w in self.block_buckets:
                    if (b, w) not in self.graphs:
                        self._fill(_padding_only(b, self.scratch_block, self.block_size), b, w)
                        self._capture(b, w)
            if self.model.device.type == "cuda":
                torch.cuda.synchronize()
        return time.perf_counter() - t0

    def close(self) -> None:
        """Drop the graphs (and the memory pool they hold)."""
        self.graphs.clear()
        self.graph_logits.clear()


def _padding_only(b: int, scratch: int, block_size: int) -> DecodeBatch:
    """A batch of ``b`` rows that only touch the scratch block (used to capture graphs ahead of time)."""
    return DecodeBatch(
        input_ids=[0] * b,
        positions=[0] * b,
        slot_mapping=[scratch * block_size] * b,
        block_tables=[[scratch]] * b,
        context_lens=[1] * b,
    )
