"""Chapter 13's cited and analytic claims: the workshop's whole vLLM ladder, today's vLLM defaults, the
decision chart's reasons and evidence, the scale-out layouts and the GPU commands (audit findings F13.1-F13.8)."""

from __future__ import annotations

import dataclasses

import pytest

from infer_lab import launchers
from infer_lab.course import ch13_engines as ch13
from infer_lab.course.ch10_prefix_caching import SGLANG_AGENTIC_CLAIM


def _chart_row(engine: str) -> ch13.EngineChoice:
    return next(c for c in ch13.DECISION_CHART if c.engine == engine)


# --- F13.3: every row of the workshop's table, with its baseline -------------------------------------


def test_the_workshop_table_has_every_row_the_speaker_gave():
    table = ch13.workshop_table()
    assert len(table) == len(ch13.WORKSHOP_RUNS)
    configs = " | ".join(r.config for r in ch13.WORKSHOP_RUNS).lower()
    for rung in ("prefix caching", "kv-cache quantization", "speculative"):
        assert rung in configs, rung
    worded = [r for r in ch13.WORKSHOP_RUNS if r.output_tokens_per_s is None]
    assert worded and all(r.said for r in worded)  # rows given in words keep the words, not an invented number
    column = table["output tokens/s"].tolist()
    assert column.count("— (said in words only)") == len(worded)
    hf = ch13.WORKSHOP_RUNS[0]
    assert table["TTFT (ms)"][0] != "— (not given)" and hf.ttft_ms and hf.itl_ms  # the baseline's latencies


def test_the_workshop_table_ratios_come_from_the_numbers():
    base, default = ch13.WORKSHOP_RUNS[0], ch13.WORKSHOP_RUNS[1]
    table = ch13.workshop_table()
    ratio = default.output_tokens_per_s / base.output_tokens_per_s
    assert table["× the HF baseline"][1] == ch13.WORKSHOP_COLUMNS[2].show(ratio)
    doubled = (base, dataclasses.replace(default, output_tokens_per_s=2 * base.output_tokens_per_s))
    assert ch13.workshop_table(doubled)["× the HF baseline"][1] == "2×"


def _ladder(prefix_tok_s: float) -> tuple[ch13.ReportedRun, ...]:
    hf, default, prefix, *rest = ch13.WORKSHOP_RUNS
    return (hf, default, dataclasses.replace(prefix, output_tokens_per_s=prefix_tok_s), *rest)


def test_the_workshop_text_says_which_way_each_numbered_row_moved():
    default = ch13.WORKSHOP_RUNS[1].output_tokens_per_s
    up, down = ch13.workshop_text(_ladder(1.5 * default)), ch13.workshop_text(_ladder(0.5 * default))
    assert "raised it to" in up and "lowered it to" not in up and "1.50×" in up
    assert "lowered it to" in down and "raised it to" not in down and "0.50×" in down
    shown = ch13.workshop_text()
    prefix = ch13.WORKSHOP_RUNS[2]
    assert f"{prefix.output_tokens_per_s:,.0f}" in shown
    for run in ch13.WORKSHOP_RUNS[3:]:  # no number: the text says so and gives the words
        assert f"**{run.config}**: no number was given" in shown and run.said in shown


# --- F13.2: today's vLLM defaults, with the version ---------------------------------------------------


def test_the_page_says_vllm_v1_turns_prefix_caching_and_chunked_prefill_on():
    text = ch13.workshop_text()
    v1 = text[text.index("That ladder"):]
    assert f"vLLM {ch13.VLLM_V1_DEFAULT_SINCE}" in v1
    assert "prefix caching and chunked prefill on by default" in v1 and "--no-enable-prefix-caching" in v1
    assert ch13.VLLM_V1_DEFAULT_SINCE in _chart_row("vLLM").reason


# --- F13.1, F13.4, F13.5, F13.6: the decision chart ---------------------------------------------------


def test_sglangs_row_gives_shared_histories_and_scheduling_not_granularity():
    row = _chart_row("SGLang")
    assert "token granularity" not in row.reason
    assert "radix" in row.reason.lower() and "scheduling" in row.reason and "chapter 10" in row.reason
    lo, hi = SGLANG_AGENTIC_CLAIM
    assert row.evidence.startswith("cited") and f"{lo:.0f}–{hi:.0f}×" in row.evidence
    assert "not SGLang" in row.evidence  # what this course measures is its own engine's caches


def test_hugging_face_serving_is_not_said_to_be_one_request_at_a_time():
    hf = _chart_row("HF transformers")
    assert "generate_batch" in hf.reason and "continuous" in hf.reason
    engines = " ".join(c.engine for c in ch13.DECISION_CHART)
    assert "TGI" in engines and "vLLM-Omni" in engines
    tgi = next(c for c in ch13.DECISION_CHART if "TGI" in c.engine)
    assert "continuous batching" in tgi.reason and "maintenance" in tgi.reason
    assert any("multimodal" in c.need for c in ch13.DECISION_CHART)


def test_tensorrt_llm_is_described_with_its_current_default_backend():
    row = _chart_row("TensorRT-LLM")
    assert "per model/shape" not in row.reason
    assert "PyTorch backend" in row.reason and "1.0" in row.reason and "no build step" in row.reason


def test_every_evidence_cell_says_what_kind_of_support_it_is():
    kinds = ("cited", "measured here", "analytic", "not measured here")
    for choice in ch13.DECISION_CHART:
        assert choice.evidence.startswith(kinds), choice.engine


def _measured(hit_rate: float | None) -> list[dict]:
    return [{"variant": ch13.HF_VARIANT, "output_tokens_per_s": 1.0, "ttft_ms_p50": 900.0, "prefix_hit_rate": None},
            {"variant": "+ prepacked weights", "output_tokens_per_s": 2.8, "ttft_ms_p50": 800.0,
             "prefix_hit_rate": None},
            {"variant": "+ prefix cache (radix)", "output_tokens_per_s": 3.0, "ttft_ms_p50": 400.0,
             "prefix_hit_rate": hit_rate}]


def test_numbers_in_the_engine_rows_say_they_are_not_the_named_engines():
    frame = ch13.decision_chart_frame(_measured(0.5)).set_index("engine")
    notes = frame[ch13.MEASURED_HERE]
    assert "not the named engine" in ch13.MEASURED_HERE
    assert "not vLLM" in notes["vLLM"] and "2.8" in notes["vLLM"]
    assert "not SGLang" in notes["SGLang"] and "50%" in notes["SGLang"]
    assert notes["TensorRT-LLM"] == ""  # nothing here bears on it
    without_cache = ch13.decision_chart_frame(_measured(None)).set_index("engine")[ch13.MEASURED_HERE]
    assert without_cache["SGLang"] == ""  # no prefix cache ran: no note, rather than an empty claim
    assert ch13.MEASURED_HERE not in ch13.decision_chart_frame().columns


# --- F13.7: the scale-out table shows the layout --------------------------------------------------------


def test_the_scale_out_table_tells_layouts_with_the_same_gpu_count_apart():
    plan = ch13.scale_out_plan()
    table = ch13.scale_out_table(plan)
    assert "layout" in table.columns
    pairs = list(zip(table["GPUs"], table["layout"], strict=True))
    assert len(set(pairs)) == len(pairs)
    if plan["chosen"]:
        assert f"{plan['chosen']} GPUs as {plan['parallelism']}" in ch13.scale_out_text(plan)


def test_the_layout_contrast_is_said_only_where_the_plans_show_it():
    plans = [{"n_gpus": 2, "parallelism": "TP2", "fits": True}, {"n_gpus": 2, "parallelism": "DP2", "fits": False}]
    assert "at 2 GPUs, TP2 fits the weights and DP2 does not" in ch13._layout_contrast(plans)
    all_fit = [{**p, "fits": True} for p in plans]
    assert ch13._layout_contrast(all_fit) == ""


# --- F13.8: the GPU commands run one engine at a time -------------------------------------------------


def test_the_gpu_commands_launch_measure_and_stop_each_engine_in_turn():
    running: set[str] = set()
    saved: dict[str, str] = {}
    for line in ch13.gpu_commands():
        words = line.split()
        if words[1:3] == ["engines", "launch"]:
            assert not running, f"{words[3]} launched while {running} still runs"
            running.add(words[3])
            port = words[words.index("--port") + 1]
        elif words[1] == "loadgen":
            (engine,) = running
            assert words[words.index("--url") + 1].endswith(f":{port}")
            saved[engine] = words[words.index("--out") + 1]
        elif words[1:3] == ["engines", "stop"]:
            running.discard(words[3])
    assert not running
    assert set(saved) == set(launchers.ENGINES) and len(set(saved.values())) == len(saved)
    assert all(engine in folder for engine, folder in saved.items())


@pytest.mark.parametrize("size", ["quick", "full"])
def test_the_page_names_the_rungs_a_size_leaves_out(size):
    s = ch13.sizes("cpu", size)
    text = ch13.variants_not_run_text(s)
    left_out = [name for name in ch13.OUR_VARIANTS if name not in s.variants]
    assert all(f"**{name}**" in text for name in left_out)
    assert (text == "") == (not left_out)


# --- review: every number of the workshop's ladder says where it comes from -----------------------------


def _numbers(run: ch13.ReportedRun) -> list[str]:
    return [name for name in ch13.NUMBER_WORDS if getattr(run, name) is not None]


def test_every_number_of_the_workshop_ladder_names_its_source():
    table = ch13.workshop_table()
    assert "talk 1 and the course brief" in table.columns[0]
    assert "talk 1 and the course brief" in ch13.WORKSHOP_TITLE
    assert ch13.WORKSHOP_TITLE in ch13.tables(ch13.Result())
    for i, run in enumerate(ch13.WORKSHOP_RUNS):
        assert all(run.source_of(name) for name in _numbers(run)), run.config
        assert table["source of each number"][i] == run.source  # the rendered table shows it
        for name in _numbers(run):  # each number stands in the source cell beside its own source
            assert f"{ch13.NUMBER_WORDS[name]} {ch13._number(getattr(run, name))}" in run.source
    assert "not in the transcript" in ch13.WORKSHOP_TABLE and "not in the transcript" in ch13.BRIEF_SETUP


def test_numbers_not_in_the_transcript_are_not_credited_to_it():
    for run in ch13.WORKSHOP_RUNS:  # what is credited to talk 1 stands in the row's quote of it
        assert run.not_in_quote() == [], run.config
        credited = [n for n in _numbers(run) if run.source_of(n).startswith("talk 1")]
        assert all(ch13._number(getattr(run, n)) in run.quote for n in credited)
    default = ch13.WORKSHOP_RUNS[1]
    with pytest.raises(ValueError, match="credited to talk 1 but not in its quote"):
        dataclasses.replace(default, from_table=())  # its tok/s is not in its quote
    with pytest.raises(ValueError, match="credited to talk 1 but not in its quote"):
        dataclasses.replace(default, from_setup=())  # nor its load
    groups = ch13.numbers_by_source()
    transcript = next(words for where, words in groups.items() if where.startswith("the transcript of talk 1"))
    table = "; ".join(groups[ch13.WORKSHOP_TABLE])
    assert f"output tok/s {ch13._number(default.output_tokens_per_s)}" in table
    assert f"output tok/s {ch13._number(default.output_tokens_per_s)}" not in "; ".join(transcript)
    text = ch13.workshop_text()
    assert f"From {ch13.WORKSHOP_TABLE}: {table}." in text


def test_the_load_is_credited_to_the_briefs_pitfalls_and_the_tok_s_to_its_table():
    """The brief's vLLM table has no load column: 1 request against 10 is in its list of pitfalls."""
    hf, default, *_ = ch13.WORKSHOP_RUNS
    assert hf.source_of("requests_in_flight") == default.source_of("requests_in_flight") == ch13.BRIEF_SETUP
    assert default.source_of("output_tokens_per_s") == ch13.WORKSHOP_TABLE
    text = ch13.workshop_text()
    assert "in flight (the brief's list of pitfalls)" in text and "about 736 output tokens/s (the brief's table)" in text
    groups = ch13.numbers_by_source()
    assert any("requests in flight 10" in row for row in groups[ch13.BRIEF_SETUP])
    assert not any("requests in flight" in row for row in groups[ch13.WORKSHOP_TABLE])


def test_a_number_quoted_from_the_transcript_is_credited_to_talk_1():
    hf, default, prefix, *rest = ch13.WORKSHOP_RUNS
    quoted = dataclasses.replace(prefix, from_table=(), quote="throughput of 1,034 tokens per second")
    groups = ch13.numbers_by_source((hf, default, quoted, *rest))
    transcript = next(words for where, words in groups.items() if where.startswith("the transcript of talk 1"))
    assert any("+ prefix caching, output tok/s 1,034" in w for w in transcript)
    assert not any("+ prefix caching" in w for w in groups[ch13.WORKSHOP_TABLE])
    assert "1,034 (talk 1;" in ch13.workshop_text((hf, default, quoted, *rest))
    assert "about 1,034 (the brief's table;" in ch13.workshop_text()
    assert quoted.source.startswith(f"talk 1, line {prefix.line}: output tok/s 1,034")


# --- review: the saved-results sentence follows what is saved -------------------------------------------


def test_the_gpu_note_says_what_is_saved_of_vllm_and_sglang():
    cpu = ch13.SavedEngineRun("engines-vllm-cpu-x.json", "vLLM 9.9 (CPU build)", "cpu")
    gpu = ch13.SavedEngineRun("h200-engines-x.json", "SGLang 9.9", "cuda")
    only_cpu = ch13.gpu_note([cpu])
    assert "No saved vLLM or SGLang results from a GPU" in only_cpu and "vLLM 9.9 (CPU build) (`engines-vllm-cpu-x.json`)" in only_cpu
    assert "No saved vLLM or SGLang results exist" not in only_cpu
    nothing = ch13.gpu_note([])
    assert "No saved vLLM or SGLang results from a GPU" in nothing and "Nor is any CPU run of them saved" in nothing
    with_gpu = ch13.gpu_note([cpu, gpu])
    assert "SGLang 9.9 (`h200-engines-x.json`)" in with_gpu and "No saved" not in with_gpu


def test_saved_engine_runs_are_read_from_the_results_folder(tmp_path):
    import json

    assert ch13.saved_engine_runs(tmp_path) == []
    (tmp_path / "engines-vllm-cpu-x.json").write_text(json.dumps({
        "environment": {"device_kind": "cpu"},
        "servers": [{"contender": "ours", "label": "our engine"}, {"contender": "vllm-cpu", "label": "vLLM (CPU)"}]}))
    (tmp_path / "h200-engines-y.json").write_text(json.dumps({
        "environment": {"device_kind": "cuda"}, "servers": {"sglang": {"version": "0.5"}}}))
    runs = ch13.saved_engine_runs(tmp_path)
    assert ch13.SavedEngineRun("engines-vllm-cpu-x.json", "vLLM (CPU)", "cpu") in runs
    assert ch13.SavedEngineRun("h200-engines-y.json", "sglang 0.5", "cuda") in runs and len(runs) == 2


# --- review: the decision chart's rows ------------------------------------------------------------------


def test_the_sglang_row_refers_to_chapter_10s_measurement_not_a_typed_amount():
    row = _chart_row("SGLang")
    assert "a few" not in row.reason and "chapter 10 measures" in row.reason


def test_the_tgi_row_reports_its_archiving_as_reported():
    tgi = next(c for c in ch13.DECISION_CHART if "TGI" in c.engine)
    assert "reported archived read-only on 2026-03-21 (secondary sources)" in tgi.reason


def test_chapter_09s_transformers_contender_is_named_as_the_manager():
    hf = _chart_row("HF transformers")
    assert "ContinuousBatchingManager" in hf.evidence
    assert "ContinuousBatchingManager" in ch13.workshop_text().split("That ladder")[1]
