"""Chapter 08's exercises: the block-table lookup, blocks to allocate, and where reserved KV goes to waste."""

from __future__ import annotations

from typing import Any

import torch

from ...engine import ContiguousKVCache
from ...engine.kv_cache import block_table_slots
from . import Exercise, build
from .checking import plain, short_repr
from .engine_sim import paged_cache, sequence, tiny_shape

NUMBER = "08"
SLUG = "kv_cache_paged"
TITLE = "08 · KV cache and PagedAttention"

LOOKUP_CASES = (([7, 2, 9], 16, 0, 48), ([7, 2, 9], 16, 14, 4), ([3, 0], 4, 5, 3), ([5, 1, 4, 0], 1, 0, 4),
                ([11, 6], 8, 15, 1))


def check_slots(fns, r) -> None:
    for table, block_size, start, count in LOOKUP_CASES:
        case = f"block table {table}, block size {block_size}, positions {start}..{start + count - 1}"
        got = r.call(fns.slots, list(table), block_size, start, count, case=case)
        kv = paged_cache(max(table) + 1, block_size)
        seq = sequence("lookup", 1)
        seq.block_table = list(table)
        expected = kv.slots(seq, start, count)
        every = block_table_slots(torch.tensor([table]), block_size)[0, start:start + count].tolist()
        assert expected == every  # the engine's two lookups agree
        got = plain(got)  # a tuple, range, generator or numpy array of the right slots is right
        hint = ""
        if isinstance(got, list) and got and got != expected and all(isinstance(x, int) for x in got):
            p = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), 0) + start
            block, offset = table[p // block_size], p % block_size
            hint = (f"position {p} is offset {offset} of logical block {p // block_size}, which is physical "
                    f"block {block}: slot {block} x {block_size} + {offset} = {block * block_size + offset}")
        r.equal(case, got, expected, hint=hint)


NEEDED_CASES = ((0, 16, 0, 16), (0, 17, 0, 16), (16, 1, 1, 16), (15, 1, 1, 16), (40, 30, 3, 16), (0, 5, 0, 1),
                (10, 0, 1, 16), (3, 2, 4, 4))


def check_blocks_needed(fns, r) -> None:
    for computed, new, held, block_size in NEEDED_CASES:
        case = f"{computed} tokens cached in {held} block(s) of {block_size}, {new} new tokens"
        got = r.call(fns.blocks_needed, computed, new, held, block_size, case=case)
        kv = paged_cache(64, block_size)
        seq = sequence("grow", max(computed, 1))
        seq.num_computed, seq.block_table = computed, list(range(held))
        expected = kv.blocks_needed(seq, new)
        hint = "a partly filled block holds the tokens of the next one: round (cached + new) / block size UP, " \
               "then subtract the blocks already held (never below 0)"
        r.close(case, got, expected, unit="blocks", hint=hint)


WASTE_CASES = (([100, 7, 64, 300], 16, 512), ([1, 2, 3], 16, 2048), ([128, 256], 16, 256), ([33, 65, 97], 32, 128),
               ([5, 9, 13], 1, 64))


def _wasted_slots(lengths: list[int], block_size: int, max_model_len: int) -> tuple[int, int]:
    """Reserved minus used slots, from the engine's allocators' own memory reports."""
    shape = tiny_shape()
    paged = paged_cache(sum(-(-n // block_size) for n in lengths), block_size)
    contiguous = ContiguousKVCache(shape, len(lengths), max_model_len, torch.float32)
    seqs = []
    for i, n in enumerate(lengths):
        for kv, kind in ((paged, "p"), (contiguous, "c")):
            seq = sequence(f"{kind}{i}", n)
            kv.allocate(seq, n)
            seq.num_computed = n
            seqs.append(seq)
    p = paged.memory_report(seqs).wasted_bytes // paged.bytes_per_token
    c = contiguous.memory_report(seqs).wasted_bytes // contiguous.bytes_per_token
    return p, c


def check_waste(fns, r) -> None:
    for lengths, block_size, max_model_len in WASTE_CASES:
        case = f"requests of {lengths} tokens, blocks of {block_size}, max_model_len {max_model_len}"
        got = plain(r.call(fns.wasted_slots, list(lengths), block_size, max_model_len, case=case))
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            r.record(case, False, f"return a pair (paged, contiguous), got {got!r:.60}")
            continue
        paged, contiguous = _wasted_slots(lengths, block_size, max_model_len)
        r.close(case + ": paged", got[0], paged, unit="slots",
                wrong={"a whole spare block per request: a full last block wastes nothing":
                       sum(block_size - n % block_size for n in lengths)})
        r.close(case + ": contiguous", got[1], contiguous, unit="slots")


EXERCISES = [
    Exercise("slots", "The block-table lookup", "implement",
             "Translate token positions to KV slots through a block table; checked against the engine's "
             "PagedKVCache.slots and its vectorized block_table_slots.", check_slots),
    Exercise("blocks_needed", "Blocks to allocate", "implement",
             "Count the new blocks a request needs for its next tokens; checked against the engine's "
             "paged cache.", check_blocks_needed),
    Exercise("wasted_slots", "Where reserved KV goes to waste", "predict",
             "Predict the reserved-but-unused slots of paged blocks and of contiguous max-length regions; "
             "checked against the engine's allocators' memory reports.", check_waste),
]


# ---------------------------------------------------------------------------------------------
# Build it: your lookup and block count inside the paged engine


def _slot_violation(table: list[int], block_size: int, start: int, count: int, got: Any) -> str | None:
    """What is wrong with the slots ``got`` for positions ``start..start+count-1``, or None.

    The invariant: position p's K/V goes to offset p % B of the block its block table names for
    logical block p // B (and nowhere else, or another position or request overwrites it).
    """
    if not isinstance(got, list) or len(got) != count:
        return f"asked for {count} slots, got {short_repr(got)}"
    for i, slot in enumerate(got):
        p = start + i
        if not isinstance(slot, int):
            return f"position {p}: slot {slot!r} is not an integer"
        block, offset = table[p // block_size], p % block_size
        if slot == block * block_size + offset:
            continue
        where = f"position {p} (block table {short_repr(table, 40)}, blocks of {block_size}) went to slot {slot}"
        if slot == p:
            why = "the slot equals the position: the block table was not used (logical block -> physical block)"
        elif slot == block + offset:
            why = (f"that is physical block {block} + offset {offset}: a block id counts blocks, so multiply it "
                   f"by the block size to get its first slot")
        elif slot // block_size == block:
            why = f"right block {block}, wrong offset {slot % block_size} instead of {offset} (p % block_size)"
        elif slot // block_size in table:
            why = (f"slot {slot} is in block {slot // block_size}, which this request holds for another "
                   f"logical block: position {p} belongs to logical block {p // block_size}")
        else:
            why = f"slot {slot} is in block {slot // block_size}, which this request does not hold"
        return f"{where}: {why}"
    return None


def check_paged_engine(fns, r) -> None:
    r.call(fns.slots, [0], 4, 0, 1, case="setup")
    r.call(fns.blocks_needed, 0, 1, 0, 4, case="setup")
    broken: list[str] = []

    def lookup(table, block_size, start, count):
        got = plain(fns.slots(list(table), block_size, start, count))
        if not broken:
            why = _slot_violation(list(table), block_size, start, count, got)
            if why:
                broken.append(f"slot lookup: {why}")
        return got

    def count(num_computed, num_new, held, block_size):
        got = plain(fns.blocks_needed(num_computed, num_new, held, block_size))
        end = num_computed + num_new
        if not broken and isinstance(got, int):
            blocks = held + max(got, 0)
            if blocks * block_size < end:
                broken.append(f"block count: a request holding {held} block(s) of {block_size} with {num_computed} "
                              f"tokens cached asked for {num_new} more and got {got} new block(s): {blocks} x "
                              f"{block_size} = {blocks * block_size} slots for {end} tokens, a block short. "
                              "A partly filled last block still needs a whole block: round UP")
            elif (blocks - 1) * block_size >= end and got > 0:
                broken.append(f"block count: {num_computed} tokens cached in {held} block(s) of {block_size}, "
                              f"{num_new} new: {got} new block(s) make {blocks} blocks for {end} tokens, more "
                              "than they need: subtract the blocks already held")
        return got

    def plug(engine):
        engine.kv.slot_lookup = lookup
        engine.kv.block_count = count

    case = "the paged engine with your slots() and blocks_needed(): 4 chat prompts, 8 greedy tokens each, blocks of 4"
    run = build.run_engine(build.engine_config(), build.chat_prompts(), plug)
    hint = broken[0] if broken else ""
    build.compare(r, case, run, hint=hint)
    r.record("invariant: every K/V write lands in its own block's slot, every request holds the blocks its "
             "tokens need", not broken, broken[0] if broken else "held throughout the run")
    if run.finished:
        build.pool_back(r, "invariant: the pool is full again after the run", run)


def install_paged(engine: Any, fns: Any) -> None:
    """The capstone: your slots() and blocks_needed() as a serving engine's block-table lookup and block count."""
    engine.kv.slot_lookup = lambda table, block_size, start, count: plain(
        fns.slots(list(table), block_size, start, count))
    engine.kv.block_count = lambda computed, new, held, block_size: plain(
        fns.blocks_needed(computed, new, held, block_size))


EXERCISES.append(
    Exercise("paged_engine", "PagedAttention inside the engine", "build",
             "Your slots() and blocks_needed() replace the paged KV cache's block-table lookup (every K/V write "
             "and every attention read goes through it) and its block count; checked by generating with the "
             "engine on the embedded model, token for token against transformers, with every block back in the "
             "pool afterwards.", check_paged_engine, functions=("slots", "blocks_needed"),
             symbol="src/infer_lab/engine/kv_cache.py::PagedKVCache.slot_lookup, PagedKVCache.block_count",
             timeout_s=build.BUILD_TIMEOUT_S, install=install_paged))
