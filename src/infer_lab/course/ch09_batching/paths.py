"""Section 5 of chapter 09: the same decode through each decode path this device has (the notebook's ``decode_paths``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...figures import finish, subplots
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER
from .shared import _wrap

if TYPE_CHECKING:
    from ...bench.engine_run import EngineBenchmark
    from .scenario import Sizes


@dataclass(frozen=True)
class PathRow:
    """One decode path on the same run: ITL p50 (ms), tokens/s per user and for the whole run."""

    path: str
    fused: bool
    compiled: bool
    batch: int
    itl_ms_p50: float
    tokens_per_s_per_user: float  # 1 / ITL p50
    output_tokens_per_s: float  # whole run, prefill included
    graphs_captured: int

    @property
    def label(self) -> str:
        return self.path + (" +fused" if self.fused else "") + (" +compile" if self.compiled else "")


def decode_path_variants(cuda: bool, compile_layers: bool = False) -> list[tuple[str, bool, bool]]:
    """(path, fused projections, compiled) to run, slowest idea first; CUDA graphs only on a GPU."""
    variants = [("per-sequence", False, False), ("batched", cuda, False), ("static", cuda, False)]
    if cuda:
        variants.append(("cuda-graphs", True, False))
    if compile_layers:
        variants.append((variants[-1][0], True, True))
    return variants


def path_rows(runs: dict[tuple[str, bool, bool], EngineBenchmark], batch: int) -> list[PathRow]:
    """The rows of the notebook's ``decode_paths``: one engine benchmark per (path, fused, compiled)."""
    return [PathRow(path, fused, compiled, batch, r.run.itl_ms.p50, 1e3 / r.run.itl_ms.p50,
                    r.output_tokens_per_s, r.run.decode_path.graphs_captured)
            for (path, fused, compiled), r in runs.items()]


def run_paths(lm: Any, sizes: Sizes, batch: int | None = None, compile_layers: bool = False) -> list[PathRow]:
    """Run the notebook's own experiment (``decode_paths`` of ``infer_lab/notebooks/09_batching.py``).

    The variants are :func:`decode_path_variants` of this device: ``per-sequence`` (one attention
    call per request), ``batched`` (one call for all), ``static`` (fixed padded shapes,
    preallocated buffers) and, on a GPU, ``cuda-graphs`` (the static step captured once, replayed
    with one launch); with ``compile_layers`` the fastest also with torch.compile's fused layers
    (compiled during the warm-up: tens of seconds on a CPU). ``batch`` overrides ``sizes.paths_batch``.
    """
    batch = batch or sizes.paths_batch
    experiment = notebook_function(NUMBER, "decode_paths")
    variants = decode_path_variants(lm.device.type == "cuda", compile_layers)
    return path_rows(experiment(lm, variants, batch, sizes.paths_prompt_len, sizes.paths_output_len), batch)


def paths_text(paths: list[PathRow]) -> str:
    fast = max(paths, key=lambda r: r.tokens_per_s_per_user)
    slow = min(paths, key=lambda r: r.tokens_per_s_per_user)
    return (f"At batch {fast.batch}, the fastest path here is **{fast.label}** at {fast.itl_ms_p50:.1f} ms per "
            f"token ({fast.tokens_per_s_per_user:.1f} tokens/s per user), the slowest **{slow.label}** at "
            f"{slow.itl_ms_p50:.1f} ms: {fast.tokens_per_s_per_user / slow.tokens_per_s_per_user:.2f}× apart.")


PATHS_COLUMNS = [
    Column("label", "decode path", "text"), Column("batch", "batch", "int"),
    Column("itl_ms_p50", "ITL p50 (ms)"), Column("tokens_per_s_per_user", "tokens/s per user"),
    Column("output_tokens_per_s", "output tokens/s (whole run)"), Column("graphs_captured", "CUDA graphs", "int"),
]


def paths_table(paths: list[PathRow]):
    return people_table(paths, PATHS_COLUMNS)


def paths_figure(paths: list[PathRow], source: str):
    """Tokens/s per user (1 / ITL p50) of each decode path, with the ITL in ms on each bar."""
    fig, ax = subplots(figsize=(7, 0.5 * len(paths) + 1.8))
    ax.barh([r.label for r in paths], [r.tokens_per_s_per_user for r in paths])
    for i, r in enumerate(paths):
        ax.text(r.tokens_per_s_per_user, i, f" {r.itl_ms_p50:.1f} ms", va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set(xlabel="tokens/s per user (1 / ITL p50)", xlim=(0, max(r.tokens_per_s_per_user for r in paths) * 1.25))
    ax.grid(alpha=0.3, axis="x")
    ax.set_title(f"Decode paths, batch {paths[0].batch}\n{_wrap(source, 70)}", fontsize=10)
    finish(fig)
    return fig
