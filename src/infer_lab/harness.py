"""The measurement harness: honest timing of prefill and decode.

Rules it follows everywhere: warm-up runs that are thrown away, device synchronization around
every timed region, several repeats, and percentiles (p50/p90/p99) rather than one number.
Memory is counted from tensors: weights from the parameters, KV from the cache tensors
themselves (never peak-minus-baseline, which would include activations and logits).
"""

from __future__ import annotations

import datetime as _dt
import inspect
import os
import platform
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import fast_paths
from .hardware import cpu_features, detect, device_label
from .progress import progress  # noqa: F401  (re-exported: measurements import it from here)
from .timing import Stats, summarize, synchronize, time_call  # noqa: F401  (re-exported)

# ---------------------------------------------------------------------------------------------
# Memory from tensors


def cache_tensor_bytes(cache: Any) -> int:
    """Bytes held by a transformers KV cache, summed over its K and V tensors.

    Works with ``DynamicCache``/``StaticCache`` (transformers >= 4.56 ``.layers``) and legacy
    tuples of ``(k, v)`` per layer.
    """
    if cache is None:
        return 0
    total = 0
    layers = getattr(cache, "layers", None)
    if layers is not None:
        for layer in layers:
            for name in ("keys", "values"):
                t = getattr(layer, name, None)
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total
    for item in cache:
        for t in item:
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def peak_allocated_bytes(device: torch.device) -> int | None:
    """Peak bytes allocated by torch on a CUDA device since the last reset; None on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return None


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


# ---------------------------------------------------------------------------------------------
# Generation timing with the transformers model (the baseline everything is compared to)


@dataclass
class GenerationRecord:
    """One timed greedy generation: times in seconds, memory in bytes."""

    batch: int
    prompt_len: int
    new_tokens: int
    ttft_s: float
    itl_s: list[float]
    e2e_s: float
    kv_bytes: int
    weight_bytes: int
    peak_allocated_bytes: int | None
    token_ids: list[list[int]] = field(default_factory=list)

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first: (E2E - TTFT) / (tokens - 1)."""
        return (self.e2e_s - self.ttft_s) / max(self.new_tokens - 1, 1)

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second over the whole request (all sequences of the batch)."""
        return self.batch * self.new_tokens / self.e2e_s

    def row(self) -> dict[str, Any]:
        """A flat, tidy record for a DataFrame (ms for times)."""
        itl = summarize(self.itl_s) if self.itl_s else None
        row = {"batch": self.batch, "prompt_len": self.prompt_len, "new_tokens": self.new_tokens,
               "ttft_ms": self.ttft_s * 1e3, "tpot_ms": self.tpot_s * 1e3, "e2e_ms": self.e2e_s * 1e3,
               "tokens_per_s": self.tokens_per_s, "kv_bytes": self.kv_bytes, "weight_bytes": self.weight_bytes,
               "peak_allocated_bytes": self.peak_allocated_bytes}
        if itl:
            row.update(itl.as_dict("itl_ms_", 1e3))
        return row


def cache_kwarg(model) -> str:
    """The forward() keyword for the KV cache: ``cache`` in newer transformers, else ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@torch.inference_mode()
def timed_generate(
    lm, input_ids: torch.Tensor, new_tokens: int, ignore_eos: bool = False
) -> GenerationRecord:
    """Greedy decode with the transformers model and a DynamicCache, timing every step.

    Prefill (the whole prompt in one forward pass) is the TTFT; each later single-token forward
    pass with the cache is one ITL sample. Every step is synchronized before the clock stops.

    Generation stops when every sequence has produced an end-of-sequence token
    (``lm.eos_token_ids``), or after ``new_tokens`` tokens. Each sequence's ``token_ids`` end at
    its EOS (included, as transformers returns it). ``ignore_eos=True`` always generates
    exactly ``new_tokens``: timing measurements use it so every run has the same length.
    ``itl_s`` has one entry per decode step after the first token.
    """
    from transformers import DynamicCache  # defers transformers

    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
    model, dev = lm.model, lm.device
    ids = input_ids.to(dev)
    stop = None if ignore_eos or not lm.eos_token_ids else torch.tensor(sorted(lm.eos_token_ids), device=dev)
    reset_peak(dev)
    cache = DynamicCache(config=model.config)
    kw = cache_kwarg(model)
    synchronize(dev)
    t_start = time.perf_counter()
    out = model(ids, use_cache=True, **{kw: cache})
    nxt = out.logits[:, -1:].argmax(-1)
    synchronize(dev)
    ttft = time.perf_counter() - t_start
    generated = [nxt]
    done = torch.isin(nxt[:, 0], stop) if stop is not None else None
    itl = []
    while len(generated) < new_tokens and not (done is not None and bool(done.all())):
        t0 = time.perf_counter()
        out = model(nxt, use_cache=True, **{kw: cache})
        nxt = out.logits[:, -1:].argmax(-1)
        if done is not None:
            done |= torch.isin(nxt[:, 0], stop)
        synchronize(dev)
        itl.append(time.perf_counter() - t0)
        generated.append(nxt)
    e2e = time.perf_counter() - t_start
    tokens = [_until_eos(row, lm.eos_token_ids if stop is not None else ()) for row in torch.cat(generated, dim=1).tolist()]
    return GenerationRecord(batch=ids.shape[0], prompt_len=ids.shape[1], new_tokens=len(generated), ttft_s=ttft,
                            itl_s=itl, e2e_s=e2e, kv_bytes=cache_tensor_bytes(cache), weight_bytes=lm.weight_bytes,
                            peak_allocated_bytes=peak_allocated_bytes(dev), token_ids=tokens)


def _until_eos(row: list[int], eos: Iterable[int]) -> list[int]:
    """``row`` up to and including its first EOS id."""
    eos = set(eos)
    for i, token in enumerate(row):
        if token in eos:
            return row[: i + 1]
    return row


def measure_generation(lm, input_ids: torch.Tensor, new_tokens: int, warmup: int = 1, repeats: int = 3,
                       label: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Repeat :func:`timed_generate` after warm-up; one tidy row per repeat (with ``repeat`` and labels).

    Every repeat generates exactly ``new_tokens`` (EOS ignored), so the repeats are comparable.
    """
    for _ in range(warmup):
        timed_generate(lm, input_ids, min(new_tokens, 4), ignore_eos=True)
    rows = []
    for r in range(repeats):
        row = timed_generate(lm, input_ids, new_tokens, ignore_eos=True).row()
        row.update(label or {})
        row["repeat"] = r
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# Environment metadata and tidy results


def env_metadata(lm=None) -> dict[str, Any]:
    """Where a number came from: device, driver, library versions, model, dtype, weights source, date."""
    import transformers  # defers transformers

    info = detect()
    meta: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device_kind": info.kind, "device_name": info.name, "driver": info.driver,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "platform": platform.platform(),
        "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "hardware": device_label(),
    }
    if info.kind == "cpu" or (lm is not None and lm.device.type == "cpu"):
        meta["cpu"] = cpu_features()  # model, AVX-512 / AMX flags: what the CPU kernels can use
        meta["fast_paths"] = fast_paths.asked()  # which kernels this run could take here, and why not
    if lm is not None:
        meta.update({"model": lm.name, "weights": lm.source, "dtype": str(lm.dtype).replace("torch.", ""),
                     "n_params": lm.n_params, "weight_bytes": lm.weight_bytes})
    return meta


def to_frame(rows: Sequence[dict[str, Any]], meta: dict[str, Any] | None = None):
    """Rows to a pandas DataFrame; metadata columns (device, model, ...) are added when given."""
    import pandas as pd  # defers pandas

    df = pd.DataFrame(list(rows))
    for key in ("device_name", "model", "dtype", "weights"):
        if meta and key in meta:
            df[key] = meta[key]
    return df
