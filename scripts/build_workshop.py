"""Write the generated part of workshop/README.md: the agenda, the buttons, their measured times.

Between the markers ``<!-- generated:start -->`` and ``<!-- generated:end -->`` everything
comes from the repository: the agenda from ``data/agenda.json`` (the deck follows the same
file), the talking points from the deck's section notes, how many slides each section shows (the
deck's ``show_budget`` of its minutes), each chapter's run buttons (the ``PARTS`` labels its notebook
gives a ``mo.ui.run_button``: :func:`button_parts`; the other parts run on open or from sliders), their
measured CPU times from the newest ``src/infer_lab/results/chapter-times-cpu-*.json``
(``scripts/time_chapters.py``), and GPU times from saved results when there are any. A test
checks that the committed file is current, so after changing any of those, run:

    python scripts/build_workshop.py           # rewrites the block in workshop/README.md
    python scripts/build_workshop.py --check   # exit 1 if the committed block is stale
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "workshop" / "README.md"
START, END = "<!-- generated:start -->", "<!-- generated:end -->"


def _seconds(value: float | None) -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from infer_lab.units import fmt_duration

    return fmt_duration(value)


def button_parts(mod: ModuleType) -> list[str]:
    """The keys of ``mod.PARTS`` that its notebook gives a run button, in ``PARTS`` order: the parts
    whose label a ``mo.ui.run_button(label=<chapter>.PARTS["key"])`` call uses (read from the notebook's
    syntax tree, nothing run). A part without one runs when the page opens or its sliders move."""
    sys.path.insert(0, str(ROOT / "src"))
    from infer_lab.course.notebook_code import notebook_path

    tree = ast.parse(notebook_path(mod.NUMBER).read_text())
    keys = set()
    for call in ast.walk(tree):
        func = call.func if isinstance(call, ast.Call) else None
        if not (isinstance(func, ast.Attribute) and func.attr == "run_button"):
            continue
        for kw in call.keywords:
            v = kw.value
            if (kw.arg == "label" and isinstance(v, ast.Subscript) and isinstance(v.value, ast.Attribute)
                    and v.value.attr == "PARTS" and isinstance(v.slice, ast.Constant)):
                keys.add(v.slice.value)
    return [k for k in mod.PARTS if k in keys]


def block() -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from infer_lab.course import chapters
    from infer_lab.course.saved import load_saved
    from infer_lab.course.slides.deck import (
        MINUTES_PER_SHOWN_SLIDE,
        SECTION_NOTES,
        clock,
        load_agenda,
        show_budget,
    )

    timing = load_saved("chapter-times-cpu-*.json")
    times = timing[0].data.get("chapters", {}) if timing else {}
    source = (f"{timing[0].raw['environment'].get('hardware')}, {timing[0].raw['environment'].get('torch_threads')} "
              f"torch threads, {timing[0].date} ([{timing[0].file}](../src/infer_lab/results/{timing[0].file}))"
              if timing else "not measured yet: run `python scripts/time_chapters.py`")
    by_number = {m.NUMBER: m for m in chapters()}
    agenda = load_agenda()
    lines = ["## Agenda (2 hours)", "",
             f"CPU run time: every run button of the section's chapters pressed once, at quick sizes, on {source}.",
             f"Slides to show: the section's minutes at {MINUTES_PER_SHOWN_SLIDE:g} minutes per slide. The deck "
             "marks that many slides of each section *show*, the most important first (the section's intro, each "
             "chapter's title, its figures, its findings in words, its saved GPU view), and tags the rest *backup* "
             "in the section bar and in the overview (`o`): skip a backup slide unless someone asks. The speaker "
             "notes of each section's first slide repeat the plan.",
             "", "| time | section | notebooks | CPU run time | slides to show | talking points |",
             "|---|---|---|---|---|---|"]
    for entry in agenda:
        present = [n for n in entry.chapters if n in by_number]
        cpu = [sum(times[n]["seconds"].values()) for n in present if n in times]
        cpu_text = _seconds(sum(cpu)) if cpu and len(cpu) == len(present) else ("—" if present else "")
        notebooks = ", ".join(present) if present else ("break" if entry.kind == "break" else "slides")
        show = "" if entry.kind == "break" else str(show_budget(entry.end - entry.start))
        lines.append(f"| {clock(entry.start)}–{clock(entry.end)} | {entry.title} | {notebooks} | {cpu_text} | "
                     f"{show} | {SECTION_NOTES.get(entry.key, '')} |")
    slack = [e for e in agenda if e.kind == "break"]
    lines += ["", f"The agenda fills {agenda[-1].end} minutes, with a {sum(e.end - e.start for e in slack)}-minute "
              "break and the questions in the last section. A chapter missing from a checkout is skipped; the order "
              "stays.", "", "## Buttons per notebook", "",
              "Press them in this order. Each time is one press on the machine above; the notebook prints the same "
              "number next to its button.", "", "| notebook | button | CPU time |", "|---|---|---|"]
    buttonless = []
    for number, mod in sorted(by_number.items()):
        entry = times.get(number, {}).get("seconds", {})
        pressed = button_parts(mod)
        for key in pressed:
            lines.append(f"| {number} {mod.SLUG.replace('_', ' ')} | {mod.PARTS[key]} | {_seconds(entry.get(key))} |")
        buttonless += [f"{number} {mod.SLUG.replace('_', ' ')}: {label}" for key, label in mod.PARTS.items()
                       if key not in pressed]
    if buttonless:
        lines += ["", "These parts have no button: they run when the notebook opens, and again as their sliders "
                  "and menus move.", ""] + [f"- {part}" for part in buttonless]
    gpu = load_saved("chapter-times-cuda-*.json")
    lines += ["", "On a GPU: " + (f"saved in {gpu[0].file} ({gpu[0].device}, {gpu[0].date})." if gpu else
                                  "no saved run of the chapter buttons yet (`python scripts/time_chapters.py` on the "
                                  "GPU box writes one); the GPU benchmarks of `scripts/gpu_checks.py` are the saved "
                                  "GPU numbers the notebooks show.")]
    return "\n".join(lines)


def render(text: str) -> str:
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{block()}\n{END}{tail}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--check", action="store_true", help="exit 1 when workshop/README.md is stale")
    args = p.parse_args()
    current = README.read_text()
    wanted = render(current)
    if args.check:
        if current != wanted:
            print("workshop/README.md is stale: run python scripts/build_workshop.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(wanted)
    print(f"wrote {README.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
