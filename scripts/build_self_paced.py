"""Write workshop/SELF_PACED.md: the course for one learner, chapter by chapter, with measured times.

Everything in the file comes from the repository: the chapters and their titles from the chapter
modules, the exercises from ``infer_lab.course.exercises``, the run time of each chapter's
buttons from the newest ``src/infer_lab/results/chapter-times-cpu-*.json`` (``scripts/time_chapters.py``),
the reading time from the words of each notebook's text. A test checks that the committed file is
what this script writes, so after changing any of those, run:

    python scripts/build_self_paced.py           # rewrites workshop/SELF_PACED.md
    python scripts/build_self_paced.py --check   # exit 1 if the committed file is stale
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import re
import sys
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "workshop" / "SELF_PACED.md"
# Where a clone keeps the package's notebooks and saved results (infer_lab.package_files finds them).
NOTEBOOKS_IN_CLONE = "src/infer_lab/notebooks"
RESULTS_IN_CLONE = "src/infer_lab/results"
WORDS_PER_MINUTE = 200  # an assumption: reading technical prose with figures in between
EXERCISE_MINUTES = {"predict": 10, "implement": 20, "build": 40}  # our estimate per exercise, not a measurement


def notebook_words(path: Path) -> int:
    """Words of prose in a notebook: the literal text of every ``mo.md(...)`` call."""
    words = 0
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "md":
            for arg in node.args:
                parts = arg.values if isinstance(arg, ast.JoinedStr) else [arg]
                for part in parts:
                    if isinstance(part, ast.Constant) and isinstance(part.value, str):
                        words += _words(part.value)
    return words


def _words(text: str) -> int:
    return len(re.findall(r"[A-Za-z0-9']+", text))


def chapter_prose_words(path: Path) -> int:
    """Words of the prose a chapter module writes into its notebook (its ``*_text``, ``*_note``, ``summary``);
    a chapter that is a package (``path`` its ``__init__.py``) counts every file of its parts."""
    files = sorted(path.parent.glob("*.py")) if path.name == "__init__.py" else [path]
    return sum(_prose_words_of(part) for part in files)


def _prose_words_of(path: Path) -> int:
    words = 0
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and (node.name.endswith(("_text", "_note")) or node.name == "summary"):
            words += sum(_words(n.value) for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return words


def measured_dates(times: dict, env: dict) -> str:
    """When the chapters were timed: the file's date, or, for a file that merged runs of several dates
    (``time_chapters.py --only``), each date with its chapters ("chapters 01, 02 on 2026-12-05; chapter 03
    on 2026-12-04"), and each run's machine when they differ."""
    runs: dict[tuple[str, str], list[str]] = {}
    for number, entry in sorted(times.get("data", {}).get("chapters", {}).items()):
        run = (entry.get("measured") or env.get("date", "?")[:10], entry.get("hardware") or env.get("hardware", ""))
        runs.setdefault(run, []).append(number)
    if len(runs) <= 1:
        return env.get("date", "?")[:10]
    machines = len({hardware for _, hardware in runs}) > 1
    return "; ".join(f"chapter{'s' if len(numbers) > 1 else ''} {', '.join(numbers)} on {day}"
                     + (f" ({hardware or 'an unrecorded machine'})" if machines else "")
                     for (day, hardware), numbers in sorted(runs.items(), reverse=True))


def reading_minutes(words: int) -> int:
    """Minutes to read ``words`` at WORDS_PER_MINUTE, rounded up to whole minutes."""
    return max(1, math.ceil(words / WORDS_PER_MINUTE))


def newest_times() -> tuple[Path | None, dict]:
    sys.path.insert(0, str(ROOT / "src"))
    from infer_lab.package_files import results_dir

    files = sorted(results_dir().glob("chapter-times-cpu-*.json"))
    return (files[-1], json.loads(files[-1].read_text())) if files else (None, {})


def _seconds(entry: dict | None) -> tuple[float, float] | None:
    """(seconds of the run buttons, seconds to load the model) of one chapter, or None if not measured."""
    if not entry:
        return None
    return sum(entry["seconds"].values()), entry.get("load_s", 0.0)


def _fmt_s(seconds: float) -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from infer_lab.units import fmt_duration

    return fmt_duration(seconds)


# The chapters the opening paragraph ties together, by slug; their numbers come from the chapter
# modules (``infer_lab.course.chapter(slug).NUMBER``), so renumbering the course renumbers the text.
LINKED_CHAPTERS = ("memory_equation", "capacity_planner", "kv_cache_paged", "prefill_decode_roofline", "batching")


def cross_references(chapter: Callable[[str], ModuleType]) -> str:
    """How the chapters feed each other, each named by its number: ``chapter`` maps a slug to its
    module (``infer_lab.course.chapter``)."""
    n = {slug: chapter(slug).NUMBER for slug in LINKED_CHAPTERS}
    return (f"the memory equation of {n['memory_equation']} feeds the capacity planner of "
            f"{n['capacity_planner']} and the KV cache of {n['kv_cache_paged']}; the roofline of "
            f"{n['prefill_decode_roofline']} explains every step time from {n['batching']} on")


def opener_pointer(chapters: Iterable[ModuleType]) -> str:
    """Where the course deck's opener (why inference cost matters) is taught: the chapter module that
    opens with it says so with ``OPENER_TITLE``; empty when none does."""
    home = next((m for m in chapters if getattr(m, "OPENER_TITLE", None)), None)
    if home is None:
        return ""
    return (f"Chapter {home.NUMBER} opens with the course deck's opener, \"{home.OPENER_TITLE}\": the token "
            "volumes talk 2 cites, what a month of them costs, and why batching makes each token cheaper.")


def render() -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from infer_lab.course import chapter as course_chapter
    from infer_lab.course import chapters as course_chapters
    from infer_lab.course import exercises as ex
    from infer_lab.course import track
    from infer_lab.package_files import notebooks_dir

    times_file, times = newest_times()
    entries = times.get("data", {}).get("chapters", {})
    env = times.get("environment", {})
    rows, sections = [], []
    total_run = total_read = total_ex = 0.0
    for n in ex.numbers():
        try:
            chapter = course_chapter(n)
        except KeyError:
            chapter = None
        title = ex.chapter_title(n)
        notebook = notebooks_dir() / ex.file_name(n)
        exercises = ex.exercises(n)
        ex_min = sum(EXERCISE_MINUTES[e.kind] for e in exercises)
        words = notebook_words(notebook) + chapter_prose_words(Path(chapter.__file__)) if chapter else 0
        read_min = reading_minutes(words) if notebook.exists() else None
        run = _seconds(entries.get(n)) if chapter is not None else None
        model = "—" if chapter is None else ("yes" if chapter.NEEDS_MODEL else "no")
        run_text = (f"{_fmt_s(run[0])} (+ {_fmt_s(run[1])} startup)" if run and run[1] >= 0.5 else
                    _fmt_s(run[0]) if run else "not measured yet")
        run_min = math.ceil(sum(run) / 60) if run else 0
        total_run += sum(run) if run else 0.0
        total_read += read_min or 0
        total_ex += ex_min
        rows.append(f"| {title} | {model} | {run_text} | {read_min if read_min else '—'} | "
                    f"{len(exercises)} ({ex_min} min) | {run_min + (read_min or 0) + ex_min} |")
        where = (f"Open `marimo edit {NOTEBOOKS_IN_CLONE}/{notebook.name}` (or run it headless: "
                 f"`python {NOTEBOOKS_IN_CLONE}/{notebook.name}`)." if notebook.exists()
                 else "Its notebook has not landed yet: do the exercises, they need only the library.")
        tiers = [(e, i) for i, e in enumerate(exercises, 1)]
        items = [f"{i}. **{e.title}** ({ex.KINDS[e.kind]}; {', '.join(f'`{f}()`' for f in e.functions)}): {e.task}"
                 for e, i in tiers if e.kind != "build"]
        build = [f"{i}. **{e.title}** ({', '.join(f'`{f}()`' for f in e.functions)} plug into `{e.symbol}`): "
                 f"{e.task} Check: `infer-lab check {n} --only {e.name}`."
                 for e, i in tiers if e.kind == "build"]
        if build:
            items += ["", "Build tier (your code runs inside the engine, checked token for token, as each task says):",
                      "", *build]
        stages = [f"- Build track, stage {s.number} (**{s.title}**, about {s.minutes} min): write "
                  f"`{track.DEFAULT_DIR}/{s.file}`, then `infer-lab check engine {s.key}`."
                  for s in track.stages() if s.chapter == n]
        sections.append("\n".join([
            f"### {title}", "", where, "", *items, "",
            f"    infer-lab check {n} --init    # writes ./{ex.default_file(n).as_posix()}",
            f"    infer-lab check {n}           # after each edit, until every line says PASS",
            "",
            *([*stages, ""] if stages else []),
        ]))
    measured = (f"measured by `{times.get('command', 'scripts/time_chapters.py').strip()}` on "
                f"{env.get('hardware', 'an unrecorded CPU')} with {env.get('torch_threads', '?')} torch threads, "
                f"{measured_dates(times, env)} ([{times_file.name}](../{RESULTS_IN_CLONE}/{times_file.name}))"
                if times_file else "not measured yet: run `python scripts/time_chapters.py`")
    note = times.get("note")
    lines = [
        "# The course at your own pace",
        "",
        "<!-- Generated by scripts/build_self_paced.py from the chapter modules, the exercises and the",
        "     measured chapter times. Do not edit by hand: tests/test_exercises.py checks it. -->",
        "",
        *textwrap.wrap(
            f"Work through the chapters in order: each one builds on the numbers of the ones before it "
            f"({cross_references(course_chapter)}). For each chapter: open its notebook, read it, press its run "
            "buttons (they run at quick sizes on a CPU), then do its exercises in a file of your own and "
            "check them until every case passes. Stuck? `infer-lab check NN --show-solution` prints the "
            "reference solution, and the notebook has it in a closed accordion at the end. "
            + opener_pointer(course_chapters()),
            width=100, break_long_words=False, break_on_hyphens=False),
        "",
        "Setup once: `make setup` in a clone (or `pip install -e .`), then `infer-lab env` to see your machine.",
        "Without a clone, a plain `pip install` of a wheel, an sdist or `git+<address>` carries the notebooks too:",
        "`infer-lab notebooks 00` prints where chapter 00's is (`marimo edit \"$(infer-lab notebooks 00)\"`).",
        "",
        "## Time per chapter",
        "",
        f"Run buttons: the wall time of every run button of the chapter at quick sizes, {measured}; "
        "startup is the imports and, where the chapter needs it, loading the model." + (f" {note}" if note else ""),
        f"Reading: the words of the notebook's text and of the prose its chapter module writes, at "
        f"{WORDS_PER_MINUTE} words a minute, rounded up (an estimate; studying the figures and tables "
        f"takes longer). Exercises: {EXERCISE_MINUTES['predict']} minutes per prediction and "
        f"{EXERCISE_MINUTES['implement']} per implementation (our estimate). In all: the run time rounded up to "
        "whole minutes, plus reading and exercises.",
        "",
        "| Chapter | Loads the model | Run buttons (measured) | Reading (min) | Exercises | In all (min) |",
        "|---|---|---|---:|---|---:|",
        *rows,
        "",
        f"In all: {total_run / 60:.0f} minutes of measured run time, about {total_read:.0f} minutes of reading "
        f"and {total_ex / 60:.1f} hours of exercises, and about {sum(s.minutes for s in track.stages()) / 60:.0f} "
        "hours for the build track (below).",
        "",
        "## Chapter by chapter",
        "",
        *sections,
        *track_section(track),
    ]
    return "\n".join(lines).rstrip() + "\n"


def track_section(track) -> list[str]:
    """The build track: every stage with its file, its check, the chapter to read first and its time."""
    rows = [f"| {s.number} | {s.title} | `{track.DEFAULT_DIR}/{s.file}` | {s.task} | {', '.join(s.chapters)} | "
            f"`infer-lab check engine {s.key}` | {s.minutes} |" for s in track.stages()]
    return [
        "## The build track: write the engine",
        "",
        "Beside the chapters you can write the serving engine itself, one component per stage, each in a",
        f"file of your own in `./{track.DEFAULT_DIR}/`. A starter has the signatures and docstrings (units, "
        "shapes,",
        "invariants) of the library's own component, which is the reference. Each stage's check runs your",
        "component inside the real engine on hidden traces and on a second, hidden model shape, and compares",
        "every token with transformers' greedy output. A component you have not written yet is the",
        "library's, so you can stop after any stage and still serve an engine, and take the stages in the",
        "order of your chapters (each one's line in its chapter above) or in the order an engine is built",
        "(this table). Minutes are our estimate.",
        "",
        "    infer-lab check engine --init    # copies the eight starters",
        "",
        "| # | Stage | Your file | What you write | Read chapter first | Check | Minutes |",
        "|---|---|---|---|---|---|---:|",
        *rows,
        "",
        "Then the whole engine, every component yours (the capstone):",
        "",
        "    infer-lab check engine           # every stage, then your engine at once on hidden traces",
        "    infer-lab check engine --json    # per component: yours or the library's; tokens identical?",
        "    infer-lab serve --engine mine    # your engine behind the OpenAI API (streaming included)",
        "    infer-lab check engine --serve   # yours, the library's and transformers, under the same load",
        "",
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--check", action="store_true", help="exit 1 when the committed file differs")
    args = p.parse_args()
    text = render()
    if args.check:
        same = OUT.exists() and OUT.read_text() == text
        print(f"{OUT.relative_to(ROOT)} is {'up to date' if same else 'stale: run python scripts/build_self_paced.py'}")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
