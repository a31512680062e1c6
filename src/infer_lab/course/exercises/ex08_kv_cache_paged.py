"""Chapter 08's exercises: the block-table lookup, blocks to allocate, and where reserved KV goes to waste."""

from __future__ import annotations

import torch

from ...engine import ContiguousKVCache
from ...engine.kv_cache import block_table_slots
from . import Exercise
from .checking import plain
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
