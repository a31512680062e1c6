"""``infer-lab tour``: every chapter headless, one report.

One generic loop over :mod:`infer_lab.course`: for each chapter it picks the sizes for the
device, runs ``measure``, saves the chapter's own ``figures``, writes its ``tables`` and
``summary`` (and, on a machine without a GPU, its saved GPU view) into ``report.md``, and its
result into ``results.json``. It keeps going when a chapter fails; the report says which and why.
"""

from __future__ import annotations

import dataclasses
import json
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from ..harness import env_metadata
from ..models import load_model, resolve_device
from . import chapters


@dataclass
class TourContext:
    """Shared settings and the (lazily loaded, shared) model for all chapters."""

    out_dir: Path
    quick: bool = True
    model: str = "smollm2-135m"
    weights: str = "pretrained"
    device: str = "auto"
    _lm: Any = field(default=None, repr=False)

    def load(self):
        """The tour's model, loaded once and shared by the chapters."""
        if self._lm is None:
            self._lm = load_model(self.model, weights=self.weights, device=self.device)
        return self._lm

    def resolved_device(self):
        return self._lm.device if self._lm is not None else resolve_device(self.device)

    def save_figure(self, fig, name: str) -> Path:
        """Save a matplotlib figure as ``out_dir/name.png``, close it, and return the path."""
        import matplotlib.pyplot as plt  # defers matplotlib.pyplot

        path = self.out_dir / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        return path


@dataclass
class ChapterRun:
    """What the tour got from one chapter: its result, the figure files and the report section."""

    key: str
    title: str
    ok: bool
    seconds: float
    markdown: str
    figures: list[Path] = field(default_factory=list)
    result: Any = None
    error: str | None = None
    traceback: str | None = None

    def record(self) -> dict[str, Any]:
        out = {"title": self.title, "ok": self.ok, "seconds": self.seconds,
               "figures": [p.name for p in self.figures]}
        if self.ok:
            out["result"] = dataclasses.asdict(self.result)
        else:
            out.update(error=self.error, traceback=self.traceback)
        return out


def run_chapter(chapter: ModuleType, ctx: TourContext) -> ChapterRun:
    """Measure one chapter at the tour's sizes and render its section of the report."""
    from .tables import markdown  # defers pandas (tables imports it)

    key = chapter.__name__.rsplit(".", 1)[-1]
    t0 = time.perf_counter()
    try:
        lm = ctx.load() if chapter.NEEDS_MODEL else None
        sizes = chapter.sizes(ctx.resolved_device(), "quick" if ctx.quick else None)
        result = chapter.measure(lm, sizes)
        figures = [ctx.save_figure(fig, f"{key[:4]}_{name}") for name, fig in chapter.figures(result).items()]
        lines = [f"## {chapter.TITLE}", "", chapter.summary(result).strip(), ""]
        for name, frame in chapter.tables(result).items():
            lines += [f"**{name}**", "", markdown(frame), ""]
        lines += [f"![{p.stem}]({p.name})" for p in figures] + [""]
        saved = chapter.saved()
        if saved is not None and ctx.resolved_device().type != "cuda":
            lines += [saved.markdown()]
        timing = ", ".join(f"{k} {v:.1f} s" for k, v in result.seconds.items())
        lines += [f"_Parts measured ({result.size} sizes): {timing}._", ""]
        return ChapterRun(key, chapter.TITLE, True, time.perf_counter() - t0, "\n".join(lines), figures, result)
    except Exception as exc:  # one broken chapter must not hide the others
        return ChapterRun(key, chapter.TITLE, False, time.perf_counter() - t0,
                          f"## {chapter.TITLE}\n\n**FAILED**: `{type(exc).__name__}: {exc}`\n",
                          error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())


def run_tour(ctx: TourContext, only: list[str] | None = None, progress: bool = True) -> dict[str, Any]:
    """Run the chapters, write ``report.md`` and ``results.json``, and return the results dict."""
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    for chapter in chapters(only):
        if progress:
            print(f"[tour] {chapter.TITLE} ...", flush=True)
        run = run_chapter(chapter, ctx)
        runs.append(run)
        if progress:
            print(f"[tour] {run.key}: {'ok' if run.ok else 'FAILED'} in {run.seconds:.1f} s", flush=True)
    env = env_metadata(ctx._lm)
    header = (f"Device: **{env.get('device_name')}** · torch {env.get('torch')} · "
              f"transformers {env.get('transformers')} · model `{ctx.model}` ({ctx.weights} weights) · "
              f"{'quick' if ctx.quick else 'full'} sizes · {env.get('date')}")
    report = ["# infer-lab tour report", "", header, ""] + [r.markdown for r in runs]
    (ctx.out_dir / "report.md").write_text("\n".join(report) + "\n")
    results = {
        "config": {"quick": ctx.quick, "model": ctx.model, "weights": ctx.weights, "device": ctx.device},
        "environment": env,
        "chapters": {r.key: r.record() for r in runs},
    }
    (ctx.out_dir / "results.json").write_text(json.dumps(results, indent=1, default=_jsonable) + "\n")
    return results


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    return str(obj)
