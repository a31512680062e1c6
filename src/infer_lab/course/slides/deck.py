"""The deck as data: sections (from the agenda) made of slides, built from the chapter modules.

Nothing on a slide is typed in: every number comes from a chapter's ``summary``/``tables``/
``figures`` (run here at the chosen sizes, or only its analytic parts with ``saved_only``), from
its ``saved()`` GPU results, or from the opener and foundations functions. Every figure carries
a caption that says where it came from: the hardware and date it was measured on, the saved
file's device and date, or "analytic" with the date the deck was built.

The sections follow ``data/agenda.json`` (the 2-hour workshop); a chapter in this checkout
that the agenda does not list still gets a section, so a new chapter is never silently left out.
Each section marks the slides its minutes allow "show" and the rest "backup" (:func:`assign_roles`).
The saved-only deck also counts chapters 09 and 10 on token ids (:data:`ID_COUNT_SLIDES`): step
and token counts need no real model and no timing.
"""

from __future__ import annotations

import base64
import io
import json
import re
import tempfile
import traceback
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ...hardware import device_label
from ...models import load_model, resolve_device
from ...package_files import data_path
from .. import chapter, chapters
from ..nb import button_time
from ..tables import people_table

# ---------------------------------------------------------------------------------------------
# The data


@dataclass(frozen=True)
class Image:
    """A PNG figure, embedded, and its provenance caption."""

    title: str
    png_base64: str
    caption: str


@dataclass(frozen=True)
class Table:
    """A people table (display strings) and its caption."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str = ""
    more_rows: int = 0  # rows left off the slide


@dataclass(frozen=True)
class Slide:
    title: str
    body: str = ""  # markdown
    images: tuple[Image, ...] = ()
    tables: tuple[Table, ...] = ()
    notes: str = ""  # speaker notes (markdown)
    kind: str = "content"  # title, agenda, section, content, figure, table, saved, failed
    warning: str = ""
    priority: int = 5  # what to show first when the section's minutes run short (PRIORITY)
    chapter: str = ""  # the chapter NUMBER the slide belongs to ("" for section-level slides)
    role: str = "show"  # "show" or "backup": set per section by assign_roles from the agenda's minutes


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    start: int  # minutes from the start
    end: int
    kind: str
    slides: tuple[Slide, ...]

    @property
    def times(self) -> str:
        return f"{clock(self.start)}–{clock(self.end)}"


@dataclass(frozen=True)
class Deck:
    title: str
    built: str  # date
    hardware: str
    mode: str  # "quick", "full" or "saved-only"
    sections: tuple[Section, ...]
    failures: tuple[str, ...] = ()

    @property
    def slides(self) -> list[tuple[Section, Slide]]:
        return [(s, slide) for s in self.sections for slide in s.slides]


@dataclass(frozen=True)
class AgendaEntry:
    key: str
    start: int
    end: int
    kind: str
    title: str
    chapters: tuple[str, ...]


def clock(minutes: int) -> str:
    """Minutes from the start as h:mm (75 -> '1:15')."""
    return f"{minutes // 60}:{minutes % 60:02d}"


def load_agenda() -> list[AgendaEntry]:
    """The workshop agenda from ``data/agenda.json``; a gap, overlap or wrong total is an error."""
    raw = json.loads(data_path("agenda.json").read_text())
    entries = [AgendaEntry(e["key"], e["start"], e["end"], e["kind"], e["title"], tuple(e["chapters"]))
               for e in raw["sections"]]
    for a, b in zip(entries, entries[1:], strict=False):
        if a.end != b.start:
            raise ValueError(f"agenda: {a.key} ends at {a.end} but {b.key} starts at {b.start}")
    if entries[0].start != 0 or entries[-1].end != raw["_about"]["total_minutes"]:
        raise ValueError("agenda: it must start at 0 and end at total_minutes")
    return entries


# ---------------------------------------------------------------------------------------------
# Show or backup: what fits a section's minutes

# The pace the deck plans with: minutes per shown slide, talking point included (a slide with a figure
# takes one to two minutes to present). A section of M minutes shows M / MINUTES_PER_SHOWN_SLIDE slides.
MINUTES_PER_SHOWN_SLIDE = 1.5
# What to show first when a section has more slides than minutes (lower first): the section's intro,
# each chapter's title, its figures (what the room sees), its findings in words, its saved GPU view, then
# the details (tables, continued text, what was not run).
PRIORITY = {"intro": 0, "chapter": 1, "figure": 2, "finding": 3, "saved": 4, "detail": 5}
UNCOUNTED_KINDS = ("title", "agenda")  # the deck's title, agenda and closing slides: always shown, never counted


def show_budget(minutes: float) -> int:
    """Slides a section of ``minutes`` can show at :data:`MINUTES_PER_SHOWN_SLIDE` each (at least its intro)."""
    return max(1, int(minutes // MINUTES_PER_SHOWN_SLIDE))


def assign_roles(slides: list[Slide], minutes: float) -> list[Slide]:
    """The section's slides, in their order, each marked "show" or "backup": the :func:`show_budget` most
    important ones (by ``priority``, taking each chapter's first slide of a priority before any chapter's
    second) are shown, the rest are backup. Title, agenda and closing slides are always shown."""
    counted = [i for i, sl in enumerate(slides) if sl.kind not in UNCOUNTED_KINDS]
    seen: dict[tuple[int, str], int] = {}
    order = []
    for i in counted:
        key = (slides[i].priority, slides[i].chapter)
        order.append((slides[i].priority, seen.get(key, 0), i))
        seen[key] = seen.get(key, 0) + 1
    shown = {i for _, _, i in sorted(order)[:show_budget(minutes)]}
    return [replace(sl, role="show" if sl.kind in UNCOUNTED_KINDS or i in shown else "backup")
            for i, sl in enumerate(slides)]


def roles_note(slides: list[Slide], minutes: float) -> str:
    """The section's plan in one line for its intro's speaker notes: how many slides to show, how many are backup."""
    counted = [sl for sl in slides if sl.kind not in UNCOUNTED_KINDS]
    backup = sum(sl.role == "backup" for sl in counted)
    return (f"Plan: {minutes:g} minutes at {MINUTES_PER_SHOWN_SLIDE:g} min per slide: show "
            f"{len(counted) - backup} of {len(counted)} slides; {backup} are backup (tagged 'backup' in the "
            "section bar and the overview): skip them unless asked.")


# ---------------------------------------------------------------------------------------------
# Building blocks


@dataclass
class BuildContext:
    """How the deck is built: sizes, saved-only, the model, and where the measurements come from."""

    size: str | None = "quick"  # None: by device (full on a GPU)
    saved_only: bool = False
    model: str = "smollm2-135m"
    weights: str = "pretrained"
    device: str = "auto"
    only: list[str] | None = None
    built: str = field(default_factory=lambda: date.today().isoformat())
    _lm: Any = field(default=None, repr=False)
    _hardware: str | None = field(default=None, repr=False)

    def load(self):
        if self._lm is None:
            self._lm = load_model(self.model, weights=self.weights, device=self.device)
        return self._lm

    def resolved_device(self):
        return self._lm.device if self._lm is not None else resolve_device(self.device)

    @property
    def hardware(self) -> str:
        if self._hardware is None:
            dev = self.resolved_device()
            threads = torch.get_num_threads()
            self._hardware = f"{device_label(dev)}, {threads} torch thread{'' if threads == 1 else 's'}"
        return self._hardware

    @property
    def mode(self) -> str:
        return "saved-only" if self.saved_only else (self.size or "by device")

    def measured_caption(self, what: str = "Measured") -> str:
        return f"{what} on {self.hardware} · {self.built} · {self.mode} sizes"

    def analytic_caption(self) -> str:
        return f"Analytic: catalog arithmetic, no hardware involved · computed {self.built}"


def png_base64(fig: Any) -> str:
    """A matplotlib figure as a base64 PNG; the figure is closed."""
    import matplotlib.pyplot as plt  # defers matplotlib.pyplot

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def figure_title(fig: Any) -> str:
    """The figure's suptitle and axes titles joined (what the caption heuristics read)."""
    texts = [fig._suptitle.get_text()] if getattr(fig, "_suptitle", None) else []
    texts += [ax.get_title() for ax in fig.get_axes()]
    return " ".join(t for t in texts if t)


def is_analytic(fig: Any) -> bool:
    """Chapters title analytic figures with the word 'analytic' (course rule 4)."""
    return "analytic" in figure_title(fig).lower()


def image(name: str, fig: Any, caption: str) -> Image:
    return Image(name.replace("_", " "), png_base64(fig), caption)


MAX_ROWS = 14


def table(title: str, frame: Any, caption: str = "") -> Table:
    """A people DataFrame as slide data: at most ``MAX_ROWS`` rows, the rest counted."""
    rows = [tuple(str(v) for v in row) for row in frame.itertuples(index=False)]
    return Table(title, tuple(str(c) for c in frame.columns), tuple(rows[:MAX_ROWS]), caption,
                 max(0, len(rows) - MAX_ROWS))


def split_markdown(text: str, limit: int = 1400) -> list[str]:
    """Markdown in slide-sized chunks, cut only between paragraphs."""
    chunks, current = [], ""
    for para in re.split(r"\n\s*\n", text.strip()):
        if current and len(current) + len(para) > limit:
            chunks.append(current)
            current = ""
        current = f"{current}\n\n{para}" if current else para
    return [c for c in chunks + [current] if c.strip()]


def first_paragraph(doc: str | None) -> str:
    return (doc or "").strip().split("\n\n")[0].replace("\n", " ")


# ---------------------------------------------------------------------------------------------
# The opener and the foundations


def opener_slides(ctx: BuildContext) -> list[Slide]:
    from .. import opener  # defers matplotlib (opener imports it)

    r = opener.compute()
    figs = opener.figures(r)
    tabs = opener.tables(r)
    said = ", ".join(sorted({v.reported for v in r.volumes}))
    cited = f"Cited: {r.latest.who}, said {said} (data/token_volumes.json); not measured by the course"
    sources = "\n".join(f"- {v.as_of}: {v.where}, {v.who}: <{v.url}>" for v in r.volumes)
    t = r.training
    notes = opener.notes(r)
    return [
        Slide("Inference is the bill that keeps coming",
              body=("- **Training** is paid once, before the first user.\n"
                    "- **Inference** is paid for every token of every user, every session, for as long as the "
                    "product lives.\n\n" + opener.cost_text(r).split("\n")[-1].lstrip("- ")),
              notes=notes, priority=PRIORITY["finding"]),
        Slide("Token volumes exploded", body=opener.volumes_text(r),
              images=(image("token volumes", figs["token_volumes"], cited),),
              notes=f"Sources, to read out if asked:\n\n{sources}\n\nTraining reference: {t.source} <{t.url}>.",
              kind="figure", priority=PRIORITY["finding"]),
        Slide("What a month of that volume costs", body=opener.cost_text(r),
              tables=tuple(table(k, v, ctx.analytic_caption()) for k, v in list(tabs.items())[1:2]),
              notes=("Roofline bounds at the catalog's on-demand prices: the best case. Say which GPU the planner "
                     "picked and why an expensive GPU can still be the cheapest per token (chapter 05)."),
              kind="table", priority=PRIORITY["finding"]),
        Slide("The cost per token falls as volume rises", body=opener.batch_text(r),
              images=(image("cost vs batch", figs["cost_vs_batch"], ctx.analytic_caption()),),
              notes=("This is the lever of the whole workshop: one decode step reads the weights once for the whole "
                     "batch. Everything in the serving chapters is about filling that batch without breaking the "
                     "latency users see."),
              kind="figure", priority=PRIORITY["finding"]),
    ]


def foundations_slides(number: str, ctx: BuildContext) -> list[Slide]:
    """The foundations narrative that belongs before chapter 03 (loop, FLOPs) and 03 (hierarchy, decode)."""
    if number == "03":
        ch03 = chapter("03")
        model = ch03.sizes("cpu", "quick").model
        rows = ch03.flop_share_rows()
        return [
            Slide("The autoregressive loop", body=f"One token at a time, for **{model}**:",
                  tables=(table(f"The loop, for {model}", ch03.loop_table(model), ctx.analytic_caption()),),
                  notes=("Walk the loop once with the audience: the prompt goes through in one pass (prefill), then "
                         "every new token is a full pass over every layer (decode) and is fed back. The KV cache is "
                         "what each layer keeps for every token so it never recomputes the past."),
                  kind="table"),
            Slide("Where the FLOPs are", body=ch03.loop_text(model),
                  images=(image("flop share", ch03.flop_share_figure(rows), ctx.analytic_caption()),),
                  notes=("The layers hold almost all the compute of a big model; a small model with a big "
                         "vocabulary spends a visible share in its LM head. The embedding is a lookup."),
                  kind="figure"),
        ]
    if number == "04":
        ch04 = chapter("04")
        s = ch04.sizes("cpu", "quick")
        rows = ch04.hierarchy_rows()
        gpus = [g for g in ("H100-SXM", "A100-80GB", "L4") if any(r.gpu == g for r in rows)]
        curves = {g: ch04.decode_wait_curve(s.model, g, s.context) for g in gpus}
        return [
            Slide("The memory hierarchy: HBM and SRAM", body=ch04.hierarchy_text(rows, s.gpu),
                  images=(image("memory hierarchy", ch04.hierarchy_figure(rows),
                                "Catalog data: vendor whitepapers and datasheets (src/infer_lab/data/gpus.json, "
                                f"_memory_hierarchy); SRAM bandwidth derived · computed {ctx.built}"),),
                  notes=("HBM is where weights and KV live; SRAM is where the math happens. Every byte a step "
                         "needs crosses from one to the other. FlashAttention (chapter 07) is the art of keeping a "
                         "tile in SRAM long enough to reuse it."),
                  kind="figure"),
            Slide("Why decode waits on memory", body=ch04.decode_wait_text(s.model, s.gpu, s.context),
                  images=(image("decode waits", ch04.decode_wait_figure(curves), ctx.analytic_caption()),),
                  notes=("Arithmetic intensity is FLOPs per byte moved. At batch 1 a decode step does about one FLOP "
                         "per byte; the GPU needs hundreds. Batching raises the intensity because the weights are "
                         "shared; the KV reads are not, so at long contexts decode stays memory-bound."),
                  kind="figure"),
        ]
    return []


# ---------------------------------------------------------------------------------------------
# Chapters


def analytic_parts(mod: ModuleType) -> list[str]:
    """The parts a chapter runs without a model or a measurement: all of a model-free chapter, those
    it lists in ``ANALYTIC_PARTS`` (computed or simulated), and those whose button label says 'analytic'."""
    if not mod.NEEDS_MODEL:
        return list(mod.PARTS)
    declared = set(getattr(mod, "ANALYTIC_PARTS", ()))
    return [k for k, label in mod.PARTS.items() if k in declared or "analytic" in label.lower()]


def run_chapter(mod: ModuleType, ctx: BuildContext) -> tuple[Any, list[str]]:
    """The chapter's result at the deck's sizes and the parts it holds (analytic parts only with saved_only;
    a chapter with none still gives its result, whose summary keeps the chapter's analytic text)."""
    parts = analytic_parts(mod) if ctx.saved_only else list(mod.PARTS)
    if not parts and not ctx.saved_only:
        return None, []
    needs_lm = mod.NEEDS_MODEL and not ctx.saved_only
    lm = ctx.load() if needs_lm else None
    device = ctx.resolved_device() if needs_lm else "cpu"
    size = "quick" if ctx.saved_only else ctx.size
    return mod.measure(lm, mod.sizes(device, size), parts=parts), parts


def chapter_notes(mod: ModuleType) -> str:
    lines = [first_paragraph(mod.__doc__), "", "Buttons in the notebook:"]
    for key, label in mod.PARTS.items():
        t = button_time(mod, key)
        lines.append(f"- **{label}**" + (f" ({t})" if t else ""))
    return "\n".join(lines)


def chapter_slides(mod: ModuleType, ctx: BuildContext) -> tuple[list[Slide], str | None]:
    """Title, summary, figures, tables and saved GPU view of one chapter; a failure becomes one slide."""
    notes = chapter_notes(mod)
    title = mod.TITLE
    parts_md = "\n".join(f"- {label}" for label in mod.PARTS.values())
    slides = [Slide(title, body=f"In the notebook (`infer_lab/notebooks/{mod.NUMBER}_{mod.SLUG}.py`):\n\n{parts_md}",
                    notes=notes, kind="section", priority=PRIORITY["chapter"])]
    failure = None
    try:
        result, parts = run_chapter(mod, ctx)
    except Exception as exc:  # one broken chapter must not sink the deck
        failure = f"{mod.NUMBER}: {type(exc).__name__}: {exc}"
        slides.append(Slide(f"{title}: could not run here", body=f"`{type(exc).__name__}: {exc}`",
                            notes=f"```\n{traceback.format_exc()}\n```", kind="failed",
                            priority=PRIORITY["finding"]))
        result, parts = None, []
    if result is not None:
        slides += result_slides(mod, result, ctx)
    counted: tuple[str, ...] = ()
    if ctx.saved_only and mod.NUMBER in ID_COUNT_SLIDES and failure is None:
        counted, make = ID_COUNT_SLIDES[mod.NUMBER]
        try:
            slides += make(mod, ctx)
        except Exception as exc:  # the counts are extra: a failure shows, the deck goes on
            failure = f"{mod.NUMBER} (counts on token ids): {type(exc).__name__}: {exc}"
            slides.append(Slide(f"{title}: counts could not run here", body=f"`{type(exc).__name__}: {exc}`",
                                notes=f"```\n{traceback.format_exc()}\n```", kind="failed",
                                priority=PRIORITY["finding"]))
            counted = ()
    skipped = [mod.PARTS[k] for k in mod.PARTS if k not in parts and k not in counted]
    if skipped and failure is None:
        slides.append(Slide(f"{mod.NUMBER} · measured live in the workshop",
                            body="Not run for this deck (saved-only build):\n\n" + "\n".join(f"- {s}" for s in skipped),
                            notes=notes))
    slides += saved_slides(mod, ctx)
    return slides, failure


def result_slides(mod: ModuleType, result: Any, ctx: BuildContext) -> list[Slide]:
    measured = mod.NEEDS_MODEL and not ctx.saved_only
    notes = chapter_notes(mod)
    short = mod.TITLE.split(":")[0]
    slides = []
    for i, chunk in enumerate(split_markdown(mod.summary(result))):
        slides.append(Slide(f"{short}: what we found" + (" (cont.)" if i else ""), body=chunk, notes=notes,
                            kind="content", priority=PRIORITY["detail" if i else "finding"]))
    for name, fig in mod.figures(result).items():
        caption = ctx.analytic_caption() if not measured or is_analytic(fig) else ctx.measured_caption()
        title = figure_title(fig).split("\n")[0] or name
        heading = title if len(title) <= 70 else name.replace("_", " ")
        slides.append(Slide(f"{short}: {heading}", images=(image(title, fig, caption),),
                            notes=f"{notes}\n\nFigure: {figure_title(fig)}\n\n{caption}", kind="figure",
                            priority=PRIORITY["figure"]))
    caption = ctx.measured_caption("Computed") if measured else ctx.analytic_caption()
    for name, frame in mod.tables(result).items():
        slides.append(Slide(f"{short}: {name}", tables=(table(name, frame, caption),), notes=notes, kind="table"))
    return slides


def saved_slides(mod: ModuleType, ctx: BuildContext) -> list[Slide]:
    view = mod.saved()
    if view is None:
        return []
    notes = "\n".join(f"- {n}" for n in view.notes)
    head = Slide(view.title, body=f"_{view.label}_\n\n" + notes, warning=view.warning or "",
                 notes=("Saved on a GPU before the workshop: say so, and say which GPU and when. " + (
                     f"Caution to read out: {view.warning}" if view.warning else "")), kind="saved",
                 priority=PRIORITY["saved"])
    slides = [head]
    for name, frame in view.tables.items():
        slides.append(Slide(f"{mod.NUMBER} · saved: {name}", tables=(table(name, frame, view.label),),
                            warning=view.warning or "", notes=head.notes, kind="saved"))
    for name, fig in view.figures.items():
        slides.append(Slide(f"{mod.NUMBER} · saved: {name.replace('_', ' ')}", images=(image(name, fig, view.label),),
                            warning=view.warning or "", notes=head.notes, kind="saved"))
    return slides


# ---------------------------------------------------------------------------------------------
# Counts on token ids: chapters 09 and 10 in the saved-only deck
#
# Continuous batching and prefix caching are counted, not timed: how many steps a batching policy takes
# and how many prompt tokens a cache hands back depend on the requests' token ids and lengths, not on the
# model's weights or the machine. So the saved-only deck runs the chapters' own experiments
# (``run_steps``, ``run_granularity``) through the engine on a stand-in model: random weights, a tiny
# Llama shape built here in a moment, nothing downloaded. No time from that run is shown.

# Its vocabulary is the embedded model's (SmolLM2, 49,152 ids): the workloads draw their seeded prompt ids from
# the vocabulary, so the stand-in serves the page's own seeded ids (the replies it quotes are its own, of the same
# lengths) and its counts are the page's.
STAND_IN_CONFIG = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                   "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 49152,
                   "max_position_embeddings": 4096, "tie_word_embeddings": True}


def stand_in_model() -> Any:
    """A CPU model of :data:`STAND_IN_CONFIG`'s shape with random weights (its config written to a temporary
    folder, which is what ``load_model`` reads for random weights)."""
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "config.json"
        config.write_text(json.dumps(STAND_IN_CONFIG))
        return load_model(str(config), weights="random", device="cpu")


def counts_caption(ctx: BuildContext, lm: Any) -> str:
    """Where the counts come from (the deck's captions start with 'Analytic' for numbers no hardware shaped)."""
    return (f"Analytic: counted on token ids by the course's engine with a stand-in model ({lm.n_params:,} random "
            f"weights, nothing downloaded); counts do not depend on the weights or the machine · computed {ctx.built}")


def batching_count_slides(mod: ModuleType, ctx: BuildContext) -> list[Slide]:
    """Chapter 09's static vs continuous batching, step by step: the chapter's ``run_steps`` on the stand-in."""
    lm = stand_in_model()
    steps = mod.run_steps(lm, mod.sizes("cpu", "quick"))
    caption = counts_caption(ctx, lm)
    short = mod.TITLE.split(":")[0]
    return [Slide(f"{short}: static vs continuous, counted", body=mod.steps_text(steps.runs, steps.slots),
                  images=(image("steps", mod.steps_figure(steps.runs, steps.slots, "token ids, stand-in model"),
                                caption),),
                  notes=("The same requests through both policies, counted step by step on token ids. A static "
                         "batch holds its slots until its longest request ends; continuous batching refills a freed "
                         f"slot at the next step. {caption}."), kind="figure", priority=PRIORITY["figure"])]


def prefix_count_slides(mod: ModuleType, ctx: BuildContext) -> list[Slide]:
    """Chapter 10's block-edge staircase (the chapter's ``run_granularity`` on the stand-in), the typo argument,
    and its three workloads through no cache, hash and radix (``run_workloads``): prefill tokens, not TTFT."""
    lm = stand_in_model()
    sizes = mod.sizes("cpu", "quick")
    match = mod.run_granularity(lm, sizes)
    workloads = mod.run_workloads(lm, sizes)
    counts = [c for c in mod.WORKLOAD_COLUMNS if not c.key.startswith("ttft")]  # a stand-in's times mean nothing
    per_workload, _, verdict = mod.workloads_text(workloads).partition("\n\n")  # the slide; the verdict is spoken
    caption = counts_caption(ctx, lm)
    short = mod.TITLE.split(":")[0]
    return [
        Slide(f"{short}: what each cache matches, counted", body=mod.granularity_text(match),
              images=(image("granularity", mod.granularity_figure(match, "token ids, stand-in model"), caption),),
              notes=f"{mod.granularity_note(match.block_size)}\n\n{caption}.", kind="figure",
              priority=PRIORITY["figure"]),
        Slide(f"{short}: a typo, and the shared system prompt",
              body=(mod.typo_text(sizes.system_len, sizes.block_size, mod.typo_position(sizes)) + "\n\n"
                    + mod.shared_prompt_prediction_text(sizes)),
              notes="Analytic: the caches' rules applied to the chapter's sizes; no model involved.",
              priority=PRIORITY["detail"]),
        Slide(f"{short}: three workloads, counted", body=per_workload,
              tables=(table("prefill tokens per workload and cache", people_table(workloads.runs, counts), caption),),
              notes=(f"{verdict}\n\nThe chapter's three workloads served through no cache, hash blocks and the radix "
                     "tree, counted on token ids: a reply's ids come from the stand-in's random weights, its length "
                     "does not (every reply runs to its set length). The TTFT is measured live in the notebook. "
                     f"{caption}."),
              kind="figure", priority=PRIORITY["figure"]),
    ]


# NUMBER -> (the parts whose counts the slides carry, the function that makes them)
ID_COUNT_SLIDES = {"09": (("steps",), batching_count_slides),
                   "10": (("granularity", "workloads"), prefix_count_slides)}


# ---------------------------------------------------------------------------------------------
# Sections


SECTION_NOTES = {
    "why": ("Ten minutes, no code. The point to land: inference cost is an operating cost that scales with "
            "usage, so every optimization in the next two hours is money. Keep the numbers on the slides; they "
            "are computed from the cited volumes and the course's own planner."),
    "setup": ("Everyone runs notebook 00 now. The ceilings they measure are the roof every later prediction "
              "uses; a CPU shows '—' for datasheet columns, with the reason."),
    "pain": ("Four problems, measured live on the room's machines. Ask people to press the buttons in order; "
             "if the Wi-Fi or a GPU fails, the saved GPU results below each are labelled with their hardware "
             "and date."),
    "foundations": ("Why the pain happens: the loop, where the FLOPs are, the memory equation, the hierarchy "
                    "and the roofline, then the planner that turns them into users and dollars."),
    "model": "Shrink the model: fewer bytes per weight and per KV entry, checked on quality, not assumed.",
    "break": "Break. Leave the deck on the agenda slide; remind people to keep their notebooks running.",
    "serving": ("The engine: what a serving stack adds on top of the model. Each chapter measures one "
                "mechanism against the naive baseline of section 2."),
    "scale": "Which engine, and what changes when one GPU is not enough.",
    "next": ("Close the loop: each direction is tied to a number the course computed. Leave time for "
             "questions; the deck's last slide lists where everything lives in the repository."),
}


def section_intro(entry: AgendaEntry, mods: list[ModuleType], agenda: list[AgendaEntry]) -> Slide:
    listed = "\n".join(f"- {m.TITLE}" for m in mods)
    body = f"**{clock(entry.start)}–{clock(entry.end)}** ({entry.end - entry.start} minutes)" + (
        f"\n\n{listed}" if listed else "")
    if entry.kind == "break":
        later = next((a for a in agenda if a.start == entry.end), None)
        body += f"\n\nBack at **{clock(entry.end)}**" + (f" for: {later.title}." if later else ".")
    notes = SECTION_NOTES.get(entry.key) or " ".join(first_paragraph(m.__doc__) for m in mods) or entry.title
    return Slide(entry.title, body=body, notes=notes, kind="section", priority=PRIORITY["intro"])


def title_slides(ctx: BuildContext, agenda: list[AgendaEntry]) -> list[Slide]:
    rows = tuple((f"{clock(a.start)}–{clock(a.end)}", a.title, ", ".join(a.chapters) or "—") for a in agenda)
    how = ("Keys: → / Space next, ← back, Home / End, **n** speaker notes below the slide, **s** speaker view in "
           "a second window, **o** overview, **f** full screen. The slide number is in the address (#12).")
    return [
        Slide("LLM inference at scale, measured on your own hardware",
              body=(f"Built {ctx.built} on {ctx.hardware} ({ctx.mode} sizes).\n\n"
                    "Every number on these slides is computed by the course's code; every measured figure says "
                    "where and when it was measured."),
              notes=how, kind="title"),
        Slide("Agenda", tables=(Table("The two hours", ("time", "section", "chapters"), rows,
                                      "From src/infer_lab/data/agenda.json"),),
              notes="Point out the break and that every notebook also runs on a CPU.", kind="agenda"),
    ]


def closing_slide(ctx: BuildContext) -> Slide:
    return Slide("Questions, and where everything lives",
                 body=("- Notebooks: `src/infer_lab/notebooks/` (marimo; `infer-lab notebooks` prints where they are) and `jupyter/` (Jupyter and Colab, with ipywidgets)\n"
                       "- Everything headless: `infer-lab tour --quick`\n"
                       "- This deck: `infer-lab slides --out deck`\n"
                       "- Capacity planning from the command line: `infer-lab capacity`\n"
                       f"\nBuilt {ctx.built} on {ctx.hardware}."),
                 notes="Thank the room; take questions; point at the self-paced path for the chapters you skipped.",
                 kind="title")


def build_deck(ctx: BuildContext) -> Deck:
    """Every section of the agenda, in order, with the chapters of this checkout."""
    agenda = load_agenda()
    mods = {m.NUMBER: m for m in chapters(ctx.only)}
    listed = {n for a in agenda for n in a.chapters}
    unlisted = sorted(set(mods) - listed)
    sections, failures = [], []
    for entry in agenda:
        present = [mods[n] for n in entry.chapters if n in mods]
        if entry.kind == "close" and unlisted:  # chapters the agenda does not know yet go before the close
            extra = [mods[n] for n in unlisted]
            sections.append(build_section(AgendaEntry("more", entry.start, entry.start, "chapters",
                                                      "More chapters", tuple(unlisted)), extra, agenda, ctx, failures))
        if entry.kind == "chapters" and not present:
            continue
        sections.append(build_section(entry, present, agenda, ctx, failures))
    first = sections[0]
    sections[0] = Section(first.key, first.title, first.start, first.end, first.kind,
                          tuple(title_slides(ctx, agenda)) + first.slides)
    last = sections[-1]
    sections[-1] = Section(last.key, last.title, last.start, last.end, last.kind, last.slides + (closing_slide(ctx),))
    return Deck("LLM inference at scale", ctx.built, ctx.hardware, ctx.mode, tuple(sections), tuple(failures))


def build_section(entry: AgendaEntry, mods: list[ModuleType], agenda: list[AgendaEntry], ctx: BuildContext,
                  failures: list[str]) -> Section:
    """The section's slides, each chapter's stamped with its number, marked show or backup for its minutes."""
    slides = [section_intro(entry, mods, agenda)]
    if entry.kind == "opener":
        slides += opener_slides(ctx)
    for mod in mods:
        slides += [replace(sl, chapter=mod.NUMBER, priority=PRIORITY["finding"])
                   for sl in foundations_slides(mod.NUMBER, ctx)]
        chapter, failure = chapter_slides(mod, ctx)
        slides += [replace(sl, chapter=mod.NUMBER) for sl in chapter]
        if failure:
            failures.append(failure)
    minutes = entry.end - entry.start
    slides = assign_roles(slides, minutes)
    intro = slides[0]
    slides[0] = replace(intro, notes=f"{intro.notes}\n\n{roles_note(slides, minutes)}")
    return Section(entry.key, entry.title, entry.start, entry.end, entry.kind, tuple(slides))
