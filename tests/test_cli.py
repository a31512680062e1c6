"""The CLI commands of the walking skeleton exit 0 and their --json parses."""

from __future__ import annotations

import json

import pytest

from infer_lab.cli import main


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("env", "generate", "tour", "models"):
        assert cmd in out


def test_every_command_has_a_help_that_parses(capsys):
    """One parser for all commands: a clashing option (two --workload) would break them all."""
    from infer_lab.cli import _command_modules

    names = [m.NAME for m in _command_modules()]
    for cmd in ("bench", "check", "cluster", "tp", "slides", "serve", "loadgen", "engines"):
        assert cmd in names
    for name in names:
        with pytest.raises(SystemExit) as exc:
            main([name, "--help"])
        assert exc.value.code == 0, name
        assert "usage" in capsys.readouterr().out


def test_env_json(capsys):
    data = _json(capsys, ["env", "--json"])
    assert data["ceilings"]["bandwidth_Bps"] > 0 and data["versions"]["torch"]
    assert data["device"]["kind"] in ("cpu", "cuda")
    if data["device"]["kind"] == "cpu":  # the CPU's flags and the engine's measured GEMM path
        assert data["cpu"]["model"] and isinstance(data["cpu"]["flags"], list) and data["cpu"]["threads"] >= 1
        assert data["gemm_plan"]["summary"] and data["gemm_plan"]["model"] == "smollm2-135m"
        compiled = data["compiled_decode"]  # whether the compiled one-token step can run, and why not
        assert compiled["available"] is (compiled["compiler"] is not None) is (compiled["reason"] is None)


def test_models_json(capsys):
    rows = _json(capsys, ["models", "--json"])
    by_name = {r["name"]: r for r in rows}
    assert by_name["mistral-7b"]["params"] == 7_248_023_552 and by_name["smollm2-135m"]["embedded"]


def test_generate_json(capsys):
    data = _json(capsys, ["generate", "--json", "--max-new-tokens", "12", "What is the capital of France?"])
    assert data["text"] == "The capital of France is Paris."
    assert isinstance(data["token_ids"], list) and data["ttft_ms"] > 0
    assert data["token_ids"][-1] == 2 and len(data["token_ids"]) < 12  # it stopped at EOS (<|im_end|>)
    assert len(data["itl_ms"]) == len(data["token_ids"]) - 1  # one gap per token after the first


def test_generate_refuses_compiled_decode_without_our_engine(capsys):
    assert main(["generate", "--compiled-decode", "--max-new-tokens", "2", "hi"]) != 0
    assert "--compiled-decode compiles our engine's decode step: use --engine paged" in capsys.readouterr().err


def test_generate_random_weights(capsys):
    data = _json(capsys, ["generate", "--json", "--weights", "random", "--max-new-tokens", "3", "--prompt-len", "5"])
    assert len(data["token_ids"]) == 3 and data["weights"] == "random"


def test_bad_input_is_one_clear_line(capsys):
    assert main(["generate", "--model", "nope"]) == 2
    err = capsys.readouterr().err
    assert "Unknown model 'nope'" in err and "mistral-7b" in err and "Traceback" not in err
    assert main(["generate", "--max-new-tokens", "0"]) == 2


def test_tour_writes_report(tmp_path, capsys):
    out = tmp_path / "tour"
    # one chapter that runs the model and draws figures (every chapter's run is in test_chapters.py)
    assert main(["tour", "--quick", "--out", str(out), "--only", "ch08"]) == 0
    report = (out / "report.md").read_text()
    results = json.loads((out / "results.json").read_text())
    assert "KV cache" in report and "Traceback" not in report and "FAILED" not in report
    assert set(results["chapters"]) == {"ch08_kv_cache_paged"}
    assert all(c["ok"] for c in results["chapters"].values())
    assert results["environment"]["device_name"] and results["environment"]["torch_threads"] >= 1
    assert len(list(out.glob("ch08_*.png"))) == 3
