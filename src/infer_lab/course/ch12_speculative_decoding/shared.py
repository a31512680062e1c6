"""What every part of chapter 12 shares: number formats, the hardware's name, the prompts' note."""

from __future__ import annotations

from typing import Any

from ...hardware import device_label


def _hardware(lm: Any) -> str:
    return device_label(lm.device)


def prompts_note(lm: Any) -> str:
    """How the prompts reach this model: through its chat template, or, without a tokenizer
    (random weights of another vocabulary, a GPU's default), one hashed id per word."""
    if lm.tokenizer is not None:
        return ""
    return (f"{lm.name} has random weights and no tokenizer, so each prompt's words are mapped to fixed token "
            "ids (one per word, by a hash): repeated words repeat ids, so n-gram lookup still finds copies, "
            "but a random model's guesses are not a trained model's. Load a pretrained model for real acceptance.")


def _x(value: float) -> str:
    return f"{value:.2f}×"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def lesson_columns(frame: Any, columns: tuple[str, ...]) -> Any:
    """The columns of a people table that carry a section's finding, in that order."""
    return frame[list(columns)]


COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
