"""Chapter 13's side-by-side (a helper module of the chapter, not a chapter): our engine, HF, vLLM's CPU build and llama.cpp on the learner's machine.

The measurement is :func:`infer_lab.bench.contenders.side_by_side`; this module gives it the
chapter's sizes and says its result for people: the sentence that ranks the contenders (computed
from the table, tested on the inverted case), the table, the figure, and a saved run when an
engine cannot be installed here (labelled as saved, with its machine).
"""

from __future__ import annotations

import atexit
import json
from collections.abc import Callable, Sequence
from typing import Any

from ..bench import contenders
from ..bench.contenders import CONTENDERS, LABELS, SideBySide, Workload  # noqa: F401  (the page's names)
from ..bench.ledger import streamed_weight_bytes
from ..bench.llama_cpp import streamed_bytes
from ..models import EMBEDDED_NAME, embedded_gguf_path, load_model
from ..package_files import results_dir
from ..units import count, human
from .tables import Column, people_table

SAVED_PATTERN = "engines-vllm-cpu-*.json"


def workload(size: str) -> Workload:
    """``quick`` (the button, about a minute once the servers run): one round, one wave of requests
    per level, 16 output tokens; ``full``: two interleaved rounds, two waves, 64 output tokens."""
    if size == "quick":
        return Workload(input_tokens=128, output_tokens=16, concurrencies=(1, 4, 16), requests_per_user=1,
                        rounds=1, warmup=1, check_tokens=16)
    return Workload()


RUNNING: dict[str, contenders.Server] = {}  # servers the page started; stopped when Python exits


def start_servers(names: Sequence[str], workload: Workload,
                  progress: Callable[[str], Any] | None = None) -> tuple[dict[str, contenders.Server], dict[str, str]]:
    """Start each contender that can run here and is not running yet, one at a time (each start timed);
    returns (every running server, contender -> why it did not start)."""
    say = progress or (lambda _m: None)
    failed = {}
    for name in names:
        if name in RUNNING:
            continue
        if (why := contenders.why_unavailable(name)) is not None:
            failed[name] = why
            continue
        say(f"starting {LABELS[name]} ...")
        try:
            RUNNING[name] = contenders.start(name, workload)
        except (RuntimeError, OSError) as exc:
            failed[name] = str(exc).splitlines()[0]
    return {n: RUNNING[n] for n in names if n in RUNNING}, failed


@atexit.register
def stop_servers() -> None:
    """Stop every server the page started."""
    while RUNNING:
        contenders.stop(RUNNING.popitem()[1])


def servers_text(running: dict[str, contenders.Server], failed: dict[str, str]) -> str:
    """Which servers answer, after how long, and which could not start (markdown)."""
    lines = [f"- **{LABELS[n]}** at {s.url}: answered {s.start_s:.1f} s after its command"
             f"{', version ' + s.version if s.version else ''}" for n, s in running.items()]
    lines += [f"- **{LABELS[n]} did not start:** {why}" for n, why in failed.items()]
    return "\n".join(lines)


def missing_engines() -> dict[str, str]:
    """Contender -> why it cannot run on this machine (empty when all four can)."""
    return {c: why for c in contenders.CONTENDERS if (why := contenders.why_unavailable(c)) is not None}


def saved_run() -> tuple[SideBySide, str] | None:
    """The newest saved side-by-side and the line that labels it (machine, date, file), or ``None``."""
    folder = results_dir()
    files = sorted(folder.glob(SAVED_PATTERN), reverse=True) if folder.is_dir() else []
    for path in files:
        try:
            result = SideBySide.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        machine = result.machine
        cpu = (machine.get("cpu") or {}).get("model") or machine.get("hardware") or "unknown CPU"
        when = str(machine.get("date", ""))[:10]
        return result, (f"Saved run, not measured on this machine: {cpu}, {machine.get('cpu_count', '?')} cores, "
                        f"{when} ({path.name})")
    return None


def ranking_text(result: SideBySide) -> str:
    """Which contender led at each concurrency, and our engine against vLLM-CPU; every number from ``result``."""
    lines = []
    for c in result.workload.concurrencies:
        rated = [(s.contender, result.median(s.contender, c)) for s in result.servers]
        rated = [(name, tps) for name, tps in rated if tps]
        if not rated:
            continue
        rated.sort(key=lambda x: -x[1])
        leader, best = rated[0]
        rest = ", ".join(f"{LABELS[n]} {tps:,.1f}" for n, tps in rated[1:])
        lines.append(f"- concurrency {c}: **{LABELS[leader]}** led with {best:,.1f} output tokens/s"
                     + (f" (then {rest})." if rest else "."))
    ratios = result.engine_vs("vllm-cpu")
    if ratios:
        parts = []
        for c, r in ratios.items():
            spread = f", rounds {min(r['rounds']):.2f}–{max(r['rounds']):.2f}" if len(r["rounds"]) > 1 else ""
            parts.append(f"{r['median']:.2f}× at concurrency {c}{spread}")
        ahead = [c for c, r in ratios.items() if r["median"] >= 1.0]
        behind = [c for c, r in ratios.items() if r["median"] < 1.0]
        verdict = ("ahead of or level with vLLM-CPU at every level" if not behind else
                   "behind vLLM-CPU at every level" if not ahead else
                   f"ahead at {', '.join(map(str, ahead))} and behind at {', '.join(map(str, behind))}")
        lines.append(f"\nOur engine's output tokens/s over vLLM-CPU's, same run: {'; '.join(parts)}: **{verdict}**.")
        if any(len(r["rounds"]) > 1 and min(r["rounds"]) < 1.0 <= max(r["rounds"]) for r in ratios.values()):
            lines.append("At least one level changed sides between rounds: on this machine the order there "
                         "is within the noise.")
    return "\n".join(lines)


def prediction_bytes() -> dict[str, int]:
    """Weight bytes one decode token streams for the embedded model: fp32 (ours, HF, vLLM) and the
    GGUF file's own tensors (llama.cpp)."""
    return {"fp32": streamed_weight_bytes(load_model(EMBEDDED_NAME)),
            "gguf": streamed_bytes(embedded_gguf_path())["bytes_per_token"]}


def why_text(result: SideBySide) -> str:
    """Where each lead or lag comes from, said from the run's own numbers: requests served one at
    a time (tok/s flat with concurrency), bytes per token (the ledger), or time per step at equal bytes."""
    lines = []
    cs = result.workload.concurrencies
    lo, hi = cs[0], cs[-1]
    ours_row = result.ledger.get("ours", {})
    for server in result.servers:
        name = server.contender
        a, b = result.median(name, lo), result.median(name, hi)
        if not (a and b):
            continue
        if name in contenders.ONE_AT_A_TIME:
            ttft = result.median(name, hi, "ttft_ms_p50")
            lines.append(f"- **{LABELS[name]}** answers one request at a time: from concurrency {lo} to {hi} its "
                         f"output tokens/s went {a:,.1f} → {b:,.1f} ({b / a:.1f}×), and at {hi} a request waited "
                         f"{ttft / 1000:,.1f} s for its first token (TTFT p50): the queue.")
    gguf, fp32 = result.ledger.get("llama-cpp", {}).get(lo), ours_row.get(lo)
    if gguf and fp32 and result.median("llama-cpp", lo) and result.median("ours", lo):
        l_tpot, o_tpot = result.median("llama-cpp", lo, "tpot_ms_p50"), result.median("ours", lo, "tpot_ms_p50")
        l_ttft, o_ttft = result.median("llama-cpp", lo, "ttft_ms_p50"), result.median("ours", lo, "ttft_ms_p50")
        lines.append(f"- **Bytes per token:** llama.cpp's file (4-bit layers, an 8-bit embedding that is also the LM "
                     f"head) streams {gguf['bytes_per_step'] / 1e6:,.0f} MB per decode step against "
                     f"{fp32['bytes_per_step'] / 1e6:,.0f} MB for fp32 "
                     f"({fp32['bytes_per_step'] / gguf['bytes_per_step']:.1f}× fewer). With one user its decode steps "
                     f"took {l_tpot:,.1f} ms against our {o_tpot:,.1f} ms (TPOT p50: "
                     f"{'faster' if l_tpot < o_tpot else 'not faster'} with fewer bytes), and its first token "
                     f"{l_ttft:,.0f} ms against our {o_ttft:,.0f} ms (TTFT p50; its prompts arrive as text).")
    vllm = result.ledger.get("vllm-cpu", {})
    for c in cs:
        if c in vllm and c in ours_row:
            lines.append(f"- **Same bytes, time per step** (concurrency {c}): vLLM-CPU and our engine stream the "
                         f"same {ours_row[c]['bytes_per_step'] / 1e6:,.0f} MB per decode step (fp32 weights and "
                         f"K/V), so the gap is how fast a step runs: the step rates their TPOT implies stream "
                         f"{ours_row[c]['fraction_of_copy']:.0%} (ours) and {vllm[c]['fraction_of_copy']:.0%} (vLLM) "
                         "of this machine's copy bandwidth.")
    vllm_server = next((s for s in result.servers if s.contender == "vllm-cpu"), None)
    if vllm_server is not None and vllm_server.notes.get("worker_cores"):
        n, reserved = len(vllm_server.notes["worker_cores"]), vllm_server.notes.get("reserved_cores", [])
        lines.append(f"- vLLM 0.32.0's CPU build bound its model worker to {count(n, 'core')} and reserved "
                     f"{count(len(reserved), 'core')} for its scheduler process (its log: `core ids="
                     f"{vllm_server.notes['worker_cores']}`, `reserved_cpus={reserved}`); ours runs the model on "
                     f"{count(result.machine.get('torch_threads') or 0, 'torch thread')} and answers HTTP from the same "
                     "process.")
    if any(lv.contender == "vllm-cpu" for lv in result.levels):
        lines.append("- vLLM ran as `infer-lab engines launch vllm --cpu` starts it: eager (`--enforce-eager`, "
                     "no torch.compile) and without the tcmalloc/libiomp `LD_PRELOAD` its log recommends; neither "
                     "was measured the other way here.")
    return "\n".join(lines)


LEDGER_NOTE = ("The ledger assumes that a decode step carries as many sequences as the concurrency (one for "
               "a server that answers one request at a time) and lasts the TPOT p50, prompt chunks that "
               "share it included; that each sequence's cache holds the mean context of its decode steps; and "
               "K/V in fp32 (fp16 for llama.cpp). Copy bandwidth: {how}")


def agreement_text(result: SideBySide) -> str:
    """Greedy agreement with transformers, one clause per contender."""
    parts = []
    for a in result.agreement:
        parts.append(f"{LABELS[a.contender]}: {a.matches} of {a.prompts} prompts identical ({a.compared})")
    tokens = result.workload.check_tokens
    return f"Greedy answers of up to {tokens} tokens against transformers' own: " + "; ".join(parts) + "." if parts else ""


def starts_text(result: SideBySide) -> str:
    return "Start, command to first healthy answer: " + ", ".join(
        f"{LABELS[s.contender]} {s.start_s:.1f} s" for s in result.servers) + "."


def skipped_text(result: SideBySide) -> str:
    lines = [f"- **{LABELS.get(c, c)} did not run here:** {why}" for c, why in result.skipped.items()]
    return "\n".join(lines + [f"- **Note:** {note}" for note in result.notes])


def contenders_text(result: SideBySide) -> str:
    """Everything said about one run, in reading order (markdown)."""
    w = result.workload
    text_only = [LABELS[s.contender] for s in result.servers if not s.takes_token_ids]
    head = (f"Every contender got the same {w.input_tokens}-token prompts as token ids"
            + (f" ({', '.join(text_only)}: as the text those ids decode to, which its tokenizer reads back "
               "as about as many tokens)" if text_only else "")
            + f" and produced {w.output_tokens} tokens each, end of answer suppressed, through the same client; "
            f"{w.rounds} interleaved round{'s' if w.rounds > 1 else ''}, each level with fresh prompts, after "
            f"{count(w.warmup, 'warm-up request')}; our engine over vLLM is the median of the per-round ratios.")
    copy = next((row.get("copy_how") for d in result.ledger.values() for row in d.values() if row.get("copy_how")),
                "measured once in the process that ran the client.")
    return "\n\n".join(t for t in (head, ranking_text(result), why_text(result), LEDGER_NOTE.format(how=copy),
                                   agreement_text(result), starts_text(result), skipped_text(result)) if t)


COLUMNS = [
    Column("contender", "contender", "text"), Column("concurrency", "concurrency", "int"),
    Column("output_tokens_per_s", "output tok/s (median)"),
    Column("output_tokens_per_s_min", "min"), Column("output_tokens_per_s_max", "max"),
    Column("ttft_ms_p50", "TTFT p50 (ms)"), Column("ttft_ms_p99", "TTFT p99 (ms)"),
    Column("itl_ms_p50", "ITL p50 (ms)"), Column("itl_ms_p99", "ITL p99 (ms)"),
    Column("rss_bytes", "resident memory (RSS summed over its processes)", "bytes"), Column("ledger_bytes_per_step", "bytes per decode step", "bytes"),
    Column("ledger_GBps", "GB/s implied (ledger)"), Column("ledger_fraction_of_copy", "of copy bandwidth", "pct"),
    Column("agreement", "greedy = transformers", "text"), Column("start_s", "start (s)"),
]


def contenders_table(result: SideBySide):
    """One row per contender and concurrency (medians over rounds, the spread beside them)."""
    return people_table([{**row, "contender": LABELS[row["contender"]]} for row in result.rows()], COLUMNS)


def contenders_figure(result: SideBySide, source: str = ""):
    """Output tokens/s against concurrency, one line per contender, the rounds' spread as a band."""
    from ..figures import subplots  # defers matplotlib

    fig, ax = subplots(figsize=(7, 4))
    for server in result.servers:
        cs = [c for c in result.workload.concurrencies if result.median(server.contender, c)]
        if not cs:
            continue
        med = [result.median(server.contender, c) for c in cs]
        lo = [result.spread(server.contender, c)[0] for c in cs]
        hi = [result.spread(server.contender, c)[1] for c in cs]
        line, = ax.plot(cs, med, marker="o", label=f"{LABELS[server.contender]} ({human(med[-1])} tok/s at {cs[-1]})")
        ax.fill_between(cs, lo, hi, color=line.get_color(), alpha=0.15)
    ax.set(xscale="log", xlabel="concurrent requests", ylabel="output tokens/s", ylim=(0, None))
    ax.set_xticks(list(result.workload.concurrencies), [str(c) for c in result.workload.concurrencies])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Same workload, same client{': ' + source if source else ''}", fontsize=10)
    fig.tight_layout()
    return fig
