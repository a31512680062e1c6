"""The command line's rough edges, found by trying it as a new user would."""

from __future__ import annotations

import json
import subprocess
import sys

from infer_lab.cli import main


def test_models_counts_from_the_configs_without_building_anything(capsys, monkeypatch):
    """It built every architecture on the meta device before: 31 s for a listing."""
    import infer_lab.models

    def refuse(*_):
        raise AssertionError("infer-lab models must not build models")

    monkeypatch.setattr(infer_lab.models, "count_params_meta", refuse)
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r["params"] for r in json.loads(capsys.readouterr().out)}
    assert rows["mistral-7b"] == 7_248_023_552 and rows["smollm2-135m"] == 134_515_008


def test_a_missing_config_file_is_reported_as_missing(capsys):
    assert main(["kv", "--model", "./no/such/config.json"]) == 2
    err = capsys.readouterr().err
    assert "no such config file" in err and "Unknown model" not in err


def test_a_model_that_does_not_fit_says_so_and_by_how_much(capsys):
    assert main(["capacity", "--model", "llama-3-70b", "--gpu", "H100-SXM", "--gpus", "1",
                 "--context", "8192", "--users", "4"]) == 0
    out = capsys.readouterr().out
    assert "does not fit" in out and "short by" in out


def test_a_context_past_the_model_limit_warns(capsys):
    assert main(["kv", "--model", "mistral-7b", "--context", "1000000", "--json"]) == 0
    captured = capsys.readouterr()
    assert "past mistral-7b's limit of 32,768" in captured.err and '"warnings"' in captured.out


def test_output_into_a_closed_pipe_is_not_a_traceback():
    code = ("import sys; from infer_lab.cli import main; "
            "sys.exit(main(['roofline', '--model', 'mistral-7b', '--gpu', 'H100-SXM']))")
    proc = subprocess.run(f'{sys.executable} -c "{code}" | head -1', shell=True, capture_output=True,
                          text=True)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr
    assert proc.stdout.strip()
