"""Stage 2, the block manager: the starter fails, the solution passes, near misses are caught by name,
and correct answers written differently pass."""

from __future__ import annotations

import pytest
from track_helpers import (
    assert_near_miss_caught,
    assert_variant_passes,
    check_text,
    failures,
    mutated,
    solution_result,
)

from infer_lab.course import track

KEY = "blocks"


def test_the_starter_is_not_done_and_the_solution_passes(tmp_path, track_solutions):
    starter = track.starter_path(track.stage(KEY)).read_text()
    assert check_text(KEY, starter, tmp_path).status == "todo"
    result = solution_result(track_solutions, KEY)
    assert result.passed, failures(result)
    assert result.tokens_identical and len(result.engine_runs) == 2


NEAR_MISSES = [  # (name, old, new, what the check must say)
    ("floor-not-ceil", "max(0, math.ceil((num_computed + num_new_tokens) / self.block_size) - blocks_held)",
     "max(0, (num_computed + num_new_tokens) // self.block_size - blocks_held)", "round (cached + new) / block size UP"),
    ("held-not-subtracted", "max(0, math.ceil((num_computed + num_new_tokens) / self.block_size) - blocks_held)",
     "math.ceil((num_computed + num_new_tokens) / self.block_size)", "subtract the blocks the request already holds"),
    ("leak-on-release", "        if self.refs[block] == 0:\n            self.free.append(block)", "",
     "did not come back to the free list (a leak)"),
    ("frees-shared-blocks", "        self.refs[block] -= 1\n        if self.refs[block] == 0:\n            self.free.append(block)",
     "        self.refs[block] = 0\n        self.free.append(block)", "while someone still holds it"),
    ("not-all-or-nothing", "        if missing > len(self.free):\n            raise OutOfKVMemory(f\"{missing} blocks needed, {len(self.free)} free\")\n"
     "        for _ in range(missing):\n            block = self.free.popleft()",
     "        for _ in range(missing):\n            if not self.free:\n                raise OutOfKVMemory(\"no free block\")\n"
     "            block = self.free.popleft()", "all or nothing"),
    ("double-free-unnoticed", "        if self.refs[block] == 0:\n            raise RuntimeError(f\"block {block} is already free (double free)\")\n", "",
     "a double free must be noticed"),
    ("block-size-16", "        keep = math.ceil(num_tokens / self.block_size)", "        keep = math.ceil(num_tokens / 16)",
     "shrink left"),
]


@pytest.mark.parametrize("name, old, new, phrase", NEAR_MISSES, ids=[n[0] for n in NEAR_MISSES])
def test_a_near_miss_is_caught(tmp_path, name, old, new, phrase):
    assert_near_miss_caught(KEY, old, new, phrase, tmp_path)


VARIANTS = {  # correct answers written differently
    "lifo-free-list": {"block = self.free.popleft()": "block = self.free.pop()"},
    "integer-ceil-and-tuples": {
        "return max(0, math.ceil((num_computed + num_new_tokens) / self.block_size) - blocks_held)":
        "return max(0, -(-(num_computed + num_new_tokens) // self.block_size) - blocks_held)",
        "keep = math.ceil(num_tokens / self.block_size)": "keep = -(-num_tokens // self.block_size)",
    },
}

SET_AND_DICT = '''"""Stage 2 written another way: a set of free ids (lowest first), holders in a dict, numpy-free."""

from infer_lab.engine.block_manager import OutOfKVMemory


class BlockManager:
    def __init__(self, num_blocks, block_size):
        self.size = block_size
        self.free = set(range(num_blocks))
        self.holders = {}

    def blocks_needed(self, num_computed, num_new_tokens, blocks_held):
        total = num_computed + num_new_tokens
        need = total // self.size + (1 if total % self.size else 0)
        return need - blocks_held if need > blocks_held else 0

    def num_free_blocks(self):
        return len(self.free)

    def ref_count(self, block):
        return self.holders.get(block, 0)

    def grow(self, block_table, num_tokens):
        n = self.blocks_needed(num_tokens, 0, len(block_table))
        if n > len(self.free):
            raise OutOfKVMemory("pool exhausted")
        for block in sorted(self.free)[:n]:
            self.free.discard(block)
            self.holders[block] = 1
            block_table.append(block)

    def shrink(self, block_table, num_tokens):
        keep = self.blocks_needed(num_tokens, 0, 0)
        while len(block_table) > keep:
            self.release(block_table.pop())

    def share(self, block):
        assert self.holders.get(block, 0) > 0, "sharing a free block"
        self.holders[block] += 1

    def release(self, block):
        if not self.holders.get(block):
            raise ValueError(f"double free of {block}")
        self.holders[block] -= 1
        if not self.holders[block]:
            del self.holders[block]
            self.free.add(block)
'''


@pytest.mark.parametrize("name", [*VARIANTS, "set-and-dict"])
def test_a_correct_variant_passes(tmp_path, name):
    text = SET_AND_DICT if name == "set-and-dict" else mutated(KEY, VARIANTS[name])
    assert_variant_passes(KEY, text, tmp_path)
