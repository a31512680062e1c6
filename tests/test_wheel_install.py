"""A plain install is a real install: the course runs from a wheel installed outside the checkout.

The sdist is built from a copy of the sources (nothing is written into the checkout), the wheel
from that sdist (as pip does with a package from an index), and the wheel is installed with
``--no-deps`` into a fresh virtual environment under ``tmp_path``. That environment borrows this
one's third-party packages through a ``.pth`` line; a directory added that way has its own
``.pth`` files ignored, so the checkout's editable ``infer_lab`` is not on its path. Then, with the
working directory outside the checkout and no ``PYTHONPATH``, it runs ``infer-lab tour --quick
--only ch08`` (which executes the experiments from notebook 08's file), ``infer-lab check 08
--solution`` (the reference solution, package data) and ``marimo export html`` of the course
index located through the installed package (its text quotes a saved result). Each of them
fails when its files did not ship. About a minute on CI's 2 cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "infer_lab"
# What the course reads besides its modules: it must all be in the sdist and in the wheel.
SHIPPED_FOLDERS = ("notebooks", "results", "data", "course/exercises/starters", "course/exercises/solutions",
                   "course/track/starters", "course/track/solutions")
SHIPPED_SUFFIXES = (".py", ".json", ".txt", ".toml")

pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    """Run ``cmd``; its output, or a failure that shows the command and the end of its output."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{output[-4000:]}"
    return proc.stdout


def _shipped_files(package: Path) -> set[str]:
    """Package-relative paths of the data files under ``package`` (``notebooks/08_kv_cache_paged.py``...)."""
    return {path.relative_to(package).as_posix() for folder in SHIPPED_FOLDERS
            for path in (package / folder).rglob("*")
            if path.is_file() and path.suffix in SHIPPED_SUFFIXES and "__pycache__" not in path.parts}


def _build(tmp: Path) -> tuple[Path, Path]:
    """(sdist, wheel) built from a copy of the sources, without the network or build isolation."""
    source = tmp / "source"
    shutil.copytree(ROOT / "src", source / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "__marimo__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    dist = tmp / "dist"
    sdist = dist / _run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                         "print(build_meta.build_sdist(sys.argv[1]))", str(dist)], cwd=source).split()[-1]
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", str(dist), str(sdist)], cwd=tmp)
    (wheel,) = dist.glob("infer_lab-*.whl")
    return sdist, wheel


def _venv_borrowing_these_packages(tmp: Path) -> Path:
    """A fresh virtual environment whose ``sys.path`` ends with this environment's site-packages."""
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
    python = venv / "bin" / "python"
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        cwd=tmp).strip())
    import site

    (purelib / "borrowed_site_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv


def test_a_wheel_installed_outside_the_checkout_runs_the_course(tmp_path):
    sdist, wheel = _build(tmp_path)
    expected = _shipped_files(PACKAGE)
    assert {"notebooks/index.py", "notebooks/08_kv_cache_paged.py", "notebooks/pyproject.toml", "results/h200-hf-baseline-2026-11-30.json",
            "data/gpus.json", "course/exercises/solutions/08_kv_cache_paged.py"} <= expected
    with tarfile.open(sdist) as archive:
        in_sdist = {name.split("/src/infer_lab/", 1)[1] for name in archive.getnames() if "/src/infer_lab/" in name}
    assert not expected - in_sdist, f"missing from the sdist: {sorted(expected - in_sdist)}"
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = {name.removeprefix("infer_lab/") for name in archive.namelist() if name.startswith("infer_lab/")}
    assert not expected - in_wheel, f"missing from the wheel: {sorted(expected - in_wheel)}"

    venv = _venv_borrowing_these_packages(tmp_path)
    python, infer_lab = str(venv / "bin" / "python"), str(venv / "bin" / "infer-lab")
    _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], cwd=tmp_path)

    work = tmp_path / "work"  # outside the checkout; the commands write here
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "INFER_LAB_NOTEBOOKS", "INFER_LAB_RESULTS", "VIRTUAL_ENV")}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", MPLBACKEND="Agg")

    imported = Path(_run([python, "-c", "import infer_lab; print(infer_lab.__file__)"], work, env).strip())
    assert imported.is_relative_to(venv), f"infer_lab imported from {imported}, not from the installed wheel"
    index = Path(_run([infer_lab, "notebooks", "index"], work, env).strip())
    chapter = Path(_run([infer_lab, "notebooks", "08"], work, env).strip())
    assert index.is_relative_to(venv) and chapter.is_relative_to(venv) and chapter.is_file()
    # marimo's settings beside the installed notebooks: they run on open, as in a clone
    settings = _run([python, "-c", "import sys; from marimo._config.manager import PyprojectConfigReader as R; "
                     "print(R(sys.argv[1]).read())", str(chapter)], work, env)
    assert "'auto_instantiate': True" in settings, settings

    tour = _run([infer_lab, "tour", "--quick", "--only", "ch08", "--out", str(work / "tour")], work, env, timeout=600)
    assert "FAILED" not in tour and "## 08 · KV cache" in (work / "tour" / "report.md").read_text()

    check = _run([infer_lab, "check", "08", "--solution"], work, env)
    assert "exercises pass" in check

    _run([python, "-m", "marimo", "export", "html", str(index), "-o", str(work / "index.html")], work, env)
    page = (work / "index.html").read_text()
    assert "KV cache and PagedAttention" in page  # the chapters' table
    assert "Run-button times" in page and "have not been timed" not in page  # a saved result was read
