"""Weight prepacking on a CPU: every GEMM weight reordered once, at load, for oneDNN.

``F.linear`` on a CPU hands a plain row-major matrix to the BLAS of PyTorch's wheel (MKL) on
every call. At decode's small batches a GEMM is a stream over its weight matrix, and how fast
that stream runs depends on the layout the kernel reads. oneDNN's GEMM reads a copy of the
weight that was reordered once into its own blocked layout (a "prepacked" weight), which is
what vLLM's CPU backend and ``torch.compile``'s CPU freezing do as well.

``infer-lab bench gemm`` times one step's GEMMs both ways over a model's real weights; on the
course's 2-core AMD EPYC (``src/infer_lab/results/gemm-cpu-*.json``) the prepacked ones are about twice
as fast at decode's batch sizes and still ahead at prefill's. The results differ from
``F.linear``'s only by float rounding (another blocking of the same sums).

The price is memory: the packed copy sits next to the plain weights, which the transformers
model still uses. So the engine prepacks by default only on a CPU, for fp32 or bf16 weights,
and only when the copy fits comfortably in the free memory.

Not every CPU runs it: oneDNN's bf16 GEMM needs AVX-512 (bw, vl, dq) or AVX-NE-CONVERT, which
AVX2-only laptops lack. :func:`verdict` asks once per process by packing and multiplying a tiny
weight (:mod:`infer_lab.fast_paths`); where it is refused, :func:`supported` says no and the
engine multiplies the plain weights with ``F.linear`` in the same dtype.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ... import fast_paths

DTYPES = (torch.float32, torch.bfloat16)


def available() -> bool:
    """True when this PyTorch build has oneDNN (``mkldnn``) for CPU tensors."""
    return bool(torch.backends.mkldnn.is_available())


def _probe(dtype: torch.dtype) -> str | None:
    if not available():
        return "this PyTorch build has no oneDNN (mkldnn)"
    w, x = fast_paths.numbers(16, 64, 0, dtype), fast_paths.numbers(3, 64, 1, dtype)
    got = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w), None, "none", [], "")
    if not fast_paths.close(got, F.linear(x, w), 1e-4 if dtype == torch.float32 else 2e-2):
        return f"oneDNN's {dtype} GEMM gave other numbers than F.linear"
    return None


def verdict(dtype: torch.dtype) -> fast_paths.Verdict:
    """Whether this CPU and PyTorch prepack and multiply ``dtype`` (fp32 or bf16) weights: probed once."""
    if dtype not in DTYPES:
        raise ValueError(f"only {' and '.join(map(str, DTYPES))} weights are prepacked, not {dtype}")
    name = "prepack-fp32" if dtype == torch.float32 else "prepack-bf16"
    return fast_paths.ask(name, lambda: _probe(dtype))


def refusal(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why weights of ``dtype`` on ``device`` cannot be prepacked here, or None when they can."""
    if torch.device(device).type != "cpu" or dtype not in DTYPES:
        return (f"prepacking is a CPU optimization for {' or '.join(map(str, DTYPES))} weights; "
                f"these are {dtype} on {device}")
    return verdict(dtype).refusal()


def supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether weights of ``dtype`` on ``device`` can be prepacked: a CPU, fp32 or bf16, and this
    machine's oneDNN runs it (:func:`verdict`)."""
    return refusal(device, dtype) is None


def free_memory_bytes() -> int | None:
    """Memory the OS can give this process now (bytes), or None where it cannot say."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def fits(copy_bytes: int, share: float = 0.5) -> bool:
    """True when a packed copy of ``copy_bytes`` takes at most ``share`` of the free memory."""
    free = free_memory_bytes()
    return free is None or copy_bytes <= share * free


def prepack(weight: torch.Tensor) -> torch.Tensor:
    """A copy of ``weight (out, in)`` in oneDNN's blocked layout, for :func:`linear` only.

    The result is an opaque tensor (``is_mkldnn``): it cannot be sliced or printed, only
    multiplied. It does not follow later changes to ``weight``.
    """
    if weight.dim() != 2:
        raise ValueError(f"only 2-D (out, in) weights are prepacked, got shape {tuple(weight.shape)}")
    why = refusal(weight.device, weight.dtype)
    if why is not None:
        raise ValueError(f"cannot prepack this weight: {why}")
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())


def is_prepacked(weight: torch.Tensor) -> bool:
    return weight.is_mkldnn


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` for a plain or a prepacked ``weight``: every engine GEMM goes here.

    A quantized weight (:mod:`infer_lab.quant.kernels`, not a tensor) multiplies itself with
    its own fused kernel.
    """
    if not isinstance(weight, torch.Tensor):
        return weight.linear(x, bias)
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)
