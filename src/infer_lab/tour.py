"""``infer-lab tour``: run every course module headless and write a report.

Each module contributes a step: a file ``infer_lab/tour_steps/mNN_<slug>.py`` defining
``TITLE`` and ``run(ctx: TourContext) -> StepResult``. The tour runs them in order, keeps
going when one fails (the report says which and why), and writes ``report.md``,
``results.json`` and the PNG figures into the output folder.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import tour_steps


@dataclass
class StepResult:
    """What a module's step reports: markdown for humans, records for machines, figure paths."""

    title: str
    summary_md: str
    records: Any = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)


@dataclass
class TourContext:
    """Shared settings and the (lazily loaded, shared) model for all steps."""

    out_dir: Path
    quick: bool = True
    model: str = "smollm2-135m"
    weights: str = "pretrained"
    device: str = "auto"
    _lm: Any = None

    def load(self):
        """The tour's model, loaded once and shared by the steps."""
        if self._lm is None:
            from .models import load_model

            self._lm = load_model(self.model, weights=self.weights, device=self.device)
        return self._lm

    def save_figure(self, fig, name: str) -> Path:
        """Save a matplotlib figure as ``out_dir/name.png``, close it, and return the path."""
        import matplotlib.pyplot as plt

        path = self.out_dir / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        return path


def discover_steps(only: list[str] | None = None) -> list[Any]:
    """Step modules in course order, optionally filtered by module number or slug substring."""
    names = sorted(i.name for i in pkgutil.iter_modules(tour_steps.__path__) if i.name.startswith("m"))
    if only:
        names = [n for n in names if any(key in n for key in only)]
    return [importlib.import_module(f"{tour_steps.__name__}.{n}") for n in names]


def run_tour(ctx: TourContext, only: list[str] | None = None, progress: bool = True) -> dict[str, Any]:
    """Run the steps, write the report files and return the results dict (also results.json)."""
    from .harness import env_metadata

    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    steps = discover_steps(only)
    results: dict[str, Any] = {"config": {"quick": ctx.quick, "model": ctx.model, "weights": ctx.weights,
                                          "device": ctx.device}, "steps": {}}
    lines = ["# infer-lab tour report", ""]
    for mod in steps:
        key = mod.__name__.rsplit(".", 1)[-1]
        if progress:
            print(f"[tour] {key}: {mod.TITLE} ...", flush=True)
        t0 = time.perf_counter()
        try:
            res: StepResult = mod.run(ctx)
            entry = {"title": res.title, "ok": True, "seconds": time.perf_counter() - t0,
                     "records": res.records, "figures": [p.name for p in res.figures]}
            lines += [f"## {res.title}", "", res.summary_md.strip(), ""]
            lines += [f"![{p.stem}]({p.name})" for p in res.figures] + [""]
        except Exception as exc:  # one broken module must not hide the others
            entry = {"title": mod.TITLE, "ok": False, "seconds": time.perf_counter() - t0,
                     "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            lines += [f"## {mod.TITLE}", "", f"**FAILED**: `{type(exc).__name__}: {exc}`", ""]
        results["steps"][key] = entry
        if progress:
            print(f"[tour] {key}: {'ok' if entry['ok'] else 'FAILED'} in {entry['seconds']:.1f} s", flush=True)
    results["environment"] = env_metadata(ctx._lm)
    env = results["environment"]
    lines[1:1] = ["", f"Device: **{env.get('device_name')}** · torch {env.get('torch')} · "
                      f"transformers {env.get('transformers')} · model `{ctx.model}` ({ctx.weights} weights) · "
                      f"{'quick' if ctx.quick else 'full'} sizes · {env.get('date')}", ""]
    (ctx.out_dir / "report.md").write_text("\n".join(lines) + "\n")
    (ctx.out_dir / "results.json").write_text(json.dumps(results, indent=1, default=_jsonable) + "\n")
    return results


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "__dict__"):
        return vars(obj)
    return str(obj)
