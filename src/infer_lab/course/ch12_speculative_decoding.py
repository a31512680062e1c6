"""Chapter 12, "Speculative decoding": guess k tokens cheaply, verify them in one target pass.

0. **One request, counted.** The notebook's ``count_passes`` decodes one copy-task prompt plain
   and with n-gram guesses: output tokens, target passes, drafts kept, from the engine's own
   counters, with the engine's real acceptance rule on the page (:func:`acceptance_code`).
1. **Proposers and k.** n-gram prompt lookup and self-speculation (the target's first L
   layers) at k = 1..8 on input-grounded prompts: acceptance, tokens per target pass, target
   passes per output token, the wall-clock speedup over plain decoding of the same engine, and
   the textbook prediction beside every k, with the costs it needs (c, and the price of a
   (k+1)-token verification) measured on this machine.
2. **Workloads.** The same proposer on grounded prompts (copy, edit, quote) and on open-ended
   chat: where speculation pays and where it costs.
3. **Batch size.** Speedup vs concurrent requests, and the roofline of chapter 04 that says where
   the gain vanishes: once a step is compute-bound, the guesses' FLOPs are no longer free.
4. **EAGLE, Medusa, MTP.** What each drafts from and adds to a model, computed from catalog
   configs, next to the speedups their papers report (cited, not measured here).

Every run is greedy and checked token for token against plain decoding. Timings come from the
engine's own step log and wall clock, plain and speculative interleaved after a warm-up
(:mod:`infer_lab.bench.speculative`).

Each experiment is an ``@app.function`` of ``infer_lab/notebooks/12_speculative_decoding.py`` (``count_passes``,
``proposers_by_k``, ``speedup_by_batch``, ``size_mechanisms``); the ``run_*`` functions here execute
those same functions (:func:`~infer_lab.course.notebook_code.notebook_function`), and the rest of
this module shapes what they return for people.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis.plausibility import caution, line_fit_flags, r_squared, speedup_flags
from ..analysis.speculation import (
    CitedResult,
    DraftMechanism,
    VerifyCost,
    acceptance_by_position,
    accepted_length_pmf,
    alpha_mle,
    cited,
    cited_results,
    draft_mechanisms,
    expected_acceptance_rate,
    predicted_speedup_with_verify,
    roofline_verify_ratio,
)
from ..bench.speculative import (
    PLAIN,
    Comparison,
    SpecRow,
    load_prompts,
    prompt_ids,
    rows,
    verify_cost,
)
from ..engine.acceptance import (
    expected_tokens_per_pass,
    predicted_speedup,
    verify_greedy,
    verify_sampling,
)
from ..figures import finish
from ..units import count
from .chapter import NO_MODEL, ChapterResult, choose_size, run_parts
from .library_code import code_block
from .notebook_code import notebook_function
from .saved import SavedView, load_saved
from .tables import Column, people_table

NUMBER = "12"
SLUG = "speculative_decoding"
TITLE = "12 · Speculative decoding: guess k tokens, verify them in one pass"
NEEDS_MODEL = True
PARTS = {
    "passes": "Count the target passes of one request",
    "sweep": "Sweep proposers and k",
    "workloads": "Grounded prompts vs open-ended chat",
    "batch": "Speedup vs batch size",
    "variants": "Size EAGLE, Medusa and MTP",
}
# Parts that need no model and measure nothing here (computed or simulated): the saved-only deck keeps them.
ANALYTIC_PARTS = ("variants",)
K_RANGE = tuple(range(1, 9))


@dataclass(frozen=True)
class Sizes:
    """What each part runs: proposers and k, prompts per workload, new tokens, batches."""

    size: str
    sweep: tuple[tuple[str, tuple[int, ...]], ...]  # (proposer, k values) on grounded prompts
    sweep_prompts: int
    workload_configs: tuple[tuple[str, int], ...]
    workload_prompts: int  # per workload
    batches: tuple[int, ...]
    batch_config: tuple[str, int]
    batch_prompts: int
    max_new_tokens: int
    rounds: int
    variant_models: tuple[str, ...] = ("mistral-7b", "llama-3-8b", "deepseek-v3")
    passes_new_tokens: int = 32  # the one counted request of part "passes"

    def sweep_configs(self) -> list[tuple[str, int]]:
        return [(p, k) for p, ks in self.sweep for k in ks]


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick``: a few seconds to about 20 s per button on a 2-core CPU; ``full``: every k."""
    size = choose_size(device, size)
    on_gpu = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    if size == "quick" and not on_gpu:
        return Sizes(size, sweep=(("ngram", (1, 2, 4, 8)), ("self:24", (1,))), sweep_prompts=2,
                     workload_configs=(("ngram", 4),), workload_prompts=2, batches=(1, 4),
                     batch_config=("ngram", 4), batch_prompts=2, max_new_tokens=24, rounds=1)
    if size == "quick":
        return Sizes(size, sweep=(("ngram", (1, 2, 4, 8)), ("self:24", (1, 2, 4))), sweep_prompts=4,
                     workload_configs=(("ngram", 4), ("self:24", 2)), workload_prompts=4,
                     batches=(1, 4, 16), batch_config=("ngram", 4), batch_prompts=8, max_new_tokens=64,
                     rounds=1)
    self_layers = (16, 24, 28) if not on_gpu else (8, 16, 24, 28)
    return Sizes(size, sweep=(("ngram", K_RANGE),) + tuple((f"self:{L}", K_RANGE) for L in self_layers),
                 sweep_prompts=4 if not on_gpu else 8,
                 workload_configs=(("ngram", 2), ("ngram", 4), ("self:24", 2)), workload_prompts=8,
                 batches=(1, 2, 4, 8) if not on_gpu else (1, 2, 4, 8, 16, 32, 64),
                 batch_config=("ngram", 4), batch_prompts=8, max_new_tokens=64 if not on_gpu else 128,
                 rounds=2 if not on_gpu else 3)


# ---------------------------------------------------------------------------------------------
# Typed results


@dataclass(frozen=True)
class PassesResult:
    """One greedy request decoded plain and with ``proposer`` at ``k``: the engine's own counts.

    ``tokens`` are output tokens, ``passes`` target forward passes (prefill included),
    ``per_pass`` the tokens each speculative decode pass appended (kept drafts + 1).
    """

    proposer: str
    k: int
    plain_tokens: int
    plain_passes: int
    tokens: int
    passes: int
    proposed: int
    accepted: int
    per_pass: tuple[int, ...]
    identical: bool

    @property
    def decode_tokens_per_pass(self) -> float:
        """Tokens per target pass after the prefill pass (plain decoding: exactly 1)."""
        return (self.tokens - 1) / (self.passes - 1) if self.passes > 1 else 1.0

    @property
    def passes_saved(self) -> float:
        """Share of plain decoding's target passes that speculation did not need."""
        return 1 - self.passes / self.plain_passes


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


@dataclass(frozen=True)
class PromptPoint:
    """One prompt under one configuration (all rounds), against plain decoding."""

    workload: str
    prompt: str
    task: str
    proposer: str
    k: int
    output_tokens: int
    tokens_per_pass: float
    speedup: float


@dataclass(frozen=True)
class WorkloadResult:
    rows: list[SpecRow]  # one per (workload, configuration)
    points: list[PromptPoint]
    max_new_tokens: int
    hardware: str
    threads: int
    prompts_note: str = ""

    def row(self, workload: str, proposer: str, k: int) -> SpecRow:
        return next(r for r in self.rows if (r.workload, r.proposer, r.k) == (workload, proposer, k))


@dataclass(frozen=True)
class BatchPoint:
    """Speculative vs plain decoding of ``batch`` concurrent requests (continuous batching)."""

    batch: int
    proposer: str
    k: int
    plain_tokens_per_s: float
    tokens_per_s: float
    speedup: float
    decode_speedup: float
    tokens_per_pass: float
    step_ratio: float  # measured target time of a speculative decode step / a plain one
    roofline_step_ratio: float  # predicted t(batch x (k+1) tokens) / t(batch x 1)
    roofline_speedup: float  # tokens per pass / the roofline step ratio (draft cost ignored)
    identical: bool


@dataclass(frozen=True)
class RooflineCurve:
    """Predicted verification cost vs batch for one model on one roof (analytic)."""

    label: str
    batches: tuple[int, ...]
    step_ratio: tuple[float, ...]
    speedup: tuple[float, ...]  # at ``tokens_per_pass``
    tokens_per_pass: float
    ridge_point: float  # FLOP/B
    vanish_batch: int | None  # first batch where the predicted gain falls under VANISHED


@dataclass(frozen=True)
class BatchResult:
    points: list[BatchPoint]
    curves: list[RooflineCurve]
    roof: str
    bandwidth_Bps: float
    peak_flops: float
    context: int
    max_new_tokens: int
    hardware: str
    threads: int
    prompts_note: str = ""


@dataclass(frozen=True)
class VariantsResult:
    mechanisms: list[DraftMechanism]
    cited: list[CitedResult]
    mtp_alpha: tuple[float, float]
    mtp_cost_ratio: float
    mtp_predicted_speedup: tuple[float, float]
    mtp_params: int


@dataclass
class Result(ChapterResult):
    """Chapter 12's measurements; a part not run is ``None``."""

    model: str = ""
    passes: PassesResult | None = None
    sweep: SweepResult | None = None
    workloads: WorkloadResult | None = None
    batch: BatchResult | None = None
    variants: VariantsResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


# ---------------------------------------------------------------------------------------------
# Measurements


def _hardware(lm: Any) -> str:
    from ..hardware import device_label

    return device_label(lm.device)


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


def prompts_note(lm: Any) -> str:
    """How the prompts reach this model: through its chat template, or, without a tokenizer
    (random weights of another vocabulary, a GPU's default), one hashed id per word."""
    if lm.tokenizer is not None:
        return ""
    return (f"{lm.name} has random weights and no tokenizer, so each prompt's words are mapped to fixed token "
            "ids (one per word, by a hash): repeated words repeat ids, so n-gram lookup still finds copies, "
            "but a random model's guesses are not a trained model's. Load a pretrained model for real acceptance.")


def grounded_prompt_ids(lm: Any, n: int) -> list[list[int]]:
    """Token ids of the first ``n`` grounded prompts (copy, edit, quote)."""
    return prompt_ids(lm, load_prompts("grounded", n))


def passes_result(runs: dict[str, tuple[Any, list[Any]]], proposer: str, k: int) -> PassesResult:
    """What ``count_passes`` of the notebook returned ({name: (RequestOutput, step records)}), counted."""
    (plain, _), (spec, steps) = runs["plain"], runs[proposer]
    per_pass = tuple(s.accepted + 1 for s in steps if s.prefill_tokens == 0 and not s.failed)
    return PassesResult(proposer, k, len(plain.token_ids), plain.target_passes, len(spec.token_ids),
                        spec.target_passes, spec.proposed_tokens, spec.accepted_tokens, per_pass,
                        plain.token_ids == spec.token_ids)


def run_passes(lm: Any, sizes: Sizes, proposer: str = "ngram", k: int = 4) -> PassesResult:
    """Run the notebook's ``count_passes`` on the first grounded prompt (the copy task)."""
    count = notebook_function(NUMBER, "count_passes")
    runs = count(lm, grounded_prompt_ids(lm, 1)[0], sizes.passes_new_tokens, proposer, k)
    return passes_result(runs, proposer, k)


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


def workloads_result(runs: dict[str, tuple[list[Any], Comparison]], lm: Any, sizes: Sizes) -> WorkloadResult:
    """``proposers_by_k`` per workload ({workload: (prompts, comparison)}), with per-prompt speedups."""
    all_rows, points = [], []
    for workload, (chosen, comparison) in runs.items():
        configs = [key for key in comparison.runs if key[0] != PLAIN]
        all_rows += rows(comparison, workload)
        for g, prompt in enumerate(chosen[: comparison.groups]):
            plain = comparison.group_totals(PLAIN, 0, g)
            for proposer, k in configs:
                spec = comparison.group_totals(proposer, k, g)
                points.append(PromptPoint(workload, prompt.name, prompt.task, proposer, k, spec.output_tokens,
                                          spec.tokens_per_pass, spec.tokens_per_s / plain.tokens_per_s))
    max_new = next(iter(runs.values()))[1].max_new_tokens
    return WorkloadResult(all_rows, points, max_new, _hardware(lm), torch.get_num_threads(), prompts_note(lm))


def run_workloads(lm: Any, sizes: Sizes) -> WorkloadResult:
    """Run the notebook's ``proposers_by_k`` on grounded and on chat prompts."""
    experiment = notebook_function(NUMBER, "proposers_by_k")
    runs = {w: experiment(lm, w, sizes.workload_prompts, list(sizes.workload_configs), sizes.max_new_tokens,
                          sizes.rounds) for w in ("grounded", "chat")}
    return workloads_result(runs, lm, sizes)


def roofline_curve(label: str, model: Any, roof: Any, k: int, context: int, tokens_per_pass: float,
                   dtype: str, batches: tuple[int, ...]) -> RooflineCurve:
    """Predicted verification cost and speedup (draft cost ignored) for each batch size."""
    ratios = tuple(roofline_verify_ratio(model, roof, b, k, context, dtype) for b in batches)
    speedups = tuple(tokens_per_pass / r for r in ratios)
    vanish = next((b for b, s in zip(batches, speedups, strict=True) if s < VANISHED), None)
    return RooflineCurve(label, batches, ratios, speedups, tokens_per_pass, roof.ridge_point, vanish)


ANALYTIC_BATCHES = tuple(2**i for i in range(11))
VANISHED = 1.1  # a predicted speedup under this counts as "the gain has vanished"


def batch_result(ids: list[list[int]], runs: dict[int, Comparison], roof: Any, lm: Any, proposer: str, k: int,
                 sizes: Sizes) -> BatchResult:
    """What ``speedup_by_batch`` returned, next to the roofline's prediction of where the gain vanishes
    (on this machine's measured roof, and analytically for a 7B model on an H200)."""
    from ..analysis.compare import dtype_name, shape_of
    from ..analysis.roofline import gpu_roof

    shape, dtype = shape_of(lm), dtype_name(lm)
    max_new = next(iter(runs.values())).max_new_tokens
    context = round(sum(len(p) for p in ids) / len(ids) + max_new / 2)
    points = []
    for b, comparison in runs.items():
        plain, spec = comparison.plain, comparison.totals(proposer, k)
        step_ratio = ((spec.decode_s - spec.draft_s) / spec.decode_steps) / plain.step_s
        roof_ratio = roofline_verify_ratio(shape, roof, b, k, context, dtype)
        points.append(BatchPoint(b, proposer, k, plain.tokens_per_s, spec.tokens_per_s,
                                 spec.tokens_per_s / plain.tokens_per_s,
                                 spec.decode_tokens_per_s / plain.decode_tokens_per_s, spec.tokens_per_pass,
                                 step_ratio, roof_ratio, spec.tokens_per_pass / roof_ratio,
                                 comparison.identical[(proposer, k)]))
    tpp = points[0].tokens_per_pass
    h200 = gpu_roof("h200")
    curves = [
        roofline_curve(f"{lm.name} ({dtype}) on {roof.name}", shape, roof, k, context, tpp, dtype, ANALYTIC_BATCHES),
        roofline_curve(f"mistral-7b (bf16) on {h200.name} (datasheet)", "mistral-7b", h200, k, context, tpp,
                       "bf16", ANALYTIC_BATCHES),
    ]
    return BatchResult(points, curves, roof.name, roof.bandwidth_Bps, roof.peak_flops, context,
                       max_new, _hardware(lm), torch.get_num_threads(), prompts_note(lm))


def run_batch(lm: Any, sizes: Sizes) -> BatchResult:
    """Run the notebook's ``speedup_by_batch`` at the batch sizes of ``sizes``."""
    experiment = notebook_function(NUMBER, "speedup_by_batch")
    proposer, k = sizes.batch_config
    ids, runs, roof = experiment(lm, sizes.batch_prompts, proposer, k, sizes.batches, sizes.max_new_tokens,
                                 sizes.rounds)
    return batch_result(ids, runs, roof, lm, proposer, k, sizes)


def variants_result(mechanisms: list[DraftMechanism]) -> VariantsResult:
    """The mechanisms ``size_mechanisms`` computed, with the papers' figures read (cited) and
    DeepSeek-V3's MTP checked against its report."""
    acceptance = cited("deepseek_v3_acceptance")
    mtp = next(m for m in draft_mechanisms("deepseek-v3") if m.method.startswith("MTP"))
    alphas = (acceptance.low, acceptance.high)
    predicted = tuple(predicted_speedup(a, acceptance.k or 1, mtp.cost_ratio) for a in alphas)
    return VariantsResult(mechanisms, cited_results(), alphas, mtp.cost_ratio, predicted, mtp.extra_params)


def run_variants(sizes: Sizes) -> VariantsResult:
    """Run the notebook's ``size_mechanisms`` on the catalog models of ``sizes`` (analytic)."""
    return variants_result(notebook_function(NUMBER, "size_mechanisms")(sizes.variant_models))


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's measurements in a row (``parts`` picks some of :data:`PARTS`)."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {
        "passes": lambda: run_passes(lm, sizes),
        "sweep": lambda: run_sweep(lm, sizes),
        "workloads": lambda: run_workloads(lm, sizes),
        "batch": lambda: run_batch(lm, sizes),
        "variants": lambda: run_variants(sizes),
    })


def acceptance_code(rule: str = "both") -> str:
    """The engine's acceptance rules, its real code (docstrings left out: the words on the page say
    the same), as a markdown code block: ``rule`` is "greedy", "sampling" or "both"."""
    rules = {"greedy": (verify_greedy,), "sampling": (verify_sampling,), "both": (verify_greedy, verify_sampling)}
    if rule not in rules:
        raise ValueError(f"rule must be one of {', '.join(rules)}, got {rule!r}")
    return code_block(*rules[rule])


# ---------------------------------------------------------------------------------------------
# Words


def _x(value: float) -> str:
    return f"{value:.2f}×"


def passes_text(p: PassesResult, guess: float | None = None) -> str:
    """The counted request in words; ``guess`` (the learner's tokens per pass) beside the measurement."""
    lines = [
        f"Plain decoding: **{p.plain_tokens} tokens in {p.plain_passes} target passes** (one per token, the "
        f"first being the prefill). With **{p.proposer} at k = {p.k}**: {p.tokens} tokens in **{p.passes} target "
        f"passes**, {100 * p.passes_saved:.0f}% of the passes saved. After the prefill pass each pass yielded "
        f"**{p.decode_tokens_per_pass:.2f} tokens** on average (at most k + 1 = {p.k + 1}); the proposer guessed "
        f"{p.proposed} tokens and the target kept {p.accepted}. Output token-identical to plain decoding: "
        f"**{'yes' if p.identical else 'NO'}**.",
    ]
    if guess is not None:
        lines.append(f"You guessed {guess:.1f} tokens per pass; measured {p.decode_tokens_per_pass:.2f}.")
    lines.append("A copy task is the best case: the text to produce is already in the prompt. Fewer passes is not "
                 "yet less time, because each pass verifies k + 1 tokens and the proposer runs too: section 2 times "
                 "it. Change `k` or `proposer` in the cell above and press the button again.")
    return "\n\n".join(lines)


def passes_table(p: PassesResult):
    rows_ = [{"decoding": "plain", "tokens": p.plain_tokens, "passes": p.plain_passes, "proposed": 0, "accepted": 0,
              "tokens_per_pass": 1.0},
             {"decoding": f"{p.proposer}, k = {p.k}", "tokens": p.tokens, "passes": p.passes, "proposed": p.proposed,
              "accepted": p.accepted, "tokens_per_pass": p.decode_tokens_per_pass}]
    return people_table(rows_, PASSES_COLUMNS)


def passes_figure(p: PassesResult, source: str):
    """Output tokens against target passes, plain and speculative (the engine's own step records)."""
    from ..figures import subplots

    fig, ax = subplots(figsize=(8, 3.4))
    ax.step(range(p.plain_passes + 1), range(p.plain_passes + 1), where="post", color="tab:gray",
            label="plain: 1 token per pass")
    made = [0, 1]  # the prefill pass makes the first token
    for n in p.per_pass:
        made.append(made[-1] + n)
    ax.step(range(len(made)), made, where="post", color="tab:blue", lw=2,
            label=f"{p.proposer}, k = {p.k}: kept drafts + 1 per pass")
    ax.set(xlabel="target forward passes", ylabel="output tokens", xlim=(0, None), ylim=(0, None),
           title=f"{p.tokens} tokens in {p.passes} passes instead of {p.plain_passes}")
    ax.legend(fontsize=8)
    fig.suptitle(f"One greedy request, copy task: {source}", fontsize=10)
    finish(fig)
    return fig


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
            f"({_x(s_pred)}). Output token-identical to plain decoding at every k: **{'yes' if same else 'NO'}**."
        )
    flags = [f for r in sweep.rows for f in speedup_flags(f"{r.proposer} at k = {r.k}", r.speedup,
                                                           r.tokens_per_pass)]
    lines.append(caution(flags))
    if sweep.prompts_note:
        lines.insert(0, sweep.prompts_note)
    return "\n\n".join(line for line in lines if line)


def implausible(result: Result) -> list[str]:
    """Every caution the chapter prints instead of a finding (fits and speedups that cannot be true)."""
    flags = []
    if result.sweep:
        v = result.sweep.verify
        flags += line_fit_flags("verification time t(q)", v.t0_s, v.t1_s, result.sweep.verify_r2)
        flags += [f for r in result.sweep.rows
                  for f in speedup_flags(f"{r.proposer} at k = {r.k}", r.speedup, r.tokens_per_pass)]
    if result.workloads:
        flags += [f for r in result.workloads.rows
                  for f in speedup_flags(f"{r.proposer} at k = {r.k} ({r.workload})", r.speedup, r.tokens_per_pass)]
    if result.batch:
        flags += [f for p in result.batch.points
                  for f in speedup_flags(f"batch {p.batch}", p.speedup, p.tokens_per_pass)]
    return flags


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


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


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


def workloads_text(result: WorkloadResult) -> str:
    lines = []
    for proposer, k in dict.fromkeys((r.proposer, r.k) for r in result.rows):
        g, c = result.row("grounded", proposer, k), result.row("chat", proposer, k)
        lines.append(
            f"**{proposer}, k = {k}**: grounded prompts {g.tokens_per_pass:.2f} tokens per pass, **{_x(g.speedup)}**; "
            f"open-ended chat {c.tokens_per_pass:.2f} tokens per pass, **{_x(c.speedup)}**"
            + (" — speculation *costs* time there: every failed guess still paid its verification." if c.speedup < 1
               else ".")
        )
    lines.append("Low-entropy, input-grounded text (copying, editing, quoting) is where guesses are right; "
                 f"on {result.hardware} with {count(result.threads, 'thread')}.")
    lines.append(caution([f for r in result.rows for f in speedup_flags(
        f"{r.proposer} at k = {r.k} ({r.workload})", r.speedup, r.tokens_per_pass)]))
    if result.prompts_note:
        lines.insert(0, result.prompts_note)
    return "\n\n".join(line for line in lines if line)


def frontier_shift_text(curve: RooflineCurve) -> str:
    """Speculation as a shift of the speed/throughput frontier (chapters 09 and 14), from one roofline curve."""
    pairs = list(zip(curve.batches, curve.speedup, strict=True))
    small = [(b, x) for b, x in pairs if x >= VANISHED]
    if not small:
        return (f"On {curve.label} the roofline gives no batch where speculation at {curve.tokens_per_pass:.2f} tokens "
                "per pass moves the speed/throughput frontier.")
    b0, s0 = small[0]
    last = small[-1][0]
    return (
        f"**A shift of the frontier, not a point on it.** Batching trades each user's speed for total throughput "
        f"along one curve (chapter 09). Speculation at {curve.tokens_per_pass:.2f} tokens per pass moves the curve: "
        f"on {curve.label} the roofline gives the same batch {s0:.2f}× the tokens per step at batch {b0}, so each "
        f"user is {s0:.2f}× faster *and* the GPU serves {s0:.2f}× the tokens, with no extra GPUs. The shift shrinks "
        f"as the batch grows and is under {VANISHED}× beyond batch {last}: speculation moves the fast, small-batch "
        "end of the frontier outward, where fast modes live (chapter 14)."
    )


def batch_text(result: BatchResult) -> str:
    return "\n\n".join(batch_paragraphs(result).values())


def batch_lead(result: BatchResult) -> str:
    """Section 4's measurement at a glance (with its caution, if any); the rest is :func:`batch_derivation`."""
    parts = batch_paragraphs(result)
    return "\n\n".join(parts[k] for k in ("note", "measured", "caution") if k in parts)


def batch_derivation(result: BatchResult) -> str:
    """The roofline's reasoning behind section 4, and speculation as a shift of the frontier."""
    parts = batch_paragraphs(result)
    return "\n\n".join(parts[k] for k in ("roof", "why", "shift") if k in parts)


def batch_paragraphs(result: BatchResult) -> dict[str, str]:
    """Section 4 in words, one paragraph each ('note', 'measured', 'roof', 'why', 'caution', 'shift';
    an empty one is left out)."""
    first, last = result.points[0], result.points[-1]
    here, gpu = result.curves
    lines = [
        f"Measured with {first.proposer}, k = {first.k}: **{_x(first.speedup)}** at batch {first.batch}, "
        f"**{_x(last.speedup)}** at batch {last.batch}. A speculative decode step cost {first.step_ratio:.2f}× a "
        f"plain one at batch {first.batch} and {last.step_ratio:.2f}× at batch {last.batch} "
        f"(roofline: {first.roofline_step_ratio:.2f}× and {last.roofline_step_ratio:.2f}×).",
        f"This machine's measured roof: {result.bandwidth_Bps / 1e9:.1f} GB/s, {result.peak_flops / 1e9:.0f} GFLOP/s, "
        f"ridge point {here.ridge_point:.1f} FLOP/B. "
        + f"At {here.tokens_per_pass:.2f} tokens per pass the roofline says the gain falls under {VANISHED}× at batch "
        + (f"**{here.vanish_batch}** here" if here.vanish_batch else f"beyond {here.batches[-1]} here")
        + "; for mistral-7b (bf16) on an H200 at batch "
        + (f"**{gpu.vanish_batch}**." if gpu.vanish_batch else f"beyond {gpu.batches[-1]}."),
        "While decode is memory-bound, verifying k + 1 tokens reads the same weights as decoding 1, so the "
        "guesses are free. Batching already fills the idle FLOPs; once batch × (k + 1) tokens pass the ridge "
        "point, each guess costs real compute and the gain vanishes. The roofline is the hardware's bound: at "
        "small batch it misses the engine's own cost of a verification pass (v in section 1), so it predicts "
        "more than is measured there; the trend with batch is what it gets right.",
        caution([f for p in result.points for f in speedup_flags(f"batch {p.batch}", p.speedup, p.tokens_per_pass)]),
        frontier_shift_text(gpu),
    ]
    keys = ("note", "measured", "roof", "why", "caution", "shift")
    return {key: line for key, line in zip(keys, [result.prompts_note or "", *lines], strict=True) if line}


def variants_text(result: VariantsResult) -> str:
    lo, hi = result.mtp_alpha
    plo, phi = result.mtp_predicted_speedup
    speed = cited("deepseek_v3_speedup")
    params = cited("deepseek_v3_mtp_params")
    return (
        f"A consistency check across the two halves: DeepSeek-V3 reports a second-token acceptance of "
        f"{_pct(lo)}–{_pct(hi)} for its one MTP module (cited). Its draft cost computed from the config is "
        f"c = {result.mtp_cost_ratio:.3f}, so the textbook formula predicts {plo:.2f}–{phi:.2f}× at k = 1; the "
        f"report says {speed.low:.1f}× (cited). The MTP module computed from the config has "
        f"{result.mtp_params / 1e9:.1f}B parameters; the model card says {params.low / 1e9:.1f}B (cited).\n\n"
        "**Measured here:** n-gram and self-speculative decoding on the embedded model, on this machine. "
        "**Computed here from catalog configs:** the extra parameters, KV bytes and draft cost of every "
        "mechanism. **Cited, not measured:** every EAGLE, Medusa, MTP and draft-model speedup and acceptance "
        "(paper, year and section in the table; nothing was trained)."
    )


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {count(result.threads, 'torch thread')}. Timings were taken on a machine that "
             "may be shared; read speedups as this run's, not as constants."]
    if result.passes:
        lines.append(passes_text(result.passes))
    if result.sweep:
        lines += [sweep_text(result.sweep), alpha_text(result.sweep), cost_text(result.sweep)]
    if result.workloads:
        lines.append(workloads_text(result.workloads))
    if result.batch:
        lines.append(batch_text(result.batch))
    if result.variants:
        lines.append(variants_text(result.variants))
    return "\n\n".join(lines)


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
    from ..figures import subplots

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


# ---------------------------------------------------------------------------------------------
# Tables

PASSES_COLUMNS = [
    Column("decoding", "decoding", "text"), Column("tokens", "output tokens", "int"),
    Column("passes", "target passes", "int"), Column("proposed", "drafts proposed", "int"),
    Column("accepted", "drafts kept", "int"), Column("tokens_per_pass", "tokens per pass after the prefill"),
]
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
WORKLOAD_COLUMNS = [
    Column("workload", "workload", "text"), Column("proposer", "proposer", "text"), Column("k", "k", "int"),
    Column("requests", "prompts", "int"), Column("acceptance_rate", "acceptance", "pct"),
    Column("tokens_per_pass", "tokens per target pass"), Column("plain_tokens_per_s", "plain tokens/s"),
    Column("tokens_per_s", "tokens/s"), Column("speedup", "speedup (wall)", "ratio"),
    Column("identical", "token-identical", "bool"),
]
POINT_COLUMNS = [
    Column("workload", "workload", "text"), Column("prompt", "prompt", "text"), Column("task", "task", "text"),
    Column("proposer", "proposer", "text"), Column("k", "k", "int"), Column("output_tokens", "tokens out", "int"),
    Column("tokens_per_pass", "tokens per pass"), Column("speedup", "speedup", "ratio"),
]
BATCH_COLUMNS = [
    Column("batch", "batch", "int"), Column("proposer", "proposer", "text"), Column("k", "k", "int"),
    Column("plain_tokens_per_s", "plain tokens/s"), Column("tokens_per_s", "speculative tokens/s"),
    Column("speedup", "speedup (wall)", "ratio"), Column("tokens_per_pass", "tokens per pass"),
    Column("step_ratio", "step cost vs plain (measured)", "ratio"),
    Column("roofline_step_ratio", "step cost vs plain (roofline)", "ratio"),
    Column("roofline_speedup", "speedup (roofline)", "ratio"), Column("identical", "token-identical", "bool"),
]
MECHANISM_COLUMNS = [
    Column("model", "target", "text"), Column("method", "mechanism", "text"),
    Column("drafts_from", "drafts from", "text"), Column("adds", "adds to the model", "text"),
    Column("extra_params", "extra parameters", "int"), Column("extra_fraction", "of the target", "pct"),
    Column("extra_weight_bytes", "extra weights (bf16)", "bytes"),
    Column("extra_kv_bytes_per_token", "extra KV per token (B, bf16)", "int"),
    Column("cost_ratio", "c (weights read per draft / per target step)", digits=2),
]
CITED_COLUMNS = [
    Column("label", "method", "text"), Column("paper", "paper", "text"), Column("year", "year", "text"),
    Column("where", "where", "text"), Column("target_model", "measured on", "text"),
    Column("setting", "setting", "text"), Column("metric", "metric", "text"),
    Column("low", "low"), Column("high", "high"), Column("url", "source", "text"),
]


# The columns each section's finding reads: the page shows these; every column is behind a closed accordion.
SWEEP_LESSON = ("proposer", "k", "tokens per target pass", "predicted tokens per pass", "speedup (wall)",
                "predicted E/(kc+v)", "token-identical")
WORKLOAD_LESSON = ("workload", "proposer", "k", "acceptance", "tokens per target pass", "speedup (wall)")
BATCH_LESSON = ("batch", "tokens per pass", "speedup (wall)", "step cost vs plain (measured)",
                "step cost vs plain (roofline)", "speedup (roofline)")
MECHANISM_LESSON = ("target", "mechanism", "extra parameters", "of the target", "extra KV per token (B, bf16)",
                    "c (weights read per draft / per target step)")


def lesson_columns(frame: Any, columns: tuple[str, ...]) -> Any:
    """The columns of a people table that carry a section's finding, in that order."""
    return frame[list(columns)]


def _row_dict(r: SpecRow) -> dict[str, Any]:
    d = dict(r.__dict__)
    d.update(measured_over_predicted=r.measured_over_predicted,
             measured_over_predicted_verify=r.measured_over_predicted_verify)
    return d


def sweep_table(sweep: SweepResult):
    return people_table([_row_dict(r) for r in sweep.rows], SWEEP_COLUMNS)


def detail_table(sweep: SweepResult):
    return people_table(sweep.details, DETAIL_COLUMNS)


def workloads_table(result: WorkloadResult):
    return people_table(result.rows, WORKLOAD_COLUMNS)


def points_table(result: WorkloadResult):
    return people_table(result.points, POINT_COLUMNS)


def batch_table(result: BatchResult):
    return people_table(result.points, BATCH_COLUMNS)


def mechanisms_table(result: VariantsResult):
    rows_ = [dict(m.__dict__, extra_fraction=m.extra_fraction, extra_weight_bytes=m.extra_weight_bytes,
                  cost_ratio=m.cost_ratio) for m in result.mechanisms]
    return people_table(rows_, MECHANISM_COLUMNS)


def cited_table(result: VariantsResult):
    return people_table(result.cited, CITED_COLUMNS)


def sweep_details(sweep: SweepResult, source: str, mechanisms: list[DraftMechanism]) -> dict[str, list[Any]]:
    """What section 2 keeps one click away (the page shows them in closed accordions): the
    acceptance derivation, the costs, every column, the proposers next to the papers'."""
    return {
        "Why the engine's acceptance rate is not α, and how to back α out": [
            sweep_figure(sweep, source, rows="acceptance"), alpha_text(sweep), detail_table(sweep)],
        "The costs the prediction needs, measured": [cost_text(sweep)],
        "Every column of the sweep": [sweep_table(sweep)],
        "The measured proposers on the same axes as the papers": [
            variants_figure(variants_result(mechanisms), sweep, source)],
    }


def workloads_details(result: WorkloadResult) -> dict[str, list[Any]]:
    """Section 3's rows prompt by prompt, and every column of its table."""
    return {"Prompt by prompt": [points_table(result)], "Every column": [workloads_table(result)]}


def batch_details(result: BatchResult) -> dict[str, list[Any]]:
    """Section 4's roofline reasoning, and every column of its table."""
    return {"The roofline's reasoning, and speculation as a shift of the frontier": [batch_derivation(result)],
            "Every column": [batch_table(result)]}


def variants_details(result: VariantsResult) -> dict[str, list[Any]]:
    """Section 5's tables: what each mechanism adds (the columns that carry it, then all), and
    what the papers report."""
    every = mechanisms_table(result)
    return {
        "What each mechanism adds to each target (computed from configs)": [
            lesson_columns(every, MECHANISM_LESSON)],
        "What each mechanism drafts from and adds, every column": [every],
        "What the papers report (cited, not measured here)": [cited_table(result)],
    }


def tables(result: Result) -> dict[str, Any]:
    out = {}
    if result.passes:
        out["One request, counted"] = passes_table(result.passes)
    if result.sweep:
        out["Proposers x k on grounded prompts: measured vs predicted"] = sweep_table(result.sweep)
        out["Why accepted/proposed is not alpha"] = detail_table(result.sweep)
    if result.workloads:
        out["Grounded vs open-ended chat"] = workloads_table(result.workloads)
        out["Per prompt"] = points_table(result.workloads)
    if result.batch:
        out["Speedup vs batch size"] = batch_table(result.batch)
    if result.variants:
        out["EAGLE, Medusa, MTP: computed from configs"] = mechanisms_table(result.variants)
        out["What the papers report (cited, not measured here)"] = cited_table(result.variants)
    return out


# ---------------------------------------------------------------------------------------------
# Figures

COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")


def sweep_figure(sweep: SweepResult, source: str, rows: str = "both"):
    """Tokens per pass and speedup vs k (measured dots, predicted lines: ``rows="speed"``), and the
    acceptance shape (``rows="acceptance"``); ``"both"`` stacks them."""
    from ..figures import subplots

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


def workloads_figure(result: WorkloadResult, source: str):
    """Per-prompt speedup and tokens per pass, grounded vs chat."""
    from ..figures import subplots

    configs = list(dict.fromkeys((p.proposer, p.k) for p in result.points))
    fig, axes = subplots(1, 2, figsize=(11, 0.9 + 0.32 * len(result.points)), sharey=True)
    labels = [f"{p.workload}: {p.prompt} ({p.proposer}, k={p.k})" for p in result.points]
    colors = ["tab:green" if p.workload == "grounded" else "tab:gray" for p in result.points]
    y = list(range(len(result.points)))
    axes[0].barh(y, [p.speedup for p in result.points], color=colors)
    axes[0].axvline(1, color="k", lw=1)
    axes[0].set(xlabel="speedup over plain decoding (×)", xlim=(0, None), title="wall-clock speedup per prompt")
    axes[1].barh(y, [p.tokens_per_pass for p in result.points], color=colors)
    axes[1].axvline(1, color="k", lw=1)
    axes[1].set(xlabel="tokens per target pass", xlim=(0, None), title="tokens per target pass")
    axes[0].set_yticks(y, labels, fontsize=7)
    axes[0].invert_yaxis()
    fig.suptitle(f"Grounded (green) vs open-ended chat (grey), {', '.join(f'{p} k={k}' for p, k in configs)}, "
                 f"batch 1 ({result.threads} threads): {source}", fontsize=10)
    finish(fig)
    return fig


def batch_figure(result: BatchResult, source: str):
    """Measured speedup vs batch with the roofline's, and the analytic verification cost to batch 1024."""
    from ..figures import subplots

    fig, axes = subplots(1, 2, figsize=(11, 4))
    b = [p.batch for p in result.points]
    axes[0].plot(b, [p.speedup for p in result.points], "o-", label="measured (wall)")
    axes[0].plot(b, [p.roofline_speedup for p in result.points], "s--", label="roofline: tokens/pass ÷ step cost")
    axes[0].axhline(1, color="k", lw=0.8)
    axes[0].set_xscale("log", base=2)
    axes[0].set(xlabel="concurrent requests (batch)", ylabel="speedup over plain decoding (×)", ylim=(0, None),
                title=f"{result.points[0].proposer}, k = {result.points[0].k}, this machine")
    axes[0].legend(fontsize=8)
    for color, curve in zip(COLORS, result.curves, strict=False):
        axes[1].plot(curve.batches, curve.speedup, "-", color=color, label=curve.label)
        if curve.vanish_batch:
            axes[1].axvline(curve.vanish_batch, color=color, ls=":", lw=1)
    axes[1].axhline(1, color="k", lw=0.8)
    axes[1].set_xscale("log", base=2)
    axes[1].set(xlabel="batch", ylabel="predicted speedup (×)", ylim=(0, None),
                title=f"analytic: {result.curves[0].tokens_per_pass:.2f} tokens per pass, draft cost ignored")
    axes[1].legend(fontsize=7)
    fig.suptitle(f"Where the gain vanishes ({result.threads} threads): {source}", fontsize=10)
    finish(fig)
    return fig


CITED_MODEL = {"Medusa": "mistral-7b", "EAGLE": "llama-3-70b", "MTP": "deepseek-v3"}


def _mechanism_cost(method: str) -> float:
    """c computed for the mechanism on the catalog model closest to the paper's (see CITED_MODEL)."""
    prefix = {"Medusa": "Medusa", "EAGLE": "EAGLE", "MTP": "MTP"}[method]
    return next(m.cost_ratio for m in draft_mechanisms(CITED_MODEL[method]) if m.method.startswith(prefix))


def variants_figure(result: VariantsResult, sweep: SweepResult | None = None, source: str = ""):
    """Speedup vs draft cost c: the papers (hollow, cited, at c computed from a catalog config) and
    our proposers (stars, measured); and the extra parameters each mechanism adds (computed)."""
    from ..figures import subplots

    fig, axes = subplots(1, 2, figsize=(12, 4.9))
    ax = axes[0]
    x_max = 0.62
    if sweep is not None:
        x_max = max([x_max] + [1.1 * sweep.best(p).cost_ratio for p in sweep.proposers()])
    cs = [x_max * i / 100 for i in range(0, 101)]
    for alpha in (0.6, 0.8, 0.9):
        ax.plot(cs, [predicted_speedup(alpha, 4, c) for c in cs], color="0.8", lw=1)
        c_label = 0.2 * x_max  # where the three curves are far apart, right of the cited points
        ax.annotate(f"α = {alpha}, k = 4", (c_label, predicted_speedup(alpha, 4, c_label)), xytext=(2, 2),
                    textcoords="offset points", fontsize=8, color="0.4")
    for i, method in enumerate(("Medusa", "EAGLE", "MTP")):
        c = _mechanism_cost(method)
        for j, r in enumerate(x for x in result.cited if x.method == method and x.metric == "speedup"):
            ax.errorbar([c * (1 + 0.06 * j)], [r.mid], yerr=[[r.mid - r.low], [r.high - r.mid]], fmt="o",
                        mfc="none", color=COLORS[i], capsize=3,
                        label=f"{r.label} {r.year}, cited (c for {CITED_MODEL[method]})")
    if sweep is not None:
        for color, proposer in zip(COLORS[3:], sweep.proposers(), strict=False):
            best = sweep.best(proposer)
            ax.plot([max(best.cost_ratio, 0.003)], [best.speedup], "*", ms=12, color=color,
                    label=f"{proposer} k={best.k}, measured here")
    ax.axhline(1, color="k", lw=0.8)
    ax.set(xlabel="draft cost c per drafted token (× one target step)", ylabel="speedup (×)", ylim=(0, None),
           xlim=(0, x_max), title="cited (hollow) and measured here (stars)")
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(0, -0.16), ncol=2)  # below the axes: covers nothing
    models = list(dict.fromkeys(m.model for m in result.mechanisms))
    methods = list(dict.fromkeys(x.method.split(" (")[0] for x in result.mechanisms))
    width = 0.8 / len(models)
    for i, model in enumerate(models):
        vals = [next((100 * m.extra_fraction for m in result.mechanisms
                      if m.model == model and m.method.split(" (")[0] == meth), 0.0) for meth in methods]
        xs = [j + i * width for j in range(len(methods))]
        axes[1].bar(xs, vals, width, label=model)
        for x, val in zip(xs, vals, strict=True):
            if val == 0:
                axes[1].annotate("0", (x, 0), ha="center", va="bottom", fontsize=8)
    axes[1].set_xticks([j + width * (len(models) - 1) / 2 for j in range(len(methods))], methods, fontsize=9)
    axes[1].set(ylabel="extra parameters (% of the target)", ylim=(0, None),
                title="what each mechanism adds (computed from configs)")
    axes[1].legend(fontsize=8)
    where = f"stars measured on {source}" if sweep is not None and source else "no measurement in this figure"
    fig.suptitle(f"EAGLE, Medusa, MTP: cited speedups, computed costs; {where}", fontsize=9)
    finish(fig)
    return fig


def figures(result: Result) -> dict[str, Any]:
    out = {}
    if result.passes:
        out["passes"] = passes_figure(result.passes, result.model)
    if result.sweep:
        out["sweep"] = sweep_figure(result.sweep, result.model)
    if result.workloads:
        out["workloads"] = workloads_figure(result.workloads, result.model)
    if result.batch:
        out["batch"] = batch_figure(result.batch, result.model)
    if result.variants:
        out["variants"] = variants_figure(result.variants, result.sweep, result.model if result.sweep else "")
    return out


# ---------------------------------------------------------------------------------------------
# Saved GPU results


def saved() -> SavedView | None:
    """``infer-lab bench spec --save src/infer_lab/results/<gpu>-bench-spec-*.json`` runs from a GPU, if any."""
    found = [s for s in load_saved("*bench-spec-*.json") if s.raw.get("environment", {}).get("device_kind") == "cuda"]
    if not found:
        return None
    src = found[0]
    table = people_table(src.data.get("rows", []), [c for c in SWEEP_COLUMNS if c.key in (
        "proposer", "k", "acceptance_rate", "tokens_per_pass", "tokens_per_s", "speedup", "predicted_speedup",
        "identical")])
    return SavedView(
        title=f"Speculative decoding on {src.device}: {src.raw.get('workload', '')} prompts, batch "
              f"{src.raw.get('batch', '')}",
        source=src, tables={"Measured on the GPU": table}, notes=[f"Measured by: {src.command}"],
    )
