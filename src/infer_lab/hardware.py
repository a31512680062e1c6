"""What hardware you have, what its datasheet promises, and what it actually achieves.

The achieved ceilings (copy bandwidth and matmul FLOP/s) are measured, not assumed, and feed
every later prediction: a roofline built on datasheet numbers flatters every machine.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import torch

import infer_lab

from .catalog import GPUSpec, get_gpu, resolve_gpu_name
from .timing import BUSY_CORES, machine_load, summarize, time_call


@dataclass(frozen=True)
class DeviceInfo:
    """The current compute device. Memory in bytes, clocks in MHz, power in W."""

    kind: str  # "cuda" or "cpu"
    name: str
    memory_total_bytes: int
    memory_free_bytes: int
    cores: int | None = None
    driver: str | None = None
    cuda_version: str | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    catalog_name: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


cpu_model = _cpu_model  # the public name: the CPU's model string, e.g. "AMD EPYC"

# The CPU features that decide which kernels PyTorch can use for the course's GEMMs.
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
             "amx_int8")


@lru_cache(maxsize=1)
def cpu_features() -> dict[str, Any]:
    """The CPU's model, the :data:`CPU_FLAGS` it has (from /proc/cpuinfo) and PyTorch's CPU capability.

    ``capability`` is what PyTorch's own kernels dispatch to (``AVX512``, ``AVX2``, ...);
    ``amx`` is True when the CPU has AMX tiles for bf16 (``amx_bf16``), which oneDNN uses for
    bf16 matmuls.
    """
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:  # an old or unusual build: say so rather than fail
        capability = None
    return {"model": _cpu_model(), "flags": [f for f in CPU_FLAGS if f in flags],
            "amx": "amx_bf16" in flags, "avx512_bf16": "avx512_bf16" in flags,
            "capability": capability}


def thread_policy() -> dict[str, Any]:
    """The torch threads and the OpenMP wait policy in force (why infer_lab sets it: its ``__init__``).

    ``set_by`` is ``"you"`` when OMP_WAIT_POLICY or GOMP_SPINCOUNT was in the environment before
    infer_lab was imported, else ``"infer_lab"``; ``applies`` is False when torch was imported before
    infer_lab (OpenMP read the environment then, so this process spins as before).
    """
    policy, spin = os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT")
    words = f"OMP_WAIT_POLICY={policy or '(unset)'}" + (f", GOMP_SPINCOUNT={spin}" if spin else "")
    words += f", set by {infer_lab.OMP_WAIT_POLICY_SET_BY}"
    if not infer_lab.OMP_WAIT_POLICY_APPLIES:
        words += " (not in force in this process: torch was imported before infer_lab)"
    return {"threads": torch.get_num_threads(), "omp_wait_policy": policy, "gomp_spincount": spin,
            "set_by": infer_lab.OMP_WAIT_POLICY_SET_BY, "applies": infer_lab.OMP_WAIT_POLICY_APPLIES,
            "text": f"{torch.get_num_threads()} torch threads, {words}"}


def _ram_bytes() -> tuple[int, int]:
    total = free = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
                elif line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except OSError:
        total = free = int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return total, free


def _nvml(index: int) -> dict[str, Any]:
    """Clocks, power and driver from NVML; empty when nvidia-ml-py or the driver is missing."""
    try:
        import pynvml  # optional: nvidia-ml-py
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        out = {
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000,
            "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
        }
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in out.items()}
    except Exception:  # NVML errors are diagnostics, never fatal
        return {}


def detect(device: torch.device | str | None = None) -> DeviceInfo:
    """Describe the device: the first CUDA GPU (or ``device``), else the CPU."""
    dev = torch.device(device) if device is not None else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda":
        index = dev.index or 0
        props = torch.cuda.get_device_properties(index)
        free, total = torch.cuda.mem_get_info(index)
        return DeviceInfo(kind="cuda", name=props.name, memory_total_bytes=int(total), memory_free_bytes=int(free),
                          cores=props.multi_processor_count, cuda_version=torch.version.cuda,
                          catalog_name=resolve_gpu_name(props.name), **_nvml(index))
    total, free = _ram_bytes()
    return DeviceInfo(kind="cpu", name=_cpu_model(), memory_total_bytes=total, memory_free_bytes=free,
                      cores=os.cpu_count())


def device_label(device: torch.device | str | None = None) -> str:
    """Short hardware label for plot titles, e.g. ``'NVIDIA H200'`` or ``'CPU: AMD EPYC (2 cores)'``."""
    info = detect(device)
    return info.name if info.kind == "cuda" else f"CPU: {info.name} ({info.cores} cores)"


def catalog_spec(info: DeviceInfo | None = None) -> GPUSpec | None:
    """Datasheet entry for the detected GPU, or None (CPU or an uncatalogued GPU)."""
    info = info or detect()
    return get_gpu(info.catalog_name) if info.catalog_name else None


# ---------------------------------------------------------------------------------------------
# Micro-benchmarks


@dataclass(frozen=True)
class Ceilings:
    """Measured ceilings of a device: bytes/s of a device copy and FLOP/s of a large matmul."""

    device: str
    device_name: str
    bandwidth_Bps: float
    matmul_flops: float
    matmul_dtype: str
    copy_bytes: int
    matmul_n: int
    measured_at: float = 0.0  # Unix time (s) of the measurement
    others_cores: float | None = None  # cores other processes kept busy just before (timing.machine_load)

    @property
    def busy(self) -> bool:
        """Whether other processes were using the CPU when these ceilings were measured."""
        return self.others_cores is not None and self.others_cores >= BUSY_CORES

    def provenance(self, now: float | None = None) -> str:
        """When these ceilings were measured and how busy the machine was, for the page."""
        age = max(0.0, (time.time() if now is None else now) - self.measured_at)
        when = f"{age:.0f} s ago" if age < 90 else f"{age / 60:.0f} min ago"
        if self.others_cores is None:
            return f"Ceilings measured {when}."
        if self.busy:
            return (f"Ceilings measured {when} while other programs kept {self.others_cores:.1f} cores busy: "
                    "they are lower than this machine can do, and so is every prediction built on them. "
                    "Measure them again on a quiet machine (the button measures afresh at every press).")
        return f"Ceilings measured {when} on a quiet machine (other programs: {self.others_cores:.1f} cores)."

    @property
    def ridge_point(self) -> float:
        """Measured FLOP per byte where the roofline bends."""
        return self.matmul_flops / self.bandwidth_Bps

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ridge_point"] = self.ridge_point
        return d


def measure_bandwidth(device: torch.device | str = "cpu", n_bytes: int = 256 * 2**20, repeats: int = 10) -> float:
    """Achieved memory bandwidth in bytes/s of ``dst.copy_(src)``: reads + writes ``2 * n_bytes``."""
    dev = torch.device(device)
    src = torch.empty(n_bytes // 4, dtype=torch.float32, device=dev).fill_(1.0)
    dst = torch.empty_like(src)
    times = time_call(lambda: dst.copy_(src), device=dev, warmup=2, repeats=repeats)
    return 2 * src.numel() * 4 / summarize(times).p50


def measure_matmul_flops(device: torch.device | str = "cpu", n: int = 1024, dtype: torch.dtype | None = None,
                         repeats: int = 5) -> float:
    """Achieved FLOP/s of an ``n x n @ n x n`` matmul (2 n^3 FLOPs), median over repeats."""
    dev = torch.device(device)
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    times = time_call(lambda: a @ b, device=dev, warmup=2, repeats=repeats)
    return 2 * n**3 / summarize(times).p50


_CEILINGS: dict[tuple[str, bool], Ceilings] = {}  # the latest measurement per (device, quick)


def _measure_ceilings(device: str, quick: bool) -> Ceilings:
    dev = torch.device(device)
    others = machine_load(0.2).others_cores if dev.type == "cpu" else None
    if dev.type == "cuda":
        copy_bytes, n = (512 * 2**20, 4096) if quick else (2 * 2**30, 8192)
        dtype = torch.bfloat16
    else:
        copy_bytes, n = (64 * 2**20, 1024) if quick else (256 * 2**20, 2048)
        dtype = torch.float32
    bw = measure_bandwidth(dev, copy_bytes, repeats=5 if quick else 20)
    flops = measure_matmul_flops(dev, n, dtype, repeats=3 if quick else 10)
    return Ceilings(device=str(dev), device_name=device_label(dev), bandwidth_Bps=bw, matmul_flops=flops,
                    matmul_dtype=str(dtype).replace("torch.", ""), copy_bytes=copy_bytes, matmul_n=n,
                    measured_at=time.time(), others_cores=others)


def measure_ceilings(device: torch.device | str | None = None, quick: bool = True, fresh: bool = False) -> Ceilings:
    """Measured copy bandwidth and matmul FLOP/s of the device.

    The latest measurement per device and size is kept for the process; ``fresh=True``
    measures again (and keeps that). ``quick`` uses small sizes (under a second on a laptop
    CPU); the full run uses 2 GiB copies and 8192^3 matmuls on a GPU. On a CPU the result
    records how busy other processes kept the machine (:attr:`Ceilings.provenance`).
    """
    dev = torch.device(device) if device is not None else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    key = (str(dev), quick)
    if fresh or key not in _CEILINGS:
        _CEILINGS[key] = _measure_ceilings(str(dev), quick)
    return _CEILINGS[key]


def ceilings_vs_spec(ceilings: Ceilings, spec: GPUSpec | None) -> list[dict[str, Any]]:
    """Rows comparing measured ceilings with the datasheet, with their ratio (None without a spec)."""
    rows = [
        {"what": "memory bandwidth", "unit": "GB/s", "measured": ceilings.bandwidth_Bps / 1e9,
         "datasheet": spec.bandwidth_Bps / 1e9 if spec else None},
        {"what": f"matmul ({ceilings.matmul_dtype})", "unit": "TFLOP/s", "measured": ceilings.matmul_flops / 1e12,
         "datasheet": spec.peak_flops("bf16") / 1e12 if spec else None},
        {"what": "ridge point", "unit": "FLOP/B", "measured": ceilings.ridge_point,
         "datasheet": spec.ridge_point() if spec else None},
    ]
    for r in rows:
        r["measured/datasheet"] = r["measured"] / r["datasheet"] if r["datasheet"] else None
    return rows
