"""Chapter 07's own numbers: the equivalence check, the MLA text, measured scorecard notes, saved views."""

from __future__ import annotations

import dataclasses
import json

import pytest

from infer_lab.attention.quality import VariantQuality
from infer_lab.bench.attention import BackendTime, DecodeAttentionTime
from infer_lab.course import ch07_attention_variants as ch07


def test_every_variant_and_path_equals_sdpa():
    rows = ch07.run_equivalence()
    assert {(r.variant, r.path) for r in rows} >= {("MHA", "naive"), ("MQA", "flash"), ("MLA", "absorbed")}
    assert all(r.equal for r in rows), [r for r in rows if not r.equal]
    assert f"{len(rows)} of {len(rows)}" in ch07.equivalence_text(rows)


def test_mla_text_states_both_k_head_dims():
    text = ch07.mla_text()
    assert "57× less" in text and "71× less" in text and "real K head of 192" in text and "14.2×" in text
    memory = ch07.memory_text(ch07.memory_rows())
    assert "real K of 192" in memory and "1.25× more" in memory and "71×" in memory


def _quality() -> ch07.QualityResult:
    rows = [VariantQuality("GQA-3 (as trained)", 20.0, 0.0, 300.0),
            VariantQuality("MQA (mean-pooled, no uptraining)", 2000.0, 99.0, 100.0),
            VariantQuality("sliding window 32", 30.0, 0.5, 300.0, "KV stops growing at 32 tokens")]
    return ch07.QualityResult(rows, 128, "smollm2-135m (embedded ...)", "smollm2-135m", embedded=True)


def test_measured_quality_sits_beside_the_cited_one_and_names_its_model():
    notes = ch07.quality_notes(_quality())
    assert notes == {
        "MQA": "measured here, converting smollm2-135m without retraining (MQA (mean-pooled, no uptraining)): "
               "perplexity ×100",
        "sliding": "measured here, converting smollm2-135m without retraining (sliding window 32): perplexity +50.0%"}
    card = {r.variant: r for r in ch07.scorecard_rows(quality=_quality()) if r.model == "mistral-7b"}
    assert card["MQA"].quality.startswith("small drop after uptraining (GQA paper)")  # the cited note stays ...
    assert card["MQA"].quality.endswith(notes["MQA"])  # ... with the measurement beside it
    assert card["MQA"].quality.count("measured") == 1  # one measured clause: this one
    assert "GQA paper" in card["GQA-8"].quality and "measured" not in card["GQA-8"].quality
    plain = {r.variant: r for r in ch07.scorecard_rows() if r.model == "mistral-7b"}
    assert "measured here" not in plain["MQA"].quality
    text = ch07.quality_text(_quality())
    assert "3.00× less KV per token" in text and "KV stops growing at 32 tokens" in text
    assert "already 4-bit" in text  # the embedded baseline is Q4_1: said wherever quality is shown


def test_saved_gpu_timings_are_read_back(tmp_path, monkeypatch):
    backends = [BackendTime("flash", 1024, 32, 128, 2 * 32 * 1024 * 1024, True, 1e-4),
                BackendTime("cudnn", 1024, 32, 128, 2 * 32 * 1024 * 1024, False, None, "not built")]
    decode = [DecodeAttentionTime(8, 32768, 8, 2 * 8 * 8 * 32768 * 128 * 2, 2e-4, 1.5e-4)]
    payload = {"sdpa_backends": [dataclasses.asdict(b) for b in backends],
               "decode_vs_kv_heads": [dataclasses.asdict(d) for d in decode],
               "environment": {"device_name": "NVIDIA H200", "date": "2026-12-01T00:00:00"},
               "command": "python3 scripts/gpu_checks.py --only attention"}
    (tmp_path / "attention-mistral-7b-cuda-2026-12-01.json").write_text(json.dumps(payload))
    monkeypatch.setenv("INFER_LAB_RESULTS", str(tmp_path))
    view = ch07.saved()
    assert view is not None and view.title == "Attention timed on NVIDIA H200"
    backend_frame, decode_frame = view.tables.values()
    assert list(backend_frame["time p50 (ms)"]) == ["0.100", "— (not available here)"]
    assert list(decode_frame["measured / predicted"]) == ["1.33×"]
    monkeypatch.setenv("INFER_LAB_RESULTS", str(tmp_path / "none"))
    assert ch07.saved() is None


def test_the_flash_saving_follows_the_tile_the_sram_allows():
    """Algorithm 1's tile rule on M, and the saving it implies, flips to 'more' when the tile is too short."""
    big = ch07.flash_tiling(sram_bytes=256 * 1024, causal=False)
    assert (big.block_k, big.block_q) == (256, 128)  # B_c = ceil(M / 4d), B_r = min(B_c, d), M in elements
    rows = ch07.flash_result(big).rows
    assert all(r.naive_over_tiled == pytest.approx(big.long_sequence_saving, rel=0.01) for r in rows)
    assert "2.0× fewer HBM bytes than naive at every length shown" in ch07.flash_text(ch07.flash_result(big))
    small = ch07.flash_tiling(sram_bytes=32 * 1024, causal=False)
    assert small.block_q == 32 and small.long_sequence_saving < 1
    text = ch07.flash_text(ch07.flash_result(small))
    assert "more HBM bytes than naive" in text and "32 rows" in text and "set by hand" in text
    causal = ch07.flash_result(ch07.flash_tiling(sram_bytes=256 * 1024, causal=True)).rows
    assert causal[0].naive_over_tiled < causal[-1].naive_over_tiled  # skipped tiles: the saving grows towards 4·tile/d
    assert causal[-1].naive_over_tiled == pytest.approx(4 * 128 / 128, rel=0.01)


def test_m_is_the_shared_memory_one_thread_block_may_use():
    """M is the per-block limit, not the SM's L1 + shared SRAM: T4's 64 KiB gives 64-row tiles and a causal
    bound of 2.00, H100's 227 KiB still gives d-row tiles; the label says whose figure M is."""
    from infer_lab.catalog import get_on_chip_memory

    t4 = ch07.flash_tiling("T4")
    assert t4.sram_bytes == get_on_chip_memory("T4").shared_bytes_per_block == 64 * 1024
    assert t4.sram_bytes < get_on_chip_memory("T4").sram_kib_per_unit * 1024
    assert (t4.block_q, t4.long_sequence_saving) == (64, 2.0)
    assert "64 rows" in ch07.flash_text(ch07.flash_result(t4, "T4")) and "= 2.00: the tile sets it" in (
        ch07.flash_text(ch07.flash_result(t4, "T4")))
    h100 = ch07.flash_tiling("H100-SXM")
    assert (h100.sram_bytes, h100.block_k, h100.block_q) == (227 * 1024, 227, 128)
    assert h100.sram_of == "the most shared memory one thread block may use on H100-SXM"
    assert ch07.flash_tiling("L4").block_q == 99  # Ada: 99 KiB per block
    assert ch07.flash_tiling("H100-SXM", sram_bytes=227 * 1024).sram_of == h100.sram_of  # the GPU's own figure
    assert ch07.flash_tiling("H100-SXM", sram_bytes=226 * 1024).sram_of == "set by hand"
    mi300x = ch07.flash_tiling("MI300X")
    assert mi300x.sram_of == "the most LDS (shared memory) one workgroup may use on MI300X" and mi300x.block_q == 64


def test_the_text_names_the_loop_order_it_counts_and_the_papers_other_one():
    text = ch07.flash_text(ch07.flash_result())
    assert "FlashAttention-2's loop order, the one `flash_attention` runs" in text
    assert "heights taken from FlashAttention's Algorithm 1 as an assumption" in text
    assert "Algorithm 1 runs the loops the other way round: K/V tiles outside" in text
    assert "re-reads Q and O" in text and "on-chip (shared memory and registers)" in text and "SRAM" not in text


def test_saving_words_follow_the_ratios():
    assert ch07.saving_across_lengths([1024, 65536], [2.0, 2.01]) == (
        "2.0× fewer HBM bytes than naive at every length shown")
    assert ch07.saving_across_lengths([1024, 65536], [9.0, 513.0]) == (
        "9.0× fewer HBM bytes than naive at 1,024 tokens, 513× fewer at 65,536")
    assert ch07.saving_across_lengths([1024, 65536], [0.5, 0.5]) == (
        "2.00× more HBM bytes than naive at every length shown")
    assert ch07.saving_across_lengths([1024, 65536], [0.8, 1.6]) == (
        "1.25× more HBM bytes than naive at 1,024 tokens, 1.6× fewer at 65,536")
    assert ch07.times_fewer(1.0) == "as many"  # only when equal: near 1 the ratio is printed, not "about as many"
    assert ch07.times_fewer(1.004) == "1.004× fewer" and ch07.times_fewer(0.996) == "1.004× more"
    assert ch07.times_fewer(1.006) == "1.01× fewer" and ch07.times_fewer(0.99) == "1.01× more"
    assert ch07.saving_across_lengths([1024, 65536], [2.0, 2.06]) == (
        "2.0× fewer HBM bytes than naive at 1,024 tokens, 2.1× fewer at 65,536")
    assert ch07.saving_across_lengths([1024, 65536], [1.0, 1.0]) == "as many HBM bytes as naive at every length shown"
    assert ch07.saving_across_lengths([1024, 65536], [1.0, 2.0]) == (
        "as many HBM bytes as naive at 1,024 tokens, 2.0× fewer at 65,536")


def test_the_cache_sentence_says_which_bound_is_nearer():
    row = ch07.flash_result().rows[-1]
    l2 = ch07.ReuseCache("L2", row.head_kv_bytes)
    assert "within X's" in ch07.cache_text(row, l2, "X") and "upper bound" not in ch07.cache_text(row, l2, "X")
    smaller = ch07.ReuseCache("L2", row.head_kv_bytes - 1)
    assert "upper bound is the nearer one" in ch07.cache_text(row, smaller, "X")
    assert "no cache size" in ch07.cache_text(row, None, "X")


def test_a_last_level_cache_is_judged_where_one_is_on_file():
    """MI300X's L2 is split between its dies; the cache every compute unit shares is the last-level one."""
    from infer_lab.catalog import get_on_chip_memory

    chip = get_on_chip_memory("MI300X")
    cache = ch07.reuse_cache(chip)
    assert cache.size_bytes == chip.last_level_cache_bytes > chip.l2_bytes and "last-level cache" in cache.name
    assert ch07.reuse_cache(get_on_chip_memory("H100-SXM")) == ch07.ReuseCache("L2", 50 * 2**20)
    text = ch07.flash_text(ch07.flash_result(ch07.flash_tiling("MI300X"), "MI300X"))
    assert "of last-level cache" in text and "hits the last-level cache" in text and " of L2" not in text
    assert ch07.flash_result(gpu="B200").cache is None  # no on-chip figures on file: no judgement
    assert "no cache size for B200" in ch07.flash_text(ch07.flash_result(gpu="B200"))


def test_the_naive_rows_say_when_their_score_matrix_cannot_fit_the_gpu():
    f = ch07.flash_result()
    last = f.rows[-1]
    assert last.score_matrix_bytes > f.gpu_memory_bytes > f.rows[-2].score_matrix_bytes  # 275 GB > 85.9 GB
    text = ch07.naive_memory_text(f.rows, f.gpu_memory_bytes, f.gpu)
    assert text.startswith(f"At {last.seq_len:,} tokens the naive path's score matrix alone")
    assert "could not run on H100-SXM there, so that row counts" in text and text in ch07.flash_text(f)
    two = ch07.naive_memory_text(f.rows, f.rows[-2].score_matrix_bytes - 1, "Y")
    assert two.startswith(f"From {f.rows[-2].seq_len:,} tokens on (the last 2 rows)") and "those rows count" in two
    fits = ch07.naive_memory_text(f.rows, last.score_matrix_bytes, "Z")  # the inverted case: everything fits
    assert fits.startswith("The naive path's score matrix fits in Z's") and "could not" not in fits


def test_the_papers_measured_figure_is_cited_with_its_workload_and_version():
    from infer_lab.attention import PAPER_HBM_TRAFFIC, CitedHBMTraffic

    paper = PAPER_HBM_TRAFFIC
    text = ch07.flash_text(ch07.flash_result())
    assert f"{paper.standard_gb} GB against {paper.flash_gb} GB" in text and "**9.2×**" in text
    assert paper.workload in text and "arXiv:2205.14135v2 (June 2022), Fig. 2 left" in text
    assert f"another version of the paper prints {paper.other_standard_gb} vs {paper.flash_gb} GB" in text
    other = dataclasses.replace(paper, standard_gb=22.0, other_standard_gb=None)  # the ratio follows the figures
    moved = ch07.flash_text(dataclasses.replace(ch07.flash_result(), paper=other))
    assert "22.0 GB against 4.4 GB" in moved and "**5.0×**" in moved and "another version" not in moved
    assert CitedHBMTraffic("s", "w", 9.0, 3.0).standard_over_flash == 3.0


def test_a_gpu_without_sram_figures_borrows_the_default_and_says_so():
    tiling = ch07.flash_tiling("B200")
    assert tiling.sram_of == (f"the most shared memory one thread block may use on {ch07.DEFAULT_GPU} "
                              "(B200 has no per-block figure on file)")


def test_dsa_reads_grow_with_the_context_because_the_indexer_reads_every_token():
    from infer_lab.attention.kv_sizing import constant_state_models, dsa_read_per_step

    reads = ch07.dsa_reads(32768)
    assert reads[1].top_k_kv_bytes == reads[0].top_k_kv_bytes  # the main attention is capped at top-k ...
    assert reads[1].indexer_bytes == 2 * reads[0].indexer_bytes  # ... the indexer is not
    assert reads[0].indexer_bytes_per_token == 32 * 128 * 1  # Mistral's 32 layers x a 128-value fp8 key
    assert "**grow**" in ch07.dsa_text(reads) and "indexer part is not" in ch07.dsa_text(reads)
    no_indexer = [dsa_read_per_step("mistral-7b", c, indexer_key_dim=0) for c in (32768, 65536)]
    assert "**do not grow**" in ch07.dsa_text(no_indexer)  # only an indexer that reads nothing would stop it
    short = [dsa_read_per_step("mistral-7b", c) for c in (512, 1024)]  # below top-k the KV part grows too
    assert "**grow**" in ch07.dsa_text(short) and "indexer part is not" not in ch07.dsa_text(short)
    wide = ch07.dsa_reads(32768, top_k=65536)  # the learner's top-k control: above the context the KV part grows too
    assert wide[1].top_k_kv_bytes == 2 * wide[0].top_k_kv_bytes and "indexer part is not" not in ch07.dsa_text(wide)
    assert "top 65,536 tokens" in ch07.state_table(context=32768, top_k=65536)["architecture"].iloc[-1]
    dsa = constant_state_models()[-1]
    assert dsa.read_grows_with_context and dsa.bytes_read_per_step == reads[0].bytes_read
    assert not constant_state_models(dsa_indexer_key_dim=0)[-1].read_grows_with_context
