"""Production quantization on a GPU: bitsandbytes LLM.int8 / NF4 through transformers.

These paths need CUDA and the ``bitsandbytes`` package (``pip install -e '.[gpu]'``). On any
other machine they raise :class:`QuantBackendUnavailable` naming what is missing, before any
weight is touched.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import torch

from ..models import LoadedModel, embedded_model_dir
from .stored_bytes import QuantizedLoadedModel


class QuantBackendUnavailable(RuntimeError):
    """A quantization method needs hardware or a package this machine does not have."""


def require_bitsandbytes(device: torch.device | str) -> None:
    """Raise :class:`QuantBackendUnavailable` unless CUDA and bitsandbytes are both present."""
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise QuantBackendUnavailable(
            f"bitsandbytes int8/nf4 needs an NVIDIA GPU with CUDA; the model is on {dev} and torch sees "
            f"{'a' if torch.cuda.is_available() else 'no'} CUDA device. Use --method int8, int4, nf4 or fp8 "
            "(from-scratch, run anywhere) or run on a GPU machine."
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        raise QuantBackendUnavailable(
            "bitsandbytes is not installed: pip install -e '.[gpu]' (or pip install 'bitsandbytes>=0.45')"
        )


def bnb_config(method: str, compute_dtype: torch.dtype = torch.bfloat16):
    """The transformers ``BitsAndBytesConfig`` for ``'bnb-int8'`` (LLM.int8) or ``'bnb-nf4'``."""
    from transformers import BitsAndBytesConfig  # defers transformers

    if method == "bnb-int8":
        # 6.0 is LLM.int8's outlier threshold: features above it stay in 16-bit.
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=6.0)
    if method == "bnb-nf4":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=compute_dtype,
            bnb_4bit_use_double_quant=False,
        )
    raise ValueError(f"unknown bitsandbytes method {method!r}; use bnb-int8 or bnb-nf4")


def load_quantized(lm: LoadedModel, method: str) -> LoadedModel:
    """Reload ``lm``'s weights through bitsandbytes (``'bnb-int8'`` or ``'bnb-nf4'``) on its GPU.

    Embedded and hub models reload from their files; random-weight models are saved to a
    temporary folder first (true shapes, so the memory and speed are real).
    """
    from transformers import AutoModelForCausalLM  # defers transformers

    config = bnb_config(
        method, compute_dtype=lm.dtype if lm.dtype != torch.float32 else torch.bfloat16
    )
    require_bitsandbytes(lm.device)
    with tempfile.TemporaryDirectory(prefix="infer-lab-bnb-") as tmp:
        if lm.source == "embedded":
            folder: str | Path = embedded_model_dir()
        elif lm.source == "hub":
            folder = lm.model.config._name_or_path
        else:
            lm.model.save_pretrained(tmp)
            folder = tmp
        model = AutoModelForCausalLM.from_pretrained(
            folder, quantization_config=config, device_map=str(lm.device)
        ).eval()
    model.generation_config = lm.model.generation_config
    return QuantizedLoadedModel(
        model=model,
        tokenizer=lm.tokenizer,
        name=lm.name,
        source=lm.source,
        device=lm.device,
        dtype=lm.dtype,
        extra={"quantization": method},
    )
