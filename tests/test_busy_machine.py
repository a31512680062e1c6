"""A timed part run while other processes load the CPU says so on the page, and never states an
inverted lesson as its finding (chapters 02 §2, 08 §1 and 10).

The hog is two spinning processes (one per core of the 2-core CI machine). The machine check
itself is tested under that hog; each chapter's text is then tested twice: on a real tiny
measurement taken under the hog (01 and 10), and on results whose numbers point against the
lesson, with the busy check (01, 08 and 10) and with a quiet one. Also here: the OpenMP wait
policy infer_lab sets for a busy machine (its ``__init__``), and the slowness factor that scales
the browser, Jupyter and server tests' bounds (tests/machine_speed.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from infer_lab.course import ch02_feel_the_pain as ch02
from infer_lab.course import ch09_batching as ch09
from infer_lab.course import ch11_chunked_prefill as ch11
from infer_lab.course.chapter import finding
from infer_lab.timing import (
    CONTRADICTED,
    INCONCLUSIVE,
    SUPPORTED,
    MachineLoad,
    compare_spreads,
    machine_load,
)

QUIET = MachineLoad(others_cores=0.02, cores=2, load1=0.1, sample_s=0.3)
HOG_PROCESSES = max(2, os.cpu_count() or 2)


@pytest.fixture(scope="module")
def hog():
    """Processes spinning on every core for the module's tests; ended by their own pids."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(HOG_PROCESSES)]
    time.sleep(0.5)
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


@pytest.fixture
def one_thread():
    """One torch thread while the hog spins: two OpenMP threads on two contended cores stall at
    every barrier, which would make a tiny measurement take minutes."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def busy(hog) -> MachineLoad:
    return machine_load(0.3)


def test_the_machine_check_sees_the_hog(busy):
    assert busy.busy and busy.others_cores >= 1.0, busy
    assert "busy" in busy.text() and f"of its {busy.cores} cores" in busy.text()


def test_a_quiet_check_is_not_busy_and_says_so():
    assert not QUIET.busy and "quiet" in QUIET.text()
    assert MachineLoad(None, 2, None, 0.3).busy is False
    assert QUIET.worst(replace(QUIET, others_cores=1.5)).others_cores == 1.5


def test_spreads_decide_supported_contradicted_or_inconclusive():
    assert compare_spreads([1.0, 1.2], [2.0, 2.5]) == SUPPORTED
    assert compare_spreads([2.0, 2.5], [1.0, 1.2]) == CONTRADICTED
    assert compare_spreads([1.0, 2.1], [2.0, 2.5]) == INCONCLUSIVE
    assert compare_spreads([1.0], [1.5], margin=0.6) == INCONCLUSIVE
    with pytest.raises(ValueError):
        compare_spreads([], [1.0])
    with pytest.raises(ValueError, match="outcome"):
        finding("maybe", "x", QUIET)


def _says_inconclusive_not_the_opposite(text: str) -> None:
    assert "Inconclusive on this run" in text, text
    assert "This run shows it" not in text, text


# --- 01 §2: TTFT grows with the prompt


def _ttft(short_s: list[float], long_s: list[float], machine: MachineLoad) -> list[ch02.TTFTPoint]:
    def point(length, samples):
        s = sorted(samples)
        return ch02.TTFTPoint(length, s[len(s) // 2], s[-1], s[0], len(s), s[-1], machine)
    return [point(32, short_s), point(512, long_s)]


def test_01_ttft_inverted_numbers_are_inconclusive_with_the_busy_machine_named(busy):
    text = ch02.ttft_text(_ttft([0.050, 0.060, 0.055], [0.020, 0.025, 0.030], busy))
    _says_inconclusive_not_the_opposite(text)
    assert "machine was busy" in text and "Close other programs" in text


def test_01_ttft_overlapping_spread_is_inconclusive_even_on_a_quiet_machine():
    text = ch02.ttft_text(_ttft([0.020, 0.022, 0.060], [0.030, 0.031, 0.032], QUIET))
    _says_inconclusive_not_the_opposite(text)
    assert "machine was quiet" in text


def test_01_ttft_separated_spread_states_the_lesson():
    text = ch02.ttft_text(_ttft([0.020, 0.021, 0.022], [0.090, 0.095, 0.100], QUIET))
    assert text.startswith("**This run shows it:** TTFT grows with the prompt") and "Inconclusive" not in text


def test_01_ttft_measured_under_the_hog_says_the_machine_is_busy(embedded, hog, one_thread):
    sizes = replace(ch02.sizes("cpu", "quick"), ttft_lengths=[8, 32], repeats=3)
    points = ch02.run_ttft(embedded, sizes)
    assert points[0].machine is not None and points[0].machine.busy
    text = ch02.ttft_text(points)
    assert "machine was busy" in text
    assert "This run shows it" in text or "Inconclusive on this run" in text


# --- 08 §1: continuous batching is the fastest contender


def _batching(engine_tokens_per_s: float) -> ch09.BatchingResult:
    w = ch09.batching_workload(ch09.sizes("cpu", "quick"))
    rows = [ch09.ContenderRow("HF one at a time", 10.0, 1.0), ch09.ContenderRow("HF padded batch", 30.0, 2.0),
            ch09.ContenderRow(ch09.ENGINE_CONTINUOUS, engine_tokens_per_s, 1.5)]
    return ch09.BatchingResult(w, rows)


def test_08_continuous_batching_slowest_is_inconclusive_with_the_busy_machine_named(busy):
    text = ch09.batching_text(_batching(5.0), busy)
    _says_inconclusive_not_the_opposite(text)
    assert "machine was busy" in text


def test_08_continuous_batching_fastest_states_the_lesson_and_still_names_a_busy_machine(busy):
    assert ch09.batching_text(_batching(60.0), QUIET).startswith("**This run shows it:**")
    text = ch09.batching_text(_batching(60.0), busy)
    assert "This run shows it" in text and "machine was busy" in text


def test_08_checks_the_machine_itself_when_no_check_is_given(hog):
    assert "machine was busy" in ch09.batching_text(_batching(5.0))


# --- 10: chunking lowers the worst gap


def _chunking(whole_max_s: float, chunked_max_s: float, noise_s: float, machine: MachineLoad) -> ch11.ChunkingResult:
    sizes = replace(ch11.sizes("cpu", "quick"), long_prompt=48, decoders=2, decode_tokens=4, max_num_batched_tokens=16,
                    arrive_at_step=1)
    steps = [ch11.StepPoint(chunking, i, 0.010 + (noise_s if i == 0 else 0.0), 0, 2)
             for chunking in (False, True) for i in range(3)]
    steps += [ch11.StepPoint(False, 3, whole_max_s, 48, 2), ch11.StepPoint(True, 3, chunked_max_s, 14, 2)]
    runs = [ch11.RunSummary(False, None, 4, 50, 1, 0.010, whole_max_s, whole_max_s),
            ch11.RunSummary(True, 16, 7, 16, 4, 0.010, chunked_max_s, 0.05)]
    return ch11.ChunkingResult(sizes, steps, runs, machine)


def test_10_chunked_worst_gap_worse_is_inconclusive_with_the_busy_machine_named(busy):
    text = ch11.chunking_text(_chunking(0.020, 0.060, 0.002, busy))
    _says_inconclusive_not_the_opposite(text)
    assert "machine was busy" in text


def test_10_a_gain_within_the_step_noise_is_inconclusive():
    text = ch11.chunking_text(_chunking(0.060, 0.040, 0.030, QUIET))
    _says_inconclusive_not_the_opposite(text)


def test_10_a_gain_beyond_the_noise_states_the_lesson():
    text = ch11.chunking_text(_chunking(0.120, 0.015, 0.002, QUIET))
    assert text.startswith("**This run shows it:** chunking lowers")


def test_10_measured_under_the_hog_says_the_machine_is_busy(embedded, hog, one_thread):
    tiny = replace(ch11.sizes("cpu", "quick"), long_prompt=32, decoders=2, decode_tokens=4, max_num_batched_tokens=16,
                   arrive_at_step=1)
    c = ch11.run_chunking(embedded, tiny)
    assert c.machine is not None and c.machine.busy
    text = ch11.chunking_text(c)
    assert "machine was busy" in text
    assert "This run shows it" in text or "Inconclusive on this run" in text


# --- ceilings: measured again on request, never silently stale


def test_ceilings_are_measured_again_on_request_and_say_when_and_how_busy(hog, one_thread):
    from infer_lab.hardware import measure_ceilings

    first = measure_ceilings("cpu", quick=True, fresh=True)
    assert measure_ceilings("cpu", quick=True) is first  # kept for the process...
    again = measure_ceilings("cpu", quick=True, fresh=True)
    assert again is not first and again.measured_at >= first.measured_at  # ...until asked again
    assert again.busy and "other programs kept" in again.provenance()
    assert "s ago" in again.provenance(now=again.measured_at + 5)
    assert "min ago" in again.provenance(now=again.measured_at + 600)
    quiet = replace(again, others_cores=0.0)
    assert "quiet machine" in quiet.provenance()


# --- 01 §4: a bigger batch gives more tokens/s in total


def test_01_itl_inverted_is_inconclusive_with_the_busy_machine_named(busy):
    itl = [ch02.ITLPoint(128, 1, 0.010, 0.012, 6, 1000), ch02.ITLPoint(128, 8, 0.200, 0.250, 6, 8000)]
    text = ch02.itl_text(itl, busy)
    _says_inconclusive_not_the_opposite(text)
    assert "machine was busy" in text
    good = [ch02.ITLPoint(128, 1, 0.010, 0.012, 6, 1000), ch02.ITLPoint(128, 8, 0.020, 0.025, 6, 8000)]
    assert ch02.itl_text(good, QUIET).startswith("**This run shows it:**")


# --- OpenMP's wait policy: passive unless the user chose one, set before torch loads


def _policy_in_a_fresh_process(code: str, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "INFER_LAB_CHOSE_OMP_WAIT")}
    out = subprocess.run([sys.executable, "-c", code + "; import os, infer_lab; print(os.environ.get("
                          "'OMP_WAIT_POLICY'), infer_lab.OMP_WAIT_POLICY_SET_BY, infer_lab.OMP_WAIT_POLICY_APPLIES)"],
                         env={**clean, **env}, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_infer_lab_asks_openmp_to_wait_passively_unless_the_user_chose():
    assert _policy_in_a_fresh_process("pass") == ["PASSIVE", "infer_lab", "True"]
    assert _policy_in_a_fresh_process("pass", OMP_WAIT_POLICY="ACTIVE") == ["ACTIVE", "you", "True"]
    assert _policy_in_a_fresh_process("pass", GOMP_SPINCOUNT="300000") == ["None", "you", "True"]
    # torch imported first has read the environment already: the policy is set but says it is not in force
    assert _policy_in_a_fresh_process("import torch") == ["PASSIVE", "infer_lab", "False"]
    # a child of an infer_lab process inherits its choice as infer_lab's, not yours; one you changed is yours
    inherited = {"OMP_WAIT_POLICY": "PASSIVE", "INFER_LAB_CHOSE_OMP_WAIT": "PASSIVE"}
    assert _policy_in_a_fresh_process("pass", **inherited) == ["PASSIVE", "infer_lab", "True"]
    assert _policy_in_a_fresh_process("pass", **{**inherited, "OMP_WAIT_POLICY": "ACTIVE"})[1] == "you"
    assert _policy_in_a_fresh_process("pass", **{**inherited, "GOMP_SPINCOUNT": "1000"})[1] == "you"


def test_a_server_spins_briefly_unless_told_passive_or_you_chose():
    code = ("import sys; from infer_lab.commands.serve import choose_wait_policy; "
            "print(choose_wait_policy(sys.argv[1])); import os; "
            "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))")
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "INFER_LAB_CHOSE_OMP_WAIT")}

    def run(wait: str, **env: str) -> list[str]:
        return subprocess.run([sys.executable, "-c", code, wait], env={**clean, **env}, capture_output=True,
                              text=True, check=True).stdout.splitlines()

    spin = run("spin")
    assert spin[0].startswith("spin") and spin[1] == "None 10000"
    assert run("passive")[1] == "PASSIVE None"
    assert run("spin", OMP_WAIT_POLICY="PASSIVE", INFER_LAB_CHOSE_OMP_WAIT="PASSIVE")[1] == "None 10000"
    yours = run("spin", OMP_WAIT_POLICY="ACTIVE")
    assert yours[0].startswith("your") and yours[1] == "ACTIVE None"


def test_the_test_session_runs_under_the_librarys_policy():
    """conftest imports infer_lab before any test module imports torch; the kernels and workers the
    tests start inherit the policy."""
    import infer_lab

    assert infer_lab.OMP_WAIT_POLICY_APPLIES
    assert os.environ.get("OMP_WAIT_POLICY") == "PASSIVE" or infer_lab.OMP_WAIT_POLICY_SET_BY == "you"


def test_env_names_the_thread_policy():
    from infer_lab.hardware import thread_policy

    policy = thread_policy()
    assert policy["threads"] >= 1 and "torch threads" in policy["text"] and "OMP_WAIT_POLICY=" in policy["text"]


def test_a_promised_button_time_stretches_with_the_load_it_sees(busy):
    from infer_lab.course import nb

    assert nb.busy_stretch(QUIET) == "" and nb.busy_stretch(None) == ""
    text = nb.busy_stretch(busy)
    assert "busy now" in text and f"of its {busy.cores} cores" in text and "× that" in text, text
    two_hogs = MachineLoad(others_cores=2.0, cores=2, load1=2.1, sample_s=0.2)  # measured: 2.2-2.5x
    assert nb.busy_stretch(two_hogs).endswith("about 2× that")
    assert nb.busy_stretch(replace(two_hogs, load1=4.0)).endswith("about 2–3× that")


# --- the tests' slowness factor (tests/machine_speed.py)


def test_the_slowness_factor_is_the_larger_of_probe_and_load_within_1_and_the_cap():
    import machine_speed as ms

    ref = ms.REFERENCE_PROBE_S
    assert ms.factor_from(ref / 2, 0.0, 2) == 1.0  # a faster machine keeps the reference bounds
    assert ms.factor_from(ref * 3, 0.5, 2) == pytest.approx(3.0)  # a slow probe
    assert ms.factor_from(ref, 10.0, 2) == pytest.approx(6.0)  # load 10 on 2 cores: 1 + 10/2
    assert ms.factor_from(ref, None, 2) == 1.0
    assert ms.factor_from(ref * 100, 100.0, 2) == ms.CAP


def test_a_failure_message_says_what_was_measured(monkeypatch):
    import machine_speed as ms

    s = ms.Slowness(factor=2.5, probe_s=0.18, reference_s=0.072, load1=4.2, cpus=2)
    assert s.scale(60) == 150
    text = s.explain("opening it", 151.3, 60)
    for expected in ("151.3 s elapsed", "bound of 150.0 s", "60 s on the reference machine", "factor 2.50",
                     "probe 180 ms against 72 ms", "load average 4.2 at the start of the run", "on 2 CPUs"):
        assert expected in text, (expected, text)
    monkeypatch.setenv(ms.ENV, "4")
    forced = ms.measure(0.0)
    assert forced.factor == 4.0 and forced.forced and f"set by {ms.ENV}" in forced.text()
    monkeypatch.setenv(ms.ENV, "0.5")
    with pytest.raises(ValueError, match=ms.ENV):
        ms.measure(0.0)


def test_a_measured_factor_is_at_least_1_and_at_most_the_cap():
    """Measured here, not through the session's fixture: the hog above may still spin, and the
    browser and Jupyter tests must not inherit a factor taken beside it."""
    import machine_speed as ms

    measured = ms.measure()
    assert 1.0 <= measured.factor <= ms.CAP and measured.probe_s > 0
    assert measured.scale(60) >= 60 and "probe" in measured.text()



def test_a_contradiction_is_reported_as_measured_unless_the_machine_was_busy(busy):
    """A run that points the other way on a quiet machine is what it measured (C02-3): the page says
    so instead of calling it a failed measurement; on a busy machine the load explains it."""
    quiet = finding(CONTRADICTED, "TTFT grows with the prompt", QUIET, "beyond the spread of 3 runs")
    assert quiet.startswith("**This run measured the opposite:**") and "press the button again" in quiet
    assert "Inconclusive" not in quiet and "This run shows it" not in quiet
    loaded = finding(CONTRADICTED, "TTFT grows with the prompt", busy, "beyond the spread of 3 runs")
    _says_inconclusive_not_the_opposite(loaded)
    assert "measured the opposite" not in loaded
