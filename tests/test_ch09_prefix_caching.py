"""Chapter 09's measured findings: what each prefix cache matches, and what it saves on workloads."""

from __future__ import annotations

from dataclasses import replace

from infer_lab.course import ch09_prefix_caching as ch09


def test_prefix_match_granularity_is_measured_per_cache(embedded):
    match = ch09.measure_match(embedded, block_size=4, prompt_len=16, shared=[0, 3, 5, 11])
    assert [match.reused("hash", k) for k in (0, 3, 5, 11)] == [0, 0, 4, 8]  # whole blocks only
    assert [match.reused("radix", k) for k in (0, 3, 5, 11)] == [0, 3, 5, 11]  # every shared token
    assert match.granularity("hash") == "block" and match.granularity("radix") == "token"
    assert "whole blocks only" in ch09.granularity_text(match)


def test_shared_lengths_straddle_every_block_edge():
    assert ch09.shared_lengths(4, 12) == [0, 1, 3, 4, 5, 7, 8, 9]


def test_workloads_share_prefixes_as_described():
    waves = ch09.build_workloads(1000, ch09.sizes("cpu", "quick"))
    system = waves["shared_system_prompt"][0][0][: ch09.sizes("cpu", "quick").system_len]
    assert all(p[: len(system)] == system for wave in waves["shared_system_prompt"] for p in wave)
    turns = waves["multi_turn_chat"]
    for before, after in zip(turns, turns[1:], strict=False):  # each turn extends the previous one
        assert all(b == a[: len(b)] for b, a in zip(before, after, strict=True))
    history, proposals, reviews = waves["agentic_branching"]
    assert all(r[: len(p)] == p for p, r in zip(proposals, reviews, strict=True))


def test_caches_compute_fewer_prefill_tokens_and_radix_never_less_than_hash(embedded):
    tiny = replace(ch09.sizes("cpu", "quick"), system_len=16, users=2, conversations=1, turns=2,
                   branches=1, output_len=1, block_size=8)
    result = ch09.measure_workloads(embedded, tiny)
    for name in result.workloads():
        none, hash_, radix = (result.run(name, c) for c in ("none", "hash", "radix"))
        assert none.prefill_tokens_computed == none.prompt_tokens and none.hit_rate == 0
        assert hash_.prompt_tokens == radix.prompt_tokens == none.prompt_tokens
        assert 0 < radix.prefill_tokens_computed <= hash_.prefill_tokens_computed < none.prompt_tokens
    # The 16-token system prompt is two whole 8-token blocks: both caches save exactly the same.
    shared = [result.run("shared_system_prompt", c).prefill_tokens_saved for c in ("hash", "radix")]
    assert shared[0] == shared[1] == 16
