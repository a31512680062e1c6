"""`make workshop`: serve the course's notebooks with marimo and open the course index in the browser.

    python scripts/workshop.py              # what `make workshop` runs
    python scripts/workshop.py --no-browser # serve only (print the address)

The server is ``marimo edit`` on the notebooks' folder (``src/infer_lab/notebooks`` in a clone,
found through :mod:`infer_lab.package_files`) with ``--session-ttl`` (:data:`SESSION_TTL_S`): a
notebook's kernel ends that many seconds after its tab closes, so a pass through the course
keeps one or two kernels alive instead of fifteen (each holds the model and PyTorch, about a
GiB). tests/test_browser.py serves the notebooks with :func:`marimo_command`, the same
command line.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
import webbrowser
from pathlib import Path
from typing import Any

from infer_lab.package_files import notebooks_dir

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = notebooks_dir()
INDEX = "index.py"
# Seconds a kernel outlives its closed tab: long enough to survive a page reload, short enough
# that closing a tab frees its memory before the next chapter's kernel has loaded its model.
SESSION_TTL_S = 5
DEFAULT_PORT = 2718


def marimo_command(port: int, folder: Path = NOTEBOOKS, token: str | None = None,
                   python: str = sys.executable) -> list[str]:
    """The ``marimo edit`` command line of ``make workshop`` (headless: this script opens the browser)."""
    auth = ["--token", "--token-password", token] if token else ["--no-token"]
    return [python, "-m", "marimo", "edit", "--headless", *auth, "--skip-update-check",
            "--no-sandbox", "--session-ttl", str(SESSION_TTL_S), "--port", str(port), str(folder)]


def index_url(port: int, token: str | None = None) -> str:
    """The course index's address on the server of :func:`marimo_command`."""
    url = f"http://localhost:{port}/?file={INDEX}"
    return url + (f"&access_token={token}" if token else "")


def free_port(preferred: int = DEFAULT_PORT) -> int:
    """``preferred`` when it is free, else any free port."""
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port")


def wait_until_serving(port: int, process: subprocess.Popen, timeout_s: float = 60, log: Any = None) -> None:
    """Return once the server answers /health; a clear error when it exits or never answers.

    ``log``: the server's output file, read back (its last 3,000 characters) into the error
    when the server exits early.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = ""
            if log is not None:
                log.seek(0)
                tail = ":\n" + log.read()[-3000:]
            raise RuntimeError(f"marimo exited with status {process.returncode}{tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"marimo did not answer on port {port} within {timeout_s:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser")
    args = parser.parse_args()
    port = free_port(args.port)
    token = secrets.token_urlsafe(16)
    process = subprocess.Popen(marimo_command(port, token=token), cwd=REPO, env=dict(os.environ))
    try:
        wait_until_serving(port, process)
        url = index_url(port, token)
        print(f"\nThe course index: {url}\n(each notebook's kernel stops {SESSION_TTL_S} s after its tab "
              "closes; Ctrl+C here stops the server)\n", flush=True)
        if not args.no_browser:
            webbrowser.open(url)
        return process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    sys.exit(main())
