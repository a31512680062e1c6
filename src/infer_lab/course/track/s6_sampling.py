"""Stage 6's check: sampling and speculative decoding's two rules, alone and inside the engine.

1. The guided functions, exactly: ``verify_greedy`` against the library's on fixed and hidden
   cases; ``acceptance_probability`` with ``residual_distribution`` by the distribution of the
   emitted token, computed exactly (it must be the target's ``p`` whatever the draft's ``q``);
   ``filter_logits`` on hidden logits (the kept set of top-k, top-p and both; ties at the k-th place
   may be kept or broken); ``ngram_lookup`` against the library's on hidden cases, overlapping
   matches and matches hundreds of tokens back included.
2. ``Sampler.sample``: greedy rows are the argmax; the same seeds give the same tokens whatever
   state torch's global RNG is in, and a row's token depends on its own generator only; and the
   samples of four hidden settings (temperature, top-k, top-p, both) never fall outside the kept
   set and follow ``softmax(filter(logits / T))`` by a G-test.
3. ``Sampler.verify``: greedy verification exactly; sampling verification by the distribution of
   the first emitted token (a draft distribution ``q``, and a deterministic guess), and of the
   bonus token when every guess is kept; the same seed gives the same result.
4. ``NgramProposer.propose`` on hidden requests, against the library's lookup, at most ``k`` guesses.
5. Inside the real engine: greedy n-gram speculation on the embedded model (a grounded prompt
   and two chat prompts) and on the hidden model, token-identical to transformers, the grounded
   prompt in fewer target passes than tokens and at most x 1.1 the passes the library's lookup
   takes on transformers' tokens (the grounded prompt is one of up to 8 hidden ones that the model
   goes on copying); 1000 hidden sampling requests with a check-side proposer (a deterministic
   guess for half of them, a guess drawn from a distorted ``q`` for the others) whose guesses your
   ``verify`` keeps or rejects: their first tokens (your ``sample``) and their second tokens after
   the guess (your ``verify``), grouped by the first, must follow the target's distributions
   (G-tests); and your proposer with seeded sampling requests, whose tokens must not change when
   other requests run beside them.

Every distribution test is a G-test (the likelihood-ratio form of Pearson's chi-square test; cells
expected fewer than :data:`MIN_EXPECTED` times are pooled). The whole check's false-alarm rate is
:data:`FALSE_ALARM` (a correct sampler fails it at most once in 10,000 runs): each of the
:data:`NUM_DISTRIBUTION_TESTS` tests rejects at ``FALSE_ALARM / NUM_DISTRIBUTION_TESTS``
(Bonferroni). The sample sizes (:data:`SAMPLE_DRAWS`, :data:`VERIFY_DRAWS`, :data:`ENGINE_REQUESTS`;
twice as many with ``--full``) are set so that the wrong answers the tests are for (a temperature
ignored, the residual not used, a bonus token from the wrong row) fail with any seed
(tests/test_track_s6.py runs each on CI's seed). Every hidden distribution is spread over at least 3
tokens of 3% or more, so each test has degrees of freedom.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from ...engine import EngineConfig, SamplingParams
from ...engine.acceptance import verify_greedy as library_verify_greedy
from ...engine.proposers import NgramProposer as LibraryNgramProposer
from ...engine.proposers import Proposal
from ...engine.sampling import filter_logits as library_filter_logits
from ...engine.sequence import Sequence
from ..exercises.checking import CaseAborted, short_repr
from . import Stage, StageContext
from . import harness as h
from .boundary import BadResult, LearnerCodeError, as_int_list, as_token_list_and_count, describe

FALSE_ALARM = 1e-4  # the whole check's false-alarm rate (all its distribution tests together)
NUM_DISTRIBUTION_TESTS = 10  # 4 sample settings, 3 verify tests, 3 inside the engine
TEST_ALPHA = FALSE_ALARM / NUM_DISTRIBUTION_TESTS  # each test's share (Bonferroni)
MIN_EXPECTED = 10.0  # cells expected fewer times than this are pooled (the G-test's approximation holds)
SAMPLE_REQUESTS = 8  # rows of each sample() call in the distribution tests (each its own generator)
SAMPLE_DRAWS = 3000  # draws per sample setting
VERIFY_DRAWS = 2000  # verifications per verify distribution test
ENGINE_REQUESTS = 1000  # sampling requests in the engine's distribution run
ENGINE_TOP_K = 6
SPEC_K = 4  # guesses per pass in the greedy engine runs
SPEC_TOKENS = 12
PASS_SLACK = 1.1  # target passes: at most the library's x this
ALT_P = 1e-3  # a wrong rule is named when the samples fit it at least this well


# ---------------------------------------------------------------------------------------------
# Adapters: results as the engine takes them


def _as_tokens_per_row(result: Any, args: tuple, kwargs: dict) -> list[int]:
    """One token id per row of the logits, each a valid id."""
    tokens = as_int_list(result, args, kwargs)
    logits = args[0] if args else kwargs.get("logits")
    rows, vocab = (logits.shape[0], logits.shape[-1]) if isinstance(logits, torch.Tensor) else (len(tokens), None)
    if len(tokens) != rows:
        raise BadResult(f"expected one token per row of the logits ({rows}), got {len(tokens)}")
    bad = [t for t in tokens if t < 0 or (vocab is not None and t >= vocab)]
    if bad:
        raise BadResult(f"token id {bad[0]} is not in [0, {vocab})")
    return tokens


def _as_verdict(result: Any, args: tuple, kwargs: dict) -> tuple[list[int], int]:
    """``(tokens, kept)``: the kept guesses, then exactly one token of the target's own."""
    tokens, kept = as_token_list_and_count(result, args, kwargs)
    drafts = list(args[0]) if args else list(kwargs.get("drafts", []))
    if kept > len(drafts):
        raise BadResult(f"{kept} guesses kept, but there were only {len(drafts)}")
    if len(tokens) != kept + 1:
        hint = (": when every guess is kept, add a bonus token drawn from the last row (p_k)"
                if len(tokens) == kept == len(drafts) else "")
        raise BadResult(f"with {kept} guesses kept, the tokens to append are those {kept} guesses and then one "
                        f"token of the target's own ({kept + 1} tokens), got {len(tokens)}{hint}")
    if tokens[:kept] != drafts[:kept]:
        raise BadResult(f"the first {kept} tokens must be the kept guesses {drafts[:kept]}, got {tokens[:kept]}")
    return tokens, kept


def _as_probability(result: Any, args: tuple, kwargs: dict) -> float:
    """A plain float from a float, numpy scalar or 0-d tensor."""
    if isinstance(result, torch.Tensor):
        if result.numel() != 1:
            raise BadResult(f"expected one number, got a tensor of shape {tuple(result.shape)}")
        result = result.item()
    if hasattr(result, "item") and not isinstance(result, (int, float)):
        result = result.item()
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        raise BadResult("expected a number (a probability)")
    return float(result)


def _as_vector_like(result: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    """A tensor shaped like the first argument, in its dtype, from a tensor, numpy array or list."""
    ref = args[0]
    try:
        out = torch.as_tensor(result)
    except (TypeError, ValueError, RuntimeError):
        raise BadResult(f"expected a tensor like the argument {describe(ref)}") from None
    if tuple(out.shape) != tuple(ref.shape):
        raise BadResult(f"expected shape {tuple(ref.shape)}, got {tuple(out.shape)}")
    return out.to(dtype=ref.dtype, device=ref.device)


def _as_proposals(result: Any, args: tuple, kwargs: dict) -> list[Proposal]:
    """One Proposal per request (a Proposal, or a plain list of token ids), at most ``ks[i]`` tokens each."""
    seqs, ks = (list(args[0]), list(args[1])) if len(args) >= 2 else (list(kwargs["seqs"]), list(kwargs["ks"]))
    try:
        items = list(result)
    except TypeError:
        raise BadResult("expected a list with one Proposal per request") from None
    if len(items) != len(seqs):
        raise BadResult(f"expected one Proposal per request ({len(seqs)}), got {len(items)}")
    out = []
    for i, (item, k) in enumerate(zip(items, ks, strict=True)):
        tokens, probs = (item.tokens, item.probs) if isinstance(item, Proposal) else (item, None)
        tokens = as_int_list(tokens, args, kwargs)
        if len(tokens) > max(k, 0):
            raise BadResult(f"request {i} may get at most ks[{i}] = {k} guesses, got {len(tokens)}: {tokens}")
        if any(t < 0 for t in tokens):
            raise BadResult(f"request {i}: {tokens} are not all token ids")
        out.append(Proposal(tokens, probs))
    return out


# ---------------------------------------------------------------------------------------------
# The G-test


@dataclass(frozen=True)
class GTest:
    """A G-test's outcome: the statistic, its degrees of freedom, the p-value and the biggest gap."""

    g: float
    df: int
    p_value: float
    samples: int
    worst: str

    def passed(self, alpha: float = TEST_ALPHA) -> bool:
        return self.p_value >= alpha

    def text(self) -> str:
        return f"G = {self.g:.1f} on {self.df} degrees of freedom, p-value {self.p_value:.2g}"


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for a chi-square variable of ``df`` degrees of freedom (the regularized upper gamma)."""
    if df <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(max(x, 0.0) / 2, dtype=torch.float64)))


def g_test(groups: list[tuple[list[int], torch.Tensor]]) -> GTest:
    """Observed tokens against expected probabilities ``(vocab,)``, one pair per group, summed over groups.

    Within a group, tokens expected fewer than :data:`MIN_EXPECTED` times share one cell. Tokens the
    expected distribution gives probability 0 must be caught before (they are the caller's message).
    """
    g, df, n_all, worst, worst_z = 0.0, 0, 0, "", -1.0
    for observed, probs in groups:
        n = len(observed)
        if n == 0:
            continue
        n_all += n
        counts = Counter(observed)
        expected = {int(t): n * float(probs[t]) for t in torch.nonzero(probs > 0).flatten().tolist()}
        order = sorted(expected, key=lambda t: -expected[t])
        own = [t for t in order if expected[t] >= MIN_EXPECTED]
        rest = [t for t in order if expected[t] < MIN_EXPECTED]
        while own and sum(expected[t] for t in rest) < MIN_EXPECTED and rest:
            rest.insert(0, own.pop())  # too little left to pool: the smallest own cell joins the rest
        cells = [([t], expected[t]) for t in own]
        if rest:
            cells.append((rest, sum(expected[t] for t in rest)))
        if len(cells) < 2:
            continue
        for tokens, e in cells:
            o = sum(counts[t] for t in tokens)
            if o > 0:
                g += 2.0 * o * math.log(o / e)
            z = abs(o - e) / math.sqrt(e)
            if z > worst_z:
                worst_z = z
                what = f"token {tokens[0]}" if len(tokens) == 1 else f"the {len(tokens)} least likely tokens together"
                worst = f"{what} drawn {o} times in {n}, expected {e:.1f} (probability {e / n:.4f})"
        df += len(cells) - 1
    return GTest(g, df, chi2_sf(g, df), n_all, worst)


def _fitting_rule(groups: list[tuple[list[int], torch.Tensor]], alternatives: dict[str, list[torch.Tensor]]) -> str:
    """``". The draws fit <a known wrong rule>"`` when one explains the draws (G-test p-value over :data:`ALT_P`)."""
    for text, alt in alternatives.items():
        alt_groups = [(obs, probs) for (obs, _), probs in zip(groups, alt, strict=True)]
        if all(float(probs[t]) > 0 for obs, probs in alt_groups for t in obs) and g_test(alt_groups).p_value > ALT_P:
            return f". The draws fit {text}"
    return ""


def _distribution_verdict(ctx: StageContext, case: str, groups: list[tuple[list[int], torch.Tensor]], what: str,
                          alternatives: dict[str, list[torch.Tensor]] | None = None) -> bool:
    """Record one distribution test: outside the support first, then the G-test (naming a wrong rule that fits)."""
    for observed, probs in groups:
        outside = [t for t in observed if float(probs[t]) == 0.0]
        if outside:
            kept = torch.nonzero(probs > 0).flatten().tolist()
            return ctx.report.record(case, False, f"token {outside[0]} was drawn ({len(outside)} of {len(observed)} "
                                                  f"draws outside the kept set), but {what} gives it probability 0; "
                                                  f"the kept set is {short_repr(kept, 80)}"
                                                  + _fitting_rule(groups, alternatives or {}))
    test = g_test(groups)
    if test.df == 0:
        return ctx.report.record(case, False, "the test had nothing to compare (one cell): the check's setting is "
                                              "degenerate, rerun with another --seed")
    if test.passed():
        return ctx.report.record(case, True, f"{test.samples} draws follow {what}: {test.text()} (rejects below "
                                             f"{TEST_ALPHA:.0e}, this check's false-alarm rate {FALSE_ALARM:.0e} "
                                             f"shared by its {NUM_DISTRIBUTION_TESTS} distribution tests)")
    return ctx.report.record(case, False, f"the draws do not follow {what}: {test.text()} < {TEST_ALPHA:.0e} (a "
                                          f"correct sampler fails this test about once in {1 / TEST_ALPHA:,.0f} "
                                          f"runs); the biggest gap: {test.worst}"
                                          + _fitting_rule(groups, alternatives or {}))


# ---------------------------------------------------------------------------------------------
# The library's rules in float64 (the check's expectations)


def _probs64(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """softmax(filter(logits / T)) in float64, from one row of logits."""
    return torch.softmax(library_filter_logits(logits.double() / temperature, top_k, top_p), dim=-1)


def _emitted(p: torch.Tensor, q: torch.Tensor, accept: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """The first emitted token's distribution: drafted and kept, or rejected and drawn from ``residual``."""
    kept = q * accept
    return kept + (1.0 - float(kept.sum())) * residual


def _residual64(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    r = (p - q).clamp_min(0)
    return r / r.sum() if float(r.sum()) > 0 else p


def _guarded(ctx: StageContext, case: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` (a learner's guarded function); an error is recorded as the failed ``case`` and ends the check."""
    try:
        return fn(*args)
    except LearnerCodeError as exc:
        ctx.report.record(case, False, str(exc))
        raise CaseAborted from exc


def _torch_gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class _GlobalRngKept:
    """Restores torch's global RNG after the check has moved it (to catch samplers that use it)."""

    def __enter__(self) -> None:
        self.state = torch.get_rng_state()

    def __exit__(self, *exc: Any) -> None:
        torch.set_rng_state(self.state)


# ---------------------------------------------------------------------------------------------
# 1. The guided functions


GREEDY_CASES = (([5, 6, 7], [5, 6, 7, 8]), ([5, 6, 7], [5, 9, 7, 8]), ([5, 6, 7], [1, 6, 7, 8]), ([], [4]),
                ([3, 3], [3, 3, 3]), ([2, 4, 6, 8], [2, 4, 6, 9, 1]))


def check_verify_greedy(ctx: StageContext) -> bool:
    rng = ctx.rng("verify_greedy")
    cases = list(GREEDY_CASES)
    for _ in range(12):
        k = rng.randint(1, 6)
        target = [rng.randrange(20) for _ in range(k + 1)]
        agree = rng.randint(0, k)
        drafts = target[:agree] + [rng.randrange(20) for _ in range(k - agree)]
        cases.append((drafts, target))
    fn = ctx.fn("verify_greedy")
    case = f"verify_greedy on {len(cases)} cases ({len(cases) - len(GREEDY_CASES)} hidden)"
    for drafts, target in cases:
        got = _guarded(ctx, case, fn, list(drafts), list(target))
        want = library_verify_greedy(drafts, target)
        if got != (want.tokens, want.accepted):
            tokens, kept = got
            if kept < want.accepted:
                why = "keep guesses while they equal the target's argmax at their position"
            elif kept > want.accepted:
                why = f"guess {want.accepted} ({drafts[want.accepted]}) differs from the target's argmax there " \
                      f"({target[want.accepted]}): stop at the first disagreement"
            else:
                why = (f"after the kept guesses comes the target's own token at that position, "
                       f"target_argmax[{kept}] = {target[kept]}")
            return ctx.report.record(case, False, f"drafts {drafts}, target argmax {target}: expected "
                                                  f"({want.tokens}, {want.accepted}), got ({tokens}, {kept}): {why}")
    return ctx.report.record(case, True, "the kept guesses, then the target's own token, every time")


def _pairs(rng: random.Random) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, p, q) pairs of distributions (float64), the first four hidden."""
    g = _torch_gen(rng.randrange(2**31))
    vocab = rng.randint(6, 12)

    def dist(scale: float = 1.0) -> torch.Tensor:
        return torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * scale, dim=0)

    p = dist()
    point = torch.zeros(vocab, dtype=torch.float64)
    point[int(torch.argsort(p)[vocab // 2])] = 1.0
    half = torch.zeros(vocab, dtype=torch.float64)
    half[: vocab // 2] = 1.0 / (vocab // 2)
    return [("a draft q unlike the target p", p, dist()),
            ("a confident draft (a peaked q)", p, dist(3.0)),
            ("a deterministic guess (q is a point mass, as for n-gram lookup)", p, point),
            ("a draft equal to the target", p, p.clone()),
            ("a draft that never proposes half the tokens", torch.full((vocab,), 1 / vocab, dtype=torch.float64), half)]


EXACT_TOL = 1e-6


def check_acceptance_rule(ctx: StageContext) -> bool:
    accept_fn, residual_fn = ctx.fn("acceptance_probability"), ctx.fn("residual_distribution")
    case = "acceptance_probability and residual_distribution: the emitted token follows p whatever q"
    for name, p, q in _pairs(ctx.rng("pairs")):
        accept = torch.zeros_like(p)
        for x in range(len(p)):
            if q[x] > 0:
                a = _guarded(ctx, case, accept_fn, float(p[x]), float(q[x]))
                if not 0.0 <= a <= 1.0 + 1e-12:
                    return ctx.report.record(case, False, f"{name}: acceptance_probability({float(p[x]):.4g}, "
                                                          f"{float(q[x]):.4g}) = {a:.4g} is not a probability: "
                                                          "keep a guess with probability min(1, p/q)")
                accept[x] = a
        want_accept = torch.where(q > 0, torch.clamp(p / q.clamp_min(1e-300), max=1.0), torch.zeros_like(p))
        rejected = 1.0 - float((q * accept).sum())
        residual = torch.zeros_like(p)
        if rejected > 1e-12:
            residual = _guarded(ctx, case, residual_fn, p.clone(), q.clone()).double()
            if not bool(torch.isfinite(residual).all()) or bool((residual < -1e-12).any()):
                return ctx.report.record(case, False, f"{name}: residual_distribution returned "
                                                      f"{short_repr([round(v, 4) for v in residual.tolist()], 80)}: "
                                                      "a distribution has no NaN and no negative entry")
            if abs(float(residual.sum()) - 1.0) > EXACT_TOL:
                return ctx.report.record(case, False, f"{name}: the residual sums to {float(residual.sum()):.6g}: it "
                                                      "is sampled from, so normalize it to sum 1 (a sampler that "
                                                      "reads it as probabilities, an inverse CDF, draws wrong tokens)")
        emitted = _emitted(p, q, accept, residual)
        err = float((emitted - p).abs().max())
        if err > EXACT_TOL:
            worst = int((emitted - p).abs().argmax())
            hint = ""
            if float((accept - want_accept).abs().max()) > 1e-9:
                hint = "keep a guess with probability min(1, p/q)"
            elif float((residual - _residual64(p, q)).abs().max()) > 1e-9:
                hint = "on a rejection draw from max(p - q, 0), normalized: where the target wants more than q gave"
            return ctx.report.record(case, False, f"{name}: P(token {worst}) is {float(emitted[worst]):.5f} but the "
                                                  f"target gives {float(p[worst]):.5f} (max |difference| {err:.3g}): "
                                                  "the output must follow p whatever the draft" +
                                                  (f". Hint: {hint}" if hint else ""))
    return ctx.report.record(case, True, "exactly p (to 1e-6) for 5 draft distributions, 4 of them hidden")


def _filter_cases(rng: random.Random) -> list[tuple[str, torch.Tensor, int, float]]:
    """(name, logits float32, top_k, top_p): top-k, top-p with the crossing token well inside, both, ties."""
    g = _torch_gen(rng.randrange(2**31))
    cases = []
    for i in range(6):
        vocab = rng.randint(12, 80)
        logits = (torch.randn(vocab, generator=g) * rng.choice((1.0, 2.0, 3.0))).float()
        probs, _ = torch.sort(torch.softmax(logits.double(), dim=-1), descending=True)
        kind = ("top-k", "top-p", "top-k and top-p", "top-p", "top-k", "top-k and top-p")[i]
        top_k = rng.randint(1, vocab - 1) if "top-k" in kind else 0
        if top_k:
            probs = probs[:top_k] / probs[:top_k].sum()
        top_p = 1.0
        if "top-p" in kind and len(probs) > 1:
            big = [j for j in range(len(probs)) if float(probs[j]) > 0.01] or [0]
            j = rng.choice(big)  # the crossing token: top_p falls in the middle of its mass
            before = float(probs[:j].sum())
            top_p = before + float(probs[j]) / 2
        cases.append((kind, logits, top_k, min(top_p, 1.0)))
    vocab = rng.randint(10, 30)
    tied = torch.randn(vocab, generator=g).float()
    order = torch.argsort(tied, descending=True)
    k = rng.randint(2, 5)
    tied[order[k - 1 : k + 2]] = float(tied[order[k - 1]])  # three logits tie for the k-th place
    cases.append(("top-k with a tie at the k-th place", tied, k, 1.0))
    vocab = rng.randint(10, 30)
    peaked = torch.randn(vocab, generator=g).float()
    peaked[rng.randrange(vocab)] = 12.0
    cases.append(("top-p smaller than the most likely token's probability", peaked, 0, 0.5))
    cases.append(("no filter (top_k 0, top_p 1)", torch.randn(17, generator=g).float(), 0, 1.0))
    return cases


def _kept(out: Any, logits: torch.Tensor) -> tuple[set[int] | None, str]:
    """The set ``out`` keeps (logits unchanged) and drops (-inf, or below -1e9); or None and what is wrong."""
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(logits.shape):
        return None, f"return a tensor of shape {tuple(logits.shape)} like the logits, got {describe(out)}"
    kept = set()
    for t, (o, x) in enumerate(zip(out.double().tolist(), logits.double().tolist(), strict=True)):
        if o == float("-inf") or o <= -1e9:
            continue
        if abs(o - x) <= 1e-5 * max(1.0, abs(x)):
            kept.add(t)
            continue
        return None, (f"token {t}'s logit {x:.4g} became {o:.4g}: keep a kept token's logit unchanged and set a "
                      "dropped one to -inf")
    return kept, ""


def _filter_hint(logits: torch.Tensor, top_k: int, top_p: float, got: set[int], want: set[int]) -> str:
    order = torch.argsort(logits.double(), descending=True).tolist()
    probs = torch.softmax(library_filter_logits(logits.double(), top_k, 1.0), dim=-1)
    if top_p < 1.0 and got == want - {max(want, key=lambda t: order.index(t))}:
        t = max(want, key=lambda t: order.index(t))
        before = sum(float(probs[u]) for u in want if u != t)
        return (f"token {t} takes the kept mass from {before:.3f} to {before + float(probs[t]):.3f}, past "
                f"top_p = {top_p:.3f}, and must be kept: keep the smallest set whose mass is at least top_p (a token "
                "stays while the mass BEFORE it is below top_p)")
    if top_p < 1.0 and len(got) == len(want) + 1 and want < got:
        return "one token too many: stop at the first token that takes the mass to top_p"
    if top_k and top_p < 1.0:
        whole = set(torch.nonzero(torch.isfinite(library_filter_logits(logits.double(), 0, top_p))).flatten().tolist())
        if got == whole & set(order[:top_k]):
            return "the nucleus is taken over what top-k left, renormalized: apply top-k first, then top-p"
    if top_k and top_p == 1.0 and abs(len(got) - top_k) == 1:
        return f"keep exactly the {top_k} largest logits (you kept {len(got)})"
    return ""


def check_filter_logits(ctx: StageContext) -> bool:
    fn = ctx.fn("filter_logits")
    cases = _filter_cases(ctx.rng("filter"))
    case = f"filter_logits on {len(cases)} hidden logit vectors"
    for name, logits, top_k, top_p in cases:
        arg = logits.clone()
        out = _guarded(ctx, case, fn, arg, top_k, top_p)
        where = f"{name}: {len(logits)} logits, top_k={top_k}, top_p={top_p:.4f}"
        if not torch.equal(arg, logits):
            return ctx.report.record(case, False, f"{where}: filter_logits changed its input in place: return a new "
                                                  "tensor (logits.clone()), the engine still needs the logits")
        got, why = _kept(out, logits)
        if got is None:
            return ctx.report.record(case, False, f"{where}: {why}")
        if "tie" in name:
            kth = float(torch.sort(logits, descending=True).values[top_k - 1])
            must = {t for t in range(len(logits)) if float(logits[t]) > kth}
            may = {t for t in range(len(logits)) if float(logits[t]) >= kth}
            if must <= got <= may and len(got) >= top_k:
                continue
            return ctx.report.record(case, False, f"{where}: kept {sorted(got)}; every logit above the k-th "
                                                  f"({sorted(must)}) must stay, and the tied ones ({sorted(may - must)}) "
                                                  f"fill the {top_k} places (all of them, or some: either is right)")
        want = set(torch.nonzero(torch.isfinite(library_filter_logits(logits.double(), top_k, top_p))).flatten().tolist())
        if got != want:
            hint = _filter_hint(logits, top_k, top_p, got, want)
            return ctx.report.record(case, False, f"{where}: expected the kept set {short_repr(sorted(want), 60)}, got "
                                                  f"{short_repr(sorted(got), 60)}" + (f". Hint: {hint}" if hint else ""))
    return ctx.report.record(case, True, "the kept set of top-k, top-p (the crossing token kept) and both; a tie at "
                                         "the k-th place; the input left unchanged")


def _lookup_variant(tokens: list[int], k: int, max_n: int, min_n: int, *, oldest: bool = False,
                    shortest: bool = False, no_overlap: bool = False, window: int | None = None) -> list[int]:
    """The library's lookup with one known mistake, to name it when the learner's answer equals it."""
    length = len(tokens)
    sizes = list(range(min(max_n, length - 1), min_n - 1, -1))
    for n in (reversed(sizes) if shortest else sizes):
        suffix = tokens[length - n:]
        last = length - 2 * n if no_overlap else length - n - 1
        first = max(0, length - window) if window else 0
        starts = list(range(last, first - 1, -1))
        for start in (reversed(starts) if oldest else starts):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def _ngram_cases(rng: random.Random) -> list[tuple[list[int], int, int, int]]:
    """(tokens, k, max_n, min_n): chapter 12's cases, overlapping matches, matches far back, random ones."""
    cases = [([1, 2, 3, 9, 9, 1, 2, 3], 3, 3, 1), ([1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2], 4, 3, 1),
             ([7, 8, 1, 7, 8, 2, 7, 8], 2, 2, 1), ([4, 5, 6], 3, 3, 1), ([1, 2, 1, 3, 1, 4, 1], 5, 3, 2),
             ([5, 1, 2, 1, 1], 3, 1, 1), ([3, 1, 2, 1, 2], 2, 3, 2), ([9, 4, 4, 4, 4], 3, 3, 1)]
    for _ in range(4):  # a short period repeated: the most recent occurrence overlaps the suffix
        period = [rng.randrange(50, 90) for _ in range(rng.randint(1, 3))]
        noise = [rng.randrange(10, 50) for _ in range(rng.randint(0, 6))]
        body = (period * 12)[: rng.randint(len(period) * 2 + 2, len(period) * 6 + 3)]
        cases.append((noise + body, rng.randint(2, 6), rng.randint(3, 4), 1))
    for _ in range(3):  # the only earlier occurrence is hundreds of tokens back
        head = [rng.randrange(1000, 1100) for _ in range(8)]
        filler = rng.sample(range(2000, 6000), rng.randint(150, 400))
        n = rng.randint(2, 3)
        cases.append((head + filler + head[:n], rng.randint(2, 5), 3, 1))
    for _ in range(24):
        alphabet = rng.choice((2, 3, 5, 12, 40))
        tokens = [rng.randrange(alphabet) for _ in range(rng.randint(2, 300))]
        max_n = rng.randint(1, 4)
        cases.append((tokens, rng.randint(1, 6), max_n, rng.randint(1, max_n)))
    return cases


def _lookup_hint(tokens: list[int], k: int, max_n: int, min_n: int, got: Any) -> str:
    hints = [({"no_overlap": True}, "an earlier occurrence may overlap the suffix (in 4 4 4 4 the suffix 4 4 4 also "
                                    "starts one token earlier): try every start up to len(tokens) - n - 1"),
             ({"oldest": True}, "the MOST RECENT earlier occurrence wins: scan the starts from the end backwards"),
             ({"shortest": True}, "try the LONGEST suffix first (n from max_n down to min_n)")]
    for flags, text in hints:
        if got == _lookup_variant(tokens, k, max_n, min_n, **flags):
            return text
    if any(got == _lookup_variant(tokens, k, max_n, min_n, window=w) for w in (16, 24, 32, 48, 64, 100, 128, 256)):
        return ("your answer is what a search of only the most recent few dozen tokens finds: search the whole text, "
                "however long (the match here is further back; the engine's requests run to thousands of tokens)")
    return ""


def check_ngram_lookup(ctx: StageContext) -> bool:
    fn = ctx.fn("ngram_lookup")
    cases = _ngram_cases(ctx.rng("ngram"))
    case = f"ngram_lookup on {len(cases)} cases (overlapping matches, matches 150-400 tokens back, random text)"
    for tokens, k, max_n, min_n in cases:
        got = _guarded(ctx, case, fn, list(tokens), k, max_n, min_n)
        want = LibraryNgramProposer(max_n, min_n).lookup(tokens, k)
        if got != want:
            shown = tokens if len(tokens) <= 14 else f"{str(tokens[:6])[:-1]}, ... ({len(tokens)} tokens) ..., " \
                                                     f"{str(tokens[-6:])[1:]}"
            hint = _lookup_hint(tokens, k, max_n, min_n, got)
            return ctx.report.record(case, False, f"tokens {shown}, k={k}, n from {max_n} down to {min_n}: expected "
                                                  f"{want}, got {got}" + (f". Hint: {hint}" if hint else ""))
    return ctx.report.record(case, True, "the longest suffix, its most recent earlier occurrence, what followed it")


# ---------------------------------------------------------------------------------------------
# 2. Sampler.sample


def _sample_settings(rng: random.Random) -> list[tuple[str, torch.Tensor, SamplingParams]]:
    """Four hidden settings: temperature alone, with top-k, with top-p, with both (float32 logits)."""
    g = _torch_gen(rng.randrange(2**31))
    out = []
    for name in ("temperature", "temperature and top-k", "temperature and top-p", "temperature, top-k and top-p"):
        while True:  # until at least 3 tokens have 3% or more: a distribution the test can tell from others
            vocab = rng.randint(16, 40)
            logits = (torch.randn(vocab, generator=g) * 1.5).float()
            temperature = rng.choice((0.6, 0.7, 1.4, 1.7))
            top_k = rng.randint(4, 8) if "top-k" in name else 0
            top_p = 1.0
            if "top-p" in name:
                probs, _ = torch.sort(_probs64(logits, temperature, top_k, 1.0), descending=True)
                crossing = [j for j in range(2, min(7, len(probs) - 1)) if float(probs[j]) >= 0.03]
                if not crossing:
                    continue
                j = rng.choice(crossing)  # the crossing token: top_p falls in the middle of its mass
                top_p = float(probs[:j].sum()) + float(probs[j]) / 2
            if top_k and top_p < 1.0:  # both: top-p on the whole distribution must keep another set than after top-k
                after_k = set(torch.nonzero(_probs64(logits, temperature, top_k, top_p) > 0).flatten().tolist())
                first_p = set(torch.nonzero(_probs64(logits, temperature, 0, top_p) > 0).flatten().tolist())
                if first_p & set(torch.topk(logits, top_k).indices.tolist()) == after_k:
                    continue
            if int((_probs64(logits, temperature, top_k, top_p) >= 0.03).sum()) >= 3:
                break
        out.append((name, logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)))
    return out


def _sample_alternatives(logits: torch.Tensor, p: SamplingParams) -> dict[str, torch.Tensor]:
    t, k, top = p.temperature, p.top_k, p.top_p
    return {
        "softmax(filter(logits)): the temperature is ignored": _probs64(logits, 1.0, k, top),
        "softmax(filter(logits * T)): the logits were multiplied by T; divide them by T":
            _probs64(logits * t * t, t, k, top),
        "softmax(filter(logits) / T): the filter ran before the division by T; divide first (top-p is taken "
        "over the tempered distribution)": torch.softmax(library_filter_logits(logits.double(), k, top) / t, dim=-1),
    }


def check_sample(ctx: StageContext) -> bool:
    sampler = _guarded(ctx, "Sampler()", ctx.part("sampler"))
    rng = ctx.rng("sample")
    draws = SAMPLE_DRAWS * (2 if ctx.full else 1)
    g = _torch_gen(rng.randrange(2**31))

    # Greedy rows: the argmax, beside sampling rows.
    case = "sample: greedy rows are the argmax"
    vocab = rng.randint(20, 60)
    logits = (torch.randn(6, vocab, generator=g) * 2).float()
    params = [SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(temperature=1e-6),
              SamplingParams(temperature=0.0, top_k=3), SamplingParams(temperature=0.8, top_p=0.9), SamplingParams()]
    gens = [None if p.greedy else _torch_gen(i) for i, p in enumerate(params)]
    got = _guarded(ctx, case, sampler.sample, logits.clone(), params, gens)
    want = logits.argmax(dim=-1).tolist()
    bad = [i for i, p in enumerate(params) if p.greedy and got[i] != want[i]]
    if bad:
        i = bad[0]
        ctx.report.record(case, False, f"row {i} (temperature {params[i].temperature:g}: greedy) got token {got[i]}, "
                                       f"the argmax is {want[i]}: a greedy request (temperature below 1e-5, "
                                       "params.greedy) takes the argmax of its row")
        return False
    ctx.report.record(case, True, f"{sum(p.greedy for p in params)} greedy rows among {len(params)}, temperature 1e-6 "
                                  "included")

    # The same seeds, the same tokens, whatever the global RNG; each row its own generator.
    case = "sample: the same seeds give the same tokens, each row from its own generator"
    with _GlobalRngKept():
        for _ in range(8):
            rows = (torch.randn(2, rng.randint(20, 40), generator=g) * 0.5).float()
            p = SamplingParams(temperature=1.5)
            a, b = rng.randrange(2**31), rng.randrange(2**31)
            torch.manual_seed(rng.randrange(2**31))
            both = _guarded(ctx, case, sampler.sample, rows.clone(), [p, p], [_torch_gen(a), _torch_gen(b)])
            torch.manual_seed(rng.randrange(2**31))
            again = _guarded(ctx, case, sampler.sample, rows.clone(), [p, p], [_torch_gen(a), _torch_gen(b)])
            if both != again:
                ctx.report.record(case, False, f"two calls with generators of the same seeds gave {both} and {again} "
                                               "(torch's global RNG was in another state): draw with the request's "
                                               "generator (torch.multinomial(probs, 1, generator=generators[i])), "
                                               "never the global RNG, so a seeded request is reproducible")
                return False
            torch.manual_seed(rng.randrange(2**31))
            alone = [_guarded(ctx, case, sampler.sample, rows[i:i + 1].clone(), [p], [_torch_gen(s)])[0]
                     for i, s in enumerate((a, b))]
            if alone != both:
                ctx.report.record(case, False, f"two rows sampled together gave {both}, each alone with the same "
                                               f"seed {alone}: row i must draw with generators[i] only, so a "
                                               "request's tokens do not depend on who else is in the batch")
                return False
    ctx.report.record(case, True, "8 trials with torch's global RNG reseeded between calls; rows alone and together")

    # The distribution of each hidden setting.
    for name, logits, params in _sample_settings(ctx.rng("sample-settings")):
        case = (f"sample: {name} (vocab {len(logits)}, T={params.temperature:g}, top_k={params.top_k}, "
                f"top_p={params.top_p:.3f}), {draws} draws")
        gens = [_torch_gen(rng.randrange(2**31)) for _ in range(SAMPLE_REQUESTS)]
        batch = logits.expand(SAMPLE_REQUESTS, -1).contiguous()
        drawn: list[int] = []
        for _ in range(draws // SAMPLE_REQUESTS):
            drawn += _guarded(ctx, case, sampler.sample, batch.clone(), [params] * SAMPLE_REQUESTS, gens)
        want = _probs64(logits, params.temperature, params.top_k, params.top_p)
        alternatives = {text: [alt] for text, alt in _sample_alternatives(logits, params).items()}
        if not _distribution_verdict(ctx, case, [(drawn, want)], "softmax(filter(logits / T))", alternatives):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# 3. Sampler.verify


def _verify_greedy_cases(rng: random.Random, g: torch.Generator) -> list[tuple[list[int], torch.Tensor]]:
    cases = []
    for _ in range(12):
        k, vocab = rng.randint(1, 5), rng.randint(12, 40)
        logits = torch.randn(k + 1, vocab, generator=g).float()
        target = logits.argmax(dim=-1).tolist()
        agree = rng.randint(0, k)
        drafts = target[:agree] + [rng.randrange(vocab) for _ in range(k - agree)]
        cases.append((drafts, logits))
    return cases


def check_verify(ctx: StageContext) -> bool:
    sampler = _guarded(ctx, "Sampler()", ctx.part("sampler"))
    rng = ctx.rng("verify")
    draws = VERIFY_DRAWS * (2 if ctx.full else 1)
    g = _torch_gen(rng.randrange(2**31))

    case = "verify: a greedy request keeps the guesses that equal the argmax, then the target's own"
    cases = _verify_greedy_cases(rng, g)
    for drafts, logits in cases:
        got = _guarded(ctx, case, sampler.verify, list(drafts), None, logits.clone(), SamplingParams(), None)
        want = library_verify_greedy(drafts, logits.argmax(dim=-1).tolist())
        if tuple(got) != (want.tokens, want.accepted):
            ctx.report.record(case, False, f"drafts {drafts}, target argmax {logits.argmax(dim=-1).tolist()}: expected "
                                           f"({want.tokens}, {want.accepted}), got {tuple(got)}")
            return False
    ctx.report.record(case, True, f"{len(cases)} hidden cases")

    vocab = rng.randint(10, 24)
    params = SamplingParams(temperature=rng.choice((0.8, 1.0, 1.3)), top_k=vocab - rng.randint(1, 3))

    def target(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        logits = (torch.randn(k + 1, vocab, generator=g) * 1.5).float()
        return logits, torch.stack([_probs64(row, params.temperature, params.top_k, 1.0) for row in logits])

    case = "verify: the same seed gives the same tokens"
    logits, p = target(3)
    q = torch.softmax(torch.randn(3, vocab, generator=g, dtype=torch.float64), dim=-1)
    with _GlobalRngKept():
        for _ in range(10):
            drafts = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(3)]
            seed = rng.randrange(2**31)
            torch.manual_seed(rng.randrange(2**31))
            first = _guarded(ctx, case, sampler.verify, list(drafts), q.float(), logits.clone(), params, _torch_gen(seed))
            torch.manual_seed(rng.randrange(2**31))
            second = _guarded(ctx, case, sampler.verify, list(drafts), q.float(), logits.clone(), params, _torch_gen(seed))
            if tuple(first) != tuple(second):
                ctx.report.record(case, False, f"drafts {drafts} verified twice with generators of the same seed gave "
                                               f"{tuple(first)} and {tuple(second)} (torch's global RNG was in another "
                                               "state): every random draw must use the request's generator")
                return False
    ctx.report.record(case, True, "10 trials with torch's global RNG reseeded between calls")

    # The first emitted token follows p_0, for a draft distribution and for a deterministic guess.
    for kind in ("q", "point"):
        k = 2 if kind == "q" else 3
        logits, p = target(k)
        if kind == "q":
            q = torch.softmax(torch.randn(k, vocab, generator=g, dtype=torch.float64) * 1.5, dim=-1)
            case = f"verify: a draft distribution q (k={k}): the first token follows p_0, {draws} verifications"
        else:
            q = None
            case = (f"verify: deterministic guesses (draft_probs None, k={k}): the first token follows p_0, "
                    f"{draws} verifications")
        fixed = [int(torch.argsort(p[i], descending=True)[1]) for i in range(k)]  # each p's second most likely
        gen = _torch_gen(rng.randrange(2**31))
        first: list[int] = []
        kept_counts = Counter()
        for _ in range(draws):
            drafts = fixed if q is None else [int(torch.multinomial(q[i], 1, generator=g)) for i in range(k)]
            tokens, kept = _guarded(ctx, case, sampler.verify, list(drafts), None if q is None else q.float(),
                                    logits.clone(), params, gen)
            first.append(tokens[0])
            kept_counts[kept] += 1
        q0 = q[0] if q is not None else torch.nn.functional.one_hot(torch.tensor(fixed[0]), vocab).double()
        accept0 = torch.where(q0 > 0, torch.clamp(p[0] / q0.clamp_min(1e-300), max=1.0), torch.zeros_like(q0))
        alternatives = {
            "the rule with the rejected token drawn from p itself: on a rejection draw from the residual "
            "norm(max(p - q, 0))": [_emitted(p[0], q0, accept0, p[0])],
            "a rule that keeps a guess with probability p(d) whatever q(d): keep it with min(1, p/q)":
                [_emitted(p[0], q0, p[0], _residual64(p[0], q0))],
        }
        if not _distribution_verdict(ctx, case, [(first, p[0])], "the target's p_0", alternatives):
            return False
        if not (kept_counts[0] and sum(kept_counts.values()) - kept_counts[0]):
            ctx.report.record(f"{case}: guesses kept and rejected", False, f"kept per verification: {dict(kept_counts)}: "
                                                                        "a test that never keeps (or never rejects) "
                                                                        "a guess tests half the rule")
            return False

    # The bonus token: with q = p every guess is kept, and one more token comes from p_k.
    k = 2
    logits, p = target(k)
    case = f"verify: every guess kept (q = p): the bonus token follows p_k, {draws} verifications"
    gen = _torch_gen(rng.randrange(2**31))
    bonus: list[int] = []
    for _ in range(draws):
        drafts = [int(torch.multinomial(p[i], 1, generator=g)) for i in range(k)]
        tokens, kept = _guarded(ctx, case, sampler.verify, list(drafts), p[:k].float(), logits.clone(), params, gen)
        if kept == k:
            bonus.append(tokens[-1])
    if len(bonus) < 0.9 * draws:
        ctx.report.record(case, False, f"only {len(bonus)} of {draws} verifications kept both guesses, though "
                                       "q equals the target's p (min(1, p/q) = 1): keep a guess when a uniform draw "
                                       "falls below min(1, p/q)")
        return False
    alternatives = {f"p_{k - 1} (the last guess's row): the bonus token comes from the row after the last guess, "
                    f"logits[{k}]": [p[k - 1]]}
    return _distribution_verdict(ctx, case, [(bonus, p[k])], f"the target's p_{k}", alternatives)


# ---------------------------------------------------------------------------------------------
# 4. NgramProposer.propose


def _seq(rid: str, tokens: list[int], prompt_len: int) -> Sequence:
    seq = Sequence(rid, list(tokens[:prompt_len]), SamplingParams(max_tokens=64, ignore_eos=True), arrival_s=0.0)
    seq.output_ids = list(tokens[prompt_len:])
    return seq


def check_proposer(ctx: StageContext) -> bool:
    rng = ctx.rng("proposer")
    case = "NgramProposer.propose on hidden requests (prompt + output), at most ks[i] guesses each"
    for trial in range(4):
        max_n = rng.randint(1, 4)
        proposer = _guarded(ctx, case, ctx.part("proposer"), max_n)
        seqs, ks = [], []
        for i in range(5):
            period = [rng.randrange(30) for _ in range(rng.randint(1, 6))]
            tokens = [rng.randrange(30) for _ in range(rng.randint(0, 40))] + period * rng.randint(1, 5)
            tokens += [rng.randrange(30) for _ in range(rng.randint(1, 3))]
            seqs.append(_seq(f"t{trial}-{i}", tokens, rng.randint(1, len(tokens))))
            ks.append(rng.choice((0, 1, 3, 4, 8)))
        got = _guarded(ctx, case, proposer.propose, list(seqs), list(ks))
        library = LibraryNgramProposer(max_n)
        for seq, k, proposal in zip(seqs, ks, got, strict=True):
            want = library.lookup(seq.all_ids, k) if k > 0 else []
            if proposal.tokens != want:
                hint = "" if k else ": k = 0 means no guesses"
                ctx.report.record(case, False, f"NgramProposer({max_n}).propose: a request of {len(seq.prompt_ids)} "
                                               f"prompt + {len(seq.output_ids)} output tokens ending "
                                               f"{seq.all_ids[-8:]}, k={k}: expected {want}, got {proposal.tokens} "
                                               f"(the lookup runs over prompt + output, n from {max_n} down to 1)"
                                               + hint)
                return False
        for seq in seqs:
            _guarded(ctx, case, proposer.rollback, seq, seq.num_tokens)
            _guarded(ctx, case, proposer.release, seq)
    ctx.report.record(case, True, "4 proposers (max_n 1-4) over 5 requests each; rollback and release accepted")
    return True


# ---------------------------------------------------------------------------------------------
# 5. Inside the engine


def _spec_config(**overrides: Any) -> EngineConfig:
    return h.engine_config(**{"speculative": "ngram:3", "num_speculative_tokens": SPEC_K, **overrides})


def library_passes(prompt: list[int], tokens: list[int], k: int = SPEC_K, max_n: int = 3) -> int:
    """Target passes the library's n-gram lookup and greedy verification take to produce ``tokens``
    after ``prompt`` (transformers' greedy tokens): the first from the prefill, then one per pass."""
    lookup = LibraryNgramProposer(max_n)
    context, done, passes = list(prompt) + list(tokens[:1]), 1, 1
    while done < len(tokens):
        drafts = lookup.lookup(context, min(k, len(tokens) - done - 1))
        kept = 0
        while kept < len(drafts) and drafts[kept] == tokens[done + kept]:
            kept += 1
        context += tokens[done:done + kept + 1]
        done, passes = done + kept + 1, passes + 1
    return passes


def _grounded_prompt(rng: random.Random, vocab: int, low: int = 4) -> list[int]:
    """16 random ids three times, then their first 4 again: a text the model may go on copying."""
    ids = h.random_prompt(rng, vocab, 16, low=low)
    return ids * 3 + ids[:4]


def _every_token_prompt(rng: random.Random, vocab: int, low: int = 4) -> list[int]:
    """Every token id from ``low`` once, in a hidden order: whatever token comes next, the lookup finds it
    earlier and proposes what followed it, so speculation runs at every step."""
    return rng.sample(range(low, vocab), vocab - low)


def _copied_prompt(rng: random.Random, model: h.CheckModel, params: SamplingParams) -> tuple[list[int], int]:
    """A hidden grounded prompt the model copies from (the library's lookup saves passes on its greedy
    continuation), and the library's passes; a small model copies some random texts and not others."""
    best: tuple[list[int], int] | None = None
    for _ in range(8):
        prompt = _grounded_prompt(rng, model.vocab, low=200)
        passes = library_passes(prompt, list(h.reference(model, prompt, params).tokens))
        if best is None or passes < best[1]:
            best = (prompt, passes)
        if passes <= params.max_tokens - 3:
            break
    return best


def check_engine_greedy(ctx: StageContext) -> bool:
    rng = ctx.rng("engine-greedy")
    model = h.embedded()
    params = SamplingParams(max_tokens=SPEC_TOKENS, ignore_eos=True)
    grounded, library = _copied_prompt(rng, model, params)
    chats = h.chat_trace(("What is the capital of France?", "Give me three prime numbers."), max_tokens=SPEC_TOKENS)
    trace = h.Trace("a grounded prompt (16 hidden ids three times) and 2 chat prompts", [grounded, *chats.prompts],
                    [params, *chats.params])
    result = h.run(model, _spec_config(block_size=5), ctx.parts(), trace)
    ok = h.compare(ctx.report, f"inside the engine, greedy n-gram speculation (k={SPEC_K}): {trace.describe()}, "
                               "the embedded model", result)
    if not ok:
        return False
    seq = result.engine.requests["r0"]
    passes, tokens = seq.num_target_passes, len(seq.output_ids)
    bound = math.floor(library * PASS_SLACK)
    good = passes <= bound and (passes < tokens or library >= tokens)
    detail = (f"the grounded prompt's {tokens} tokens took {passes} target passes ({seq.num_accepted} of "
              f"{seq.num_proposed} guesses kept); the library's lookup takes {library} on the same tokens")
    if library >= tokens:
        detail += " (the model copied none of 8 hidden prompts, so only that bound was checked)"
    if not good:
        detail += (": your guesses were kept less often. Propose what FOLLOWED the most recent earlier occurrence of "
                   "the longest matching suffix (tokens[start + n : start + n + k]), as many as k allows")
    if not ctx.report.record("fewer target passes than tokens on a grounded prompt", good, detail):
        return False

    hidden = h.hidden()
    bs = rng.choice((3, 7))
    prompts = [h.random_prompt(rng, hidden.vocab, rng.randint(6, 14)) for _ in range(3)]
    prompts += [_every_token_prompt(rng, hidden.vocab)]
    trace = h.Trace("a hidden trace", prompts, [SamplingParams(max_tokens=rng.randint(14, 24), ignore_eos=True)
                                                for _ in prompts], arrivals=[0, 0, 1, 2])
    result = h.run(hidden, _spec_config(block_size=bs, max_model_len=512), ctx.parts(), trace)
    ok = h.compare(ctx.report, f"inside the engine, greedy n-gram speculation: {trace.describe()}, blocks of {bs}, "
                               "the hidden model", result)
    if ok:
        totals = result.engine.spec_totals
        if not totals["proposed_tokens"]:
            return ctx.report.record("guesses verified on the hidden model", False, "no request got a guess, so "
                                     "speculation was never tested: does propose return the lookup's tokens?")
    return ok


@dataclass
class _Plan:
    """What the check-side proposer guesses after each first token ``t0``, and the target's p_1 there."""

    p1: dict[int, torch.Tensor]
    point: dict[int, int]
    q: dict[int, torch.Tensor]


class _TargetAwareProposer:
    """A check-side proposer: one guess per request at its first decode step. Even requests get a
    deterministic guess (``probs`` None); odd ones a guess drawn from a distorted ``q``, with ``q``."""

    def __init__(self, plan: _Plan, seed: int):
        self.plan, self.gen = plan, _torch_gen(seed)
        self.name = "check"

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Proposal]:
        out = []
        for seq, k in zip(seqs, ks, strict=True):
            t0 = seq.output_ids[0] if seq.output_ids else None
            if k <= 0 or t0 not in self.plan.p1:
                out.append(Proposal([]))
            elif int(seq.request_id[1:]) % 2 == 0:
                out.append(Proposal([self.plan.point[t0]]))
            else:
                q = self.plan.q[t0]
                out.append(Proposal([int(torch.multinomial(q, 1, generator=self.gen))], q[None].clone()))
        return out

    def rollback(self, seq: Sequence, num_valid: int) -> None:
        pass

    def release(self, seq: Sequence) -> None:
        pass


def _next_logits(model: h.CheckModel, prompt: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model.lm.model(torch.tensor([prompt])).logits[0, -1].float()


def _spread(p: torch.Tensor, tokens: int = 3, mass: float = 0.03) -> bool:
    """At least ``tokens`` tokens of ``mass`` or more each: a G-test over them has degrees of freedom."""
    return int((p >= mass).sum()) >= tokens


def _margin_ok(logits: torch.Tensor, temperature: float, top_k: int) -> bool:
    """The k-th and (k+1)-th logits far enough apart that the engine's logits keep the same top-k."""
    top = torch.topk(logits.double() / temperature, top_k + 1).values
    return float(top[top_k - 1] - top[top_k]) > 1e-2


@lru_cache(maxsize=4)
def _engine_plan(seed: int) -> tuple[list[int], float, torch.Tensor, _Plan]:
    """(prompt, temperature, p0, plan) for the engine's distribution run, from the hidden model."""
    model = h.hidden()
    rng = random.Random(seed)
    for _ in range(400):  # a prompt whose first two distributions are spread out: a test with degrees of freedom
        temperature = rng.choice((0.8, 1.0, 1.2))
        prompt = h.random_prompt(rng, model.vocab, rng.randint(6, 12))
        logits0 = _next_logits(model, prompt)
        if not _margin_ok(logits0, temperature, ENGINE_TOP_K):
            continue
        p0 = _probs64(logits0, temperature, ENGINE_TOP_K, 1.0)
        if not _spread(p0):
            continue
        support = torch.nonzero(p0 > 0).flatten().tolist()
        nexts = {t: _next_logits(model, prompt + [t]) for t in support}
        if all(_margin_ok(x, temperature, ENGINE_TOP_K) for x in nexts.values()) and all(
                _spread(_probs64(x, temperature, ENGINE_TOP_K, 1.0)) for t, x in nexts.items() if p0[t] >= 0.1):
            break
    else:
        raise RuntimeError(f"the check found no spread-out distribution for seed {seed}: a defect of the check")
    g = _torch_gen(seed)
    p1, point, q = {}, {}, {}
    for t, x in nexts.items():
        p1[t] = _probs64(x, temperature, ENGINE_TOP_K, 1.0)
        kept = torch.nonzero(p1[t] > 0).flatten().tolist()
        point[t] = int(torch.argsort(p1[t], descending=True)[1])  # the second most likely: kept about a third of the time
        outside = [u for u in rng.sample(range(4, model.vocab), 8) if u not in kept][:2]
        weights = torch.zeros(model.vocab, dtype=torch.float64)
        weights[kept] = p1[t][kept][torch.randperm(len(kept), generator=g)]  # the right mass on the wrong tokens
        weights[kept + outside] += 1.0 / len(kept + outside)
        q[t] = (weights / weights.sum()).float()
    return prompt, temperature, p0, _Plan(p1, point, q)


def check_engine_sampling(ctx: StageContext) -> bool:
    seed = ctx.subseed("engine-sampling")
    prompt, temperature, p0, plan = _engine_plan(seed)
    model = h.hidden()
    n = ENGINE_REQUESTS * (2 if ctx.full else 1)
    params = [SamplingParams(max_tokens=3, temperature=temperature, top_k=ENGINE_TOP_K, ignore_eos=True, seed=seed + i)
              for i in range(n)]
    trace = h.Trace("sampling requests", [list(prompt)] * n, params)
    proposer = _TargetAwareProposer(plan, seed)
    config = _spec_config(max_num_seqs=256, max_model_len=24, num_speculative_tokens=2)
    result = h.run(model, config, ctx.parts(proposer=lambda max_n: proposer), trace)
    what = (f"inside the engine: {n} sampling requests (T={temperature:g}, top_k={ENGINE_TOP_K}, each its own seed) on "
            f"the hidden model, one guess each at its first decode step")
    if result.failed:
        why = result.crash or next((e for e in result.errors if e), None) or "the engine stopped making progress"
        return ctx.report.record(what, False, why)
    totals = result.engine.spec_totals
    verified, kept = totals["verify_passes"], totals["accepted_tokens"]
    if verified < 0.9 * n or not kept or kept == totals["proposed_tokens"]:
        return ctx.report.record(what, False, f"{verified} verifications, {kept} guesses kept of "
                                              f"{totals['proposed_tokens']}: the run did not test both sides of the "
                                              "rule (is verify called, and does it keep and reject?)")
    ctx.report.record(what, True, f"{verified} guesses verified by your verify: {kept} kept, {verified - kept} rejected")
    first = [out[0] for out in result.outputs]
    ok = _distribution_verdict(ctx, f"inside the engine: the first tokens of {n} requests (your sample)", [(first, p0)],
                               "the target's distribution after the prompt")
    if not ok:
        return False
    for kind, parity in (("deterministic guesses", 0), ("guesses drawn from a distorted q", 1)):
        groups: dict[int, list[int]] = {}
        for i, out in enumerate(result.outputs):
            if i % 2 == parity and len(out) > 1:
                groups.setdefault(out[0], []).append(out[1])
        case = (f"inside the engine: the second tokens after {kind} (your verify), grouped by the first token, "
                f"{sum(map(len, groups.values()))} requests")
        if not _distribution_verdict(ctx, case, [(obs, plan.p1[t]) for t, obs in groups.items()],
                                     "the target's distribution after the prompt and the first token"):
            return False
    return True


def check_engine_seeds(ctx: StageContext) -> bool:
    """Your sampler and proposer on seeded sampling requests: the same tokens with other requests beside them."""
    rng = ctx.rng("engine-seeds")
    model = h.hidden()
    prompts = [_every_token_prompt(rng, model.vocab) for _ in range(3)]
    params = [SamplingParams(max_tokens=16, temperature=1.0, top_k=40, ignore_eos=True, seed=rng.randrange(10**6))
              for _ in prompts]
    others = [h.random_prompt(rng, model.vocab, rng.randint(8, 20)) for _ in range(3)]
    other_params = [SamplingParams(max_tokens=12, temperature=1.3, ignore_eos=True) for _ in others]
    config = _spec_config(block_size=rng.choice((3, 5, 7)), num_speculative_tokens=3, max_model_len=512)
    alone = h.run(model, config, ctx.parts(), h.Trace("seeded", prompts, params))
    mixed = h.run(model, config, ctx.parts(), h.Trace("seeded and others", others[:1] + prompts + others[1:],
                                                      other_params[:1] + params + other_params[1:],
                                                      arrivals=[0, 1, 0, 2, 0, 1]))
    case = (f"inside the engine: {len(prompts)} seeded sampling requests with your proposer (n-gram speculation), "
            "alone and with 3 other requests beside them")
    for run in (alone, mixed):
        if run.failed:
            why = run.crash or next((e for e in run.errors if e), None) or "the engine stopped making progress"
            return ctx.report.record(case, False, why)
    seeded = mixed.outputs[1:1 + len(prompts)]
    for i, (a, b) in enumerate(zip(alone.outputs, seeded, strict=True)):
        if a != b:
            j = next((x for x, (u, v) in enumerate(zip(a, b, strict=False)) if u != v), min(len(a), len(b)))
            return ctx.report.record(case, False, f"request {i} (seed {params[i].seed}) gave other tokens when other "
                                                  f"requests ran beside it (first difference at output position {j}): "
                                                  "every draw must come from the request's own generator")
    proposed = alone.engine.spec_totals["proposed_tokens"]
    if not proposed:
        return ctx.report.record(case, False, "no guess was proposed for the seeded requests, so speculation with "
                                              "sampling never ran")
    return ctx.report.record(case, True, f"identical tokens; {proposed} guesses verified "
                                         f"({alone.engine.spec_totals['accepted_tokens']} kept)")


def check(ctx: StageContext) -> None:
    units = [check_verify_greedy, check_acceptance_rule, check_filter_logits, check_ngram_lookup, check_sample,
             check_verify, check_proposer]
    passed = [unit(ctx) for unit in units]
    if not all(passed):
        return  # inside the engine it would fail the same way: fix the cases above first
    with _GlobalRngKept():
        check_engine_greedy(ctx) and check_engine_sampling(ctx) and check_engine_seeds(ctx)


STAGE = Stage(
    number=6, key="sampling", title="Sampling and speculation", file="06_sampling.py",
    components={"sampler": "Sampler", "proposer": "NgramProposer"}, chapter="12", minutes=90,
    task="The next token from logits (greedy, temperature, top-k, top-p, drawn with the request's own generator), "
         "speculative decoding's verification (greedy, and the rejection-sampling rule that keeps every token "
         "distributed as the target's) and prompt-lookup guesses.",
    check=check,
    requires=("filter_logits", "verify_greedy", "acceptance_probability", "residual_distribution", "ngram_lookup"),
    adapters={"sample": _as_tokens_per_row, "verify": _as_verdict, "verify_greedy": as_token_list_and_count,
              "propose": _as_proposals, "filter_logits": _as_vector_like, "residual_distribution": _as_vector_like,
              "acceptance_probability": _as_probability, "ngram_lookup": as_int_list},
    symbol="src/infer_lab/engine/sampling.py::Sampler, src/infer_lab/engine/proposers.py::NgramProposer",
)
