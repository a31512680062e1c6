"""The course index: every chapter with its notebook, its time in the workshop and what it needs.

``make workshop`` opens ``infer_lab/notebooks/index.py``, which shows :func:`index_markdown`. The
rows come from the chapter modules (number, title, whether a model is loaded), the
workshop agenda (``data/agenda.json``: minutes per section, shared by the chapters it
presents) and the measured button times (``infer_lab/results/chapter-times-cpu-*.json``,
written by ``scripts/time_chapters.py``). Nothing is typed twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..package_files import data_path
from ..units import fmt_duration
from . import chapters
from .saved import load_saved

CPU_TIMES_FILE = "chapter-times-cpu-*.json"

# What a chapter needs beyond its notebook, when that is more than "the embedded model".
EXTRA_NEEDS = {
    "13": "local servers (127.0.0.1)",
    "14": "two local processes (gloo)",
}


@dataclass(frozen=True)
class IndexRow:
    """One chapter in the index. ``agenda_minutes`` is its share of its workshop section."""

    number: str
    title: str
    notebook: str  # file name in infer_lab/notebooks/
    agenda_minutes: float | None
    buttons_s: float | None  # all its run buttons, measured on a 2-core CPU (None when never timed)
    buttons: int
    needs: str


def agenda_minutes() -> dict[str, float]:
    """Minutes of the 2-hour workshop per chapter: its section's length split evenly over its chapters."""
    raw = json.loads(data_path("agenda.json").read_text())
    out: dict[str, float] = {}
    for section in raw["sections"]:
        numbers = section.get("chapters") or []
        for number in numbers:
            out[number] = (section["end"] - section["start"]) / len(numbers)
    return out


def rows() -> list[IndexRow]:
    """One row per chapter module in course order."""
    minutes = agenda_minutes()
    found = load_saved(CPU_TIMES_FILE)
    times = found[0].data.get("chapters", {}) if found else {}
    out = []
    for ch in chapters():
        seconds = times.get(ch.NUMBER, {}).get("seconds")
        needs = "the model (a CPU is enough)" if ch.NEEDS_MODEL else "no model: arithmetic on the catalog"
        if ch.NUMBER in EXTRA_NEEDS:
            needs += "; " + EXTRA_NEEDS[ch.NUMBER]
        out.append(IndexRow(ch.NUMBER, ch.TITLE.split("·", 1)[-1].strip(), f"{ch.NUMBER}_{ch.SLUG}.py",
                            minutes.get(ch.NUMBER), sum(seconds.values()) if seconds else None,
                            len(ch.PARTS), needs))
    return out


def duration_text(seconds: float | None) -> str:
    """Seconds for people (:func:`infer_lab.units.fmt_duration`)."""
    return fmt_duration(seconds)


def index_markdown(link_prefix: str = "?file=") -> str:
    """The index as a markdown table; each title links to its notebook (``link_prefix`` + file name)."""
    lines = ["| | chapter | workshop | run buttons | all buttons take | needs |", "|:--|:--|--:|--:|--:|:--|"]
    for r in rows():
        minutes = "—" if r.agenda_minutes is None else f"{r.agenda_minutes:.0f} min"
        lines.append(f"| {r.number} | [{r.title}]({link_prefix}{r.notebook}) | {minutes} | {r.buttons} | "
                     f"{duration_text(r.buttons_s) if r.buttons else '—'} | {r.needs} |")
    return "\n".join(lines)


def times_source() -> str:
    """Where the button times come from, for the line under the index."""
    found = load_saved(CPU_TIMES_FILE)
    if not found:
        return "The run buttons have not been timed on this checkout (scripts/time_chapters.py)."
    hardware = found[0].raw.get("environment", {}).get("hardware", "a CPU")
    return (f"Run-button times: all of a chapter's buttons pressed once, measured on {hardware} on "
            f"{found[0].date} at the sizes a CPU gets (scripts/time_chapters.py); a busy machine takes longer.")
