"""Reusing the K/V of prompt prefixes that were computed before.

Two designs over the same reference-counted blocks (:class:`~.block_manager.BlockManager`):

* :class:`HashPrefixCache` (vLLM style): a *full* block is named by a hash of its tokens and of
  the hash of the block before it, so equal hashes mean equal prefixes. Hits are block-aligned:
  a 100-token shared prefix with 16-token blocks reuses 96 tokens.
* :class:`RadixPrefixCache` (SGLang style): a radix tree over token ids whose nodes remember the
  slot of every token. Matches here are token-granular because of this engine's copy-on-write:
  whole blocks are shared by reference, and a partly matching block is copied into a fresh block,
  so nothing is recomputed. The tree is not what makes it token-granular: SGLang itself matches
  token by token only at its default page size of 1, and page-aligned above that.

Both hold one reference on each block they remember, and give blocks back in least-recently-used
order when the pool runs dry (only blocks no running request holds are actually freed).
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from dataclasses import dataclass, field

from .kv_cache import OutOfKVMemory, PagedKVCache
from .sequence import Sequence


@dataclass
class PrefixCacheStats:
    """Lookups on admission: prompt tokens asked for and found. ``hit_rate = hit / queried``."""

    queried_tokens: int = 0
    hit_tokens: int = 0
    lookups: int = 0
    evicted_blocks: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "queried_tokens": self.queried_tokens,
            "hit_tokens": self.hit_tokens,
            "lookups": self.lookups,
            "evicted_blocks": self.evicted_blocks,
            "hit_rate": self.hit_rate,
        }


class PrefixCache:
    """Common interface: ``attach`` on admission, ``insert`` when K/V was computed, ``clear`` at the end.

    The KV cache calls ``attach`` / ``detach`` / ``insert`` (through its ``attach_prefix``,
    ``detach_prefix``, ``cache_prefix`` and ``free``), ``evict_one`` when it runs out of free blocks
    and ``num_evictable`` when it counts what it could hand out; ``record`` counts an admitted
    request's hit in :attr:`stats`.
    """

    kind = "none"

    def __init__(self, kv: PagedKVCache):
        self.kv = kv
        self.blocks = kv.blocks  # the block manager: share / release / ref_count
        self.stats = PrefixCacheStats()
        kv.prefix_cache = self  # the KV cache evicts through this cache when blocks run out

    def reusable_limit(self, seq: Sequence) -> int:
        """At most all tokens but the last: the last one must be computed to produce logits."""
        return seq.num_tokens - 1

    def attach(self, seq: Sequence) -> int:
        """Point a fresh ``seq`` at cached blocks for its longest cached prefix; returns tokens reused."""
        raise NotImplementedError

    def detach(self, seq: Sequence) -> None:
        """Undo :meth:`attach` when the request could not be admitted after all."""
        self.kv.free(seq)
        seq.num_computed = 0

    def insert(self, seq: Sequence) -> None:
        raise NotImplementedError

    def evict_one(self) -> bool:
        raise NotImplementedError

    def num_evictable(self) -> int:
        raise NotImplementedError

    def clear(self) -> None:
        """Forget everything (blocks still used by requests stay allocated to them)."""
        while self.evict_one():
            pass

    def record(self, seq: Sequence, hit: int) -> None:
        """Count one admitted request's lookup in the hit-rate statistics."""
        self.stats.lookups += 1
        self.stats.queried_tokens += len(seq.prompt_ids)
        self.stats.hit_tokens += min(hit, len(seq.prompt_ids))


class HashPrefixCache(PrefixCache):
    """Block-aligned reuse keyed by chained block hashes (vLLM's automatic prefix caching)."""

    kind = "hash"

    def __init__(self, kv: PagedKVCache):
        super().__init__(kv)
        self.block_of: OrderedDict[int, int] = (
            OrderedDict()
        )  # hash -> block, least recently used first

    def block_hashes(self, token_ids: list[int], num_blocks: int) -> list[int]:
        """Chained hashes of the first ``num_blocks`` full blocks: h_i = hash(h_{i-1}, tokens of block i)."""
        bs, out, parent = self.kv.block_size, [], 0
        for i in range(num_blocks):
            parent = hash((parent, tuple(token_ids[i * bs : (i + 1) * bs])))
            out.append(parent)
        return out

    def attach(self, seq: Sequence) -> int:
        usable_blocks = self.reusable_limit(seq) // self.kv.block_size
        hits = []
        for h in self.block_hashes(seq.all_ids, usable_blocks):
            block = self.block_of.get(h)
            if block is None:
                break
            self.block_of.move_to_end(h)
            self.blocks.share(block)
            hits.append(block)
        seq.block_table = hits
        seq.num_computed = len(hits) * self.kv.block_size
        return seq.num_computed

    def insert(self, seq: Sequence) -> None:
        """Remember every full block of ``seq`` whose K/V is computed."""
        full = min(seq.num_computed // self.kv.block_size, len(seq.block_table))
        for h, block in zip(self.block_hashes(seq.all_ids, full), seq.block_table, strict=False):
            if h not in self.block_of:
                self.block_of[h] = block
                self.blocks.share(block)

    def num_evictable(self) -> int:
        return sum(1 for b in self.block_of.values() if self.blocks.ref_count(b) == 1)

    def evict_one(self) -> bool:
        """Forget the least recently used block no request holds; False when there is none."""
        for h, block in self.block_of.items():
            if self.blocks.ref_count(block) == 1:
                del self.block_of[h]
                self.blocks.release(block)
                self.stats.evicted_blocks += 1
                return True
        return False

    def clear(self) -> None:
        for block in self.block_of.values():
            self.blocks.release(block)
        self.block_of.clear()


def share_or_copy(kv: PagedKVCache, slots: list[int]) -> tuple[list[int], int]:
    """A block table for a request whose first ``len(slots)`` tokens' K/V sit in cache ``slots``.

    Each group of ``block_size`` slots that is one whole block, in order, is shared by reference
    (one more holder). Any other group (a partly matching last block, or a block's worth of slots
    from two blocks) is copied into a fresh block (``kv.take_block()``, which may evict, then
    ``kv.copy_slots``), so the request can write its own tokens after it: copy-on-write.

    The blocks of groups still to come are held meanwhile, so making room for a copy cannot evict
    them. A copy's own sources may go: the copy reads them before anything is written, and with a
    full pool the block handed back may be one of them. Returns ``(block_table, tokens reused)``;
    fewer tokens than ``len(slots)`` only when no block could be found for a copy.
    """
    bs = kv.block_size
    groups = [slots[i * bs : (i + 1) * bs] for i in range(math.ceil(len(slots) / bs))]
    held = [{s // bs for s in group} for group in groups]
    for blocks in held:
        for b in blocks:
            kv.blocks.share(b)
    table: list[int] = []
    reused = 0
    try:
        for i, group in enumerate(groups):
            first = group[0]
            if len(group) == bs and first % bs == 0 and group == list(range(first, first + bs)):
                kv.blocks.share(first // bs)
                table.append(first // bs)
            else:
                for b in held[i]:
                    kv.blocks.release(b)
                held[i] = set()
                try:
                    block = kv.take_block()
                except OutOfKVMemory:
                    break
                kv.copy_slots(group, list(range(block * bs, block * bs + len(group))))
                kv.block_fill[block] = len(group)
                table.append(block)
            reused += len(group)
    finally:
        for blocks in held:
            for b in blocks:
                kv.blocks.release(b)
    return table, reused


@dataclass(eq=False)
class RadixNode:
    """An edge of the radix tree: a run of tokens and the cache slot of each of them."""

    tokens: list[int]
    slots: list[int]
    parent: RadixNode | None
    children: dict[int, RadixNode] = field(default_factory=dict)  # first token -> child
    last_used: int = 0


class RadixPrefixCache(PrefixCache):
    """Token-granular reuse with a radix tree (SGLang's RadixAttention), LRU eviction of leaves."""

    kind = "radix"

    def __init__(self, kv: PagedKVCache):
        super().__init__(kv)
        self.root = RadixNode(tokens=[], slots=[], parent=None)
        self.clock = itertools.count(1)
        self.tree_refs: dict[int, int] = {}  # block -> references held by tree nodes

    def _blocks(self, slots: list[int]) -> set[int]:
        return {s // self.kv.block_size for s in slots}

    def _hold(self, slots: list[int]) -> None:
        for b in self._blocks(slots):
            self.blocks.share(b)
            self.tree_refs[b] = self.tree_refs.get(b, 0) + 1

    def _release(self, slots: list[int]) -> None:
        for b in self._blocks(slots):
            self.tree_refs[b] -= 1
            if not self.tree_refs[b]:
                del self.tree_refs[b]
            self.blocks.release(b)

    def match(self, token_ids: list[int]) -> list[int]:
        """Slots of the longest cached prefix of ``token_ids`` (touching the nodes on the way)."""
        node, i, slots, now = self.root, 0, [], next(self.clock)
        while i < len(token_ids):
            child = node.children.get(token_ids[i])
            if child is None:
                break
            n = 0
            while (
                n < len(child.tokens)
                and i + n < len(token_ids)
                and child.tokens[n] == token_ids[i + n]
            ):
                n += 1
            child.last_used = now
            slots += child.slots[:n]
            i += n
            if n < len(child.tokens):
                break
            node = child
        return slots

    def attach(self, seq: Sequence) -> int:
        """Share whole matching blocks by reference; copy a partly matching block into a new one."""
        seq.block_table, seq.num_computed = share_or_copy(self.kv, self.match(seq.all_ids[: self.reusable_limit(seq)]))
        return seq.num_computed

    def insert(self, seq: Sequence) -> None:
        """Add ``seq``'s computed tokens to the tree; only the part not already there takes new references."""
        tokens = seq.all_ids[: seq.num_computed]
        slots = self.kv.slots(seq, 0, len(tokens))
        node, i, now = self.root, 0, next(self.clock)
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                leaf = RadixNode(tokens=tokens[i:], slots=slots[i:], parent=node, last_used=now)
                self._hold(leaf.slots)
                node.children[tokens[i]] = leaf
                return
            n = 0
            while (
                n < len(child.tokens) and i + n < len(tokens) and child.tokens[n] == tokens[i + n]
            ):
                n += 1
            child.last_used = now
            if n < len(child.tokens):
                if i + n == len(tokens):
                    return
                self._split(child, n)
            node, i = child, i + n

    def _split(self, node: RadixNode, n: int) -> None:
        """Cut ``node``'s edge after ``n`` tokens; the tail becomes its only child."""
        tail = RadixNode(
            tokens=node.tokens[n:],
            slots=node.slots[n:],
            parent=node,
            children=node.children,
            last_used=node.last_used,
        )
        for c in tail.children.values():
            c.parent = tail
        head_slots = node.slots[:n]
        # The node held one reference per block of all its slots; now head and tail each hold their own.
        self._hold(head_slots)
        self._hold(tail.slots)
        self._release(node.slots)
        node.tokens, node.slots, node.children = node.tokens[:n], head_slots, {tail.tokens[0]: tail}

    def _leaves(self) -> list[RadixNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root:
                out.append(node)
        return out

    def num_evictable(self) -> int:
        return sum(1 for b, n in self.tree_refs.items() if self.blocks.ref_count(b) == n)

    def evict_one(self) -> bool:
        """Drop least-recently-used leaves until a block is freed; False when the tree is empty."""
        free_before = self.blocks.num_free_blocks()
        while self.blocks.num_free_blocks() == free_before:
            leaves = self._leaves()
            if not leaves:
                return False
            leaf = min(leaves, key=lambda n: n.last_used)
            self._release(leaf.slots)
            del leaf.parent.children[leaf.tokens[0]]
        self.stats.evicted_blocks += self.blocks.num_free_blocks() - free_before
        return True

    def clear(self) -> None:
        while self._leaves():
            for leaf in self._leaves():
                self._release(leaf.slots)
                del leaf.parent.children[leaf.tokens[0]]
