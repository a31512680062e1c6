"""The saved H200 HF-eager baseline: its caution and its batch-1 step, as other chapters quote it."""

from __future__ import annotations

from typing import Any


def saved_warning(data: dict[str, Any]) -> str:
    """Why the saved HF baseline must not be read for its shape, with its own numbers."""
    ctx, batch = data["ctx_sweep"], {r["batch"]: r for r in data["batch_sweep"]}
    b1, b_next = batch[min(batch)], batch[sorted(batch)[1]]
    return (
        f"this run is noisy and launch-bound: its ITL *falls* from {ctx[0]['itl_ms']:.0f} ms at "
        f"{ctx[0]['ctx']:,} tokens to {ctx[-1]['itl_ms']:.0f} ms at {ctx[-1]['ctx']:,}, and its decode step "
        f"jumps from {b1['step_ms']:.0f} ms at batch {b1['batch']} to {b_next['step_ms']:.0f} ms at batch "
        f"{b_next['batch']}, then stays flat. Read it only as 'HF eager decode costs tens of ms per step, "
        "far above the weight-streaming time'; draw no conclusion from its shape until it is re-measured."
    )


def saved_batch1_steps_ms(data: dict[str, Any]) -> tuple[float, float]:
    """(fastest, slowest) batch-1 decode step of the saved HF baseline, over every row that has one
    (its context sweep and its batch sweep): the one way chapters quote that noisy run."""
    steps = [r["itl_ms"] for r in data["ctx_sweep"]] + [r["step_ms"] for r in data["batch_sweep"] if r["batch"] == 1]
    return min(steps), max(steps)


def saved_batch1_text(data: dict[str, Any], roof_ms: float) -> str:
    """The saved HF eager batch-1 step as a range against ``roof_ms`` (the roofline's step, ms)."""
    lo, hi = saved_batch1_steps_ms(data)
    return (f"between **{lo:.0f} and {hi:.0f} ms** ({lo / roof_ms:.0f}–{hi / roof_ms:.0f}× the roofline's "
            f"{roof_ms:.1f} ms) across that run's batch-1 rows; the run is noisy, so it is quoted as a range, "
            "never as one row")
