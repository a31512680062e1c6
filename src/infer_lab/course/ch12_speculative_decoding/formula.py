"""Section 0 of chapter 12: the textbook model E = (1 - a^(k+1)) / (1 - a), speedup E / (k c + v) (analytic)."""

from __future__ import annotations

from ...analysis.speculation import predicted_speedup_with_verify
from ...engine.acceptance import expected_tokens_per_pass
from ...figures import finish, subplots
from .scenario import K_RANGE


def formula_text(alpha: float, k: int, cost_ratio: float, verify_ratio: float = 1.0) -> str:
    """The textbook prediction for one (alpha, k, c), and the best k, in words (analytic)."""
    e = expected_tokens_per_pass(alpha, k)
    s = predicted_speedup_with_verify(alpha, k, cost_ratio, verify_ratio)
    best = max(K_RANGE, key=lambda j: predicted_speedup_with_verify(alpha, j, cost_ratio, verify_ratio))
    return (
        f"At α = {alpha:.2f} and k = {k}, one target pass yields E = (1 − α^(k+1)) / (1 − α) = **{e:.2f} tokens** "
        f"and costs k·c + v = {k * cost_ratio + verify_ratio:.2f} plain decode steps, so the speedup is "
        f"**{s:.2f}×**. The best k here is {best} "
        f"({predicted_speedup_with_verify(alpha, best, cost_ratio, verify_ratio):.2f}×): beyond it, each extra "
        "guess is kept too rarely to pay for itself."
    )


def formula_figure(alpha: float, cost_ratio: float, verify_ratio: float = 1.0):
    """Analytic: tokens per pass and speedup vs k at one alpha, c and v, with neighbouring alphas."""
    fig, axes = subplots(1, 2, figsize=(10, 3.4))
    ks = list(K_RANGE)
    for a in sorted({round(alpha, 2), 0.5, 0.7, 0.9}):
        style = dict(lw=2.5, color="k") if a == round(alpha, 2) else dict(lw=1, alpha=0.6)
        axes[0].plot(ks, [expected_tokens_per_pass(a, k) for k in ks], "-o", ms=3, label=f"α = {a:.2f}", **style)
        axes[1].plot(ks, [predicted_speedup_with_verify(a, k, cost_ratio, verify_ratio) for k in ks], "-o", ms=3,
                     label=f"α = {a:.2f}", **style)
    axes[0].set(xlabel="k (guesses per pass)", ylabel="tokens per target pass", ylim=(0, None),
                title="E = (1 − α^(k+1)) / (1 − α)")
    axes[1].axhline(1, color="k", lw=0.8)
    axes[1].set(xlabel="k (guesses per pass)", ylabel="speedup (×)", ylim=(0, None),
                title=f"E / (k·c + v), c = {cost_ratio:.2f}, v = {verify_ratio:.2f}")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.suptitle("The textbook model of speculative decoding (analytic)", fontsize=10)
    finish(fig)
    return fig
