"""Stage 3's check: the paged K/V store, alone on hidden block tables and hard numerics, then inside the engine.

1. ``paged_slots`` on chapter 08's cases and hidden ones (tables in no order, odd block sizes).
2. ``online_softmax_update`` through the check's tile loop against softmax(QK^T)V: one tile and
   many, a short last tile, scores in the hundreds (exp overflows float32 without the max
   subtracted), rows whose scores lie hundreds apart (one shared max underflows the others to 0),
   a tile the causal mask hides completely (exp(-inf - -inf) is NaN), leading (head, query) dims.
3. The store alone: built for blocks of 16, then odd block sizes (1 .. 7), with grouped-query
   heads (6 over 2, 8 over 1, 4 over 4); K/V written through random non-contiguous block
   tables, several requests and layers; ``slots``; ``attend`` against a float64 gather and causal
   softmax for whole prompts (the first rows see only the first block: the later tiles are fully
   masked for them), chunks ending a longer context and single decoding queries, with ordinary,
   huge and wide-apart scores; ``copy`` of a whole and a part of a block, in every layer; a
   bfloat16 store.
4. Inside the real engine: the embedded model's chat prompts, then the hidden model with an odd
   block size, chunked prefill and a radix prefix cache (which calls ``copy``), every token
   compared with transformers.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import torch

from ...engine.kv_store import paged_slots as library_slots
from ..exercises.ex07_attention_variants import last_tile_only, no_acc_rescale, no_sum_rescale
from . import Stage, StageContext
from . import harness as h
from .boundary import BadResult, LearnerCodeError, as_int_list, as_tensor_like, describe

LOOKUP_CASES = (([7, 2, 9], 16, 0, 48), ([7, 2, 9], 16, 14, 4), ([3, 0], 4, 5, 3), ([5, 1, 4, 0], 1, 0, 4),
                ([11, 6], 8, 15, 1))
QUESTIONS = ("What is the capital of France?", "Give me three prime numbers.", "hi")
ATOL = 1e-4  # float32 against a float64 reference, outputs of order 1
BF16_ATOL = 6e-2
LAYERS = 2


# ---------------------------------------------------------------------------------------------
# Taking results


def _as_state(result: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(new_max, new_sum, new_acc)`` from a tuple, list or generator of three tensors (or arrays)."""
    try:
        items = list(result)
    except TypeError:
        raise BadResult("expected three tensors (new_max, new_sum, new_acc)") from None
    if len(items) != 3:
        raise BadResult(f"expected three tensors (new_max, new_sum, new_acc), got {len(items)} items")
    out = []
    for item, ref in zip(items, args[:3], strict=True):
        t = torch.as_tensor(item.__array__()) if hasattr(item, "__array__") and not isinstance(item, torch.Tensor) \
            else item
        if not isinstance(t, torch.Tensor):
            raise BadResult(f"expected three tensors, got {describe(item)}")
        if tuple(t.shape) != tuple(ref.shape):
            raise BadResult(f"each of the three keeps its input's shape: expected {tuple(ref.shape)}, got "
                            f"{tuple(t.shape)}")
        out.append(t)
    return out[0], out[1], out[2]


# ---------------------------------------------------------------------------------------------
# 1. The slot formula


def _slot_hint(table: list[int], bs: int, start: int, got: list[int], want: list[int]) -> str:
    i = next((j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), 0)
    p = start + i
    block, offset = table[p // bs], p % bs
    if got[i] == block + offset:
        return f"multiply the physical block by the block size: slot = {block} x {bs} + {offset} = {want[i]}"
    if got[i] == (p // bs) * bs + offset:
        return (f"position {p} is in logical block {p // bs}, which is physical block {block} (block_table[{p // bs}]): "
                f"slot {block} x {bs} + {offset} = {want[i]}")
    if got[i] == block * bs + p:
        return f"the offset inside the block is p % block size ({offset}), not the position {p}"
    return (f"position {p} is offset {offset} of logical block {p // bs}, which is physical block {block}: slot "
            f"{block} x {bs} + {offset} = {want[i]}")


def _random_table(rng: random.Random, num_blocks: int, blocks: int) -> list[int]:
    return rng.sample(range(num_blocks), blocks)


def check_paged_slots(ctx: StageContext) -> bool:
    rng = ctx.rng("slots")
    cases = list(LOOKUP_CASES)
    for _ in range(6):
        bs = rng.choice((1, 3, 5, 7, 16))
        table = _random_table(rng, 40, rng.randint(2, 6))
        start = rng.randrange(len(table) * bs)
        cases.append((table, bs, start, rng.randint(1, len(table) * bs - start)))
    for table, bs, start, count in cases:
        case = f"paged_slots({table}, block_size={bs}, start={start}, count={count})"
        got = ctx.call("paged_slots", list(table), bs, start, count, case=case)
        want = library_slots(table, bs, start, count)
        if got != want:
            hint = _slot_hint(table, bs, start, got, want) if len(got) == len(want) else \
                f"one slot per position: {count} of them"
            return ctx.report.record(case, False, f"expected {describe(want, 80)}, got {describe(got, 80)}\n    hint: {hint}")
    return ctx.report.record(f"paged_slots on {len(cases)} cases ({len(cases) - len(LOOKUP_CASES)} hidden)", True,
                             "block sizes 1, 3, 4, 5, 7, 8, 16; tables in no order; starts inside a block")


# ---------------------------------------------------------------------------------------------
# 2. The online-softmax update


def _fold(update: Callable[..., Any], scores: torch.Tensor, values: torch.Tensor, tile: int,
          sums: list[torch.Tensor] | None = None) -> torch.Tensor:
    """softmax(scores) @ values, ``tile`` keys at a time through ``update``; ``scores (..., n, keys)``.

    ``sums`` gets the final running sum (0 where exp underflowed, inf where it overflowed).
    """
    lead = scores.shape[:-1]
    state = (torch.full((*lead, 1), float("-inf"), dtype=scores.dtype), torch.zeros((*lead, 1), dtype=scores.dtype),
             torch.zeros((*lead, values.shape[-1]), dtype=scores.dtype))
    for start in range(0, scores.shape[-1], tile):
        state = update(*state, scores[..., start: start + tile], values[..., start: start + tile, :])
    if sums is not None:
        sums.append(state[1])
    return state[2] / state[1]


RESCALE_HINT = ("a later tile raised the max: rescale the running sum AND output_acc by exp(old max - new max) before "
                "adding the tile's share")
KNOWN_UPDATES = {
    RESCALE_HINT + " (output_acc was not)": no_acc_rescale,
    RESCALE_HINT + " (the running sum was not)": no_sum_rescale,
    "only the last tile counts: carry the running max, sum and output from tile to tile": last_tile_only,
}
OVERFLOW_HINT = ("scores this large overflow exp() in float32 (above about 88): subtract the running max before exp(), "
                 "so every exponent is <= 0")
WIDE_HINT = ("one max per query row (and head): these rows' scores lie hundreds apart, and exp(score - a max shared "
             "with other rows) underflows to 0 for the lower ones (0 / 0 is NaN)")
MASKED_HINT = ("a tile where every score is -inf (the causal mask hides all of it from {who}) gives NaN: exp(-inf - "
               "(-inf)) is NaN. Take the new max as max(running max, tile max), which is finite after the first "
               "tile, and subtract THAT; or skip a tile a row cannot see")


def check_online_softmax(ctx: StageContext) -> bool:
    g = torch.Generator().manual_seed(ctx.subseed("update"))
    update = ctx.fn("online_softmax_update")
    d = 16
    q, k, v = torch.randn(5, d, generator=g), torch.randn(64, d, generator=g), torch.randn(64, d, generator=g)
    k[40] *= 12  # a key in a later tile raises the max: what came before must be rescaled
    scale = d**-0.5
    plain = (q @ k.T) * scale
    wide = plain + torch.tensor([300.0, -300.0, 0.0, 150.0, -150.0])[:, None]  # rows hundreds apart
    masked = plain.clone()
    masked[:2, 16:] = float("-inf")  # rows 0-1 see only the first tile: tiles 2-4 are fully masked for them
    heads = torch.randn(3, 4, 40, generator=g)  # (heads, queries, keys)
    cases = [("one tile of 64 keys", plain, v, 64, ""), ("tiles of 16", plain, v, 16, ""),
             ("tiles of 7 (a short last one)", plain, v, 7, ""), ("tiles of 1 key", plain, v, 1, ""),
             ("tiles of 16, scores in the hundreds", plain * 60, v, 16, OVERFLOW_HINT),
             ("tiles of 16, rows whose scores lie 150-600 apart", wide, v, 16, WIDE_HINT),
             ("tiles of 16, rows 0-1 fully masked after the first tile", masked, v, 16,
              MASKED_HINT.format(who="rows 0-1 after the first tile")),
             ("3 heads x 4 queries, tiles of 8 (leading dimensions)", heads, torch.randn(3, 40, d, generator=g), 8,
              "reduce over the last dimension (dim=-1, keepdim=True) and multiply with @, which broadcasts over "
              "the leading (head) dimension")]
    for name, scores, values, tile, why in cases:
        case = f"online_softmax_update: {tuple(scores.shape[:-1])} queries over {scores.shape[-1]} keys, {name}"
        sums: list[torch.Tensor] = []
        try:
            got = _fold(update, scores, values, tile, sums)
        except LearnerCodeError as exc:
            return ctx.report.record(case, False, str(exc))
        want = torch.softmax(scores.double(), dim=-1) @ values.double()
        worst = float((got.double() - want).abs().nan_to_num(float("inf")).max())
        if worst <= ATOL:
            continue
        bad = not bool(torch.isfinite(got).all())
        total = sums[0].double()
        if bool((total == 0).any()):  # every exp() of a row underflowed: a max far above the row's own
            hint = WIDE_HINT
        elif bool(torch.isinf(total).any()):
            hint = OVERFLOW_HINT
        elif bool(torch.isnan(total).any()) and "-inf" in why:
            hint = why
        else:
            hint = why if why == WIDE_HINT else ""
        if not hint:
            hint = next((text for text, bug in KNOWN_UPDATES.items()
                         if torch.allclose(got.double(), _fold(bug, scores.double(), values.double(), tile), atol=ATOL)),
                        "")
        return ctx.report.record(case, False, f"max |difference| from softmax(QK^T)V is {worst:.3g} (allowed {ATOL:g})"
                                 + (" (NaN or inf in the output)" if bad else "") + (f"\n    hint: {hint}" if hint else ""))
    return ctx.report.record(f"online_softmax_update on {len(cases)} tilings", True,
                             "huge scores, rows hundreds apart, fully masked tiles, leading dimensions: all within "
                             f"{ATOL:g} of softmax(QK^T)V")


# ---------------------------------------------------------------------------------------------
# 3. The store alone


class _Shadow:
    """What the check wrote: each request's K/V per layer, position by position (the reference's source)."""

    def __init__(self, layers: int):
        self.kv: dict[tuple[int, int], tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        self.layers = layers

    def add(self, request: int, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        ks, vs = self.kv.setdefault((request, layer), ([], []))
        ks.extend(k)
        vs.extend(v)

    def context(self, request: int, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        ks, vs = self.kv[(request, layer)]
        return torch.stack(ks[:length]), torch.stack(vs[:length])


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, grouping: str = "interleave",
               causal: str = "offset") -> torch.Tensor:
    """Attention of ``q (n, heads, d)`` over ``k, v (ctx, kv_heads, d)`` in float64 (and known mistakes)."""
    n, heads, _ = q.shape
    length, kv_heads, _ = k.shape
    group = heads // kv_heads
    if grouping == "interleave":
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    else:
        k, v = k.repeat(1, group, 1), v.repeat(1, group, 1)
    scores = torch.einsum("nhd,chd->hnc", q.double(), k.double()) * scale
    offset = length - n if causal == "offset" else 0
    if causal != "none":
        future = torch.arange(length)[None, :] > torch.arange(n)[:, None] + offset
        scores = scores.masked_fill(future, float("-inf"))
    return torch.einsum("hnc,chd->nhd", scores.softmax(-1), v.double())


class _StoreCase:
    """One store of the learner's, the requests written into it and what was written."""

    def __init__(self, ctx: StageContext, rng: random.Random, g: torch.Generator, bs: int, heads: int, kv_heads: int,
                 d: int, dtype: torch.dtype = torch.float32, wide: bool = False):
        self.ctx, self.rng, self.g = ctx, rng, g
        self.bs, self.heads, self.kv_heads, self.d, self.dtype = bs, heads, kv_heads, d, dtype
        self.scale = d**-0.5
        self.lengths = [rng.randint(2 * bs + 2, 4 * bs + 3) if bs > 1 else rng.randint(6, 14) for _ in range(3)]
        blocks = [math.ceil(n / bs) for n in self.lengths]
        self.num_blocks = sum(blocks) + rng.randint(3, 6)
        free = rng.sample(range(self.num_blocks), self.num_blocks)  # in no order: tables are not contiguous
        self.tables = []
        for b in blocks:
            self.tables.append(free[:b])
            free = free[b:]
        self.spare = free
        self.shadow = _Shadow(LAYERS)
        self.calls = 0
        # wide: every key shares a large component, so each query row's score range is set by q . common
        self.common = torch.randn(1, kv_heads, d, generator=g) * 3 if wide else None
        self.label = (f"a store of {self.num_blocks} blocks of {bs}, {heads} heads over {kv_heads} KV heads of {d}"
                      + ("" if dtype == torch.float32 else f", {str(dtype).replace('torch.', '')}"))
        self.store = ctx.part("kv_store")(self.num_blocks, bs, LAYERS, kv_heads, d, dtype, "cpu")

    def kv(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = torch.randn(count, self.kv_heads, self.d, generator=self.g)
        if self.common is not None:
            k = k + self.common
        return k.to(self.dtype), torch.randn(count, self.kv_heads, self.d, generator=self.g).to(self.dtype)

    def write_all(self) -> None:
        """Each request's K/V in pieces, as the engine writes them: a prefill chunk, then a flat batch of the rest."""
        cuts = [self.rng.randint(1, n - 1) for n in self.lengths]
        for layer in range(LAYERS):
            slots, ks, vs = [], [], []
            for r in range(len(self.lengths)):  # the first piece of every request in one call
                k, v = self.kv(cuts[r])
                slots += library_slots(self.tables[r], self.bs, 0, cuts[r])
                ks.append(k)
                vs.append(v)
                self.shadow.add(r, layer, k, v)
            self.store.write(layer, torch.tensor(slots, dtype=torch.long), torch.cat(ks), torch.cat(vs))
            for r, n in enumerate(self.lengths):  # the rest, one request at a time
                k, v = self.kv(n - cuts[r])
                self.store.write(layer, torch.tensor(library_slots(self.tables[r], self.bs, cuts[r], n - cuts[r]),
                                                     dtype=torch.long), k, v)
                self.shadow.add(r, layer, k, v)

    def query(self, n: int, kind: str) -> torch.Tensor:
        """``n`` queries: ordinary, huge (scores in the hundreds) or wide (rows' scores hundreds apart)."""
        q = torch.randn(n, self.heads, self.d, generator=self.g)
        if kind == "huge":
            q = q * 60.0
        elif kind == "wide":  # each (row, head) gets its own score shift of -200, 0 or +200
            shift = torch.tensor([self.rng.choice((-200.0, 0.0, 200.0)) for _ in range(n * self.heads)])
            common = self.common[0].repeat_interleave(self.heads // self.kv_heads, dim=0)  # (heads, d)
            direction = common / common.pow(2).sum(-1, keepdim=True)  # direction . common = 1
            q = q + shift.view(n, self.heads, 1) / self.scale * direction
        return q.to(self.dtype)

    def attend(self, layer: int, q: torch.Tensor, table: list[int], length: int) -> torch.Tensor:
        self.calls += 1
        return self.store.attend(layer, q, list(table), length, self.scale)


def _attend_cases(rng: random.Random, length: int) -> list[tuple[int, str]]:
    """(queries, what) for one request: a whole prompt, a chunk ending the context, one decoding query."""
    return [(length, "a whole prompt (its first rows see only the first block)"),
            (rng.randint(2, max(2, length - 2)), "a chunk: the last n positions of the context"),
            (1, "one decoding query")]


def _bug_no_max(m, s, acc, scores, values):
    p = torch.exp(scores)
    return m, s + p.sum(-1, keepdim=True), acc + p @ values


def _bug_global_max(m, s, acc, scores, values):
    new_m = torch.maximum(m.amax(), scores.amax()).expand_as(m)
    c, p = torch.exp(m - new_m), torch.exp(scores - new_m)
    return new_m, s * c + p.sum(-1, keepdim=True), acc * c + p @ values


def _bug_tile_max(m, s, acc, scores, values):
    t = scores.amax(-1, keepdim=True)
    new_m = torch.maximum(m, t)
    p = torch.exp(scores - t)
    return (new_m, s * torch.exp(m - new_m) + p.sum(-1, keepdim=True) * torch.exp(t - new_m),
            acc * torch.exp(m - new_m) + (p @ values) * torch.exp(t - new_m))


def _tiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, bs: int,
           update: Callable[..., Any]) -> torch.Tensor:
    """The store's tile loop in float32 over a gathered context, through ``update`` (a known mistake)."""
    n, heads, d = q.shape
    length, group = k.shape[0], heads // k.shape[1]
    qf = q.float().transpose(0, 1)
    kf = k.float().transpose(0, 1).repeat_interleave(group, dim=0)
    vf = v.float().transpose(0, 1).repeat_interleave(group, dim=0)
    rows = torch.arange(length - n, length)
    state = (torch.full((heads, n, 1), float("-inf")), torch.zeros(heads, n, 1), torch.zeros(heads, n, d))
    for first in range(0, length, bs):
        scores = qf @ kf[:, first: first + bs].transpose(1, 2) * scale
        future = torch.arange(first, min(first + bs, length))[None, :] > rows[:, None]
        state = update(*state, scores.masked_fill(future, float("-inf")), vf[:, first: first + bs])
    return (state[2] / state[1]).transpose(0, 1)


def _diagnose(case: _StoreCase, got: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tol: float,
              kind: str, sixteen_passed: bool) -> str:
    """The hint for a wrong attend output, when one known mistake explains it."""
    scale = case.scale
    if not bool(torch.isfinite(got).all()):
        rows = [i for i in range(got.shape[0]) if not bool(torch.isfinite(got[i]).all())]
        masked = MASKED_HINT.format(who=f"row {rows[0]}, which sees positions 0..{rows[0]} only")
        for hint, bug in ((OVERFLOW_HINT, _bug_no_max), (WIDE_HINT, _bug_global_max), (masked, _bug_tile_max)):
            sim = _tiled(q, k, v, scale, case.bs, bug)
            if torch.equal(torch.isfinite(sim), torch.isfinite(got)):  # the same rows broken the same way
                return hint
        return {"huge": OVERFLOW_HINT, "wide": WIDE_HINT}.get(kind, "the output holds NaN or inf")
    alternatives = {}
    if 1 < case.kv_heads < case.heads:
        alternatives[f"query head h reads KV head h // {case.heads // case.kv_heads} (consecutive heads share one): "
                     "repeat_interleave, not repeat"] = lambda: _reference(q, k, v, scale, grouping="repeat")
    if q.shape[0] < k.shape[0]:
        alternatives[f"the {q.shape[0]} queries are the LAST {q.shape[0]} positions of the context of {k.shape[0]}: "
                     f"query i sees positions 0 .. {k.shape[0] - q.shape[0]} + i"] = \
            lambda: _reference(q, k, v, scale, causal="no offset")
    if q.shape[0] > 1:
        alternatives["no causal mask: query i must not see the positions after its own"] = \
            lambda: _reference(q, k, v, scale, causal="none")
    for hint, make in alternatives.items():
        if float((got.double() - make()).abs().max()) <= tol:
            return hint
    if kind == "wide":
        return WIDE_HINT
    if case.bs != 16 and sixteen_passed:
        return (f"right with blocks of 16, wrong with blocks of {case.bs}: is a block size fixed somewhere? The "
                "store's block size is the one it was built with")
    return ""


def _check_attend(case: _StoreCase, kind: str, sixteen_passed: bool) -> str | None:
    """Every request, layer and query shape of ``case`` against the float64 reference; what failed first."""
    tol = ATOL if case.dtype == torch.float32 else BF16_ATOL
    for r, length in enumerate(case.lengths):
        for n, what in _attend_cases(case.rng, length):
            layer = case.rng.randrange(LAYERS)
            k, v = case.shadow.context(r, layer, length)
            q = case.query(n, kind)
            got = case.attend(layer, q, case.tables[r], length)
            want = _reference(q, k, v, case.scale)
            worst = float((got.double() - want).abs().nan_to_num(float("inf")).max())
            if worst > tol:
                hint = _diagnose(case, got, q, k, v, tol, kind, sixteen_passed)
                return (f"{case.label}: attend(layer={layer}, q {n}x{case.heads}x{case.d}, block_table={case.tables[r]}, "
                        f"context_len={length}), {what}" + {"huge": ", scores in the hundreds", "wide": ", rows whose "
                        "scores lie hundreds apart"}.get(kind, "") + f": max |difference| from a gather + causal "
                        f"softmax is {worst:.3g} (allowed {tol:g})" + (f"\n    hint: {hint}" if hint else ""))
    return None


def _check_copy(case: _StoreCase) -> str | None:
    """A whole block and the first part of another copied into spare blocks, then read through new tables."""
    r = max(range(len(case.lengths)), key=lambda i: case.lengths[i])
    table, length, bs = case.tables[r], case.lengths[r], case.bs
    whole, part = case.spare[0], case.spare[1]
    m = case.rng.randint(1, bs - 1) if bs > 1 else 1
    src = library_slots(table, bs, 0, bs) + library_slots(table, bs, bs, m)
    dst = list(range(whole * bs, whole * bs + bs)) + list(range(part * bs, part * bs + m))
    case.store.copy(src, dst)
    for layer in range(LAYERS):  # the rest of the partly copied block: written anew, as the engine would
        k, v = case.shadow.context(r, layer, length)
        rest = list(range(part * bs + m, part * bs + bs))
        if rest:
            case.store.write(layer, torch.tensor(rest, dtype=torch.long), k[bs + m: 2 * bs], v[bs + m: 2 * bs])
    new_table = [whole, part] + table[2:]
    for layer in range(LAYERS):
        k, v = case.shadow.context(r, layer, length)
        q = case.query(3, "plain")
        got = case.attend(layer, q, new_table, length)
        worst = float((got.double() - _reference(q, k, v, case.scale)).abs().nan_to_num(float("inf")).max())
        if worst > ATOL:
            return (f"{case.label}: after copy(src={describe(src)}, dst={describe(dst)}) (block {table[0]} into block "
                    f"{whole}, the first {m} slots of block {table[1]} into block {part}), attend through "
                    f"{new_table} in layer {layer} differs from the original K/V by {worst:.3g}: copy K and V of "
                    "each source slot to its destination slot in every layer")
    return None


def check_store(ctx: StageContext) -> bool:
    rng = ctx.rng("store")
    g = torch.Generator().manual_seed(ctx.subseed("store"))
    configs = [(16, 4, 4, 8), (rng.choice((3, 5, 7)), 6, 2, 16), (rng.choice((1, 2, 3)), 8, 1, 8)]
    sixteen_passed = False
    calls = 0
    case_name = "the store's attend against a gather + causal softmax"
    for number, (bs, heads, kv_heads, d) in enumerate(configs, 1):
        try:
            case = _StoreCase(ctx, rng, g, bs, heads, kv_heads, d)
            why = _check_slots_method(case)
            if why:
                return ctx.report.record(f"{case.label}: slots", False, why)
            case.write_all()
            why = _check_attend(case, "plain", sixteen_passed) or _check_attend(case, "huge", sixteen_passed)
            if why:
                return ctx.report.record(case_name, False, why)
            wide = _StoreCase(ctx, rng, g, bs, heads, kv_heads, d, wide=True)
            wide.write_all()
            why = _check_attend(wide, "wide", sixteen_passed)
            if why:
                return ctx.report.record(case_name, False, why)
            why = _check_copy(case)
            if why:
                return ctx.report.record("the store's copy", False, why)
        except LearnerCodeError as exc:
            fixed = (f"\n    hint: right with blocks of 16, wrong with blocks of {bs}: is a block size fixed somewhere? "
                     "The store's block size is the one it was built with") if bs != 16 and sixteen_passed else ""
            return ctx.report.record(f"the store, {number} of {len(configs)} (blocks of {bs}, {heads} heads over "
                                     f"{kv_heads} KV heads)", False, f"{exc}{fixed}")
        sixteen_passed = sixteen_passed or bs == 16
        calls += case.calls + wide.calls
    why = _tile_loop_problem(ctx, case)
    if why:
        return ctx.report.record("attend walks the block table tile by tile", False, why)
    sizes = ", ".join(str(c[0]) for c in configs)
    ctx.report.record(f"the store alone: {len(configs)} stores (blocks of {sizes}), non-contiguous block tables", True,
                      f"{calls} attend calls within {ATOL:g} of a float64 gather + causal softmax: whole prompts (the "
                      "later tiles fully masked for their first rows), chunks, decoding queries; scores in the "
                      "hundreds; rows hundreds apart; GQA 6/2, MQA 8/1, MHA 4/4; copy of a whole and of part of a "
                      "block, every layer")
    try:
        bf16 = _StoreCase(ctx, rng, g, rng.choice((3, 5)), 6, 2, 16, torch.bfloat16)
        bf16.write_all()
        why = _check_attend(bf16, "plain", False)
    except LearnerCodeError as exc:
        why = str(exc)
    case = "a bfloat16 store (an engine running in bf16)"
    if why is not None:
        return ctx.report.record(case, False, why)
    held = _tensor_bytes(getattr(bf16.store, "learner_object", bf16.store))
    want = 2 * LAYERS * bf16.num_blocks * bf16.bs * bf16.kv_heads * bf16.d * 2  # K and V, 2 bytes a value
    if held > 1.5 * want:
        return ctx.report.record(case, False, f"attention is right, but the store holds {held:,} bytes of tensors "
                                              f"where K and V in bfloat16 take {want:,}: keep them in the dtype the "
                                              "store is built with (in float32 the same memory holds half the tokens)")
    size = (f"its tensors take {held:,} bytes, K and V in bfloat16 {want:,}" if held else
            "(its tensors were not found among its attributes, so their bytes were not counted)")
    return ctx.report.record(case, True, f"{bf16.calls} attend calls within {BF16_ATOL:g} of float64 attention over "
                                         f"the same bf16 K/V; {size}")


def _tile_loop_problem(ctx: StageContext, case: _StoreCase) -> str | None:
    """The lesson of the stage: ``attend`` folds the context in tile by tile with ``online_softmax_update``
    (more than one tile for a context of several blocks), instead of gathering it whole."""
    r = max(range(len(case.lengths)), key=lambda i: case.lengths[i])
    length, table = case.lengths[r], case.tables[r]
    blocks = math.ceil(length / case.bs)
    calls = [0]
    update = ctx.module.online_softmax_update

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return update(*args, **kwargs)

    ctx.module.online_softmax_update = counted
    try:
        case.attend(0, case.query(1, "plain"), table, length)
    finally:
        ctx.module.online_softmax_update = update
    if calls[0] >= 2:
        return None
    return (f"one decoding query over a context of {length} tokens in {blocks} blocks of {case.bs} called "
            f"online_softmax_update {calls[0]} time(s): walk the block table one tile (a block, or a few) at a "
            "time and fold each tile into the running max, sum and output with online_softmax_update; the "
            "context is never gathered whole (that is what a paged attention kernel does)")


def _tensor_bytes(obj: Any) -> int:
    """Bytes of the distinct tensor storages among ``obj``'s attributes (and in its lists, tuples, dicts)."""
    seen: dict[int, int] = {}

    def visit(value: Any, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        elif depth < 2 and isinstance(value, (list, tuple)):
            for item in value:
                visit(item, depth + 1)
        elif depth < 2 and isinstance(value, dict):
            for item in value.values():
                visit(item, depth + 1)

    for value in getattr(obj, "__dict__", {}).values():
        visit(value, 0)
    return sum(seen.values())


def _check_slots_method(case: _StoreCase) -> str | None:
    """The store's ``slots`` (what the engine calls) on hidden tables."""
    rng, bs = case.rng, case.bs
    for _ in range(3):
        table = _random_table(rng, case.num_blocks, rng.randint(1, 4))
        start = rng.randrange(len(table) * bs)
        count = rng.randint(1, len(table) * bs - start)
        got = case.store.slots(list(table), start, count)
        want = library_slots(table, bs, start, count)
        if got != want:
            hint = _slot_hint(table, bs, start, got, want) if len(got) == len(want) else ""
            if bs != 16 and got == library_slots(table, 16, start, count):
                hint = f"that is the lookup for blocks of 16; this store's blocks hold {bs} (the size it was built with)"
            return (f"slots({table}, {start}, {count}) is {describe(got, 80)}, expected {describe(want, 80)}"
                    + (f"\n    hint: {hint}" if hint else ""))
    return None


# ---------------------------------------------------------------------------------------------
# 4. Inside the engine


class _CountingStore:
    """The learner's store (guarded), with its ``copy`` calls counted."""

    def __init__(self, store: Any, counts: list[int]):
        self._store, self._counts = store, counts

    def copy(self, src: Any, dst: Any) -> None:
        self._counts[0] += 1
        self._store.copy(src, dst)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def check_engine(ctx: StageContext) -> None:
    parts = ctx.parts()
    chat = h.chat_trace(QUESTIONS, max_tokens=8)
    result = h.run(h.embedded(), h.engine_config(block_size=5), parts, chat)
    h.compare(ctx.report, f"inside the engine: {chat.describe()}, blocks of 5", result)

    rng = ctx.rng("engine")
    model = h.hidden()
    bs, budget = rng.choice((3, 5, 7)), rng.randint(9, 14)
    copies, chunks = [0], [0]
    mine = ctx.part("kv_store")
    parts = ctx.parts(kv_store=lambda *args: _CountingStore(mine(*args), copies))
    trace = h.random_trace(ctx.subseed("trace"), model.vocab, n=8 if ctx.full else 6, prompt_lens=(16, 30),
                           new_tokens=(6, 14), shared_prefix=13, arrival_steps=4,
                           name="a hidden trace on the hidden model")
    config = h.engine_config(block_size=bs, max_model_len=64, max_num_seqs=3, chunked_prefill=True,
                             max_num_batched_tokens=budget, prefix_cache="radix")
    result = h.run(model, config, parts, trace, on_step=h.count_prompt_chunks(chunks))
    reused = result.engine.prefix_cache.stats.hit_tokens if result.finished else 0
    h.compare(ctx.report, f"inside the engine: {trace.describe()}, blocks of {bs}, chunked prefill under {budget} "
                          f"tokens a step ({chunks[0]} chunks continued a prompt), radix prefix cache ({reused} prompt "
                          f"tokens reused, {copies[0]} copy calls)", result)


def check(ctx: StageContext) -> None:
    if check_paged_slots(ctx) and check_online_softmax(ctx) and check_store(ctx):
        check_engine(ctx)


STAGE = Stage(
    number=3, key="paged", title="Paged KV", file="03_paged_kv.py",
    components={"kv_store": "PagedKVStore"}, chapter="08", reads=("07", "08"), minutes=120,
    task="The K/V store behind PagedAttention: write each token's K/V to the slot its block table names, and "
         "attend one request's queries to its context one block (a tile) at a time with an online softmax, "
         "exact for huge scores and fully masked tiles; copy slots for the prefix cache.",
    check=check, requires=("paged_slots", "online_softmax_update"),
    adapters={"paged_slots": as_int_list, "slots": as_int_list, "online_softmax_update": _as_state,
              "attend": as_tensor_like(1)},
    symbol="src/infer_lab/engine/kv_store.py::PagedKVStore",
)
