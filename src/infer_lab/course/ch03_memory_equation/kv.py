"""The KV formula on one model: its real code, its numbers, its growth, and talk 2's rule of thumb."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...analysis import memory
from ...analysis.memory import ModelLike, as_shape
from ...catalog import get_gpu
from ...figures import finish, subplots
from ...units import GB, KiB, fmt_bytes, human
from ..library_code import code_block

# Talk 2 (Daniel, Cerebras; talks/T4-system-talk.txt): "for a model with 70 billion parameters ... for every
# 3000 tokens, you need 1 GB of additional KV cache", for one request.
RULE_OF_THUMB_TOKENS, RULE_OF_THUMB_BYTES, RULE_OF_THUMB_MODEL = 3_000, 10**9, "llama-3-70b"


def kv_summary(model: ModelLike, kv_dtype: str = "bf16", context: int = 4096, users: int = 80) -> memory.KVReport:
    return memory.kv_report(model, context=context, users=users, kv_dtype=kv_dtype)


def attention_line(model: ModelLike) -> str:
    """'32 layers, GQA: 8 KV heads of 128 (of 32 query heads)' from the config."""
    shape = as_shape(model)
    if shape.mla:
        attn = f"MLA: latent {shape.mla.kv_lora_rank} + RoPE key {shape.mla.qk_rope_head_dim}"
    else:
        attn = f"{shape.attention_kind}: {shape.kv_heads} KV heads of {shape.head_dim} (of {shape.heads} query heads)"
    return f"{shape.layers} layers, {attn}"


def kv_summary_text(report: memory.KVReport) -> str:
    """The KV numbers of one model as a markdown table (exact bytes and GB/GiB)."""
    rows = [("KV per token per layer", report.kv_bytes_per_token_per_layer),
            ("KV per token (all layers)", report.kv_bytes_per_token),
            (f"one user, {report.context:,} tokens", report.kv_bytes_per_user),
            (f"{report.users:,} users, {report.context:,} tokens each", report.kv_bytes_total)]
    lines = [f"### {report.model}: {attention_line(report.model)}", "",
             f"| KV in {report.kv_dtype} | bytes | GB (GiB) |", "|---|---:|---|"]
    lines += [f"| {what} | {n:,} | {fmt_bytes(n)} |" for what, n in rows]
    if report.sliding_window_layers:
        lines += ["", f"{report.sliding_window_layers} of {report.layers} layers use a sliding window: "
                      "their cache stops growing at the window."]
    return "\n".join(lines)


def units_example(model: ModelLike = "mistral-7b", kv_dtype: str = "bf16") -> str:
    """'"131 KB" and "128 KiB" are the same 131,072 bytes' for one model's KV per token."""
    n = memory.kv_bytes_per_token(model, kv_dtype)
    return (f"{as_shape(model).name}'s KV per token in {kv_dtype}, \"{n / 1e3:.0f} KB\" and \"{n / KiB:.0f} KiB\", "
            f"are the same {n:,} bytes")


@dataclass(frozen=True)
class RuleOfThumb:
    """Talk 2's "1 GB of KV per 3,000 tokens for a 70B model" against the KV formula on one model."""

    model: str
    kv_dtype: str
    kv_bytes_per_token: int  # from the formula (B)
    rule_tokens: int  # tokens in the rule
    rule_bytes: int  # bytes in the rule (B)

    @property
    def formula_bytes(self) -> int:
        """What the formula gives for the rule's tokens (B)."""
        return self.kv_bytes_per_token * self.rule_tokens

    @property
    def tokens_per_rule_bytes(self) -> float:
        """Tokens of KV that the rule's bytes hold, by the formula."""
        return self.rule_bytes / self.kv_bytes_per_token

    @property
    def rule_over_formula(self) -> float:
        return self.rule_bytes / self.formula_bytes


def rule_of_thumb(model: ModelLike = RULE_OF_THUMB_MODEL, kv_dtype: str = "bf16",
                  rule_tokens: int = RULE_OF_THUMB_TOKENS, rule_bytes: int = RULE_OF_THUMB_BYTES) -> RuleOfThumb:
    """The rule of thumb (``rule_bytes`` of KV per ``rule_tokens`` tokens) next to the KV formula on ``model``."""
    return RuleOfThumb(as_shape(model).name, kv_dtype, memory.kv_bytes_per_token(model, kv_dtype), rule_tokens,
                       rule_bytes)


def rule_of_thumb_text(rule: RuleOfThumb) -> str:
    """The rule, the formula's answer and how close they are, every number from ``rule``."""
    gap = rule.rule_over_formula - 1
    closeness = (f"the rule is **{abs(gap):.1%} {'above' if gap > 0 else 'below'}** the formula" if abs(gap) >= 0.0005
                 else "the rule and the formula agree")
    verdict = ("a good rule of thumb" if abs(gap) <= 0.05 else
               f"{'an overestimate' if gap > 0 else 'an underestimate'} by {human(max(rule.rule_over_formula, 1 / rule.rule_over_formula), 3)}×")
    return (f"Talk 2 (Daniel, Cerebras) gives a rule of thumb for a 70-billion-parameter model: **{human(rule.rule_bytes / GB, 3)} GB "
            f"of KV per {rule.rule_tokens:,} tokens**, for one request. The formula on {rule.model} ({rule.kv_dtype} KV) "
            f"gives {rule.kv_bytes_per_token:,} B per token, so {rule.rule_tokens:,} tokens take "
            f"{human(rule.formula_bytes / GB, 3)} GB and {human(rule.rule_bytes / GB, 3)} GB holds {rule.tokens_per_rule_bytes:,.0f} "
            f"tokens: {closeness}, {verdict} for this model and KV dtype.")


def kv_formula_code() -> str:
    """The KV formula, the library's real code (:mod:`infer_lab.analysis.memory`), docstrings left out."""
    return code_block(memory.kv_elements_per_token_per_layer, memory.kv_bytes_per_token_per_layer,
                      memory.kv_bytes_per_token)


def kv_growth_figure(model: ModelLike, kv_dtype: str = "bf16", users: tuple[int, ...] = (1, 8, 32, 80),
                     max_tokens: int = 32768, gpu: str | None = None, weight_dtype: str = "bf16"):
    """KV bytes (GB = 1e9 B) vs tokens per user, one line per user count, on log axes; weights and GPU lines."""
    shape = as_shape(model)
    tokens = np.unique(np.geomspace(128, max_tokens, 48).astype(int))
    fig, ax = subplots(figsize=(7, 4))
    for u in users:
        ax.plot(tokens, [memory.kv_bytes(shape, int(t), u, kv_dtype) / GB for t in tokens], label=f"KV, {u:,} user{'' if u == 1 else 's'}")
    w = memory.weight_bytes(shape, weight_dtype).total / GB
    ax.axhline(w, color="k", ls="--", lw=1, label=f"weights ({weight_dtype}) {human(w, 3)} GB")
    if gpu:
        spec = get_gpu(gpu)
        ax.axhline(spec.memory_bytes / GB, color="r", ls=":", lw=1,
                   label=f"{spec.name} memory {human(spec.memory_bytes / GB, 3)} GB")
    ax.set(xscale="log", yscale="log", xlabel="tokens per user (context), log scale", ylabel="GB (10⁹ B), log scale")
    ax.set_xscale("log", base=2)
    ax.set_title(f"KV cache of {shape.name} ({shape.attention_kind}, KV in {kv_dtype}): analytic, no hardware",
                 fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    finish(fig)
    return fig
