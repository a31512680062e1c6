"""Chapters 14-16's sentences that compare or count, checked on the run's numbers and on inverted ones
(audit findings F14.3, F14.4, F15.3, F15.4, F15.7, F16.2, F16.3)."""

from __future__ import annotations

import dataclasses
import shlex

import pytest
from page_helpers import edited_notebook

from infer_lab.analysis.memory import as_shape
from infer_lab.course import ch14_tensor_parallel as ch14
from infer_lab.course import ch15_cluster as ch15
from infer_lab.course import ch16_where_next as ch16
from infer_lab.course.chapter import NO_MODEL

# ---------------------------------------------------------------------------------------------
# F14.3: this engine replicates the vocabulary; production engines shard it (two more collectives)


@pytest.mark.parametrize("model", ["smollm2-135m", "llama-3-70b"])
def test_the_page_counts_this_engines_collectives_and_a_production_engines(model):
    layers = as_shape(model).layers
    ours, theirs = ch14.collectives_per_step(layers, False), ch14.collectives_per_step(layers, True)
    assert ours == 2 * layers and theirs == ours + ch14.VOCAB_PARALLEL_COLLECTIVES
    text = ch14.replicated_vocab_text(model)
    assert f"makes its {ours} all-reduces (2 x {layers} layers) and no other message" in text
    assert f"a vLLM step of this model makes {theirs} collectives" in text and "VocabParallelEmbedding" in text


# ---------------------------------------------------------------------------------------------
# F14.4: the scaling figure draws the layouts that do not fit as a faint reference


def _faint_and_labels(fig):
    ax = fig.axes[0]
    faint = [p for c in ax.containers if hasattr(c, "patches") for p in c.patches
             if p.get_alpha() == ch14.NOT_FITTING_ALPHA]
    labels = [t for t in ax.texts if t.get_text() == "does not fit"]
    return faint, labels


def test_layouts_that_do_not_fit_are_drawn_faint_and_labelled():
    import matplotlib.pyplot as plt

    big = ch14.scaling_result("llama-3-70b", 16, 8192)
    missing = [r for r in big.rows if not r.fits]
    assert missing  # 70B in bf16 does not fit one or two H100s
    faint, labels = _faint_and_labels(fig := ch14.tp_scaling_figure(big))
    assert len(labels) == len(missing) and len(faint) == 2 * len(missing)  # compute and all-reduce bars
    assert "does not fit" in ch14.tp_scaling_title(big) or "do not fit" in ch14.tp_scaling_title(big)
    plt.close(fig)
    small = ch14.scaling_result("llama-3-8b", 1, 1024)  # fits everywhere: nothing faint, nothing labelled
    assert all(r.fits for r in small.rows)
    faint, labels = _faint_and_labels(fig := ch14.tp_scaling_figure(small))
    assert not faint and not labels and "fit" not in ch14.tp_scaling_title(small)
    plt.close(fig)


@pytest.mark.parametrize("batch, context", [(16, 8192), (64, 32768)])
def test_the_scaling_figure_keeps_its_title_inside_and_its_labels_off_the_ideal_line(batch, context):
    import matplotlib.pyplot as plt
    import numpy as np

    fig = ch14.tp_scaling_figure(ch14.scaling_result("llama-3-70b", batch, context))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    title, frame = ax.title.get_window_extent(renderer), fig.bbox  # default savefig keeps the figure's frame
    assert "\n" in ax.get_title()  # the two-line title, with the layouts that do not fit
    assert frame.x0 <= title.x0 and title.x1 <= frame.x1 and title.y1 <= frame.y1
    _, labels = _faint_and_labels(fig)
    assert labels
    lines = [line for line in ax.lines if line.get_linestyle() == "--"]
    for label in labels:
        box = label.get_window_extent(renderer)
        assert ax.bbox.y0 <= box.y0 and box.y1 <= ax.bbox.y1  # inside the plot, not under the axis
        for line in lines:  # the dashed line, sampled densely in display coordinates, misses the label
            xs, ys = line.get_xdata(), line.get_ydata()
            t = np.linspace(0, 1, 400)
            points = np.concatenate([np.column_stack([x0 + (x1 - x0) * t, y0 + (y1 - y0) * t])
                                     for x0, x1, y0, y1 in zip(xs[:-1], xs[1:], ys[:-1], ys[1:], strict=True)])
            shown = ax.transData.transform(points)
            assert not any(box.contains(x, y) for x, y in shown), label.get_position()
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# F15.3: the wafer's speeds are compared only when the quoted GPU speed can be the same workload


def test_the_wafer_paragraph_refuses_to_compare_speeds_that_cannot_be_one_workload():
    w = ch15.wafer_point("llama-3-70b")
    assert not w.quote_is_this_workload  # 70B at batch 1 on one H100: does not fit, and bound far below 600 tok/s
    text = ch15.wafer_text(w)
    assert f"cannot be {w.model} at batch 1 on one {w.gpu}" in text
    assert f"{w.gpu_bound_tokens_per_s:,.0f} tok/s, below the quoted {w.claimed_h100_tokens_per_s:,.0f}" in text
    assert "something other than memory bandwidth" not in text
    assert f"needs {w.chips_to_hold_weights} wafers" in text
    from infer_lab.units import fmt_bytes  # memory in both units: the H100's 80 GiB is 85.9 GB

    assert f"{fmt_bytes(w.weight_bytes)} of weights do not fit one {w.gpu}'s {fmt_bytes(w.gpu_memory_bytes)}" in text
    assert "GiB" in fmt_bytes(w.gpu_memory_bytes) and " GB (" in fmt_bytes(w.gpu_memory_bytes)
    # inverted: a quote within the bound, for weights that fit: then the deduction may be drawn
    plausible = dataclasses.replace(w, claimed_h100_tokens_per_s=w.gpu_bound_tokens_per_s / 2,
                                    gpu_memory_bytes=2 * w.weight_bytes, chips_to_hold_weights=1)
    assert plausible.quote_is_this_workload
    other = ch15.wafer_text(plausible)
    assert "could be that workload" in other and "something other than memory bandwidth" in other
    assert "cannot be" not in other and "fit one wafer's SRAM" in other


# ---------------------------------------------------------------------------------------------
# F15.4: the P/D deployment is a procedure: disjoint GPUs, one proxy/router, consistent hosts and ports


def _args(command: str) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(command)
    env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-") and w.split("=")[0].isupper())
    return env, [w for w in words if w not in {f"{k}={v}" for k, v in env.items()}]


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize("tp", [1, 4])
def test_the_pd_commands_run_as_one_deployment(tp):
    cmds = ch15.pd_commands("meta-llama/Meta-Llama-3-70B-Instruct", tp, 8192)
    assert list(cmds) == ["vllm prefill", "vllm decode", "vllm proxy", "sglang prefill", "sglang decode",
                          "sglang router"]
    for eng, front in (("vllm", "proxy"), ("sglang", "router")):
        servers = {role: _args(cmds[f"{eng} {role}"]) for role in ("prefill", "decode")}
        gpus = [set(env["CUDA_VISIBLE_DEVICES"].split(",")) for env, _ in servers.values()]
        assert all(len(g) == tp for g in gpus) and not gpus[0] & gpus[1]  # each role its own TP group
        bound = {role: (_flag(a, "--host"), _flag(a, "--port")) for role, (_, a) in servers.items()}
        _, proxy = _args(cmds[f"{eng} {front}"])
        if eng == "vllm":
            pointed = {"prefill": (_flag(proxy, "--prefiller-hosts"), _flag(proxy, "--prefiller-ports")),
                       "decode": (_flag(proxy, "--decoder-hosts"), _flag(proxy, "--decoder-ports"))}
            nixl = [int(env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) for env, _ in servers.values()]
            assert nixl[1] >= nixl[0] + tp  # each worker's handshake port is base + its TP rank: no overlap
        else:
            pointed = {"prefill": tuple(_flag(proxy, "--prefill").removeprefix("http://").split(":")),
                       "decode": tuple(_flag(proxy, "--decode").removeprefix("http://").split(":"))}
        assert pointed == bound, eng  # the front end sends requests where the servers listen


def test_the_pd_gpu_count_is_said_against_the_planners():
    assert "**8 GPUs**, TP4 per role: 4 more than the 4 the planner chose" in ch15.pd_gpus_text(4, 4)
    assert "the same 8 the planner chose" in ch15.pd_gpus_text(4, 8)
    assert "4 fewer than the 8 the planner chose" in ch15.pd_gpus_text(2, 8)
    assert ch15.pd_gpus_text(4, None).endswith("TP4 per role.")
    plan = ch15.run_plan(None, ch15.sizes("cpu", "quick"))
    text = ch15.plan_text(plan)
    assert ch15.pd_gpus_text(plan.pd_tp, plan.chosen) in text and ch15.VLLM_PD_PROXY in text


# ---------------------------------------------------------------------------------------------
# F15.7: a result without a model says so


def test_results_without_a_model_name_it():
    r14 = ch14.measure(None, ch14.sizes("cpu", "quick"), parts=["scaling"])
    assert r14.model == NO_MODEL and ch14.summary(r14).startswith(f"Model: {NO_MODEL};")
    r15 = ch15.measure(None, ch15.sizes("cpu", "quick"), parts=["plan"])
    assert r15.model == NO_MODEL and ch15.summary(r15).startswith(f"Model: {NO_MODEL};")


# ---------------------------------------------------------------------------------------------
# F16.3 and F16.2: the KV transfer is added to the first token; the talk's kernel agents are cited


def test_the_kv_transfer_is_added_to_the_prefill_not_traded_for_it():
    text = ch16.kv_transfer_text(10.7e9, 0.027, 1.081)
    assert "adds 27 ms to the first token (2.5% of the prefill's time)" in text
    assert "1,081 ms + 27 ms = 1,108 ms" in text and "replaces" not in text
    slow = ch16.kv_transfer_text(10.7e9, 2.0, 1.0)  # inverted: a transfer longer than the prefill
    assert "2.00x the prefill's time: the transfer, not the prefill, sets the first token" in slow
    assert "% of the prefill" not in slow
    row = ch16.directions(ch16.sizes("cpu", "quick"))[2]
    assert "adds" in row.motivation and "of the prefill it replaces" not in row.motivation


def test_the_kernels_direction_cites_the_talks_kernel_agent():
    claim = ch16.TALK_KERNEL_AGENT
    text = ch16.kernel_agents_text()
    assert claim["name"] in text and f"{claim['speedup_pct']}%" in text and "reported, not measured" in text
    other = ch16.kernel_agents_text({**claim, "speedup_pct": 7, "name": "X"})  # the words follow the data
    assert "by 7%" in other and "X" in other
    kernels = ch16.directions(ch16.sizes("cpu", "quick"))[3]
    assert text in kernels.motivation and any("agent" in t for t in kernels.tools)


def test_the_tp_page_says_what_its_engine_replicates_and_what_production_engines_shard(tmp_path):
    """Notebook 14's part-1 text, as marimo renders it, carries the computed sentence."""
    pytest.importorskip("marimo")
    import html
    import re

    import marimo as mo

    def words(text: str) -> str:
        return " ".join(html.unescape(re.sub(r"<[^>]+>", "", text)).replace("**", "").replace("`", "").split())

    page = edited_notebook("14", tmp_path)  # the notebook as it is
    shown = [words(cell.run(ch14=ch14, mo=mo)[0].text) for data in page.app._cell_manager.cell_data()
             if (cell := data.cell) is not None and data.config.hide_code and set(cell.refs) == {"ch14", "mo"}]
    assert any(words(ch14.replicated_vocab_text("smollm2-135m")) in text for text in shown)


# ---------------------------------------------------------------------------------------------
# Review: the KV transfer's time is over one NDR link per GPU, and the page says how many


def test_the_kv_transfer_names_as_many_links_as_the_gpus_that_move_it():
    from infer_lab.catalog import get_interconnect

    link = ch16.TIER_LINKS["another server over InfiniBand NDR"]
    gbit = get_interconnect(link).per_direction_gbps * 8
    assert ch16.links_words("NDR", link, 8) == f"8 NDR links of {gbit:,.0f} Gb/s (one per GPU)"
    assert ch16.links_words("NDR", link, 1) == f"1 NDR link of {gbit:,.0f} Gb/s"  # one GPU: one link
    sizes = ch16.sizes("cpu", "quick")
    n = ch16.serving_gpus(sizes.model, sizes.gpu, sizes.prompt, users=sizes.decode_batch)
    words = ch16.links_words("InfiniBand NDR", link, n)
    assert f"over {words} adds" in ch16.directions(sizes)[2].motivation
    # the time said is the time over those n links, not over one
    from infer_lab.units import human

    kv = ch16.memory.kv_bytes(sizes.model, sizes.prompt, 1)
    assert f"adds {human(ch16.link_time_s(kv, link, n) * 1e3, 3)} ms" in ch16.directions(sizes)[2].motivation
