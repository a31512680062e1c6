"""Start and stop real serving engines (vLLM, SGLang) as subprocesses, for fair comparisons.

Each launch builds the engine's own command line from a few documented switches, starts it in
its own process group with its log in a file, waits until its ``/health`` answers, records
its version and writes a state file (PID, URL, command, version). ``stop`` reads that file and
ends the process group by PID. Engines that are not installed fail at once with what to do.

The switches, and the engine flags they become:

==================  =========================================  ===============================
switch              vLLM                                       SGLang
==================  =========================================  ===============================
prefix_caching      ``--enable-prefix-caching`` / ``--no-...`` radix cache on, or
                                                               ``--disable-radix-cache``
kv_cache_dtype      ``--kv-cache-dtype fp8``                   ``--kv-cache-dtype fp8_e5m2``
chunked_prefill     ``--enable-chunked-prefill``               ``--chunked-prefill-size N``
speculative=ngram   ``--speculative-config {"method":"ngram",   ``--speculative-algorithm NGRAM``
                    "num_speculative_tokens":K,...}``          (CUDA only)
speculative=eagle   ``--speculative-config {"method":"eagle",   ``--speculative-algorithm EAGLE
                    "model":DRAFT,"num_speculative_tokens":K}`` --speculative-draft-model-path
                    (``eagle3`` likewise)                      DRAFT --speculative-num-steps K
                                                               --speculative-eagle-topk 1
                                                               --speculative-num-draft-tokens K+1``
tensor_parallel     ``--tensor-parallel-size N``               ``--tp-size N``
pipeline_parallel   ``--pipeline-parallel-size N``             ``--pp-size N``
data_parallel       ``--data-parallel-size N``                 ``--dp-size N``
disaggregation      ``--kv-transfer-config {"kv_connector":    ``--disaggregation-mode
                    "NixlConnector","kv_role":"kv_producer"}`` prefill|decode``,
                    (prefill) / ``kv_consumer`` (decode)       ``--disaggregation-transfer-backend
                                                               mooncake|nixl``
==================  =========================================  ===============================

Disaggregated prefill runs two launches (one ``disaggregation="prefill"``, one ``"decode"``,
on different GPUs) plus a router in front: SGLang ships one
(:func:`pd_router_command`: ``python -m sglang_router.launch_router --pd-disaggregation``);
vLLM's docs use a proxy script from its repository (``toy_proxy_server.py`` next to its NIXL
tests), which is not part of the installed package. For multi-node serving, KV-aware routing
and autoscaled prefill/decode pools use NVIDIA Dynamo (github.com/ai-dynamo/dynamo) or llm-d
(github.com/llm-d/llm-d); they run vLLM and SGLang workers with these same flags.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from .analysis.capacity import recommend
from .catalog import load_model_config

ENGINES = ("vllm", "sglang")
DISAGGREGATION_ROLES = ("prefill", "decode")
VLLM_KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
SGLANG_TRANSFER_BACKENDS = ("mooncake", "nixl")
DISTRIBUTED_POINTERS = {
    "dynamo": "NVIDIA Dynamo: disaggregated serving, KV-aware routing, multi-node (github.com/ai-dynamo/dynamo)",
    "llm-d": "llm-d: Kubernetes-native distributed inference on vLLM, prefill/decode pools (github.com/llm-d/llm-d)",
}
INSTALL_HINT = {
    "vllm": "pip install vllm  (Linux + NVIDIA GPU; see docs.vllm.ai for the CUDA build matching your driver)",
    "sglang": "pip install 'sglang[all]'  (Linux + NVIDIA GPU; see docs.sglang.ai)",
}


class EngineNotInstalledError(RuntimeError):
    """The engine's Python package is not importable here."""


@dataclass
class EngineOptions:
    """What to launch and with which optimizations (``None`` keeps the engine's default)."""

    model: str
    port: int = 8000
    host: str = "127.0.0.1"
    tensor_parallel: int = 1
    prefix_caching: bool | None = None
    kv_cache_dtype: str | None = None  # e.g. "fp8"
    chunked_prefill: bool | None = None
    chunked_prefill_size: int = 2048  # SGLang's chunk size in tokens when chunked_prefill is on
    speculative: str | None = None  # "ngram", "eagle" or "eagle3" (EAGLE needs speculative_model)
    num_speculative_tokens: int = 4  # tokens proposed per step (K)
    speculative_model: str | None = None  # the EAGLE draft head, e.g. yuhuili/EAGLE-LLaMA3.1-Instruct-8B
    max_model_len: int | None = None
    pipeline_parallel: int = 1
    data_parallel: int = 1
    disaggregation: str | None = None  # "prefill" or "decode": one side of a disaggregated pair
    kv_connector: str = "NixlConnector"  # vLLM's KV-transfer connector
    transfer_backend: str = "mooncake"  # SGLang's KV transfer engine: mooncake or nixl
    ib_device: str | None = None  # SGLang --disaggregation-ib-device (e.g. mlx5_0)
    bootstrap_port: int | None = None  # SGLang --disaggregation-bootstrap-port (prefill side)
    extra_args: list[str] = field(default_factory=list)

    @property
    def n_gpus(self) -> int:
        """GPUs this launch uses: tensor x pipeline x data parallel sizes."""
        return self.tensor_parallel * self.pipeline_parallel * self.data_parallel


SPECULATIVE_METHODS = ("ngram", "eagle", "eagle3")


def _check_speculative(opts: EngineOptions) -> None:
    if opts.speculative not in SPECULATIVE_METHODS:
        raise ValueError(f"speculative must be one of {', '.join(SPECULATIVE_METHODS)}, got {opts.speculative!r}")
    if opts.speculative.startswith("eagle") and not opts.speculative_model:
        raise ValueError("EAGLE drafts from a trained head: give its hub id as speculative_model "
                         "(--speculative-model), e.g. yuhuili/EAGLE-LLaMA3.1-Instruct-8B")
    if opts.num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {opts.num_speculative_tokens}")


def _vllm_speculative_config(opts: EngineOptions) -> dict[str, Any]:
    """vLLM's ``--speculative-config`` JSON (its docs' field names)."""
    _check_speculative(opts)
    if opts.speculative == "ngram":
        return {"method": "ngram", "num_speculative_tokens": opts.num_speculative_tokens,
                "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    return {"method": opts.speculative, "model": opts.speculative_model,
            "num_speculative_tokens": opts.num_speculative_tokens}


def _sglang_speculative_flags(opts: EngineOptions) -> list[str]:
    """SGLang's speculative flags: a chain of K drafted tokens (top-k 1), verified K + 1 at a time."""
    _check_speculative(opts)
    flags = ["--speculative-algorithm", {"ngram": "NGRAM", "eagle": "EAGLE", "eagle3": "EAGLE3"}[opts.speculative]]
    if opts.speculative_model:
        flags += ["--speculative-draft-model-path", opts.speculative_model]
    return flags + ["--speculative-num-steps", str(opts.num_speculative_tokens),
                    "--speculative-eagle-topk", "1",
                    "--speculative-num-draft-tokens", str(opts.num_speculative_tokens + 1)]


def is_installed(engine: str) -> bool:
    """Whether the engine's package can be imported by this Python."""
    _check_name(engine)
    return importlib.util.find_spec(engine) is not None


def _check_name(engine: str) -> None:
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")


def build_command(engine: str, opts: EngineOptions, python: str | None = None) -> list[str]:
    """The engine's command line for ``opts`` (no side effects; shown by ``--dry-run``)."""
    _check_name(engine)
    for name in ("tensor_parallel", "pipeline_parallel", "data_parallel"):
        if getattr(opts, name) < 1:
            raise ValueError(
                f"{name.replace('_', ' ')} size must be >= 1, got {getattr(opts, name)}"
            )
    if opts.disaggregation is not None and opts.disaggregation not in DISAGGREGATION_ROLES:
        raise ValueError(
            f"disaggregation must be one of {', '.join(DISAGGREGATION_ROLES)}, got {opts.disaggregation!r}"
        )
    py = python or sys.executable
    if engine == "vllm":
        cmd = [
            py,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            opts.model,
            "--host",
            opts.host,
            "--port",
            str(opts.port),
            "--tensor-parallel-size",
            str(opts.tensor_parallel),
        ]
        if opts.prefix_caching is not None:
            cmd.append(
                "--enable-prefix-caching" if opts.prefix_caching else "--no-enable-prefix-caching"
            )
        if opts.kv_cache_dtype:
            cmd += ["--kv-cache-dtype", opts.kv_cache_dtype]
        if opts.chunked_prefill is not None:
            cmd.append(
                "--enable-chunked-prefill"
                if opts.chunked_prefill
                else "--no-enable-chunked-prefill"
            )
        if opts.speculative:
            cmd += ["--speculative-config", json.dumps(_vllm_speculative_config(opts))]
        if opts.max_model_len:
            cmd += ["--max-model-len", str(opts.max_model_len)]
        if opts.pipeline_parallel > 1:
            cmd += ["--pipeline-parallel-size", str(opts.pipeline_parallel)]
        if opts.data_parallel > 1:
            cmd += ["--data-parallel-size", str(opts.data_parallel)]
        if opts.disaggregation:
            config = {
                "kv_connector": opts.kv_connector,
                "kv_role": VLLM_KV_ROLES[opts.disaggregation],
            }
            cmd += ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
    else:
        cmd = [
            py,
            "-m",
            "sglang.launch_server",
            "--model-path",
            opts.model,
            "--host",
            opts.host,
            "--port",
            str(opts.port),
            "--tp-size",
            str(opts.tensor_parallel),
        ]
        if opts.prefix_caching is False:
            cmd.append("--disable-radix-cache")
        if opts.kv_cache_dtype:
            cmd += [
                "--kv-cache-dtype",
                "fp8_e5m2" if opts.kv_cache_dtype == "fp8" else opts.kv_cache_dtype,
            ]
        if opts.chunked_prefill is not None:
            cmd += [
                "--chunked-prefill-size",
                str(opts.chunked_prefill_size if opts.chunked_prefill else -1),
            ]
        if opts.speculative:
            cmd += _sglang_speculative_flags(opts)
        if opts.max_model_len:
            cmd += ["--context-length", str(opts.max_model_len)]
        if opts.pipeline_parallel > 1:
            cmd += ["--pp-size", str(opts.pipeline_parallel)]
        if opts.data_parallel > 1:
            cmd += ["--dp-size", str(opts.data_parallel)]
        if opts.disaggregation:
            if opts.transfer_backend not in SGLANG_TRANSFER_BACKENDS:
                raise ValueError(
                    f"SGLang transfer backend must be one of {', '.join(SGLANG_TRANSFER_BACKENDS)}, "
                    f"got {opts.transfer_backend!r}"
                )
            cmd += [
                "--disaggregation-mode",
                opts.disaggregation,
                "--disaggregation-transfer-backend",
                opts.transfer_backend,
            ]
            if opts.ib_device:
                cmd += ["--disaggregation-ib-device", opts.ib_device]
            if opts.bootstrap_port:
                cmd += ["--disaggregation-bootstrap-port", str(opts.bootstrap_port)]
    return cmd + list(opts.extra_args)


def pd_router_command(
    engine: str,
    prefill_urls: list[str],
    decode_urls: list[str],
    port: int = 8000,
    host: str = "0.0.0.0",
    bootstrap_ports: list[int | None] | None = None,
    python: str = "python",
) -> list[str]:
    """The router in front of a disaggregated pair (SGLang's ``sglang_router``).

    One ``--prefill URL [BOOTSTRAP_PORT]`` per prefill server and one ``--decode URL`` per
    decode server, as in SGLang's PD disaggregation docs. vLLM has no router in its package
    (its docs use a proxy script from the repository): this raises and names the options.
    """
    _check_name(engine)
    if not prefill_urls or not decode_urls:
        raise ValueError("a PD router needs at least one prefill URL and one decode URL")
    if engine == "vllm":
        raise ValueError(
            "vLLM ships no PD router: use the proxy from its docs "
            "(tests/v1/kv_connector/nixl_integration/toy_proxy_server.py in the vLLM repository), "
            f"or {DISTRIBUTED_POINTERS['dynamo']}, or {DISTRIBUTED_POINTERS['llm-d']}"
        )
    cmd = [python, "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    ports = bootstrap_ports or [None] * len(prefill_urls)
    if len(ports) != len(prefill_urls):
        raise ValueError("give one bootstrap port (or None) per prefill URL")
    for url, boot in zip(prefill_urls, ports, strict=True):
        cmd += ["--prefill", url] + ([str(boot)] if boot else [])
    for url in decode_urls:
        cmd += ["--decode", url]
    return cmd + ["--host", host, "--port", str(port)]


def state_dir() -> Path:
    """Where launch records live: ``$INFER_LAB_CACHE/engines`` (default ``~/.cache/infer_lab/engines``)."""
    from .models import cache_dir  # defers torch (models)

    return cache_dir() / "engines"


@dataclass
class LaunchRecord:
    """What ``launch`` started: enough to find, measure and stop it later."""

    engine: str
    pid: int
    url: str
    command: list[str]
    log_file: str
    started_at: float
    version: str | None = None
    ready_s: float | None = None

    def path(self) -> Path:
        return state_dir() / f"{self.engine}-{self.url.rsplit(':', 1)[-1]}.json"


def wait_healthy(
    url: str, timeout_s: float, process: subprocess.Popen | None = None, poll_s: float = 1.0,
    path: str = "/health",
) -> float:
    """Poll ``url + path`` until it answers 200; seconds waited. Raises when the process dies or time runs out."""
    t0 = time.monotonic()
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(
                f"the engine exited with code {process.returncode} before it became healthy"
            )
        try:
            with urllib.request.urlopen(url.rstrip("/") + path, timeout=5) as resp:
                if resp.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"{url}{path} did not answer within {timeout_s:g} s")
        time.sleep(poll_s)


def engine_version(engine: str, url: str | None = None) -> str | None:
    """The engine's version: from its HTTP API when running, else from the installed package."""
    if url:
        for path in ("/version", "/get_server_info"):
            try:
                with urllib.request.urlopen(url.rstrip("/") + path, timeout=5) as resp:
                    data = json.loads(resp.read())
                    if isinstance(data, dict) and data.get("version"):
                        return str(data["version"])
            except (urllib.error.URLError, OSError, ValueError):
                continue
    try:
        return version(engine)
    except Exception:
        return None


def launch(
    engine: str, opts: EngineOptions, timeout_s: float = 900.0, log_dir: str | Path | None = None
) -> LaunchRecord:
    """Start ``engine`` in the background, wait until healthy, record its version; returns the record."""
    _check_name(engine)
    if not is_installed(engine):
        raise EngineNotInstalledError(
            f"{engine} is not installed in this Python ({sys.executable}). "
            f"Install it with: {INSTALL_HINT[engine]}"
        )
    cmd = build_command(engine, opts)
    logs = Path(log_dir) if log_dir else state_dir()
    logs.mkdir(parents=True, exist_ok=True)
    log_file = logs / f"{engine}-{opts.port}.log"
    url = f"http://{opts.host}:{opts.port}"
    with open(log_file, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    rec = LaunchRecord(
        engine=engine,
        pid=proc.pid,
        url=url,
        command=cmd,
        log_file=str(log_file),
        started_at=time.time(),
    )
    try:
        rec.ready_s = wait_healthy(url, timeout_s, proc)
    except RuntimeError as exc:
        terminate(proc.pid)
        raise RuntimeError(
            f"{engine} did not start: {exc}. Last log lines:\n{log_tail(log_file)}"
        ) from exc
    rec.version = engine_version(engine, url)
    rec.path().parent.mkdir(parents=True, exist_ok=True)
    rec.path().write_text(json.dumps(asdict(rec), indent=1))
    return rec


def running() -> list[LaunchRecord]:
    """Launch records whose process is still alive."""
    out = []
    folder = state_dir()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            rec = LaunchRecord(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            continue
        if _alive(rec.pid):
            out.append(rec)
    return out


def stop(
    engine: str | None = None,
    pid: int | None = None,
    port: int | None = None,
    timeout_s: float = 30.0,
) -> list[dict[str, Any]]:
    """Stop launched engines matching the filters (SIGTERM to the group, SIGKILL after ``timeout_s``);
    ``engine`` is a GPU engine's name or that of any launch on record (:mod:`infer_lab.local_engines`'
    ``vllm-cpu`` and ``llama-cpp``, the side-by-side's ``ours`` and ``hf``)."""
    folder = state_dir()  # any name may have records; one with none stops nothing
    stopped = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            rec = LaunchRecord(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            continue
        if (
            (engine and rec.engine != engine)
            or (pid and rec.pid != pid)
            or (port and not rec.url.endswith(f":{port}"))
        ):
            continue
        was_alive = _alive(rec.pid)
        if was_alive:
            terminate(rec.pid, timeout_s)
        path.unlink(missing_ok=True)
        stopped.append(
            {"engine": rec.engine, "pid": rec.pid, "url": rec.url, "was_running": was_alive}
        )
    if pid is not None and not stopped:
        raise ValueError(f"no engine launched by infer-lab has PID {pid} (records are in {folder})")
    return stopped


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def terminate(pid: int, timeout_s: float = 30.0) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)  # the engine's workers share its process group
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if not _alive(pid):
            return
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def which_engines() -> dict[str, dict[str, Any]]:
    """Installed or not, and the version, for each engine (for the notebook and ``engines list``)."""
    return {
        e: {
            "installed": is_installed(e),
            "version": engine_version(e) if is_installed(e) else None,
            "install": INSTALL_HINT[e],
            "cli": shutil.which(e),
        }
        for e in ENGINES
    }


# ---------------------------------------------------------------------------------------------
# Scale-out: when one GPU is not enough


def scale_out(
    model: str,
    gpu: str = "H100-SXM",
    context: int = 8192,
    itl_slo_ms: float | None = 50.0,
    min_users: int = 16,
    gpu_counts: tuple[int, ...] = (1, 2, 4, 8),
) -> dict[str, Any]:
    """How many GPUs and which parallelism (the capacity planner's recommendation) fit ``model``
    and serve ``min_users`` within the ITL SLO, with the vLLM and SGLang launch lines for it.

    Returns ``{"plans": [plan rows], "chosen": n_gpus or None, "parallelism": label or None,
    "reason": str, "vllm": cmd, "sglang": cmd}``. When nothing meets the SLO the commands are
    for the largest count, tensor parallel.
    """
    rec = recommend(
        model, gpu, counts=gpu_counts, context=context, itl_slo_ms=itl_slo_ms, min_users=min_users
    )
    hub_id = load_model_config(model).get("_infer_lab", {}).get("hf_id", model)
    if rec.plan is not None:
        tp, pp, dp = rec.plan.tp, rec.plan.pp, rec.plan.dp
    else:
        tp, pp, dp = max(gpu_counts), 1, 1
    opts = EngineOptions(
        model=hub_id,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        data_parallel=dp,
        max_model_len=context,
    )
    return {
        "plans": [p.row() for p in rec.considered],
        "chosen": rec.n_gpus,
        "parallelism": rec.parallelism,
        "reason": rec.reason,
        "vllm": build_command("vllm", opts, python="python"),
        "sglang": build_command("sglang", opts, python="python"),
    }
