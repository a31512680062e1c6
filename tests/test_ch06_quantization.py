"""Chapter 06's own numbers: the saved bitsandbytes run, the analytic fit table, the baseline caveat."""

from __future__ import annotations

import pytest

from infer_lab.course import ch06_quantization as ch06


def test_bitsandbytes_bandwidth_fraction_is_computed_from_the_saved_run():
    view = ch06.saved()
    assert view is not None and "H200" in view.title
    reads = ch06.weight_reads(view.source.data["bnb_linear"], *ch06.BNB_SHAPE, 4.8e12)
    int8 = next(r for r in reads if r.format == "int8" and r.batch == 1)
    # 4096 x 14336 int8 codes = 58.7 MB read in 250 us: 235 GB/s, 4.9% of 4.8 TB/s, about a twentieth
    assert int8.weight_bytes == 4096 * 14336
    assert int8.achieved_Bps == pytest.approx(235e9, rel=0.01)
    assert int8.achieved_Bps / 4.8e12 == pytest.approx(1 / 20, rel=0.03)
    note = view.notes[0]
    assert "4.9% of the 4.8 TB/s" in note and "about 1/20" in note and "8.0× longer" in note
    assert "tenth" not in note


def test_fit_table_and_gpt_oss_text_come_from_the_memory_model():
    rows = {(r.model, r.weight_dtype): r for r in ch06.fit_rows(gpus=("H100-SXM",))}
    assert rows[("gpt-oss-120b", "bf16")].max_users["H100-SXM"] == 0
    assert rows[("gpt-oss-120b", "mxfp4")].max_users["H100-SXM"] > 0
    assert rows[("mistral-7b", "int4")].weight_bytes < rows[("mistral-7b", "bf16")].weight_bytes
    text = ch06.gpt_oss_text()  # the same formats the table shows with users (issue 23, item 16)
    assert "only the 4-bit formats leave room" in text and "mxfp4 (" in text and "int4 (" in text
    frame = ch06.fit_table(context=8192)
    assert "users of 8,192 tokens on one H200" in frame.columns


def test_quick_sizes_are_small_and_full_sizes_bigger():
    quick, full = ch06.sizes("cpu", "quick"), ch06.sizes("cpu", "full")
    assert quick.eval_tokens <= 128 and len(quick.methods) <= 3 and quick.format_block_stride > 1
    assert full.eval_tokens > quick.eval_tokens and set(quick.methods) <= set(full.methods)


def _formats(q41_error: float) -> ch06.FormatsResult:
    rows = [ch06.LayerError("q4_1-g32", f"layers.0.l{i}", 64, 40, q41_error, q41_error) for i in range(2)]
    rows += [ch06.LayerError("int4-g64", f"layers.0.l{i}", 64, 35, 0.09, 0.01) for i in range(2)]
    return ch06.FormatsResult(rows, [0], 30, embedded=True)


def test_the_baseline_caveat_is_stated_and_measured():
    assert ch06.baseline_note(False) == ""
    assert "Q4_1" in ch06.baseline_note(True) and "already 4-bit" in ch06.baseline_note(True)
    exact = ch06.baseline_note(True, _formats(0.0))
    assert "2 of 2 checked layers come back bit for bit" in exact and "int4-g64 9.0%" in exact
    summary = {s.method: s for s in _formats(0.0).summary()}
    assert summary["q4_1-g32"].bits_per_weight == 5.0 and summary["q4_1-g32"].exact_layers == 2
    assert "0 of 2" in ch06.baseline_note(True, _formats(0.01))


def test_compare_text_says_quality_is_against_the_4_bit_baseline():
    base = ch06.MethodRow("float32", 1000, 1.0, 1.0, 10.0, 20.0, None, None)
    int4 = ch06.MethodRow("int4-g64", 300, 3.33, 0.6, 5.0, 30.0, 0.5, 0.09)
    comparison = ch06.Comparison(base, [int4], 127, 16, 2, 1, 1, "cpu")
    text = ch06.compare_text(comparison, embedded=True)
    assert "perplexity +50.0%" in text and "60% of next tokens unchanged" in text and "0.50×" in text
    assert "Q4_1-derived baseline" in text
    assert "Q4_1" not in ch06.compare_text(comparison, embedded=False)
