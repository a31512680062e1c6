"""What every chapter module shares: choosing sizes and the model, timing its parts, the base of its results."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis.memory import weight_bytes
from ..catalog import list_models
from ..models import free_memory_bytes, resolve_device
from ..timing import CONTRADICTED, INCONCLUSIVE, SUPPORTED, MachineLoad, machine_load

SIZES = ("quick", "full")
QUICK_ENV = "INFER_LAB_QUICK"


def choose_size(device: torch.device | str | None = None, size: str | None = None) -> str:
    """``"quick"`` or ``"full"``: the learner's choice, else ``$INFER_LAB_QUICK``, else by device.

    A CPU gets ``"quick"`` (every run button done in well under a minute on 2 cores), a GPU
    ``"full"``. ``INFER_LAB_QUICK=1`` (CI, the instructor's pre-run) forces ``"quick"``.
    """
    if size is not None:
        if size not in SIZES:
            raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
        return size
    env = os.environ.get(QUICK_ENV)
    if env is not None and env != "":
        return "quick" if env not in ("0", "false", "no") else "full"
    dev = torch.device(device) if device is not None else None
    on_gpu = dev.type == "cuda" if dev is not None else torch.cuda.is_available()
    return "full" if on_gpu else "quick"


def has_gpu() -> bool:
    """True when torch sees a CUDA GPU."""
    return torch.cuda.is_available()


def model_choice() -> tuple[str, str]:
    """(model, weights) for the notebooks: ``$INFER_LAB_MODEL``/``$INFER_LAB_WEIGHTS``, else the
    embedded SmolLM2 on a CPU and a Mistral-7B-shape random model on a GPU."""
    model = os.environ.get("INFER_LAB_MODEL")
    weights = os.environ.get("INFER_LAB_WEIGHTS")
    if model:
        return model, weights or "pretrained"
    if has_gpu():
        return "mistral-7b", weights or "random"
    return "smollm2-135m", weights or "pretrained"


def loadable_models(device: Any = None) -> list[str]:
    """Catalogued models whose weights fit this device's free memory in its default dtype.

    On a laptop CPU that is the embedded model and a few small ones; a 7B model in fp32 (29 GB)
    is left out rather than offered only to fail.
    """
    dev = resolve_device(device or "auto")
    fmt = "bf16" if dev.type == "cuda" else "fp32"
    free = free_memory_bytes(dev)
    fits = []
    for name in list_models():
        try:
            if weight_bytes(name, fmt).total < 0.9 * free:
                fits.append(name)
        except (ValueError, KeyError):
            continue
    return fits


@dataclass
class ChapterResult:
    """Base of every chapter's ``Result``: its size and how long each part took (seconds)."""

    size: str = "quick"
    seconds: dict[str, float] = field(default_factory=dict)

    def parts_run(self) -> list[str]:
        return list(self.seconds)


# What a chapter's result names as its model when it ran without one (its analytic parts only).
NO_MODEL = "no model loaded (analytic and simulated parts only)"


def selected_parts(parts: Iterable[str] | None, known: dict[str, str]) -> list[str]:
    """The requested parts in course order; an unknown key is a clear error."""
    if parts is None:
        return list(known)
    wanted = list(parts)
    unknown = [p for p in wanted if p not in known]
    if unknown:
        raise ValueError(f"unknown part(s) {', '.join(unknown)}; this chapter has {', '.join(known)}")
    return [p for p in known if p in wanted]


def run_parts(
    result: ChapterResult,
    parts: Iterable[str] | None,
    known: dict[str, str],
    functions: dict[str, Callable[[], Any]],
) -> ChapterResult:
    """Run each selected part's function, store its value on ``result.<part>`` and time it."""
    for key in selected_parts(parts, known):
        t0 = time.perf_counter()
        setattr(result, key, functions[key]())
        result.seconds[key] = time.perf_counter() - t0
    return result


@dataclass(frozen=True)
class Part:
    """One part of a chapter's page, in page order: how it runs and what it shows.

    A measured part has ``run``: its ``key`` is its entry in the chapter's ``PARTS`` (its run button's
    label) and the attribute of the chapter's ``Result`` that holds what ``run(lm, sizes)`` returned; it
    shows once that value is there and not empty (``None`` or an empty list shows nothing). A part without
    ``run`` is analytic: nothing to measure, shown on every page, its ``key`` only a name. ``text``, ``tables`` and ``figures`` take the whole result, so a part
    can quote another's numbers; ``text`` may give several paragraphs, and an empty one is left out.
    """

    key: str
    run: Callable[[Any, Any], Any] | None = None
    text: Callable[[Any], str | Sequence[str] | None] | None = None
    tables: Callable[[Any], dict[str, Any]] | None = None
    figures: Callable[[Any], dict[str, Any]] | None = None


@dataclass(frozen=True)
class Page:
    """A chapter's page as a list of parts, in page order, and what the chapter's surface does with it:
    ``measure`` runs the measured parts, ``summary``, ``tables`` and ``figures`` gather what each shown
    part says, in page order. ``labels`` is the chapter's ``PARTS``: every measured part once, in its order.
    """

    labels: dict[str, str]
    parts: tuple[Part, ...]

    def __init__(self, labels: dict[str, str], *parts: Part) -> None:
        measured = [p.key for p in parts if p.run is not None]
        if measured != list(labels):
            raise ValueError(f"the page's measured parts {measured} must be PARTS {list(labels)}, in that order")
        keys = [p.key for p in parts]
        if len(set(keys)) != len(keys):
            raise ValueError(f"a part's key appears twice on the page: {keys}")
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "parts", parts)

    def measure(self, result: ChapterResult, lm: Any, sizes: Any, parts: Iterable[str] | None = None) -> Any:
        """Run the selected measured parts (all when ``parts`` is None) on ``lm`` at ``sizes`` into ``result``."""
        runs = {p.key: p.run for p in self.parts if p.run is not None}
        return run_parts(result, parts, self.labels,
                         {key: (lambda run=run: run(lm, sizes)) for key, run in runs.items()})

    def shown(self, result: ChapterResult) -> list[Part]:
        """The parts ``result`` can show: every analytic part, and each measured part that ran."""
        return [p for p in self.parts if p.run is None or getattr(result, p.key, None)]

    def summary(self, result: ChapterResult, header: str) -> str:
        """``header``, then each shown part's text, as paragraphs (markdown)."""
        paragraphs = [header]
        for part in self.shown(result):
            words = part.text(result) if part.text else None
            paragraphs += [words] if isinstance(words, str) else list(words or [])
        return "\n\n".join(p for p in paragraphs if p)

    def tables(self, result: ChapterResult) -> dict[str, Any]:
        """Each shown part's tables, by title."""
        return {title: table for part in self.shown(result) if part.tables
                for title, table in part.tables(result).items()}

    def figures(self, result: ChapterResult) -> dict[str, Any]:
        """Each shown part's figures, by name."""
        return {name: fig for part in self.shown(result) if part.figures
                for name, fig in part.figures(result).items()}


def model_name(lm: Any) -> str:
    """What a chapter's result names as its model: ``lm.describe()``, or :data:`NO_MODEL` without one."""
    return lm.describe() if lm is not None else NO_MODEL


def check_machine(sample_s: float = 0.3) -> MachineLoad:
    """What else is using the CPU right now (see :func:`infer_lab.timing.machine_load`)."""
    return machine_load(sample_s)


# One timed run per contender: a ratio of two throughputs closer to 1 than this is not read as a
# difference (the run-to-run spread of a throughput on a shared 2-core machine is of this order;
# repeat the run to see it).
SINGLE_RUN_NOISE = 0.10


def finding(outcome: str, claim: str, machine: MachineLoad | None, spread: str = "") -> str:
    """The verdict of a timed part as markdown: the claim when the spread supports it; *inconclusive*
    with the reason when the spreads overlap, or when they point the other way on a busy machine
    (the load explains it); and, on a machine not found busy, a run that points the other way is
    reported as what it measured, not explained away.

    ``outcome`` is one of :data:`~infer_lab.timing.SUPPORTED`, ``INCONCLUSIVE`` or
    ``CONTRADICTED`` (from :func:`~infer_lab.timing.compare_spreads`); ``claim`` is the
    heading's lesson as a sentence without its full stop ("TTFT grows with the prompt");
    ``spread`` names the evidence ("beyond the spread of 3 runs per length").
    """
    if outcome not in (SUPPORTED, INCONCLUSIVE, CONTRADICTED):
        raise ValueError(f"outcome must be {SUPPORTED}, {INCONCLUSIVE} or {CONTRADICTED}, got {outcome!r}")
    busy = machine is not None and machine.busy
    where = f" ({spread})" if spread else ""
    machine_line = f" {machine.text()}" if machine is not None else ""
    if outcome == SUPPORTED:
        text = f"**This run shows it:** {claim}{where}."
        if busy:
            text += machine_line + " The direction held anyway; the sizes of the numbers would not."
        return text
    if outcome == CONTRADICTED and not busy:
        return (f"**This run measured the opposite:** its numbers{where} point against the claim that {claim}."
                f"{machine_line} One run can be an accident: press the button again. If it holds, it is this "
                "machine's result at these sizes, and the numbers say by how much.")
    if outcome == INCONCLUSIVE:
        reason = f"the spread of its numbers{where} is wider than the effect, so it cannot show that {claim}."
    else:
        reason = f"its numbers{where} point the other way, on a busy machine, so it cannot show that {claim}."
    advice = (" Close other programs and press the button again." if busy else
              " Press the button again; when it stays this way, the effect is smaller than this "
              "machine's timing noise at these sizes (a larger size setting shows it more clearly).")
    return f"**Inconclusive on this run:** {reason}{machine_line}{advice}"



def chapter_number(slug: str) -> str:
    """The number (``"05"``) of the chapter whose slug is ``slug``, from the course's registry
    (:func:`infer_lab.course.chapter`), so that renumbering the course renumbers the text."""
    from . import chapter as course_chapter  # import cycle: infer_lab.course imports this first

    return course_chapter(slug).NUMBER
