"""Chapter 12 (names start test_ch12_ so `-k ch12` selects them): alpha backed out, predicted vs measured, bench spec, generate --speculative."""

from __future__ import annotations

import json
import random

import pytest

from infer_lab.analysis.speculation import (
    acceptance_by_position,
    accepted_length_pmf,
    alpha_mle,
    cited,
    cited_results,
    draft_mechanisms,
    expected_acceptance_rate,
    fit_verify_cost,
    predicted_speedup_with_verify,
    roofline_verify_ratio,
)
from infer_lab.bench.speculative import RunTotals, load_prompts, parse_proposer, spec_row, sum_runs
from infer_lab.cli import main
from infer_lab.engine.acceptance import alpha_from_tokens_per_pass, expected_tokens_per_pass


def iid_passes(alpha: float, k: int, n: int, seed: int) -> list[tuple[int, int]]:
    """(proposed, accepted) of n passes whose k drafts are each kept with probability alpha."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a = 0
        while a < k and rng.random() < alpha:
            a += 1
        out.append((k, a))
    return out


# ---------------------------------------------------------------------------------------------
# Backing alpha out


def test_ch12_alpha_mle_is_kept_over_tested_drafts():
    # (proposed, accepted): 4 of 4 kept; 1 of 4 (one rejection); no draft; 0 of 2 (one rejection)
    passes = [(4, 4), (4, 1), (0, 0), (2, 0)]
    assert alpha_mle([a for _, a in passes], [m for m, _ in passes]) == pytest.approx(5 / 7)
    assert alpha_mle([0], [0]) is None  # nothing tested, nothing to say
    with pytest.raises(ValueError, match="cannot keep"):
        alpha_mle([3], [2])


@pytest.mark.parametrize(("alpha", "k"), [(0.3, 4), (0.6, 2), (0.8, 8)])
def test_ch12_alpha_is_recovered_from_synthetic_iid_passes(alpha, k):
    passes = iid_passes(alpha, k, 4000, seed=11)
    accepted, proposed = [a for _, a in passes], [m for m, _ in passes]
    assert alpha_mle(accepted, proposed) == pytest.approx(alpha, abs=0.02)
    # the engine's counter is biased low by truncation, exactly as predicted, and the MLE fixes it
    rate = sum(accepted) / sum(proposed)
    assert rate == pytest.approx(expected_acceptance_rate(alpha, k), abs=0.02)
    assert rate < alpha - 0.05
    # inverting E(alpha, k) from the measured tokens per pass gives alpha back too
    tpp = 1 + sum(accepted) / len(passes)
    assert alpha_from_tokens_per_pass(tpp, k) == pytest.approx(alpha, abs=0.03)
    # i.i.d. drafts: the same acceptance at every position, and a truncated geometric histogram
    by_position = acceptance_by_position(accepted, proposed, k)
    assert max(p for p in by_position if p is not None) - min(p for p in by_position if p is not None) < 0.08
    counts = [sum(a == j for a in accepted) / len(passes) for j in range(k + 1)]
    assert counts == pytest.approx(accepted_length_pmf(alpha, k), abs=0.03)


def test_ch12_correlated_copy_spans_show_rising_position_acceptance():
    """All-or-nothing passes (in a copy span or not) are far from geometric: acceptance rises."""
    k = 4
    rng = random.Random(5)
    passes = [(k, k) if rng.random() < 0.5 else (k, rng.choice([0, 0, 0, 1])) for _ in range(2000)]
    by_position = acceptance_by_position([a for _, a in passes], [m for m, _ in passes], k)
    assert by_position[0] < 0.7 and by_position[-1] > 0.95


def test_ch12_pmf_and_acceptance_rate_edge_cases():
    assert accepted_length_pmf(1.0, 3) == [0.0, 0.0, 0.0, 1.0]
    assert sum(accepted_length_pmf(0.37, 5)) == pytest.approx(1.0)
    assert expected_acceptance_rate(0.5, 1) == pytest.approx(0.5)  # k = 1: no truncation bias
    assert expected_acceptance_rate(0.5, 2) == pytest.approx((0.5 + 0.25) / 2)


# ---------------------------------------------------------------------------------------------
# Costs


def test_ch12_verify_cost_fit_recovers_a_line_next_to_the_plain_step():
    # plain steps 0.030 s; verification passes 0.032 + 0.004 q (a jump at q = 2: another attention path)
    samples = [(1, 0.030), (1, 0.030)] + [(q, 0.032 + 0.004 * q) for q in (2, 3, 5, 5, 9)]
    cost = fit_verify_cost(samples)
    assert cost.decode_s == pytest.approx(0.030)
    assert cost.t0_s == pytest.approx(0.032) and cost.t1_s == pytest.approx(0.004)
    assert cost.ratio(1) == 1 and cost.ratio(5) == pytest.approx(0.052 / 0.030)
    assert cost.q_values == (2, 3, 5, 9)
    flat = fit_verify_cost([(1, 0.05), (1, 0.07)])
    assert flat.t1_s == 0 and flat.ratio(9) == pytest.approx(1.0)  # no verification seen: textbook
    with pytest.raises(ValueError):
        fit_verify_cost([])
    with pytest.raises(ValueError, match="plain decode step"):
        fit_verify_cost([(3, 0.05)])
    assert fit_verify_cost([(3, 0.05)], decode_s=0.025).ratio(3) == pytest.approx(2.0)


def test_ch12_roofline_makes_guesses_free_only_while_memory_bound():
    from infer_lab.analysis.roofline import gpu_roof

    roof = gpu_roof("h200")
    small = roofline_verify_ratio("mistral-7b", roof, batch=1, k=4, context=512)
    large = roofline_verify_ratio("mistral-7b", roof, batch=512, k=4, context=512)
    assert 1.0 <= small < 1.1  # 5 tokens read the same weights as 1
    assert large > 3.0  # 2560 tokens per step: compute-bound, guesses cost their FLOPs


# ---------------------------------------------------------------------------------------------
# Predicted vs measured, as the chapter computes it


def totals(proposer, k, **kw) -> RunTotals:
    base = dict(batch=1, requests=2, output_tokens=42, target_passes=42, proposed=0, accepted=0,
                wall_s=4.2, decode_s=4.0, draft_s=0.0, decode_steps=40)
    base.update(kw)
    return RunTotals(proposer, k, **base)


def test_ch12_spec_row_arithmetic_by_hand():
    plain = totals("plain", 0)  # 40 decode steps of 0.1 s; 42 tokens in 4.2 s
    # 2 requests, 42 tokens: 2 from prefill, 40 from 12 verification passes (14 passes in all);
    # 48 guesses proposed, 28 kept; proposer took 0.06 s; decode took 1.8 s; wall 2.1 s
    passes = ((4, 4),) * 6 + ((4, 0),) * 4 + ((4, 2),) * 2
    spec = totals("self:8", 4, target_passes=14, proposed=48, accepted=28, wall_s=2.1, decode_s=1.8,
                  draft_s=0.06, decode_steps=12, passes=passes)
    cost = fit_verify_cost([(1, 0.1), (5, 0.2)])  # one verification sample: v(5) = 0.2 / 0.1 = 2
    row = spec_row(spec, plain, "grounded", cost, identical=True, alpha=0.7, alpha_source="given")
    assert row.tokens_per_pass == pytest.approx(40 / 12)
    assert row.passes_per_token == pytest.approx(14 / 42)
    assert row.acceptance_rate == pytest.approx(28 / 48)
    assert row.accepted_per_pass == pytest.approx(28 / 12)
    assert row.alpha_mle == pytest.approx(28 / (28 + 6))  # 6 passes ended on a rejection
    assert row.alpha_tpp == pytest.approx(alpha_from_tokens_per_pass(40 / 12, 4))
    assert row.speedup == pytest.approx(4.2 / 2.1)
    assert row.decode_speedup == pytest.approx((40 / 1.8) / (40 / 4.0))
    assert row.cost_ratio == pytest.approx(0.06 / 12 / (4 * 0.1))  # draft s per pass / (k x plain step)
    assert row.verify_ratio == pytest.approx(2.0)
    e = expected_tokens_per_pass(0.7, 4)
    assert row.predicted_tokens_per_pass == pytest.approx(e)
    assert row.predicted_speedup == pytest.approx(e / (4 * row.cost_ratio + 1))
    assert row.predicted_speedup_verify == pytest.approx(e / (4 * row.cost_ratio + 2.0))
    assert row.measured_over_predicted == pytest.approx(row.decode_speedup / row.predicted_speedup)
    assert predicted_speedup_with_verify(0.7, 4, row.cost_ratio, 2.0) == row.predicted_speedup_verify
    # without a given alpha, the row predicts from its own backed-out alpha
    own = spec_row(spec, plain, "grounded", cost, identical=True)
    assert own.alpha == own.alpha_mle and own.alpha_source == "this run (MLE)"


def test_ch12_run_totals_add_up():
    a, b = totals("ngram", 2, passes=((2, 1),)), totals("ngram", 2, passes=((2, 2),))
    s = sum_runs([a, b])
    assert s.output_tokens == 84 and s.passes == ((2, 1), (2, 2)) and s.wall_s == pytest.approx(8.4)
    assert totals("plain", 0).tokens_per_pass == 1.0


def test_ch12_chapter_best_k_and_formula_text_agree():
    from infer_lab.course import ch12_speculative_decoding as ch12

    text = ch12.formula_text(0.8, 4, 0.05, 1.0)
    best = max(range(1, 9), key=lambda k: predicted_speedup_with_verify(0.8, k, 0.05, 1.0))
    assert f"best k here is {best}" in text
    assert f"{expected_tokens_per_pass(0.8, 4):.2f} tokens" in text


def test_ch12_proposer_names_and_prompts():
    assert parse_proposer("ngram") == "ngram" and parse_proposer("self:12") == "self:12"
    for bad in ("eagle", "self:", "ngram:x", "self:0"):
        with pytest.raises(ValueError, match="proposer must be"):
            parse_proposer(bad)
    grounded, chat = load_prompts("grounded"), load_prompts("chat")
    assert len(grounded) >= 6 and len(chat) >= 6 and len(load_prompts("chat", 2)) == 2
    with pytest.raises(ValueError, match="workload"):
        load_prompts("poetry")


# ---------------------------------------------------------------------------------------------
# EAGLE, Medusa, MTP from configs, and the cited figures


def test_ch12_mechanism_sizes_from_configs():
    by = {m.method.split(" (")[0]: m for m in draft_mechanisms("mistral-7b")}
    h, vocab = 4096, 32768  # mistral-7b v0.3
    assert by["n-gram"].extra_params == 0 and by["n-gram"].cost_ratio == 0
    assert by["self-speculative"].extra_params == 0 and by["self-speculative"].extra_kv_bytes_per_token > 0
    assert by["Medusa-1"].extra_params == 3 * (h * h + h + h * vocab)
    layer = (h * h + 2 * h * 1024 + h * h) + 3 * h * 14336 + 2 * h  # q, k, v (8 KV heads), o; MLP; 2 norms
    assert by["EAGLE"].extra_params == 2 * h * h + h + layer
    assert by["EAGLE"].extra_kv_bytes_per_token == 2 * 8 * 128 * 2  # one layer's K and V, bf16
    mtp = next(m for m in draft_mechanisms("deepseek-v3") if m.method.startswith("MTP"))
    assert mtp.method == "MTP (1 module)"  # num_nextn_predict_layers of the released config
    assert mtp.extra_params == pytest.approx(cited("deepseek_v3_mtp_params").low, rel=0.02)


def test_ch12_cited_results_carry_their_source():
    results = cited_results()
    assert {r.method for r in results} >= {"Medusa", "EAGLE", "MTP", "draft model"}
    for r in results:
        assert r.url.startswith("https://") and r.where and r.paper and 2022 <= r.year <= 2026
        assert r.low <= r.high
    with pytest.raises(KeyError, match="known"):
        cited("no-such-paper")


# ---------------------------------------------------------------------------------------------
# The CLI


def test_ch12_bench_spec_json_has_every_row_field(capsys):
    code = main(["bench", "spec", "--proposer", "ngram", "--k", "1,3", "--workload", "grounded",
                 "--prompts", "1", "--max-new-tokens", "12", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["proposer"] == "ngram" and data["ks"] == [1, 3] and data["batch"] == 1
    assert data["environment"]["torch_threads"] >= 1 and data["environment"]["hardware"]
    assert [r["k"] for r in data["rows"]] == [1, 3]
    for row in data["rows"]:
        for key in ("acceptance_rate", "alpha_mle", "tokens_per_pass", "passes_per_token", "tokens_per_s",
                    "speedup", "predicted_speedup", "predicted_speedup_verify", "measured_over_predicted",
                    "cost_ratio", "verify_ratio", "identical"):
            assert key in row, key
        assert row["identical"] is True  # greedy speculation reproduces plain decoding
        assert row["passes_per_token"] < 1  # copying text: fewer target passes than tokens
        assert row["alpha_source"] == "measured at k = 1"


def test_ch12_bench_spec_rejects_bad_input(capsys):
    assert main(["bench", "spec", "--k", "0", "--json"]) == 2
    assert main(["bench", "spec", "--k", "two", "--json"]) == 2
    assert main(["bench", "spec", "--proposer", "eagle", "--json"]) == 2
    err = capsys.readouterr().err
    assert "--k" in err and "proposer must be" in err and "Traceback" not in err


def test_ch12_generate_speculative_json_adds_the_counters_and_keeps_the_tokens(capsys):
    prompt = "Repeat exactly: the red fox ran past the old mill and the red fox ran home."
    base = ["generate", "--json", "--engine", "paged", "--max-new-tokens", "16", prompt]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(base[:1] + ["--speculative", "ngram", "--num-speculative-tokens", "4"] + base[1:]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["token_ids"] == plain["token_ids"]
    assert spec["speculative"] == "ngram" and spec["num_speculative_tokens"] == 4
    assert 0 < spec["accepted_tokens"] <= spec["proposed_tokens"]
    assert spec["target_passes"] < len(spec["token_ids"])
    assert "proposed_tokens" not in plain


def test_ch12_generate_speculative_needs_our_engine(capsys):
    assert main(["generate", "--engine", "hf", "--speculative", "ngram", "x"]) == 2
    assert main(["generate", "--engine", "paged", "--speculative", "medusa", "x"]) == 2
    assert main(["generate", "--engine", "paged", "--speculative", "ngram", "--num-speculative-tokens", "0",
                 "x"]) == 2
    err = capsys.readouterr().err
    assert "--engine paged" in err and "ngram, ngram:N or self:L" in err and "Traceback" not in err
