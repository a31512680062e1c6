"""Quantization: round-trip error bounds, exact packed bytes, and quality on the real embedded model."""

from __future__ import annotations

import json
import math

import pytest
import torch

from infer_lab.quant import (
    DequantLinear,
    QuantBackendUnavailable,
    attention_output_error,
    dequantize_fp8,
    dequantize_int4,
    dequantize_int8,
    dequantize_kv,
    dequantize_nf4,
    error_stats,
    model_weight_bytes,
    nf4_levels,
    pack_int4,
    parse_method,
    quantize,
    quantize_fp8,
    quantize_int4,
    quantize_int8_absmax,
    quantize_kv,
    quantize_lm,
    quantize_nf4,
    quantize_q4_1,
    unpack_int4,
)

EVAL_TOKENS = 256  # one window: a few seconds per model on 2 CPU cores


@pytest.fixture(scope="module")
def weight():
    torch.manual_seed(0)
    return torch.randn(64, 256) * 0.02


def test_int8_round_trip_error_is_at_most_half_a_step(weight):
    q, scale = quantize_int8_absmax(weight)
    assert q.dtype == torch.int8 and scale.shape == (64, 1)
    err = (weight - dequantize_int8(q, scale)).abs()
    assert bool((err <= scale / 2 + 1e-7).all())
    assert error_stats(weight, dequantize_int8(q, scale))["rel_fro"] < 0.01


def test_int4_round_trip_bounds_both_scalings(weight):
    # symmetric: half a step; zero-point: the rounded zero point can shift the grid by another half step
    for symmetric, steps, bound in ((False, 1.0, 0.12), (True, 0.5, 0.15)):
        packed = quantize_int4(weight, group_size=64, symmetric=symmetric)
        recon = dequantize_int4(packed)
        step = packed.scale.float().repeat_interleave(64, dim=1)
        assert bool(((weight - recon).abs() <= steps * step + 1e-6).all()), symmetric
        assert error_stats(weight, recon)["rel_fro"] < bound


def test_smaller_groups_give_smaller_error(weight):
    errors = [
        error_stats(weight, dequantize_int4(quantize_int4(weight, g)))["rel_fro"]
        for g in (256, 64, 16)
    ]
    assert errors[0] > errors[1] > errors[2]


def test_nf4_levels_and_round_trip(weight):
    levels = nf4_levels()
    assert levels.numel() == 16 and levels[0] == -1 and levels[-1] == 1 and (levels == 0).sum() == 1
    assert error_stats(weight, dequantize_nf4(quantize_nf4(weight, 64)))["rel_fro"] < 0.12


def test_q4_1_round_trip_bytes_and_idempotence(weight):
    packed = quantize_q4_1(weight, 32)
    assert packed.zero is None and packed.minimum.dtype == torch.float16
    # codes (half a byte each) + one fp16 scale and one fp16 minimum per group of 32
    assert packed.nbytes == 64 * 256 // 2 + 64 * (256 // 32) * 2 * 2
    recon = dequantize_int4(packed)
    step = packed.scale.float().repeat_interleave(32, dim=1)
    low = packed.minimum.float().repeat_interleave(32, dim=1)
    assert bool(((weight - recon).abs() <= 0.5 * step + (weight.abs().amax() * 2**-11)).all())
    assert bool((recon >= low - 1e-6).all())  # the group minimum is a level, nothing below it
    assert error_stats(weight, recon)["rel_fro"] < 0.1
    # a Q4_1 weight re-quantized to Q4_1 with the same groups comes back bit for bit
    assert torch.equal(dequantize_int4(quantize_q4_1(recon, 32)), recon)
    layer = DequantLinear.from_linear(torch.nn.Linear(256, 64, bias=False), "q4_1", 32)
    assert layer.weight_bytes() == packed.nbytes


def test_fp8_round_trip(weight):
    codes, scale = quantize_fp8(weight)
    assert codes.dtype == torch.float8_e4m3fn
    assert error_stats(weight, dequantize_fp8(codes, scale))["rel_fro"] < 0.05


def test_pack_unpack_int4_is_exact_and_two_per_byte():
    codes = torch.randint(0, 16, (3, 10), dtype=torch.uint8)
    packed = pack_int4(codes)
    assert packed.shape == (3, 5) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), codes)
    with pytest.raises(ValueError, match="0..15"):
        pack_int4(torch.full((2, 2), 16, dtype=torch.uint8))


@pytest.mark.parametrize(
    "out_f,in_f,group,symmetric", [(64, 256, 64, True), (48, 576, 128, False), (8, 576, 64, False)]
)
def test_packed_int4_bytes_are_exact(out_f, in_f, group, symmetric):
    w = torch.randn(out_f, in_f)
    layer = DequantLinear.from_linear(
        torch.nn.Linear(in_f, out_f, bias=False), "int4", group, symmetric
    )
    groups = math.ceil(in_f / group)
    expected = out_f * in_f // 2 + out_f * groups * 2 + (0 if symmetric else out_f * groups)
    assert layer.weight_bytes() == expected
    assert quantize_int4(w, group, symmetric).nbytes == expected


def test_dequant_linear_matches_float_layer():
    torch.manual_seed(1)
    lin = torch.nn.Linear(128, 32)
    x = torch.randn(4, 128)
    for scheme, tol in (("int8", 0.01), ("int4", 0.15), ("nf4", 0.15), ("fp8", 0.06)):
        q = DequantLinear.from_linear(lin, scheme, group_size=64)
        ref = lin(x)
        with torch.no_grad():
            assert float((q(x) - ref).norm() / ref.norm()) < tol, scheme


def test_parse_method_and_bad_input():
    assert parse_method("int4").label == "int4-g128"
    assert parse_method("int4-g64-sym").symmetric
    assert parse_method("nf4").group_size == 64
    assert parse_method("q4_1").label == "q4_1-g32" and parse_method("q4_1-g64").group_size == 64
    for bad in ("int3", "int8-g64", "nf4-sym", "q4_1-sym", ""):
        with pytest.raises(ValueError, match="unknown quantization method"):
            parse_method(bad)


def test_bitsandbytes_without_gpu_names_what_it_needs(embedded):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(QuantBackendUnavailable, match="CUDA"):
        quantize_lm(embedded, "bnb-int8")
    with pytest.raises(ValueError, match="bitsandbytes"):
        quantize(embedded.model, "bnb-nf4")


def test_kv_quantization_per_token_per_head():
    torch.manual_seed(2)
    k = torch.randn(2, 3, 10, 64)
    k[:, :, 4] *= 50  # one loud token must not coarsen the others
    for kv_dtype, bound in (("int8", 0.01), ("fp8", 0.05)):
        q = quantize_kv(k, kv_dtype)
        assert q.scale.shape == (2, 3, 10, 1)
        recon = dequantize_kv(q)
        quiet = torch.cat([k[:, :, :4], k[:, :, 5:]], dim=2)
        quiet_recon = torch.cat([recon[:, :, :4], recon[:, :, 5:]], dim=2)
        assert error_stats(quiet, quiet_recon)["rel_fro"] < bound
        assert q.nbytes == k.numel() * 1 + 2 * 3 * 10 * 4
    qry = torch.randn(2, 6, 1, 64)
    err = attention_output_error(qry, k, torch.randn(2, 3, 10, 64), "int8")
    assert 0 < err["rel_fro"] < 0.02


# ---------------------------------------------------------------------------------------------
# The real model


@pytest.fixture(scope="module")
def eval_ids(embedded):
    from infer_lab.evaluation import eval_token_ids

    return eval_token_ids(embedded.tokenizer, EVAL_TOKENS)


@pytest.fixture(scope="module")
def fp32_ppl(embedded, eval_ids):
    from infer_lab.evaluation import perplexity

    return perplexity(embedded.model, eval_ids, window=EVAL_TOKENS)


def test_perplexity_is_deterministic_and_sane(embedded, eval_ids, fp32_ppl):
    from infer_lab.evaluation import perplexity

    again = perplexity(embedded.model, eval_ids[:128], window=64)
    assert again == perplexity(embedded.model, eval_ids[:128], window=64)
    assert 1.5 < fp32_ppl.perplexity < 60, fp32_ppl
    assert fp32_ppl.scored_tokens == EVAL_TOKENS - 1


def test_the_embedded_model_is_already_q4_1(embedded):
    """Its fp32 weights were dequantized from a Q4_1 GGUF: Q4_1 at groups of 32 gives them back exactly."""
    from infer_lab.quant import layer_error_stats

    first_block = embedded.model.model.layers[0]
    exact = layer_error_stats(first_block, "q4_1-g32")
    assert len(exact) == 7 and all(r["max_abs"] == 0 for r in exact)
    assert all(r["rel_fro"] > 0.05 for r in layer_error_stats(first_block, "int4-g32"))


@pytest.fixture(scope="module")
def int8_report(embedded):
    return quantize(embedded.model, "int8")


def test_int8_perplexity_within_a_few_percent_and_exact_bytes(
    embedded, eval_ids, fp32_ppl, int8_report
):
    from infer_lab.evaluation import perplexity

    report = int8_report
    assert report.weight_bytes_unquantized == embedded.weight_bytes
    linear_params = sum(r["out_features"] * r["in_features"] for r in report.layers)
    rows = sum(r["out_features"] for r in report.layers)
    # int8 codes (1 B/weight) + one fp32 scale per row replace 4 B/weight; the rest is unchanged
    assert report.weight_bytes == embedded.weight_bytes - 3 * linear_params + 4 * rows
    ppl = perplexity(report.model, eval_ids, window=EVAL_TOKENS)
    assert abs(ppl.perplexity / fp32_ppl.perplexity - 1) < 0.03, (ppl, fp32_ppl)
    assert report.layer_frame()["rel_fro"].max() < 0.05


def test_int4_model_is_smaller_than_int8_and_still_generates(embedded, int8_report):
    from infer_lab.harness import timed_generate

    q4, r4 = quantize_lm(embedded, "int4-g64", error_stats_per_layer=False)
    assert r4.weight_bytes < int8_report.weight_bytes < embedded.weight_bytes
    assert q4.weight_bytes == r4.weight_bytes == model_weight_bytes(q4.model)
    record = timed_generate(q4, embedded.chat_ids("What is the capital of France?"), 3)
    assert record.weight_bytes == r4.weight_bytes
    text = embedded.tokenizer.decode(record.token_ids[0])
    assert len(record.token_ids[0]) == 3 and text.strip(), text


def test_cli_quantize_json(capsys):
    from infer_lab.cli import main

    rc = main(
        [
            "quantize",
            "--method",
            "int8",
            "--json",
            "--new-tokens",
            "2",
            "--repeats",
            "1",
            "--prompt-tokens",
            "16",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["weight_bytes"] < out["weight_bytes_unquantized"]
    assert 0.5 < out["top1_agreement"] <= 1.0 and out["decode_tokens_per_s"] > 0


def test_cli_rejects_unknown_method_and_missing_gpu(capsys):
    from infer_lab.cli import main

    assert main(["quantize", "--method", "int3"]) == 2
    assert "unknown quantization method" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["quantize", "--method", "bnb-nf4"]) == 2
        assert "CUDA" in capsys.readouterr().err


def test_evaluation_text_is_shipped_documented_and_user_files_work(tmp_path):
    import platform

    from infer_lab.evaluation import (
        EVAL_SOURCES,
        HELDOUT_SOURCES,
        build_eval_text,
        eval_sections,
        eval_text,
        perplexity,
    )

    sections = eval_sections()
    assert list(sections) == list(EVAL_SOURCES + HELDOUT_SOURCES)
    assert "JSON" in eval_text() and "copytree" not in eval_text()  # held-out text stays out
    if platform.python_version() == "3.11.7":  # the Python the shipped file was built with
        assert eval_sections() == eval_sections_from_text(build_eval_text(), tmp_path)
    own = tmp_path / "mine.txt"
    own.write_text("Plain text without headers.\nSecond line.\n")
    assert eval_text(own) == "Plain text without headers.\nSecond line.\n"
    with pytest.raises(FileNotFoundError):
        eval_text(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="1-D"):
        perplexity(None, torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="window"):
        perplexity(None, torch.zeros(8, dtype=torch.long), window=1)


def eval_sections_from_text(text: str, folder):
    from infer_lab.evaluation import eval_sections

    path = folder / "rebuilt.txt"
    path.write_text(text)
    return eval_sections(path)
