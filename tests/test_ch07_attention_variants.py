"""Chapter 07's own numbers: the equivalence check, the MLA text, measured scorecard notes, saved views."""

from __future__ import annotations

import dataclasses
import json

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


def test_measured_quality_replaces_the_cited_one_and_names_its_model():
    notes = ch07.quality_notes(_quality())
    assert notes == {"MQA": "measured on smollm2-135m, MQA (mean-pooled, no uptraining): perplexity ×100",
                     "sliding": "measured on smollm2-135m, sliding window 32: perplexity +50.0%"}
    card = {r.variant: r for r in ch07.scorecard_rows(quality=_quality()) if r.model == "mistral-7b"}
    assert card["MQA"].quality == notes["MQA"] and "GQA paper" in card["GQA-8"].quality
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
