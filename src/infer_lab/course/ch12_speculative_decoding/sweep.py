"""Section 2 of chapter 12: proposers and k on grounded prompts, measured next to the prediction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ...analysis.plausibility import caution, line_fit_flags, r_squared, speedup_flags
from ...analysis.speculation import (
    VerifyCost,
    acceptance_by_position,
    accepted_length_pmf,
    alpha_mle,
    expected_acceptance_rate,
    predicted_speedup_with_verify,
)
from ...bench.speculative import (
    PLAIN,
    Comparison,
    SpecRow,
    rows,
    verify_cost,
)
from ...engine.acceptance import (
    expected_tokens_per_pass,
    predicted_speedup,
)
from ...figures import finish, subplots
from ...units import count
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .passes import identical_text
from .scenario import K_RANGE, NUMBER
from .shared import COLORS, _hardware, _pct, _x, prompts_note

if TYPE_CHECKING:
    from .scenario import Sizes


@dataclass(frozen=True)
class AcceptanceDetail:
    """Per-pass acceptance of one (proposer, k) at batch 1: why accepted/proposed is not alpha.

    ``length_counts[j]`` passes kept j drafts (j = 0..k) among passes that had k drafts;
    ``position_acceptance[i-1]`` is the acceptance of draft i given drafts 1..i-1 were kept.
    """

    proposer: str
    k: int
    passes: int
    empty_fraction: float  # passes with no proposal at all
    short_fraction: float  # passes with 1..k-1 drafts
    mean_drafts: float
    acceptance_rate: float | None
    alpha_mle: float | None
    iid_acceptance_rate: float | None  # what i.i.d. drafts at alpha_mle would show
    length_counts: tuple[int, ...]
    position_acceptance: tuple[float | None, ...]


@dataclass(frozen=True)
class SweepResult:
    """Proposers x k on grounded prompts at batch 1, with everything the prediction needs."""

    rows: list[SpecRow]
    details: list[AcceptanceDetail]
    verify: VerifyCost
    plain_tokens_per_s: float
    plain_step_s: float
    prompts: list[str]
    max_new_tokens: int
    rounds: int
    hardware: str
    threads: int
    target_layers: int
    verify_r2: float | None = None  # R² of the t0 + t1 q fit over its samples
    prompts_note: str = ""  # how the prompts became token ids, when not through a tokenizer

    def proposers(self) -> list[str]:
        return list(dict.fromkeys(r.proposer for r in self.rows))

    def of(self, proposer: str) -> list[SpecRow]:
        return sorted((r for r in self.rows if r.proposer == proposer), key=lambda r: r.k)

    def best(self, proposer: str) -> SpecRow:
        """The measured best k (highest wall-clock speedup)."""
        return max(self.of(proposer), key=lambda r: r.speedup)

    def predicted_best_k(self, proposer: str) -> tuple[int, float]:
        """(k, speedup) maximising E / (k c + v) over k = 1..8, from this proposer's alpha and c."""
        line = self.of(proposer)
        alpha = line[0].alpha
        c = sum(r.cost_ratio for r in line) / len(line)
        curve = {k: predicted_speedup_with_verify(alpha, k, c, self.verify.ratio(k + 1)) for k in K_RANGE}
        k = max(curve, key=curve.get)
        return k, curve[k]


def acceptance_detail(comparison: Comparison, proposer: str, k: int) -> AcceptanceDetail:
    """How this run's drafts were kept, pass by pass (batch-1 passes of every prompt)."""
    passes = comparison.totals(proposer, k).passes
    n = len(passes) or 1
    full = [(m, a) for m, a in passes if m == k]
    counts = [0] * (k + 1)
    for _, a in full:
        counts[a] += 1
    mle = alpha_mle([a for _, a in passes], [m for m, _ in passes])
    proposed = sum(m for m, _ in passes)
    return AcceptanceDetail(
        proposer, k, len(passes),
        empty_fraction=sum(m == 0 for m, _ in passes) / n,
        short_fraction=sum(0 < m < k for m, _ in passes) / n,
        mean_drafts=proposed / n,
        acceptance_rate=sum(a for _, a in passes) / proposed if proposed else None,
        alpha_mle=mle,
        iid_acceptance_rate=expected_acceptance_rate(mle, k) if mle is not None else None,
        length_counts=tuple(counts),
        position_acceptance=tuple(acceptance_by_position([a for _, a in passes], [m for m, _ in passes], k)),
    )


def sweep_result(chosen: list[Any], comparison: Comparison, lm: Any, sizes: Sizes) -> SweepResult:
    """What ``proposers_by_k`` returned (the prompts and the comparison), as the chapter's rows."""
    plain = comparison.plain
    out = rows(comparison, "grounded")
    details = [acceptance_detail(comparison, p, k) for p, k in comparison.runs if p != PLAIN]
    runs = [comparison.totals(*key) for key in comparison.runs]
    cost = verify_cost(runs)
    samples = [(q, t) for r in runs for q, t in r.verify_samples if q >= 2]
    return SweepResult(out, details, cost, plain.tokens_per_s, plain.step_s, [p.name for p in chosen],
                       comparison.max_new_tokens, comparison.rounds, _hardware(lm), torch.get_num_threads(),
                       lm.model.config.num_hidden_layers, r_squared(samples, cost.t0_s, cost.t1_s),
                       prompts_note(lm))


def run_sweep(lm: Any, sizes: Sizes) -> SweepResult:
    """Run the notebook's ``proposers_by_k`` on the grounded prompts at every (proposer, k) of ``sizes``."""
    experiment = notebook_function(NUMBER, "proposers_by_k")
    chosen, comparison = experiment(lm, "grounded", sizes.sweep_prompts, sizes.sweep_configs(),
                                    sizes.max_new_tokens, sizes.rounds)
    return sweep_result(chosen, comparison, lm, sizes)


def sweep_text(sweep: SweepResult) -> str:
    lines = [
        f"Plain decoding of the same engine: **{sweep.plain_tokens_per_s:.1f} tokens/s** "
        f"({sweep.plain_step_s * 1e3:.1f} ms per decode step) on {sweep.hardware}, "
        f"{count(sweep.threads, 'torch thread')}, {len(sweep.prompts)} grounded prompts, up to {sweep.max_new_tokens} new tokens each."
    ]
    for proposer in sweep.proposers():
        best = sweep.best(proposer)
        k_pred, s_pred = sweep.predicted_best_k(proposer)
        same = all(r.identical for r in sweep.of(proposer))
        lines.append(
            f"**{proposer}**: best measured k = {best.k}: {best.tokens_per_pass:.2f} tokens per target pass, "
            f"{best.passes_per_token:.2f} target passes per output token, **{_x(best.speedup)}** wall-clock "
            f"({_x(best.decode_speedup)} in decode steps alone). The model predicts its best k = {k_pred} "
            f"({_x(s_pred)}). Output token-identical to plain decoding at every k: {identical_text(same)}."
        )
    flags = [f for r in sweep.rows for f in speedup_flags(f"{r.proposer} at k = {r.k}", r.speedup,
                                                           r.tokens_per_pass)]
    lines.append(caution(flags))
    if sweep.prompts_note:
        lines.insert(0, sweep.prompts_note)
    return "\n\n".join(line for line in lines if line)


def explained_detail(sweep: SweepResult) -> AcceptanceDetail:
    """The run that best shows why accepted/proposed is not alpha: the biggest gap between them
    (ties: the largest k), among runs with at least one tested draft."""
    tested = [d for d in sweep.details if d.alpha_mle is not None and d.acceptance_rate is not None]
    return max(tested or sweep.details,
               key=lambda d: (round(abs((d.alpha_mle or 0) - (d.acceptance_rate or 0)), 3), d.k))


def alpha_text(sweep: SweepResult) -> str:
    """Why the engine's acceptance rate is not the i.i.d. alpha, with this run's numbers."""
    d = explained_detail(sweep)
    if d.alpha_mle is None or d.acceptance_rate is None:
        return f"{d.proposer} at k = {d.k} tested no draft in this run: nothing to back alpha out of."
    gap = d.alpha_mle - d.acceptance_rate
    positions = [p for p in d.position_acceptance if p is not None]
    rising = len(positions) > 1 and positions[-1] > positions[0] + 0.05
    parts = [
        f"Take **{d.proposer} at k = {d.k}** ({d.passes} verification passes). The engine counts "
        f"accepted / proposed = {_pct(d.acceptance_rate)}; kept over *tested* drafts, the maximum-likelihood "
        f"alpha of a geometric truncated at the first rejection, is {_pct(d.alpha_mle)} "
        f"({100 * gap:+.0f} points). Why they differ:",
        f"1. **Truncation at the first rejection.** Drafts after it count as proposed but are never tested. "
        f"Even i.i.d. drafts kept with probability α = {_pct(d.alpha_mle)} would show accepted / proposed = "
        f"(α + α² + … + α^k) / k = {_pct(d.iid_acceptance_rate)} at k = {d.k}.",
        f"2. **Short or empty proposals.** {_pct(d.empty_fraction)} of passes had no draft (no n-gram match, or no "
        f"room left) and {_pct(d.short_fraction)} fewer than k: {d.mean_drafts:.2f} drafts per pass on average, "
        f"not {d.k}. The formula assumes k every time, so E(α, k) overestimates a proposer that runs dry.",
        "3. **Correlated acceptance.** The acceptance of draft i, given drafts 1..i-1 were kept, is "
        + ", ".join(_pct(p) for p in d.position_acceptance) + f" for i = 1..{d.k}: "
        + ("it *rises* along the pass. Inside a copy span the next guess is right more often, so accepted lengths "
           "bunch at 0 and at k instead of falling geometrically (the histogram)." if rising else
           "for i.i.d. drafts all would be equal; in copy spans they rise, so accepted lengths bunch at 0 and at k "
           "instead of falling geometrically (compare the histogram with the geometric)."),
        "**Backing alpha out.** Each pass that kept a of m drafts tested a right drafts and, if a < m, one wrong "
        "one; the likelihood α^A (1 − α)^R peaks at **α = A / (A + R)**, kept over tested (column 'α backed out'). "
        "The other estimate inverts the formula: the α whose E(α, k) equals the measured tokens per pass "
        "(column 'α from tokens/pass', by bisection); it absorbs the empty proposals, so it is lower.",
    ]
    return "\n\n".join(parts)


def cost_text(sweep: SweepResult) -> str:
    v = sweep.verify
    k_max = max(r.k for r in sweep.rows)
    lines = [
        f"A plain decode step takes {v.decode_s * 1e3:.1f} ms here. A verification pass over q tokens takes "
        f"t(q) = {v.t0_s * 1e3:.1f} ms + q × {v.t1_s * 1e3:.2f} ms (least squares over {v.samples} verification "
        f"passes with q in {{{', '.join(map(str, v.q_values))}}}): checking 1 guess costs v = {v.ratio(2):.2f} "
        f"plain steps and checking {k_max} costs v = {v.ratio(k_max + 1):.2f}, where the textbook formula assumes "
        "1 (the column 'predicted E/(kc+v)'). Two reasons: a CPU runs matmuls near its FLOP ceiling already at a "
        "few tokens (a GPU at batch 1 does not, so there v stays close to 1), and this engine verifies through "
        "its chunked-prefill attention path, not the batched one-token decode path.",
    ]
    fit_flags = line_fit_flags("verification time t(q)", v.t0_s, v.t1_s, sweep.verify_r2)
    if fit_flags:
        lines[0] = caution(fit_flags) + " What the line says, for the record: " + lines[0]
    for proposer in sweep.proposers():
        line = sweep.of(proposer)
        c = sum(r.cost_ratio for r in line) / len(line)
        extra = ""
        if proposer.startswith("self:"):
            layers = int(proposer.split(":")[1])
            extra = (f" Its layers alone are {layers} / {sweep.target_layers} = {layers / sweep.target_layers:.2f} "
                     "of the target; the rest is the full LM head and the fixed cost of every forward pass, "
                     "which a draft pays k times per target pass.")
        lines.append(f"Draft cost **c = {c:.3f}** for {proposer} (proposer seconds per pass / (k × a plain "
                     f"decode step)).{extra} Alpha for its prediction: {_pct(line[0].alpha)} "
                     f"({line[0].alpha_source}).")
    return "\n\n".join(lines)


SWEEP_COLUMNS = [
    Column("proposer", "proposer", "text"), Column("k", "k", "int"),
    Column("acceptance_rate", "acceptance (accepted/proposed)", "pct"),
    Column("alpha_mle", "α backed out (MLE)", "pct"), Column("alpha_tpp", "α from tokens/pass", "pct"),
    Column("accepted_per_pass", "accepted per pass"), Column("tokens_per_pass", "tokens per target pass"),
    Column("predicted_tokens_per_pass", "predicted tokens per pass"),
    Column("passes_per_token", "target passes per output token"),
    Column("tokens_per_s", "tokens/s"), Column("speedup", "speedup (wall)", "ratio"),
    Column("decode_speedup", "speedup (decode)", "ratio"),
    Column("predicted_speedup", "predicted E/(kc+1)", "ratio"),
    Column("predicted_speedup_verify", "predicted E/(kc+v)", "ratio"),
    Column("measured_over_predicted", "measured / predicted", "ratio"),
    Column("measured_over_predicted_verify", "measured / predicted (v)", "ratio"),
    Column("cost_ratio", "c (draft/target)", digits=2), Column("verify_ratio", "v = t(k+1)/t(1)", digits=3),
    Column("identical", "token-identical", "bool"),
]

DETAIL_COLUMNS = [
    Column("proposer", "proposer", "text"), Column("k", "k", "int"), Column("passes", "passes", "int"),
    Column("empty_fraction", "passes without a draft", "pct"),
    Column("short_fraction", "passes with < k drafts", "pct"), Column("mean_drafts", "drafts per pass"),
    Column("acceptance_rate", "accepted/proposed", "pct"), Column("alpha_mle", "α (MLE)", "pct"),
    Column("iid_acceptance_rate", "accepted/proposed if i.i.d. at α", "pct"),
]

# The columns each section's finding reads: the page shows these; every column is behind a closed accordion.
SWEEP_LESSON = ("proposer", "k", "tokens per target pass", "predicted tokens per pass", "speedup (wall)",
                "predicted E/(kc+v)", "token-identical")


def _row_dict(r: SpecRow) -> dict[str, Any]:
    d = dict(r.__dict__)
    d.update(measured_over_predicted=r.measured_over_predicted,
             measured_over_predicted_verify=r.measured_over_predicted_verify)
    return d


def sweep_table(sweep: SweepResult):
    return people_table([_row_dict(r) for r in sweep.rows], SWEEP_COLUMNS)


def detail_table(sweep: SweepResult):
    return people_table(sweep.details, DETAIL_COLUMNS)




def sweep_figure(sweep: SweepResult, source: str, rows: str = "both"):
    """Tokens per pass and speedup vs k (measured dots, predicted lines: ``rows="speed"``), and the
    acceptance shape (``rows="acceptance"``); ``"both"`` stacks them."""
    if rows not in ("both", "speed", "acceptance"):
        raise ValueError(f"rows must be 'both', 'speed' or 'acceptance', got {rows!r}")
    if rows == "both":
        fig, axes = subplots(2, 2, figsize=(11, 7.5))
    else:
        fig, row = subplots(1, 2, figsize=(11, 3.9))
        axes = {(0 if rows == "speed" else 1, i): ax for i, ax in enumerate(row)}
    if rows in ("both", "speed"):
        _speed_panels(axes, sweep)
    if rows in ("both", "acceptance"):
        _acceptance_panels(axes, sweep)
    fig.suptitle(f"Speculative decoding, grounded prompts, batch 1 ({sweep.threads} threads): {source}", fontsize=10)
    finish(fig)
    return fig


def _speed_panels(axes: Any, sweep: SweepResult) -> None:
    ks = list(K_RANGE)
    for color, proposer in zip(COLORS, sweep.proposers(), strict=False):
        line = sweep.of(proposer)
        alpha = line[0].alpha
        c = sum(r.cost_ratio for r in line) / len(line)
        axes[0, 0].plot([r.k for r in line], [r.tokens_per_pass for r in line], "o", color=color,
                        label=f"{proposer} measured")
        axes[0, 0].plot(ks, [expected_tokens_per_pass(alpha, k) for k in ks], "-", color=color, alpha=0.6,
                        label=f"{proposer} predicted, α = {alpha:.2f}")
        axes[0, 1].plot([r.k for r in line], [r.speedup for r in line], "o", color=color,
                        label=f"{proposer} measured (wall)")
        axes[0, 1].plot(ks, [predicted_speedup(alpha, k, c) for k in ks], "--", color=color, alpha=0.6,
                        label=f"{proposer} E/(kc+1), c = {c:.2f}")
        axes[0, 1].plot(ks, [predicted_speedup_with_verify(alpha, k, c, sweep.verify.ratio(k + 1)) for k in ks],
                        "-", color=color, alpha=0.6, label=f"{proposer} E/(kc+v), v measured")
    axes[0, 0].set(xlabel="k (guesses per pass)", ylabel="tokens per target pass", ylim=(0, None),
                   title="tokens per target pass")
    axes[0, 1].axhline(1, color="k", lw=0.8)
    axes[0, 1].set(xlabel="k (guesses per pass)", ylabel="speedup over plain decoding (×)", ylim=(0, None),
                   title="wall-clock speedup, measured vs predicted")
    for ax in (axes[0, 0], axes[0, 1]):
        ax.legend(fontsize=7)


def _acceptance_panels(axes: Any, sweep: SweepResult) -> None:
    detail = explained_detail(sweep)
    full = sum(detail.length_counts)
    if full and detail.alpha_mle is not None:
        js = list(range(detail.k + 1))
        axes[1, 0].bar(js, [n / full for n in detail.length_counts], color="tab:blue", alpha=0.7,
                       label=f"measured ({full} passes with k drafts)")
        axes[1, 0].plot(js, accepted_length_pmf(detail.alpha_mle, detail.k), "ko-",
                        label=f"i.i.d. at α = {detail.alpha_mle:.2f} (truncated geometric)")
        axes[1, 0].legend(fontsize=7)
    axes[1, 0].set(xlabel="drafts kept in a pass", ylabel="fraction of passes", ylim=(0, 1),
                   title=f"{detail.proposer}, k = {detail.k}: accepted length per pass")
    positions = [i + 1 for i, p in enumerate(detail.position_acceptance) if p is not None]
    axes[1, 1].plot(positions, [p for p in detail.position_acceptance if p is not None], "o-",
                    label="measured: P(draft i kept | drafts before it kept)")
    if detail.alpha_mle is not None:
        axes[1, 1].axhline(detail.alpha_mle, color="k", ls="--", lw=1, label="i.i.d. model: the same α everywhere")
    axes[1, 1].set(xlabel="draft position i", ylabel="acceptance", ylim=(0, 1.05),
                   title="correlated acceptance in copy spans")
    axes[1, 1].legend(fontsize=7)
