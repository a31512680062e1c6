"""Execution: one forward pass over a scheduled step, and every way the engine makes it fast.

The step loop hands :meth:`Executor.execute` what the scheduler chose (which requests, which of
their tokens) and gets back logits for the tokens to sample. In between:

* the step's tokens of every request are concatenated into one flat batch (no padding), each
  with its position and the KV slot its K/V goes to;
* the model runs over that batch (:mod:`.model`), attention reading each request's context
  from the KV cache.

The model is prepared once, here: cast to the compute dtype, quantized, or its GEMM weights
prepacked for oneDNN at the step sizes where that measured faster on this machine
(:mod:`.cpu.prepack`, :mod:`.cpu.gemm_choice`); steps of one token may run a compiled decode
(:mod:`.cpu.cpu_decode`), and pure-decode steps on a GPU a fixed-shape runner replayed from CUDA
graphs (:mod:`.graph_runner`).

With a forward pass or a KV store that is not the library's (a learner's, from the course's
build track), none of those paths apply: the step runs the *readable* path, the forward pass
``forward(model, token_ids, positions, attend, rows)`` with ``attend`` writing K/V into the store
and asking it for each request's attention (:meth:`~.kv_cache.PagedKVCache.attend`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .config import EngineConfig
from .cpu import cpu_decode, gemm_choice, prepack
from .cpu.gemm_choice import GemmPlan
from .graph_runner import DecodeBatch, StaticDecodeRunner
from .kv_cache import AttentionMetadata, PagedKVCache
from .layers import LayerFunctions
from .model import EngineModel, forward_tokens
from .scheduler import SchedulerOutput

Forward = Callable[..., torch.Tensor]  # (model, token_ids, positions, attend, rows) -> logits


def gemm_plan(config: EngineConfig, model: EngineModel) -> GemmPlan:
    """Which GEMM path an engine with ``config`` takes at each step size (see ``prepack_weights``).

    ``True``: prepacked at every size; ``False`` (or a model that cannot be packed): plain.
    ``None`` (auto): where prepacking applies (a CPU whose oneDNN runs it for this dtype, fused
    projections, not compiled, fp32/bf16, a copy that fits in half the free memory), the plan
    measured on this machine (:func:`~.cpu.gemm_choice.plan_for`), else plain. A CPU that
    refuses the kernel (:func:`~.cpu.prepack.verdict`: bf16 on an AVX2-only CPU) gets the plain
    plan with the refusal as its reason; ``True`` there is an error that says so.
    """
    wanted = config.prepack_weights
    why_not = prepack.refusal(model.device, model.dtype)
    if wanted and why_not is not None:
        raise ValueError(f"prepack_weights=True cannot run here: {why_not}. "
                         "Leave prepack_weights at None (auto) or set it to False for plain F.linear")
    if wanted is None:
        if why_not is not None and model.device.type == "cpu" and model.dtype in prepack.DTYPES:
            return GemmPlan.refused_here(why_not)  # this CPU lacks the kernel: plain, and it says why
        if not (why_not is None and config.fuse_projections and not config.compile_layers
                and (model.is_prepacked or prepack.fits(model.gemm_weight_bytes()))):
            return GemmPlan.always(False)
        return gemm_choice.plan_for(model.plain.gemm_weights(), model.prepacked().gemm_weights())
    return GemmPlan.always(bool(wanted))


def use_prepacked_weights(config: EngineConfig, model: EngineModel) -> bool:
    """Whether an engine with ``config`` multiplies by prepacked weights at any step size."""
    return gemm_plan(config, model).any_prepacked


class Executor:
    """The model, prepared once for ``config``, run over one scheduled step at a time.

    Args:
        model: the weights, as loaded.
        config: the engine's switches (dtype, weight_quant, prepack_weights, compile_layers,
            compiled_decode, static_decode, cuda_graphs, fuse_projections, batched_decode).
        forward: a forward pass with :func:`~.model.forward_tokens`'s interface to run instead of
            the library's (the readable path); ``None``: the library's, with its fast paths.
        static: whether pure-decode steps go through the fixed-shape runner (decided by the engine).
    """

    def __init__(self, model: EngineModel, config: EngineConfig, forward: Forward | None = None,
                 static: bool = False):
        self.config, self.forward = config, forward
        if config.dtype is not None:
            model = model.plain.cast({"fp32": torch.float32, "bf16": torch.bfloat16}[config.dtype])
        if config.weight_quant is not None:
            model = model.plain.quantized(config.weight_quant)
            self.gemm_plan = GemmPlan((1,), (False,), source=f"quantized weights ({config.weight_quant})")
        elif forward is not None:  # a forward pass of one's own multiplies the plain weights
            self.gemm_plan = GemmPlan.always(False)
        else:
            self.gemm_plan = gemm_plan(config, model)
        self.prepacked_weights = self.gemm_plan.any_prepacked
        self.model = model.prepacked() if self.prepacked_weights else model.plain
        if config.compile_layers and self.model.device.type == "cpu" and (why := cpu_decode.verdict().refusal()):
            raise ValueError(f"compile_layers cannot run here: {why}. Set compile_layers=False (the default)")
        self.layer_fns = LayerFunctions(fused=config.fuse_projections, compiled=config.compile_layers)
        # compiled_decode: steps of one token run cpu_decode's compiled halves on the plain weights.
        self.one_token_fns: LayerFunctions | None = None
        self.compile_s: float | None = None  # seconds its compilation (or disk-cache load) took
        if config.compiled_decode:
            why = cpu_decode.unsupported_reason(self.model.device, self.model.dtype)
            if why is None and static:
                why = "the static decode path runs its own fixed-shape step"
            if why is None and forward is not None:
                why = "it compiles the library's forward pass, and this engine runs another"
            if why is not None:
                raise ValueError(f"compiled_decode cannot run here: {why}. Set compiled_decode=False "
                                 "(the default) for the engine's usual one-token step")
            self.one_token_fns = cpu_decode.layer_functions()
            self.compile_s = cpu_decode.compile_for(self.model.plain)
        self.static = static
        self.kv: Any = None
        self.decode_runner: StaticDecodeRunner | None = None

    def bind(self, kv: Any, max_num_seqs: int, max_model_len: int) -> None:
        """Use ``kv`` as the step's KV cache (and build the fixed-shape decode runner over it)."""
        self.kv = kv
        self.readable = self.forward is not None or (isinstance(kv, PagedKVCache) and not kv.library_store)
        if self.static:
            graphs = self.config.cuda_graphs if self.config.cuda_graphs is not None else \
                self.model.device.type == "cuda"
            self.decode_runner = StaticDecodeRunner(self.model, kv, max_num_seqs, max_model_len,
                                                    use_cuda_graphs=graphs, layer_fns=self.layer_fns)

    @property
    def scale(self) -> float:
        return self.model.shape.head_dim**-0.5

    def execute(self, batch: SchedulerOutput) -> torch.Tensor:
        """Logits (fp32) for every token to sample: per request that completes its context, one row,
        or ``1 + k`` rows when it carries ``k`` speculative guesses; in the batch's order."""
        if self.readable:
            return self._execute_readable(batch)
        if self.decode_runner is not None and all(
            s.num_new_tokens == 1 and s.completes_context for s in batch.scheduled
        ):
            return self.decode_runner.run(self._decode_batch(batch))
        ids, positions, slots, sample_rows = self._flatten(batch)
        kv = self.kv
        device = self.model.device
        one_token = self.one_token_fns is not None and len(ids) == 1
        model = self.model if self.gemm_plan.use_prepacked(len(ids)) and not one_token else self.model.plain
        meta = AttentionMetadata(
            query_lens=[s.num_new_tokens for s in batch.scheduled],
            context_lens=[s.start + s.num_new_tokens for s in batch.scheduled],
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device) if kv.stores_kv else None,
            sample_indices=sample_rows,
        )
        kv.fill_metadata(meta, [s.seq for s in batch.scheduled], batched_decode=self.config.batched_decode)
        return model.forward(
            torch.tensor(ids, dtype=torch.long, device=device),
            torch.tensor(positions, dtype=torch.long, device=device),
            meta,
            kv if kv.stores_kv else None,
            self.one_token_fns if one_token else self.layer_fns,
        )

    def _flatten(self, batch: SchedulerOutput) -> tuple[list[int], list[int], list[int], list[int]]:
        """Token ids, positions and KV slots of the step's tokens, concatenated; the rows to sample."""
        ids, positions, slots, sample_rows = [], [], [], []
        for item in batch.scheduled:
            seq, start, n = item.seq, item.start, item.num_new_tokens
            ids += seq.all_ids[start : start + item.num_real_tokens] + item.drafts
            positions += range(start, start + n)
            slots += self.kv.slots(seq, start, n)
            if item.completes_context:  # one row per real last token and per guess
                sample_rows += range(len(ids) - 1 - len(item.drafts), len(ids))
        return ids, positions, slots, sample_rows

    def _execute_readable(self, batch: SchedulerOutput) -> torch.Tensor:
        """The step through ``forward(model, ids, positions, attend, rows)`` and the store's ``attend``."""
        ids, positions, slots, sample_rows = self._flatten(batch)
        device, kv, scale = self.model.device, self.kv, self.scale
        slot_mapping = torch.tensor(slots, dtype=torch.long, device=device)
        spans, start = [], 0
        for item in batch.scheduled:
            spans.append((start, item.num_new_tokens, list(item.seq.block_table), item.start + item.num_new_tokens))
            start += item.num_new_tokens

        dtype = self.model.dtype  # what the store keeps; a forward pass may compute in another (float64)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kv.write(layer, slot_mapping, k.to(dtype), v.to(dtype))
            out = torch.empty_like(q)
            for first, n, table, context_len in spans:
                out[first : first + n] = kv.attend(layer, q[first : first + n].to(dtype), table, context_len, scale)
            return out

        forward = self.forward or forward_tokens
        return forward(self.model.plain, torch.tensor(ids, dtype=torch.long, device=device),
                       torch.tensor(positions, dtype=torch.long, device=device), attend, sample_rows)

    def _decode_batch(self, batch: SchedulerOutput) -> DecodeBatch:
        """The host-side inputs of a pure-decode step, for the static runner."""
        seqs = [s.seq for s in batch.scheduled]
        positions = [s.start for s in batch.scheduled]
        return DecodeBatch(
            input_ids=[seq.token_at(p) for seq, p in zip(seqs, positions, strict=False)],
            positions=positions,
            slot_mapping=[self.kv.slots(seq, p, 1)[0] for seq, p in zip(seqs, positions, strict=False)],
            block_tables=[seq.block_table for seq in seqs],
            context_lens=[p + 1 for p in positions],
        )
