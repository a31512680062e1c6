"""Stage 7, the radix prefix cache: the starter fails, the solution passes, near misses are caught by name,
and correct answers written differently pass."""

from __future__ import annotations

import re

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

KEY = "radix"


def test_the_starter_is_not_done_and_the_solution_passes(tmp_path, track_solutions):
    starter = track.starter_path(track.stage(KEY)).read_text()
    assert check_text(KEY, starter, tmp_path).status == "todo"
    result = solution_result(track_solutions, KEY)
    assert result.passed, failures(result)
    assert result.tokens_identical and len(result.engine_runs) == 2
    details = " | ".join(o.detail for o in result.outcomes)
    # The runs really exercised what they claim: evictions, preemptions, reuse inside the engine.
    pressure = next(o.detail for o in result.outcomes if "under memory pressure" in o.case)
    assert sum(map(int, re.findall(r"(\d+) blocks evicted", pressure))) > 0
    assert sum(map(int, re.findall(r"(\d+) preemptions", pressure))) > 0
    hidden = next(o.detail for o in result.outcomes if o.case == "inside the engine, the hidden model: prompt tokens "
                                                                   "reused")
    assert int(re.search(r"\((\d+) blocks evicted", hidden).group(1)) > 0
    assert int(re.match(r"(\d+) prompt tokens reused", hidden).group(1)) > 0
    assert "lost" in details


NEAR_MISSES = [  # (name, old, new, what the check must say)
    ("walk-two-levels-deep", "        while i < len(token_ids) and token_ids[i] in node.children:\n"
                             "            child = node.children[token_ids[i]]",
     "        depth = 0\n        while i < len(token_ids) and token_ids[i] in node.children and depth < 2:\n"
     "            depth += 1\n            child = node.children[token_ids[i]]", "stopped after two edges"),
    ("match-stops-at-whole-nodes", "            slots += child.slots[:n]\n            i += n\n"
                                   "            if n < len(child.tokens):\n                break",
     "            if n < len(child.tokens):\n                break\n            slots += child.slots[:n]\n            i += n",
     "a partly matching edge still gives the slots"),
    ("evicts-the-most-recent-leaf", "leaf = min(leaves, key=lambda node: node.last_used)",
     "leaf = max(leaves, key=lambda node: node.last_used)", "least recently used leaf first"),
    ("evicts-inner-nodes", "            if node.children:\n                stack.extend(node.children.values())\n"
                           "            elif node is not self.root:",
     "            stack.extend(node.children.values())\n            if node is not self.root:", "a leak"),
    ("insert-takes-references-again", "            node, i = child, i + n",
     "            self._hold(child.slots[:n])\n            node, i = child, i + n", "a leak"),
    ("eviction-frees-running-blocks", "                self.blocks.release(b)",
     "                while self.blocks.ref_count(b):\n                    self.blocks.release(b)",
     "a block a running request still uses was freed"),
    ("evictable-counts-shared-blocks", "return sum(1 for b in self.in_tree if self.blocks.ref_count(b) == 1)",
     "return len(self.in_tree)", "num_evictable() returned"),
    ("attach-reuses-the-last-token", "slots = self.match(seq.all_ids[:self.reusable_limit(seq)])",
     "slots = self.match(seq.all_ids)", "at most all but the last"),
]


@pytest.mark.parametrize("name, old, new, phrase", NEAR_MISSES, ids=[n[0] for n in NEAR_MISSES])
def test_a_near_miss_is_caught(tmp_path, name, old, new, phrase):
    assert_near_miss_caught(KEY, old, new, phrase, tmp_path)


VARIANTS = {  # correct answers written differently
    "recursive-walk": {
        "        node, i, slots, now = self.root, 0, [], next(self.clock)\n"
        "        while i < len(token_ids) and token_ids[i] in node.children:\n"
        "            child = node.children[token_ids[i]]\n"
        "            n = common(child.tokens, token_ids[i:])\n"
        "            child.last_used = now\n"
        "            slots += child.slots[:n]\n"
        "            i += n\n"
        "            if n < len(child.tokens):\n"
        "                break  # the prompt parts from this edge in its middle\n"
        "            node = child\n"
        "        return slots":
        "        return self._walk(self.root, list(token_ids), next(self.clock))\n\n"
        "    def _walk(self, node, tokens, now):\n"
        "        child = node.children.get(tokens[0]) if tokens else None\n"
        "        if child is None:\n"
        "            return []\n"
        "        child.last_used = now\n"
        "        n = common(child.tokens, tokens)\n"
        "        if n < len(child.tokens):\n"
        "            return child.slots[:n]\n"
        "        return child.slots + self._walk(child, tokens[n:], now)",
    },
    "ties-broken-the-other-way": {
        "leaf = min(leaves, key=lambda node: node.last_used)": "leaf = min(reversed(leaves), key=lambda node: node.last_used)",
    },
}

TRIE = '''"""Stage 7 written another way: a trie of one token per node, dicts for nodes, a reference per node and block."""

from infer_lab.engine.prefix_cache import PrefixCache


def share_or_copy(kv, slots):
    bs, matched = kv.block_size, {s // kv.block_size for s in slots}
    for b in matched:
        kv.blocks.share(b)
    table, reused = [], 0
    try:
        for start in range(0, len(slots), bs):
            group = slots[start:start + bs]
            if len(group) == bs and group[0] % bs == 0 and group == list(range(group[0], group[0] + bs)):
                kv.blocks.share(group[0] // bs)
                table.append(group[0] // bs)
            else:
                try:
                    block = kv.take_block()
                except Exception:
                    break
                kv.copy_slots(group, list(range(block * bs, block * bs + len(group))))
                kv.block_fill[block] = len(group)
                table.append(block)
            reused += len(group)
    finally:
        for b in matched:
            kv.blocks.release(b)
    return table, reused


class RadixPrefixCache(PrefixCache):
    def __init__(self, kv):
        super().__init__(kv)
        self.root = {"children": {}, "slot": None, "parent": None, "used": 0, "token": None}
        self.time = 0
        self.refs = {}  # block -> nodes holding a slot in it

    def match(self, token_ids):
        self.time += 1
        node, out = self.root, []
        for t in token_ids:
            node = node["children"].get(t)
            if node is None:
                break
            node["used"] = self.time
            out.append(node["slot"])
        return out

    def attach(self, seq):
        table, reused = share_or_copy(self.kv, self.match(seq.all_ids[:seq.num_tokens - 1]))
        seq.block_table, seq.num_computed = table, reused
        return reused

    def insert(self, seq):
        self.time += 1
        tokens = seq.all_ids[:seq.num_computed]
        node = self.root
        for t, s in zip(tokens, self.kv.slots(seq, 0, len(tokens))):
            child = node["children"].get(t)
            if child is None:
                child = {"children": {}, "slot": s, "parent": node, "used": self.time, "token": t}
                node["children"][t] = child
                b = s // self.kv.block_size
                self.blocks.share(b)
                self.refs[b] = self.refs.get(b, 0) + 1
            child["used"] = self.time
            node = child

    def num_evictable(self):
        return sum(1 for b, n in self.refs.items() if self.blocks.ref_count(b) == n)

    def evict_one(self):
        free = self.blocks.num_free_blocks()
        while self.blocks.num_free_blocks() == free:
            leaves, stack = [], [self.root]
            while stack:
                n = stack.pop()
                if n["children"]:
                    stack.extend(n["children"].values())
                elif n is not self.root:
                    leaves.append(n)
            if not leaves:
                return False
            leaf = min(leaves, key=lambda n: n["used"])
            del leaf["parent"]["children"][leaf["token"]]
            b = leaf["slot"] // self.kv.block_size
            self.refs[b] -= 1
            if not self.refs[b]:
                del self.refs[b]
            self.blocks.release(b)
        return True
'''


@pytest.mark.parametrize("name", [*VARIANTS, "trie-of-one-token-per-node"])
def test_a_correct_variant_passes(tmp_path, name):
    text = TRIE if name == "trie-of-one-token-per-node" else mutated(KEY, VARIANTS[name])
    assert_variant_passes(KEY, text, tmp_path)
