"""Weight prepacking on a CPU: every GEMM weight reordered once, at load, for oneDNN.

``F.linear`` on a CPU hands a plain row-major matrix to the BLAS of PyTorch's wheel (MKL) on
every call. At decode's small batches a GEMM is a stream over its weight matrix, and how fast
that stream runs depends on the layout the kernel reads. oneDNN's GEMM reads a copy of the
weight that was reordered once into its own blocked layout (a "prepacked" weight), which is
what vLLM's CPU backend and ``torch.compile``'s CPU freezing do as well.

``infer-lab bench gemm`` times one step's GEMMs both ways over a model's real weights; on the
course's 2-core AMD EPYC (``assets/results/gemm-cpu-*.json``) the prepacked ones are about twice
as fast at decode's batch sizes and still ahead at prefill's. The results differ from
``F.linear``'s only by float rounding (another blocking of the same sums).

The price is memory: the packed copy sits next to the plain weights, which the transformers
model still uses. So the engine prepacks by default only on a CPU, for fp32 or bf16 weights,
and only when the copy fits comfortably in the free memory.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

DTYPES = (torch.float32, torch.bfloat16)


def available() -> bool:
    """True when this PyTorch build has oneDNN (``mkldnn``) for CPU tensors."""
    return bool(torch.backends.mkldnn.is_available())


def supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether weights of ``dtype`` on ``device`` can be prepacked (CPU, fp32 or bf16, oneDNN built in)."""
    return torch.device(device).type == "cpu" and dtype in DTYPES and available()


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
    if not supported(weight.device, weight.dtype):
        raise ValueError(
            f"prepacking needs a {' or '.join(map(str, DTYPES))} weight on a CPU with oneDNN; "
            f"got {weight.dtype} on {weight.device}"
        )
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
