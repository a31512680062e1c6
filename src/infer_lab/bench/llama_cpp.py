"""llama.cpp on the embedded model's own GGUF file: the laptop user's alternative, one user decoding.

The course's embedded model ships as a GGUF file, the format llama.cpp runs: its layers in Q4_1
(4-bit codes with one fp16 scale and one fp16 minimum per 32 weights) and its token embedding,
which is also its LM head, in Q8_0. The engine's fp32 weights are that file dequantized, so
llama.cpp multiplies by the very same weight values while reading a fraction of fp32's bytes. ``infer-lab bench quant --llama-cpp`` times its decode of that file next to the
engine's fp32, int8 and int4 paths: the same prompt token ids (the file carries the same
vocabulary), one user, greedy, EOS ignored, interleaved rounds; and the bytes each one streams
per token, since at one row bytes set the speed limit.

llama.cpp is optional and never installed by the project: llama-cpp-python compiles it from source
(``pip install llama-cpp-python``, several minutes on 2 cores). Its speed depends on that build, so
the result records the version and the SIMD features it was compiled with.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

INSTALL_HINT = ("llama.cpp is optional: `pip install llama-cpp-python` compiles it from source (several "
                "minutes on 2 cores; set CMAKE_ARGS to choose its CPU features)")


def available() -> str | None:
    """None when llama-cpp-python imports here, else why not (with how to install it)."""
    try:
        import llama_cpp  # optional: llama-cpp-python  # noqa: F401
    except ImportError as exc:
        return f"{exc}. {INSTALL_HINT}"
    return None


def streamed_bytes(path: Path | str) -> dict[str, Any]:
    """Bytes llama.cpp reads from the GGUF file ``path`` per decode token, and by tensor type.

    Every weight tensor is read once per token. An LM head tied to the token embedding (no
    ``output.weight`` tensor, as in SmolLM2) reads the whole embedding matrix; an untied model
    reads its own ``output.weight``, and its embedding lookup only one row (not counted).
    Returns ``{"bytes_per_token", "by_type": {type name: bytes}, "file_bytes"}``.
    """
    from gguf import GGUFReader  # optional: gguf

    tensors = GGUFReader(str(path)).tensors
    untied = any(t.name == "output.weight" for t in tensors)
    by_type: dict[str, int] = {}
    for t in tensors:
        if untied and t.name == "token_embd.weight":
            continue
        by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + int(t.n_bytes)
    return {"bytes_per_token": sum(by_type.values()), "by_type": by_type, "file_bytes": Path(path).stat().st_size}


class LlamaCppDecoder:
    """One llama.cpp model loaded from ``path`` with ``threads`` threads, timed as the engine is."""

    def __init__(self, path: Path | str, context_tokens: int, threads: int) -> None:
        reason = available()
        if reason:
            raise RuntimeError(reason)
        import llama_cpp  # optional: llama-cpp-python

        self.path, self.threads = Path(path), threads
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=context_tokens, n_threads=threads,
                                   n_threads_batch=threads, verbose=False)
        self.version = llama_cpp.__version__
        self.system_info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()

    def decode(self, prompt: list[int], new_tokens: int) -> tuple[float, list[int]]:
        """Greedy ``new_tokens`` after ``prompt`` (EOS ignored): decode tokens/s (the time after the
        first token, as the engine's), and the tokens."""
        if new_tokens < 2:
            raise ValueError("new_tokens must be >= 2 (decode speed is timed after the first token)")
        self.llm.reset()  # no prefix reuse from the last round: every run prefills the whole prompt
        stamps: list[float] = []
        tokens: list[int] = []
        for token in self.llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                       reset=True):
            stamps.append(time.perf_counter())
            tokens.append(int(token))
            if len(tokens) == new_tokens:
                break
        return (len(stamps) - 1) / (stamps[-1] - stamps[0]), tokens

    def describe(self) -> dict[str, Any]:
        """Version, build features and threads, for the result file."""
        return {"llama_cpp_python": self.version, "system_info": self.system_info, "threads": self.threads,
                "gguf": self.path.name, **streamed_bytes(self.path)}


def summarize(rates: list[float], tokens: list[int], reference: list[int], decoder: LlamaCppDecoder,
              base_rate: float) -> dict[str, Any]:
    """llama.cpp's row in ``bench quant``: median decode tok/s over the rounds, its ratio to the
    engine's base dtype, bytes per token, and how many leading greedy tokens equal ``reference``
    (the engine's in its base dtype)."""
    med = statistics.median(rates)
    info = decoder.describe()
    same = next((i for i, (a, b) in enumerate(zip(tokens, reference, strict=False)) if a != b),
                min(len(tokens), len(reference)))
    return {"decode_tokens_per_s": med, "by_round": rates, "speedup_vs_base": med / base_rate,
            "gemm_weight_bytes_per_token": info["bytes_per_token"],
            "gemm_path": f"llama.cpp ({info['gguf']}, llama-cpp-python {info['llama_cpp_python']})",
            "same_greedy_tokens_as_base": same, "build": info}
