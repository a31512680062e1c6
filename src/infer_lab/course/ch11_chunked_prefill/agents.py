"""Section 2 of chapter 11: coding agents, one huge prompt among decoding users on a catalog GPU (analytic)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ...analysis import memory, roofline
from ...catalog import get_gpu
from ..ch15_cluster import SERVING_SLO

AGENT_MODEL = "qwen2.5-7b-1m"  # a catalogued model that reads a million positions
AGENT_PROMPTS = (200_000, 1_000_000)  # a repository in the prompt: the range the talk gave for coding agents
AGENT_DECODERS, AGENT_DECODER_CONTEXT, AGENT_MAX_NUM_BATCHED_TOKENS = 32, 4096, 2048
# Token budgets searched for one that meets the target: 64..2,048 (a budget holds the decoders' tokens first).
AGENT_BUDGETS = tuple(2**i for i in range(6, 12))


def budgets_words(budgets: Sequence[int]) -> str:
    """The budgets tried, for people: "powers of two from 16 to 2,048", or the list when they are not."""
    ordered = sorted(budgets)
    if len(ordered) > 2 and ordered[0] > 0 and ordered[0] & (ordered[0] - 1) == 0 and \
            all(b * 2 == c for b, c in zip(ordered, ordered[1:], strict=False)):
        return f"powers of two from {ordered[0]:,} to {ordered[-1]:,}"
    return ", ".join(f"{b:,}" for b in ordered)


@dataclass(frozen=True)
class AgentPromptRow:
    """One long prompt arriving among ``decoders`` users on ``n_gpus`` x ``gpu`` (roofline bounds, seconds)."""

    gpu: str
    n_gpus: int
    prompt_tokens: int
    prefill_s: float  # the whole prompt in one go: every decoder's stall without chunking
    decode_step_s: float  # the decoders' step without the prompt
    steps_missed: float  # prefill_s / decode_step_s
    chunked_step_s: float  # a decode step with one chunk of the prompt in it, on average over the chunks
    max_num_batched_tokens: int  # the step's token budget: one token per decoder first, the prompt's chunk the rest
    decoders: int = AGENT_DECODERS

    @property
    def chunk_tokens(self) -> int:
        """The prompt's tokens in one chunked step: the budget less one token per decoder."""
        return self.max_num_batched_tokens - self.decoders

    @property
    def chunks(self) -> int:
        """How many steps the chunked prefill takes: the prompt over its share of the budget, rounded up."""
        return -(-self.prompt_tokens // self.chunk_tokens)

    @property
    def chunked_prefill_s(self) -> float:
        """The prompt's prefill spread over its chunks (seconds): every chunked step, decodes included."""
        return self.chunks * self.chunked_step_s

    def at_budget(self, max_num_batched_tokens: int) -> AgentPromptRow:
        """The same prompt, GPUs and decoders at a ``max_num_batched_tokens`` budget per step (same model: the
        step without the prompt plus the chunk's share of the whole prefill). The budget must hold every
        decoder's token and at least one of the prompt's."""
        if max_num_batched_tokens <= self.decoders:
            raise ValueError(f"a {max_num_batched_tokens}-token budget leaves no room for the prompt beside "
                             f"{self.decoders} decoders")
        chunk = max_num_batched_tokens - self.decoders
        return replace(self, chunked_step_s=self.decode_step_s + self.prefill_s * chunk / self.prompt_tokens,
                       max_num_batched_tokens=max_num_batched_tokens)


def usable_budgets(row: AgentPromptRow, budgets: Sequence[int]) -> list[int]:
    """The budgets of ``budgets`` that leave room for the prompt beside ``row``'s decoders."""
    return [b for b in budgets if b > row.decoders]


def largest_budget_meeting(row: AgentPromptRow, tpot_slo_s: float,
                           budgets: Sequence[int] = AGENT_BUDGETS) -> AgentPromptRow | None:
    """The largest token budget of ``budgets`` whose chunked step meets ``tpot_slo_s`` (seconds per token)
    for ``row``'s prompt, as a row at that budget; ``None`` when even the smallest does not."""
    fitting = [r for r in map(row.at_budget, usable_budgets(row, budgets)) if r.chunked_step_s <= tpot_slo_s]
    return max(fitting, key=lambda r: r.max_num_batched_tokens, default=None)


def agent_prompt_rows(gpu: str = "H100-SXM", model: str = AGENT_MODEL, prompts: tuple[int, ...] = AGENT_PROMPTS,
                      decoders: int = AGENT_DECODERS, decoder_context: int = AGENT_DECODER_CONTEXT,
                      max_num_batched_tokens: int = AGENT_MAX_NUM_BATCHED_TOKENS) -> list[AgentPromptRow]:
    """What a coding agent's prompt costs on ``gpu``: prefill time, and the decoders' stall with and without
    chunking. Each row uses the fewest GPUs (1, 2, 4, 8, tensor-parallel) whose memory holds the weights,
    the prompt's KV and the decoders' KV. Dense attention: an upper bound for models that prefill sparsely."""
    spec = get_gpu(gpu)
    rows = []
    for prompt in prompts:
        if prompt > memory.context_limit(model):
            raise ValueError(f"{model} reads at most {memory.context_limit(model):,} positions, not {prompt:,}")
        need = memory.kv_bytes(model, prompt) + memory.kv_bytes(model, decoder_context, decoders)
        n = next((k for k in (1, 2, 4, 8) if memory.fit(model, spec.memory_bytes, prompt, n_gpus=k).kv_budget_bytes
                  >= need), None)
        if n is None:
            continue
        roof = roofline.gpu_roof(gpu, n_gpus=n)
        prefill = roofline.predict_prefill(model, roof, 1, prompt).time_s
        step = roofline.predict_decode(model, roof, decoders, decoder_context).time_s
        rows.append(AgentPromptRow(spec.name, n, prompt, prefill, step, prefill / step, step, max_num_batched_tokens,
                                   decoders).at_budget(max_num_batched_tokens))
    return rows


def serving_tpot_slo_s() -> float:
    """The per-token latency target (seconds) the course serves to: chapter 15's TPOT objective."""
    return SERVING_SLO.tpot_ms / 1e3


def chunking_verdict_text(rows: list[AgentPromptRow], tpot_slo_s: float,
                          budgets: Sequence[int] = AGENT_BUDGETS) -> str:
    """What chunking does for the decoders in ``rows``, judged against a per-token target ``tpot_slo_s``
    (seconds): it bounds their worst gap at one chunked step. When that step misses the target at the rows'
    budget, the largest of ``budgets`` that meets it (and the longer prefill it costs) is named, or the
    lack of one; disaggregation is the way to keep decoders at their normal step without that trade."""
    over = [r for r in rows if r.chunked_step_s > tpot_slo_s]
    slo = f"{tpot_slo_s * 1e3:,.0f} ms"
    budget = " and ".join(dict.fromkeys(f"{r.max_num_batched_tokens:,}" for r in rows))
    if not over:
        return (f"At a {budget}-token budget every chunked step stays under a {slo} per-token target on average "
                "(the one chapter 15 serves to): here chunking is enough to keep the decoders interactive while "
                "the prompt is prefilled (the last chunks, which attend to the most positions, take longest).")
    worst = max(over, key=lambda r: r.chunked_step_s)
    words = (f"At a {budget}-token budget, chunking bounds the decoders' worst gap at one chunked step instead of the "
             f"whole prefill, but that step misses the target: with the {worst.prompt_tokens:,}-token prompt each "
             f"of their steps takes about {worst.chunked_step_s * 1e3:,.0f} ms on average (the last chunks, which "
             f"attend to the most positions, take longer), over a {slo} per-token target (chapter 15's), for the "
             f"{worst.chunked_prefill_s:,.1f} s the chunked prefill lasts, against {worst.decode_step_s * 1e3:.1f} ms "
             f"without the prompt ({len(over)} of {len(rows)} prompts here miss that target at this budget). "
             f"Budgets tried for it: {budgets_words(budgets)} tokens.")
    for r in over:
        fit = largest_budget_meeting(r, tpot_slo_s, budgets)
        if fit is None:
            smallest = min(usable_budgets(r, budgets), default=r.decoders + 1)
            words += (f" For the {r.prompt_tokens:,}-token prompt no budget down to {smallest:,} tokens meets "
                      "it: its share of the prefill alone is too slow.")
        else:
            words += (f" For the {r.prompt_tokens:,}-token prompt the largest that meets it is {fit.max_num_batched_tokens:,} "
                      f"tokens per step: the decoders' steps then take {fit.chunked_step_s * 1e3:,.1f} ms on average, "
                      f"and the prompt's prefill takes {fit.chunked_prefill_s:,.1f} s instead of {r.prefill_s:,.1f} s "
                      "in one go.")
    return words + (" Moving such prompts to their own prefill pool (disaggregation, chapter 15) keeps the decoders "
                    "at their normal step without that trade.")


def agent_prompt_text(rows: list[AgentPromptRow], decoders: int = AGENT_DECODERS,
                      tpot_slo_s: float | None = None) -> str:
    """Coding agents' prompts in words, every number from ``rows``; chunking judged against ``tpot_slo_s``
    (seconds per token, default chapter 15's TPOT objective)."""
    if not rows:
        return "No configuration of up to 8 of these GPUs holds such a prompt beside its users."
    parts = []
    for r in rows:
        parts.append(
            f"a **{r.prompt_tokens:,}-token** prompt on {r.n_gpus}× {r.gpu} takes at least **{r.prefill_s:,.1f} s** of "
            f"prefill; without chunking, {decoders} users decoding beside it wait that long for their next token, "
            f"**{r.steps_missed:,.0f} decode steps** of {r.decode_step_s * 1e3:.1f} ms. With a "
            f"{r.max_num_batched_tokens:,}-token budget per step ({r.decoders} for the decoders, {r.chunk_tokens:,} for "
            f"the prompt's chunk), each of their steps takes about {r.chunked_step_s * 1e3:.0f} ms on average "
            f"instead while the prompt lasts")
    slo = serving_tpot_slo_s() if tpot_slo_s is None else tpot_slo_s
    return ("**Coding agents.** An agent that puts a repository into its prompt sends "
            f"{min(AGENT_PROMPTS):,} to {max(AGENT_PROMPTS):,} tokens (talk 2; {AGENT_MODEL}, which reads that many "
            "positions; roofline bounds with dense attention, so real engines take longer and sparse-attention "
            "models less): " + "; ".join(parts) + ". In an agent's loop most of that context was already in the "
            "previous turn's prompt, so a prefix cache (chapter 10) keeps its K/V: these whole prefills are a first "
            "turn's, or a cache miss's. " + chunking_verdict_text(rows, slo))
