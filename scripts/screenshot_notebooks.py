"""Open every notebook as a learner does, in headless Chromium, and screenshot it.

`make workshop` runs ``marimo edit`` on the notebooks' folder (``src/infer_lab/notebooks``), and the project's marimo configuration
(``auto_instantiate = true``) runs the cells when a notebook opens. This script serves the
notebooks the same way, opens each one in Debian's chromium through Playwright, waits until
the kernel has finished the run it started on open (without pressing any button), saves a
full-page screenshot and prints what a learner would see: error boxes ("Ancestor stopped",
"Ancestor prevented", exceptions), tracebacks, stderr in the console area (tqdm bars show up
there as red boxes) and which cells have output.

    python scripts/screenshot_notebooks.py                       # every notebook NN_*.py
    python scripts/screenshot_notebooks.py 01 03 --out shots     # some of them
    python scripts/screenshot_notebooks.py --timeout 120 --full  # full sizes (INFER_LAB_QUICK unset)

The exit status is 1 when any notebook shows a problem. tests/test_browser.py uses the same
functions. Needs ``apt-get install chromium`` and ``pip install playwright`` (never
``playwright install``: the system's chromium is launched through ``executable_path``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infer_lab.package_files import notebooks_dir

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = notebooks_dir()

# Headless, and quiet on a machine without network: without the background-networking flags
# Chromium keeps retrying connections that are refused.
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 900}
MAX_SCREENSHOT_HEIGHT_PX = 30_000
BUSY_STATUSES = {"running", "queued"}
# A cell that shows one of these has not run with its current inputs (greyed out for a learner).
STALE_STATUSES = {"outdated", "stale", "disabled-transitively"}
COMPUTED_KINDS = {"text", "table", "image", "chart", "ui", "html"}

# One record per cell, read from the rendered page (marimo's own custom elements draw into
# shadow roots, so text is collected through them).
CELLS_JS = r"""
() => {
  const skip = new Set(["STYLE", "SCRIPT", "NOSCRIPT", "TEMPLATE"]);
  const blocks = /^(P|DIV|LI|TR|TD|TH|H[1-6]|BR|PRE|SECTION)$/;
  function deepText(node) {
    if (node.nodeType === Node.TEXT_NODE) return node.textContent;
    if (node.nodeType !== Node.ELEMENT_NODE && node.nodeType !== Node.DOCUMENT_FRAGMENT_NODE) return "";
    if (node.nodeType === Node.ELEMENT_NODE && skip.has(node.tagName)) return "";
    let text = node.shadowRoot ? deepText(node.shadowRoot) : "";
    for (const child of node.childNodes) text += deepText(child);
    if (node.nodeType === Node.ELEMENT_NODE && blocks.test(node.tagName)) text += " ";
    return text;
  }
  const oneLine = (s) => s.replace(/\s+/g, " ").trim();
  return [...document.querySelectorAll("[data-cell-id]")].map((cell, index) => {
    const status = cell.querySelector('[data-testid="cell-status"]');
    const out = cell.querySelector('[data-cell-role="output"]');
    const consoleArea = cell.querySelector('[data-testid="console-output-area"]');
    const kinds = new Set();
    const callouts = [];
    const errors = [];
    if (out) {
      for (const alert of out.querySelectorAll('[role="alert"]')) {
        const title = alert.querySelector("h5, h4, h3");
        errors.push(oneLine((title ? title.textContent + ": " : "") +
                            deepText(alert).replace(title ? title.textContent : "", "")));
      }
      if (out.querySelector(".markdown")) kinds.add("markdown");
      if (out.querySelector("marimo-table, table")) kinds.add("table");
      if (out.querySelector("img, canvas")) kinds.add("image");
      if (out.querySelector("marimo-vega, marimo-plotly, .vega-embed")) kinds.add("chart");
      if (out.querySelector("marimo-ui-element")) kinds.add("ui");
      if (out.querySelector("pre")) kinds.add("text");
      for (const c of out.querySelectorAll("marimo-callout-output")) {
        let kind = c.getAttribute("data-kind") || "";
        try { kind = JSON.parse(kind); } catch (e) {}
        kinds.add("callout");
        callouts.push({kind: kind, text: oneLine(deepText(c))});
      }
      if (errors.length) kinds.add("error");
      if (!kinds.size && oneLine(deepText(out))) kinds.add("html");
    }
    const clipped = out && out.scrollHeight > out.clientHeight + 4 ? [out.clientHeight, out.scrollHeight] : null;
    const headings = out ? [...out.querySelectorAll("h1")].map((h) => oneLine(h.textContent)) : [];
    const stderr = consoleArea ? [...consoleArea.querySelectorAll(".stderr")].map((e) => e.textContent).join("") : "";
    return {
      index: index,
      cell_id: cell.getAttribute("data-cell-id"),
      status: status ? status.getAttribute("data-status") : null,
      text: out ? oneLine(deepText(out)) : "",
      kinds: [...kinds],
      headings: headings,
      callouts: callouts,
      errors: errors,
      stderr: oneLine(stderr),
      traceback: !!consoleArea && /Traceback/.test(consoleArea.textContent),
      clipped: clipped,
    };
  });
}
"""

# How much taller than the window the notebook is: marimo scrolls an inner element, not the
# document, so a plain full-page screenshot would stop at the window's height.
EXTRA_HEIGHT_JS = r"""
() => {
  let extra = document.documentElement.scrollHeight - window.innerHeight;
  for (const el of document.querySelectorAll("*")) {
    const overflow = getComputedStyle(el).overflowY;
    if ((overflow === "auto" || overflow === "scroll") && el.scrollHeight > el.clientHeight) {
      extra = Math.max(extra, el.scrollHeight - el.clientHeight);
    }
  }
  return Math.max(0, extra);
}
"""


EXPAND_OUTPUTS_CSS = '[data-cell-role="output"] { max-height: none !important; overflow: visible !important; }'


@dataclass
class CellReport:
    """What one cell shows after the notebook opened (read from the page)."""

    index: int
    cell_id: str
    status: str | None
    text: str
    kinds: list[str]
    headings: list[str]
    callouts: list[dict[str, str]]
    errors: list[str]
    stderr: str
    traceback: bool
    clipped: list[int] | None = None  # [shown, total] px when the output scrolls inside its cell

    @property
    def has_output(self) -> bool:
        return bool(self.text or self.kinds)

    @property
    def computed(self) -> bool:
        """An output the kernel computed: more than markdown prose and callouts."""
        return bool(COMPUTED_KINDS & set(self.kinds))

    def problems(self) -> list[str]:
        """What a learner would read as something gone wrong in this cell."""
        where = f"cell {self.index + 1} ({self.cell_id})"
        found = [f"{where}: error box: {_short(e)}" for e in self.errors]
        if self.traceback:
            found.append(f"{where}: traceback in the console area")
        if self.stderr:
            found.append(f"{where}: stderr box: {_short(self.stderr)}")
        found += [f"{where}: red callout: {_short(c['text'])}" for c in self.callouts
                  if c["kind"] == "danger"]
        if self.status in STALE_STATUSES and "markdown" not in self.kinds:
            found.append(f"{where}: not run on open (status {self.status})")
        return found


@dataclass
class NotebookReport:
    """One notebook after it opened: readiness, cells, screenshot."""

    name: str
    seconds: float
    ran: bool
    timed_out: bool
    cells: list[CellReport] = field(default_factory=list)
    busy_cells: list[str] = field(default_factory=list)
    frontend_errors: list[str] = field(default_factory=list)
    screenshot: Path | None = None
    kernel_ready_s: float | None = None
    first_run_s: float | None = None
    runs: int = 0  # runs the kernel completed while the page was open

    def problems(self) -> list[str]:
        found = []
        if self.timed_out:
            busy = ", ".join(self.busy_cells) or "none busy"
            found.append(f"the kernel did not settle in {self.seconds:.0f} s (running or queued: {busy})")
        if not self.ran:
            found.append("nothing ran on open (no completed run from the kernel: is auto_instantiate on?)")
        if not self.cells:
            found.append("no cells rendered")
        for cell in self.cells:
            found += cell.problems()
        return found

    def summary(self) -> str:
        with_output = [c for c in self.cells if c.has_output]
        head = (f"{self.name}: {'timed out' if self.timed_out else 'settled'} after {self.seconds:.1f} s, "
                f"{len(self.cells)} cells, {len(with_output)} with output")
        if self.kernel_ready_s is not None:
            head += f" (kernel up at {self.kernel_ready_s:.1f} s"
            head += f", first run done at {self.first_run_s:.1f} s" if self.first_run_s is not None else ""
            head += f", {self.runs} runs)" if self.runs > 1 else ")"
        if self.screenshot:
            head += f" -> {self.screenshot}"
        problems = self.problems()
        lines = [head, f"  problems: {len(problems) or 'none'}"]
        lines += [f"    - {p}" for p in problems]
        for cell in self.cells:
            shown = ",".join(cell.kinds) if cell.kinds else "no output"
            text = f"  {_short(cell.text, 90)}" if cell.text else ""
            if cell.clipped:
                shown += f" (scrolls: {cell.clipped[0]} of {cell.clipped[1]} px shown)"
            lines.append(f"  cell {cell.index + 1:>2} {cell.cell_id} [{cell.status or '-'}] {shown}{text}")
        if self.frontend_errors:
            lines.append(f"  frontend errors (console): {len(self.frontend_errors)}")
            lines += [f"    - {_short(e)}" for e in self.frontend_errors[:5]]
        return "\n".join(lines)


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def browser_missing() -> str | None:
    """Why the browser check cannot run here (None when chromium and playwright are both present)."""
    if shutil.which("chromium") is None:
        return "chromium is not installed (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package playwright is not installed (pip install playwright)"
    return None


def find_notebooks(selection: list[str] | None = None, folder: Path = NOTEBOOKS) -> list[Path]:
    """``folder``'s NN_*.py (the course index first), or those whose name starts with one of ``selection`` ('02', '03_prefill')."""
    paths = sorted(folder.glob("[0-9][0-9]_*.py"))
    if (folder / "index.py").is_file():  # the course index make workshop opens
        paths.insert(0, folder / "index.py")
    if selection:
        paths = [p for p in paths if any(p.name.startswith(s) or p.stem == s for s in selection)]
    return paths


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class MarimoServer:
    """A running ``marimo edit --headless`` serving one folder of notebooks."""

    folder: Path
    port: int
    process: subprocess.Popen

    def url(self, notebook: Path) -> str:
        return f"http://127.0.0.1:{self.port}/?file={notebook.relative_to(self.folder)}"


@contextmanager
def marimo_server(folder: Path = NOTEBOOKS, quick: bool = True, startup_s: float = 60) -> Iterator[MarimoServer]:
    """``marimo edit`` on ``folder`` with the command line of ``make workshop`` (scripts/workshop.py),
    without a token.

    Its ``--session-ttl`` ends a notebook's kernel a few seconds after its page closes, so one
    server can open the notebooks one after another without piling up kernels. ``quick`` sets
    INFER_LAB_QUICK=1 in the kernels' environment.
    """
    port = _free_port()
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p))
    env.setdefault("OMP_NUM_THREADS", "1")
    if quick:
        env["INFER_LAB_QUICK"] = "1"
    else:
        env.pop("INFER_LAB_QUICK", None)
    log = tempfile.TemporaryFile(mode="w+")
    command = _workshop().marimo_command(port, folder)
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
    try:
        _workshop().wait_until_serving(port, process, startup_s, log=log)
        yield MarimoServer(folder=folder, port=port, process=process)
    finally:
        stop_server(process)
        log.close()


def stop_server(process: subprocess.Popen, grace_s: float = 15) -> None:
    """Terminate a server (and so its kernels); kill it when it has not exited after ``grace_s``."""
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _workshop() -> Any:
    """scripts/workshop.py as a module (the command line of ``make workshop``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("infer_lab_workshop", REPO / "scripts" / "workshop.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants (bytes): the server and its kernels."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total


class PeakMemory:
    """Samples :func:`tree_rss_bytes` of a process every ``every_s`` seconds in a thread; keeps the peak."""

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        import threading

        self.pid, self.every_s = pid, every_s
        self.peak_bytes = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, tree_rss_bytes(self.pid))
            self.samples += 1
            self._stop.wait(self.every_s)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, tree_rss_bytes(self.pid))


@contextmanager
def chromium() -> Iterator[Any]:
    """Debian's chromium through Playwright, headless, with a fresh profile; yields a context."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="infer-lab-chromium-") as profile, sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS, headless=True,
            viewport=VIEWPORT)
        try:
            yield context
        finally:
            context.close()


class _KernelWatch:
    """Follows the notebook's websocket: the kernel's completed runs and its last cell update."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.completed_runs = 0
        self.frames = 0
        self.last_cell_update = self.start
        self.kernel_ready_s: float | None = None  # seconds from opening the page
        self.first_run_s: float | None = None

    def attach(self, websocket: Any) -> None:
        if "/ws" in websocket.url:
            websocket.on("framereceived", self._on_frame)

    def _on_frame(self, payload: Any) -> None:
        try:
            op = json.loads(payload).get("op")
        except (TypeError, ValueError, AttributeError):
            return
        self.frames += 1
        if op == "kernel-ready":
            self.kernel_ready_s = time.monotonic() - self.start
        elif op == "completed-run":
            self.completed_runs += 1
            if self.first_run_s is None:
                self.first_run_s = time.monotonic() - self.start
        elif op in ("cell-op", "execution"):
            self.last_cell_update = time.monotonic()


STATUSES_JS = """
() => [...document.querySelectorAll('[data-cell-id]')].map((c) => {
  const status = c.querySelector('[data-testid="cell-status"]');
  return [c.getAttribute('data-cell-id'), status ? status.getAttribute('data-status') : null];
})
"""


class NotebookVisit:
    """One notebook open in its own page, from opening until its kernel has settled.

    Settled means: the kernel reported at least one completed run (the run it starts on open),
    no cell shows a running or queued status, and no cell update arrived for ``quiet_s``
    seconds. ``timeout_s`` bounds the wait; a notebook that does not settle is reported.
    Several visits can be polled side by side in one browser.
    """

    def __init__(self, context: Any, server: MarimoServer, notebook: Path, timeout_s: float = 60,
                 quiet_s: float = 1.0) -> None:
        self.notebook, self.timeout_s, self.quiet_s = notebook, timeout_s, quiet_s
        self.watch = _KernelWatch()
        self.frontend_errors: list[str] = []
        self.busy: list[str] = []
        self.timed_out = False
        self.page = context.new_page()
        self.page.on("websocket", self.watch.attach)
        self.page.on("pageerror", lambda exc: self.frontend_errors.append(str(exc)))
        self.start = self.last_busy = time.monotonic()
        self.page.goto(server.url(notebook), wait_until="domcontentloaded", timeout=timeout_s * 1000)

    def settled(self) -> bool:
        """Look once; True when the notebook has settled or its time is up."""
        statuses = self.page.evaluate(STATUSES_JS)
        self.busy = [cell for cell, status in statuses if status in BUSY_STATUSES]
        now = time.monotonic()
        if self.busy:
            self.last_busy = now
        quiet = now - max(self.last_busy, self.watch.last_cell_update) >= self.quiet_s
        if statuses and self._ran(s for _, s in statuses) and not self.busy and quiet:
            return True
        self.timed_out = now - self.start >= self.timeout_s
        return self.timed_out

    def _ran(self, statuses: Any) -> bool:
        # Without websocket frames to go by (a future marimo), an idle cell means the kernel ran.
        return self.watch.completed_runs > 0 or (self.watch.frames == 0 and "idle" in set(statuses))

    def finish(self, screenshot_dir: Path | None = None, expand_outputs: bool = True) -> NotebookReport:
        """Read the cells, screenshot the page when asked, and close it."""
        try:
            seconds = time.monotonic() - self.start
            cells = [CellReport(**c) for c in self.page.evaluate(CELLS_JS)]
            report = NotebookReport(
                name=self.notebook.name, seconds=seconds, ran=self._ran(c.status for c in cells),
                timed_out=self.timed_out, cells=cells, busy_cells=self.busy,
                frontend_errors=self.frontend_errors, kernel_ready_s=self.watch.kernel_ready_s,
                first_run_s=self.watch.first_run_s, runs=self.watch.completed_runs)
            if screenshot_dir is not None:
                report.screenshot = _full_page_screenshot(
                    self.page, screenshot_dir / f"{self.notebook.stem}.png", expand_outputs)
            return report
        finally:
            self.page.close()


def open_notebook(context: Any, server: MarimoServer, notebook: Path, timeout_s: float = 60,
                  quiet_s: float = 1.0, screenshot_dir: Path | None = None,
                  expand_outputs: bool = True) -> NotebookReport:
    """Open one notebook, wait until its kernel settles, read its cells and (optionally) screenshot it."""
    visit = NotebookVisit(context, server, notebook, timeout_s, quiet_s)
    while not visit.settled():
        visit.page.wait_for_timeout(250)  # lets Playwright deliver the websocket events meanwhile
    return visit.finish(screenshot_dir, expand_outputs)


def visit_notebooks(context: Any, server: MarimoServer, notebooks: list[Path], timeout_s: float = 60,
                    quiet_s: float = 1.0, screenshot_dir: Path | None = None, expand_outputs: bool = True,
                    parallel: int = 1) -> Iterator[NotebookReport]:
    """Reports for ``notebooks``, as each settles, with up to ``parallel`` of them open at once."""
    waiting, open_now = list(notebooks), []
    while waiting or open_now:
        while waiting and len(open_now) < parallel:
            open_now.append(NotebookVisit(context, server, waiting.pop(0), timeout_s, quiet_s))
        open_now[0].page.wait_for_timeout(250)
        for visit in [v for v in open_now if v.settled()]:
            open_now.remove(visit)
            yield visit.finish(screenshot_dir, expand_outputs)


def _full_page_screenshot(page: Any, path: Path, expand_outputs: bool = True) -> Path:
    """The whole notebook in one PNG; ``expand_outputs`` lifts marimo's height cap on outputs
    so that an output which scrolls inside its cell is shown whole (the report says which)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if expand_outputs:
        page.add_style_tag(content=EXPAND_OUTPUTS_CSS)
    height = VIEWPORT["height"]
    for _ in range(4):  # outputs re-layout at each new height; grow until nothing scrolls
        page.wait_for_timeout(400)
        extra = page.evaluate(EXTRA_HEIGHT_JS)
        if extra == 0 or height >= MAX_SCREENSHOT_HEIGHT_PX:
            break
        height = min(height + extra, MAX_SCREENSHOT_HEIGHT_PX)
        page.set_viewport_size({"width": VIEWPORT["width"], "height": height})
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size(VIEWPORT)
    return path


def check_notebooks(notebooks: list[Path], timeout_s: float = 60, quiet_s: float = 1.0,
                    screenshot_dir: Path | None = None, quick: bool = True, folder: Path = NOTEBOOKS,
                    expand_outputs: bool = True, parallel: int = 1) -> Iterator[NotebookReport]:
    """One marimo server for ``folder`` and one browser; a report per notebook, as each settles."""
    with marimo_server(folder, quick=quick) as server, chromium() as context:
        yield from visit_notebooks(context, server, notebooks, timeout_s, quiet_s, screenshot_dir,
                                   expand_outputs, parallel)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", help="notebook numbers or names (default: all)")
    parser.add_argument("--out", type=Path, default=Path("notebook-screenshots"), help="folder for the PNGs")
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait per notebook")
    parser.add_argument("--quiet", type=float, default=1.0, help="seconds without cell activity = settled")
    parser.add_argument("--parallel", type=int, default=1, help="notebooks open at once (one kernel each)")
    parser.add_argument("--full", action="store_true", help="full sizes (do not set INFER_LAB_QUICK=1)")
    parser.add_argument("--as-seen", action="store_true",
                        help="keep marimo's height cap on outputs (tall outputs scroll inside their cell)")
    args = parser.parse_args(argv)

    missing = browser_missing()
    if missing:
        print(f"cannot run: {missing}", file=sys.stderr)
        return 2
    notebooks = find_notebooks(args.notebooks)
    if not notebooks:
        print(f"no notebook matches {args.notebooks}", file=sys.stderr)
        return 2
    failed = 0
    for report in check_notebooks(notebooks, args.timeout, args.quiet, args.out, quick=not args.full,
                                  expand_outputs=not args.as_seen, parallel=args.parallel):
        print(report.summary(), flush=True)
        failed += bool(report.problems())
    print(f"{len(notebooks) - failed} of {len(notebooks)} notebooks open cleanly; screenshots in {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
