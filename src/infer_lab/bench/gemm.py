"""The GEMMs of one engine step, plain (``F.linear``) against prepacked (oneDNN), by batch size.

A decode step multiplies every token's hidden state by every weight matrix of the model: four
per layer (q|k|v, o, gate|up, down) and the LM head. This times exactly those multiplications,
over the model's real weights in layer order (so, as in a real step, a weight has left the
cache by the time it is used again), for a few batch sizes, through both backends of
:mod:`infer_lab.engine.cpu.prepack`. Median of ``repeats`` interleaved rounds after one warm-up pass.
CPU only: a CPU op is finished when it returns, so no synchronization is needed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..engine import cpu_decode, prepack
from ..engine.model import EngineModel
from ..harness import env_metadata
from .ledger import copy_bandwidth

BATCHES = (1, 4, 16, 64, 256)


@dataclass(frozen=True)
class GemmPoint:
    """One batch size: the step's GEMMs through each backend (ms) and the bytes they stream (GB/s)."""

    batch: int
    plain_ms: float
    prepacked_ms: float
    weight_bytes: int
    max_abs_diff: float  # largest |plain - prepacked| over the LM head's outputs
    plain_samples_ms: tuple[float, ...] = ()  # every round's time, in order
    prepacked_samples_ms: tuple[float, ...] = ()

    @property
    def speedup(self) -> float:
        return self.plain_ms / self.prepacked_ms

    @property
    def plain_gb_per_s(self) -> float:
        return self.weight_bytes / (self.plain_ms * 1e-3) / 1e9

    @property
    def prepacked_gb_per_s(self) -> float:
        return self.weight_bytes / (self.prepacked_ms * 1e-3) / 1e9


def _step_gemms(batch: int, model: EngineModel, dtype: torch.dtype,
                mm: Callable[..., torch.Tensor] = prepack.linear) -> Callable[[], None]:
    """A function that multiplies ``batch`` rows by every GEMM weight of ``model`` once, in order, through ``mm``."""
    shape = model.shape
    generator = torch.Generator().manual_seed(batch)
    hidden, attn, mid = (torch.randn(batch, n, generator=generator).to(dtype)
                         for n in (shape.hidden, shape.heads * shape.head_dim, shape.intermediate))

    def one_pass() -> None:
        for w in model.layers:
            mm(hidden, w.qkv_proj, w.qkv_bias)
            mm(attn, w.o_proj)
            mm(hidden, w.gate_up_proj)
            mm(mid, w.down_proj)
        mm(hidden, model.lm_head)

    return one_pass


def _interleaved_ms(passes: list[Callable[[], None]], repeats: int) -> list[list[float]]:
    """Each pass once to warm up, then ``repeats`` rounds of all of them in turn: every time, in ms."""
    for one_pass in passes:
        one_pass()
    times: list[list[float]] = [[] for _ in passes]
    for _ in range(repeats):
        for one_pass, ts in zip(passes, times, strict=True):
            t0 = time.perf_counter()
            one_pass()
            ts.append(time.perf_counter() - t0)
    return [[t * 1e3 for t in ts] for ts in times]


@torch.inference_mode()
def measure_gemm_backends(lm: Any, batches: tuple[int, ...] = BATCHES, repeats: int = 5) -> list[GemmPoint]:
    """Plain against prepacked GEMMs of one step of ``lm`` at each batch size (rows = tokens)."""
    if not batches or min(batches) < 1:
        raise ValueError(f"batch sizes must be >= 1, got {batches}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    plain = EngineModel.from_hf(lm.model)
    packed = plain.prepacked()  # refuses a model it cannot pack (GPU, fp16)
    points = []
    for batch in batches:
        x = torch.randn(batch, plain.shape.hidden, generator=torch.Generator().manual_seed(0)).to(lm.dtype)
        diff = (prepack.linear(x, plain.lm_head) - prepack.linear(x, packed.lm_head)).abs().max().item()
        plain_ms, packed_ms = _interleaved_ms(
            [_step_gemms(batch, plain, lm.dtype), _step_gemms(batch, packed, lm.dtype)], repeats)
        points.append(GemmPoint(batch, statistics.median(plain_ms), statistics.median(packed_ms),
                                plain.gemm_weight_bytes(), diff, tuple(plain_ms), tuple(packed_ms)))
    return points


@torch.inference_mode()
def measure_one_row(lm: Any, repeats: int = 5, compiled: bool = True) -> dict[str, dict[str, float]]:
    """One user's step (one row) four ways over the same weights: ms and GB/s read.

    ``F.linear`` (plain), oneDNN on prepacked weights, the compiled multiply-sum GEMV of
    :mod:`infer_lab.engine.cpu.cpu_decode` (when a C++ compiler is found; its first call compiles),
    and ``Tensor.sum`` over every weight: no arithmetic worth the name, so the speed at which
    this machine reads those bytes, and the mark a GEMV could reach. ``compiled=False`` leaves
    the compiled GEMV out (it takes tens of seconds to compile the first time).
    """
    plain, dtype = EngineModel.from_hf(lm.model), lm.dtype

    def read_only() -> None:
        for t in plain.gemm_weights():
            t.sum()

    passes = {"plain": _step_gemms(1, plain, dtype), "read (sum)": read_only}
    if prepack.supported(plain.device, dtype):
        passes["prepacked"] = _step_gemms(1, plain.prepacked(), dtype)
    if compiled and cpu_decode.unsupported_reason(plain.device, dtype) is None:
        passes["compiled gemv"] = _step_gemms(1, plain, dtype, cpu_decode.compiled_gemv())
    times = _interleaved_ms(list(passes.values()), repeats)
    weight_bytes = plain.gemm_weight_bytes()
    out = {}
    for name, samples in zip(passes, times, strict=True):
        ms = statistics.median(samples)
        out[name] = {"ms": ms, "gb_per_s": weight_bytes / (ms * 1e-3) / 1e9, "samples_ms": samples}
    return out


def gemm_benchmark(lm: Any, batches: tuple[int, ...] = BATCHES, repeats: int = 5) -> dict[str, Any]:
    """:func:`measure_gemm_backends` as JSON, with the environment and threads.

    When the batches include 1, also :func:`measure_one_row` (``one_row``): one user's step
    through every path, next to the speed of merely reading the weights. Every GB/s comes with
    its fraction of the machine's :func:`~.ledger.copy_bandwidth` (``*fraction_of_copy``). The
    bytes are the GEMM weights only: this times no attention, so it streams no K/V.
    """
    points = measure_gemm_backends(lm, batches, repeats)
    one_row = measure_one_row(lm, repeats) if 1 in batches else None
    copy = copy_bandwidth(lm.device)
    rows = [{**asdict(p), "speedup": p.speedup, "plain_gb_per_s": p.plain_gb_per_s,
             "prepacked_gb_per_s": p.prepacked_gb_per_s, "plain_fraction_of_copy": p.plain_gb_per_s / copy.GBps,
             "prepacked_fraction_of_copy": p.prepacked_gb_per_s / copy.GBps} for p in points]
    for r in (one_row or {}).values():
        r["fraction_of_copy"] = r["gb_per_s"] / copy.GBps
    return {"rows": rows, "one_row": one_row, "repeats": repeats, "copy_bandwidth": copy.as_dict(),
            "threads": torch.get_num_threads(), "environment": env_metadata(lm)}
