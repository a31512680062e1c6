"""What every build-track stage's tests share: a stage's check on the starter, the solution, near misses
and correct variants written differently.

A near miss is the reference solution with one place changed (``old`` -> ``new``, which must occur exactly
once), and the check must fail with ``phrase`` in what it says. A variant is the solution with several
places changed, or a whole file of its own, and the check must pass. Seeds are fixed, so CI is
deterministic; the learner's runs draw fresh ones.
"""

from __future__ import annotations

from pathlib import Path

from infer_lab.course import track

SEED = 20261203  # CI's hidden seed


def source(key: str) -> str:
    return track.solution_path(track.stage(key)).read_text()


def mutated(key: str, changes: dict[str, str]) -> str:
    """The solution of stage ``key`` with each ``old`` replaced by ``new`` (each ``old`` exactly once)."""
    text = source(key)
    for old, new in changes.items():
        assert text.count(old) == 1, f"{old!r} must occur exactly once in the solution of {key}"
        text = text.replace(old, new)
    return text


def check_text(key: str, text: str, tmp_path: Path, fail_fast: bool = False, seed: int = SEED):
    """Stage ``key``'s check on ``text`` written to a file of the stage's name."""
    path = tmp_path / track.stage(key).file
    path.write_text(text)
    return track.check_file(key, path, seed=seed, fail_fast=fail_fast)


def failures(result) -> str:
    return " | ".join(f"{o.case}: {o.detail}" for o in result.outcomes if not o.passed)


def assert_near_miss_caught(key: str, old: str, new: str, phrase: str, tmp_path: Path) -> None:
    result = check_text(key, mutated(key, {old: new}), tmp_path, fail_fast=True)
    assert result.status == "fail", f"the near miss passed: {[o.detail for o in result.outcomes]}"
    said = failures(result)
    assert phrase in said, said


def assert_variant_passes(key: str, text: str, tmp_path: Path) -> None:
    result = check_text(key, text, tmp_path)
    assert result.passed, failures(result)


def solution_result(report, key: str):
    """Stage ``key``'s result in the session's ``track_solutions`` report."""
    return next(r for r in report.stages if r.stage.key == key)
