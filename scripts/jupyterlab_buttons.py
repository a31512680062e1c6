"""Press one run button per Jupyter notebook in a real JupyterLab, and read its figure back.

The Jupyter edition (``jupyter/NN_*.ipynb``, built by scripts/build_jupyter.py) draws a part's
figures when its ipywidgets button is pressed. A learner reported blank and cut-off figures there
that no headless run reproduced: a kernel subshell thread closed the pyplot figure while the
button's callback saved it. So this opens each notebook the way a learner does, in JupyterLab
served from the package index's ``jupyterlab`` and driven in Debian's chromium, runs all its cells,
presses one button (the cheapest part that draws a figure) and inspects the PNG the page shows:

* Run All leaves no traceback and no raw "nan" / "None" in the notebook's outputs;
* the status next to the button reports the part's time, not "failed";
* no traceback reaches the output;
* the image decodes, and its ink (pixels that are not near-white) covers at least
  ``MIN_INK_SHARE`` of it and reaches every quarter of it (a blank or a half-drawn figure fails).

Each notebook's kernel is shut down before the next one opens, and the peak resident memory of
the server and its kernels is reported.

    python scripts/jupyterlab_buttons.py              # every notebook
    python scripts/jupyterlab_buttons.py 08 11 --out shots   # some of them, with screenshots

The exit status is 1 when a notebook fails. tests/test_jupyterlab.py uses the same functions.
Needs ``pip install jupyterlab playwright`` and ``apt-get install chromium``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
JUPYTER = REPO / "jupyter"
MIN_INK_SHARE = 0.005  # of the figure's pixels
# The part whose button is pressed in each notebook: the cheapest that draws a figure at the
# quick sizes (measured with the chapters' own `figures`), except 08, whose "predicted vs
# measured" figure is the one the learner saw come out blank.
BUTTONS = {
    "00": "ceilings", "01": "flops", "02": "memory", "03": "equation", "04": "datasheet",
    "05": "tradeoff", "06": "outliers", "07": "equivalence", "08": "cache", "09": "predicted",
    "10": "granularity", "11": "chunking", "12": "variants", "13": "sweep", "14": "scaling",
    "15": "cluster", "16": "tiers",
}


def _marimo_browser() -> Any:
    """scripts/screenshot_notebooks.py, for its chromium(), free port and memory helpers."""
    spec = importlib.util.spec_from_file_location("screenshot_notebooks", REPO / "scripts" / "screenshot_notebooks.py")
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


def jupyterlab_missing() -> str | None:
    """Why this check cannot run here (None when JupyterLab, playwright and chromium are present)."""
    if importlib.util.find_spec("jupyterlab") is None:
        return "jupyterlab is not installed (pip install jupyterlab)"
    return _marimo_browser().browser_missing()


def find_notebooks(selection: list[str] | None = None) -> list[Path]:
    """jupyter/NN_*.ipynb, or those whose name starts with one of ``selection``."""
    paths = sorted(JUPYTER.glob("[0-9][0-9]_*.ipynb"))
    if selection:
        paths = [p for p in paths if any(p.name.startswith(s) for s in selection)]
    return paths


def button_label(notebook: Path) -> tuple[str, str]:
    """(part key, the button's label) for the part pressed in ``notebook``."""
    from infer_lab.course import chapters

    number = notebook.name[:2]
    key = BUTTONS[number]
    chapter = next(m for m in chapters() if m.NUMBER == number)
    return key, chapter.PARTS[key]


@dataclass
class LabServer:
    """A running ``jupyter lab`` on jupyter/, no token, its app exposed to the page's scripts."""

    port: int
    process: subprocess.Popen

    def api(self, path: str, method: str = "GET") -> Any:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/api/{path}", method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None


@contextmanager
def jupyterlab_server(quick: bool = True, startup_s: float = 90) -> Iterator[LabServer]:
    """JupyterLab serving jupyter/ with fresh settings and workspaces (nothing of the user's is read
    or written), no update checks or news, and INFER_LAB_QUICK=1 in its kernels when ``quick``."""
    port = _marimo_browser()._free_port()
    with tempfile.TemporaryDirectory(prefix="infer-lab-jupyterlab-") as home:
        env = dict(os.environ, MPLBACKEND="Agg", JUPYTER_CONFIG_DIR=f"{home}/config",
                   JUPYTER_RUNTIME_DIR=f"{home}/runtime", PYTHONPATH=os.pathsep.join(
                       p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p))
        env.setdefault("OMP_NUM_THREADS", "1")
        if quick:
            env["INFER_LAB_QUICK"] = "1"
        else:
            env.pop("INFER_LAB_QUICK", None)
        command = [
            sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
            "--allow-root", "--IdentityProvider.token=", "--ServerApp.password=", f"--ServerApp.root_dir={JUPYTER}",
            "--LabApp.expose_app_in_browser=True", "--ServerApp.disable_check_xsrf=True", f"--LabApp.workspaces_dir={home}/workspaces",
            f"--LabApp.user_settings_dir={home}/settings", f"--FileCheckpoints.checkpoint_dir={home}/checkpoints", "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ]
        log = tempfile.TemporaryFile(mode="w+")
        process = subprocess.Popen(command, cwd=JUPYTER, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
        server = LabServer(port=port, process=process)
        try:
            deadline = time.monotonic() + startup_s
            while True:
                try:
                    server.api("status")
                    break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        raise RuntimeError(f"jupyter lab did not start:\n{log.read()[-3000:]}") from None
                    time.sleep(0.3)
            yield server
        finally:
            _marimo_browser().stop_server(process)
            log.close()


# JupyterLab's application object (exposed to the page by --LabApp.expose_app_in_browser): open a
# notebook as the file browser does, the state of its kernel, run all as the Run menu does, and
# close it and shut its kernel down, as "Close and Shut Down Notebook" does (without the dialog).
_OPEN_JS = """async (path) => {
  const app = window.jupyterapp;
  const w = await app.commands.execute('docmanager:open', {path, factory: 'Notebook'});
  await w.context.ready; await w.sessionContext.ready;
  app.shell.activateById(w.id);
  return w.id;
}"""
_KERNEL_STATE_JS = """(id) => {
  const app = window.jupyterapp; if (!app) return 'no app';
  const w = [...app.shell.widgets('main')].find(x => x.id === id); if (!w) return 'no notebook';
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  return k ? k.status : 'no kernel';
}"""
_RUN_ALL_JS = """async (id) => {
  const app = window.jupyterapp;
  app.shell.activateById(id);
  await app.commands.execute('notebook:run-all-cells');
  return true;
}"""
_CLOSE_JS = """(id) => {
  const app = window.jupyterapp;
  const w = [...app.shell.widgets('main')].find(x => x.id === id); if (!w) return false;
  const session = w.sessionContext.session && w.sessionContext.session.id;
  w.context.model.dirty = false;
  w.dispose();
  // the kernel shuts down in the background while the next notebook opens
  if (session) fetch('/api/sessions/' + session, {method: 'DELETE'});
  return true;
}"""
# What Run All left in the notebook's outputs: tracebacks, and raw values ("nan", "None") in its
# text (code blocks aside: the library's real code may say None).
_OUTPUTS_JS = """(id) => {
  const w = [...window.jupyterapp.shell.widgets('main')].find(x => x.id === id);
  if (!w) return {found: false};
  const outputs = [...w.node.querySelectorAll('.jp-OutputArea-output')];
  const tracebacks = outputs.map(o => o.innerText).filter(t => t.includes('Traceback'))
    .map(t => t.slice(0, 600));
  const words = new Set();
  for (const o of outputs) {
    const mime = o.getAttribute('data-mime-type') || '';
    if (!mime.startsWith('text/html') && !mime.startsWith('text/markdown')) continue;
    const copy = o.cloneNode(true);
    copy.querySelectorAll('pre, code').forEach(e => e.remove());
    for (const word of (copy.textContent || '').split(/[\\s,;:()\\[\\]]+/)) {
      if (['nan', 'NaN', 'None'].includes(word)) words.add(word);
    }
  }
  return {found: true, outputs: outputs.length, tracebacks, raw_words: [...words]};
}"""
# How much of a figure is drawn: the share of its pixels that are not near-white ("ink"), and
# the ink in each quarter (top left, top right, bottom left, bottom right). A figure that did not
# decode (cut off) reports decoded: false.
INK_JS = """(img) => {
  if (!img.complete || !img.naturalWidth) return {decoded: false};
  const c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const g = c.getContext('2d'); g.drawImage(img, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  let ink = 0; const quarters = [0, 0, 0, 0];
  for (let i = 0; i < d.length; i += 4) {
    if (d[i + 3] > 0 && (d[i] < 235 || d[i + 1] < 235 || d[i + 2] < 235)) {
      ink++;
      const p = i / 4, x = p % c.width, y = Math.floor(p / c.width);
      quarters[(x >= c.width / 2 ? 1 : 0) + (y >= c.height / 2 ? 2 : 0)]++;
    }
  }
  return {decoded: true, width: c.width, height: c.height, ink: ink / (c.width * c.height), quarters};
}"""
# The button's box (its label is unique in the notebook) and what its output area shows now.
_PART_STATE_JS = """([id, label]) => {
  const INK = """ + INK_JS + """;
  const w = [...window.jupyterapp.shell.widgets('main')].find(x => x.id === id);
  if (!w) return {found: false};
  const button = [...w.node.querySelectorAll('button.jupyter-button, button.widget-button')]
    .find(b => b.textContent.trim() === label);
  if (!button) return {found: false};
  button.scrollIntoView({block: 'center'});
  const box = button.closest('.widget-vbox') || button.parentElement.parentElement;
  const status = box.querySelector('.widget-html') ? box.querySelector('.widget-html').innerText : '';
  const imgs = [...box.querySelectorAll('img')].map(INK);
  return {found: true, disabled: button.disabled, status, text: box.innerText, imgs};
}"""


@dataclass
class ButtonReport:
    """What pressing one notebook's button showed."""

    notebook: str
    part: str
    label: str
    seconds: float = 0.0  # the button press, until its part reported
    phases: dict[str, float] = field(default_factory=dict)  # open, kernel, run all, button, close (s)
    status: str = ""
    images: list[dict] = field(default_factory=list)
    error: str = ""
    run_all: dict = field(default_factory=dict)  # what Run All left in the outputs (_OUTPUTS_JS)

    def problems(self) -> list[str]:
        found: list[str] = []
        if self.error:
            found.append(self.error)
        if "failed" in self.status:
            found.append(f"the part failed: {self.status}")
        for trace in self.run_all.get("tracebacks", []):
            found.append(f"Run All left a traceback: {trace[:300]}")
        if self.run_all.get("raw_words"):
            found.append(f"the outputs show raw values: {', '.join(self.run_all['raw_words'])}")
        if not self.images:
            found.append("no figure appeared under the button")
        for i, img in enumerate(self.images):
            if not img.get("decoded"):
                found.append(f"figure {i + 1} did not decode (cut off?)")
            elif img["ink"] < MIN_INK_SHARE:
                found.append(f"figure {i + 1} is blank ({img['ink']:.2%} ink)")
            elif min(img["quarters"]) == 0:
                found.append(f"figure {i + 1} is drawn in only part of its area, blank or cut off elsewhere "
                             f"(ink per quarter {img['quarters']})")
        return found

    def summary(self) -> str:
        problems = self.problems()
        figures = ", ".join(f"{i['width']}x{i['height']} px, {i['ink']:.0%} ink" for i in self.images if i.get("decoded"))
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items())
        head = f"{self.notebook}: '{self.label}' in {self.seconds:.1f} s; {figures or 'no figure'} ({phases})"
        return head + ("" if not problems else "\n  PROBLEM: " + "\n  PROBLEM: ".join(problems))


def _wait(predicate: Any, timeout_s: float, every_s: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every_s)


def press_one_button(page: Any, notebook: Path, timeout_s: float = 90,
                     screenshot_dir: Path | None = None) -> ButtonReport:
    """In a JupyterLab ``page``: open ``notebook``, run all its cells, press its part's button, read
    the figure back, then shut its kernel down and close it."""
    key, label = button_label(notebook)
    report = ButtonReport(notebook=notebook.name, part=key, label=label)
    widget = None
    clock = [time.monotonic()]

    def phase(name: str) -> None:
        clock.append(time.monotonic())
        report.phases[name] = clock[-1] - clock[-2]

    try:
        widget = page.evaluate(_OPEN_JS, notebook.name)
        phase("open")
        if _wait(lambda: page.evaluate(_KERNEL_STATE_JS, widget) == "idle", timeout_s) is False:
            report.error = f"the kernel never became idle ({page.evaluate(_KERNEL_STATE_JS, widget)})"
            return report
        phase("kernel")
        page.evaluate(_RUN_ALL_JS, widget)
        if not _wait(lambda: page.evaluate(_KERNEL_STATE_JS, widget) == "idle"
                     and page.evaluate(_PART_STATE_JS, [widget, label]).get("found"), timeout_s):
            report.error = f"run all did not finish or showed no button '{label}' within {timeout_s:.0f} s"
            return report
        phase("run all")
        report.run_all = page.evaluate(_OUTPUTS_JS, widget)
        button = page.locator(f"#{widget} button.jupyter-button, #{widget} button.widget-button",
                              has_text=label).first
        start = time.monotonic()
        button.click()

        def done() -> dict | None:
            state = page.evaluate(_PART_STATE_JS, [widget, label])
            finished = not state["disabled"] and (" s at " in state["status"] or "failed" in state["status"])
            return state if finished else None

        state = _wait(done, timeout_s)
        report.seconds = time.monotonic() - start
        phase("button")
        if not state:
            report.error = f"the part did not finish within {timeout_s:.0f} s"
            return report
        state = _wait(lambda: (lambda s: s if s["imgs"] and all(i.get("decoded") for i in s["imgs"]) else None)(
            page.evaluate(_PART_STATE_JS, [widget, label])), 2.0) or page.evaluate(_PART_STATE_JS, [widget, label])
        report.status, report.images = state["status"], state["imgs"]
        if "Traceback" in state["text"]:
            report.error = "a traceback reached the output"
        if screenshot_dir is not None:
            screenshot_dir.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot_dir / f"{notebook.stem}.png"))
        return report
    except Exception as exc:  # a page that breaks is a finding, not a crash of the whole pass
        report.error = f"{type(exc).__name__}: {exc}"
        return report
    finally:
        if widget is not None:
            try:
                page.evaluate(_CLOSE_JS, widget)
                phase("close")
            except Exception as exc:
                report.error = report.error or f"closing failed: {exc}"


def _lane(context: Any, server: LabServer, lane: int, notebooks: list[Path], timeout_s: float,
          screenshot_dir: Path | None) -> list[ButtonReport]:
    """One JupyterLab page (its own workspace) that takes ``notebooks`` one after another."""
    page = context.new_page()
    try:
        page.goto(f"http://127.0.0.1:{server.port}/lab/workspaces/lane{lane}?reset", wait_until="domcontentloaded")
        page.wait_for_function("() => window.jupyterapp && window.jupyterapp.started !== undefined", timeout=timeout_s * 1000)
        page.evaluate("async () => { await window.jupyterapp.started; await window.jupyterapp.restored; }")
        return [press_one_button(page, nb, timeout_s, screenshot_dir) for nb in notebooks]
    finally:
        page.close()


@dataclass
class LabPass:
    """One pass through the notebooks in JupyterLab."""

    reports: list[ButtonReport]  # in the order the notebooks were given
    peak_bytes: int  # resident memory of the server and its kernels, at its peak
    kernels_left: int  # kernels still running once every notebook was closed
    seconds: float
    files_written: list[str]  # what the pass left in jupyter/ (nothing: the checkout stays clean)


def check_notebooks(notebooks: list[Path], timeout_s: float = 90, quick: bool = True,
                    screenshot_dir: Path | None = None, lanes: int = 2, startup_s: float = 90) -> LabPass:
    """Every notebook's button pressed in one JupyterLab, ``lanes`` pages at a time (one kernel
    each; a notebook's kernel is shut down when it is closed). ``timeout_s`` bounds each wait,
    ``startup_s`` the server's start."""
    from concurrent.futures import ThreadPoolExecutor

    tool = _marimo_browser()
    start = time.monotonic()
    before = {p for p in JUPYTER.rglob("*")}
    shares = [notebooks[i::lanes] for i in range(lanes)]
    with jupyterlab_server(quick=quick, startup_s=startup_s) as server, tool.PeakMemory(server.process.pid) as peak:
        # Playwright's sync API is bound to its thread: each lane gets its own browser.
        def run(i: int) -> list[ButtonReport]:
            with tool.chromium() as context:
                return _lane(context, server, i, shares[i], timeout_s, screenshot_dir)

        with ThreadPoolExecutor(lanes) as pool:
            results = list(pool.map(run, range(lanes)))
        _wait(lambda: not server.api("kernels"), 30)  # the last shutdowns end in the background
        kernels_left = len(server.api("kernels") or [])
    by_name = {r.notebook: r for lane in results for r in lane}
    written = sorted(str(p.relative_to(JUPYTER)) for p in set(JUPYTER.rglob("*")) - before)
    return LabPass([by_name[nb.name] for nb in notebooks], peak.peak_bytes, kernels_left,
                   time.monotonic() - start, written)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", help="notebook numbers or name prefixes (default: all)")
    parser.add_argument("--out", type=Path, help="save a screenshot of each pressed button's figure here")
    parser.add_argument("--timeout", type=float, default=90, help="seconds for each wait (default 90)")
    parser.add_argument("--full", action="store_true", help="full sizes (INFER_LAB_QUICK unset)")
    parser.add_argument("--lanes", type=int, default=2, help="notebooks open at once, one kernel each (default 2)")
    args = parser.parse_args(argv)
    missing = jupyterlab_missing()
    if missing:
        print(f"cannot run: {missing}", file=sys.stderr)
        return 2
    notebooks = find_notebooks(args.notebooks)
    result = check_notebooks(notebooks, args.timeout, not args.full, args.out, args.lanes)
    for report in result.reports:
        print(report.summary())
    bad = [r for r in result.reports if r.problems()]
    print(f"{len(result.reports) - len(bad)} of {len(result.reports)} notebooks drew their figure in "
          f"{result.seconds:.0f} s; the server and its kernels peaked at {result.peak_bytes / 2**30:.1f} GiB; "
          f"{result.kernels_left} kernels left running after closing every notebook")
    if result.files_written:
        print(f"the pass wrote into jupyter/: {', '.join(result.files_written)}")
    return 1 if bad or result.kernels_left or result.files_written else 0


if __name__ == "__main__":
    raise SystemExit(main())
