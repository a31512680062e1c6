"""The GPU learner's defaults, shrunk to run on a 2-core CPU (used by tests/test_gpu_defaults.py).

On a CUDA device the notebooks pick ``mistral-7b`` with random weights (:func:`infer_lab.course.nb.model_choice`):
a vocabulary of 32,768 that is not SmolLM2's, so there is no tokenizer, and bf16 weights. This
module writes that model family's config with the same vocabulary, layer count and head ratio
but a tiny width, so that every chapter can be taken through the same path on a CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

from infer_lab.catalog import load_model_config

GPU_MODEL = "mistral-7b"
GPU_DTYPE = "bf16"  # what load_model picks on a CUDA device


def tiny_gpu_default_config(folder: Path) -> Path:
    """``folder/config.json``: mistral-7b's config with hidden 64, 4 heads (2 KV heads), FFN 128.

    Layers (32), vocabulary (32,768, so no tokenizer matches it) and the context limit are kept.
    """
    cfg = load_model_config(GPU_MODEL)
    cfg.pop("_infer_lab", None)
    cfg.update(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(cfg, indent=1) + "\n")
    return path


def run_tour_half(config: str, only: list[str], out_dir: str, check_exercises: list[str]) -> dict:
    """Worker: the tour over ``only`` with the tiny GPU-default model (random bf16 weights, no
    tokenizer) on the CPU, and the reference solutions' exercise checks of ``check_exercises``
    with model loading forbidden (an exercise check must not need the learner's model)."""
    import matplotlib

    matplotlib.use("Agg")
    import torch

    torch.set_num_threads(1)
    import infer_lab.models as models
    from infer_lab.course import exercises
    from infer_lab.course.tour import TourContext, run_tour

    ctx = TourContext(out_dir=Path(out_dir), quick=True, model=config, weights="random", device="cpu")
    ctx._lm = models.load_model(config, weights="random", device="cpu", dtype=GPU_DTYPE)
    results = run_tour(ctx, only=only, progress=False)
    real_load = models.load_model

    def forbidden(*args, **kwargs):
        raise AssertionError(f"an exercise check loaded a model: {args}")

    models.load_model = forbidden
    try:
        # Chapter 06's build exercise runs the real engine on the embedded SmolLM2 by design (its checks
        # compare with transformers greedy), on a GPU box too: every other exercise must not load a model.
        checks = {n: exercises.check_solution(n, only=[ex.name for ex in exercises.exercises(n)
                                                       if ex.kind != "build"]).passed
                  for n in check_exercises}
    finally:
        models.load_model = real_load
    return {"tour": results, "report": (Path(out_dir) / "report.md").read_text(), "exercises": checks,
            "tokenizer": ctx._lm.tokenizer is None, "dtype": str(ctx._lm.dtype)}
