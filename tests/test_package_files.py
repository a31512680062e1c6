"""The course's files are package data, found through importlib.resources (infer_lab.package_files).

tests/test_wheel_install.py builds and installs a wheel (slow); these check, in a second, that
every file the course reads is named by pyproject.toml's package-data and that every reader
finds it through the package, with the environment overrides still working.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

import infer_lab
from infer_lab.cli import main
from infer_lab.course.notebook_code import notebook_path
from infer_lab.course.saved import load_saved
from infer_lab.package_files import data_path, notebooks_dir, results_dir

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(infer_lab.__file__).parent
READ_AS_FILES = ("notebooks", "starters", "solutions")  # folders of .py files the course reads, not imports


def test_the_files_are_found_inside_the_package():
    assert notebooks_dir() == PACKAGE / "notebooks" and results_dir() == PACKAGE / "results"
    assert notebook_path("08") == PACKAGE / "notebooks" / "08_kv_cache_paged.py"
    assert (notebooks_dir() / "index.py").is_file() and data_path("gpus.json").is_file()
    assert any(r.file.startswith("h200-hf-baseline") for r in load_saved("*.json"))


def test_every_data_file_is_named_by_package_data():
    """Files under the package other than its modules must match a package-data pattern, or a wheel
    leaves them out. The notebooks, starters and solutions are .py files but read as files, so they
    are named there too rather than left to package discovery."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["infer_lab"]
    unlisted = []
    for path in PACKAGE.rglob("*"):
        relative = path.relative_to(PACKAGE).as_posix()
        if not path.is_file() or "__pycache__" in path.parts or "__marimo__" in path.parts:
            continue
        a_module = path.suffix == ".py" and path.parent.name not in READ_AS_FILES
        if not a_module and not any(fnmatch.fnmatch(relative, p) for p in patterns):
            unlisted.append(relative)
    assert not unlisted, f"not in pyproject.toml's package-data: {unlisted}"


def test_the_environment_overrides_still_win(monkeypatch, tmp_path):
    (tmp_path / "08_my_copy.py").write_text("")
    monkeypatch.setenv("INFER_LAB_NOTEBOOKS", str(tmp_path))
    monkeypatch.setenv("INFER_LAB_RESULTS", str(tmp_path / "none"))
    assert notebook_path("08") == tmp_path / "08_my_copy.py"
    assert load_saved("*.json") == []


def test_infer_lab_notebooks_prints_the_folder_or_one_notebook(capsys):
    assert main(["notebooks"]) == 0 and capsys.readouterr().out.strip() == str(notebooks_dir())
    assert main(["notebooks", "8"]) == 0 and capsys.readouterr().out.strip() == str(notebook_path("08"))
    assert main(["notebooks", "index"]) == 0 and capsys.readouterr().out.strip().endswith("index.py")
    assert main(["notebooks", "99"]) == 2 and "expected one notebook 99_" in capsys.readouterr().err


@pytest.mark.parametrize("old", ["notebooks", "assets/results"])
def test_the_old_places_are_links_to_the_one_copy(old):
    """The repository's old paths still work for people and scripts that use them: links, not copies."""
    path = ROOT / old
    if not path.exists():
        pytest.skip(f"{old} is gone")
    assert path.is_symlink() and path.resolve() == (PACKAGE / Path(old).name).resolve()
