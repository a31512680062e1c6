"""llama.cpp as the laptop user's alternative (bench quant --llama-cpp): the bytes it streams per token
are read off the GGUF file, its absence is one clear line, and where it is installed it runs in the
same rounds as the engine (llama-cpp-python compiles llama.cpp at install, so CI never has it)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from infer_lab.bench import llama_cpp
from infer_lab.models import embedded_gguf_path


def _gguf(path, untied: bool) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((8, 32), np.float16))  # 512 bytes
    if untied:
        writer.add_tensor("output.weight", np.zeros((8, 32), np.float32))  # 1024 bytes
    writer.add_tensor("blk.0.attn_norm.weight", np.zeros(32, np.float32))  # 128 bytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_tied_lm_head_reads_the_embedding_and_an_untied_one_reads_its_own(tmp_path):
    _gguf(tmp_path / "tied.gguf", untied=False)
    _gguf(tmp_path / "untied.gguf", untied=True)
    tied, untied = llama_cpp.streamed_bytes(tmp_path / "tied.gguf"), llama_cpp.streamed_bytes(tmp_path / "untied.gguf")
    assert tied["bytes_per_token"] == 512 + 128 and tied["by_type"] == {"F16": 512, "F32": 128}
    assert untied["bytes_per_token"] == 1024 + 128 and untied["by_type"] == {"F32": 1152}  # the lookup is one row


def test_the_embedded_file_streams_a_fraction_of_the_fp32_bytes(embedded):
    found = llama_cpp.streamed_bytes(embedded_gguf_path())
    params = sum(p.numel() for p in embedded.model.parameters())  # the LM head is tied: counted once
    # Q4_1 is 20 bytes per 32 weights, Q8_0 34 per 32; the layers are Q4_1, the embedding Q8_0, norms fp32
    assert set(found["by_type"]) == {"Q4_1", "Q8_0", "F32"}
    assert 0.15 < found["bytes_per_token"] / (4 * params) < 0.2
    assert found["bytes_per_token"] < found["file_bytes"]  # the file also holds the tokenizer


def test_without_llama_cpp_the_bench_says_how_to_get_it(monkeypatch, capsys):
    from infer_lab.cli import main

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if not installed
    assert "pip install llama-cpp-python" in llama_cpp.available()
    with pytest.raises(RuntimeError, match="pip install llama-cpp-python"):
        llama_cpp.LlamaCppDecoder(embedded_gguf_path(), 64, 1)
    assert main(["bench", "quant", "--llama-cpp", "--rounds", "1"]) != 0
    assert "pip install llama-cpp-python" in capsys.readouterr().err


def test_llama_cpp_runs_in_the_same_rounds_when_installed(embedded):
    pytest.importorskip("llama_cpp")
    from infer_lab.bench.weight_quant import decode_speed

    speed = decode_speed(embedded, ("int4",), prompt_len=16, new_tokens=8, rounds=1, llama_cpp=True)
    row = speed["llama.cpp"]
    assert row["decode_tokens_per_s"] > 0 and "int4" in speed and "float32" in speed
    assert row["gemm_weight_bytes_per_token"] == llama_cpp.streamed_bytes(embedded_gguf_path())["bytes_per_token"]
    assert 0 <= row["same_greedy_tokens_as_base"] <= 8 and row["build"]["threads"] >= 1
