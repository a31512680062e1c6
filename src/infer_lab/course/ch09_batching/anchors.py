"""The saved H200 anchors the page closes on (a naive CUDA-graph decode vs the HF eager step), and section 5's launch overhead."""

from __future__ import annotations

from dataclasses import dataclass

from ...analysis.compare import saved_baseline_vs_roofline
from ...analysis.params import param_counts
from ...figures import finish, subplots
from ...units import GB
from ..ch02_feel_the_pain import saved_batch1_text
from ..saved import SavedResult, load_saved
from .shared import _plain_log_ticks

SOL_FILE = "h200-sol-decode-*.json"
HF_BASELINE_FILE = "h200-hf-baseline-*.json"


@dataclass(frozen=True)
class AnchorRow:
    """One batch size of the saved H200 anchors: a naive CUDA-graph decode vs the HF eager step."""

    batch: int
    graph_step_ms: float
    graph_tokens_per_s: float
    weight_GBps: float
    bandwidth_share: float | None  # all bytes moved per second / measured copy bandwidth
    hf_step_ms: float | None

    @property
    def hf_over_graph(self) -> float | None:
        return self.hf_step_ms / self.graph_step_ms if self.hf_step_ms else None


def anchor_rows(sol: SavedResult, baseline: SavedResult | None) -> list[AnchorRow]:
    """Rows of the sol-decode anchor (``b1``, ``b8`` ...), with the HF step at the same batch when saved."""
    copy_Bps = baseline.data["copy_TBps"] * 1e12 if baseline else None
    hf = {r["batch"]: r["step_ms"] for r in baseline.data["batch_sweep"]} if baseline else {}
    rows = []
    for key, r in sorted(((k, v) for k, v in sol.data.items() if k.startswith("b") and k[1:].isdigit()),
                         key=lambda kv: int(kv[0][1:])):
        b = int(key[1:])
        rows.append(AnchorRow(b, r["step_ms"], r["tok_s"], r["GBps_weights"],
                              r["GBps_all"] * 1e9 / copy_Bps if copy_Bps else None, hf.get(b)))
    return rows


def launch_overhead_text() -> str:
    """Why a GPU decode step is launch-bound, with the saved H200 HF baseline's numbers (labelled)."""
    found = load_saved(HF_BASELINE_FILE)
    if not found:
        return ("On a GPU, the HF eager decode step of a 7B model takes many times its weight-streaming time: "
                "Python launches hundreds of kernels one by one and the GPU waits for each.")
    src = found[0]
    d = src.data

    model = str(src.raw.get("model"))
    counts = param_counts(model)
    # a token reads one row of the embedding table: every other weight is streamed each step
    read = d["weight_bytes"] - counts.embeddings * d["weight_bytes"] / counts.total
    # the roofline's batch-1 step at 512 tokens on that run's ceilings: the figure chapter 04 compares with
    stream_ms = next(r["predicted"] for r in saved_baseline_vs_roofline(src.raw)
                     if r["quantity"].startswith("decode") and r["batch"] == 1 and r["context"] == 512)
    return (
        f"At batch 1 a decode step of the {model} shape must stream {read / GB:.1f} GB of its "
        f"{d['weight_bytes'] / GB:.1f} GB of weights (the embedding table is looked up one row per token, not "
        f"streamed) plus the KV cache: {stream_ms:.1f} ms at 512 tokens on the roofline of the {d['copy_TBps']:.2f} "
        f"TB/s copy "
        f"bandwidth measured on an {src.device}. The HF eager step measured on that machine took "
        f"{saved_batch1_text(d, stream_ms)}: Python launches hundreds of kernels one by one and the GPU waits "
        f"for each. _{src.label}._"
    )


def _anchor_figure(rows: list[AnchorRow], device: str, model: str):
    fig, ax = subplots(figsize=(6.5, 4))
    batches = [r.batch for r in rows]
    ax.plot(batches, [r.graph_step_ms for r in rows], "o-", label="naive decode in a CUDA graph")
    hf = [r for r in rows if r.hf_step_ms is not None]
    if hf:
        ax.plot([r.batch for r in hf], [r.hf_step_ms for r in hf], "s--", label="HF transformers eager (noisy run)")
    ax.set(xscale="log", yscale="log", xlabel="batch (sequences per decode step)", ylabel="decode step (ms)")
    _plain_log_ticks(ax, batches)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(f"Saved, not measured here: decode step on {device}\n{model} shape, random bf16 weights",
                 fontsize=10)
    finish(fig)
    return fig
