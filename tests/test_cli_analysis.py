"""`infer-lab kv`, `capacity` and `roofline`: output, JSON and bad input."""

from __future__ import annotations

import json

import pytest

from infer_lab.cli import main


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)


def test_kv_json_mistral(capsys):
    d = run_json(capsys, "kv", "--model", "mistral-7b", "--context", "4096", "--users", "80")
    assert d["kv_bytes_per_token"] == 131_072 and isinstance(d["kv_bytes_per_token"], int)
    assert d["kv_bytes_per_token_per_layer"] == 4096
    assert d["kv_bytes_total"] == 80 * 4096 * 131_072


def test_kv_json_deepseek_mla_and_fp8(capsys):
    d = run_json(capsys, "kv", "--model", "deepseek-v3")
    assert d["kv_bytes_per_token"] == 70_272 and d["attention"] == "MLA"
    d8 = run_json(capsys, "kv", "--model", "deepseek-v3", "--kv-dtype", "fp8")
    assert d8["kv_bytes_per_token"] == 35_136


def test_kv_text_shows_both_units(capsys):
    assert main(["kv", "--model", "mistral-7b"]) == 0
    out = capsys.readouterr().out
    assert "131,072 B" in out and "131 KB" in out and "128 KiB" in out


def test_capacity_compare_all_json(capsys):
    d = run_json(
        capsys, "capacity", "--model", "mistral-7b", "--context", "4096", "--itl-slo-ms", "50"
    )
    plans = d["plans"]
    assert len(plans) >= 10
    meeting = [p for p in plans if p["meets_slo"]]
    costs = [p["usd_per_m_output_tokens"] for p in meeting]
    assert costs == sorted(costs)
    assert d["cheapest_meeting_slo"] == f"{meeting[0]['n_gpus']}x {meeting[0]['gpu']}"
    assert d["price_vs_cost"]["expensive_gpu_wins"] is True


def test_capacity_one_gpu_does_not_fit_is_a_result(capsys):
    d = run_json(capsys, "capacity", "--model", "llama-3-70b", "--gpu", "T4", "--context", "4096")
    (p,) = d["plans"]
    assert p["fits"] is False and p["shortfall_bytes"] > 0 and d["cheapest_meeting_slo"] is None
    assert main(["capacity", "--model", "llama-3-70b", "--gpu", "T4"]) == 0
    assert "short by" in capsys.readouterr().out


def test_capacity_preset_and_overrides(capsys):
    d = run_json(
        capsys,
        "capacity",
        "--model",
        "llama-3-8b",
        "--preset",
        "premium-chat",
        "--gpu",
        "H100-SXM",
        "--context",
        "4096",
    )
    assert d["inputs"]["context"] == 4096 and d["inputs"]["itl_slo_ms"] == 25.0
    assert d["plans"][0]["itl_ms"] <= 25.0


def test_roofline_json(capsys):
    d = run_json(
        capsys,
        "roofline",
        "--model",
        "mistral-7b",
        "--gpu",
        "H100-SXM",
        "--batch",
        "8",
        "--context",
        "2048",
    )
    assert 290 < d["ridge_point"] < 300
    assert d["prefill"]["bound"] == "compute" and d["decode"]["bound"] == "memory"
    assert {o["name"] for o in d["decode_ops"]} >= {
        "q/k/v projections",
        "o projection",
        "MLP (dense)",
        "LM head",
    }
    assert d["tokens_per_s"] == pytest.approx(8 / (d["itl_ms"] / 1e3))


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["kv", "--context", "0"], "context must be > 0"),
        (["kv", "--users", "-3"], "users must be > 0"),
        (["kv", "--model", "mistrall-7b"], "mistral-7b"),
        (["capacity", "--gpu", "H1000"], "Known GPUs"),
        (["roofline", "--gpu", "nope"], "Known GPUs"),
        (["capacity", "--gpu", "H100-SXM", "--gpus", "0"], "n_gpus must be > 0"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(capsys, argv, needle):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err
