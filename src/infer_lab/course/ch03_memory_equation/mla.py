"""The MLA trap: the MLA model's KV per token, right, per layer and with the blind GQA formula."""

from __future__ import annotations

from dataclasses import dataclass

from ...analysis import memory
from ...analysis.memory import ModelLike, as_shape
from ...attention.kv_sizing import mla_ratio_explained
from ...units import human
from ..ch07_attention_variants import TALK_MATCH, TALK_MLA_CORRECTED, ratio_matching
from ..chapter import chapter_number
from ..tables import Column, people_table

MLA_EXAMPLE = "deepseek-v3"


@dataclass(frozen=True)
class VariantRow:
    variant: str
    kv_bytes_per_token_per_layer: int
    kv_bytes_per_token: int
    mha_over_variant: float


@dataclass(frozen=True)
class MLATrap:
    """The MLA model's KV, right and wrong: per layer vs all layers, and the blind GQA formula."""

    model: str
    layers: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    config_kv_heads: int
    bytes_per_element: int
    right: int  # B/token, all layers
    naive: int  # the GQA formula applied blindly
    one_layer: int  # MLA for one layer
    variants: list[VariantRow]
    per_layer_7b_model: str  # the often-quoted "about 14x": one MLA layer vs one MHA layer of a 7B model
    per_layer_7b_ratio: float
    talk_corrected: float = 0.0  # the workshop's corrected figure (chapter 07's TALK_MLA_CORRECTED)
    per_layer_7b_is_talk_figure: bool = False  # chapter 07's matching reads that figure as this ratio

    @property
    def mha_all_layers(self) -> int:
        return next(v.kv_bytes_per_token for v in self.variants if v.variant == "MHA")

    @property
    def naive_over_right(self) -> float:
        return self.naive / self.right

    @property
    def wrong_ratio(self) -> float:
        """MHA over all layers against MLA for one layer: inflated by the layer count."""
        return self.mha_all_layers / self.one_layer

    @property
    def right_ratio(self) -> float:
        return self.mha_all_layers / self.right


def mla_trap(model: ModelLike = MLA_EXAMPLE, kv_dtype: str = "bf16") -> MLATrap:
    """The MLA model's KV per token: right, per layer, and with the blind GQA formula."""
    shape = as_shape(model)
    if not shape.mla:
        raise ValueError(f"{shape.name} does not use MLA")
    variants = [VariantRow(**v) for v in memory.attention_variants(shape, kv_dtype)]

    seven_b = "mistral-7b"
    ratios = mla_ratio_explained(shape.name, seven_b)
    per_layer_7b = ratios["7b_layer"]
    match = ratio_matching(TALK_MLA_CORRECTED, ratios)
    return MLATrap(shape.name, shape.layers, shape.mla.kv_lora_rank, shape.mla.qk_rope_head_dim, shape.kv_heads,
                   memory.kv_bytes_per_element(kv_dtype), memory.kv_bytes_per_token(shape, kv_dtype),
                   memory.naive_kv_bytes_per_token(shape, kv_dtype),
                   memory.kv_bytes_per_token_per_layer(shape, kv_dtype), variants, seven_b, per_layer_7b.ratio,
                   TALK_MLA_CORRECTED, match is not None and match.comparison == per_layer_7b.comparison)


def talk_figure_words(trap: MLATrap) -> str:
    """Whether the per-layer ratio is the workshop's corrected figure, as chapter 07 reads it: "probably",
    since the transcript does not say what the demo computed."""
    if trap.per_layer_7b_is_talk_figure:
        return f"probably the talk's corrected {trap.talk_corrected:g}× (talk 1, the workshop)"
    return f"not the talk's corrected {trap.talk_corrected:g}× (more than {TALK_MATCH:.0%} from it)"


def mla_text(trap: MLATrap) -> str:
    width = trap.kv_lora_rank + trap.qk_rope_head_dim
    return (
        f"- MLA, all {trap.layers} layers: **{trap.right:,} B/token** ({trap.layers} × ({trap.kv_lora_rank} + "
        f"{trap.qk_rope_head_dim}) × {trap.bytes_per_element} B = {trap.layers} × {width} × "
        f"{trap.bytes_per_element} B).\n"
        f"- The blind GQA formula with the config's `num_key_value_heads: {trap.config_kv_heads}`: "
        f"{trap.naive:,} B/token, **{human(trap.naive_over_right, 3)}× too large**.\n"
        f"- A slip seen in published workshop material compares MLA for one layer with MHA for all layers. On "
        f"{trap.model}'s shape that slip gives {trap.wrong_ratio:,.0f}× ({trap.mha_all_layers:,} B against "
        f"{trap.one_layer:,} B; this is our computation, not that material's figure), inflated by the layer count. "
        f"Over all layers on both sides the ratio is **{human(trap.right_ratio, 3)}×**. Against one MHA layer of a "
        f"7B-class model ({trap.per_layer_7b_model}'s shape, all heads) it is {human(trap.per_layer_7b_ratio, 3)}× per "
        f"layer: {talk_figure_words(trap)}. It answers another question (a different model's layer); it does not "
        f"fix the {human(trap.right_ratio, 3)}×, which is the like-for-like ratio (chapter "
        f"{chapter_number('attention_variants')} explains both)."
    )


VARIANT_COLUMNS = [
    Column("variant", "attention", "text"), Column("kv_bytes_per_token_per_layer", "KV per token per layer (B)", "int"),
    Column("kv_bytes_per_token", "KV per token, all layers (B)", "int"), Column("mha_over_variant", "MHA ÷ this", "ratio"),
]


def variants_table(trap: MLATrap):
    return people_table(trap.variants, VARIANT_COLUMNS)
