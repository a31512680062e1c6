"""Chapters 00, 02, 03 and 04: what each computes and shows, beyond the common chapter surface."""

from __future__ import annotations

import pytest

from infer_lab.course import ch00_setup as ch00
from infer_lab.course import ch03_memory_equation as ch03
from infer_lab.course import ch04_prefill_decode_roofline as ch04
from infer_lab.course import ch05_capacity_planner as ch05
from infer_lab.hardware import DeviceInfo, measure_ceilings

CPU = DeviceInfo(kind="cpu", name="Test CPU", memory_total_bytes=8 * 10**9, memory_free_bytes=4 * 10**9, cores=2)


def test_hello_stops_at_the_end_of_sequence_token(embedded):
    hello = ch00.run_hello(embedded, ch00.sizes("cpu", "quick"))
    assert hello.answer == "The capital of France is Paris."
    assert hello.stopped_at_eos and hello.new_tokens < hello.max_new_tokens
    assert "end-of-sequence" in ch00.hello_text(hello)


def test_a_cpu_has_no_datasheet_and_the_table_says_why():
    result = ch00.ceilings_result(measure_ceilings("cpu", quick=True), CPU, "smollm2-135m", 512)
    table = ch00.ceilings_table(result)
    assert list(table["datasheet"]) == ["— (no datasheet for a CPU)"] * 3
    assert not {"None", "nan", "NaN"} & set(table.to_string().split())


def test_decode_intensity_is_computed_from_the_roofline():
    bf16, fp32 = ch00.decode_intensities("smollm2-135m")
    # one multiply-add (2 FLOPs) per weight read once: 2 B in bf16, 4 B in fp32, plus a little KV
    assert bf16.intensity == pytest.approx(1.0, rel=0.15) and fp32.intensity == pytest.approx(0.5, rel=0.15)
    result = ch00.ceilings_result(measure_ceilings("cpu", quick=True), CPU, "smollm2-135m", 512)
    assert f"{bf16.intensity:.2g} FLOP per byte in bf16" in ch00.ceilings_text(result)


def test_saved_h200_ceilings_sit_beside_the_h200_datasheet():
    view = ch00.saved()
    assert view is not None and "H200" in view.title
    table = next(iter(view.tables.values()))
    assert table.iloc[0]["measured"] == "4,246" and table.iloc[0]["datasheet"] == "4,800"  # GB/s


def test_memory_equation_numbers_from_the_configs():
    eq = ch03.equation(ch03.sizes("cpu", "quick"))
    assert eq.report.kv_bytes_per_token == 131_072  # Mistral-7B: 2 x 32 x 8 x 128 x 2 B
    assert eq.report.kv_bytes_total == 80 * 4096 * 131_072
    assert eq.mla.right == 61 * (512 + 64) * 2 and eq.mla.wrong_ratio == pytest.approx(61 * eq.mla.right_ratio)
    assert "131,072 bytes" in ch03.units_example()


def test_memory_check_counts_the_tensors_exactly(embedded):
    check = ch03.run_check(embedded, ch03.sizes("cpu", "quick"))
    assert [r.measured_over_predicted for r in check.rows] == [1.0, 1.0]
    assert check.rows[1].measured == 2 * 30 * 3 * 64 * 4 * check.batch * check.cached_tokens  # SmolLM2, fp32


def test_datasheet_view_is_analytic_and_decode_is_memory_bound():
    view = ch04.datasheet_view("mistral-7b", "H100-SXM", batch=1, context=4096)
    assert view.prediction.decode.bound == "memory" and view.prediction.prefill.bound == "compute"
    assert all(op.bound == "memory" for op in view.decode_ops)
    assert "analytic" in ch04.datasheet_figure(view).axes[0].get_title()


def test_saved_baseline_view_computes_its_ratio():
    view = ch04.saved()
    assert view is not None and view.warning and "ratio" in view.figures
    # a range over the noisy run's batch-1 rows (issue 23, item 9): 35.07 and 95.88 ms / 3.37 ms on that run's roof
    assert any("between **35 and 96 ms** (10–28× the roofline's 3.4 ms)" in note for note in view.notes)


def test_tradeoff_plot_has_no_negative_users_and_nothing_clipped():
    trade = ch05.tradeoff(["mistral-7b", "llama-3-70b"], "H100-SXM")  # 70B does not fit on one H100
    ax = ch05.tradeoff_figure(trade).axes[0]
    low, high = ax.get_ylim()
    assert ax.get_yscale() == "log" and 0 < low < 1
    assert high > max(p.max_users for p in trade.points)
    assert "does not fit" in ch05.tradeoff_text(trade)


def test_presets_name_the_cheapest_plan_and_why():
    presets = ch05.plan_presets("mistral-7b")
    assert [p.preset for p in presets] == ["premium-chat", "async-agents", "batch-summarization"]
    chat = presets[0]
    assert chat.best is not None and chat.best.meets_slo
    assert f"{chat.best.n_gpus}x {chat.best.gpu}" in ch05.preset_line(chat)
