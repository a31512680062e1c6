"""Quality checks that need no download: perplexity on a shipped text, top-1 agreement.

The evaluation text
-------------------
``infer_lab/data/eval_text.txt`` ships with the package. It was generated once by
:func:`build_eval_text` from the docstrings (``inspect.getdoc``) of a fixed list of Python
standard-library objects, :data:`EVAL_SOURCES` (perplexity) and :data:`HELDOUT_SOURCES`
(prompts for top-1 agreement), on CPython 3.11.7. Each section starts with a header line
``### <dotted name>`` followed by the docstring. Docstrings change between Python versions, so the
shipped file, not a rebuild, is the fixed reference; rebuild it only to make a new reference
(``python -c "from infer_lab.evaluation import write_eval_text; write_eval_text()"``).

Perplexity is ``exp(mean negative log-likelihood)`` over non-overlapping windows of the token
stream; the first token of each window is only context. It is deterministic: same text,
same windows, greedy math, no sampling.
"""

from __future__ import annotations

import importlib
import inspect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .package_files import data_path

EVAL_SOURCES = (
    "json",
    "textwrap.TextWrapper",
    "argparse",
    "heapq",
    "functools.lru_cache",
    "collections.namedtuple",
)
HELDOUT_SOURCES = ("shutil.copytree", "zipfile.ZipFile", "tempfile.mkstemp", "math.isclose")
SECTION_PREFIX = "### "
EVAL_FILE = "eval_text.txt"


def _resolve(dotted: str) -> Any:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ValueError(f"cannot import {dotted!r}")


def build_eval_text(sources: tuple[str, ...] = EVAL_SOURCES + HELDOUT_SOURCES) -> str:
    """The evaluation text rebuilt from this Python's docstrings (see the module docstring)."""
    sections = []
    for dotted in sources:
        doc = inspect.getdoc(_resolve(dotted))
        if not doc:
            raise ValueError(f"{dotted} has no docstring in this Python")
        sections.append(f"{SECTION_PREFIX}{dotted}\n{doc.strip()}\n")
    return "\n".join(sections)


def write_eval_text(path: str | Path | None = None) -> Path:
    """Regenerate the shipped evaluation file (a new reference: old perplexities stop comparing)."""
    target = Path(path) if path else data_path(EVAL_FILE)
    target.write_text(build_eval_text())
    return target


def eval_sections(path: str | Path | None = None) -> dict[str, str]:
    """Sections of the evaluation file as ``{dotted name: text}``; ``path`` overrides the shipped file.

    A user file without ``### `` headers becomes one section named ``'text'``.
    """
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"evaluation text {p} does not exist")
        raw = p.read_text()
    else:
        raw = data_path(EVAL_FILE).read_text()
    sections: dict[str, str] = {}
    current = None
    for line in raw.splitlines():
        if line.startswith(SECTION_PREFIX):
            current = line[len(SECTION_PREFIX) :].strip()
            sections[current] = ""
        else:
            key = current or "text"
            sections[key] = sections.get(key, "") + line + "\n"
    return {k: v.strip() + "\n" for k, v in sections.items() if v.strip()}


def eval_text(path: str | Path | None = None) -> str:
    """The perplexity text: the :data:`EVAL_SOURCES` sections (or a whole user file), joined."""
    sections = eval_sections(path)
    if path is not None and not any(s in sections for s in EVAL_SOURCES):
        return "\n".join(sections.values())
    return "\n".join(sections[s] for s in EVAL_SOURCES)


def heldout_prompts(tokenizer, tokens_each: int = 96) -> list[torch.Tensor]:
    """Token ids ``(1, n)`` of the held-out sections, each cut to ``tokens_each`` tokens."""
    sections = eval_sections()
    return [
        tokenizer(sections[s], return_tensors="pt")["input_ids"][:, :tokens_each]
        for s in HELDOUT_SOURCES
    ]


@dataclass(frozen=True)
class PerplexityResult:
    """Perplexity (unitless), mean NLL in nats per token, how many tokens were scored and windows used."""

    perplexity: float
    nll_per_token: float
    scored_tokens: int
    windows: int
    window: int

    def as_dict(self) -> dict[str, float]:
        return {
            "perplexity": self.perplexity,
            "nll_per_token": self.nll_per_token,
            "scored_tokens": self.scored_tokens,
            "windows": self.windows,
            "window": self.window,
        }


def eval_token_ids(
    tokenizer, max_tokens: int | None = None, path: str | Path | None = None
) -> torch.Tensor:
    """The evaluation text as one 1-D tensor of token ids, cut to ``max_tokens``."""
    ids = tokenizer(eval_text(path), return_tensors="pt")["input_ids"][0]
    return ids[:max_tokens] if max_tokens else ids


@torch.inference_mode()
def perplexity(
    model, token_ids: torch.Tensor, window: int = 512, batch_size: int = 4
) -> PerplexityResult:
    """Perplexity of a causal LM over non-overlapping windows of ``token_ids`` (1-D).

    The tail that does not fill a whole window is dropped, so every model sees exactly the
    same windows. Windows run ``batch_size`` at a time; the NLL is summed in fp64.
    """
    if token_ids.dim() != 1:
        raise ValueError(f"token_ids must be 1-D, got shape {tuple(token_ids.shape)}")
    if window < 2:
        raise ValueError(f"window must be >= 2 tokens, got {window}")
    n_windows = token_ids.numel() // window
    if n_windows == 0:
        raise ValueError(
            f"the text has {token_ids.numel()} tokens, fewer than one window of {window}"
        )
    device = next(model.parameters()).device
    windows = token_ids[: n_windows * window].view(n_windows, window).to(device)
    total_nll = 0.0
    scored = 0
    for start in range(0, n_windows, batch_size):
        batch = windows[start : start + batch_size]
        logits = model(batch).logits.float()
        logprobs = torch.log_softmax(logits[:, :-1], dim=-1)
        target = batch[:, 1:]
        nll = -logprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        total_nll += float(nll.double().sum())
        scored += target.numel()
    mean = total_nll / scored
    return PerplexityResult(
        perplexity=math.exp(mean),
        nll_per_token=mean,
        scored_tokens=scored,
        windows=n_windows,
        window=window,
    )


@torch.inference_mode()
def next_token_predictions(model, prompts: list[torch.Tensor]) -> list[torch.Tensor]:
    """Greedy next-token prediction at every position of every prompt (teacher-forced).

    Prompts of equal length run as one batch (one pass over the weights instead of several).
    """
    device = next(model.parameters()).device
    out: list[torch.Tensor | None] = [None] * len(prompts)
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_length.setdefault(p.shape[-1], []).append(i)
    for indices in by_length.values():
        batch = torch.cat([prompts[i].reshape(1, -1) for i in indices]).to(device)
        predictions = model(batch).logits.argmax(-1).cpu()
        for row, i in enumerate(indices):
            out[i] = predictions[row]
    return out  # type: ignore[return-value]


def top1_agreement(reference: list[torch.Tensor], candidate: list[torch.Tensor]) -> float:
    """Fraction of positions where two models' greedy next tokens agree (1.0 = identical choices)."""
    if len(reference) != len(candidate) or any(
        a.shape != b.shape for a, b in zip(reference, candidate, strict=True)
    ):
        raise ValueError("reference and candidate predictions must come from the same prompts")
    same = sum(int((a == b).sum()) for a, b in zip(reference, candidate, strict=True))
    total = sum(a.numel() for a in reference)
    return same / total
