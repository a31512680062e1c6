"""The page's opening: talk 1's workshop runs (HF baseline, then vLLM one setting at a time), cited with their sources."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from ...units import count
from ..tables import Column, people_table


@dataclass(frozen=True)
class ReportedRun:
    """One row of a benchmark reported elsewhere (not measured here), with what it was measured at
    and where each of its numbers comes from.

    ``output_tokens_per_s`` is ``None`` where no number was given for the row (only words, in
    ``said``); ``ttft_ms`` and ``itl_ms`` likewise (milliseconds). ``said_vs_baseline`` is a ratio
    to the baseline the speaker said aloud ("almost 15x"). ``line`` is the line of talk 1's
    transcript with the speaker's words for the row and ``quote`` those words, verbatim, where they
    hold numbers. A number comes from the transcript unless its field is in ``from_table`` (the
    course brief's vLLM table of the workshop, approximate there: "~736") or in ``from_setup`` (how
    the workshop's benchmark was set up, from the course brief's list of its pitfalls); neither is in
    the transcript. ``units_from_table`` names the fields whose number the transcript gives without a
    unit (the brief's table gives it).
    """

    config: str
    output_tokens_per_s: float | None
    requests_in_flight: int | None
    ttft_ms: float | None = None
    itl_ms: float | None = None
    said: str = ""  # the speaker's words for this row, paraphrased
    said_vs_baseline: float | None = None
    line: int | None = None
    quote: str = ""
    from_table: tuple[str, ...] = ()
    from_setup: tuple[str, ...] = ()
    units_from_table: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """A number credited to the transcript must stand in the row's quote of it."""
        if wrong := self.not_in_quote():
            raise ValueError(f"{self.config}: {', '.join(wrong)} credited to {TALK_1} but not in its quote "
                             f"{self.quote!r}; put the field in from_table or from_setup, or quote the words")

    def not_in_quote(self) -> list[str]:
        """The fields credited to the transcript whose number is not in ``quote`` as a whole number."""
        return [name for name in NUMBER_WORDS
                if (self.source_of(name) or "").startswith(TALK_1)
                and not re.search(rf"(?<![\d.,]){re.escape(_number(getattr(self, name)))}(?![\d]|[.,]\d)", self.quote)]

    def source_of(self, name: str) -> str | None:
        """Where the number in field ``name`` comes from; ``None`` when the row has no such number."""
        if getattr(self, name) is None:
            return None
        if name in self.from_setup:
            return BRIEF_SETUP
        return WORKSHOP_TABLE if name in self.from_table else f"{TALK_1}, line {self.line}"

    @property
    def source(self) -> str:
        """Every number of the row with its source, grouped by source ("" for a row of words only)."""
        groups: dict[str, list[str]] = {}
        for name, words in NUMBER_WORDS.items():
            if (where := self.source_of(name)) is not None:
                unit = " (no unit spoken; ms from the brief's table)" if name in self.units_from_table else ""
                groups.setdefault(where, []).append(f"{words} {_number(getattr(self, name))}{unit}")
        words_only = f"{TALK_1}, line {self.line}: words only" if self.line is not None else ""
        return "; ".join(f"{where}: {', '.join(items)}" for where, items in groups.items()) or words_only


TALK_1 = "talk 1"
WORKSHOP_TABLE = "the course brief's table of the workshop's vLLM results, approximate there (not in the transcript)"
BRIEF_SETUP = ("the course brief's list of the workshop's pitfalls, which says how its benchmark was set up "
               "(not in the transcript)")
SHORT_SOURCE = {WORKSHOP_TABLE: "the brief's table", BRIEF_SETUP: "the brief's list of pitfalls"}
# The numbered fields of a ReportedRun, in the words the source column uses.
NUMBER_WORDS = {"output_tokens_per_s": "output tok/s", "said_vs_baseline": "ratio to the baseline said aloud",
                "ttft_ms": "TTFT", "itl_ms": "ITL", "requests_in_flight": "requests in flight"}


def _number(value: float) -> str:
    """A reported number as the source wrote it: no trailing zeros, thousands separated."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,g}"


WORKSHOP_SETUP = "an H100 serving Mistral-7B"
# Talk 1 (the workshop), the presenter of its vLLM benchmark notebook, lines 107-111: an HF transformers
# baseline, then vLLM with one setting added per row. The transcript gives the baseline's 51 tok/s, TTFT
# "54" and ITL "19" (no units) and "almost 15x" for vLLM's default; the ms units, the 736 and 1,034 tok/s
# come from the course brief's vLLM table ("~736", "~1034"), and the load (1 request against 10 in flight)
# from the brief's list of the workshop's pitfalls; neither is in the transcript. The KV-quantization and
# speculative rows were given in words only.
_SETUP_LOAD = ("requests_in_flight",)
WORKSHOP_RUNS = (
    ReportedRun("HF transformers baseline", 51, 1, ttft_ms=54, itl_ms=19,
                said="the raw model behind an API: send the text, get the answer back", line=107,
                quote="hugging phase has a throughput of like around 51 tokens per second. Time to first token "
                      "was like 54 and then the inter token latency was 19",
                from_setup=_SETUP_LOAD, units_from_table=("ttft_ms", "itl_ms")),
    ReportedRun("vLLM default (paged attention, continuous batching, KV cache)", 736, 10,
                said="throughput \"almost 15x\"; TTFT rises, ITL goes down", said_vs_baseline=15, line=109,
                quote="your throughput is like almost 15x",
                from_table=("output_tokens_per_s",), from_setup=_SETUP_LOAD),
    ReportedRun("+ prefix caching", 1034, None,
                said="throughput up again, TTFT down, ITL about the same, KV use per user down", line=109,
                from_table=("output_tokens_per_s",)),
    ReportedRun("+ KV-cache quantization", None, None,
                said="throughput, TTFT and ITL about the same; KV usage goes down", line=111),
    ReportedRun("+ speculative decoding", None, None,
                said="results about the same, a little less KV usage", line=111),
)
# vLLM's own defaults moved under this ladder: since vLLM 0.8.0 (March 2025) the V1 engine is the default,
# and V1 turns on automatic prefix caching and chunked prefill without a flag (vLLM V1 user guide; the
# "Optimization and Tuning" page for V1; Red Hat, "Performance boosts in vLLM 0.8.1: switching to the V1
# engine", 2025-04-28). `--no-enable-prefix-caching` gives back the workshop's "default" row.
VLLM_V1_DEFAULT_SINCE = "0.8.0"


def _change_words(before: float, after: float) -> str:
    """"raised it to" / "lowered it to" / "left it at": the direction of ``after`` against ``before``."""
    if after > before:
        return "raised it to"
    if after < before:
        return "lowered it to"
    return "left it at"


def numbers_by_source(runs: tuple[ReportedRun, ...] = WORKSHOP_RUNS) -> dict[str, list[str]]:
    """Every number of ``runs``, said with its row, grouped by where it comes from: talk 1's transcript
    (one group, its lines named), the course brief's table, or the brief's list of pitfalls (the setup)."""
    groups: dict[str, list[str]] = {}
    lines = sorted({r.line for r in runs if r.line is not None and any(
        (r.source_of(n) or "").startswith(TALK_1) for n in NUMBER_WORDS)})
    transcript = (f"the transcript of {TALK_1} (line{'s' if len(lines) > 1 else ''} "
                  f"{', '.join(map(str, lines))})")
    for run in runs:
        by_row: dict[str, list[str]] = {}
        for name, words in NUMBER_WORDS.items():
            if (where := run.source_of(name)) is None:
                continue
            unit = " (no unit spoken)" if name in run.units_from_table else ""
            key = where if where in SHORT_SOURCE else transcript
            by_row.setdefault(key, []).append(f"{words} {_number(getattr(run, name))}{unit}")
        for key, items in by_row.items():
            groups.setdefault(key, []).append(f"{run.config}, {', '.join(items)}")
    return groups


def _from(run: ReportedRun, name: str) -> str:
    """A short tag for the source of one number: "talk 1", "the brief's table" or "the brief's list of pitfalls"."""
    return SHORT_SOURCE.get(run.source_of(name) or "", TALK_1)


def _about(run: ReportedRun, name: str) -> str:
    """"about " before a number the brief's table gives approximately ("~736"), else nothing."""
    return "about " if run.source_of(name) == WORKSHOP_TABLE else ""


def workshop_text(runs: tuple[ReportedRun, ...] = WORKSHOP_RUNS) -> str:
    """The workshop's vLLM ladder against its HF baseline, said with the load each side had and the
    source of every number (every number from ``runs``: the baseline first, vLLM's default second,
    then one setting added per row)."""
    hf, default, *added = runs
    sources = " ".join(f"From {where}: " + "; ".join(items) + "." for where, items in numbers_by_source(runs).items())
    text = (
        f"The workshop this course grew from (talk 1, the presenter of its vLLM benchmark) reported, on "
        f"{WORKSHOP_SETUP}, an HF transformers baseline and then vLLM with one setting added at a time (the table "
        f"below; its source column says where each number comes from). {sources}"
    )
    if hf.output_tokens_per_s and default.output_tokens_per_s:
        said = (f" (the speaker said \"almost {_number(default.said_vs_baseline)}x\")"
                if default.said_vs_baseline is not None else "")
        text += (f"\n\nvLLM's default served {_about(default, 'output_tokens_per_s')}"
                 f"{_number(default.output_tokens_per_s)} output tokens/s "
                 f"({_from(default, 'output_tokens_per_s')}) against the baseline's {_number(hf.output_tokens_per_s)} "
                 f"({_from(hf, 'output_tokens_per_s')}): "
                 f"{default.output_tokens_per_s / hf.output_tokens_per_s:.0f}× the baseline{said}.")
    if hf.requests_in_flight is not None and default.requests_in_flight is not None:
        text += (" That ratio is not engine against engine: "
                 f"HF had **{count(hf.requests_in_flight, 'request')}** in flight ({_from(hf, 'requests_in_flight')}) "
                 f"and vLLM **{default.requests_in_flight}** ({_from(default, 'requests_in_flight')}), "
                 "so much of it is batching, which any engine with continuous batching gets.")
    previous = default
    for run in added:
        if run.output_tokens_per_s is None or previous.output_tokens_per_s is None:
            text += f" **{run.config}**: no number was given; the speaker said {run.said}."
            continue
        ratio = run.output_tokens_per_s / previous.output_tokens_per_s
        text += (f" **{run.config}** {_change_words(previous.output_tokens_per_s, run.output_tokens_per_s)} "
                 f"{_about(run, 'output_tokens_per_s')}{_number(run.output_tokens_per_s)} "
                 f"({_from(run, 'output_tokens_per_s')}; {ratio:.2f}× the row "
                 "before it).")
        previous = run
    text += (
        f"\n\nThat ladder starts from a vLLM without prefix caching. Since vLLM {VLLM_V1_DEFAULT_SINCE} the V1 "
        "engine is the default, and it turns automatic prefix caching and chunked prefill on by default: a plain "
        "`vllm serve` today is already the \"+ prefix caching\" row, and the workshop's \"default\" is "
        "`--no-enable-prefix-caching`. The talk names no vLLM version, so nobody can tell whether the vLLM "
        "behind its SGLang comparison (the decision chart below) kept prefixes at all. Here every variant "
        "gets the same workload at the same concurrency; the HF variant still serves one request at a time, "
        "because that is what a plain `generate` loop behind an API does (transformers' own continuous "
        "batching, its `ContinuousBatchingManager` through `continuous_batching_context_manager`, is a "
        "contender in chapter 09)."
    )
    return text


WORKSHOP_COLUMNS = [
    Column("config", "configuration (talk 1 and the course brief)", "text"),
    Column("output_tokens_per_s", "output tokens/s", "int", missing="— (said in words only)"),
    Column("vs_baseline", "× the HF baseline", "ratio", digits=2, missing="—"),
    Column("ttft_ms", "TTFT (ms)", "int", missing="— (not given)"),
    Column("itl_ms", "ITL (ms)", "int", missing="— (not given)"),
    Column("requests_in_flight", "requests in flight", "int", missing="— (not given)"),
    Column("said", "what the speaker said", "text"),
    Column("source", "source of each number", "text"),
]
WORKSHOP_TITLE = "The workshop's vLLM ladder (talk 1 and the course brief; cited, not measured here)"


def workshop_table(runs: tuple[ReportedRun, ...] = WORKSHOP_RUNS):
    """The workshop's vLLM ladder as reported (cited, not measured here), with each row's ratio to the
    HF baseline computed from ``runs``."""
    base = runs[0].output_tokens_per_s
    rows = [{**dataclasses.asdict(r), "source": r.source,
             "vs_baseline": r.output_tokens_per_s / base if r.output_tokens_per_s and base else None}
            for r in runs]
    return people_table(rows, WORKSHOP_COLUMNS)
