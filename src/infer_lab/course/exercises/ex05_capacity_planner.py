"""Chapter 05's exercises: dollars per million tokens, users within a latency SLO, context against users."""

from __future__ import annotations

from ...analysis import capacity, memory
from ...analysis.roofline import gpu_roof, predict_decode
from ...catalog import get_gpu
from ...shape import model_shape
from . import Exercise
from .checking import Mistake, factor_of_2

NUMBER = "05"
SLUG = "capacity_planner"
TITLE = "05 · Capacity planner"

PLANS = (("mistral-7b", "H100-SXM", 1), ("llama-3-8b", "L4", 1), ("llama-3-70b", "H100-SXM", 4),
         ("qwen2.5-7b", "A100-80GB", 1))


def check_usd_per_million(fns, r) -> None:
    for model, gpu, n_gpus in PLANS:
        p = capacity.plan(model, gpu, n_gpus=n_gpus, context=4096, itl_slo_ms=50)
        case = f"{model} on {n_gpus}x {gpu}: ${p.usd_per_hour:g}/hour, {p.tokens_per_s:,.0f} output tokens/s"
        got = r.call(fns.usd_per_million_tokens, p.usd_per_hour, p.tokens_per_s, case=case)
        r.close(case, got, p.usd_per_m_output_tokens, rel_tol=1e-9, unit="$/M tokens",
                mistakes=[Mistake(3600.0, "3600x too large: an hour has 3600 seconds of tokens"),
                          Mistake(1 / 3600, "3600x too small: divide the hourly price by the tokens of an hour"),
                          Mistake(1e-3, "1000x too small: per thousand tokens instead of per million"),
                          Mistake(1e3, "1000x too large: per billion tokens instead of per million")])


SLO_CASES = (("mistral-7b", "H100-SXM", 4096, 20.0), ("mistral-7b", "H100-SXM", 4096, 8.0),
             ("llama-3-8b", "A100-80GB", 8192, 30.0), ("qwen2.5-7b", "H200", 2048, 15.0),
             ("mistral-7b", "L4", 4096, 10.0),
             # loose SLOs: memory caps the batch before latency does
             ("mistral-7b", "H100-SXM", 4096, 200.0), ("llama-3-8b", "A100-80GB", 8192, 100.0))


def _slo_only_users(model: str, gpu: str, context: int, slo_ms: float, limit: int = 1 << 16) -> int:
    """The largest batch within the SLO with no memory cap at all (what ignoring memory_users gives)."""
    roof = gpu_roof(gpu)
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if predict_decode(model, roof, mid, context).time_s * 1e3 <= slo_ms:
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_users_within_slo(fns, r) -> None:
    for model, gpu, context, slo in SLO_CASES:
        p = capacity.plan(model, gpu, context=context, itl_slo_ms=slo)
        case = f"{model} on one {gpu}, context {context:,}, ITL SLO {slo:g} ms, {p.max_users_memory} users fit memory"
        got = r.call(fns.users_within_itl_slo, model, gpu, context, slo, p.max_users_memory, case=case)
        wrong = {}
        if p.max_users_within_slo != p.max_users_memory:
            wrong["the memory limit: the SLO caps the batch first here (or the SLO in ms was compared with "
                  "predict_decode's time_s in seconds, which every batch meets)"] = p.max_users_memory
        else:
            wrong["more users than fit in memory: the batch is capped by memory_users too"] = \
                _slo_only_users(model, gpu, context, slo)
        if p.max_users_within_slo:
            wrong["nobody: is the SLO in ms compared with a time in seconds the wrong way round?"] = 0
        r.close(case, got, p.max_users_within_slo, unit="users", wrong=wrong)


TRADEOFF_CASES = (("mistral-7b", 4096), ("mistral-7b", 8192), ("mistral-7b", 32768), ("llama-3-8b", 16384),
                  ("mistral-7b-v0.1", 16384), ("mistral-7b-v0.1", 32768),
                  ("mistral-7b-v0.1", 2048),  # shorter than the window: every token is cached
                  ("llama-3-70b", 4096))  # bf16 weights larger than the GPU: a negative budget


def check_users_at_context(fns, r) -> None:
    gpu = "H100-SXM"
    for model, context in TRADEOFF_CASES:
        s = model_shape(model)
        windows = set(s.layer_windows)
        window = windows.pop() if len(windows) == 1 else None
        fit = memory.fit(model, get_gpu(gpu).memory_bytes, context)
        per_token = memory.kv_bytes_per_token(model)
        note = f", sliding window {window:,} on every layer" if window else ""
        case = f"{model} on one {gpu}: KV budget {fit.kv_budget_bytes / 1e9:.1f} GB, context {context:,}{note}"
        got = r.call(fns.users_at_context, fit.kv_budget_bytes, per_token, context, window, case=case)
        wrong = {}
        if window and window < context:
            wrong["the whole context cached: a sliding-window layer keeps only its last `window` tokens"] = \
                fit.kv_budget_bytes // (per_token * context)
        if window and window > context:
            wrong["the window cached although the context is shorter: a user caches min(context, window) "
                  "tokens"] = fit.kv_budget_bytes // (per_token * window)
        hint = ""
        if fit.kv_budget_bytes < 0:
            hint = "the weights alone overflow the GPU: nobody fits (0 users, not a negative number)"
        r.close(case, got, fit.max_users, unit="users", wrong=wrong or None, mistakes=factor_of_2(), hint=hint)


EXERCISES = [
    Exercise("usd_per_million_tokens", "Dollars per million tokens", "implement",
             "Turn a GPU's hourly price and its output tokens/s into $ per million tokens; checked against "
             "the capacity planner's plans.", check_usd_per_million),
    Exercise("users_within_itl_slo", "Users within an ITL SLO", "implement",
             "Find the largest batch whose predicted decode step meets an inter-token-latency SLO; checked "
             "against the capacity planner on catalog GPUs.", check_users_within_slo),
    Exercise("users_at_context", "Context against users", "predict",
             "Predict how many users a KV budget holds at a context length (sliding windows included); "
             "checked against the memory equation's fit.", check_users_at_context),
]
