"""Stage 3, paged KV: the starter fails, the solution passes, near misses are caught by name,
and correct answers written differently pass."""

from __future__ import annotations

import re

import pytest
from track_helpers import check_text, failures, mutated, solution_result

from infer_lab.course import track

KEY = "paged"


def test_the_starter_is_not_done_and_the_solution_passes(tmp_path, track_solutions):
    starter = track.starter_path(track.stage(KEY)).read_text()
    assert check_text(KEY, starter, tmp_path).status == "todo"
    result = solution_result(track_solutions, KEY)
    assert result.passed, failures(result)
    assert result.tokens_identical and len(result.engine_runs) == 2
    said = " | ".join(f"{o.case}: {o.detail}" for o in result.outcomes)
    # what the engine run claims to exercise, it did: continued chunks, reused prompt tokens, copy-on-write
    found = re.search(r"\((\d+) chunks continued a prompt\), radix prefix cache \((\d+) prompt tokens reused, (\d+) "
                      r"copy calls\)", said)
    assert found and all(int(x) > 0 for x in found.groups()), said


UPDATE = """    new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))
    correction = torch.exp(running_max - new_max)  # exp(-inf) = 0 on the first tile
    probs = torch.exp(scores - new_max)
    new_sum = running_sum * correction + probs.sum(dim=-1, keepdim=True)
    new_acc = output_acc * correction + probs @ values
"""

NEAR_MISSES = [  # (name, {old: new}, what the check must say)
    ("slot-without-block-size", {"return [block_table[p // block_size] * block_size + p % block_size":
                                 "return [block_table[p // block_size] + p % block_size"},
     "multiply the physical block by the block size"),
    ("no-max-subtraction", {UPDATE: UPDATE.replace("correction = torch.exp(running_max - new_max)", "correction = 1.0")
                            .replace("torch.exp(scores - new_max)", "torch.exp(scores)")},
     "subtract the running max"),
    ("one-global-max", {"torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))":
                        "torch.maximum(running_max.amax(), scores.amax()).expand_as(running_max)"},
     "one max per query row"),
    ("accumulator-not-rescaled", {"new_acc = output_acc * correction + probs @ values":
                                  "new_acc = output_acc + probs @ values"},
     "rescale the running sum AND output_acc"),
    ("nan-on-a-fully-masked-tile", {UPDATE: """    tile_max = scores.amax(dim=-1, keepdim=True)
    new_max = torch.maximum(running_max, tile_max)
    probs = torch.exp(scores - tile_max)  # against the tile's own max, then brought to the new one
    new_sum = running_sum * torch.exp(running_max - new_max) + probs.sum(dim=-1, keepdim=True) * torch.exp(
        tile_max - new_max)
    new_acc = output_acc * torch.exp(running_max - new_max) + (probs @ values) * torch.exp(tile_max - new_max)
"""}, "every score is -inf"),
    ("fixed-block-size", {"        bs = self.block_size\n        q = q.float()": "        bs = 16\n        q = q.float()"},
     "right with blocks of 16, wrong with blocks of"),
    ("gqa-repeat", {".transpose(0, 1).repeat_interleave(group, dim=0)\n            v":
                    ".transpose(0, 1).repeat(group, 1, 1)\n            v",
                    "v = self.v[layer, slot:slot + count].float().transpose(0, 1).repeat_interleave(group, dim=0)":
                    "v = self.v[layer, slot:slot + count].float().transpose(0, 1).repeat(group, 1, 1)"},
     "repeat_interleave, not repeat"),
    ("causal-mask-from-zero", {"torch.arange(context_len - n, context_len, device=q.device)":
                               "torch.arange(n, device=q.device)"}, "are the LAST"),
    ("copy-one-layer-only", {"        self.k[:, dst_slots] = self.k[:, src_slots]\n        self.v[:, dst_slots] = "
                             "self.v[:, src_slots]":
                             "        self.k[0, dst_slots] = self.k[0, src_slots]\n        self.v[0, dst_slots] = "
                             "self.v[0, src_slots]"}, "in every layer"),
    ("store-always-float32", {"dtype=dtype, device=device)": "dtype=torch.float32, device=device)"},
     "keep them in the dtype the store is built with"),
]


@pytest.mark.parametrize("name, changes, phrase", NEAR_MISSES, ids=[n[0] for n in NEAR_MISSES])
def test_a_near_miss_is_caught(tmp_path, name, changes, phrase):
    result = check_text(KEY, mutated(KEY, changes), tmp_path, fail_fast=True)
    assert result.status == "fail", f"the near miss passed: {[o.detail for o in result.outcomes]}"
    said = failures(result)
    assert phrase in said, said


FLOAT64_ACCUMULATION = {  # scores, running max, sum and output in float64
    "q = q.float().transpose(0, 1)": "q = q.double().transpose(0, 1)",
    'running_max = torch.full((heads, n, 1), float("-inf"), device=q.device)':
    'running_max = torch.full((heads, n, 1), float("-inf"), dtype=torch.float64, device=q.device)',
    "running_sum = torch.zeros(heads, n, 1, device=q.device)":
    "running_sum = torch.zeros(heads, n, 1, dtype=torch.float64, device=q.device)",
    "output_acc = torch.zeros(heads, n, d, device=q.device)":
    "output_acc = torch.zeros(heads, n, d, dtype=torch.float64, device=q.device)",
    "k = self.k[layer, slot:slot + count].float()": "k = self.k[layer, slot:slot + count].double()",
    "v = self.v[layer, slot:slot + count].float()": "v = self.v[layer, slot:slot + count].double()",
}

TILES_OF_TWO_BLOCKS = {  # two blocks a tile: their slots are not consecutive, so they are gathered
    "        for i in range((context_len + bs - 1) // bs):  # one block of the table: a tile of keys\n"
    "            first, count = i * bs, min(bs, context_len - i * bs)\n"
    "            slot = block_table[i] * bs  # a block's slots are consecutive: read them in place\n"
    "            k = self.k[layer, slot:slot + count].float().transpose(0, 1).repeat_interleave(group, dim=0)\n"
    "            v = self.v[layer, slot:slot + count].float().transpose(0, 1).repeat_interleave(group, dim=0)\n":
    "        for first in range(0, context_len, 2 * bs):\n"
    "            count = min(2 * bs, context_len - first)\n"
    "            slots = torch.tensor(self.slots(block_table, first, count))\n"
    "            k = self.k[layer, slots].float().transpose(0, 1).repeat_interleave(group, dim=0)\n"
    "            v = self.v[layer, slots].float().transpose(0, 1).repeat_interleave(group, dim=0)\n",
}

GATHER_THEN_SOFTMAX = '''"""Stage 3 another way: gather the whole context, one masked softmax; tuples and index_copy_."""

import math

import torch


def paged_slots(block_table, block_size, start, count):
    return tuple(block_table[p // block_size] * block_size + p % block_size for p in range(start, start + count))


def online_softmax_update(running_max, running_sum, output_acc, scores, values):
    m = torch.max(running_max, scores.max(dim=-1, keepdim=True).values)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # a row that has seen nothing yet
    old = torch.exp(running_max - m_safe)
    p = torch.exp(scores - m_safe)
    return [m, old * running_sum + p.sum(-1, keepdim=True), old * output_acc + torch.matmul(p, values)]


class PagedKVStore:
    def __init__(self, num_blocks, block_size, layers, kv_heads, head_dim, dtype, device="cpu"):
        self.size = block_size
        self.keys = [torch.zeros(num_blocks * block_size, kv_heads, head_dim, dtype=dtype, device=device)
                     for _ in range(layers)]
        self.values = [torch.zeros_like(t) for t in self.keys]

    def slots(self, block_table, start, count):
        return (s for s in paged_slots(block_table, self.size, start, count))

    def write(self, layer, slots, k, v):
        self.keys[layer].index_copy_(0, slots, k.to(self.keys[layer].dtype))
        self.values[layer].index_copy_(0, slots, v.to(self.values[layer].dtype))

    def attend(self, layer, q, block_table, context_len, scale):
        n, heads, _ = q.shape
        where = torch.tensor(paged_slots(block_table, self.size, 0, context_len))
        k = self.keys[layer][where].float()
        v = self.values[layer][where].float()
        per_kv = heads // k.shape[1]
        k = k[:, torch.arange(heads) // per_kv]  # head h -> KV head h // per_kv
        v = v[:, torch.arange(heads) // per_kv]
        scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
        visible = torch.arange(context_len)[None, :] <= torch.arange(context_len - n, context_len)[:, None]
        scores = scores.masked_fill(~visible, -math.inf)
        return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)

    def copy(self, src_slots, dst_slots):
        src, dst = torch.tensor(list(src_slots)), torch.tensor(list(dst_slots))
        for store in self.keys + self.values:
            store[dst] = store[src]
'''

FINITE_MASK = {  # a large negative number for hidden keys instead of -inf
    'scores = scores.masked_fill(future, float("-inf"))': "scores = scores.masked_fill(future, -1e30)",
}

VARIANTS = {"float64-accumulation": FLOAT64_ACCUMULATION, "tiles-of-two-blocks": TILES_OF_TWO_BLOCKS,
            "finite-mask-value": FINITE_MASK}


# The gather version again, its attend a tile loop over the blocks: per-layer lists, tuples, generators.
_GATHER_ATTEND = GATHER_THEN_SOFTMAX[GATHER_THEN_SOFTMAX.index("    def attend("):GATHER_THEN_SOFTMAX.index("    def copy(")]
LISTS_AND_TUPLES = GATHER_THEN_SOFTMAX.replace(_GATHER_ATTEND, '''    def attend(self, layer, q, block_table, context_len, scale):
        n, heads, d = q.shape
        qf = q.float().transpose(0, 1)  # (heads, n, d)
        state = (torch.full((heads, n, 1), -math.inf), torch.zeros(heads, n, 1), torch.zeros(heads, n, d))
        rows = torch.arange(context_len - n, context_len)[:, None]
        for first in range(0, context_len, self.size):
            where = torch.tensor(paged_slots(block_table, self.size, first, min(self.size, context_len - first)))
            k, v = self.keys[layer][where].float(), self.values[layer][where].float()
            per_kv = heads // k.shape[1]
            k, v = k[:, torch.arange(heads) // per_kv], v[:, torch.arange(heads) // per_kv]
            scores = torch.einsum("hqd,khd->hqk", qf, k) * scale
            scores = scores.masked_fill(first + torch.arange(len(where))[None, :] > rows, -math.inf)
            state = online_softmax_update(*state, scores, v.transpose(0, 1))
        return (state[2] / state[1]).transpose(0, 1)
''')


@pytest.mark.parametrize("name", [*VARIANTS, "lists-and-tuples"])
def test_a_correct_variant_passes(tmp_path, name):
    text = LISTS_AND_TUPLES if name == "lists-and-tuples" else mutated(KEY, VARIANTS[name])
    assert text != GATHER_THEN_SOFTMAX
    result = check_text(KEY, text, tmp_path)
    assert result.passed, failures(result)
    assert result.tokens_identical


def test_attention_without_the_tile_loop_is_told_to_walk_the_blocks(tmp_path):
    """Gather the whole context and take one softmax: right numbers, but not the stage's lesson."""
    result = check_text(KEY, GATHER_THEN_SOFTMAX, tmp_path, fail_fast=True)
    assert result.status == "fail"
    assert "walk the block table one tile" in failures(result)
