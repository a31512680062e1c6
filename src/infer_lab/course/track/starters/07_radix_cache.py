"""Stage 7 · The radix prefix cache: match, insert and evict (SGLang's RadixAttention).

Requests that start alike (a system prompt, a few-shot header, a chat's history) compute the same
K/V for their common prefix. A prefix cache keeps the K/V of finished (and prefilled) requests and
hands it to later ones, so their prefill skips what was computed before.

Here the cache is a **radix tree** over token ids: each node is an edge of one or more tokens and
remembers the KV-cache slot of each of them (a slot is ``block * block_size + offset``; a request's
K/V lives in the blocks of its block table). A lookup walks down from the root as long as the
prompt agrees with the edges, **token by token**: a prompt may part from an edge in its middle and
still reuse the tokens before that point. An insert walks the same way and adds what is new; where
the new text parts from an edge in its middle, the edge is split in two.

Memory: the tree holds references on the blocks its slots sit in (``self.blocks.share(b)`` /
``self.blocks.release(b)``, the block manager's reference counts), so a finished request's blocks
stay allocated while the tree remembers them. When the pool runs out, the KV cache calls
``evict_one()``: give back the **least recently used leaf** (a lookup or an insert that walks a node
uses it), and the next, until a block is actually freed. Only the tree's own references are given
back: a block that a running request also holds stays allocated to it.

How the engine calls you (through its KV cache, ``src/infer_lab/engine/kv_cache.py``):

* ``attach(seq)`` when a waiting request is about to be admitted (``kv.attach_prefix``), and
  ``detach(seq)`` (given) when it is not admitted after all;
* ``insert(seq)`` after its prefill (its prompt's K/V is computed) and when it finishes or is
  preempted (``kv.cache_prefix`` / ``kv.free(seq, cache_prefix=True)``): ``seq.num_computed`` leading
  tokens of ``seq.all_ids`` have their K/V in ``kv.slots(seq, 0, n)``;
* ``num_evictable()`` when it counts the blocks it could hand out (``kv.available_blocks``);
* ``evict_one()`` when it needs a free block and none is left (``kv._make_room``);
* ``clear()`` (given: ``evict_one`` until it returns False) to forget everything.

Write ``match`` first (chapter 10's tree walk), then ``insert``, ``attach``, and eviction.
``share_or_copy`` (imported from the library's ``prefix_cache.py``) is given: it turns matched slots
into a block table (whole blocks shared by reference, a partly matching block copied into a fresh
block: copy-on-write).

Check it: ``infer-lab check engine radix``. Your cache then runs on hidden trees of any depth (the
same hits as the library's), in eviction scenarios (the least recently used text goes first), and
under memory pressure beside the library's (hits close to its own, nothing leaked, no block freed
under a running request), and inside the real engine, every token compared with transformers. The
library's version: ``src/infer_lab/engine/prefix_cache.py`` (``RadixPrefixCache``).
"""

from infer_lab.engine.prefix_cache import PrefixCache, share_or_copy  # noqa: F401  (share_or_copy: for attach)


class Node:
    """A suggestion: an edge of the tree (change it as you like).

    ``tokens``: the token ids along the edge into this node (the root's is empty); ``slots``: the
    cache slot of each of them; ``children``: first token of a child's edge -> the child;
    ``last_used``: when a lookup or an insert last walked it (for LRU eviction).
    """

    def __init__(self, tokens: list[int], slots: list[int], parent: "Node | None", last_used: int = 0):
        self.tokens, self.slots, self.parent = tokens, slots, parent
        self.children: dict[int, Node] = {}
        self.last_used = last_used


class RadixPrefixCache(PrefixCache):
    """Token-granular prefix reuse with a radix tree, LRU eviction of leaves.

    ``PrefixCache`` (the base class) gives ``self.kv`` (the paged KV cache: ``block_size``, ``slots``,
    ``take_block``, ``copy_slots``), ``self.blocks`` (its block manager: ``share``, ``release``,
    ``ref_count``, ``num_free_blocks``), ``self.stats``, ``reusable_limit(seq)``, ``detach``,
    ``clear`` and ``record``. The engine builds one with ``RadixPrefixCache(kv)``.
    """

    def __init__(self, kv) -> None:
        """Call ``super().__init__(kv)`` first (it registers this cache with the KV cache); then an empty tree."""
        raise NotImplementedError

    def match(self, token_ids: list[int]) -> list[int]:
        """The cache slots of the longest prefix of ``token_ids`` the tree holds, in order ([] for none).

        Walk down from the root: the child whose edge starts with the next token, then its edge
        token by token. An edge that matches only partly gives the slots of its matching tokens and
        ends the walk. Every node walked is used now (LRU).
        """
        raise NotImplementedError

    def attach(self, seq) -> int:
        """A fresh request (no blocks yet): point it at the cache's K/V for its longest cached prefix.

        At most ``self.reusable_limit(seq)`` tokens (all but the last: the last prompt token is
        always computed, its logits give the first new token). Set ``seq.block_table`` and
        ``seq.num_computed`` (``share_or_copy`` gives both) and return the tokens reused.
        """
        raise NotImplementedError

    def insert(self, seq) -> None:
        """Add ``seq``'s first ``seq.num_computed`` tokens (``seq.all_ids``) and their slots
        (``self.kv.slots(seq, 0, n)``) to the tree.

        Only what is not in the tree yet is added, and only that takes references on blocks (the
        part already there keeps its own slots and references: taking them again leaks blocks).
        Where the new text parts from an edge in its middle, split the edge. The nodes walked are
        used now (LRU).
        """
        raise NotImplementedError

    def num_evictable(self) -> int:
        """Blocks that evicting the whole tree would free: those whose every holder is the tree
        (no running request holds them)."""
        raise NotImplementedError

    def evict_one(self) -> bool:
        """Give back least recently used leaves (a leaf's parent may become a leaf) until one block is
        free again; False when the tree runs empty first. Never give back a reference the tree does
        not hold, and never evict a node that still has children."""
        raise NotImplementedError
