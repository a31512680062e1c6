"""Speculative decoding: exact under greedy, exact in distribution under sampling, and no leaked KV."""

from __future__ import annotations

import pytest
import torch

from infer_lab.engine import Engine, EngineConfig, SamplingParams
from infer_lab.engine.acceptance import (
    alpha_from_tokens_per_pass,
    expected_tokens_per_pass,
    predicted_speedup,
    verify_greedy,
    verify_sampling,
)
from infer_lab.engine.proposers import NgramProposer, ProposerError, check_same_tokenizer

from engine_helpers import NEW_TOKENS, assert_pool_clean


def run(embedded, prompts, **config):
    engine = Engine.from_loaded(embedded, EngineConfig(**config))
    outs = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS))
    return engine, outs


def assert_all_blocks_back(engine):
    assert_pool_clean(engine)
    draft_kv = getattr(engine.proposer, "kv", None)
    if draft_kv is not None:
        assert draft_kv.pool.all_free() and not engine.proposer.shadows


@pytest.mark.parametrize(("proposer", "k"), [("ngram", 4), ("ngram:2", 1), ("self:10", 4), ("self:24", 2)])
def test_greedy_speculation_is_token_identical_to_transformers(embedded, prompts, reference, proposer, k):
    engine, outs = run(embedded, prompts, speculative=proposer, num_speculative_tokens=k, max_num_seqs=20)
    assert [o.token_ids for o in outs] == reference
    assert sum(o.proposed_tokens for o in outs) > 0
    assert_all_blocks_back(engine)


@pytest.mark.parametrize(
    "config",
    [
        dict(kv_mode="contiguous", max_model_len=256),
        dict(prefix_cache="radix", block_size=4),
        dict(prefix_cache="hash", block_size=16),
        dict(chunked_prefill=True, max_num_batched_tokens=32, block_size=4),
        dict(block_size=16, num_blocks=14, max_model_len=224, chunked_prefill=True, max_num_batched_tokens=48),
    ],
    ids=["contiguous", "radix", "hash", "chunked", "preemption"],
)
def test_speculation_in_every_kv_mode_matches_and_frees_everything(embedded, prompts, reference, config):
    arrivals = list(range(len(prompts)))  # staggered: continuous batching with mixed steps
    proposer = "self:12" if "num_blocks" in config else "ngram"
    engine = Engine.from_loaded(embedded, EngineConfig(speculative=proposer, num_speculative_tokens=3,
                                                       max_num_seqs=20, **config))
    outs = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS), arrival_steps=arrivals)
    assert [o.token_ids for o in outs] == reference
    if "num_blocks" in config:
        assert engine.scheduler.num_preemptions > 0
    assert_all_blocks_back(engine)


def test_rejected_guesses_give_their_blocks_back_across_block_boundaries(embedded):
    """Block size 1: every rejected guess held a block of its own, and it must come back."""
    prompt = embedded.random_ids(1, 9, seed=3)[0].tolist()
    engine = Engine.from_loaded(embedded, EngineConfig(speculative="self:2", num_speculative_tokens=6,
                                                       block_size=1, max_num_seqs=1))
    engine.add_request(prompt, SamplingParams(max_tokens=12, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
        for seq in engine.scheduler.running:  # between steps, blocks hold exactly the computed tokens
            assert len(seq.block_table) == seq.num_computed
    rejected = sum(r.proposed - r.accepted for r in engine.step_log)
    assert rejected > 0  # a 2-layer draft guesses wrong often: the rollback was exercised
    assert_all_blocks_back(engine)


def test_ngram_needs_clearly_fewer_target_passes_on_copy_heavy_text(embedded):
    code = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
    ids = embedded.chat_ids(f"{code}\nWrite the same two functions again.")[0].tolist()
    params = SamplingParams(max_tokens=40)
    engine = Engine.from_loaded(embedded, EngineConfig(speculative="ngram", num_speculative_tokens=4))
    out = engine.generate([ids], params)[0]
    plain = Engine.from_loaded(embedded, EngineConfig()).generate([ids], params)[0]
    assert out.token_ids == plain.token_ids and len(out.token_ids) >= 20
    assert plain.target_passes == len(plain.token_ids)  # plain decoding: one pass per token
    assert out.target_passes <= 0.5 * len(out.token_ids)
    assert_all_blocks_back(engine)


def test_a_draft_model_with_the_same_tokenizer_keeps_greedy_exact(embedded, prompts, reference):
    """A random-weight SmolLM2-shape draft: it guesses badly, so nearly every guess is rolled back."""
    from infer_lab.models import load_model

    draft = load_model("smollm2-135m", weights="random", device="cpu")
    config = EngineConfig(speculative="draft", num_speculative_tokens=3, max_num_seqs=20)
    engine = Engine.from_loaded(embedded, config, draft=draft)
    outs = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS))
    assert [o.token_ids for o in outs] == reference
    proposed = sum(o.proposed_tokens for o in outs)
    assert proposed > 0 and sum(o.accepted_tokens for o in outs) < proposed
    assert_all_blocks_back(engine)


def test_ngram_lookup_takes_the_most_recent_longest_match():
    p = NgramProposer(max_n=3)
    assert p.lookup([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 3) == [7, 8, 1]
    assert p.lookup([5, 6, 7], 2) == []
    assert p.lookup([4, 4, 4, 4], 2) == [4]  # the match may run into the suffix itself


def test_greedy_verification_keeps_the_agreeing_prefix_and_adds_the_targets_token():
    assert verify_greedy([5, 6, 7], [5, 6, 9, 1]).tokens == [5, 6, 9]
    assert verify_greedy([5, 6, 7], [5, 6, 7, 1]).tokens == [5, 6, 7, 1]
    v = verify_greedy([5, 6, 7], [4, 6, 7, 1])
    assert v.tokens == [4] and v.accepted == 0 and v.proposed == 3


@pytest.mark.parametrize("deterministic_draft", [True, False], ids=["ngram-like", "sampled-draft"])
def test_rejection_sampling_reproduces_the_target_distribution(deterministic_draft):
    """Over 20,000 seeded trials, the first emitted token follows the target's p, whatever q was."""
    gen = torch.Generator().manual_seed(1234)
    vocab = 6
    p = torch.tensor([0.05, 0.30, 0.10, 0.25, 0.20, 0.10])
    q = torch.tensor([0.40, 0.05, 0.25, 0.05, 0.05, 0.20])  # a poor draft on purpose
    target = torch.stack([p, torch.full((vocab,), 1 / vocab)])
    counts = torch.zeros(vocab)
    trials = 20_000
    for _ in range(trials):
        if deterministic_draft:
            draft, probs = 2, None  # always guesses token 2: q is a point mass
        else:
            draft, probs = int(torch.multinomial(q, 1, generator=gen)), q[None]
        verdict = verify_sampling([draft], probs, target, gen)
        counts[verdict.tokens[0]] += 1
    empirical = counts / trials
    total_variation = 0.5 * (empirical - p).abs().sum().item()
    assert total_variation < 0.02  # the sampling error at 20k trials is about 0.005
    expected = p * trials
    chi2 = (((counts - expected) ** 2) / expected).sum().item()
    assert chi2 < 20.5  # 99.9th percentile of chi-square with 5 degrees of freedom


def test_acceptance_arithmetic():
    assert expected_tokens_per_pass(0.0, 4) == 1
    assert expected_tokens_per_pass(1.0, 4) == 5
    assert expected_tokens_per_pass(0.5, 2) == pytest.approx(1.75)
    assert predicted_speedup(0.5, 2, cost_ratio=0.0) == pytest.approx(1.75)
    assert predicted_speedup(0.5, 2, cost_ratio=0.5) == pytest.approx(1.75 / 2)
    assert alpha_from_tokens_per_pass(1.75, 2) == pytest.approx(0.5, abs=1e-6)


def test_a_draft_with_another_tokenizer_is_refused(embedded):
    class Other:
        bos_token_id, eos_token_id, pad_token_id = 1, 2, None

        def get_vocab(self):
            return {"a": 0, "b": 1}

    with pytest.raises(ProposerError, match="tokenizer is not the target's"):
        check_same_tokenizer(embedded.tokenizer, Other())
    check_same_tokenizer(embedded.tokenizer, embedded.tokenizer)  # the same one passes


def test_bad_speculative_settings_are_clear_errors(embedded):
    with pytest.raises(ProposerError, match="self:L"):
        Engine.from_loaded(embedded, EngineConfig(speculative="self:99"))
    with pytest.raises(ProposerError, match="needs a draft model"):
        Engine.from_loaded(embedded, EngineConfig(speculative="draft"))
    with pytest.raises(ValueError, match="needs a KV cache"):
        Engine.from_loaded(embedded, EngineConfig(speculative="ngram", kv_mode="nocache"))
