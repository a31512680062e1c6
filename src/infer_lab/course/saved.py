"""Results measured on a GPU and saved under ``infer_lab/results/``, for machines without one.

Every saved file carries its hardware, versions, date and command. A chapter's ``saved()``
reads the files that belong to it and returns a :class:`SavedView`: tables and figures whose
titles say where the numbers came from, and a warning when a saved run is known to be noisy.
Notebooks show these views, labelled as saved, without any button.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..package_files import RESULTS_ENV, results_dir

__all__ = ["RESULTS_ENV", "SavedResult", "SavedView", "load_saved", "results_dir"]


@dataclass(frozen=True)
class SavedResult:
    """One saved result file: its data and where it was measured."""

    file: str
    device: str
    date: str
    command: str
    data: dict[str, Any]
    raw: dict[str, Any]

    @property
    def external(self) -> bool:
        """True for a reference measurement made outside this repository (its ``provenance`` says so)."""
        return str(self.raw.get("provenance", "")).startswith("external")

    @property
    def label(self) -> str:
        """'Saved result, not measured on this machine: NVIDIA H200, 2026-11-30 (file)'; an external
        reference measurement says that it is one, and why."""
        text = f"Saved result, not measured on this machine: {self.device}, {self.date} ({self.file})"
        if self.external:
            text += f". External reference measurement: {self.raw['provenance'].split(': ', 1)[-1]}"
        return text


def load_saved(pattern: str) -> list[SavedResult]:
    """Saved result files matching ``pattern`` (e.g. ``'h200-hf-baseline-*.json'``), newest first."""
    folder = results_dir()
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob(pattern), reverse=True):
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        env = raw.get("environment") or raw.get("meta") or {}
        out.append(
            SavedResult(
                file=path.name,
                device=str(env.get("device_name") or env.get("gpu") or "unknown device"),
                date=str(env.get("date", "unknown date"))[:10],
                command=str(raw.get("command", "")),
                data=raw.get("data", raw),
                raw=raw,
            )
        )
    return out


@dataclass
class SavedView:
    """What a chapter shows of its saved GPU results: label, tables, figures, notes."""

    title: str
    source: SavedResult
    tables: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    warning: str | None = None

    @property
    def label(self) -> str:
        return self.source.label

    def markdown(self) -> str:
        """The view as markdown (the tour's report)."""
        from .tables import markdown  # defers pandas (tables imports it)

        parts = [f"### {self.title}", "", f"_{self.label}_", ""]
        if self.warning:
            parts += [f"> **Caution:** {self.warning}", ""]
        for name, frame in self.tables.items():
            parts += [f"**{name}**", "", markdown(frame), ""]
        parts += [f"- {n}" for n in self.notes]
        return "\n".join(parts).strip() + "\n"
