"""Chapter 10's measured findings: what each prefix cache matches, and the workloads it is measured on."""

from __future__ import annotations

from infer_lab.bench.prefix_workloads import prefix_sharing_workloads
from infer_lab.course import ch10_prefix_caching as ch10


def test_prefix_match_granularity_is_measured_per_cache(embedded):
    match = ch10.run_granularity(embedded, ch10.sizes("cpu", "quick"), block_size=4, shared=[0, 3, 5, 11])
    assert [match.reused("hash", k) for k in (0, 3, 5, 11)] == [0, 0, 4, 8]  # whole blocks only
    assert [match.reused("radix", k) for k in (0, 3, 5, 11)] == [0, 3, 5, 11]  # every shared token
    assert match.granularity("hash") == "block" and match.granularity("radix") == "token"
    assert "whole blocks only" in ch10.granularity_text(match) and "agree at 8 of 8 points" in ch10.granularity_text(match)


def test_shared_lengths_straddle_every_block_edge():
    assert ch10.shared_lengths(4, 12) == [0, 1, 3, 4, 5, 7, 8, 9]


def test_the_prediction_is_whole_blocks_for_hash_and_every_token_for_radix_but_never_the_last():
    assert [ch10.predicted_reuse("hash", k, 4, 12) for k in (0, 3, 4, 7, 11, 12)] == [0, 0, 4, 4, 8, 8]
    assert [ch10.predicted_reuse("radix", k, 4, 12) for k in (0, 3, 11, 12)] == [0, 3, 11, 11]
    assert ch10.shared_prompt_prediction(4, 40, 16) == {"hash": 96, "radix": 120}


def test_workloads_share_prefixes_as_described():
    s = ch10.sizes("cpu", "quick")
    waves = prefix_sharing_workloads(1000, s.system_len, s.users, s.conversations, s.turns, s.branches, s.output_len)
    assert set(waves) == set(ch10.WORKLOADS)
    prompts = {name: [w.prompts for w in ws] for name, ws in waves.items()}
    system = prompts["shared_system_prompt"][0][0][: s.system_len]
    assert all(p[: len(system)] == system for wave in prompts["shared_system_prompt"] for p in wave)
    assert sum(map(len, prompts["shared_system_prompt"])) == s.users
    turns = prompts["multi_turn_chat"]
    assert len(turns) == s.turns
    for before, after in zip(turns, turns[1:], strict=False):  # each turn extends the previous one
        assert all(b == a[: len(b)] and len(a) > len(b) for b, a in zip(before, after, strict=True))
    history, proposals, reviews = prompts["agentic_branching"]
    assert len(proposals) == s.branches
    assert all(r[: len(p)] == p for p, r in zip(proposals, reviews, strict=True))
    assert all(w.output_lens == [s.output_len] * len(w.prompts) for ws in waves.values() for w in ws)
    again = prefix_sharing_workloads(1000, s.system_len, s.users, s.conversations, s.turns, s.branches, s.output_len)
    assert again == waves  # seeded
