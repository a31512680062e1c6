"""The data files: one source of truth, well formed."""

from __future__ import annotations

import pytest

from infer_lab import catalog, hardware
from infer_lab.units import fmt_bytes

REQUIRED = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings")


@pytest.mark.parametrize("name", catalog.list_models())
def test_model_configs_are_well_formed(name):
    cfg = catalog.load_model_config(name)
    missing = [k for k in REQUIRED if k not in cfg]
    assert not missing, f"{name} lacks {missing}"
    assert cfg["_infer_lab"]["hf_id"].count("/") == 1
    assert cfg["hidden_size"] > 0 and cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0


def test_required_models_are_catalogued():
    assert {"mistral-7b", "llama-3-8b", "llama-3-70b", "qwen2.5-7b", "smollm2-135m", "deepseek-v3",
            "gpt-oss-120b"} <= set(catalog.list_models())


@pytest.mark.parametrize("name", catalog.list_gpus())
def test_gpu_entries_are_well_formed(name):
    g = catalog.get_gpu(name)
    assert g.memory_bytes > 8 * 2**30 and g.bandwidth_Bps > 1e11
    assert g.peak_flops("bf16") > 1e13 and g.tdp_w > 0
    assert g.price_usd_per_hour > 0 and g.price_source and g.price_date == "2026-11-30"


def test_required_gpus_are_catalogued():
    assert {"T4", "L4", "A10G", "L40S", "A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200", "B200",
            "MI300X", "RTX-Pro-6000-Blackwell"} <= set(catalog.list_gpus())


def test_h100_ridge_point():
    assert catalog.get_gpu("H100-SXM").ridge_point() == pytest.approx(295.2, abs=0.1)


@pytest.mark.parametrize("driver_name, key", [
    ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA H200", "H200"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("Tesla T4", "T4"),
    ("NVIDIA L4", "L4"), ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-Pro-6000-Blackwell"),
    ("NVIDIA GeForce GTX 1080", None),
])
def test_driver_names_resolve(driver_name, key):
    assert catalog.resolve_gpu_name(driver_name) == key


def test_unknown_gpu_lists_known():
    with pytest.raises(catalog.UnknownNameError, match="H100-SXM"):
        catalog.get_gpu("H1000")


def test_units_label_both_systems():
    assert fmt_bytes(131_072) == "131 KB (128 KiB)"
    assert fmt_bytes(536_870_912) == "0.537 GB (0.5 GiB)" or fmt_bytes(536_870_912) == "537 MB (512 MiB)"


def test_ceilings_vs_spec_ratio():
    c = hardware.Ceilings(device="cuda", device_name="x", bandwidth_Bps=4.25e12, matmul_flops=802e12,
                          matmul_dtype="bfloat16", copy_bytes=1, matmul_n=1)
    rows = hardware.ceilings_vs_spec(c, catalog.get_gpu("H200"))
    assert rows[0]["measured/datasheet"] == pytest.approx(4.25 / 4.8)
    assert hardware.ceilings_vs_spec(c, None)[0]["measured/datasheet"] is None


def test_measured_cpu_ceilings_are_plausible():
    c = hardware.measure_ceilings("cpu", quick=True)
    assert 1e8 < c.bandwidth_Bps < 1e13 and 1e8 < c.matmul_flops < 1e14


@pytest.mark.parametrize("name", [g for g in catalog.list_gpus() if catalog.get_on_chip_memory(g) is not None])
def test_shared_memory_per_block_is_part_of_the_units_sram(name):
    """What one thread block may use as shared memory is at most its SM's L1/shared SRAM (all of an AMD
    compute unit's LDS); the tiles of chapter 07's FlashAttention model are sized from it."""
    chip = catalog.get_on_chip_memory(name)
    assert 0 < chip.shared_bytes_per_block <= chip.sram_kib_per_unit * 1024
    if catalog.get_gpu(name).vendor == "NVIDIA":
        assert chip.shared_bytes_per_block < chip.sram_kib_per_unit * 1024  # the L1 cache keeps the rest


def test_per_block_shared_memory_follows_the_compute_capability():
    kib = {g: catalog.get_on_chip_memory(g).shared_kib_max_per_block for g in ("T4", "L4", "L40S", "A100-80GB", "H200")}
    assert kib == {"T4": 64, "L4": 99, "L40S": 99, "A100-80GB": 163, "H200": 227}
    mi300x = catalog.get_on_chip_memory("MI300X")
    assert mi300x.last_level_cache_bytes == 256 * 2**20 > mi300x.l2_bytes
    assert catalog.get_on_chip_memory("H100-SXM").last_level_cache_bytes is None
