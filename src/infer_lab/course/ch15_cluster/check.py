"""Section 4 of chapter 15: the simulator checked against our engine (the notebook's ``simulator_vs_engine``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...analysis.plausibility import R2_FLOOR, caution, line_fit_flags
from ...cluster.engine_check import TOLERANCES, SimVsEngine
from ...models import load_model
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import CHECK_QUESTIONS, CHECK_SLOTS, NUMBER

if TYPE_CHECKING:
    from .scenario import Sizes


def check_model(lm: Any) -> Any:
    """The model the engine check serves: ``lm`` on a CPU, else the embedded SmolLM2 on the CPU
    (the check fits a CPU engine's step times; a GPU's are measured the same way by the CLI)."""
    if lm is not None and lm.device.type == "cpu":
        return lm

    return load_model("smollm2-135m", device="cpu")


def check_prompts(lm: Any, sizes: Sizes) -> list[list[int]]:
    """The engine check's prompts: chat questions, or random ids when the model has no tokenizer."""
    n = sizes.check_prompts
    if lm.tokenizer is None or lm.is_random:
        return [lm.random_ids(1, 12 + 5 * i, seed=i)[0].tolist() for i in range(n)]
    return [lm.chat_ids(CHECK_QUESTIONS[i % len(CHECK_QUESTIONS)])[0].tolist() for i in range(n)]


def run_check(lm: Any, sizes: Sizes, slots: int = CHECK_SLOTS) -> SimVsEngine:
    """Run the notebook's own experiment (``simulator_vs_engine`` of ``infer_lab/notebooks/15_cluster.py``)."""
    cpu = check_model(lm)
    return notebook_function(NUMBER, "simulator_vs_engine")(cpu, check_prompts(cpu, sizes), sizes.check_new_tokens, slots)


def check_text(c: SimVsEngine) -> str:
    """Part 4 in words: what the check can show (the same steps as the engine's) first, then the
    times, with a verdict on them only when the fitted step cost explains the steps."""
    r = c.ratios()
    flags = line_fit_flags("the engine's step time", c.fit.a_s, c.fit.b_s_per_token, c.fit.r2, r2_floor=R2_FLOOR)
    schedule = ("the simulator's scheduler made **the same steps as the engine's, step for step**"
                if c.same_schedule else "the simulator's scheduler made **DIFFERENT steps from the engine's**")
    times = (f"Simulated / measured: makespan {r['makespan']:.3f}, mean ITL {r['mean_itl']:.3f}, mean first-token "
             f"time {r['mean_first_token']:.3f} (tolerances {', '.join(f'{k} ±{v:.0%}' for k, v in TOLERANCES.items())})")
    if flags:
        times += (": **no verdict on times**, because the step cost they rest on is not a cost model. "
                  + caution(flags))
    else:
        times += f": on times they **{'agree' if c.within() else 'DO NOT agree'}**."
    return (
        f"Our engine served {c.requests} requests with {c.max_num_seqs} slots in {len(c.engine_step_tokens)} steps "
        f"({c.threads} torch thread(s)), and {schedule}: that is what this check tests. Its steps fit "
        f"`{c.fit.a_s * 1e3:.1f} ms + {c.fit.b_s_per_token * 1e3:.2f} ms x tokens` (R² {c.fit.r2:.2f}), and the "
        f"simulator replays the steps on that same fit, " + (
            f"so its busy time matches the engine's by construction (ratio {c.busy_ratio:.4f}: a least-squares "
            f"fit's residuals sum to zero over the same steps). " if c.same_schedule else
            f"but over other steps, so even its busy time tests the fit (ratio {c.busy_ratio:.4f}). ")
        + f"{times} "
        "What is not tested here: the roofline step costs that parts 1 and 2 simulate with."
    )


CHECK_COLUMNS = [
    Column("what", "quantity", "text"), Column("engine", "engine, measured (ms)"),
    Column("sim", "simulator (ms)"), Column("ratio", "sim / engine", "ratio", digits=4),
]


def check_table(c: SimVsEngine):
    rows = [{"what": "makespan", "engine": c.engine_wall_s * 1e3, "sim": c.sim_makespan_s * 1e3,
             "ratio": c.makespan_ratio},
            {"what": "busy time (sum of steps)", "engine": c.engine_busy_s * 1e3, "sim": c.sim_makespan_s * 1e3,
             "ratio": c.busy_ratio},
            {"what": "mean ITL", "engine": c.engine_mean_itl_s * 1e3, "sim": c.sim_mean_itl_s * 1e3,
             "ratio": c.itl_ratio},
            {"what": "mean first token since start", "engine": c.engine_mean_first_token_s * 1e3,
             "sim": c.sim_mean_first_token_s * 1e3, "ratio": c.first_token_ratio}]
    return people_table(rows, CHECK_COLUMNS)
