"""Chapter 10's exercises: chained block hashes, tokens reused by each cache, and a workload's hit rate."""

from __future__ import annotations

import random

from ...engine import HashPrefixCache, RadixPrefixCache
from . import Exercise
from .checking import plain
from .engine_sim import paged_cache, sequence

NUMBER = "10"
SLUG = "prefix_caching"
TITLE = "10 · Prefix caching"

CACHES = {"hash": HashPrefixCache, "radix": RadixPrefixCache}


def _tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 50_000) for _ in range(n)]


def _reuse(kind: str, cached: list[int], new: list[int], block_size: int, cache_class=None) -> int:
    """Tokens of ``new`` that the engine's ``kind`` cache hands over after ``cached`` was computed."""
    kv = paged_cache(2 * (len(cached) + len(new)) // block_size + 4, block_size)
    cache = (cache_class or CACHES[kind])(kv)
    first = sequence("cached", cached)
    kv.allocate(first, len(cached))
    first.num_computed = len(cached)
    cache.insert(first)
    return cache.attach(sequence("new", new))


def _learner_hash_cache(block_hashes):
    class LearnerHashes(HashPrefixCache):
        def block_hashes(self, token_ids, num_blocks):
            return list(block_hashes(list(token_ids[: num_blocks * self.kv.block_size]), self.kv.block_size))
    return LearnerHashes


def check_block_hashes(fns, r) -> None:
    bs = 4
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    case = f"tokens {a}, blocks of {bs}"
    got = plain(r.call(fns.block_hashes, list(a), bs, case=case))  # a tuple, generator or array is fine
    if not isinstance(got, list):
        r.record(case, False, f"return one hash per full block (a list or tuple), got {type(got).__name__} "
                              f"{got!r:.60}")
        return
    if len(got) != 2:
        why = ("a hash for the partial last block too: only full blocks are hashed (their K/V is final)"
               if len(got) == 3 else f"{len(got)} hashes")
        r.record(case, False, f"two full blocks of {bs}, so two hashes; got {why}: {got!r:.60}")
        return
    r.record(case, True, "one hash per full block")
    again = plain(r.call(fns.block_hashes, list(a), bs, case=case))
    r.record("the same tokens again", again == got, "the same hashes" if again == got else
             f"different hashes for the same tokens: {got} then {again}; hash the token ids, nothing else")
    b = [9, 9, 9, 9, 5, 6, 7, 8]  # block 1 equal to a's block 1, after a different block 0
    other = plain(r.call(fns.block_hashes, b, bs, case="same second block after a different first block"))
    r.record("same second block [5, 6, 7, 8] after a different first block", other[1] != got[1],
             "different hashes: the chain carries the prefix" if other[1] != got[1] else
             "equal hashes: a block's hash must depend on every token before it too (chain the previous "
             "block's hash), or a request would reuse K/V computed after a different prefix")
    for shared, block_size in ((40, 16), (33, 16), (64, 8)):
        cached, new = _tokens(shared + 20, 1), _tokens(shared, 1) + _tokens(30, 2)
        case = f"a real hash cache driven by your hashes: {shared} shared tokens, blocks of {block_size}"
        try:
            got = _reuse("hash", cached, new, block_size, _learner_hash_cache(fns.block_hashes))
        except Exception as exc:
            r.record(case, False, f"the cache failed with your hashes: {type(exc).__name__}: {exc}")
            continue
        r.close(case, got, _reuse("hash", cached, new, block_size), unit="tokens reused")


REUSE_CASES = ((0, 40, 16), (15, 40, 16), (16, 40, 16), (17, 40, 16), (40, 60, 16), (32, 32, 16), (9, 30, 1))


def check_reused(fns, r) -> None:
    for shared, new_len, block_size in REUSE_CASES:
        cached = _tokens(shared, 3) + _tokens(24, 4)
        new = _tokens(shared, 3) + _tokens(new_len - shared, 5)
        for kind in CACHES:
            case = f"{kind}: {shared} tokens shared, new prompt of {new_len}, blocks of {block_size}"
            got = r.call(fns.reused_tokens, shared, new_len, block_size, kind, case=case)
            hint = ("the last prompt token is always computed (its logits give the first output token)"
                    if shared >= new_len else
                    "the hash cache reuses whole blocks only" if kind == "hash" else
                    "the radix tree reuses every shared token")
            r.close(case, got, _reuse(kind, cached, new, block_size), unit="tokens", hint=hint)


HIT_CASES = ((8, 100, 28, 16), (4, 512, 64, 16), (10, 30, 10, 32), (6, 1000, 1, 16))


def _hit_rate(kind: str, n: int, system: int, user: int, block_size: int) -> float:
    kv = paged_cache(n * (system + user) // block_size + 8, block_size)
    cache = CACHES[kind](kv)
    prefix = _tokens(system, 7)
    for i in range(n):
        seq = sequence(f"r{i}", prefix + _tokens(user, 100 + i))
        hit = cache.attach(seq)
        cache.record(seq, hit)
        kv.allocate(seq, seq.num_tokens - seq.num_computed)
        seq.num_computed = seq.num_tokens
        cache.insert(seq)
        kv.free(seq)
    return cache.stats.hit_rate


def check_hit_rate(fns, r) -> None:
    for n, system, user, block_size in HIT_CASES:
        for kind in CACHES:
            case = f"{kind}: {n} requests, a {system}-token system prompt + {user} own tokens, blocks of {block_size}"
            got = r.call(fns.shared_prompt_hit_rate, n, system, user, block_size, kind, case=case)
            r.close(case, got, _hit_rate(kind, n, system, user, block_size), rel_tol=1e-9, abs_tol=1e-12,
                    hint="hit rate = prompt tokens found in the cache / all prompt tokens; the first request "
                         "finds nothing")


EXERCISES = [
    Exercise("block_hashes", "Chained block hashes", "implement",
             "Hash a prompt's full blocks so that a block's hash depends on every token before it; checked "
             "by properties and by driving the engine's hash cache with your hashes.", check_block_hashes),
    Exercise("reused_tokens", "What each cache reuses", "predict",
             "Predict how many prompt tokens the hash cache and the radix tree hand to a request that shares "
             "a prefix; checked against the engine's two caches.", check_reused),
    Exercise("shared_prompt_hit_rate", "A shared system prompt's hit rate", "predict",
             "Predict the hit rate of a workload whose requests share a system prompt; checked against the "
             "engine's caches run over that workload.", check_hit_rate),
]
