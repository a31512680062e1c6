"""Notebook 01's page is the experiment: the loop on the page is the model's real computation (the
engine and transformers choose the same greedy tokens), the FLOP count is right by hand on a tiny
config, and the bandwidth sweep returns a curve of sane numbers."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch
from page_helpers import cell_call, chapter_call, edited_notebook, experiment_calls

from infer_lab.analysis.flops import COMPONENTS, flops_by_component
from infer_lab.bench.bandwidth import KIB, bandwidth_sweep, cache_levels, working_sets
from infer_lab.course import ch01_foundations as ch01
from infer_lab.course.notebook_code import notebook_function

TINY = dict(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4, intermediate_size=16,
            num_hidden_layers=2, vocab_size=10)


def _part(name: str):
    """The chapter package's module for one part (``loop``, ``bandwidth``, ...): where it looks up the
    notebook's experiment."""
    return importlib.import_module(f"{ch01.__name__}.{name}")


def test_the_chapter_runs_the_notebooks_experiments_with_its_sizes(monkeypatch, embedded):
    """The chapter module has no experiment of its own: each run_<part> calls the notebook's function."""
    sizes = ch01.sizes("cpu", "quick")
    (name, args), = experiment_calls(monkeypatch, _part("loop"), ch01.run_loop, embedded, sizes, stop_at="generate_step_by_step")
    assert name == "generate_step_by_step"
    assert args == {"lm": embedded, "ids": ch01.prompt_ids(embedded, sizes.loop_prompt), "new_tokens": sizes.loop_new_tokens}
    device = SimpleNamespace(device="cpu")
    (name, args), = experiment_calls(monkeypatch, _part("bandwidth"), ch01.run_bandwidth, device, sizes, stop_at="bandwidth_curve")
    assert name == "bandwidth_curve"
    assert args == {"device": "cpu", "smallest": sizes.bw_smallest, "largest": sizes.bw_largest,
                    "repeats": sizes.bw_repeats}
    calls = experiment_calls(monkeypatch, _part("decode"), ch01.run_decode, embedded, sizes, stop_at="decode_measured")
    assert [name for name, _ in calls] == ["decode_prediction", "decode_measured"]
    assert all(args["lm"] is embedded and args["context"] == sizes.decode_context for _, args in calls)
    assert calls[1][1]["steps"] == sizes.decode_steps


@pytest.fixture(scope="module")
def loop(tour_runs) -> ch01.LoopResult:
    return tour_runs.part("ch01_foundations", "loop")


def test_the_loop_equals_the_engine_and_transformers_greedy(embedded, loop):
    n = ch01.sizes("cpu", "quick").loop_new_tokens
    assert len(loop.steps) == n and loop.same_as_engine
    with torch.inference_mode():
        ids = torch.tensor([list(loop.prompt_ids)])
        hf = embedded.model.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n)[0, ids.shape[1]:]
    assert list(loop.tokens) == hf.tolist()
    # one pass per token, each over the whole text so far, logits over the whole vocabulary
    hidden, vocab = embedded.config.hidden_size, embedded.config.vocab_size
    p = len(loop.prompt_ids)
    assert [s["input"] for s in loop.steps] == [(p + i,) for i in range(n)]
    assert [s["hidden"] for s in loop.steps] == [(p + i, hidden) for i in range(n)]
    assert all(s["logits"] == (vocab,) for s in loop.steps)
    assert loop.pieces is not None and "Paris" in loop.pieces[0]
    text = ch01.loop_text(loop)
    assert f"**{n} tokens took {n} forward passes.**" in text and f"the same {n} tokens" in text


def test_flops_by_component_by_hand_on_a_tiny_config():
    # hidden 8, 2 heads of 4 (1 KV head), MLP 16, 2 layers, vocabulary 10; a decode step at context 3
    got = flops_by_component(TINY, context=3)
    assert list(got.flops) == list(COMPONENTS)
    assert got.flops == {
        "embedding": 0.0,
        "attention projections": 2 * 2 * (8 * 8 + 2 * 8 * 4 + 8 * 8),  # q, k, v, o per layer, 2 FLOPs per weight
        "attention scores": 2 * 2 * 3 * 2 * (4 + 4),  # 2 layers x 3 keys x 2 heads x (q·k + p·v) x 2
        "MLP": 2 * 2 * 3 * 8 * 16,
        "norms": 4 * 8 * (2 * 2 + 1),  # 4 FLOPs per element, 2 norms per layer + the final one
        "LM head": 2 * 10 * 8,
    }
    assert got.total == 2816 and got.layers == 2816 - 160
    assert got.layers_share == pytest.approx(2656 / 2816)
    # a prefill of 3 tokens: the projections, MLP and norms scale with the tokens, the head does not
    prefill = flops_by_component(TINY, context=3, tokens=3)
    assert prefill.flops["MLP"] == 3 * got.flops["MLP"]
    assert prefill.flops["attention scores"] == 2 * 2 * (1 + 2 + 3) * 2 * (4 + 4)
    assert prefill.flops["LM head"] == got.flops["LM head"]
    with pytest.raises(ValueError):
        flops_by_component(TINY, context=2, tokens=3)


def test_the_95_percent_rule_is_checked_honestly_for_both_models(embedded):
    small, seven_b = ch01.run_flops(embedded, ch01.sizes("cpu", "quick"))
    assert small.model == embedded.name and seven_b.model == "mistral-7b"
    assert small.layers_share < 0.95 < seven_b.layers_share  # the rule holds for the 7B, not for the 135M
    assert small.share("LM head") > 5 * seven_b.share("LM head")
    text = ch01.flops_text([small, seven_b], guess_pct=95)
    assert "does not hold for it" in text and "holds for it" in text and "You guessed **95 %**" in text
    # attention scores grow with the context; nothing else does
    longer = flops_by_component("mistral-7b", context=8 * seven_b.context)
    assert longer.flops["attention scores"] == pytest.approx(8 * seven_b.flops["attention scores"], rel=1e-3)
    assert longer.flops["MLP"] == seven_b.flops["MLP"]


def test_bandwidth_sweep_returns_a_curve_of_sane_numbers():
    sizes = working_sets(64 * KIB, 4 * 2**20, factor=4)
    assert sizes == [64 * KIB, 256 * KIB, 2**20, 4 * 2**20]
    points = bandwidth_sweep("cpu", sizes, repeats=3, sample_s=5e-4)
    assert [p.working_set_bytes for p in points] == sizes
    for p in points:
        assert 0.05 < p.GBps_low <= p.GBps <= p.GBps_high < 10_000  # GB/s: a copy, not zero, not absurd
        assert p.copies_per_sample >= 1 and p.samples == 3
    levels = cache_levels("cpu")
    assert all(a.size_bytes < b.size_bytes for a, b in zip(levels, levels[1:], strict=False))
    fig = ch01.bandwidth_figure(points, "cpu")
    assert fig.axes[0].get_xscale() == "log"


@pytest.mark.slow
def test_changing_the_tokens_in_the_cell_changes_the_passes(embedded, tmp_path, loop):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    cell = edited_notebook("01", tmp_path, new_tokens=3).the_loop
    _, defs = cell.run(ch01=ch01, lm=embedded, mo=mo, nb=nb, loop_button=SimpleNamespace(value=True),
                       sizes=ch01.sizes("cpu", "quick"))
    edited = defs["loop"]
    assert len(edited.steps) == 3 < len(loop.steps)  # one pass per token: fewer tokens, fewer passes
    assert edited.tokens == loop.tokens[:3] and edited.same_as_engine  # greedy: the same first tokens


def test_decode_prediction_says_memory_bound_on_this_cpu(embedded):
    step = notebook_function("01", "decode_prediction")(embedded, 128)
    assert step.bound == "memory" and step.bytes >= 0.95 * 4 * embedded.n_params  # fp32: 4 bytes per weight, read once
    text = ch01.budget_text(step, ch01.byte_split(embedded, 128))
    assert "memory-bound" in text and "of weights" in text


def test_without_a_tokenizer_the_page_says_it_shows_token_ids(loop):
    ids_only = ch01.LoopResult(loop.model, loop.prompt, loop.prompt_ids, loop.steps, loop.engine_tokens[:2] + (0,) * 4,
                               None, True)
    text = ch01.loop_text(ids_only)
    assert text.startswith("**This model has no tokenizer**") and str(list(loop.tokens)) in text
    assert "differ from pass 3 on" in text and "nearly tied" in text
    assert (ch01.loop_table(ids_only)["as text"] == "— (no tokenizer)").all()


def test_the_flop_comparison_picks_the_other_model():
    from infer_lab.catalog import load_model_config

    def fake(name: str) -> SimpleNamespace:
        cfg = load_model_config(name)
        return SimpleNamespace(name=name, model=SimpleNamespace(config=SimpleNamespace(to_dict=lambda: dict(cfg))))

    assert [getattr(m, "name", m) for m in ch01.flops_models(fake("mistral-7b"))] == ["mistral-7b", "smollm2-135m"]
    assert [getattr(m, "name", m) for m in ch01.flops_models(fake("smollm2-135m"))] == ["smollm2-135m", "mistral-7b"]
    assert ch01.flops_models(None) == ["smollm2-135m", "mistral-7b"]  # no model: the deck's analytic build


@pytest.mark.parametrize(("runner", "experiment", "defining"), [
    ("run_loop", "generate_step_by_step", "loop"), ("run_flops", "flop_shares", "shares")])
def test_each_cell_as_shipped_makes_the_chapters_call(monkeypatch, embedded, tmp_path, runner, experiment, defining):
    """The page's cells and the chapter's runners read the prompt, the tokens and the context from one
    home (the chapter's sizes): each cell as shipped hands its experiment what the tour hands it."""
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    sizes, pressed = ch01.sizes("cpu", "quick"), SimpleNamespace(value=True)
    page = cell_call("01", tmp_path, experiment, dict(ch01=ch01, lm=embedded, mo=mo, nb=nb, sizes=sizes,
                                                      loop_button=pressed, flops_button=pressed,
                                                      flops_guess=SimpleNamespace(value=50)), defining)
    assert page == chapter_call(monkeypatch, getattr(ch01, runner), embedded, sizes, experiment=experiment)
