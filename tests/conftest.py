"""Shared fixtures. The embedded model loads once per test session (about 1 s from cache)."""

from __future__ import annotations

import os

import pytest

# Notebooks and the tour size themselves down in CI.
os.environ.setdefault("INFER_LAB_QUICK", "1")
# Tests are hermetic: nothing may reach a model hub (CI has no network for it anyway).
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def embedded():
    """The real SmolLM2-135M-Instruct (fp32, CPU): the model every engine path is checked against."""
    from infer_lab.models import load_model

    return load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="session")
def prompts(embedded) -> list[list[int]]:
    """The 20-prompt set every engine mode is checked on (see ``engine_helpers.chat_prompts``)."""
    from engine_helpers import chat_prompts

    return chat_prompts(embedded)


@pytest.fixture(scope="session")
def reference(embedded, prompts) -> list[list[int]]:
    """transformers greedy ``generate`` on the 20 prompts: what every engine mode must reproduce."""
    from engine_helpers import greedy_reference

    return greedy_reference(embedded, prompts)
