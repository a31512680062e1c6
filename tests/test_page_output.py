"""What reaches the page: numbers written for people, library warnings and errors kept off it.

Scientific notation (``2.61e+03 ms``, ``1e+03T``) and rows of zeros (``0.0000000894``) must not
appear in a chapter's text, tables or figure labels; PyTorch's and transformers' raw messages
must not land in a table cell or an output box.
"""

from __future__ import annotations

import re

import pytest

from infer_lab.course import chapter_names
from infer_lab.figures import log_tick_label
from infer_lab.units import human

SCIENTIFIC = re.compile(r"\d(?:\.\d+)?e[+-]?\d", re.IGNORECASE)
ZEROS = re.compile(r"0\.0000\d")


def assert_outside_pyplot(figures: dict, where: str) -> None:
    """Every figure is a plain matplotlib ``Figure``, not pyplot state: no pyplot manager holds it, so a
    ``plt.close("all")`` from another thread (a Jupyter subshell's hook) cannot take it away."""
    held = [key for key, fig in figures.items() if fig.canvas.manager is not None]
    assert not held, f"{where}: figures {held} live in pyplot's registry"


def assert_for_people(text: str, where: str) -> None:
    assert not SCIENTIFIC.search(text), f"{where}: scientific notation in {SCIENTIFIC.search(text).group()!r}"
    assert not ZEROS.search(text), f"{where}: a row of zeros in {text[max(0, ZEROS.search(text).start() - 20):][:60]!r}"


@pytest.mark.parametrize(("value", "expected"), [
    (2610.0, "2,610"), (24.869571912452834, "24.9"), (0.012345, "0.0123"), (8.94e-08, "8.94 × 10⁻⁸"),
    (3.67e-05, "3.67 × 10⁻⁵"), (1e-4, "1 × 10⁻⁴"), (-2.5e-6, "-2.5 × 10⁻⁶"), (0.001, "0.001"),
])
def test_human_numbers_never_use_exponents_or_rows_of_zeros(value, expected):
    assert human(value) == expected
    assert_for_people(human(value), f"human({value})")


@pytest.mark.parametrize(("value", "expected"), [
    (999.6e9, "1T"), (1.5e12, "1.5T"), (2.61e3, "2.61k"), (999.9e3, "1M"), (4096, "4G" if False else "4k"),
    (0.0000367, "3.67 × 10⁻⁵"), (12, "12"),
])
def test_tick_labels_are_short_and_plain(value, expected):
    assert log_tick_label(value) == expected


def _page_text(text: str, tables: dict, figures: dict) -> str:
    """What a page shows of a result, as text: its words, its tables and every label of its figures."""
    import matplotlib

    matplotlib.use("Agg")
    texts = [text] + [frame.to_string() for frame in tables.values()]
    for fig in figures.values():
        fig.canvas.draw()
        for ax in fig.axes:
            texts += [t.get_text() for t in ax.get_xticklabels() + ax.get_yticklabels() + ax.texts]
            texts += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        texts += [t.get_text() for t in fig.texts]
    return "\n".join(texts)


def _chapter_outputs(ch, parts: list[str] | None) -> str:
    result = ch.measure(None, ch.sizes("cpu", "quick"), parts)
    return _page_text(ch.summary(result), ch.tables(result), ch.figures(result))


@pytest.mark.parametrize(("number", "parts"), [("05", None), ("16", None), ("04", ["datasheet"]),
                                               ("14", ["scaling"]), ("15", ["plan"])])
def test_chapter_outputs_without_a_model_are_written_for_people(number, parts):
    from infer_lab.course import chapter

    assert_for_people(_chapter_outputs(chapter(number), parts), f"chapter {number}")


@pytest.mark.parametrize("name", chapter_names())
def test_every_page_output_is_written_for_people(name, tour_runs):
    """Each chapter's words, tables and figure labels, from the run the tour made of it at quick sizes
    on this machine (measured numbers: tiny times, huge byte counts), carry no exponent and no row of
    zeros: numbers are written with :func:`~infer_lab.units.human` and its kin. Its figures are built
    outside pyplot (:func:`infer_lab.figures.subplots`)."""
    import importlib

    ch, run = importlib.import_module(f"infer_lab.course.{name}"), tour_runs[name]
    assert run.ok, run.traceback
    figures = ch.figures(run.result)
    assert_for_people(_page_text(ch.summary(run.result), ch.tables(run.result), figures), name)
    assert_outside_pyplot(figures, name)


def test_the_opener_and_the_calculator_are_written_for_people():
    """The course's opener, and the calculator at its defaults (its plans and its KV visualizer)."""
    from infer_lab.course import calculator, opener

    result = opener.compute()
    figures = opener.figures(result)
    assert_for_people(_page_text(opener.summary(result), opener.tables(result), figures), "opener")
    assert_outside_pyplot(figures, "opener")
    plans = calculator.capacity_plans(**calculator.DEFAULTS_CAPACITY)
    curves = calculator.kv_curves(**calculator.DEFAULTS_KV)
    figures = {"kv": calculator.kv_visualizer_figure(curves)}
    shown = _page_text(f"{plans.verdict}\n{curves.kv_total_label}", {"plans": calculator.plans_table(plans.plans)},
                       figures)
    assert_for_people(shown, "calculator")
    assert_outside_pyplot(figures, "calculator")


def test_unavailable_sdpa_backends_are_named_in_words_not_pytorch_errors():
    from infer_lab.bench.attention import BackendTime
    from infer_lab.course import ch07_attention_variants as ch07

    raw = ("No viable backend for scaled_dot_product_attention was found. This is likely due to turning off "
           "both the math kernel and the fused kernels.")
    backends = [BackendTime(name, n, 4, 32, 1000, name == "math", 0.001 if name == "math" else None,
                            "" if name == "math" else raw)
                for n in (64, 128) for name in ("math", "efficient", "cudnn")]
    decode = [ch07.DecodeAttentionTime(1, 64, 1, 1000, 1e-5), ch07.DecodeAttentionTime(4, 64, 1, 4000, 2e-5)]
    timing = ch07.TimingResult(backends, decode, "CPU", 1e10, 2)
    table = ch07.backend_table(timing).to_string()
    text = ch07.timing_text(timing)
    for shown in (table, text):
        assert "viable" not in shown and "fused kernels" not in shown
    assert "efficient, cudnn" in text and text.count("Not run here") == 1
    assert "efficient" not in table and "math" in table


def test_the_4bit_baseline_note_stands_once_in_the_chapter_summary():
    from infer_lab.course import ch06_quantization as ch06

    result = ch06.Result(embedded=True)
    assert ch06.summary(result).count("The baseline is already 4-bit") == 1


# --- figures without pyplot state (the Jupyter edition saves them while other kernel threads run);
# every chapter's figures are checked in test_every_page_output_is_written_for_people

def test_course_figures_survive_a_close_all_from_another_thread():
    """A figure from the course is not in pyplot's registry: ``plt.close('all')`` (what a Jupyter
    subshell's post-run hook does) leaves it whole, and it still saves a drawn PNG."""
    import io
    import threading

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    from infer_lab.course import chapter

    ch05 = chapter("05")
    figs = ch05.figures(ch05.measure(None, ch05.sizes("cpu", "quick")))
    assert figs and not plt.get_fignums()
    closer = threading.Thread(target=plt.close, args=("all",))
    closer.start()
    closer.join()
    for name, fig in figs.items():
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=50)
        pixels = Image.open(io.BytesIO(buf.getvalue())).convert("L")
        lo, hi = pixels.getextrema()
        assert hi - lo > 100, f"figure {name} came out blank"


# --- legible labels, honest durations


def test_overlapping_point_labels_are_moved_apart():
    from infer_lab.figures import declutter_labels, subplots

    fig, ax = subplots(figsize=(4, 3))
    for i in range(4):  # four labels on nearly the same spot, as 04's GPUs crowd together
        ax.scatter(1 + i * 0.01, 1)
        ax.annotate(f"1x GPU-{i}", (1 + i * 0.01, 1), xytext=(3, 3), textcoords="offset points")
    ax.set(xlim=(0, 10), ylim=(0, 2))
    ax.text(0.5, 0.2, "alone", transform=ax.transAxes)
    assert declutter_labels(fig) == 3
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert declutter_labels(fig) == 0  # nothing left to move


@pytest.mark.parametrize(("seconds", "expected"), [(0.0009, "under 1 s"), (0.4, "under 1 s"), (1.2, "1 s"),
                                                   (16.3, "16 s"), (89, "89 s"), (150, "2 min")])
def test_durations_never_read_zero_seconds(seconds, expected):
    from infer_lab.units import fmt_duration

    assert fmt_duration(seconds) == expected


@pytest.mark.parametrize(("n", "expected"), [(1, "1 torch thread"), (2, "2 torch threads"), (0, "0 torch threads"),
                                             (1024, "1,024 torch threads")])
def test_counts_are_plural_unless_one(n, expected):
    from infer_lab.units import count

    assert count(n, "torch thread") == expected


def test_every_promised_button_time_is_honest():
    """No button promises 'About 0 s'; a model chapter's first button adds the model's load time."""
    from infer_lab.course import chapters, nb

    texts = {(ch.NUMBER, part): nb.button_time(ch, part) for ch in chapters() for part in ch.PARTS}
    if not any(texts.values()):
        pytest.skip("no chapter-times-cpu-*.json in infer_lab/results")
    for key, text in texts.items():
        assert "About 0 s" not in text and " 0 s" not in text, (key, text)
    first = [(ch.NUMBER, next(iter(ch.PARTS))) for ch in chapters() if ch.NEEDS_MODEL]
    assert all("loading it adds" in texts[k] for k in first if texts[k])


def test_a_wide_table_is_split_into_narrower_ones_that_repeat_its_keys():
    import pandas as pd

    from infer_lab.course.tables import MAX_COLUMNS, split_wide

    frame = pd.DataFrame({"proposer": ["n-gram", "draft"], "k": ["1", "2"]}
                         | {f"col {i}": ["1.5", "—"] for i in range(17)})  # 19 columns, as 11's sweep
    parts = split_wide(frame)
    assert len(parts) == 3 and all(len(p.columns) <= MAX_COLUMNS for p in parts)
    assert all(p.columns[0] == "proposer" for p in parts)
    shown = [c for p in parts for c in p.columns if c != "proposer"]
    assert shown == list(frame.columns[1:])  # every other column once, in order
    narrow = frame.iloc[:, :5]
    assert split_wide(narrow)[0] is narrow
    with pytest.raises(ValueError):
        split_wide(frame, max_columns=1)
