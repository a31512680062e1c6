"""Part 2 of chapter 07, MLA: its ratio against each baseline, the talk's 56x and 14x, and its RoPE key."""

from __future__ import annotations

from ...analysis import memory as kv_memory
from ...attention.kv_sizing import MLARatio, mla_ratio_explained
from ..tables import Column, people_table


def mla_text(ratios: dict[str, MLARatio] | None = None) -> str:
    r = ratios or mla_ratio_explained()
    a, b, c, d = r["same_shape_k128"], r["same_shape_k192"], r["7b_layer"], r["one_layer_mistake"]
    return (
        f"Against an MHA of DeepSeek-V3's own shape, MLA caches **{a.ratio:.0f}× less** if that MHA's K had the "
        f"value head dim ({a.k_head_dim}), and **{b.ratio:.0f}× less** with DeepSeek's real K head of "
        f"{b.k_head_dim} (the MHA DeepSeek would have had to cache). Against one MHA layer of a 7B-class model it "
        f"is **{c.ratio:.1f}×**. A whole MHA model against one MLA layer gives {d.ratio:,.0f}×: the layer count, "
        "not the attention, makes that number.\n\n"
        + talk_mla_text(r)
    )


# What the workshop (talk 1) said about MLA: its demo gave 56x, and the speaker corrected it: "it wasn't ...
# 56x it was 14x ... the demo had a mistake of a computation where it did not multiply the number of layers"
# (T0-workshop).
TALK_MLA_FIRST = 56.0
TALK_MLA_CORRECTED = 14.0
TALK_MATCH = 0.05  # a computed ratio within 5% of a figure the talk said is taken as the one it probably meant


def ratio_matching(said: float, ratios: dict[str, MLARatio], tolerance: float = TALK_MATCH) -> MLARatio | None:
    """The computed ratio nearest to a figure the talk said, when within ``tolerance`` of it (else ``None``)."""
    nearest = min(ratios.values(), key=lambda x: abs(x.ratio / said - 1))
    return nearest if abs(nearest.ratio / said - 1) <= tolerance else None


def talk_mla_text(ratios: dict[str, MLARatio], first: float = TALK_MLA_FIRST,
                  corrected: float = TALK_MLA_CORRECTED) -> str:
    """The talk's 56x and 14x against the ratios computed here: which each one probably is, or that none is.

    The transcript says only that the demo "did not multiply the number of layers"; what it computed is not
    in it, so the match is a reading of the numbers, said as "probably".
    """
    def reading(said: float) -> str:
        match = ratio_matching(said, ratios)
        if match is None:
            return f"none of the ratios computed here is within {TALK_MATCH:.0%} of {said:g}×"
        return f"{said:g}× is probably the {match.ratio:.1f}× of {match.comparison}"

    both = ratio_matching(first, ratios) is not None and ratio_matching(corrected, ratios) is not None
    return (
        "**About the talk's correction.** In the workshop (talk 1) the demo gave "
        f"{first:g}×, and the speaker corrected it to {corrected:g}×, saying the demo \"did not multiply the number "
        "of layers\". "
        "What the demo computed is not in the transcript, so this is a reading of the numbers: "
        f"{reading(first)}; {reading(corrected)}. "
        + ("Read that way, both are right answers to different questions: the like-for-like one (the same model, "
           "every layer on both sides, the layer counts cancel) and one MLA layer against one layer of another "
           "model. " if both else "")
        + "Say which baseline you mean."
    )


def mla_rope_text(model: str = "deepseek-v3") -> str:
    """Why MLA caches a separate RoPE key beside its latent, with the sizes from ``model``'s shape."""
    m = kv_memory.as_shape(model).mla
    if m is None:
        raise ValueError(f"{model} has no MLA attention")
    return (
        "**RoPE, and why MLA keeps a separate key for it.** RoPE (rotary position embedding) rotates each query and "
        "key vector by angles set by its position, so a query-key dot product depends on how far apart the two "
        "tokens are. MLA rebuilds each head's key from the cached latent with an up-projection, and at decode it "
        "folds that projection into the query instead (the absorbed path). A rotation that depends on the key's "
        "position would sit between the two, and a matrix that changes with every position cannot be folded in "
        f"once. So {model} caches a {m.kv_lora_rank}-value latent without position, plus one "
        f"{m.qk_rope_head_dim}-value key that carries RoPE, shared by all heads, per token per layer."
    )


MLA_COLUMNS = [
    Column("comparison", "comparison", "text"), Column("k_head_dim", "MHA K head dim", "int"),
    Column("mha_bytes_per_token", "MHA KV per token", "bytes"),
    Column("mla_bytes_per_token", "MLA KV per token", "bytes"),
    Column("ratio", "MHA / MLA", "ratio"), Column("fair", "fair", "bool"),
]


def mla_table(ratios: dict[str, MLARatio] | None = None):
    return people_table(list((ratios or mla_ratio_explained()).values()), MLA_COLUMNS)
