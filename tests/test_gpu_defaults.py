"""The GPU learner's defaults, taken through every chapter, the tour and every exercise check on a CPU.

On a CUDA device the notebooks load ``mistral-7b`` with random bf16 weights, whose vocabulary
(32,768) has no tokenizer here. Nothing else in the suite runs that path; this file does, with
the same model family shrunk to a tiny width (:mod:`gpu_defaults`), in bf16 (the GPU default dtype,
which this CPU supports), the engine on its default ``auto`` decode path (CUDA graphs need a GPU,
so the CPU's pick). Every part must either work or say what it needs.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from gpu_defaults import GPU_MODEL, run_tour_half, tiny_gpu_default_config

from infer_lab.course import chapter_names, exercises, nb
from infer_lab.models import load_model
from infer_lab.package_files import notebooks_dir

course_chapter = importlib.import_module("infer_lab.course.chapter")  # the module, not course.chapter()

NAMES = chapter_names()
# the longest chapters split across the two workers, so that both finish together
FIRST = ["ch12_speculative_decoding", "ch00_setup", "ch02_feel_the_pain", "ch03_memory_equation",
         "ch04_prefill_decode_roofline", "ch05_capacity_planner", "ch16_where_next"]


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    return tiny_gpu_default_config(tmp_path_factory.mktemp("tiny-mistral"))


def test_the_tiny_model_is_the_gpu_default_shrunk(tiny_config, monkeypatch):
    monkeypatch.delenv("INFER_LAB_MODEL", raising=False)
    monkeypatch.delenv("INFER_LAB_WEIGHTS", raising=False)
    monkeypatch.setattr(course_chapter, "has_gpu", lambda: True)  # nb.model_choice is chapter's
    assert nb.model_choice() == (GPU_MODEL, "random")
    lm = load_model(str(tiny_config), weights="random", device="cpu", dtype="bf16")
    assert lm.tokenizer is None and lm.is_random and lm.config.model_type == "mistral"
    assert lm.config.vocab_size == 32768 and lm.config.num_hidden_layers == 32
    with pytest.raises(ValueError, match="no tokenizer"):
        lm.chat_ids("hello")
    ids = lm.word_ids("copy this copy this")[0].tolist()  # the stand-in for text keeps repeats
    assert ids[0] == ids[2] and ids[1] == ids[3] and ids[0] != ids[1]
    assert all(100 <= i < 32768 for i in ids)


@pytest.fixture(scope="module")
def gpu_default_runs(tiny_config, tmp_path_factory) -> list[dict]:
    halves = [FIRST, [n for n in NAMES if n not in FIRST]]
    numbers = exercises.numbers()
    checks = [numbers[::2], numbers[1::2]]
    out = tmp_path_factory.mktemp("gpu-defaults")
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(run_tour_half, str(tiny_config), half, str(out / str(i)), check)
                   for i, (half, check) in enumerate(zip(halves, checks, strict=True))]
        return [f.result() for f in futures]


def test_every_chapter_runs_the_tour_with_the_gpu_defaults(gpu_default_runs):
    chapters = {k: v for run in gpu_default_runs for k, v in run["tour"]["chapters"].items()}
    assert sorted(chapters) == NAMES
    failed = {k: v.get("traceback") for k, v in chapters.items() if not v["ok"]}
    assert not failed, failed
    assert all(run["tokenizer"] and run["dtype"] == "torch.bfloat16" for run in gpu_default_runs)


def test_pages_say_what_a_tokenizer_less_model_changes(gpu_default_runs):
    report = "\n".join(run["report"] for run in gpu_default_runs)
    assert "no tokenizer, so each prompt's words are mapped to fixed token ids" in report  # chapter 12
    assert "Served instead of" in report and "smollm2-135m" in report  # chapter 13 falls back, and says so


def test_every_exercise_check_passes_without_loading_a_model(gpu_default_runs):
    checks = {n: ok for run in gpu_default_runs for n, ok in run["exercises"].items()}
    assert sorted(checks) == sorted(exercises.numbers()) and all(checks.values()), checks


GPU_DEFAULT_NOTEBOOKS = ["12_speculative_decoding.py", "13_engines.py"]


@pytest.fixture(scope="module")
def gpu_default_notebooks(tiny_config) -> dict[str, tuple[int, str]]:
    """Both notebooks in script mode on the tiny model, side by side (one torch thread each): name -> (rc, stderr)."""
    env = dict(os.environ, INFER_LAB_QUICK="1", MPLBACKEND="Agg", OMP_NUM_THREADS="1",
               INFER_LAB_MODEL=str(tiny_config), INFER_LAB_WEIGHTS="random")
    logs = {name: tempfile.TemporaryFile("w+") for name in GPU_DEFAULT_NOTEBOOKS}  # no pipe to fill up
    procs = {name: subprocess.Popen([sys.executable, str(notebooks_dir() / name)], env=env,
                                    stdout=subprocess.DEVNULL, stderr=logs[name])
             for name in GPU_DEFAULT_NOTEBOOKS}
    done = {}
    for name, proc in procs.items():
        try:
            proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        logs[name].seek(0)
        done[name] = (proc.returncode, logs[name].read())
        logs[name].close()
    return done


@pytest.mark.slow
@pytest.mark.parametrize("notebook", GPU_DEFAULT_NOTEBOOKS)
def test_notebook_runs_with_the_gpu_default_model(notebook, gpu_default_notebooks):
    returncode, stderr = gpu_default_notebooks[notebook]
    assert returncode == 0, stderr[-4000:]
    assert "Traceback" not in stderr, stderr[-4000:]
