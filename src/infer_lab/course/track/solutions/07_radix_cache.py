"""Stage 7 · The radix prefix cache: a reference solution."""

import itertools
from collections import Counter

from infer_lab.engine.prefix_cache import PrefixCache, share_or_copy


class Node:
    """An edge of the tree: a run of tokens, the cache slot of each, children by their first token."""

    def __init__(self, tokens: list[int], slots: list[int], parent: "Node | None", last_used: int = 0):
        self.tokens, self.slots, self.parent = tokens, slots, parent
        self.children: dict[int, Node] = {}
        self.last_used = last_used


def common(edge: list[int], tokens: list[int]) -> int:
    """How many leading tokens ``edge`` and ``tokens`` share."""
    n = 0
    while n < len(edge) and n < len(tokens) and edge[n] == tokens[n]:
        n += 1
    return n


class RadixPrefixCache(PrefixCache):
    """A radix tree over token ids; the tree holds one reference on every block with a slot in it."""

    def __init__(self, kv) -> None:
        super().__init__(kv)
        self.root = Node([], [], None)
        self.clock = itertools.count(1)
        self.in_tree = Counter()  # block -> how many of its slots the tree holds

    def _hold(self, slots: list[int]) -> None:
        for s in slots:
            b = s // self.kv.block_size
            if not self.in_tree[b]:
                self.blocks.share(b)
            self.in_tree[b] += 1

    def _drop(self, slots: list[int]) -> None:
        for s in slots:
            b = s // self.kv.block_size
            self.in_tree[b] -= 1
            if not self.in_tree[b]:
                del self.in_tree[b]
                self.blocks.release(b)

    def match(self, token_ids: list[int]) -> list[int]:
        node, i, slots, now = self.root, 0, [], next(self.clock)
        while i < len(token_ids) and token_ids[i] in node.children:
            child = node.children[token_ids[i]]
            n = common(child.tokens, token_ids[i:])
            child.last_used = now
            slots += child.slots[:n]
            i += n
            if n < len(child.tokens):
                break  # the prompt parts from this edge in its middle
            node = child
        return slots

    def attach(self, seq) -> int:
        slots = self.match(seq.all_ids[:self.reusable_limit(seq)])
        seq.block_table, seq.num_computed = share_or_copy(self.kv, slots)
        return seq.num_computed

    def insert(self, seq) -> None:
        tokens = seq.all_ids[:seq.num_computed]
        slots = self.kv.slots(seq, 0, len(tokens))
        node, i, now = self.root, 0, next(self.clock)
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:  # the rest is new: one leaf, and the tree holds its blocks
                node.children[tokens[i]] = Node(tokens[i:], slots[i:], node, now)
                self._hold(slots[i:])
                return
            n = common(child.tokens, tokens[i:])
            child.last_used = now
            if n < len(child.tokens):
                if i + n == len(tokens):
                    return  # all of it is in the tree already
                self._split(child, n)
            node, i = child, i + n

    def _split(self, node: Node, n: int) -> None:
        """Cut ``node``'s edge after ``n`` tokens; the rest becomes its only child (same slots, same blocks)."""
        tail = Node(node.tokens[n:], node.slots[n:], node, node.last_used)
        tail.children = node.children
        for child in tail.children.values():
            child.parent = tail
        node.tokens, node.slots, node.children = node.tokens[:n], node.slots[:n], {tail.tokens[0]: tail}

    def _leaves(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root:
                out.append(node)
        return out

    def num_evictable(self) -> int:
        return sum(1 for b in self.in_tree if self.blocks.ref_count(b) == 1)  # the tree's is the only reference

    def evict_one(self) -> bool:
        free = self.blocks.num_free_blocks()
        while self.blocks.num_free_blocks() == free:
            leaves = self._leaves()
            if not leaves:
                return False
            leaf = min(leaves, key=lambda node: node.last_used)  # least recently used
            del leaf.parent.children[leaf.tokens[0]]
            self._drop(leaf.slots)
        self.stats.evicted_blocks += self.blocks.num_free_blocks() - free
        return True
