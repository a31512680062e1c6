"""The Jupyter / Colab setup cell (scripts/build_jupyter.py): it installs only when infer_lab is
missing, from the clone around it, else a wheel or sdist beside it (offline), else the repository's
address when the generator knew it; it says once that it knows none of them; and it says when pip
replaced a package the kernel had already imported (the kernel must restart)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _builder():
    spec = importlib.util.spec_from_file_location("build_jupyter_for_setup", ROOT / "scripts" / "build_jupyter.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


builder = _builder()


def _run(cell: str, monkeypatch, cwd: Path, installed: bool, versions_after: dict[str, str] | None = None):
    """Exec the cell; infer_lab counts as missing unless ``installed``; pip is recorded and, with
    ``versions_after``, 'replaces' those packages."""
    import importlib.util as iu

    calls: list[list[str]] = []
    real_find_spec, real_version = iu.find_spec, importlib.metadata.version
    state = {"after": False}

    def find_spec(name, *args, **kwargs):
        return None if name == "infer_lab" and not installed else real_find_spec(name, *args, **kwargs)

    def check_call(cmd, *args, **kwargs):
        calls.append([str(c) for c in cmd])
        state["after"] = True
        return 0

    def version(name):
        if state["after"] and versions_after and name in versions_after:
            return versions_after[name]
        return real_version(name)

    monkeypatch.setattr(iu, "find_spec", find_spec)
    monkeypatch.setattr(subprocess, "check_call", check_call)
    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.chdir(cwd)
    path_before = list(sys.path)
    try:
        exec(compile(cell, "setup", "exec"), {})
    finally:
        sys.path[:] = path_before
    return calls


def test_the_address_is_built_in_when_known(monkeypatch):
    known = builder.setup_cell("https://github.com/owner/infer-lab")
    assert "REPO_URL = 'https://github.com/owner/infer-lab'" in known
    assert 'REPO_URL = ""' in builder.setup_cell("")
    monkeypatch.setenv("INFER_LAB_REPO_URL", "git@github.com:owner/infer-lab.git")
    assert builder.repository_url() == "https://github.com/owner/infer-lab"
    monkeypatch.setenv("INFER_LAB_REPO_URL", "https://example.org/x/y")
    assert builder.setup_cell().count("https://example.org/x/y") == 1


def test_without_a_clone_it_installs_from_the_known_address(monkeypatch, tmp_path):
    calls = _run(builder.setup_cell("https://example.org/owner/infer-lab"), monkeypatch, tmp_path, installed=False)
    assert calls == [[sys.executable, "-m", "pip", "install", "-q",
                      "infer-lab[widgets] @ git+https://example.org/owner/infer-lab"]]


@pytest.mark.parametrize("file_name", ["infer_lab-0.1.0-py3-none-any.whl", "infer_lab-0.1.0.tar.gz"])
def test_a_wheel_or_sdist_beside_the_notebook_is_installed_offline(monkeypatch, tmp_path, file_name):
    (tmp_path / file_name).write_bytes(b"")
    calls = _run(builder.setup_cell("https://example.org/owner/infer-lab"), monkeypatch, tmp_path, installed=False)
    assert calls == [[sys.executable, "-m", "pip", "install", "-q", f"{tmp_path / file_name}[widgets]"]]


def test_an_unknown_address_is_said_once_and_only_when_nothing_else_can_be_installed(monkeypatch, tmp_path):
    unknown = builder.setup_cell("")
    assert unknown.count("does not know where to install it from") == 1
    with pytest.raises(RuntimeError, match="does not know where to install it from") as error:
        _run(unknown, monkeypatch, tmp_path, installed=False)
    message = str(error.value)
    assert str(tmp_path) in message and "REPO_URL" in message and "wheel" in message
    (tmp_path / "infer_lab-0.1.0-py3-none-any.whl").write_bytes(b"")  # a package file: no message at all
    assert len(_run(unknown, monkeypatch, tmp_path, installed=False)) == 1


def test_nothing_is_installed_when_infer_lab_is_already_importable(monkeypatch, tmp_path):
    assert _run(builder.setup_cell(""), monkeypatch, tmp_path, installed=True) == []


def test_a_package_replaced_under_a_running_kernel_asks_for_a_restart(monkeypatch):
    import torch  # noqa: F401  (this kernel has imported it)

    with pytest.raises(RuntimeError, match="Restart the kernel.*torch"):
        _run(builder.setup_cell(""), monkeypatch, ROOT, installed=False, versions_after={"torch": "0.0.1"})


def test_an_install_that_replaces_nothing_goes_on(monkeypatch):
    calls = _run(builder.setup_cell(""), monkeypatch, ROOT, installed=False)
    assert calls == [[sys.executable, "-m", "pip", "install", "-q", "-e", f"{ROOT}[widgets]"]]


def test_lone_dollars_are_escaped_for_jupyter_math_and_display_math_is_kept():
    text = "- **$ per million output tokens** = $/hour ÷ (tokens/s × 3600)\n\n$$\\text{KV} = 2 \\times L$$"
    out = builder.escape_dollars(text)
    assert out.startswith("- **\\$ per million output tokens** = \\$/hour")
    assert "$$\\text{KV} = 2 \\times L$$" in out
    assert builder.escape_dollars("already \\$ escaped") == "already \\$ escaped"


def test_jupyter_md_sends_lone_dollars_as_their_own_element(monkeypatch):
    from IPython import display as ipd

    from infer_lab.course import jupyter

    shown = []
    monkeypatch.setattr(ipd, "display", lambda obj: shown.append(obj.data))
    jupyter.md("**$ per million** = $/hour\n\n$$a = b$$")
    assert shown == ["**<span>$</span> per million** = <span>$</span>/hour\n\n$$a = b$$"]


def test_text_that_names_marimo_controls_stays_out_of_the_jupyter_edition():
    from infer_lab.course import chapter

    assert builder.jupyter_text("A.\n<!-- marimo -->\nMove the sliders.\n<!-- /marimo -->\nB.") == "A.\nB."
    texts = {n: "\n".join(text for _, text in builder.build(chapter(n)).cells) for n in ("00", "08", "12")}
    assert "Move the sliders" not in texts["12"] and "E / (k·c + v)" in texts["12"]
    assert "max_tokens = oracle" not in texts["08"]
    assert "Install it with" not in texts["00"] and "press the" not in texts["00"]
