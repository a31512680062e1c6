"""Chapter 03, "The memory equation": weights + overhead + KV per token, checked against real tensors.

Everything but the last part is arithmetic on a model's ``config.json``
(:mod:`infer_lab.analysis.memory` and :mod:`infer_lab.analysis.params`): no weights, no GPU,
so the notebook runs it live as the learner moves the controls. The last part loads a model
and counts its bytes from the tensors themselves: the weights from the parameters, the KV
from the cache's K and V tensors after a generation.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis import memory
from ..analysis.compare import dtype_name
from ..analysis.memory import ModelLike, as_shape
from ..analysis.params import param_counts
from ..attention.kv_sizing import mla_ratio_explained
from ..figures import finish
from ..units import GB, KiB, fmt_bytes, human
from .calculator import DEFAULTS_KV, KVCurves, kv_curves, kv_visualizer_figure
from .chapter import ChapterResult, chapter_number, choose_size, run_parts
from .library_code import code_block
from .notebook_code import notebook_function
from .tables import Column, people_table

NUMBER = "03"
SLUG = "memory_equation"
TITLE = "03 · The memory equation: weights, overhead and KV per token"
NEEDS_MODEL = True
PARTS = {
    "equation": "The memory equation for every catalogued model (analytic: runs live)",
    "check": "Load the model and count its bytes",
}
MLA_EXAMPLE = "deepseek-v3"
# The planner's defaults, read from the functions that apply them (one source for the words and the numbers).
PLANNER_MEMORY_FRACTION: float = inspect.signature(memory.fit).parameters["memory_fraction"].default
KEPT_DTYPE: str = inspect.signature(memory.weight_bytes).parameters["keep_dtype"].default
# Talk 2 (Daniel, Cerebras; talks/T4-system-talk.txt): "for a model with 70 billion parameters ... for every
# 3000 tokens, you need 1 GB of additional KV cache", for one request.
RULE_OF_THUMB_TOKENS, RULE_OF_THUMB_BYTES, RULE_OF_THUMB_MODEL = 3_000, 10**9, "llama-3-70b"


@dataclass(frozen=True)
class Sizes:
    """The analytic defaults (what the notebook's controls start at) and the size of the tensor check."""

    size: str
    model: str
    kv_dtype: str
    context: int
    users: int
    gpu: str
    growth_users: tuple[int, ...]  # one line per user count in the KV-growth figure
    growth_max_tokens: int
    check_batch: int
    check_prompt_len: int
    check_new_tokens: int


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """The check is a 2 x 16-token prompt at ``quick`` (under a second on a CPU), 2 x 256 at ``full``."""
    size = choose_size(device, size)
    d = DEFAULTS_KV
    return Sizes(size, model=d["model"], kv_dtype=d["kv_dtype"], context=d["context"], users=d["users"],
                 gpu=d["gpu"], growth_users=(1, 8, 32, 80), growth_max_tokens=32768, check_batch=2,
                 check_prompt_len=16 if size == "quick" else 256, check_new_tokens=4)


# ---------------------------------------------------------------------------------------------
# Typed results


@dataclass(frozen=True)
class ModelMemoryRow:
    """One catalogued model: its KV per token and per user at ``context``, and its weights."""

    model: str
    attention: str
    layers: int
    kv_dtype: str
    context: int
    kv_bytes_per_token: int
    kv_bytes_per_user: int
    params_total: int
    params_active: int
    weight_dtype: str
    weight_bytes: int


@dataclass(frozen=True)
class ParamRow:
    component: str
    parameters: int


@dataclass(frozen=True)
class WeightFormatRow:
    """The weights of one model in one storage format; the KV per token does not change with it."""

    dtype: str
    bits_per_weight: float  # matmul weights, scales included
    scales: str
    weight_bytes: int
    kv_bytes_per_token_bf16: int


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


@dataclass(frozen=True)
class TradeoffPoint:
    context: int
    max_users: int
    kv_bytes_per_user: int


@dataclass(frozen=True)
class FitView:
    """One workload on one GPU: the fit report, the longest context for one user, the context/users curve."""

    model: str
    gpu: str
    gpu_memory_bytes: int
    kv_dtype: str
    context: int
    users: int
    fit: memory.FitReport
    max_context_one_user: int  # what memory allows, before the model's own limit
    tradeoff: list[TradeoffPoint]
    memory_fraction: float = PLANNER_MEMORY_FRACTION
    prefill_chunk: int = 2048
    context_limit: int = 0  # the model's max_position_embeddings (0: unknown)
    dropped_contexts: tuple[int, ...] = ()  # trade-off contexts past the model's limit, left out


@dataclass(frozen=True)
class EquationResult:
    """The analytic part at the chapter's defaults."""

    report: memory.KVReport
    models: list[ModelMemoryRow]
    params: list[ParamRow]
    weight_formats: list[WeightFormatRow]
    mla: MLATrap
    curves: KVCurves
    fit: FitView
    growth_users: tuple[int, ...]
    growth_max_tokens: int
    gpu: str


@dataclass(frozen=True)
class BytesCheck:
    what: str
    predicted: int
    measured: int

    @property
    def measured_over_predicted(self) -> float:
        return self.measured / self.predicted


@dataclass(frozen=True)
class CheckResult:
    """The memory equation against the tensors of a loaded model."""

    model: str
    dtype: str
    batch: int
    cached_tokens: int
    rows: list[BytesCheck]


@dataclass
class Result(ChapterResult):
    """Chapter 03's results; a part not run is ``None``."""

    model: str = ""
    equation: EquationResult | None = None
    check: CheckResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


# ---------------------------------------------------------------------------------------------
# The analytic part (live in the notebook)


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


def model_rows(context: int = 4096, kv_dtype: str = "bf16", weight_dtype: str = "bf16",
               models: list[str] | None = None) -> list[ModelMemoryRow]:
    """Every catalogued model (or ``models``) at the same context and dtypes."""
    from ..catalog import list_models

    rows = []
    for name in models or list_models():
        r = memory.kv_report(name, context=context, kv_dtype=kv_dtype)
        w = memory.weight_bytes(name, weight_dtype)
        rows.append(ModelMemoryRow(name, r.attention, r.layers, kv_dtype, context, r.kv_bytes_per_token,
                                   r.kv_bytes_per_user, w.params.total, w.params.active, weight_dtype, w.total))
    return rows


def models_notes(rows: list[ModelMemoryRow]) -> str:
    """What the model table's columns hide: sliding-window layers (KV per user below KV per token x
    context) and what "active parameters" of a mixture of experts counts (markdown, '' if nothing)."""
    notes = []
    for r in rows:
        full = r.kv_bytes_per_token * r.context
        if r.kv_bytes_per_user < full:
            rep = memory.kv_report(r.model, context=r.context, kv_dtype=r.kv_dtype)
            notes.append(f"- **{r.model}**: KV per user is {r.kv_bytes_per_user / full:.0%} of KV per token × "
                         f"{r.context:,} tokens, because {rep.sliding_window_layers} of its {r.layers} layers use a "
                         "sliding window and stop caching at the window; KV per token counts every layer.")
        if r.params_active < r.params_total:
            counts = param_counts(as_shape(r.model))
            notes.append(f"- **{r.model}**: its {r.params_active / 1e9:.2f} B active parameters count the embedding "
                         f"table ({counts.embeddings / 1e9:.2f} B) as if every row were used. A token reads one row "
                         f"of it, so without it the active count is {(r.params_active - counts.embeddings) / 1e9:.2f} B, "
                         "and model cards differ on whether they count it.")
    return "\n".join(notes)


def param_rows(model: ModelLike) -> list[ParamRow]:
    """Parameters by component (exact: tests compare them with a meta-device build)."""
    counts = param_counts(as_shape(model)).as_dict()
    return [ParamRow(k, v) for k, v in counts.items()]


def weight_format_rows(model: ModelLike) -> list[WeightFormatRow]:
    """The model's weights in every format; the KV cache (bf16) is the same in each."""
    shape = as_shape(model)
    kv = memory.kv_bytes_per_token(shape, "bf16")
    return [WeightFormatRow(name, fmt.bits_per_element, fmt.note or "none (plain floats)", memory.weight_bytes(shape, name).total, kv)
            for name, fmt in memory.WEIGHT_FORMATS.items()]


def mla_trap(model: ModelLike = MLA_EXAMPLE, kv_dtype: str = "bf16") -> MLATrap:
    """The MLA model's KV per token: right, per layer, and with the blind GQA formula."""
    shape = as_shape(model)
    if not shape.mla:
        raise ValueError(f"{shape.name} does not use MLA")
    variants = [VariantRow(**v) for v in memory.attention_variants(shape, kv_dtype)]
    from .ch07_attention_variants import TALK_MLA_CORRECTED, ratio_matching

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
    from .ch07_attention_variants import TALK_MATCH

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


def fit_view(model: ModelLike, gpu: str, context: int, users: int, kv_dtype: str = "bf16",
             contexts: list[int] | None = None) -> FitView:
    """Does ``users`` x ``context`` fit on one ``gpu``, and how context trades against users there."""
    from ..catalog import get_gpu

    spec = get_gpu(gpu)
    shape = as_shape(model)
    contexts = contexts or [1024 * 2**i for i in range(8)]
    readable = memory.within_limit(shape, contexts)
    report = memory.fit(shape, spec.memory_bytes, context, users=users, kv_dtype=kv_dtype)
    trade = [TradeoffPoint(**r) for r in memory.context_users_tradeoff(shape, spec.memory_bytes, readable,
                                                                        kv_dtype=kv_dtype)]
    return FitView(shape.name, spec.name, spec.memory_bytes, kv_dtype, context, users, report,
                   memory.max_context(shape, spec.memory_bytes, users=1, kv_dtype=kv_dtype), trade,
                   context_limit=memory.context_limit(shape),
                   dropped_contexts=tuple(c for c in contexts if c not in readable))


def fit_text(view: FitView) -> str:
    f = view.fit
    verdict = (f"**Fits**, {fmt_bytes(f.headroom_bytes)} to spare." if f.fits else
               f"**Does not fit**: short by {f.shortfall_bytes:,} B ({fmt_bytes(f.shortfall_bytes)}).")
    return (
        f"{view.model} on one **{view.gpu}** ({fmt_bytes(view.gpu_memory_bytes)}; "
        f"{view.memory_fraction:.0%} usable), {view.users:,} users × {view.context:,} tokens: weights "
        f"{fmt_bytes(f.weight_bytes)}, overhead {fmt_bytes(f.overhead_bytes)}, KV {fmt_bytes(f.kv_needed_bytes)}. "
        f"{verdict} At most **{f.max_users:,} users** at this context; " + one_user_text(view)
        + (f" **{view.model} reads at most {view.context_limit:,} positions, so {view.context:,} tokens is past what "
           "it can serve at all**, whatever the memory." if view.context_limit and view.context > view.context_limit
           else "")
        + (f" The trade-off table stops at the model's limit (left out: {', '.join(f'{c:,}' for c in view.dropped_contexts)} "
           "tokens)." if view.dropped_contexts else "")
    )


def one_user_text(view: FitView) -> str:
    """The longest context of one user: the memory's answer, capped at the model's own limit."""
    if view.context_limit and view.max_context_one_user > view.context_limit:
        return (f"memory would hold one user's KV for {view.max_context_one_user:,} tokens, but {view.model} reads "
                f"at most **{view.context_limit:,} positions**, so that is one user's limit.")
    return f"one user can have up to **{view.max_context_one_user:,} tokens**."




# vLLM's default for ``gpu_memory_utilization``: 0.92 in vLLM's current source (``vllm/config/cache.py``,
# ``CacheConfig.gpu_memory_utilization``, read 2026-12); 0.9 before (vLLM 0.6.4's engine-argument docs,
# docs.vllm.ai/en/v0.6.4/models/engine_args.html). Not tied to a release: the snapshot read names no version,
# and the default of the vLLM this course pins for CPU runs (``local_engines.SPECS``) was not checked.
VLLM_MEMORY_UTILIZATION = 0.92
VLLM_OLD_MEMORY_UTILIZATION = 0.9


def memory_fraction_text(memory_fraction: float = PLANNER_MEMORY_FRACTION) -> str:
    """Where the usable fraction of the GPU's memory comes from: a setting of the planner (and of
    engines), not a property of the GPU."""
    return (f"the planner counts {memory_fraction:.0%} of the GPU's memory as usable: its default `memory_fraction`, "
            "an engine setting rather than a property of the GPU (vLLM's `gpu_memory_utilization` is the same knob: "
            f"current vLLM source, `vllm/config/cache.py`, defaults to {VLLM_MEMORY_UTILIZATION:g}; older releases and "
            f"docs said {VLLM_OLD_MEMORY_UTILIZATION:g}, vLLM 0.6.4's among them). The capacity calculator's "
            f"\"memory fraction\" slider (chapter {chapter_number('capacity_planner')}) changes it")


def fit_intro(prefill_chunk: int = 2048, memory_fraction: float = PLANNER_MEMORY_FRACTION) -> str:
    """How the fit is computed, with the defaults of :func:`infer_lab.analysis.memory.fit`."""
    return (
        f"Usable memory: {memory_fraction_text(memory_fraction)}. After the weights and an overhead term (a "
        f"runtime reserve of {fmt_bytes(memory.DEFAULT_RUNTIME_OVERHEAD_BYTES)} plus the activation workspace of "
        f"a {prefill_chunk:,}-token prefill chunk), the rest is KV budget. At a fixed GPU and model you trade "
        "context length against concurrent users."
    )


def kept_dtype_text(keep_dtype: str = KEPT_DTYPE) -> str:
    """What a quantized format leaves unquantized (:func:`infer_lab.analysis.memory.weight_bytes`)."""
    return (f"the embeddings, the LM head and the norms stay in {keep_dtype} (a released quantized checkpoint can "
            "keep more, as its config's `modules_to_not_convert` lists)")


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


def equation(sizes: Sizes) -> EquationResult:
    """The analytic part at the chapter's defaults (what the notebook's controls start at)."""
    return EquationResult(
        report=kv_summary(sizes.model, sizes.kv_dtype, sizes.context, sizes.users),
        models=model_rows(sizes.context, sizes.kv_dtype),
        params=param_rows(sizes.model),
        weight_formats=weight_format_rows(sizes.model),
        mla=mla_trap(),
        curves=kv_curves(sizes.model, sizes.kv_dtype, sizes.context, sizes.users, gpu=sizes.gpu),
        fit=fit_view(sizes.model, sizes.gpu, sizes.context, sizes.users, sizes.kv_dtype),
        growth_users=sizes.growth_users,
        growth_max_tokens=sizes.growth_max_tokens,
        gpu=sizes.gpu,
    )


# ---------------------------------------------------------------------------------------------
# The check on this machine


def check_result(lm: Any, rows: list[tuple[str, int, int]], batch: int, cached_tokens: int) -> CheckResult:
    """What the notebook's ``bytes_predicted_vs_counted`` returns ([(what, predicted, counted)]) as a
    :class:`CheckResult`."""
    return CheckResult(lm.describe(), dtype_name(lm), batch, cached_tokens, [BytesCheck(*r) for r in rows])


def run_check(lm: Any, sizes: Sizes) -> CheckResult:
    """Run the notebook's own experiment (``bytes_predicted_vs_counted`` of ``infer_lab/notebooks/03_memory_equation.py``)."""
    experiment = notebook_function(NUMBER, "bytes_predicted_vs_counted")
    rows, cached = experiment(lm, sizes.check_batch, sizes.check_prompt_len, sizes.check_new_tokens)
    return check_result(lm, rows, sizes.check_batch, cached)


def kv_formula_code() -> str:
    """The KV formula, the library's real code (:mod:`infer_lab.analysis.memory`), docstrings left out."""
    return code_block(memory.kv_elements_per_token_per_layer, memory.kv_bytes_per_token_per_layer,
                      memory.kv_bytes_per_token)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's parts in a row (``parts`` picks some of :data:`PARTS`)."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else "")
    return run_parts(result, parts, PARTS, {
        "equation": lambda: equation(sizes),
        "check": lambda: run_check(lm, sizes),
    })


def check_text(check: CheckResult) -> str:
    worst = max(abs(r.measured_over_predicted - 1) for r in check.rows)
    verdict = "the equation is exact" if worst == 0 else f"they differ by at most {human(100 * worst, 3)}%"
    return (f"Measured on **{check.model}**: predicted and measured bytes agree: {verdict}. "
            f"The KV counts {check.batch} sequences × {check.cached_tokens} cached tokens (the last generated "
            "token is never fed back, so it has no KV yet).")


# ---------------------------------------------------------------------------------------------
# Tables and figures


MODEL_COLUMNS = [
    Column("model", "model", "text"), Column("attention", "attention", "text"), Column("layers", "layers", "int"),
    Column("kv_bytes_per_token", "KV per token (B)", "int"), Column("kv_bytes_per_user", "KV per user", "bytes"),
    Column("params_total", "parameters", "int"), Column("params_active", "active parameters", "int"),
    Column("weight_bytes", "weights", "bytes"),
]
PARAM_COLUMNS = [Column("component", "component", "text"), Column("parameters", "parameters", "int")]
WEIGHT_FORMAT_COLUMNS = [
    Column("dtype", "weight dtype", "text"), Column("bits_per_weight", "bits per weight (matmuls)"),
    Column("scales", "scales", "text"), Column("weight_bytes", "weights", "bytes"),
    Column("kv_bytes_per_token_bf16", "KV per token, bf16 KV (B)", "int"),
]
VARIANT_COLUMNS = [
    Column("variant", "attention", "text"), Column("kv_bytes_per_token_per_layer", "KV per token per layer (B)", "int"),
    Column("kv_bytes_per_token", "KV per token, all layers (B)", "int"), Column("mha_over_variant", "MHA ÷ this", "ratio"),
]
TRADEOFF_COLUMNS = [
    Column("context", "context (tokens)", "int"), Column("max_users", "max users", "int"),
    Column("kv_bytes_per_user", "KV per user", "bytes"),
]
CHECK_COLUMNS = [
    Column("what", "what", "text"), Column("predicted", "predicted (B)", "int"), Column("measured", "measured (B)", "int"),
    Column("measured_over_predicted", "measured ÷ predicted", "ratio", digits=4),
]


def models_table(rows: list[ModelMemoryRow]):
    return people_table(rows, MODEL_COLUMNS)


def params_table(rows: list[ParamRow]):
    return people_table(rows, PARAM_COLUMNS)


def weight_formats_table(rows: list[WeightFormatRow]):
    return people_table(rows, WEIGHT_FORMAT_COLUMNS)


def variants_table(trap: MLATrap):
    return people_table(trap.variants, VARIANT_COLUMNS)


def tradeoff_table(view: FitView):
    return people_table(view.tradeoff, TRADEOFF_COLUMNS)


def check_table(check: CheckResult):
    return people_table(check.rows, CHECK_COLUMNS)


def tables(result: Result) -> dict[str, Any]:
    out = {}
    if result.equation:
        eq = result.equation
        first = eq.models[0]
        out[f"Every catalogued model at {first.context:,} tokens (KV in {first.kv_dtype}, weights in "
            f"{first.weight_dtype})"] = models_table(eq.models)
        out[f"Parameters of {eq.report.model}"] = params_table(eq.params)
        out[f"Weights of {eq.report.model} by storage format"] = weight_formats_table(eq.weight_formats)
        out[f"KV per token of the {eq.mla.model} shape under each attention variant"] = variants_table(eq.mla)
        out[f"Context against users on one {eq.fit.gpu}"] = tradeoff_table(eq.fit)
    if result.check:
        out["Predicted vs measured bytes on this machine"] = check_table(result.check)
    return out


def summary(result: Result) -> str:
    lines = []
    if result.equation:
        eq = result.equation
        lines += [kv_summary_text(eq.report), mla_text(eq.mla), fit_text(eq.fit)]
        if eq.models and models_notes(eq.models):
            lines.append(models_notes(eq.models))
    if result.check:
        lines.append(check_text(result.check))
    return "\n\n".join(lines)


def kv_growth_figure(model: ModelLike, kv_dtype: str = "bf16", users: tuple[int, ...] = (1, 8, 32, 80),
                     max_tokens: int = 32768, gpu: str | None = None, weight_dtype: str = "bf16"):
    """KV bytes (GB = 1e9 B) vs tokens per user, one line per user count, on log axes; weights and GPU lines."""
    import numpy as np

    from ..figures import subplots

    shape = as_shape(model)
    tokens = np.unique(np.geomspace(128, max_tokens, 48).astype(int))
    fig, ax = subplots(figsize=(7, 4))
    for u in users:
        ax.plot(tokens, [memory.kv_bytes(shape, int(t), u, kv_dtype) / GB for t in tokens], label=f"KV, {u:,} user{'' if u == 1 else 's'}")
    w = memory.weight_bytes(shape, weight_dtype).total / GB
    ax.axhline(w, color="k", ls="--", lw=1, label=f"weights ({weight_dtype}) {human(w, 3)} GB")
    if gpu:
        from ..catalog import get_gpu

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


def figures(result: Result) -> dict[str, Any]:
    out = {}
    if result.equation:
        eq = result.equation
        out["kv_growth"] = kv_growth_figure(eq.report.model, eq.report.kv_dtype, eq.growth_users,
                                            eq.growth_max_tokens, eq.gpu)
        out["kv_visualizer"] = kv_visualizer_figure(eq.curves)
    return out


def saved() -> None:
    """Nothing saved from a GPU: the equation is exact, and the check takes a second on any machine."""
    return None


# ---------------------------------------------------------------------------------------------
# Foundations: the autoregressive loop and where its FLOPs are (the deck's foundations section)


@dataclass(frozen=True)
class LoopStage:
    """One stage of generating a token: what it does and its size for the chosen model."""

    stage: str
    what: str
    size: str


@dataclass(frozen=True)
class FlopShare:
    """FLOPs of one decode step at ``context`` for one sequence, by where they are spent."""

    model: str
    context: int
    layers_flops: float  # projections, attention and MLP of all decoder layers
    attention_flops: float  # the part of layers_flops that is scores + weighted sum over the cache
    embedding_flops: float  # a table lookup: no multiply-adds
    head_flops: float  # the LM head's logits
    embedding_params: int
    head_params: int  # 0 when tied to the embeddings (the head still costs FLOPs)
    layer_params: int

    @property
    def total_flops(self) -> float:
        return self.layers_flops + self.embedding_flops + self.head_flops

    @property
    def layers_share(self) -> float:
        return self.layers_flops / self.total_flops

    @property
    def head_share(self) -> float:
        return self.head_flops / self.total_flops


def loop_stages(model: ModelLike = "mistral-7b", kv_dtype: str = "bf16") -> list[LoopStage]:
    """The autoregressive loop for ``model``: tokenize, embed, N layers, LM head, sample, feed back."""
    shape = as_shape(model)
    kv_layer = memory.kv_bytes_per_token_per_layer(shape, kv_dtype)
    return [
        LoopStage("tokenize", "text → token ids", f"a vocabulary of {shape.vocab:,} tokens"),
        LoopStage("embed", "each id picks one row of the embedding table (a lookup, no matmul)",
                  f"{shape.vocab:,} × {shape.hidden:,} table; a vector of {shape.hidden:,} per token"),
        LoopStage(f"{shape.layers} layers", "each: norm → attention (Q, K, V projections; K and V appended to the "
                  "cache) → norm → MLP", f"{attention_line(shape)}; KV {kv_layer:,} B per token per layer "
                  f"({kv_dtype})"),
        LoopStage("LM head", "the last vector → one logit per vocabulary entry",
                  f"{shape.hidden:,} × {shape.vocab:,} matmul"),
        LoopStage("sample", "pick the next token from the logits (greedy, or temperature / top-p)",
                  "one token per sequence per step"),
        LoopStage("feed back", "the new token goes back to 'embed'; the prompt was one prefill pass, every "
                  "further token is one decode step", "until end-of-sequence or the length limit"),
    ]


def flop_share(model: ModelLike = "mistral-7b", context: int = 4096) -> FlopShare:
    """Where one decode step's FLOPs are (one sequence, ``context`` tokens), from the roofline's op count."""
    from ..analysis.roofline import decode_ops

    shape = as_shape(model)
    ops = decode_ops(shape, 1, context)
    head = sum(o.flops for o in ops if o.name == "LM head")
    attention = sum(o.flops for o in ops if o.name.startswith("attention"))
    counts = param_counts(shape)
    return FlopShare(shape.name, context, sum(o.flops for o in ops) - head, attention, 0.0, head,
                     counts.embeddings, counts.lm_head, counts.active - counts.embeddings - counts.lm_head)


def flop_share_rows(context: int = 4096, models: list[str] | None = None) -> list[FlopShare]:
    """:func:`flop_share` for every catalogued model (or ``models``)."""
    from ..catalog import list_models

    return [flop_share(m, context) for m in models or list_models()]


def attention_crossover_context(model: ModelLike = "mistral-7b") -> int:
    """The context (tokens) from which attention over the cache takes at least half of a decode
    step's layer FLOPs (its cost grows with context; the projections and MLP do not)."""
    lo, hi = 1, 2**24
    while lo < hi:
        mid = (lo + hi) // 2
        share = flop_share(model, mid)
        if share.attention_flops >= share.layers_flops / 2:
            hi = mid
        else:
            lo = mid + 1
    return lo


def attention_claim_text(model: ModelLike = "mistral-7b", context: int = 4096) -> str:
    """The talk's "attention is the most compute-intensive layer", against the FLOP count (analytic)."""
    share = flop_share(model, context)
    cross = attention_crossover_context(model)
    limit = memory.context_limit(model)
    where = (f"only beyond {cross:,} tokens of context" if cross <= limit
             else f"only beyond {cross:,} tokens, past the {limit:,} positions it can read")
    return (
        f"The talk calls attention the most compute-intensive layer. By FLOPs, for {share.model} at {context:,} "
        f"tokens it is {share.attention_flops / share.layers_flops:.1%} of the layer FLOPs of a decode step; it "
        f"overtakes the projections and MLP together {where}, because it is the only part whose work grows with the "
        "context. What makes attention expensive at ordinary contexts is memory, not FLOPs: each step reads the "
        f"whole KV cache (chapter {chapter_number('prefill_decode_roofline')}), and prefill's attention is quadratic "
        "in the prompt."
    )


def loop_text(model: ModelLike = "mistral-7b", context: int = 4096) -> str:
    """The loop in words with the FLOP split for ``model`` (markdown)."""
    share = flop_share(model, context)
    head = ("tied to the embedding table, so no extra weights, but its matmul still runs every step"
            if not share.head_params else f"{share.head_params:,} parameters of its own")
    return (
        f"Generating one token of **{share.model}** at {context:,} tokens of context takes "
        f"{human(share.total_flops / 1e9, 3)} GFLOP. **{share.layers_share:.1%}** of them are in the decoder layers "
        f"({share.attention_flops / share.layers_flops:.1%} of those in attention over the cache), "
        f"{share.head_share:.1%} in the LM head ({head}), and none in the embedding, which is a lookup. "
        "Every one of these steps re-reads every weight, and the loop runs once per generated token. "
        + attention_claim_text(model, context)
    )


def loop_table(model: ModelLike = "mistral-7b"):
    return people_table(loop_stages(model), [Column("stage", "stage", "text"), Column("what", "what happens", "text"),
                                             Column("size", "for this model", "text")])


def flop_share_table(rows: list[FlopShare]):
    return people_table(rows, [
        Column("model", "model", "text"), Column("total_flops", "GFLOP per token", scale=1e-9),
        Column("layers_share", "in the layers", "pct"), Column("head_share", "in the LM head", "pct"),
        Column("embedding_flops", "in the embedding (FLOP)", "int"),
    ])


def flop_share_figure(rows: list[FlopShare]):
    """Stacked bars: share of a decode step's FLOPs in the layers (attention, the rest) and the LM head."""
    from ..figures import subplots

    fig, ax = subplots(figsize=(7, 3.6))
    names = [r.model for r in rows]
    att = [100 * r.attention_flops / r.total_flops for r in rows]
    rest = [100 * (r.layers_flops - r.attention_flops) / r.total_flops for r in rows]
    head = [100 * r.head_share for r in rows]
    ax.barh(names, rest, label="layers: projections and MLP", color="tab:blue")
    ax.barh(names, att, left=rest, label="layers: attention over the cache", color="tab:cyan")
    ax.barh(names, head, left=[a + b for a, b in zip(rest, att, strict=True)], label="LM head", color="tab:orange")
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of one decode step's FLOPs (the embedding is a lookup: 0)")
    ax.set_title(f"Where the FLOPs of one token are, at {rows[0].context:,} tokens of context: analytic, no hardware",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    ax.grid(alpha=0.3, axis="x")
    finish(fig)
    return fig
