"""What this CPU and this PyTorch build can run: each fast path tried once, on a tiny tensor.

The engine's CPU speed-ups call kernels that a machine may lack. oneDNN's prepacked bf16 GEMM
needs AVX-512 (bw, vl, dq) or AVX-NE-CONVERT, so an AVX2-only laptop refuses it; the int8 and
int4 kernels are PyTorch internals that a build may not have; torch.compile (the compiled
one-token decode, the compiled layers) needs a C++ compiler that works. Reading ``/proc/cpuinfo`` cannot tell: PyTorch decides at the call, from
its own checks. So each path is asked the only reliable way, by running it: once per process,
on a few numbers, compared with the plain computation. A refusal (an exception, or a wrong
answer) is caught and kept as the reason, and the caller takes the plain path instead
(``F.linear`` on the same weights, in the same dtype) or refuses the option clearly where no
plain path does the same job (the engine's quantized weights, ``compiled_decode``,
``compile_layers``).

This module keeps the verdicts; each path's owner holds its probe and asks through
:func:`ask`: :func:`infer_lab.engine.cpu.prepack.verdict`,
:func:`infer_lab.quant.kernels.verdict`, :func:`infer_lab.engine.cpu.cpu_decode.verdict`.
Which kernel family (AMX tiles, AVX-512, AVX2) runs inside a path is PyTorch's and oneDNN's
choice at run time; what the probes decide is whether the path runs here at all.

``INFER_LAB_REFUSE_FAST_PATHS`` (comma-separated names from :data:`PATHS`, or ``all``) makes a
path report "unsupported" as if the machine lacked it: to see the plain path's speed, or to
see what a laptop without the kernel gets. :func:`refused` does the same inside a ``with``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

ENV_REFUSE = "INFER_LAB_REFUSE_FAST_PATHS"

PATHS: dict[str, str] = {
    "prepack-fp32": "prepacked oneDNN GEMM on fp32 weights (EngineConfig.prepack_weights)",
    "prepack-bf16": "prepacked oneDNN GEMM on bf16 weights (EngineConfig.prepack_weights with dtype='bf16')",
    "int8-kernel": "fused int8 weight-only matmul, aten._weight_int8pack_mm (weight_quant='int8')",
    "int4-kernel": "fused int4 weight-only matmul, aten._weight_int4pack_mm_for_cpu (weight_quant='int4')",
    "torch-compile": "torch.compile on this CPU, C++ written and built by inductor (compiled_decode=True, "
                     "compile_layers=True)",
}


@dataclass(frozen=True)
class Verdict:
    """Whether one fast path runs here.

    Attributes:
        path: its name, a key of :data:`PATHS`.
        supported: True when the tiny run succeeded and matched the plain computation.
        reason: why not (PyTorch's own refusal, or what was missing); None when supported.
        forced: True when the refusal came from :data:`ENV_REFUSE` or :func:`refused`, not the machine.
    """

    path: str
    supported: bool
    reason: str | None = None
    forced: bool = False

    def describe(self) -> str:
        """One line: ``prepack-bf16: runs`` or ``prepack-bf16: refused (...)``."""
        return f"{self.path}: " + ("runs" if self.supported else f"refused ({self.reason})")

    def refusal(self) -> str | None:
        """``<what the path is> does not run here: <reason>``, or None when it runs."""
        return None if self.supported else f"{PATHS[self.path]} does not run here: {self.reason}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_VERDICTS: dict[str, Verdict] = {}
_FORCED: set[str] = set()


def refused_by_choice() -> set[str]:
    """The paths refused by :data:`ENV_REFUSE` or :func:`refused` (not by the machine)."""
    names = {n.strip() for n in os.environ.get(ENV_REFUSE, "").split(",") if n.strip()}
    if "all" in names:
        return set(PATHS)
    unknown = names - set(PATHS)
    if unknown:
        raise ValueError(f"{ENV_REFUSE} names unknown fast paths {sorted(unknown)}; known: "
                         f"{', '.join(PATHS)} or all")
    return names | _FORCED


def _refused_by_choice_verdict(path: str) -> Verdict:
    return Verdict(path, False, f"refused by choice ({ENV_REFUSE} or fast_paths.refused)", forced=True)


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0].strip()}" if lines else type(error).__name__


def ask(path: str, probe: Callable[[], str | None]) -> Verdict:
    """Whether ``path`` runs on this machine: ``probe()`` at the first ask in this process, then kept.

    ``probe`` runs the path on a few numbers and returns None when it ran and matched the plain
    computation, or why not; an exception it raises is PyTorch's refusal, and becomes the reason.
    """
    if path not in PATHS:
        raise ValueError(f"unknown fast path {path!r}; known: {', '.join(PATHS)}")
    if path in refused_by_choice():
        return _refused_by_choice_verdict(path)
    if path not in _VERDICTS:
        try:
            reason = probe()
        except Exception as error:  # the machine's or the build's refusal: what the probe is for
            reason = _first_line(error)
        _VERDICTS[path] = Verdict(path, reason is None, reason)
    return _VERDICTS[path]


def asked() -> dict[str, dict[str, Any]]:
    """The verdicts this process has asked for so far (and every path refused by choice), as JSON.

    What a benchmark records beside its numbers: the paths it could take, and why not.
    """
    out = {p: v.as_dict() for p, v in _VERDICTS.items()}
    for p in sorted(refused_by_choice()):
        out[p] = _refused_by_choice_verdict(p).as_dict()
    return out


def close(got: torch.Tensor, want: torch.Tensor, rel: float) -> bool:
    """Whether ``got`` is within ``rel`` of ``want``'s largest magnitude everywhere (a probe's "same sums?")."""
    scale = float(want.abs().max()) or 1.0
    return tuple(got.shape) == tuple(want.shape) and bool(torch.isfinite(got).all()) and \
        float((got.float() - want.float()).abs().max()) <= rel * scale


def numbers(rows: int, cols: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A small ``(rows, cols)`` tensor of normal numbers in ``dtype``, the same for every ``seed``."""
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)).to(dtype)


@contextlib.contextmanager
def refused(*paths: str) -> Iterator[None]:
    """Inside the ``with``, each of ``paths`` reports "unsupported", as on a machine that lacks it."""
    unknown = set(paths) - set(PATHS)
    if unknown:
        raise ValueError(f"unknown fast paths {sorted(unknown)}; known: {', '.join(PATHS)}")
    before = set(_FORCED)
    _FORCED.update(paths)
    try:
        yield
    finally:
        _FORCED.clear()
        _FORCED.update(before)
