"""KV waste over time: the first-fit allocator, hand-checked tiny timelines, and a mixed workload."""

from __future__ import annotations

import random

import pytest

from infer_lab.analysis.fragmentation import (
    LAYOUTS,
    FirstFitAllocator,
    Request,
    StepSlots,
    make_layout,
    make_requests,
    simulate,
)
from infer_lab.analysis.kv_waste import kv_waste_breakdown, mixed_lengths
from infer_lab.bench.kv_allocators import kv_memory_waste
from infer_lab.course import ch08_kv_cache_paged as ch08
from infer_lab.engine.kv_cache import OutOfKVMemory

# (prompt, actual output, declared max_tokens), all arriving at step 0
TINY = [Request(0, 2, 1, 2), Request(0, 2, 2, 2), Request(0, 3, 2, 2)]
TINY_BUDGET, TINY_MAX_LEN = 10, 5


def run_tiny(layout: str, block_size: int = 2):
    return simulate(make_layout(layout, TINY_BUDGET, TINY_MAX_LEN, block_size), TINY, TINY_BUDGET)


def test_first_fit_takes_the_first_hole_and_coalesces_on_free():
    a = FirstFitAllocator(10)
    assert [a.allocate(3), a.allocate(3), a.allocate(3)] == [0, 3, 6]
    a.free(3)
    assert a.free_ranges == [(3, 3), (9, 1)]
    assert a.num_free == 4 and a.find(4) is None
    with pytest.raises(OutOfKVMemory):
        a.allocate(4)  # 4 slots are free, but no 4 of them are contiguous
    assert a.allocate(2) == 3  # first fit: the hole at 3, not the tail at 9
    a.free(0)
    assert a.free_ranges == [(0, 3), (5, 1), (9, 1)]
    a.free(3)  # merges with the hole before (0..3) and after (5)
    assert a.free_ranges == [(0, 6), (9, 1)]
    a.free(6)  # merges on both sides: one range again
    assert a.free_ranges == [(0, 10)] and a.allocated == {}
    with pytest.raises(ValueError, match="double free"):
        a.free(6)


def test_first_fit_never_overlaps_and_always_coalesces_under_random_use():
    rng, a, live = random.Random(3), FirstFitAllocator(200), []
    for _ in range(2000):
        if live and (rng.random() < 0.45 or a.largest_free == 0):
            a.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.randint(1, 30)
            if a.find(size) is None:
                with pytest.raises(OutOfKVMemory):
                    a.allocate(size)
                continue
            live.append(a.allocate(size))
        owner = [0] * a.capacity  # how many reservations or holes cover each slot
        for start, length in [*a.allocated.items(), *a.free_ranges]:
            for slot in range(start, start + length):
                owner[slot] += 1
        assert owner == [1] * a.capacity  # every slot exactly once: no overlap, no leak
        gaps = zip(a.free_ranges, a.free_ranges[1:], strict=False)
        assert all(s1 + n1 < s2 for (s1, n1), (s2, _) in gaps)  # sorted, never two touching holes


def test_contiguous_exact_tiny_case_by_hand():
    # Step 0: A takes slots 0-3 (2 + 2 declared), B 4-7; C needs 5 and only 8-9 are free.
    # A holds 3 of its 4 (1 never filled) and leaves; B holds 3 of 4 (1 for its next token).
    # Step 1: 0-3 and 8-9 are free, 6 slots >= C's 5, but no 5 in a row: 6 slots blocked.
    # Step 2: B left, the holes coalesced into 0-9; C takes 0-4.
    t = run_tiny("contiguous-exact")
    assert t.steps == [
        StepSlots(0, running=2, waiting=1, used=6, future=1, internal=1, external=0, free=2),
        StepSlots(1, running=1, waiting=1, used=4, future=0, internal=0, external=6, free=0),
        StepSlots(2, running=1, waiting=0, used=4, future=1, internal=0, external=0, free=5),
        StepSlots(3, running=1, waiting=0, used=5, future=0, internal=0, external=0, free=5),
    ]
    assert (t.eol_used, t.eol_reserved, t.preemptions) == (12, 13, 0)
    assert t.fractions() == {
        "used": 19 / 28,
        "future": 2 / 28,
        "internal": 1 / 28,
        "external": 6 / 28,
    }


def test_contiguous_max_tiny_case_by_hand():
    # Two regions of max_model_len = 5 slots. A holds 3 of 5 (2 never filled), B 3 of 5 (1 for
    # its next token, 1 never filled); C waits for a whole region, then fills all of it.
    t = run_tiny("contiguous-max")
    assert t.steps == [
        StepSlots(0, running=2, waiting=1, used=6, future=1, internal=3, external=0, free=0),
        StepSlots(1, running=2, waiting=0, used=8, future=1, internal=1, external=0, free=0),
        StepSlots(2, running=1, waiting=0, used=5, future=0, internal=0, external=0, free=5),
    ]
    assert (t.eol_used, t.eol_reserved) == (12, 15)


def test_paged_tiny_case_by_hand():
    # Blocks of 2 slots, 5 blocks. Step 0: A and B take 2 blocks each for 3 tokens; C needs 2
    # blocks, 1 is free. Step 1: A left, C gets 2 blocks. Step 2: C's 5th token opens a third
    # block whose second slot is never filled (internal fragmentation under one block).
    t = run_tiny("paged")
    assert t.steps == [
        StepSlots(0, running=2, waiting=1, used=6, future=1, internal=1, external=0, free=2),
        StepSlots(1, running=2, waiting=0, used=8, future=0, internal=0, external=0, free=2),
        StepSlots(2, running=1, waiting=0, used=5, future=0, internal=1, external=0, free=4),
    ]
    assert (t.eol_used, t.eol_reserved, t.preemptions) == (12, 14, 0)


def test_paged_preempts_the_newest_request_and_it_recomputes_later():
    # 3 blocks of 2 slots. Step 1: A takes the free block for its 3rd token; B (the newest) then
    # needs a block too and none is left, so B is preempted, and no one is admitted that step.
    # B comes back once A has left, recomputing its prompt and its one generated token.
    reqs = [Request(0, 1, 3, 3), Request(0, 1, 4, 4)]
    t = simulate(make_layout("paged", 6, 8, 2), reqs, 6)
    assert t.preemptions == 1
    assert [(s.running, s.waiting, s.used, s.future, s.internal) for s in t.steps] == [
        (2, 0, 4, 0, 0),  # both hold prompt + 1 token, one block each
        (1, 1, 3, 1, 0),  # B preempted; A holds 3 tokens in 2 blocks
        (1, 1, 4, 0, 0),  # A finishes; B needs 2 blocks, 1 is free
        (1, 0, 3, 1, 0),  # B back: prompt + 1 recomputed + the 2nd token
        (1, 0, 4, 0, 0),
        (1, 0, 5, 0, 1),  # its 5th and last token opens a 3rd block, half of it never filled
    ]
    assert all(s.external == 0 for s in t.steps)


def test_requests_are_cut_at_max_tokens_and_max_model_len():
    reqs = make_requests([10, 100], [50, 50], max_model_len=120, max_tokens=30, arrival_every=2.5)
    assert reqs == [Request(0, 10, 30, 30), Request(2, 100, 20, 20)]
    oracle = make_requests([10], [50], max_model_len=120, max_tokens=None)
    assert oracle == [Request(0, 10, 50, 50)]
    with pytest.raises(ValueError):
        make_requests([120], [1], max_model_len=120)


@pytest.fixture(scope="module")
def mixed():
    prompts, outputs = mixed_lengths(256, seed=0)
    requests = make_requests(prompts, outputs, max_model_len=2048, max_tokens=512)
    budget = 16384  # tokens: tight enough that requests queue in every layout
    return {
        name: simulate(make_layout(name, budget, 2048, 16), requests, budget) for name in LAYOUTS
    }


def test_mixed_workload_every_slot_is_classified_and_fractions_sum_to_one(mixed):
    for timeline in mixed.values():
        for s in timeline.steps:
            assert min(s.used, s.future, s.internal, s.external, s.free) >= 0
            assert s.used + s.future + s.internal + s.external + s.free == 16384
        assert sum(timeline.fractions().values()) == pytest.approx(1.0)


def test_mixed_workload_paged_has_no_external_and_under_a_block_internal(mixed):
    paged = mixed["paged"]
    assert all(s.external == 0 for s in paged.steps)
    assert all(s.internal + s.future < 16 * s.running or s.running == 0 for s in paged.steps)
    assert paged.eol_reserved - paged.eol_used < 16 * 256
    assert paged.preemptions > 0  # memory ran short, and still no slot was blocked by holes
    assert paged.fractions()["used"] > 0.95


def test_mixed_workload_contiguous_exact_shows_external_fragmentation(mixed):
    exact, cmax = mixed["contiguous-exact"], mixed["contiguous-max"]
    assert exact.total("external") > 0
    assert cmax.total("external") == 0  # equal-size reservations leave only usable holes
    assert cmax.fractions()["used"] < exact.fractions()["used"] < mixed["paged"].fractions()["used"]
    # the same tokens, and paging fits more requests at once, so it finishes first
    assert len(mixed["paged"].steps) < len(exact.steps) < len(cmax.steps)
    assert max(s.running for s in mixed["paged"].steps) > max(s.running for s in exact.steps)


def test_waste_breakdown_is_deterministic_and_matches_the_real_allocators():
    from infer_lab.models import hf_config
    from infer_lab.shape import ModelShape

    shape = ModelShape.from_hf_config(hf_config("mistral-7b"))
    prompts, outputs = mixed_lengths(64, seed=2)
    args = (shape, prompts, outputs, 2048, 2 * 2**30)
    rows = kv_waste_breakdown(*args, max_tokens=512)
    assert rows == kv_waste_breakdown(*args, max_tokens=512)
    per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * 2
    for row in rows:
        fractions = [getattr(row, f"{k}_fraction") for k in ("used", "reserved_future", "internal_frag")]
        assert sum(fractions) + row.external_frag_fraction == pytest.approx(1.0)
        assert (
            row.eol_used_bytes
            == sum(p + o for p, o in zip(prompts, outputs, strict=True)) * per_token
        )
    # end of life, the simulator and the engine's allocators must agree on the waste
    by_layout = {r.layout: r for r in rows}
    old = {r.layout: r for r in kv_memory_waste(shape, prompts, outputs, 2048)}
    for new, before in (("contiguous-max", "contiguous"), ("paged", "paged")):
        assert by_layout[new].eol_reserved_bytes == old[before].reserved_bytes
        assert by_layout[new].eol_wasted_fraction == pytest.approx(old[before].wasted_fraction)


def test_waste_bars_stack_every_class_per_layout():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from infer_lab.models import hf_config
    from infer_lab.shape import ModelShape

    shape = ModelShape.from_hf_config(hf_config("mistral-7b"))
    prompts, outputs = mixed_lengths(32, seed=0)
    rows = kv_waste_breakdown(shape, prompts, outputs, 2048, 2 * 2**30)
    fig = ch08.kv_waste_figure(rows, "test")
    bars = fig.axes[0].patches
    assert len(bars) == 4 * len(rows)  # used, future, internal, external for each layout
    for i, row in enumerate(rows):  # segments of one layout add up to its memory in play (GB)
        in_play = sum(getattr(row, f"{k}_bytes") for k in ("used", "reserved_future", "internal_frag"))
        in_play += row.external_frag_bytes
        assert sum(b.get_width() for b in bars[i :: len(rows)]) == pytest.approx(in_play / 1e9)
    plt.close(fig)
    old = ch08.kv_waste_figure(kv_memory_waste(shape, prompts, outputs, 2048), "test")
    assert len(old.axes[0].patches) == 2 * 2  # end-of-life rows: used + reserved-but-empty
    plt.close(old)
