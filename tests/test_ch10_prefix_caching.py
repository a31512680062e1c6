"""Chapter 10's measured findings: what each prefix cache matches, the workloads it is measured on,
and the words computed from both."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import matplotlib.pyplot as plt

from infer_lab.bench.prefix_workloads import (
    Reply,
    longest_request,
    prefix_sharing_workloads,
    prompt_lengths,
)
from infer_lab.course import ch10_prefix_caching as ch10
from infer_lab.course.notebook_code import notebook_function


def test_prefix_match_granularity_is_measured_per_cache(embedded):
    match = ch10.run_granularity(embedded, ch10.sizes("cpu", "quick"), block_size=4, shared=[0, 3, 5, 11])
    assert [match.reused("hash", k) for k in (0, 3, 5, 11)] == [0, 0, 4, 8]  # whole blocks only
    assert [match.reused("radix", k) for k in (0, 3, 5, 11)] == [0, 3, 5, 11]  # every shared token
    assert match.granularity("hash") == "block" and match.granularity("radix") == "token"
    text = ch10.granularity_text(match)
    assert "whole blocks only" in text and "agree at 8 of 8 points" in text and "matched alike" not in text


def test_one_token_blocks_make_the_hash_table_token_granular_too(embedded):
    """Granularity is the block size's, not the tree's: with 1-token blocks hash reuses every shared token."""
    match = ch10.run_granularity(embedded, ch10.sizes("cpu", "quick"), block_size=1)
    assert match.granularity("hash") == match.granularity("radix") == "token"
    assert all(match.reused("hash", k) == match.reused("radix", k) for k in match.shared_values())
    assert "matched alike" in ch10.granularity_text(match) and "whole blocks only" not in ch10.granularity_text(match)


def test_the_granularity_note_keeps_tree_and_granularity_apart():
    note = ch10.granularity_note(4)
    assert f"SGLang {ch10.SGLANG_VERSION}" in note and "4-token blocks" in note
    assert f"defaults to {ch10.SGLANG_DEFAULT_PAGE_SIZE} token" in note and "--page-size" in note
    assert all(name in note for name in ch10.SGLANG_FORCED_PAGE_SIZES)
    assert "16-token blocks" in ch10.granularity_note(16)


def test_a_typo_breaks_both_caches_from_the_typo_on():
    inside = ch10.typo_reuse(40, 16, 24)  # typo inside the second block
    assert inside == {"hash": 16, "radix": 24}
    text = ch10.typo_text(40, 16, 24)
    assert "hands back 16 tokens and the radix tree 24" in text and "compute the 16 tokens from the typo on" in text
    assert "keeps the 8 tokens" in text and "block edge, so both get the same" not in text
    edge = ch10.typo_text(48, 16, 32)  # the inverted case: a typo on a block edge
    assert ch10.typo_reuse(48, 16, 32) == {"hash": 32, "radix": 32}
    assert "block edge, so both get the same" in edge and "keeps the" not in edge
    s = ch10.sizes("cpu", "quick")
    assert ch10.typo_position(s) % s.block_size  # the page's example sits inside a block
    full = ch10.sizes("cuda", "full")
    assert ch10.typo_position(full) % full.block_size


def test_shared_lengths_straddle_every_block_edge():
    assert ch10.shared_lengths(4, 12) == [0, 1, 3, 4, 5, 7, 8, 9]


def test_the_prediction_is_whole_blocks_for_hash_and_every_token_for_radix_but_never_the_last():
    assert [ch10.predicted_reuse("hash", k, 4, 12) for k in (0, 3, 4, 7, 11, 12)] == [0, 0, 4, 4, 8, 8]
    assert [ch10.predicted_reuse("radix", k, 4, 12) for k in (0, 3, 11, 12)] == [0, 3, 11, 11]
    assert ch10.shared_prompt_prediction(4, 40, 16) == {"hash": 96, "radix": 120}


def test_the_figure_draws_the_prediction_as_a_staircase():
    points = [ch10.MatchPoint(c, k, ch10.predicted_reuse(c, k, 4, 12)) for c in ch10.CACHES
              for k in ch10.shared_lengths(4, 12)]
    fig = ch10.granularity_figure(ch10.MatchResult(4, 12, points), "test")
    predicted = {line.get_label(): line for line in fig.axes[0].lines if "predicted" in line.get_label()}
    hash_line = predicted["hash (predicted)"]
    assert hash_line.get_drawstyle() == "steps-post"
    xs, ys = list(hash_line.get_xdata()), list(hash_line.get_ydata())
    assert xs == list(range(len(xs))) and ys[:9] == [0, 0, 0, 0, 4, 4, 4, 4, 8]  # flat, then a step at each edge
    plt.close(fig)


def _waves(output_len: int = 3):
    s = ch10.sizes("cpu", "quick")
    return s, prefix_sharing_workloads(1000, s.system_len, s.users, s.conversations, s.turns, s.branches, output_len)


def test_workloads_share_prefixes_as_described():
    s, waves = _waves()
    assert set(waves) == set(ch10.WORKLOADS)
    fake = {(i, j): [7] * n for ws in waves.values() for i, w in enumerate(ws) for j, n in enumerate(w.output_lens)}
    prompts = {name: [w.prompts_with(fake) for w in ws] for name, ws in waves.items()}
    assert {name: [[len(p) for p in wave] for wave in ps] for name, ps in prompts.items()} == {
        name: prompt_lengths(ws) for name, ws in waves.items()}  # lengths are known before anything runs
    system = prompts["shared_system_prompt"][0][0][: s.system_len]
    assert all(p[: len(system)] == system for wave in prompts["shared_system_prompt"] for p in wave)
    assert sum(map(len, prompts["shared_system_prompt"])) == s.users
    turns = prompts["multi_turn_chat"]
    assert len(turns) == s.turns
    for before, after in zip(turns, turns[1:], strict=False):  # each turn extends the previous one and its reply
        assert all(a[: len(b) + 3] == b + [7] * 3 and len(a) > len(b) + 3 for b, a in zip(before, after, strict=True))
    history, proposals, reviews = prompts["agentic_branching"]
    assert len(proposals) == s.branches
    assert all(r[: len(p) + 3] == p + [7] * 3 for p, r in zip(proposals, reviews, strict=True))
    assert all(w.output_lens == (3,) * len(w.prompts) for ws in waves.values() for w in ws)
    assert longest_request(waves["multi_turn_chat"]) == max(map(len, turns[-1])) + 3
    assert prefix_sharing_workloads(1000, s.system_len, s.users, s.conversations, s.turns, s.branches, 3) == waves


def test_the_replies_are_placeholders_for_the_model_s_own_tokens():
    _, waves = _waves()
    chat = waves["multi_turn_chat"]
    later = [piece for w in chat[1:] for prompt in w.prompts for piece in prompt if isinstance(piece, Reply)]
    assert later and all(r.wave < len(chat) - 1 for r in later)  # turn t quotes a reply of an earlier turn
    assert not any(isinstance(piece, Reply) for prompt in chat[0].prompts for piece in prompt)


def test_a_chat_turn_sends_back_the_tokens_the_engine_generated(embedded):
    """The notebook's serve_waves on a three-turn chat: turn k+1's prompt starts with turn k's prompt
    and the tokens the engine generated for it, and the cache hands part of that reply back."""
    s = dataclasses.replace(ch10.sizes("cpu", "quick"), conversations=2, turns=3, output_len=5)
    waves = ch10.workload_waves(embedded, s)["multi_turn_chat"]
    serve_waves = notebook_function("10", "serve_waves")
    step_log, stats, outputs = serve_waves(embedded, waves, "radix", s.block_size)
    assert len(outputs) == s.conversations * s.turns
    for k in range(s.turns - 1):
        for c in range(s.conversations):
            this, following = outputs[k * s.conversations + c], outputs[(k + 1) * s.conversations + c]
            assert len(this.token_ids) == s.output_len
            head = list(this.prompt_ids) + list(this.token_ids)
            assert list(following.prompt_ids[: len(head)]) == head
            # everything but the reply's last token (its K/V was never computed) came from the cache
            assert following.num_cached_prompt_tokens == len(head) - 1
    run = ch10.workload_run("multi_turn_chat", "radix", s.block_size, step_log, stats, outputs)
    # turn k quotes k replies, all computed by now except the last token of the newest one
    assert run.generated_tokens_reused == sum(s.conversations * (k * s.output_len - 1) for k in range(1, s.turns))
    again = serve_waves(embedded, waves, "radix", s.block_size)[2]  # deterministic: greedy, EOS ignored
    assert [o.prompt_ids for o in again] == [o.prompt_ids for o in outputs]


def _out(prompt, tokens, cached):
    return SimpleNamespace(prompt_ids=list(prompt), token_ids=list(tokens), num_cached_prompt_tokens=cached)


def test_generated_tokens_reused_counts_only_reply_tokens_found_in_the_cache():
    first = _out([1, 2, 3], [8, 9], 0)
    assert ch10.generated_tokens_reused([first, _out([1, 2, 3, 8, 9, 4], [5], 4)]) == 1  # 8 found, 9 not
    assert ch10.generated_tokens_reused([first, _out([1, 2, 3, 8, 9, 4], [5], 3)]) == 0  # only the prompt found
    assert ch10.generated_tokens_reused([first, _out([1, 2, 3, 7, 9, 4], [5], 3)]) == 0  # a different reply
    third = _out([1, 2, 3, 8, 9, 4, 5, 6], [0], 7)  # quotes both earlier replies; 8, 9 and 5 found
    assert ch10.generated_tokens_reused([first, _out([1, 2, 3, 8, 9, 4], [5], 5), third]) == 2 + 3


def _run(workload, cache, computed, hit_rate, ttft=0.1, inside=0, hits=4, generated=0):
    return ch10.WorkloadRun(workload, cache, 16, 4, 400, computed, hit_rate, ttft, ttft, 1.0, hits, inside, generated)


def _workloads(**radix):
    runs = [_run("multi_turn_chat", "none", 400, 0.0, hits=0), _run("multi_turn_chat", "hash", 300, 0.25),
            _run("multi_turn_chat", "radix", **{"computed": 250, "hit_rate": 0.375, "inside": 3, "generated": 12,
                                                 **radix})]
    return ch10.WorkloadsResult(runs, 16, 40, 6)


def test_workloads_text_says_where_radix_won_and_why_from_the_numbers():
    text = ch10.workloads_text(_workloads())
    assert "Radix saved more prefill than hash on multi-turn chat (50 tokens more; 3 of radix's 4 hits" in text
    assert "12 of them tokens the model had generated" in text
    hash_wins = ch10.workloads_text(_workloads(computed=350, hit_rate=0.125, generated=0))  # the inverted case
    assert "Hash saved more than radix on multi-turn chat (50 tokens)" in hash_wins and "Radix saved more" not in hash_wins
    assert "tokens the model had generated" not in hash_wins
    same = ch10.workloads_text(_workloads(computed=300, hit_rate=0.25))
    assert "They saved the same on multi-turn chat" in same


def _agentic(hash_computed, radix_computed, hash_ttft=0.1, radix_ttft=0.1):
    runs = [_run("agentic_branching", "none", 1000, 0.0, hits=0),
            _run("agentic_branching", "hash", hash_computed, 1 - hash_computed / 1000, ttft=hash_ttft),
            _run("agentic_branching", "radix", radix_computed, 1 - radix_computed / 1000, ttft=radix_ttft)]
    return ch10.WorkloadsResult(runs, 16, 64, 8)


def test_the_sglang_claim_computes_the_granularity_gap_and_sets_the_ttft_beside_it():
    text = ch10.sglang_claim_text(_agentic(400, 340))
    assert "worth 6.0 points of hit rate here and 1.18× in prefill tokens, short of the reported 3×" in text
    assert "the time followed the work" in text
    far = ch10.sglang_claim_text(_agentic(400, 100))  # the inverted case: the cache alone reaches the claim
    assert "worth 30.0 points" in far and "4.00× in prefill tokens, as much as the reported 3×" in far
    assert "short of" not in far


def test_a_ttft_ratio_beyond_the_work_is_called_noise_and_one_below_it_overhead():
    hash_, radix = _run("a", "hash", 400, 0.6, ttft=0.4), _run("a", "radix", 340, 0.66, ttft=0.1)
    noisy = ch10.ttft_vs_work_text(hash_, radix)
    assert "4.00×, against 1.18× in prefill tokens" in noisy and "noise" in noisy
    slow = ch10.ttft_vs_work_text(_run("a", "hash", 400, 0.6, ttft=0.1), _run("a", "radix", 100, 0.9, ttft=0.1))
    assert "1.00×, against 4.00×" in slow and "moved less than the work" in slow
    assert ch10.ttft_vs_work_text(_run("a", "hash", 400, 0.6, ttft=0.0), radix) == ""
