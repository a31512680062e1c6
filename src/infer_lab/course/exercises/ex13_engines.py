"""Chapter 13's exercises: TPOT, why token-weighted ITL and request-weighted TPOT differ, and goodput."""

from __future__ import annotations

from ...loadgen.client import RequestRecord
from ...loadgen.metrics import SLO, summarize_records
from . import Exercise
from .checking import Mistake

NUMBER = "13"
SLUG = "engines"
TITLE = "13 · Engines"


def _record(token_times_s: list[float], start_s: float = 0.0, ok: bool = True) -> RequestRecord:
    """A finished request that received one text chunk (one token) at each of ``token_times_s`` after sending."""
    return RequestRecord(session_id="s", turn=0, start_s=start_s, ok=ok, ttft_s=token_times_s[0],
                         e2e_s=token_times_s[-1], chunk_times_s=[start_s + t for t in token_times_s],
                         completion_tokens=len(token_times_s), usage_source="usage")


def _even(ttft: float, gap: float, tokens: int) -> list[float]:
    return [ttft + i * gap for i in range(tokens)]


TPOT_CASES = ((0.2, 1.2, 11), (0.05, 0.05, 1), (0.5, 2.5, 101), (0.1, 0.3, 2))


def check_tpot(fns, r) -> None:
    for ttft, e2e, tokens in TPOT_CASES:
        case = f"TTFT {ttft:g} s, E2E {e2e:g} s, {tokens} output tokens"
        got = r.call(fns.tpot_s, ttft, e2e, tokens, case=case)
        rec = RequestRecord("s", 0, 0.0, ok=True, ttft_s=ttft, e2e_s=e2e, completion_tokens=tokens)
        expected = rec.tpot_s
        if expected is None:
            r.equal(case, got, None, hint="with one token there is no time per output token: return None")
            continue
        r.close(case, got, expected, unit="s/token",
                wrong={"E2E / tokens: the first token's wait is TTFT, not a decode step": e2e / tokens,
                       "(E2E - TTFT) / tokens: n tokens have n - 1 gaps after the first": (e2e - ttft) / tokens})


WORKLOADS = (
    ("one long answer (101 tokens, 10 ms apart) and nine short ones (11 tokens, 50 ms apart)",
     [_even(0.1, 0.01, 101)] + [_even(0.1, 0.05, 11)] * 9),
    ("two requests, 5 tokens 20 ms apart and 3 tokens 100 ms apart",
     [_even(0.3, 0.02, 5), _even(0.2, 0.1, 3)]),
    ("uneven gaps within a request", [[0.1, 0.11, 0.31, 0.32, 0.52], _even(0.1, 0.05, 5)]),
)


def check_means(fns, r) -> None:
    for name, times in WORKLOADS:
        case = name
        got = r.call(fns.itl_and_tpot_means, [list(t) for t in times], case=case)
        row = summarize_records([_record(t) for t in times])
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            r.record(case, False, f"return a pair (ITL mean, TPOT mean) in seconds, got {got!r:.60}")
            continue
        itl, tpot = row["itl_ms_mean"] / 1e3, row["tpot_ms_mean"] / 1e3
        r.close(f"{case}: mean ITL (every gap of every request)", got[0], itl, rel_tol=1e-9, unit="s",
                wrong={"the request-weighted mean (that is TPOT): ITL pools every gap, so long answers "
                       "weigh more": tpot} if abs(itl - tpot) > 1e-9 else None)
        r.close(f"{case}: mean TPOT (one value per request)", got[1], tpot, rel_tol=1e-9, unit="s",
                wrong={"the token-weighted mean (that is ITL): TPOT is one value per request, averaged over "
                       "requests": itl} if abs(itl - tpot) > 1e-9 else None)


def _goodput_records() -> list[RequestRecord]:
    return [_record(_even(0.1, 0.02, 20)), _record(_even(0.6, 0.02, 20)), _record(_even(0.1, 0.08, 20)),
            _record(_even(0.2, 0.03, 1)), _record(_even(0.3, 0.04, 10)),
            RequestRecord("s", 0, 0.0, ok=False, error="HTTP 503")]


GOODPUT_SLOS = ((500.0, 50.0), (200.0, 30.0), (1000.0, 100.0), (150.0, 25.0))


def check_goodput(fns, r) -> None:
    records = _goodput_records()
    duration = 4.0
    plain = [(rec.ttft_s, rec.tpot_s) if rec.ok else None for rec in records]
    for ttft_slo, tpot_slo in GOODPUT_SLOS:
        case = f"6 requests in {duration:g} s (one failed, one with a single token), SLO TTFT <= {ttft_slo:g} ms " \
               f"and TPOT <= {tpot_slo:g} ms"
        got = r.call(fns.goodput_per_s, list(plain), ttft_slo, tpot_slo, duration, case=case)
        expected = summarize_records(records, SLO(ttft_ms=ttft_slo, tpot_ms=tpot_slo), duration)["goodput_per_s"]
        r.close(case, got, expected, unit="requests/s",
                mistakes=[Mistake(1e3, "1000x too large: compare seconds with SLOs in milliseconds")],
                hint="a request counts when it succeeded and meets every SLO; a request of one token has no "
                     "TPOT and meets the TPOT SLO; a failed request never counts")


EXERCISES = [
    Exercise("tpot_s", "Time per output token", "implement",
             "Compute a request's TPOT from its TTFT, E2E and token count; checked against the load "
             "generator's RequestRecord.", check_tpot),
    Exercise("itl_and_tpot_means", "Token-weighted ITL vs request-weighted TPOT", "predict",
             "Predict both means for a workload with one long answer among short ones; checked against the "
             "load generator's metrics.", check_means),
    Exercise("goodput_per_s", "Goodput", "implement",
             "Count the requests per second that met every SLO; checked against the load generator's metrics "
             "with SLOs.", check_goodput),
]
