"""The opener (0:00-0:10), "Why inference cost matters": cited token volumes and what they cost.

Training is paid once; inference is paid for every token of every user, every month. The
opener puts numbers on that, all computed here:

* the monthly token volumes Google reported (cited, with their source, in
  ``data/token_volumes.json``) and their growth: the factor between two reports and the
  monthly growth rate it implies;
* what a month of that volume would cost and how many GPUs it would keep busy, if every token
  came from one catalogued model on the cheapest catalogued GPU that meets an ITL SLO
  (:func:`infer_lab.analysis.capacity.compare_gpus`: roofline bounds at the catalog's $/hour,
  so a real engine costs more);
* why the cost per token falls as volume rises: one decode step reads the weights once for the
  whole batch, so more concurrent users share that read (:func:`infer_lab.analysis.capacity.plan`);
* training against inference: the tokens of inference whose compute equals one training run
  (6 x N x D against 2 x N per token), and how long the reported volume takes to reach them.

Nothing here needs a GPU or a model: it is arithmetic on cited figures and the catalog.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import date
from typing import Any

from ..analysis.capacity import cheapest, compare_gpus, plan
from ..analysis.params import param_counts
from ..catalog import gpu_catalog_about
from ..figures import finish, subplots
from ..package_files import data_path
from ..units import human
from .tables import Column, people_table

TITLE = "Why inference cost matters"
SECONDS_PER_MONTH = 365.25 / 12 * 86400  # an average month, 30.44 days
COST_MODELS = ("mistral-7b", "llama-3-70b")
BATCH_MODEL, BATCH_GPU = "mistral-7b", "H100-SXM"
CONTEXT, ITL_SLO_MS = 4096, 50.0
# An assumption, not a reported figure: Google does not split its volume into prompt and output
# tokens. Chat and agent traffic is mostly prompt (history, documents, tool results); 10:1 is the
# course's middle case between the two bounds that cost_text prints.
ASSUMED_INPUT_PER_OUTPUT = 10.0


@dataclass(frozen=True)
class TokenVolume:
    """One reported monthly volume and who reported it, where and when (cited, not measured)."""

    value: float  # tokens per month
    unit: str
    qualifier: str  # "about" or "over" (a lower bound)
    as_of: str  # YYYY-MM, the month the volume refers to
    reported: str  # YYYY-MM-DD, when it was said
    who: str
    where: str
    url: str
    also: tuple[str, ...] = ()

    @property
    def as_of_year(self) -> float:
        """The month as a decimal year (2025-05 -> 2025.33), for plotting."""
        year, month = (int(x) for x in self.as_of.split("-"))
        return year + (month - 1) / 12

    @property
    def tokens_per_s(self) -> float:
        """The monthly volume as an average rate over a 30.44-day month."""
        return self.value / SECONDS_PER_MONTH

    def label(self) -> str:
        """'over 3.2 quadrillion tokens/month (2026-05)'."""
        return f"{self.qualifier} {tokens_in_words(self.value)} tokens/month ({self.as_of})"


@dataclass(frozen=True)
class Growth:
    """The growth between two reported volumes."""

    earlier: TokenVolume
    later: TokenVolume

    @property
    def months(self) -> int:
        (y0, m0), (y1, m1) = (tuple(int(x) for x in v.as_of.split("-")) for v in (self.earlier, self.later))
        return (y1 - y0) * 12 + (m1 - m0)

    @property
    def factor(self) -> float:
        return self.later.value / self.earlier.value

    @property
    def monthly_growth(self) -> float:
        """The constant month-on-month growth that compounds to ``factor`` (0.17 = +17 % a month)."""
        return self.factor ** (1 / self.months) - 1

    @property
    def doubling_months(self) -> float:
        return math.log(2) / math.log(1 + self.monthly_growth)


@dataclass(frozen=True)
class ServingCost:
    """The cheapest catalogued configuration that serves one model within the ITL SLO, and a month of volume on it."""

    model: str
    gpu: str
    n_gpus: int
    parallelism: str
    context: int
    itl_slo_ms: float
    users: int
    itl_ms: float
    tokens_per_s: float  # output tokens/s of one configuration
    usd_per_hour: float
    usd_per_m_tokens: float  # per million output (decode) tokens
    volume: float  # tokens/month priced
    price_date: str
    usd_per_m_input_tokens: float = 0.0  # per million prompt (prefill) tokens, same configuration

    @property
    def usd_per_month(self) -> float:
        """Upper bound: every token of the volume priced as an output token."""
        return self.volume / 1e6 * self.usd_per_m_tokens

    @property
    def usd_per_month_all_input(self) -> float:
        """Lower bound: every token priced as a prompt token (prefill shares the weight reads widely)."""
        return self.volume / 1e6 * self.usd_per_m_input_tokens

    def usd_per_month_mix(self, input_per_output: float = ASSUMED_INPUT_PER_OUTPUT) -> float:
        """The volume split ``input_per_output`` : 1 into prompt and output tokens, each at its own price."""
        out = self.volume / (1 + input_per_output)
        return (out * self.usd_per_m_tokens + (self.volume - out) * self.usd_per_m_input_tokens) / 1e6

    @property
    def gpus_busy(self) -> float:
        """GPUs kept busy around the clock by the volume (its average rate over the configuration's)."""
        return self.volume / SECONDS_PER_MONTH / self.tokens_per_s * self.n_gpus


@dataclass(frozen=True)
class BatchCost:
    """One batch size (concurrent users) on one GPU: the step, the throughput and the cost per token."""

    users: int
    itl_ms: float
    tokens_per_s: float
    usd_per_m_tokens: float


@dataclass(frozen=True)
class TrainingVsInference:
    """One training run against the inference that does as much compute."""

    model: str
    params: int  # active parameters
    training_tokens: float
    qualifier: str
    source: str
    url: str
    volume: float  # tokens/month

    @property
    def training_flops(self) -> float:
        return 6.0 * self.params * self.training_tokens

    @property
    def inference_flops_per_token(self) -> float:
        return 2.0 * self.params

    @property
    def tokens_to_match(self) -> float:
        """Inference tokens whose compute equals the training run: 3 x the training tokens."""
        return self.training_flops / self.inference_flops_per_token

    @property
    def hours_at_volume(self) -> float:
        return self.tokens_to_match / self.volume * SECONDS_PER_MONTH / 3600


@dataclass(frozen=True)
class OpenerResult:
    volumes: list[TokenVolume]
    growth: list[Growth]
    costs: list[ServingCost]
    batch_costs: list[BatchCost]
    batch_model: str
    batch_gpu: str
    training: TrainingVsInference
    context: int = CONTEXT  # tokens per user of the cost and batch rows

    @property
    def latest(self) -> TokenVolume:
        return self.volumes[-1]

    @property
    def overall(self) -> Growth:
        return Growth(self.volumes[0], self.volumes[-1])


# ---------------------------------------------------------------------------------------------
# The cited data


def _data() -> dict[str, Any]:
    return json.loads(data_path("token_volumes.json").read_text())


def token_volumes() -> list[TokenVolume]:
    """The reported volumes, oldest first, from ``data/token_volumes.json``."""
    rows = [TokenVolume(**{**v, "also": tuple(v.get("also", ()))}) for v in _data()["volumes"]]
    return sorted(rows, key=lambda v: v.as_of)


def spending_text() -> str:
    """The talk's compute-spending figures (cited from ``data/token_volumes.json``, not computed)."""
    rows = _data().get("spending", [])
    if not rows:
        return ""
    said = " and ".join(f"{r['qualifier']} {_usd(r['value_usd'])} {r['when']}" for r in rows)
    return (f"- Spending on AI compute: {said} ({rows[0]['who']}: {rows[0]['source']}). Cited, not computed; "
            "the token volume above is what it pays for.")


def tokens_in_words(n: float) -> str:
    """'3.2 quadrillion', '480 trillion', '9.7 trillion' (short scale)."""
    for scale, word in ((1e15, "quadrillion"), (1e12, "trillion"), (1e9, "billion"), (1e6, "million")):
        if n >= scale:
            return f"{human(n / scale)} {word}"
    return human(n)


def growth_steps(volumes: list[TokenVolume]) -> list[Growth]:
    """Growth between consecutive reports."""
    return [Growth(a, b) for a, b in zip(volumes, volumes[1:], strict=False)]


# ---------------------------------------------------------------------------------------------
# The arithmetic


def serving_cost(model: str, volume: float, context: int = CONTEXT, itl_slo_ms: float = ITL_SLO_MS) -> ServingCost:
    """The cheapest catalogued GPU configuration meeting the ITL SLO for ``model``, priced for ``volume``."""
    best = cheapest(compare_gpus(model, context=context, itl_slo_ms=itl_slo_ms))
    if best is None:
        raise ValueError(f"no catalogued GPU serves {model} at {context:,} tokens within {itl_slo_ms:g} ms")
    return ServingCost(best.model, best.gpu, best.n_gpus, best.parallelism, context, itl_slo_ms, best.users,
                       best.itl_ms, best.tokens_per_s, best.usd_per_hour, best.usd_per_m_output_tokens, volume,
                       gpu_catalog_about()["price_date"], best.usd_per_m_input_tokens or 0.0)


def cost_vs_batch(model: str = BATCH_MODEL, gpu: str = BATCH_GPU, context: int = CONTEXT) -> list[BatchCost]:
    """$ per million output tokens at 1, 2, 4, ... concurrent users, up to what memory holds."""
    most = plan(model, gpu, 1, context=context).max_users_memory
    users = sorted({*(2**i for i in range(12) if 2**i <= most), most})
    rows = []
    for u in users:
        p = plan(model, gpu, 1, context=context, users=u)
        rows.append(BatchCost(u, p.itl_ms, p.tokens_per_s, p.usd_per_m_output_tokens))
    return rows


def training_vs_inference(volume: float) -> TrainingVsInference:
    """The cited training run (``training_reference`` in the data file) against ``volume`` tokens/month."""
    ref = _data()["training_reference"]
    return TrainingVsInference(ref["model"], param_counts(ref["model"]).active, ref["training_tokens"],
                               ref["qualifier"], f"{ref['who']}, {ref['where']} ({ref['date']})", ref["url"], volume)


def compute(cost_models: tuple[str, ...] = COST_MODELS, context: int = CONTEXT,
            itl_slo_ms: float = ITL_SLO_MS) -> OpenerResult:
    """Every number of the opener (a fraction of a second, no hardware).

    ``cost_models``: the catalog models a month of the latest volume is priced on; ``context``:
    tokens per user (prompt and output); ``itl_slo_ms``: the most a user waits between two tokens, ms.
    """
    volumes = token_volumes()
    latest = volumes[-1].value
    return OpenerResult(volumes, growth_steps(volumes),
                        [serving_cost(m, latest, context, itl_slo_ms) for m in cost_models],
                        cost_vs_batch(context=context), BATCH_MODEL, BATCH_GPU, training_vs_inference(latest),
                        context)


# ---------------------------------------------------------------------------------------------
# Words, tables and figures


def approx(x: float, digits: int = 2) -> str:
    """A large count to ``digits`` significant figures: 136,656 -> '140,000'."""
    if x <= 0:
        return f"{x:,.0f}"
    return f"{round(x, digits - 1 - math.floor(math.log10(x))):,.0f}"


def _usd(x: float) -> str:
    for scale, word in ((1e12, " trillion"), (1e9, " billion"), (1e6, " million")):
        if x >= scale:
            return f"${human(x / scale)}{word}"
    return f"${human(x)}"


def volumes_text(result: OpenerResult) -> str:
    lines = [f"- **{v.label()}**: {v.who}, {v.where} (said {v.reported})." for v in result.volumes]
    lines += [f"- {g.earlier.as_of} → {g.later.as_of}: **{human(g.factor)}×** in {g.months} months, "
              f"{human(100 * g.monthly_growth, 3)}% a month compounded (doubling every {human(g.doubling_months, 2)} months)."
              for g in result.growth]
    o = result.overall
    lines.append(f"- Over {o.months} months: **{human(o.factor)}×**. The latest is "
                 f"{tokens_in_words(result.latest.tokens_per_s)} tokens every second, day and night.")
    spending = spending_text()
    return "\n".join(lines + ([spending] if spending else []))


def cost_text(result: OpenerResult) -> str:

    v = result.latest
    lines = [f"If all {tokens_in_words(v.value)} tokens of a month came from one model, on the cheapest "
             f"catalogued GPU that keeps the ITL under {result.costs[0].itl_slo_ms:g} ms at "
             f"{result.costs[0].context:,} tokens of context (roofline bounds, catalog prices of "
             f"{result.costs[0].price_date}: a real engine costs more):"]
    for c in result.costs:
        lines.append(f"- **{c.model}** on {c.n_gpus}× {c.gpu} ({c.parallelism}, {c.users:,} users, "
                     f"{c.tokens_per_s:,.0f} output tokens/s, ${c.usd_per_hour:.2f}/h): ${human(c.usd_per_m_tokens, 3)} per "
                     f"million output tokens and ${human(c.usd_per_m_input_tokens, 3)} per million prompt tokens. Every "
                     f"token priced as output: **{_usd(c.usd_per_month)} a month** and about "
                     f"**{approx(c.gpus_busy)} GPUs** busy around the clock (the upper bound); every token priced as "
                     f"prompt: {_usd(c.usd_per_month_all_input)} (the lower bound); at an assumed "
                     f"{ASSUMED_INPUT_PER_OUTPUT:.0f}:1 prompt to output: {_usd(c.usd_per_month_mix())}.")
    lines.append("- The volume is not split into prompt and output tokens by who reported it, and most of it is "
                 "prompt (history, documents, tool results), which the planner prices far below output: the "
                 f"{ASSUMED_INPUT_PER_OUTPUT:.0f}:1 is the course's assumption, the two bounds are what is certain.")
    t = result.training
    lines.append(f"- Training is paid once: {t.model} was trained on {t.qualifier} {tokens_in_words(t.training_tokens)} "
                 f"tokens, about {human(t.training_flops, 2)} FLOP (6 × parameters × tokens). Inference at 2 × parameters "
                 f"per token (prompt or output alike) matches it after {tokens_in_words(t.tokens_to_match)} tokens: "
                 f"**{human(t.hours_at_volume, 2)} hours** of the reported monthly volume, if that volume all went through one "
                 f"{t.model}-sized model. It does not: it spans many models of many sizes, so read this as a scale, "
                 "not a like-for-like comparison. Then the meter keeps running.")
    return "\n".join(lines)


def batch_text(result: OpenerResult) -> str:
    first, last = result.batch_costs[0], result.batch_costs[-1]
    return (f"Why the cost per token falls as volume rises: {result.batch_model} on one {result.batch_gpu} costs "
            f"${human(first.usd_per_m_tokens, 3)} per million tokens with {first.users} user and "
            f"${human(last.usd_per_m_tokens, 3)} with {last.users:,} (what its memory holds at {result.context:,} tokens): "
            f"**{first.usd_per_m_tokens / last.usd_per_m_tokens:,.0f}× cheaper**, because one decode step reads "
            f"the weights once for the whole batch. Its ITL goes from {human(first.itl_ms, 3)} to {human(last.itl_ms, 3)} ms: "
            "that is the latency the volume buys its cost with.")


def summary(result: OpenerResult) -> str:
    return "\n\n".join([volumes_text(result), cost_text(result), batch_text(result)])


VOLUME_COLUMNS = [
    Column("as_of", "month", "text"), Column("value", "trillion tokens per month", scale=1e-12),
    Column("qualifier", "as said", "text"),
    Column("reported", "reported on", "text"), Column("where", "where", "text"),
]
COST_COLUMNS = [
    Column("model", "model", "text"), Column("gpu", "GPU", "text"), Column("n_gpus", "GPUs", "int"),
    Column("users", "users", "int"), Column("itl_ms", "ITL (ms)"), Column("tokens_per_s", "output tokens/s"),
    Column("usd_per_m_tokens", "$ per M tokens"),
    Column("usd_per_month", "$ million per month at the latest volume", scale=1e-6),
    Column("gpus_busy", "GPUs busy"),
]
BATCH_COLUMNS = [
    Column("users", "concurrent users", "int"), Column("itl_ms", "ITL (ms)"),
    Column("tokens_per_s", "output tokens/s"), Column("usd_per_m_tokens", "$ per M output tokens"),
]


def tables(result: OpenerResult) -> dict[str, Any]:
    return {
        "Monthly token volumes Google reported (cited)": people_table(result.volumes, VOLUME_COLUMNS),
        f"A month of {tokens_in_words(result.latest.value)} tokens on the cheapest configuration (analytic)":
            people_table([{**c.__dict__, "usd_per_month": c.usd_per_month, "gpus_busy": c.gpus_busy}
                          for c in result.costs], COST_COLUMNS),
        f"{result.batch_model} on one {result.batch_gpu}: cost per token against users (analytic)":
            people_table(result.batch_costs, BATCH_COLUMNS),
    }


def volumes_figure(result: OpenerResult):
    """The reported volumes on a log axis against the month they refer to."""
    fig, ax = subplots(figsize=(7, 3.8))
    xs, ys = [v.as_of_year for v in result.volumes], [v.value for v in result.volumes]
    ax.semilogy(xs, ys, "o-", color="tab:red")
    for v in result.volumes:
        ax.annotate(f"{v.qualifier} {tokens_in_words(v.value)}\n(said {v.reported})", (v.as_of_year, v.value),
                    xytext=(6, -18), textcoords="offset points", fontsize=8)
    ax.set_xlim(min(xs) - 0.25, max(xs) + 0.6)
    ax.set_ylim(min(ys) / 3, max(ys) * 5)
    ax.set(xlabel="month the volume refers to", ylabel="tokens per month, log scale")
    ax.set_title("Tokens per month across Google's products and APIs\n"
                 "cited: Sundar Pichai's Google I/O 2025 and 2026 keynotes (data/token_volumes.json)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    finish(fig)
    return fig


def batch_figure(result: OpenerResult):
    """$ per million output tokens against concurrent users on one GPU, log-log, with the ITL."""
    fig, ax = subplots(figsize=(7, 3.8))
    users = [b.users for b in result.batch_costs]
    ax.loglog(users, [b.usd_per_m_tokens for b in result.batch_costs], "o-", label="$ per M output tokens")
    ax.set(xlabel="concurrent users (decode batch), log scale", ylabel="$ per million output tokens, log scale")
    twin = ax.twinx()
    twin.semilogx(users, [b.itl_ms for b in result.batch_costs], "s--", color="tab:gray", label="ITL (ms)")
    twin.set_ylabel("ITL (ms)")
    twin.set_ylim(0, max(b.itl_ms for b in result.batch_costs) * 1.2)
    ax.set_title(f"{result.batch_model} on one {result.batch_gpu} at {result.context:,} tokens: the cost per token falls with "
                 "the batch\nanalytic: roofline bound at the catalog's $/hour, no hardware", fontsize=9)
    lines = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(lines, [h.get_label() for h in lines], fontsize=8, loc="upper center")
    ax.grid(alpha=0.3, which="both")
    finish(fig)
    return fig


def figures(result: OpenerResult) -> dict[str, Any]:
    return {"token_volumes": volumes_figure(result), "cost_vs_batch": batch_figure(result)}


def notes(result: OpenerResult) -> str:
    """Speaker notes for the opener: what to say, with its numbers."""

    c = result.costs[-1]
    return (
        "Open with the bill, not the model. Training is a one-off capital cost; inference is an operating cost "
        "that grows with every user, every token and every session, for as long as the product lives. "
        f"Read the curve: {result.overall.factor:,.0f}× in {result.overall.months} months, "
        f"{human(100 * result.growth[-1].monthly_growth, 2)}% a month over the last year. "
        f"Then make it concrete: at the latest volume, a {c.model}-class model on the cheapest GPU the planner finds "
        f"would cost up to {_usd(c.usd_per_month)} a month if every token were an output token (the upper bound; "
        f"{_usd(c.usd_per_month_all_input)} if every token were a prompt token), at roofline speed, which no real "
        "engine reaches. Most of the volume is prompt tokens: say the bounds, not one figure. The last slide is the lever the rest of the workshop pulls: batching "
        "shares the weight reads, so cost per token falls as volume rises, and latency is what pays for it. "
        "Sources are in src/infer_lab/data/token_volumes.json; say they are the speaker's figures, not ours."
    )


def today() -> str:
    return date.today().isoformat()
