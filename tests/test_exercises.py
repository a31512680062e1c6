"""The checks of the checks: they fail on every starter, pass on every solution, and name near misses."""

from __future__ import annotations

import inspect
import types
from pathlib import Path

import pytest

from infer_lab.cli import main
from infer_lab.course import chapter as course_chapter
from infer_lab.course import chapter_names, exercises
from infer_lab.course.exercises import load_file

NUMBERS = exercises.numbers()


def test_every_chapter_has_two_to_four_exercises():
    chapters = {name[2:4] for name in chapter_names()}
    assert chapters <= set(NUMBERS), f"chapters without exercises: {sorted(chapters - set(NUMBERS))}"
    for n in NUMBERS:  # 2-4 in the predict/implement tier, at most one build exercise on top
        tiers = [e.kind == "build" for e in exercises.exercises(n)]
        assert 2 <= tiers.count(False) <= 4 and tiers.count(True) <= 1, n


@pytest.mark.parametrize("number", NUMBERS)
def test_file_names_follow_the_chapter(number):
    mod = exercises.exercise_module(number)
    try:
        assert mod.SLUG == course_chapter(number).SLUG
    except KeyError:
        pass  # the chapter module has not landed yet: the exercise module names it
    assert exercises.starter_path(number).is_file() and exercises.solution_path(number).is_file()


@pytest.mark.parametrize("number", NUMBERS)
def test_every_check_fails_on_the_untouched_starter(number):
    report = exercises.check_file(number, exercises.starter_path(number))
    assert not report.passed
    for result in report.results:
        assert result.status == "todo", (result.exercise.name, result.outcomes)
        assert "NotImplementedError" in result.outcomes[0].detail


@pytest.mark.parametrize("number", NUMBERS)
def test_every_check_passes_on_the_reference_solution(number):
    report = exercises.check_solution(number)
    failures = [(r.exercise.name, o) for r in report.results for o in r.outcomes if not o.passed]
    assert report.passed and not failures, failures
    for result in report.results:  # an implementation is tried on several inputs; a prediction may be one number
        assert len(result.outcomes) >= (2 if result.exercise.kind == "implement" else 1), result.exercise.name


def _call_with_nothing(fn) -> None:
    """Call ``fn`` with ``None`` for every parameter: a starter must raise before it reads any of them."""
    params = inspect.signature(fn).parameters.values()
    fn(*[None for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)],
       **{p.name: None for p in params if p.kind == p.KEYWORD_ONLY})


@pytest.mark.parametrize("number", NUMBERS)
def test_starter_is_signatures_and_docstrings_only(number):
    starter, solution = load_file(exercises.starter_path(number)), load_file(exercises.solution_path(number))
    for ex in exercises.exercises(number):
        for name in ex.functions:
            fn = getattr(starter, name)
            assert inspect.signature(fn) == inspect.signature(getattr(solution, name)), name
            assert inspect.getdoc(fn), f"{name}: the starter must say the task and units"
            with pytest.raises(NotImplementedError):  # nothing done yet: it says what to write and stops
                _call_with_nothing(fn)


# A near miss: (chapter, exercise, text in the solution, its wrong replacement, what the feedback must say)
NEAR_MISSES = [
    ("00", "decode_intensity", "2.0 * batch", "1.0 * batch", "a multiply-add is 2 FLOP"),
    ("00", "mlp_flops", "* 3 *", "* 2 *", "THREE matrices"),
    ("02", "kv_cache_bytes", "2 * layers", "layers", "a K AND a V"),
    ("02", "itl_floor_s", "weight_bytes + batch * context", "weight_bytes + context", "each of the batch"),
    ("03", "kv_gb_70b_128k", "/ 1e9", "/ 2**30", "GiB instead of GB"),
    ("03", "kv_gb_70b_128k", "layers * 2 * kv_heads", "layers * kv_heads", "count both K and V"),
    ("03", "kv_gb_70b_128k", "128 * 1024 / 1e9", "128_000 / 1e9", "not 128,000"),
    ("03", "mla_kv_bytes_per_token", "return layers * (kv_lora_rank", "return (kv_lora_rank",
     "off by the layer count (61)"),
    ("03", "quantized_bytes", "    if group_size:\n        total_bits +=", "    if False:\n        total_bits +=",
     "without their scales"),
    ("03", "max_users", "return max(0, budget // kv_bytes_per_user)", "return budget // kv_bytes_per_user",
     "not a negative number"),
    ("04", "critical_batch_estimate", "* bytes_per_weight / 2", "* bytes_per_weight", "factor of 2"),
    ("04", "roofline_time_s", "return max(flops / peak_flops, n_bytes / bandwidth_Bps)",
     "return flops / peak_flops + n_bytes / bandwidth_Bps", "the roofline takes the slower"),
    ("04", "critical_batch", "    if not compute_bound(max_batch):\n        return None\n", "", "return None"),
    ("05", "usd_per_million_tokens", "/ 3600 ", "", "3600x too large"),
    ("05", "users_at_context", "cached = context if window is None else min(context, window)", "cached = context",
     "sliding-window layer keeps only"),
    ("06", "quantize_int8_absmax", "absmax > 0, absmax / 127", "absmax > 0, absmax / 128", "absmax / 128"),
    ("06", "quantize_int8_absmax", "w.abs().amax(dim=1, keepdim=True)", "w.abs().amax()", "one scale per ROW"),
    ("06", "int4_stored_bytes", "(2 if symmetric else 3)", "2", "without the zero points"),
    ("06", "int8_relative_error", "/ math.sqrt(12) ", "", "its rms is step / sqrt(12)"),
    ("07", "online_softmax_update", "new_acc = output_acc * correction +", "new_acc = output_acc +",
     "output_acc was not rescaled"),
    ("07", "online_softmax_update", "probs = torch.exp(scores - new_max)",
     "probs = torch.exp(scores - new_max + new_max.clamp(max=0))", "max |difference|"),
    ("07", "expand_kv_heads", "kv.repeat_interleave(n_heads // kv.shape[1], dim=1)",
     "kv.repeat(1, n_heads // kv.shape[1], 1, 1)", "repeat_interleave, not repeat"),
    ("07", "mha_over_mla", "mla = mla_layers * (", "mla = (", "the one-layer mistake"),
    ("08", "slots", "block_table[p // block_size] * block_size + p % block_size",
     "block_table[p // block_size] + p % block_size", "which is physical block"),
    ("08", "blocks_needed", "math.ceil(", "math.floor(", "round (cached + new) / block size UP"),
    ("08", "wasted_slots", "-n % block_size", "block_size - n % block_size", "a full last block wastes nothing"),
    ("09", "admit_count", "            break\n        free_blocks", "            continue\n        free_blocks",
     "stop at the first that does not fit"),
    ("09", "batching_steps", 'if policy == "static":', 'if policy == "never":', "got/expected"),
    ("10", "block_hashes", "hash((parent, tuple(", "hash((0, tuple(", "chain the previous"),
    ("10", "reused_tokens", "usable = min(shared, new_prompt_len - 1)", "usable = shared", "always computed"),
    ("11", "chunk_sizes", "room = budget - num_decoding", "room = budget", "one token each of the budget"),
    ("12", "verify_greedy", "return drafts[:accepted] + [target_argmax[accepted]], accepted",
     "return drafts[:accepted], accepted", "at least one token"),
    ("12", "acceptance_probability", "min(1.0, p_token / q_token)", "p_token / q_token", "not a probability"),
    ("12", "acceptance_probability", "return residual / residual.sum()", "return residual", "normalize it"),
    ("12", "acceptance_probability", "residual = (p - q).clamp_min(0)", "residual = p", "must follow p"),
    ("12", "tokens_per_pass", "range(k + 1)", "range(1, k + 1)", "the target's own token comes on top"),
    ("13", "tpot_s", "/ (output_tokens - 1)", "/ output_tokens", "n - 1 gaps"),
    ("13", "itl_and_tpot_means", "sum(gaps) / len(gaps)", "sum(tpots) / len(tpots)", "(that is TPOT)"),
    ("13", "goodput_per_s", "ttft * 1e3 <= ttft_slo_ms", "ttft <= ttft_slo_ms", "got/expected"),
    ("14", "ring_allreduce_s", "steps / n_ranks * message_bytes", "message_bytes", "2(N-1)/N x S"),
    ("14", "ring_allreduce_s", "steps = 2 * (n_ranks - 1)", "steps = n_ranks - 1", "a reduce-scatter AND"),
    ("14", "tp_decode_allreduces", "return 2 * layers,", "return layers,", "after attention AND after the MLP"),
    ("14", "kv_copies", "    if mla:\n        return float(tp)\n", "", "every rank caches all of it"),
    ("15", "colocated_capacity_rps", "output_tokens * decode_step_s / decode_batch", "output_tokens * decode_step_s",
     "a request pays 1/batch"),
    ("15", "step_cost_fit", "return ms - b * mt, b", "return 0.0, sum(t * s for t, s in zip(tokens, seconds)) / "
     "sum(t * t for t in tokens)", "through the origin"),
    ("16", "kv_transfer_s", "context * kv_bytes_per_token / link_Bps", "context * kv_bytes_per_token / (2 * link_Bps)",
     "per-direction bandwidth"),
    ("16", "recompute_over_reload", "(2 * params / peak_flops)", "(params / peak_flops)", "2 FLOP per weight"),
    ("16", "users_with_smaller_kv", "return max(0, kv_budget_bytes // per_user)",
     "return kv_budget_bytes // kv_bytes_per_user * 2", "the old users times two"),
]


@pytest.mark.parametrize("number, name, old, new, phrase", NEAR_MISSES,
                         ids=[f"{n}-{name}-{i}" for i, (n, name, *_) in enumerate(NEAR_MISSES)])
def test_a_near_miss_is_caught_and_named(tmp_path, number, name, old, new, phrase):
    source = exercises.solution_source(number)
    assert source.count(old) == 1, f"the near miss must change exactly one place: {old!r}"
    path = tmp_path / exercises.file_name(number)
    path.write_text(source.replace(old, new))
    report = exercises.check_file(number, path, only=[name])
    assert not report.passed
    details = " | ".join(o.detail for r in report.results for o in r.outcomes if not o.passed)
    assert phrase in details, details


def test_a_numeric_miss_says_expected_got_and_the_ratio(tmp_path):
    source = exercises.solution_source("03").replace("/ 1e9", "/ 2**30")
    path = tmp_path / "mine.py"
    path.write_text(source)
    detail = exercises.check_file("03", path, only=["kv_gb_70b_128k"]).results[0].outcomes[0].detail
    assert detail.startswith("expected 42.9497 GB, got 40 GB (got/expected = 0.9313: GiB instead of GB")


def test_a_file_that_does_not_import_is_reported(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("def ridge_point(:\n")
    report = exercises.check_file("00", path)
    assert not report.passed and "does not import (line 1)" in report.load_error


def test_a_check_in_a_cell():
    report = exercises.check("14", kv_copies=lambda kv_heads, tp, mla: 1.0)
    assert [r.exercise.name for r in report.results] == ["kv_copies"] and not report.passed
    assert "✘" in report.markdown()


def test_cli_init_check_solution(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["check", "08"]) == 2  # no file yet: says how to make one
    assert "--init" in capsys.readouterr().err
    assert main(["check", "08", "--init"]) == 0
    mine = tmp_path / "exercises" / exercises.file_name("08")
    assert mine.read_text() == exercises.starter_path("08").read_text()
    mine.write_text(mine.read_text() + "\n# my work\n")
    assert main(["check", "08", "--init"]) == 0 and mine.read_text().endswith("# my work\n")  # never overwritten
    capsys.readouterr()
    assert main(["check", "08"]) == 1
    assert "TODO" in capsys.readouterr().out
    assert main(["check", "08", "--solution", "--only", "slots", "blocks_needed", "wasted_slots"]) == 0
    assert "3 of 3 exercises pass" in capsys.readouterr().out
    assert main(["check", "08", "--show-solution"]) == 0
    assert "def slots(" in capsys.readouterr().out


def test_the_notebook_section_lists_every_exercise_and_hides_solutions():
    for n in NUMBERS:
        text = exercises.exercises_markdown(n)
        assert f"infer-lab check {n} --init" in text
        for ex in exercises.exercises(n):
            assert ex.title in text and f"`{ex.functions[0]}()`" in text
            if ex.kind == "build":
                assert ex.symbol in text and f"infer-lab check {n} --only {ex.name}" in text
        assert "raise NotImplementedError" not in exercises.solution_markdown(n)


def test_package_data_ships_starters_and_solutions():
    import tomllib

    root = Path(__file__).resolve().parents[1]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["infer_lab"]
    package = root / "src" / "infer_lab"
    shipped = {p for g in globs for p in package.glob(g)}
    for n in NUMBERS:
        assert exercises.starter_path(n) in shipped and exercises.solution_path(n) in shipped


def test_self_paced_guide_is_what_the_script_writes():
    script = _self_paced_script()
    committed = (Path(__file__).resolve().parents[1] / "workshop" / "SELF_PACED.md").read_text()
    assert committed == script.render(), "workshop/SELF_PACED.md is stale: run python scripts/build_self_paced.py"
    for n in NUMBERS:
        assert f"infer-lab check {n} --init" in committed


def test_the_notebook_cell_shows_the_list_and_a_closed_accordion():
    from infer_lab.course import nb

    html = nb.exercises_section("08").text
    assert "Exercises" in html and "infer-lab check 08 --init" in html
    assert "<marimo-accordion" in html and "data-expanded='[]'" in html  # closed until the learner opens it
    assert "reference solutions" in html.split("<marimo-accordion", 1)[1]  # the solution is inside it


def test_a_loop_that_never_ends_is_reported(tmp_path):
    source = exercises.solution_source("08").replace("return max(0, math.ceil(", "while True:\n        pass\n    return max(0, math.ceil(")
    path = tmp_path / "mine.py"
    path.write_text(source)
    ex = next(e for e in exercises.exercises("08") if e.name == "blocks_needed")
    result = exercises.run_exercise(ex, exercises.load_file(path), timeout_s=0.5)
    assert result.status == "fail" and "did not finish within 0.5 s" in result.outcomes[-1].detail


def test_the_workshop_agenda_and_button_times_are_current():
    """workshop/README.md's agenda and button table are generated (scripts/build_workshop.py)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "scripts" / "build_workshop.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------------------------
# Wrong answers that used to pass, right answers that used to be rejected, hints that misdiagnosed

# (chapter, exercise, text in the solution, its wrong replacement, what the feedback must say)
CAUGHT_NOW = [
    ("03", "quantized_bytes", "math.ceil(n_weights / group_size)", "(n_weights // group_size)", "full groups only"),
    ("03", "quantized_bytes", "math.ceil(n_weights / group_size)", "(n_weights / group_size)",
     "a fractional number of groups"),
    ("03", "quantized_bytes", "return math.ceil(total_bits / 8)", "return total_bits // 8", "rounded down"),
    ("03", "kv_gb_70b_128k", "return per_token * 128 * 1024 / 1e9", "return 42.0", "rounded to whole GB"),
    ("03", "max_users", "max(0, budget // kv_bytes_per_user)", "max(0, -(-budget // kv_bytes_per_user))",
     "rounded up"),
    ("05", "users_within_itl_slo", "lo, hi = 0, memory_users", "lo, hi = 0, 1 << 16", "capped by memory_users"),
    ("05", "users_at_context", "cached = context if window is None else min(context, window)",
     "cached = context if window is None else window", "min(context, window)"),
    ("05", "users_at_context", "return max(0, kv_budget_bytes // (kv_bytes_per_token * cached))",
     "return kv_budget_bytes // (kv_bytes_per_token * cached)", "not a negative number"),
    ("07", "mha_over_mla", "return mha / mla", "return mha / mha_layers / (mla / mla_layers)", "different depths"),
    ("07", "mha_over_mla", "mha = mha_layers * heads", "mha = heads", "count MHA's layers"),
    ("12", "ngram_lookup", "range(length - n - 1, -1, -1)", "range(length - n - 2, -1, -1)",
     "ends right where the suffix starts"),
    ("12", "ngram_lookup", "range(length - n - 1, -1, -1)", "range(0, length - n)", "MOST RECENT"),
    ("14", "kv_copies", "return max(1.0, tp / kv_heads)", "return tp * -(-kv_heads // tp) / kv_heads",
     "an uneven split copies nothing"),
]


@pytest.mark.parametrize("number, name, old, new, phrase", CAUGHT_NOW,
                         ids=[f"{n}-{name}-{i}" for i, (n, name, *_) in enumerate(CAUGHT_NOW)])
def test_a_wrong_answer_that_used_to_pass_is_caught(tmp_path, number, name, old, new, phrase):
    test_a_near_miss_is_caught_and_named(tmp_path, number, name, old, new, phrase)


# Each hint names the mistake made, not another: (chapter, exercise, old, new, must say, must not say)
MISDIAGNOSED = [
    ("03", "kv_gb_70b_128k", "return per_token * 128 * 1024 / 1e9", "return 42.0", "rounded", "128,000"),
    ("03", "max_users", "max(0, budget // kv_bytes_per_user)", "max(0, -(-budget // kv_bytes_per_user))",
     "rounded up", "that is the budget without the overhead ("),
    ("04", "critical_batch_estimate", "* bytes_per_weight / 2", "* bytes_per_weight", "2 FLOP", "ridge point itself"),
    ("05", "users_within_itl_slo", "lo, hi = 0, memory_users", "lo, hi = 0, 1 << 16", "memory_users",
     "predict_decode's time_s is in seconds"),
]


@pytest.mark.parametrize("number, name, old, new, says, never", MISDIAGNOSED,
                         ids=[f"{n}-{name}-{i}" for i, (n, name, *_) in enumerate(MISDIAGNOSED)])
def test_a_hint_names_the_mistake_made(tmp_path, number, name, old, new, says, never):
    source = exercises.solution_source(number)
    assert source.count(old) == 1, old
    path = tmp_path / exercises.file_name(number)
    path.write_text(source.replace(old, new))
    report = exercises.check_file(number, path, only=[name])
    details = " | ".join(o.detail for r in report.results for o in r.outcomes if not o.passed)
    assert not report.passed and says in details and never not in details, details


# A right answer written differently: (chapter, exercise, old, new); it must pass
DIFFERENT_BUT_RIGHT = [
    ("10", "block_hashes", "    return hashes\n", "    return tuple(hashes)\n"),
    ("08", "slots", "return [block_table[p // block_size] * block_size + p % block_size for p in range(start, start + count)]",
     "import numpy as np\n    table = np.asarray(block_table)\n    p = np.arange(start, start + count)\n"
     "    return table[p // block_size] * block_size + p % block_size"),
    ("08", "slots", "return [block_table[p // block_size] * block_size + p % block_size for p in range(start, start + count)]",
     "return (block_table[b] * block_size + o for b, o in (divmod(p, block_size) for p in range(start, start + count)))"),
    ("08", "blocks_needed", "return max(0, math.ceil((num_computed + num_new_tokens) / block_size) - blocks_held)",
     "import numpy as np\n    return np.int64(max(0, -(-(num_computed + num_new_tokens) // block_size) - blocks_held))"),
    ("08", "wasted_slots", "return paged, contiguous", "return [paged, contiguous]"),
    ("05", "usd_per_million_tokens", "return usd_per_hour / 3600 / tokens_per_s * 1e6",
     "import torch\n    t = torch.tensor(usd_per_hour)  # float32, torch's default\n"
     "    return float(t / 3600 / tokens_per_s * 1e6)"),
    ("05", "usd_per_million_tokens", "return usd_per_hour / 3600 / tokens_per_s * 1e6",
     "from fractions import Fraction\n    return Fraction(usd_per_hour) / 3600 / Fraction(tokens_per_s) * 10**6"),
    ("12", "acceptance_probability", "return min(1.0, p_token / q_token)",
     "import torch\n    return torch.clamp(torch.tensor(p_token) / torch.tensor(q_token), max=1.0)"),
    ("12", "acceptance_probability", "return residual / residual.sum()", "return (residual / residual.sum()).float()"),
    ("12", "verify_greedy", "return drafts[:accepted] + [target_argmax[accepted]], accepted",
     "return tuple(drafts[:accepted]) + (target_argmax[accepted],), accepted"),
    ("12", "ngram_lookup", "return tokens[start + n:start + n + k]", "return tuple(tokens[start + n:start + n + k])"),
    ("14", "kv_copies", "return max(1.0, tp / kv_heads)",
     "from fractions import Fraction\n    return max(Fraction(1), Fraction(tp, kv_heads))"),
    ("14", "tp_decode_allreduces", "return 2 * layers, batch * hidden * bytes_per_value",
     "import numpy as np\n    return [np.int64(2 * layers), np.int64(batch * hidden * bytes_per_value)]"),
    ("15", "step_cost_fit", "    b = cov / var\n    return ms - b * mt, b\n",
     "    import numpy as np\n    b, a = np.polyfit(tokens, seconds, 1)\n    return [a, b]\n"),
]


@pytest.mark.parametrize("number, name, old, new", DIFFERENT_BUT_RIGHT,
                         ids=[f"{n}-{name}-{i}" for i, (n, name, *_) in enumerate(DIFFERENT_BUT_RIGHT)])
def test_a_right_answer_written_differently_passes(tmp_path, number, name, old, new):
    source = exercises.solution_source(number)
    assert source.count(old) == 1, old
    path = tmp_path / exercises.file_name(number)
    path.write_text(source.replace(old, new))
    report = exercises.check_file(number, path, only=[name])
    failures = [o for r in report.results for o in r.outcomes if not o.passed]
    assert report.passed, failures


def test_a_float_miss_prints_the_digits_that_differ():
    from infer_lab.course.exercises.checking import Report, ratio_text

    r = Report()
    r.close("case", 10.2237 * (1 + 1e-5), 10.2237)
    detail = r.outcomes[0].detail
    assert not r.passed and "10.2237, got 10.2238" in detail or "10.22370" in detail, detail
    assert "0.0%" not in detail and "0.001%" in detail, detail
    assert "exactly" not in ratio_text(146.1, 1.0) and "about 146x" in ratio_text(146.1, 1.0)
    assert "exactly 146x" in ratio_text(146.0, 1.0)


def test_a_generator_or_array_answer_is_read_as_its_values():
    import numpy as np

    from infer_lab.course.exercises.checking import plain

    assert plain((1, 2)) == [1, 2] and plain(x for x in (1, 2)) == [1, 2]
    assert plain(np.array([3, 4])) == [3, 4] and type(plain(np.int64(3))) is int
    assert plain(([1], 2)) == [[1], 2] and plain("ab") == "ab" and plain(None) is None


# ---------------------------------------------------------------------------------------------
# The build tier: the learner's code inside the real engine, token for token against transformers

BUILD = [(n, ex.name) for n in NUMBERS for ex in exercises.exercises(n) if ex.kind == "build"]

# (chapter, exercise, text in the solution, its wrong replacement, what the feedback must say)
BUILD_NEAR_MISSES = [
    ("06", "int8_engine", "amax(dim=1, keepdim=True)", "amax(dim=0, keepdim=True)", "one scale per COLUMN"),
    ("06", "int8_engine", ".clamp(-127, 127).to(torch.int8)", ".clamp(-127, 127)", "codes should be int8"),
    ("06", "int8_engine", "w.abs().amax(dim=1, keepdim=True)", "w.abs().amax()", "one scale for the whole tensor"),
]


def test_the_build_tier_left_in_the_chapters_is_chapter_06s_int8_engine():
    """The engine's components are the build track's stages now (tests/test_track_*.py); chapter 06 keeps
    its quantizer inside the engine (quantization is not an engine component)."""
    assert BUILD == [("06", "int8_engine")]
    ex = exercises.exercises("06")[-1]
    assert ex.symbol.startswith("src/infer_lab/engine/") and "::" in ex.symbol
    assert sum(1 for c in BUILD_NEAR_MISSES if c[:2] == ("06", "int8_engine")) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("number, name, old, new, phrase", BUILD_NEAR_MISSES,
                         ids=[f"{n}-{name}-{i}" for i, (n, name, *_) in enumerate(BUILD_NEAR_MISSES)])
def test_a_build_near_miss_is_caught_in_the_engine(tmp_path, number, name, old, new, phrase):
    test_a_near_miss_is_caught_and_named(tmp_path, number, name, old, new, phrase)


def test_json_says_which_exercises_ran_the_engine(capsys):
    import json

    assert main(["check", "08", "--solution", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    by_name = {e["name"]: e for e in report["exercises"]}
    assert report["passed"] and by_name["slots"]["kind"] == "implement"
    assert by_name["slots"]["ran_engine"] is False and by_name["slots"]["tokens_identical"] is None


def test_the_plug_points_left_default_to_the_librarys_own_code():
    from infer_lab.engine import EngineModel
    from infer_lab.quant.formats import quantize_int8_absmax

    assert inspect.signature(EngineModel.quantized).parameters["int8_quantizer"].default is quantize_int8_absmax


def test_the_int8_build_names_the_mistake_made():
    """The invariants' diagnoses, on a small weight (no engine): each wrong quantizer or dequantizer gets its hint."""
    import torch

    from infer_lab.course.exercises import ex06_quantization as ex06
    from infer_lab.quant.formats import quantize_int8_absmax

    w = torch.randn(6, 40, generator=torch.Generator().manual_seed(3))
    absmax = w.abs().amax(dim=1, keepdim=True)
    q, s = quantize_int8_absmax(w)
    assert ex06._scale_problem(w, s, "w") is None and ex06._roundtrip_problem(w, q, s, q.float() * s, "w") is None
    assert ex06._scale_problem(w, s.double() * (1 + 1e-7), "w") is None  # absmax / 127 computed another way

    def roundtrip(codes, scale, deq=None):
        return ex06._roundtrip_problem(w, codes, scale, codes.float() * scale if deq is None else deq, "w")

    assert "truncated toward zero" in roundtrip((w / s).trunc().to(torch.int8), s)
    assert "rounded down (floor)" in roundtrip((w / s).floor().to(torch.int8), s)
    assert "divides by the scale" in roundtrip(q, s, q.float() / s)
    assert "each row times its own scale" in roundtrip(q, s, q.float() * s[0])
    small = absmax / 128
    assert "absmax / 128" in ex06._scale_problem(w, small, "w")
    assert "beyond the largest code" in roundtrip(torch.round(w / small).clamp(-127, 127).to(torch.int8), small)
    assert "wraps to -128" in roundtrip(torch.round(w / small).to(torch.int32).to(torch.int8), small)
    whole = (w.abs().amax() / 127).expand(6, 1)
    assert "every row has the same scale" in ex06._scale_problem(w, whole, "w")
    assert "divide it by 127" in ex06._scale_problem(w, absmax, "w")
    with pytest.raises(ex06._Unusable, match="one scale for the whole tensor"):
        ex06._codes_and_scales((q, s.max()), w, "w")
    with pytest.raises(ex06._Unusable, match="codes should be int8"):
        ex06._codes_and_scales((q.float(), s), w, "w")
    codes, scales = ex06._codes_and_scales((q.numpy(), s.reshape(-1).double().numpy()), w, "w")  # numpy, (out,), f64
    assert codes.dtype == torch.int8 and scales.shape == (6, 1) and scales.dtype == torch.float32

    from infer_lab.course.exercises.checking import Report

    source = exercises.solution_source("06")
    for old, new, phrase in (("torch.where(absmax > 0, absmax / 127, torch.ones_like(absmax))", "absmax / 127",
                              "an all-zero row needs a positive scale"), (None, None, None)):
        learner = types.ModuleType("learner")
        exec(source if old is None else source.replace(old, new), learner.__dict__)
        report = Report()
        ex06._check_pruned_row(learner, report, w, 2, "a pruned row")
        assert report.outcomes[0].passed is (phrase is None), report.outcomes
        assert phrase is None or phrase in report.outcomes[0].detail


@pytest.mark.slow
def test_a_rounding_that_breaks_ties_another_way_passes_the_int8_engine(tmp_path):
    """Half away from zero instead of torch.round's half to even: codes differ at exact ties only (common in
    weights stored in bf16), a greedy token may flip, and the check accepts it within the quality bounds."""
    source = exercises.solution_source("06")
    old = "torch.round(w / scale)"
    assert source.count(old) == 1
    path = tmp_path / exercises.file_name("06")
    path.write_text(source.replace(old, "(torch.floor((w / scale).abs() + 0.5) * torch.sign(w))"))
    result = exercises.check_file("06", path, only=["int8_engine"]).results[0]
    assert result.passed, [o for o in result.outcomes if not o.passed]
    assert result.ran_engine
    engine_case = next(o for o in result.outcomes if o.case.startswith("the int8 engine"))
    assert "exact ties" in engine_case.detail


def _self_paced_script():
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("build_self_paced", root / "scripts" / "build_self_paced.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_a_times_file_merged_from_several_runs_names_each_date():
    """`time_chapters.py --only` merges into the newest file: the guide then says which chapters ran when."""
    script = _self_paced_script()
    env = {"date": "2026-12-05T09:00:00+00:00"}
    one_run = {"data": {"chapters": {"01": {"measured": "2026-12-05"}, "02": {}}}}
    assert script.measured_dates(one_run, env) == "2026-12-05"
    merged = {"data": {"chapters": {"01": {"measured": "2026-12-05"}, "02": {"measured": "2026-12-04"},
                                    "03": {"measured": "2026-12-04"}}}}
    assert script.measured_dates(merged, env) == "chapter 01 on 2026-12-05; chapters 02, 03 on 2026-12-04"
    merged["data"]["chapters"]["01"]["hardware"] = "CPU: another"  # a run on another machine says which
    assert script.measured_dates(merged, env) == ("chapter 01 on 2026-12-05 (CPU: another); "
                                                  "chapters 02, 03 on 2026-12-04 (an unrecorded machine)")


def test_a_chapter_package_counts_the_prose_of_all_its_parts():
    """Chapter 12 is a package: its reading time counts the ``*_text`` functions of every part file."""
    from infer_lab.course import chapter

    script = _self_paced_script()
    package = Path(chapter("speculative_decoding").__file__)
    assert package.name == "__init__.py"
    assert script.chapter_prose_words(package) > script.chapter_prose_words(package.with_name("whole.py")) > 0
