"""The page's "vLLM and SGLang" section: how to measure them on a GPU, and what is saved of them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ... import launchers
from ...package_files import results_dir

GPU_MODEL = "mistralai/Mistral-7B-Instruct-v0.3"


GPU_PORT = 8000  # every engine in turn on the same port, so the same loadgen line reaches each


def gpu_commands(model: str = GPU_MODEL, port: int = GPU_PORT) -> list[str]:
    """The commands that measure vLLM and SGLang with the same loadgen, one engine at a time: for
    each engine, launch it on ``port``, drive it, save under ``results/<engine>``, stop it."""
    commands = []
    for engine in launchers.ENGINES:
        commands += [
            f"infer-lab engines launch {engine} --model {model} --port {port} --prefix-caching on",
            f"infer-lab loadgen --url http://127.0.0.1:{port} --model {model} --workload agentic "
            f"--concurrency 1,4,16,64 --repeats 3 --out results/{engine}",
            f"infer-lab engines stop {engine}",
        ]
    return commands


def engines_text(model: str = GPU_MODEL) -> str:
    """Which engines this machine has, and how to measure them on a GPU box (markdown)."""
    installed = launchers.which_engines()
    status = ", ".join(f"{e}: {'installed ' + str(d['version']) if d['installed'] else 'not installed'}"
                       for e, d in installed.items())
    launch = " ".join(launchers.build_command("vllm", launchers.EngineOptions(model=model), python="python"))
    return "\n".join([
        f"Here, in this Python: {status} (vLLM's CPU build, above, runs from a virtual environment of its "
        "own). On a GPU box with them installed, each engine in turn is started on the same port, "
        "driven by the same loadgen into a folder of its own, and stopped before the next one starts:", "", "```bash", *gpu_commands(model), "```", "",
        f"`launch` runs, for vLLM, `{launch}`, waits for `/health`, and records the version and the PID.",
    ])


@dataclass(frozen=True)
class SavedEngineRun:
    """A saved result file that holds numbers of vLLM or SGLang, and on what kind of device."""

    file: str  # the file's name under the results folder
    engine: str  # the server as the file labels it, e.g. "vLLM 0.32.0 (CPU build)"
    device_kind: str  # the measuring machine's device kind: "cpu", "cuda", ...


NAMED_ENGINES = ("vllm", "sglang")  # the contender names of the engines this section is about


def saved_engine_runs(folder: Path | None = None) -> list[SavedEngineRun]:
    """Every vLLM or SGLang server in the saved ``*engines*.json`` results of ``folder`` (default: the
    package's results folder), one entry per file and server."""
    folder = folder or results_dir()
    out = []
    for path in sorted(folder.glob("*engines*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text())
            servers = data["servers"]
            kind = str((data.get("environment") or {}).get("device_kind", "unknown"))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        entries = ([(s.get("contender", ""), s.get("label") or s.get("contender", "")) for s in servers]
                   if isinstance(servers, list) else
                   [(name, f"{name} {info.get('version', '')}".strip()) for name, info in servers.items()])
        out += [SavedEngineRun(path.name, label, kind) for contender, label in entries
                if str(contender).startswith(NAMED_ENGINES)]
    return out


def gpu_note(runs: list[SavedEngineRun] | None = None) -> str:
    """What is saved of vLLM and SGLang (default: :func:`saved_engine_runs`), and what is missing on a
    GPU (markdown)."""
    runs = saved_engine_runs() if runs is None else runs
    on_gpu = [r for r in runs if r.device_kind != "cpu"]
    on_cpu = [r for r in runs if r.device_kind == "cpu"]

    def listed(rs: list[SavedEngineRun]) -> str:
        return ", ".join(f"{r.engine} (`{r.file}`)" for r in rs)

    if on_gpu:
        return (f"**Saved vLLM or SGLang runs not on a CPU:** {listed(on_gpu)}. This page does not draw them; "
                "read them with the loadgen report, and add a run of each engine with the commands in the notebook's \"vLLM and SGLang\" section.")
    cpu = (f"The saved vLLM or SGLang numbers here are CPU runs: {listed(on_cpu)}."
           if on_cpu else "Nor is any CPU run of them saved.")
    return ("**No saved vLLM or SGLang results from a GPU exist in `src/infer_lab/results/` yet**, so nothing "
            f"measured on a GPU is shown for them here. {cpu} Run the commands of the notebook's \"vLLM and SGLang\" section on a GPU and save the loadgen "
            "JSON as `src/infer_lab/results/<gpu>-engines-<date>.json`.")
