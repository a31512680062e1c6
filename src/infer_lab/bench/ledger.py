"""The performance ledger: the bytes a decode step streams, and how close a run came to the memory's speed.

A decode step reads every weight once and, for each sequence of the batch, the K and V of its
cached tokens in every layer. At a measured decode speed those bytes are a bandwidth, and
against the copy bandwidth measured on the same machine a fraction: the figure gpt-fast and
tiny-llm print beside tokens/s. GB = 1e9 bytes throughout.

Counted: every weight once, the LM head included (a head tied to the token embedding counts
once, as the head reads it; an untied embedding table is not counted, since a step reads only
its batch's rows, as :func:`infer_lab.bench.llama_cpp.streamed_bytes` counts it), and the K/V
of :func:`infer_lab.analysis.memory.kv_bytes` (sliding-window layers capped at their window).
Not counted: activations, logits, the scales of an int8 or fp8 KV cache, the padded slots a
static decode path reads and masks, and everything a mixture-of-experts model's unused experts
would save (all experts are counted).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch

from .. import hardware
from ..analysis.compare import TORCH_DTYPE_NAMES, dtype_name, shape_of
from ..analysis.memory import as_shape, kv_bytes, weight_format
from ..analysis.params import param_counts
from ..engine import EngineModel
from ..timing import machine_load
from ..units import GiB, MiB, fmt_bytes, gb, human

# The copy's two buffers are each at least MIN_COPY_BYTES and LLC_MULTIPLE times the CPU's
# last-level cache, so the copy runs from main memory; on a GPU each is GPU_COPY_BYTES.
MIN_COPY_BYTES = 64 * MiB
LLC_MULTIPLE = 4
GPU_COPY_BYTES = GiB
COPY_REPEATS = 10


@dataclass(frozen=True)
class CopyBandwidth:
    """The machine's measured copy bandwidth: ``GBps`` (1e9 bytes read + written per second)."""

    GBps: float
    working_set_bytes: int  # both buffers together
    threads: int | None  # torch threads of the copy; None on a GPU
    device: str
    how: str  # one sentence: how it was measured
    others_cores: float | None = None  # cores other programs kept busy just before (CPU only)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _last_level_cache_bytes() -> int | None:
    """The largest cache of CPU 0 (Linux sysfs), or None where it cannot be read."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes) if sizes else None


@cache
def _measure_copy(device: str) -> CopyBandwidth:
    dev = torch.device(device)
    others = None
    if dev.type == "cuda":
        buffer, threads, past = GPU_COPY_BYTES, None, "its L2"
        gbps = hardware.measure_bandwidth(dev, buffer, COPY_REPEATS) / 1e9
    else:
        llc = _last_level_cache_bytes()
        buffer = max(MIN_COPY_BYTES, LLC_MULTIPLE * (llc or 0))
        past = f"the {fmt_bytes(llc)} last-level cache" if llc else "the last-level cache (size unknown)"
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        others = machine_load(0.2).others_cores  # a busy machine copies slower: say so
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            gbps = hardware.measure_bandwidth(dev, buffer, COPY_REPEATS) / 1e9
        finally:
            torch.set_num_threads(before)
    who = f"{threads} threads" if threads else str(dev)
    how = (f"dst.copy_(src) of two {fmt_bytes(buffer)} buffers on {who} (well past {past}), "
           f"bytes read plus bytes written per second, median of {COPY_REPEATS} copies after a warm-up")
    return CopyBandwidth(GBps=gbps, working_set_bytes=2 * buffer, threads=threads, device=str(dev), how=how,
                         others_cores=others)


def copy_bandwidth(device: torch.device | str = "cpu") -> CopyBandwidth:
    """The copy bandwidth of ``device`` from main memory (or HBM), every thread; measured once per process.

    :func:`infer_lab.hardware.measure_bandwidth` over a working set well past the last-level
    cache, with every core this process may use (the torch thread count is put back after).
    On a CPU it records how many cores other programs kept busy just before (``others_cores``).
    """
    return _measure_copy(str(torch.device(device)))


def _is_loaded(model: Any) -> bool:
    return hasattr(getattr(model, "model", None), "config")


def streamed_weight_bytes(model: Any) -> int:
    """Bytes of weights one decode step reads: all parameters but an untied token-embedding table.

    ``model``: a loaded model (:func:`infer_lab.models.load_model`; its tensors' own bytes) or a
    config, name or :class:`~infer_lab.shape.ModelShape` (bf16, from the parameter counts).
    """
    if _is_loaded(model):
        embed = model.model.get_input_embeddings().weight
        head = model.model.get_output_embeddings().weight
        untied = 0 if embed.data_ptr() == head.data_ptr() else embed.numel() * embed.element_size()
        return model.weight_bytes - untied
    counts = param_counts(as_shape(model))
    return weight_format("bf16").bytes_for(counts.total - (counts.embeddings if counts.lm_head else 0))


def engine_weight_bytes(lm: Any, engine_model: Any) -> int:
    """:func:`streamed_weight_bytes` of ``lm`` as an engine over ``engine_model`` stores them.

    Its GEMM weights as stored (codes and scales when quantized, a bf16 copy when cast) plus
    the rest (norms, biases) in the engine's dtype.
    """
    float_gemm = EngineModel.from_hf(lm.model).gemm_weight_bytes()
    rest = streamed_weight_bytes(lm) - float_gemm
    rest = rest * engine_model.dtype.itemsize // lm.dtype.itemsize
    return engine_model.plain.gemm_weight_bytes_stored() + rest


def decode_step_bytes(model: Any, batch: float, context_tokens: float, *, weight_bytes: int | None = None,
                      kv_dtype: str | None = None) -> int:
    """Bytes one decode step streams from memory: every weight once, plus each sequence's cached K/V.

    Args:
        model: a loaded model (:func:`infer_lab.models.load_model`), or its config, catalog
            name or :class:`~infer_lab.shape.ModelShape` (then weights and K/V are taken as bf16).
        batch: sequences in the step (a mean over steps may be fractional).
        context_tokens: tokens each sequence's cache holds when the step reads it (a mean).
        weight_bytes: the weights' bytes when they are not the model's own (a quantized file);
            default :func:`streamed_weight_bytes`.
        kv_dtype: how the cache stores K/V (``fp32``, ``bf16``, ``fp16``, ``int8``, ``fp8``);
            default the model's dtype.
    Returns:
        Bytes (an int): weights + ``batch`` x the K/V of ``context_tokens`` tokens in every layer.
    """
    if _is_loaded(model):
        shape, dtype = shape_of(model), dtype_name(model)
    else:
        shape, dtype = as_shape(model), "bf16"
    weights = streamed_weight_bytes(model) if weight_bytes is None else weight_bytes
    return weights + round(kv_bytes(shape, context_tokens, users=batch, kv_dtype=kv_dtype or dtype))


def kv_dtype_of(dtype: torch.dtype, kv_dtype: str | None = None) -> str:
    """The ledger's name of a cache's K/V format: ``kv_dtype`` when quantized, else the model's ``dtype``."""
    return kv_dtype or TORCH_DTYPE_NAMES[str(dtype)]


def mean_decode_context(prompt_lens: Sequence[int], output_lens: Sequence[int]) -> float:
    """Mean tokens a sequence's cache holds in a decode step, over every decode step of every request.

    A request of ``P`` prompt and ``N`` output tokens gets its first token from prefill, then
    ``N - 1`` decode steps that read ``P + 1`` ... ``P + N - 1`` cached tokens.
    """
    steps = sum(n - 1 for n in output_lens)
    if steps < 1:
        raise ValueError("no request has a decode step (every output is a single token)")
    tokens = sum((n - 1) * p + n * (n - 1) / 2 for p, n in zip(prompt_lens, output_lens, strict=True))
    return tokens / steps


def ledger_row(output_tokens_per_s: float, mean_batch: float, bytes_per_step: int,
               copy: CopyBandwidth) -> dict[str, float]:
    """The ledger's columns for one measured decode speed.

    Args:
        output_tokens_per_s: decode tokens/s only: tokens from decode steps over those steps'
            seconds, prefill excluded (its tokens and its time).
        mean_batch: output tokens one decode step yields on average: the mean number of
            sequences per decode step (times the tokens per pass under speculative decoding).
        bytes_per_step: :func:`decode_step_bytes` at that batch and the mean context.
        copy: the machine's :func:`copy_bandwidth`.
    Returns:
        ``bytes_per_step``; ``bytes_per_token`` (= bytes_per_step / mean_batch);
        ``GBps`` = steps/s x bytes_per_step / 1e9, with steps/s = output_tokens_per_s / mean_batch;
        ``copy_GBps``; ``fraction_of_copy`` = GBps / copy_GBps.
    """
    if mean_batch <= 0:
        raise ValueError(f"mean_batch must be > 0, got {mean_batch}")
    gbps = output_tokens_per_s / mean_batch * bytes_per_step / 1e9
    return {"bytes_per_step": bytes_per_step, "bytes_per_token": bytes_per_step / mean_batch, "GBps": gbps,
            "copy_GBps": copy.GBps, "fraction_of_copy": gbps / copy.GBps}


def format_ledger(output_tokens_per_s: float, row: dict[str, float]) -> str:
    """One line for people: ``'52.3 tok/s · 0.538 GB/step · 28.4 GB/s = 61% of copy'``."""
    return (f"{human(output_tokens_per_s)} tok/s · {human(gb(row['bytes_per_step']))} GB/step · "
            f"{human(row['GBps'])} GB/s = {row['fraction_of_copy']:.0%} of copy")
