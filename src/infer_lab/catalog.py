"""One source of truth for constants: model architectures and GPU specs, read from data files.

Model configs are HF ``config.json`` dicts (plus an ``_infer_lab`` block with the hub id and
notes). GPU specs carry datasheet numbers and an indicative price with its source and date, and
name their scale-up interconnect (NVLink/NVSwitch, PCIe, Infinity Fabric), whose bandwidth and
latency live in the same file with their sources. Accelerators that the course only *cites*
(the wafer-scale SRAM chip of the talk) live in ``cited_chips.json`` and never enter the planner.
Notebooks and CLI read these; nobody re-types a number.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from .package_files import data_path
from .units import GiB


class UnknownNameError(KeyError):
    """An unknown model or GPU name; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def _data_dir() -> Path:
    return data_path()


@lru_cache(maxsize=1)
def _model_files() -> dict[str, Any]:
    folder = _data_dir() / "models"
    return {p.name[:-5]: p for p in folder.iterdir() if p.name.endswith(".json")}


def list_models() -> list[str]:
    """Names of the catalogued architectures, e.g. ``['deepseek-v3', 'llama-3-70b', ...]``."""
    return sorted(_model_files())


def _unknown(kind: str, name: str, known: list[str], extra: str = "") -> UnknownNameError:
    close = difflib.get_close_matches(name, known, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return UnknownNameError(f"Unknown {kind} {name!r}.{hint} Known {kind}s: {', '.join(known)}.{extra}")


def load_model_config(name_or_path: str | os.PathLike) -> dict[str, Any]:
    """The HF-style config dict of a catalogued model name or a ``config.json`` path.

    Raises :class:`UnknownNameError` (listing the known names) for anything else.
    """
    text = str(name_or_path)
    files = _model_files()
    if text in files:
        cfg = json.loads(files[text].read_text())
        cfg.setdefault("_infer_lab", {})["name"] = text
        return cfg
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" and path.is_file():
        cfg = json.loads(path.read_text())
        cfg.setdefault("_infer_lab", {}).setdefault("name", path.parent.name or path.stem)
        return cfg
    if path.suffix == ".json" or text.startswith((".", "/", "~")):  # meant as a file, not a name
        raise FileNotFoundError(f"{text}: no such config file. Give the path of an HF config.json "
                                f"(or of its folder), or a catalogued name: {', '.join(list_models())}.")
    raise _unknown("model", text, list_models(), " A path to an HF config.json also works.")


def model_info(name_or_path: str) -> dict[str, Any]:
    """The ``_infer_lab`` block of a model: display name, hub id, notes."""
    return dict(load_model_config(name_or_path).get("_infer_lab", {}))


@dataclass(frozen=True)
class GPUSpec:
    """Datasheet numbers of one GPU. Rates are dense peak; bytes and bytes/s are exact units."""

    name: str
    vendor: str
    arch: str
    memory_gib: float
    memory_type: str
    hbm_bandwidth_tbps: float
    bf16_tflops: float | None
    fp16_tflops: float | None
    fp8_tflops: float | None
    int8_tops: float | None
    tdp_w: float
    price_usd_per_hour: float
    price_source: str
    price_date: str
    interconnect: str = "pcie4-x16"
    interconnect_note: str = ""

    @property
    def memory_bytes(self) -> int:
        """Marketed capacity in bytes (GiB-based)."""
        return int(self.memory_gib * GiB)

    @property
    def bandwidth_Bps(self) -> float:
        """Peak memory bandwidth in bytes per second."""
        return self.hbm_bandwidth_tbps * 1e12

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Dense peak tensor FLOP/s for a compute dtype (bf16, fp16, fp8, int8); falls back to 16-bit."""
        table = {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "fp8": self.fp8_tflops, "int8": self.int8_tops}
        if dtype in ("fp32", "float32"):
            dtype = "bf16"  # tensor cores via TF32/bf16; the planner assumes 16-bit compute
        value = table.get(dtype)
        if value is None:
            value = self.bf16_tflops or self.fp16_tflops
        return float(value) * 1e12

    def ridge_point(self, dtype: str = "bf16") -> float:
        """Arithmetic intensity (FLOP/byte) where the roofline turns from memory- to compute-bound."""
        return self.peak_flops(dtype) / self.bandwidth_Bps

    def link(self) -> InterconnectSpec:
        """The scale-up interconnect tensor parallelism uses inside one server."""
        return get_interconnect(self.interconnect)


@lru_cache(maxsize=1)
def _gpu_table() -> dict[str, Any]:
    return json.loads((_data_dir() / "gpus.json").read_text())


def list_gpus() -> list[str]:
    """Catalogued GPU names, in catalog order."""
    return [k for k in _gpu_table() if not k.startswith("_")]


def gpu_catalog_about() -> dict[str, str]:
    """Units, sources and the date of the prices in the GPU catalog."""
    return dict(_gpu_table()["_about"])


def get_gpu(name: str) -> GPUSpec:
    """Look a GPU up by catalog name, alias or a device name such as ``'NVIDIA H100 80GB HBM3'``."""
    table = _gpu_table()
    key = resolve_gpu_name(name)
    if key is None:
        raise _unknown("GPU", name, list_gpus())
    entry = table[key]
    return GPUSpec(name=key, price_date=table["_about"]["price_date"], **entry)


def resolve_gpu_name(name: str) -> str | None:
    """Catalog key for a name or alias, or a best guess from a driver-reported device name."""
    table = _gpu_table()
    if name in table and not name.startswith("_"):
        return name
    aliases = table.get("_aliases", {})
    if name in aliases:
        return aliases[name]
    norm = name.upper().replace("NVIDIA", "").replace("AMD", "").replace("INSTINCT", "").strip()
    lowered = {k.upper(): k for k in list_gpus()}
    if norm in lowered:
        return lowered[norm]
    # Driver names such as "NVIDIA H100 80GB HBM3" or "NVIDIA A100-SXM4-40GB".
    words = set(re.split(r"[\s\-_]+", norm))
    if "H200" in words:
        return "H200"
    if "H100" in words:
        return "H100-PCIe" if "PCIE" in words else "H100-SXM"
    if "A100" in words:
        return "A100-40GB" if "40GB" in words else "A100-80GB"
    if "RTX PRO 6000" in norm:
        return "RTX-Pro-6000-Blackwell"
    for key in ("B200", "L40S", "A10G", "L4", "T4", "MI300X"):
        if key in words:
            return key
    return None


# ---------------------------------------------------------------------------------------------
# Interconnects


@dataclass(frozen=True)
class InterconnectSpec:
    """One GPU-to-GPU link type. Bandwidths in GB/s (1e9 B/s), latencies in microseconds.

    ``total_bidirectional_gbps`` is the datasheet headline (both directions added);
    ``per_direction_gbps`` is half of it. ``ring_busbw_gbps`` is what the scaling model uses:
    the nccl-tests bus bandwidth of a ring all-reduce over the full group (see ``busbw_source``).
    ``base_latency_us`` and ``hop_latency_us`` are NCCL's ring cost-model constants.
    """

    name: str
    kind: str  # nvlink, pcie, xgmi, network
    description: str
    total_bidirectional_gbps: float
    per_direction_gbps: float
    topology: str  # switch, shared-bus, mesh, point-to-point
    max_group: int
    ring_busbw_gbps: float
    busbw_source: str
    base_latency_us: float
    hop_latency_us: float
    latency_source: str
    source: str
    recorded: str
    peer_links: int | None = None  # mesh only: direct links per GPU

    def bus_bandwidth_Bps(self, n_ranks: int) -> float:
        """Ring bus bandwidth (bytes/s) for a group of ``n_ranks`` GPUs.

        On a mesh a group of N uses N-1 of the GPU's direct links, so small groups get less;
        on a switch or a shared bus the figure does not depend on N.
        """
        if self.topology == "mesh" and self.peer_links:
            used = min(max(n_ranks - 1, 1), self.peer_links)
            return self.ring_busbw_gbps * 1e9 * used / self.peer_links
        return self.ring_busbw_gbps * 1e9

    @property
    def per_direction_Bps(self) -> float:
        """Point-to-point bandwidth (bytes/s) of one transfer in one direction."""
        if self.topology == "mesh" and self.peer_links:
            return self.per_direction_gbps * 1e9 / self.peer_links  # one direct link
        return self.per_direction_gbps * 1e9

    @property
    def base_latency_s(self) -> float:
        return self.base_latency_us * 1e-6

    @property
    def hop_latency_s(self) -> float:
        return self.hop_latency_us * 1e-6

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _interconnect_table() -> dict[str, Any]:
    return _gpu_table()["_interconnects"]


def list_interconnects() -> list[str]:
    """Catalogued link types, e.g. ``['nvlink3-nvswitch', 'nvlink4-nvswitch', ...]``."""
    return [k for k in _interconnect_table() if not k.startswith("_")]


def interconnect_about() -> dict[str, str]:
    """What each interconnect field means: which direction, which algorithm bandwidth."""
    return dict(_interconnect_table()["_about"])


def get_interconnect(name: str) -> InterconnectSpec:
    """A link type by key (``'nvlink4-nvswitch'``, ``'pcie5-x16'``, ``'infiniband-ndr400'``...)."""
    table = _interconnect_table()
    if name.startswith("_") or name not in table:
        raise _unknown("interconnect", name, list_interconnects())
    return InterconnectSpec(
        name=name, recorded=table["_about"]["recorded"], **table[name]
    )


# ---------------------------------------------------------------------------------------------
# Cited accelerators (data points from the talks, never planner GPUs)


@dataclass(frozen=True)
class CitedChip:
    """An accelerator the course cites, with its vendor figures and what the talk claimed."""

    name: str
    kind: str
    vendor: str
    system: str
    on_chip_memory_gb: float
    on_chip_memory_type: str
    memory_bandwidth_pbps: float
    peak_pflops: float
    peak_note: str
    source: str
    talk_claims: dict[str, Any]
    recorded: str

    @property
    def bandwidth_Bps(self) -> float:
        return self.memory_bandwidth_pbps * 1e15

    def bandwidth_ratio_vs(self, gpu: str = "H100-SXM") -> float:
        """This chip's memory bandwidth over a catalog GPU's HBM bandwidth."""
        return self.bandwidth_Bps / get_gpu(gpu).bandwidth_Bps

    def claimed_speedup(self) -> float | None:
        """The talk's tokens/s over its H100 tokens/s (3,000 / 600 = 5x), when both are quoted."""
        ours, h100 = self.talk_claims.get("tokens_per_s"), self.talk_claims.get("h100_tokens_per_s")
        return ours / h100 if ours and h100 else None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["bandwidth_ratio_vs_h100_sxm"] = self.bandwidth_ratio_vs("H100-SXM")
        d["claimed_speedup"] = self.claimed_speedup()
        return d


@lru_cache(maxsize=1)
def _cited_table() -> dict[str, Any]:
    return json.loads((_data_dir() / "cited_chips.json").read_text())


def list_cited_chips() -> list[str]:
    """Names of the cited (non-planner) accelerators."""
    return [k for k in _cited_table() if not k.startswith("_")]


def get_cited_chip(name: str) -> CitedChip:
    """A cited accelerator by name, e.g. ``'Cerebras-WSE-3'``."""
    table = _cited_table()
    if name.startswith("_") or name not in table:
        raise _unknown("cited chip", name, list_cited_chips())
    return CitedChip(name=name, recorded=table["_about"]["recorded"], **table[name])


def get_cited_system_claim(name: str) -> dict[str, Any]:
    """A claim the talk made about a whole system rather than one chip (``cited_chips.json``'s
    ``_system_claims``), e.g. ``'heterogeneous-vs-homogeneous'``: what, against which baseline, who said it."""
    claims = _cited_table().get("_system_claims", {})
    if name not in claims:
        raise _unknown("cited system claim", name, list(claims))
    return dict(claims[name])


# ---------------------------------------------------------------------------------------------
# On-chip memory (the memory hierarchy beside HBM)


@dataclass(frozen=True)
class OnChipMemory:
    """One GPU's on-chip SRAM and caches next to its HBM, from ``gpus.json``'s ``_memory_hierarchy``.

    ``units`` are NVIDIA SMs or AMD compute units. Sizes are KiB/MiB as the whitepapers give
    them; the byte properties are exact. The SRAM bandwidth is derived (units x bytes per clock
    x clock): no datasheet prints it. ``shared_kib_max_per_block`` is the part of one unit's SRAM a
    single thread block (AMD: workgroup) may use as shared memory: what one kernel's tiles can hold.
    """

    gpu: str
    units: int
    sram_kib_per_unit: float
    shared_kib_max_per_block: float
    register_file_kib_per_unit: float | None
    l2_mib: float
    last_level_cache_mib: float | None
    clock_mhz: float
    sram_bytes_per_clock_per_unit: int
    source: str
    bandwidth_source: str
    recorded: str

    @property
    def sram_bytes(self) -> int:
        """All units' L1/shared SRAM together, in bytes."""
        return int(self.units * self.sram_kib_per_unit * 1024)

    @property
    def shared_bytes_per_block(self) -> int:
        """The most shared memory (AMD: LDS) one thread block may use, in bytes."""
        return int(self.shared_kib_max_per_block * 1024)

    @property
    def l2_bytes(self) -> int:
        return int(self.l2_mib * 1024 * 1024)

    @property
    def last_level_cache_bytes(self) -> int | None:
        """The cache beyond the L2 (AMD Infinity Cache), in bytes, when there is one."""
        return int(self.last_level_cache_mib * 1024 * 1024) if self.last_level_cache_mib else None

    @property
    def sram_bandwidth_Bps(self) -> float:
        """Peak SRAM bandwidth over all units, bytes/s (derived)."""
        return self.units * self.sram_bytes_per_clock_per_unit * self.clock_mhz * 1e6

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(sram_bytes=self.sram_bytes, l2_bytes=self.l2_bytes, sram_bandwidth_Bps=self.sram_bandwidth_Bps)
        return d


def _hierarchy_table() -> dict[str, Any]:
    return _gpu_table().get("_memory_hierarchy", {})


def memory_hierarchy_about() -> dict[str, str]:
    """What the on-chip fields mean, how the SRAM bandwidth is derived, and which GPUs lack them."""
    return dict(_hierarchy_table().get("_about", {}))


def get_on_chip_memory(gpu: str) -> OnChipMemory | None:
    """The on-chip memory of a catalog GPU (name or alias), or ``None`` when none is on file."""
    key = resolve_gpu_name(gpu)
    if key is None:
        raise _unknown("GPU", gpu, list_gpus())
    table = _hierarchy_table()
    if key not in table:
        return None
    return OnChipMemory(gpu=key, recorded=table["_about"]["recorded"], **table[key])
