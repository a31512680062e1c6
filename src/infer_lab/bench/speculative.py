"""Speculative decoding measured: the same engine and prompts, with and without a proposer.

Every comparison here is against the strongest fair baseline: plain decoding by the *same*
engine configuration (paged KV, continuous batching, same batch slots) on the *same* prompts,
greedy, so both produce the same tokens (checked, and reported as ``identical``). Timings are
honest in the usual ways: every engine warms up first; for each prompt (or each batch of
prompts) plain decoding runs before *and* after the speculative runs, so a change of machine
load in between hits both sides; totals are summed over every prompt and round.

What one run records (:class:`RunTotals`) is counted by the engine itself: target passes,
proposed and accepted guesses (``RequestOutput``), the proposer's seconds and each step's size
and time (``Engine.step_log``). :func:`spec_row` turns a speculative run and its plain twin into
the numbers of chapter 12: acceptance, tokens per pass, speedup, and the prediction beside them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analysis.speculation import (
    VerifyCost,
    alpha_mle,
    fit_verify_cost,
    predicted_speedup_with_verify,
)
from ..engine import Engine, EngineConfig, SamplingParams
from ..engine.acceptance import (
    alpha_from_tokens_per_pass,
    expected_tokens_per_pass,
    predicted_speedup,
)
from ..harness import env_metadata
from ..package_files import data_path
from .ledger import (
    CopyBandwidth,
    copy_bandwidth,
    decode_step_bytes,
    ledger_row,
    mean_decode_context,
)

WORKLOADS = ("grounded", "chat")
PLAIN = "plain"


# ---------------------------------------------------------------------------------------------
# Workloads


@dataclass(frozen=True)
class SpecPrompt:
    """One prompt of a workload: ``grounded`` (copy or edit the given text) or ``chat``."""

    workload: str
    name: str
    task: str
    text: str


def _prompts_file() -> Path:
    return data_path("speculative_prompts.json")


def load_prompts(workload: str, n: int | None = None) -> list[SpecPrompt]:
    """The first ``n`` prompts (all when None) of ``workload`` from ``data/speculative_prompts.json``."""
    if workload not in WORKLOADS:
        raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}, got {workload!r}")
    rows = json.loads(_prompts_file().read_text())[workload]
    if n is not None and not 1 <= n <= len(rows):
        raise ValueError(f"the {workload} workload has {len(rows)} prompts; asked for {n}")
    return [SpecPrompt(workload, r["name"], r["task"], r["text"]) for r in rows[:n]]


def prompt_ids(lm: Any, prompts: Sequence[SpecPrompt]) -> list[list[int]]:
    """Token ids of each prompt through the model's chat template (one id per word, from
    :meth:`~infer_lab.models.LoadedModel.word_ids`, for a model without a tokenizer)."""
    if lm.tokenizer is None:
        return [lm.word_ids(p.text)[0].tolist() for p in prompts]
    return [lm.chat_ids(p.text)[0].tolist() for p in prompts]


def parse_proposer(spec: str) -> str:
    """Validate ``ngram``, ``ngram:N`` or ``self:L`` (what ``EngineConfig.speculative`` takes here)."""
    kind, _, arg = spec.partition(":")
    if kind == "ngram" and (not arg or arg.isdigit()):
        return spec
    if kind == "self" and arg.isdigit() and int(arg) >= 1:
        return spec
    raise ValueError(f"proposer must be ngram, ngram:N or self:L (L layers of the target), got {spec!r}")


# ---------------------------------------------------------------------------------------------
# One engine configuration over a workload


@dataclass(frozen=True)
class RunTotals:
    """One configuration over a set of requests, summed (tokens, passes, seconds).

    ``proposer`` is ``"plain"`` (no speculation, ``k = 0``) or what the engine was given.
    ``passes`` holds ``(proposed, accepted)`` of every verification pass of a lone sequence
    (batch 1), the raw data of the acceptance analysis; ``verify_samples`` holds
    ``(tokens in the pass, target seconds)`` of every pure decode step at batch 1.
    ``decode_seqs`` sums the sequences of every decode step; ``prompt_lens`` and
    ``output_lens`` are every request's, for the ledger's mean context.
    """

    proposer: str
    k: int
    batch: int
    requests: int
    output_tokens: int
    target_passes: int
    proposed: int
    accepted: int
    wall_s: float
    decode_s: float  # steps without prefill work, draft time included
    draft_s: float
    decode_steps: int
    passes: tuple[tuple[int, int], ...] = ()
    verify_samples: tuple[tuple[int, float], ...] = ()
    decode_seqs: int = 0
    prompt_lens: tuple[int, ...] = ()
    output_lens: tuple[int, ...] = ()

    @property
    def decode_passes(self) -> int:
        """Target passes after each request's prefill (the verification passes)."""
        return self.target_passes - self.requests

    @property
    def decode_tokens(self) -> int:
        """Tokens after each request's first (the one its prefill pass produced)."""
        return self.output_tokens - self.requests

    @property
    def tokens_per_pass(self) -> float:
        return self.decode_tokens / self.decode_passes if self.decode_passes else 1.0

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s else float("nan")

    @property
    def step_s(self) -> float:
        """Mean seconds of a decode step (draft included)."""
        return self.decode_s / self.decode_steps if self.decode_steps else float("nan")


def _add(a: RunTotals | None, b: RunTotals) -> RunTotals:
    if a is None:
        return b
    return RunTotals(
        a.proposer, a.k, a.batch, a.requests + b.requests, a.output_tokens + b.output_tokens,
        a.target_passes + b.target_passes, a.proposed + b.proposed, a.accepted + b.accepted,
        a.wall_s + b.wall_s, a.decode_s + b.decode_s, a.draft_s + b.draft_s,
        a.decode_steps + b.decode_steps, a.passes + b.passes, a.verify_samples + b.verify_samples,
        a.decode_seqs + b.decode_seqs, a.prompt_lens + b.prompt_lens, a.output_lens + b.output_lens,
    )


def sum_runs(runs: Sequence[RunTotals]) -> RunTotals:
    """Totals of several runs of the same configuration."""
    out = None
    for r in runs:
        out = _add(out, r)
    if out is None:
        raise ValueError("no runs to sum")
    return out


def make_engine(lm: Any, proposer: str, k: int, batch: int, max_len: int) -> Engine:
    """The engine both sides use: paged KV, continuous batching, ``batch`` slots."""
    spec = None if proposer == PLAIN else parse_proposer(proposer)
    config = EngineConfig(max_num_seqs=batch, max_model_len=max_len, speculative=spec,
                          num_speculative_tokens=max(k, 1))
    return Engine.from_loaded(lm, config)


def run_once(engine: Engine, prompts: Sequence[list[int]], params: SamplingParams,
             proposer: str, k: int) -> tuple[RunTotals, list[list[int]]]:
    """Generate ``prompts`` together (one batch) and total what the engine counted."""
    first = len(engine.step_log)
    t0 = time.perf_counter()
    outs = engine.generate(list(prompts), params)
    wall = time.perf_counter() - t0
    steps = list(engine.step_log)[first:]
    for o in outs:
        engine.release(o.request_id)
    decode = [s for s in steps if s.prefill_tokens == 0 and not s.failed]
    lone = [s for s in decode if s.num_seqs == 1]
    totals = RunTotals(
        proposer=proposer, k=k, batch=len(prompts), requests=len(outs),
        output_tokens=sum(len(o.token_ids) for o in outs),
        target_passes=sum(o.target_passes for o in outs),
        proposed=sum(o.proposed_tokens for o in outs), accepted=sum(o.accepted_tokens for o in outs),
        wall_s=wall, decode_s=sum(s.duration_s for s in decode), draft_s=sum(s.draft_s for s in decode),
        decode_steps=len(decode),
        passes=tuple((s.proposed, s.accepted) for s in lone),
        verify_samples=tuple((s.num_tokens, s.duration_s - s.draft_s) for s in lone),
        decode_seqs=sum(s.num_seqs for s in decode),
        prompt_lens=tuple(len(p) for p in prompts), output_lens=tuple(len(o.token_ids) for o in outs),
    )
    return totals, [o.token_ids for o in outs]


@dataclass
class Comparison:
    """Plain vs speculative configurations over the same groups of prompts.

    ``runs[(proposer, k)][g]`` is the totals of group ``g`` (one prompt at batch 1, or one batch);
    plain's entry for a group sums its two bracketing runs.
    """

    batch: int
    max_new_tokens: int
    rounds: int
    groups: int
    runs: dict[tuple[str, int], list[RunTotals]] = field(default_factory=dict)
    identical: dict[tuple[str, int], bool] = field(default_factory=dict)
    plain_repeatable: bool = True  # False: two plain greedy runs differed (random bf16 weights: near-ties)

    def totals(self, proposer: str, k: int) -> RunTotals:
        return sum_runs(self.runs[(proposer, k)])

    @property
    def plain(self) -> RunTotals:
        return self.totals(PLAIN, 0)

    def group_totals(self, proposer: str, k: int, group: int) -> RunTotals:
        """One group's totals over every round."""
        runs = self.runs[(proposer, k)]
        return sum_runs(runs[group :: self.groups])


def compare(
    lm: Any,
    prompts: Sequence[list[int]],
    configs: Sequence[tuple[str, int]],
    max_new_tokens: int,
    batch: int = 1,
    rounds: int = 1,
    progress: Any = None,
) -> Comparison:
    """Run plain decoding and every ``(proposer, k)`` over ``prompts``, ``batch`` at a time.

    Order, for every round and every group of ``batch`` prompts: plain, each configuration,
    plain again. Greedy; generation stops at EOS or ``max_new_tokens``.
    """
    if batch < 1 or rounds < 1 or max_new_tokens < 1:
        raise ValueError("batch, rounds and max_new_tokens must be >= 1")
    if not prompts:
        raise ValueError("need at least one prompt")
    groups = [[prompts[(g * batch + i) % len(prompts)] for i in range(batch)]
              for g in range(max(1, len(prompts) // batch))]
    max_len = max(len(p) for p in prompts) + max_new_tokens + 2
    eos = tuple(sorted(lm.eos_token_ids))
    params = SamplingParams(max_tokens=max_new_tokens, stop_token_ids=eos)
    keys = [(PLAIN, 0)] + [(parse_proposer(p), k) for p, k in configs]
    engines = {key: make_engine(lm, key[0], key[1], batch, max_len) for key in keys}
    warm = SamplingParams(max_tokens=4, ignore_eos=True)
    for engine in engines.values():  # warm-up: first calls pay one-time costs
        engine.generate([list(g) for g in groups[0]], warm)
    result = Comparison(batch, max_new_tokens, rounds, len(groups))
    result.runs = {key: [] for key in keys}
    result.identical = {key: True for key in keys[1:]}
    plan = [(r, g) for r in range(rounds) for g in range(len(groups))]
    for _, g in (progress(plan) if progress else plan):
        before, reference = run_once(engines[keys[0]], groups[g], params, *keys[0])
        for key in keys[1:]:
            totals, tokens = run_once(engines[key], groups[g], params, *key)
            result.runs[key].append(totals)
            result.identical[key] &= tokens == reference
        after, again = run_once(engines[keys[0]], groups[g], params, *keys[0])
        result.runs[keys[0]].append(_add(before, after))
        if again != reference:
            if not getattr(lm, "is_random", False):
                raise RuntimeError("plain greedy decoding gave two different outputs for the same prompts")
            # Random weights in bf16 leave near-ties in the logits, and a lone sequence's in-place
            # K/V read rounds differently from the batched gather: greedy may flip a tie between two
            # plain runs. Token identity is then not a meaningful check: say so, do not claim it.
            result.plain_repeatable = False
            result.identical = {key: False for key in keys[1:]}
    return result


# ---------------------------------------------------------------------------------------------
# From runs to the chapter's numbers


@dataclass(frozen=True)
class SpecRow:
    """One (proposer, k) against plain decoding of the same prompts: measured and predicted.

    Measured: ``acceptance_rate`` (accepted / proposed, the engine's counter),
    ``accepted_per_pass``, ``tokens_per_pass`` (after the first token: decode tokens / decode
    passes; plain = 1), ``passes_per_token`` (all target passes / output tokens), wall-clock
    ``tokens_per_s`` and ``speedup`` (plain's time / this one's, prefill included) and
    ``decode_speedup`` (decode steps only). Backed out: ``alpha_mle`` (kept / tested drafts,
    :func:`~infer_lab.analysis.speculation.alpha_mle`) and ``alpha_tpp`` (the i.i.d. alpha that
    gives the measured tokens per pass). Costs: ``cost_ratio`` c (proposer seconds per pass /
    (k x plain decode step)) and ``verify_ratio`` v (fitted target time of a (k+1)-token pass
    / a 1-token one). Predicted from ``alpha`` (see ``alpha_source``): ``predicted_tokens_per_pass``
    = E(alpha, k), ``predicted_speedup`` = E / (k c + 1) and ``predicted_speedup_verify`` =
    E / (k c + v).
    """

    proposer: str
    k: int
    workload: str
    batch: int
    requests: int
    output_tokens: int
    acceptance_rate: float | None
    accepted_per_pass: float
    tokens_per_pass: float
    passes_per_token: float
    tokens_per_s: float
    plain_tokens_per_s: float
    speedup: float
    decode_speedup: float
    alpha_mle: float | None
    alpha_tpp: float | None
    alpha: float
    alpha_source: str
    cost_ratio: float
    verify_ratio: float
    predicted_tokens_per_pass: float
    predicted_speedup: float
    predicted_speedup_verify: float
    identical: bool

    @property
    def measured_over_predicted(self) -> float:
        """Measured decode speedup over the textbook prediction."""
        return self.decode_speedup / self.predicted_speedup

    @property
    def measured_over_predicted_verify(self) -> float:
        """Measured decode speedup over the prediction with the measured verification cost."""
        return self.decode_speedup / self.predicted_speedup_verify


def cost_ratio(spec: RunTotals, plain: RunTotals) -> float:
    """c: the proposer's seconds per verification pass over k plain decode steps."""
    passes = spec.decode_passes / max(spec.batch, 1)  # steps, when the batch decodes together
    if not passes or spec.k == 0:
        return 0.0
    return spec.draft_s / passes / (spec.k * plain.step_s)


def verify_cost(runs: Sequence[RunTotals]) -> VerifyCost:
    """The ``t0 + t1 q`` fit over every batch-1 verification pass of ``runs`` (target time only),
    next to their mean plain one-token step."""
    samples = [s for r in runs for s in r.verify_samples]
    return fit_verify_cost(samples)


def spec_row(
    spec: RunTotals,
    plain: RunTotals,
    workload: str,
    cost: VerifyCost,
    identical: bool,
    alpha: float | None = None,
    alpha_source: str = "",
) -> SpecRow:
    """The measured and predicted numbers of one speculative run against its plain twin.

    ``alpha`` is the per-draft acceptance the prediction uses (for example the one measured at
    k = 1, to *predict* the other k); by default this run's own :func:`alpha_mle`.
    """
    mle = alpha_mle([a for _, a in spec.passes], [m for m, _ in spec.passes]) if spec.passes else None
    tpp = spec.tokens_per_pass
    alpha_tpp = alpha_from_tokens_per_pass(min(max(tpp, 1.0), spec.k + 1.0), spec.k) if spec.k else None
    if alpha is None:
        alpha, alpha_source = (mle, "this run (MLE)") if mle is not None else (0.0, "no drafts tested")
    c = cost_ratio(spec, plain)
    v = cost.ratio(spec.k + 1)
    predicted_tpp = expected_tokens_per_pass(alpha, spec.k)
    return SpecRow(
        proposer=spec.proposer, k=spec.k, workload=workload, batch=spec.batch, requests=spec.requests,
        output_tokens=spec.output_tokens,
        acceptance_rate=spec.accepted / spec.proposed if spec.proposed else None,
        accepted_per_pass=spec.accepted / spec.decode_passes if spec.decode_passes else 0.0,
        tokens_per_pass=tpp, passes_per_token=spec.target_passes / spec.output_tokens,
        tokens_per_s=spec.tokens_per_s, plain_tokens_per_s=plain.tokens_per_s,
        speedup=spec.tokens_per_s / plain.tokens_per_s,
        decode_speedup=spec.decode_tokens_per_s / plain.decode_tokens_per_s,
        alpha_mle=mle, alpha_tpp=alpha_tpp, alpha=alpha, alpha_source=alpha_source,
        cost_ratio=c, verify_ratio=v, predicted_tokens_per_pass=predicted_tpp,
        predicted_speedup=predicted_speedup(alpha, spec.k, c),
        predicted_speedup_verify=predicted_speedup_with_verify(alpha, spec.k, c, v),
        identical=identical,
    )


def proposer_alpha(comparison: Comparison, proposer: str) -> tuple[float | None, str]:
    """The alpha that predicts every k of ``proposer``: measured at k = 1 when that was run
    (where accepted / proposed has no truncation bias), else the MLE over all its runs."""
    ks = sorted(k for p, k in comparison.runs if p == proposer)
    source = 1 if 1 in ks else None
    runs = [comparison.totals(proposer, k) for k in ([1] if source else ks)]
    passes = [p for r in runs for p in r.passes]
    alpha = alpha_mle([a for _, a in passes], [m for m, _ in passes]) if passes else None
    return alpha, ("measured at k = 1" if source else "MLE over all k")


def rows(comparison: Comparison, workload: str) -> list[SpecRow]:
    """A :class:`SpecRow` per configuration; each proposer predicted from its own alpha."""
    plain = comparison.plain
    keys = [key for key in comparison.runs if key[0] != PLAIN]
    cost = verify_cost([comparison.totals(*key) for key in comparison.runs])
    alphas = {p: proposer_alpha(comparison, p) for p, _ in keys}
    out = []
    for proposer, k in keys:
        alpha, source = alphas[proposer]
        out.append(spec_row(comparison.totals(proposer, k), plain, workload, cost,
                            comparison.identical[(proposer, k)], alpha, source))
    return out


def spec_ledger(lm: Any, totals: RunTotals, copy: CopyBandwidth) -> dict[str, float] | None:
    """The ledger (:func:`~.ledger.ledger_row`) of a run's pure decode steps; None without any.

    A step yields ``decode_tokens / decode_steps`` tokens (the sequences times the tokens per
    pass) and streams the target's weights once and each sequence's K/V at the mean context.
    The target's passes only: a ``self:L`` draft's reads of its L layers are not counted.
    """
    if not totals.decode_steps or not totals.decode_s:
        return None
    seqs = totals.decode_seqs / totals.decode_steps
    step = decode_step_bytes(lm, seqs, mean_decode_context(totals.prompt_lens, totals.output_lens))
    return ledger_row(totals.decode_tokens_per_s, totals.decode_tokens / totals.decode_steps, step, copy)


def bench_spec(
    lm: Any,
    proposer: str,
    ks: Sequence[int],
    workload: str = "grounded",
    batch: int = 1,
    max_new_tokens: int = 64,
    prompts: int | None = None,
    rounds: int = 1,
) -> dict[str, Any]:
    """``infer-lab bench spec``: one proposer at several k on one workload, as plain JSON data.

    Plain decoding and every row carry their ``decode_tokens_per_s`` and ledger
    (:func:`spec_ledger`); ``samples`` keeps every run's own totals (plain's: before and after
    summed), in the order they ran.
    """
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"k values must be >= 1, got {list(ks)}")
    chosen = load_prompts(workload, prompts)
    comparison = compare(lm, prompt_ids(lm, chosen), [(proposer, k) for k in ks], max_new_tokens,
                         batch=batch, rounds=rounds)
    plain, copy = comparison.plain, copy_bandwidth(lm.device)
    out_rows = [dict(row.__dict__, measured_over_predicted=row.measured_over_predicted,
                     measured_over_predicted_verify=row.measured_over_predicted_verify,
                     decode_tokens_per_s=comparison.totals(row.proposer, row.k).decode_tokens_per_s,
                     ledger=spec_ledger(lm, comparison.totals(row.proposer, row.k), copy))
                for row in rows(comparison, workload)]
    sample_keys = ("output_tokens", "wall_s", "decode_s", "draft_s", "decode_steps", "target_passes")
    return {
        "proposer": proposer, "ks": list(ks), "workload": workload, "batch": batch,
        "max_new_tokens": max_new_tokens, "rounds": rounds, "prompts": [p.name for p in chosen],
        "plain": {"tokens_per_s": plain.tokens_per_s, "output_tokens": plain.output_tokens // 2,
                  "decode_step_ms": plain.step_s * 1e3, "decode_tokens_per_s": plain.decode_tokens_per_s,
                  "ledger": spec_ledger(lm, plain, copy)},
        "rows": out_rows,
        "samples": {f"{p} k={k}": [{key: getattr(r, key) for key in sample_keys} for r in runs]
                    for (p, k), runs in comparison.runs.items()},
        "copy_bandwidth": copy.as_dict(),
        "environment": env_metadata(lm),
    }
