"""The Jupyter / Colab front-end: ipywidgets over the same chapter functions the marimo notebooks call.

The generated notebooks in ``jupyter/`` (``scripts/build_jupyter.py``) use three things from here:

* :class:`ChapterPanel`: one per chapter. Its header picks the sizes (and the model, for a
  chapter that needs one); ``panel.part("memory")`` shows that part's run button and, when
  pressed, runs ``chapter.measure(lm, sizes, parts=["memory"])`` and shows the part's summary,
  figures and tables, exactly what ``infer-lab tour`` and the marimo notebook show.
* The live explorers of the analytic chapters (:data:`EXPLORERS`), and the KV visualizer and
  capacity calculator of :mod:`infer_lab.course.calculator`: controls that recompute as they move.
* :func:`show_saved`: a chapter's saved GPU results, labelled as saved.

With ``INFER_LAB_AUTORUN=1`` (how CI executes the notebooks headless, like marimo's script mode
presses every run button) each part runs as its cell runs and each explorer renders its defaults
once, straight into the cell's output, so an error fails the cell instead of hiding in a widget.
"""

from __future__ import annotations

import inspect
import os
import re
import textwrap
import traceback
from collections.abc import Callable
from dataclasses import replace
from types import ModuleType
from typing import Any

from ..catalog import list_gpus, list_models
from ..models import load_model
from .chapter import choose_size, has_gpu, loadable_models, model_choice
from .ipython import ipywidgets_module, say, show_figure  # noqa: F401 (show_figure: jupyter.show_figure stays)
from .notebook_code import notebook_function, notebook_path

AUTORUN_ENV = "INFER_LAB_AUTORUN"
# Explorer functions below, in the order of the marimo notebook's control cells they stand in for.
EXPLORERS = {
    "03": ("memory_explorer",),
    "04": ("roofline_explorer",),
    "05": ("presets_explorer",),
    "07": ("attention_memory_explorer", "dsa_explorer", "flash_explorer"),
    "14": ("scaling_explorer",),
    "16": ("where_next_explorer",),
}


def autorun() -> bool:
    """True when ``$INFER_LAB_AUTORUN`` asks every part to run as its cell runs (headless execution)."""
    return os.environ.get(AUTORUN_ENV, "").lower() in ("1", "true", "yes")


def _widgets():
    return ipywidgets_module()


# ---------------------------------------------------------------------------------------------
# Showing things


def md(text: str) -> None:
    """Display narrative markdown (indentation of a triple-quoted string removed; ``$$...$$`` is LaTeX).

    A lone ``$`` is a dollar: it goes out as ``<span>$</span>`` (see :func:`say`), so the
    notebook's math renderer cannot pair it with the next one.
    """
    from IPython.display import Markdown, display  # optional: IPython (Jupyter/Colab only)

    text = textwrap.dedent(text).strip()
    parts = re.split(r"(\$\$.*?\$\$)", text, flags=re.S)
    text = "".join(part if part.startswith("$$") else re.sub(r"(?<!\\)\$", "<span>$</span>", part) for part in parts)
    display(Markdown(text))


def show_experiment(number: str, name: str) -> None:
    """Show one experiment of notebook ``number`` (an ``@app.function``): the code its part's run
    button executes, read from the marimo notebook itself (:mod:`infer_lab.course.notebook_code`)."""
    from IPython.display import Markdown, display  # optional: IPython (Jupyter/Colab only)

    code = inspect.getsource(notebook_function(number, name))
    display(Markdown(f"The experiment `{name}`, run from `infer_lab/notebooks/{notebook_path(number).name}` "
                     f"(the same code the marimo notebook shows):\n\n```python\n{code}```"))


def show_table(frame: Any, title: str = "") -> None:
    """Display a people table (display strings) without its index."""
    from IPython.display import HTML, display  # optional: IPython (Jupyter/Colab only)

    from .tables import split_wide  # defers pandas (tables imports it)

    if title:
        say(f"**{title}**")
    for part in split_wide(frame):  # a wide table as narrower ones, stacked: no sideways scrolling
        display(HTML(part.to_html(index=False, border=0)))


def show_result(chapter: ModuleType, result: Any) -> None:
    """A chapter result's summary, figures and tables (only the parts it holds)."""
    text = chapter.summary(result)
    if text.strip():
        say(text)
    for fig in chapter.figures(result).values():
        show_figure(fig)
    for title, frame in chapter.tables(result).items():
        show_table(frame, title)


def show_saved(chapter: ModuleType, only_without_gpu: bool = True) -> None:
    """The chapter's saved GPU results, labelled as saved (nothing when none, or on a GPU)."""
    view = chapter.saved()
    if view is None or (only_without_gpu and has_gpu()):
        return
    say(f"### {view.title}\n\n_{view.label}_")
    if view.warning:
        say(f"> **Caution:** {view.warning}")
    for title, frame in view.tables.items():
        show_table(frame, title)
    for fig in view.figures.values():
        show_figure(fig)
    if view.notes:
        say("\n".join(f"- {n}" for n in view.notes))


# ---------------------------------------------------------------------------------------------
# The chapter panel


class ChapterPanel:
    """Sizes (and model) for one chapter, and one run button per part with its output area."""

    def __init__(self, chapter: ModuleType, lm: Any = None, size: str | None = None) -> None:
        w = _widgets()
        self.chapter = chapter
        self._lm = lm
        self._loaded: dict[tuple[str, str], Any] = {}
        self.size = w.Dropdown(options=["quick", "full"], value=choose_size(None, size), description="sizes")
        controls = [self.size]
        if chapter.NEEDS_MODEL and lm is None:
            name, weights = model_choice()
            self.model = w.Dropdown(options=sorted(set(loadable_models()) | {name}), value=name, description="model")
            self.weights = w.ToggleButtons(options=["pretrained", "random"], value=weights, description="weights")
            controls += [self.model, self.weights]
        self.header = w.VBox([w.HBox(controls), w.HTML(self._header_note())])

    def _header_note(self) -> str:
        if not self.chapter.NEEDS_MODEL:
            return "<i>Analytic chapter: no model needed.</i>"
        return ("<i>The model loads on the first button press (the embedded SmolLM2-135M on a CPU, a "
                "Mistral-7B-shape model with random weights on a GPU).</i>")

    def _ipython_display_(self) -> None:
        from IPython.display import display  # optional: IPython (Jupyter/Colab only)

        display(self.header)

    def lm(self) -> Any:
        """The chosen model, loaded once per (model, weights)."""
        if self._lm is not None or not self.chapter.NEEDS_MODEL:
            return self._lm
        key = (self.model.value, self.weights.value)
        if key not in self._loaded:
            self._loaded[key] = load_model(key[0], weights=key[1])
        return self._loaded[key]

    def run(self, part: str) -> Any:
        """``chapter.measure`` for one part at the chosen sizes."""
        lm = self.lm()
        device = lm.device if lm is not None else None
        sizes = self.chapter.sizes(device, self.size.value)
        return self.chapter.measure(lm, sizes, parts=[part])

    def part(self, key: str) -> None:
        """Display the part's run button and output area; with autorun, also run it now, in the cell."""
        from IPython.display import clear_output, display  # optional: IPython (Jupyter/Colab only)

        w = _widgets()
        if key not in self.chapter.PARTS:
            raise KeyError(f"{self.chapter.NUMBER} has no part {key!r}; its parts: {', '.join(self.chapter.PARTS)}")
        button = w.Button(description=self.chapter.PARTS[key], layout=w.Layout(width="auto"),
                          button_style="primary", icon="play")
        status = w.HTML("")
        out = w.Output()

        def on_click(_: Any) -> None:
            button.disabled = True
            status.value = "<i>running…</i>"
            with out:
                clear_output(wait=True)
                try:
                    result = self.run(key)
                    show_result(self.chapter, result)
                    status.value = f"<i>{result.seconds[key]:.1f} s at {result.size} sizes</i>"
                except Exception as exc:  # shown in the panel; the kernel keeps going
                    status.value = f"<b>failed:</b> {type(exc).__name__}: {exc}"
                    print(traceback.format_exc())
                finally:
                    button.disabled = False

        button.on_click(on_click)
        display(w.VBox([w.HBox([button, status]), out]))
        if autorun():
            show_result(self.chapter, self.run(key))


# ---------------------------------------------------------------------------------------------
# Live explorers (ipywidgets that recompute as they move)


def explorer(render: Callable[..., None], controls: dict[str, Any], rows: int = 2) -> Any:
    """Controls over ``render(**values)``; with autorun, the defaults are also rendered in the cell."""
    w = _widgets()
    out = w.interactive_output(render, controls)
    items = list(controls.values())
    per_row = -(-len(items) // rows)
    box = w.VBox([w.HBox(items[i:i + per_row]) for i in range(0, len(items), per_row)] + [out])
    if autorun():
        render(**{k: c.value for k, c in controls.items()})
    return box


def memory_explorer() -> Any:
    """Chapter 03: the memory equation of one model, live (model, KV dtype, context, users, GPU)."""
    from . import ch03_memory_equation as ch03  # defers matplotlib, pandas

    w = _widgets()
    s = ch03.sizes()
    controls = {
        "model": w.Dropdown(options=list_models(), value=s.model, description="model"),
        "kv_dtype": w.Dropdown(options=["bf16", "fp16", "fp8", "int8", "fp32"], value=s.kv_dtype, description="KV dtype"),
        "context": w.IntSlider(min=256, max=131072, step=256, value=s.context, description="context"),
        "users": w.IntSlider(min=1, max=512, value=s.users, description="users"),
        "gpu": w.Dropdown(options=list_gpus(), value=s.gpu, description="GPU"),
    }

    def render(model: str, kv_dtype: str, context: int, users: int, gpu: str) -> None:
        say(ch03.kv_summary_text(ch03.kv_summary(model, kv_dtype, context, users)))
        show_figure(ch03.kv_growth_figure(model, kv_dtype, gpu=gpu))
        say(ch03.fit_text(ch03.fit_view(model, gpu, context, users, kv_dtype)))

    return explorer(render, controls)


def roofline_explorer() -> Any:
    """Chapter 04: prefill and decode of one model on a datasheet GPU, live."""
    from . import ch04_prefill_decode_roofline as ch04  # defers matplotlib, pandas

    w = _widgets()
    s = ch04.sizes("cpu", "quick")
    controls = {
        "model": w.Dropdown(options=list_models(), value=s.model, description="model"),
        "gpu": w.Dropdown(options=list_gpus(), value=s.gpu, description="GPU"),
        "batch": w.IntSlider(min=1, max=512, value=s.batch, description="decode batch"),
        "context": w.IntSlider(min=128, max=32768, step=128, value=s.context, description="context"),
    }

    def render(model: str, gpu: str, batch: int, context: int) -> None:
        view = ch04.datasheet_view(model, gpu, batch, context)
        say(ch04.datasheet_text(view))
        show_figure(ch04.datasheet_figure(view))
        show_table(ch04.ops_table(view.prefill_ops), f"Prefill, one {view.context:,}-token prompt")
        show_table(ch04.ops_table(view.decode_ops), f"Decode step, batch {view.batch:,}")

    return explorer(render, controls)


def presets_explorer() -> Any:
    """Chapter 05: the workload presets for one model, and context against users on one GPU, live."""
    from . import ch05_capacity_planner as ch05  # defers matplotlib, pandas

    w = _widgets()
    controls = {
        "model": w.Dropdown(options=list(ch05.PRESET_MODELS), value=ch05.PRESET_MODELS[0], description="model"),
        "gpu": w.Dropdown(options=list_gpus(), value=ch05.sizes().tradeoff_gpu, description="GPU"),
    }

    def render(model: str, gpu: str) -> None:
        for p in ch05.plan_presets(model):
            say(ch05.preset_line(p))
            show_table(ch05.plans_table(p.plans))
        trade = ch05.tradeoff([model], gpu)
        show_figure(ch05.tradeoff_figure(trade))
        say(ch05.tradeoff_text(trade))

    return explorer(render, controls, rows=1)


def attention_memory_explorer() -> Any:
    """Chapter 07, part 2: KV memory per attention variant on a GPU at a context, live."""
    from . import ch07_attention_variants as ch07  # defers matplotlib, pandas

    w = _widgets()
    controls = {
        "gpu": w.Dropdown(options=list_gpus(), value=ch07.DEFAULT_GPU, description="GPU"),
        "context": w.IntSlider(min=1024, max=131072, step=1024, value=ch07.DEFAULT_CONTEXT, description="context"),
    }

    def render(gpu: str, context: int) -> None:
        memory = ch07.memory_rows(gpu, context)
        show_figure(ch07.kv_figure(memory, "KV bytes per token per variant, all layers (analytic)"))
        say(ch07.memory_text(memory))
        show_table(ch07.memory_table(memory))

    return explorer(render, controls, rows=1)


def dsa_explorer() -> Any:
    """Chapter 07, part 5: the states of architectures without a growing KV cache, and what a DSA
    decode step reads, at a context and a top-k, live."""
    from . import ch07_attention_variants as ch07  # defers matplotlib, pandas

    w = _widgets()
    low, high, step = ch07.DSA_TOP_K_RANGE
    controls = {
        "context": w.IntSlider(min=1024, max=131072, step=1024, value=ch07.DEFAULT_CONTEXT, description="context"),
        "top_k": w.IntSlider(min=low, max=high, step=step, value=ch07.DSA_TOP_K, description="DSA top-k",
                             style={"description_width": "initial"}),
    }

    def render(context: int, top_k: int) -> None:
        show_table(ch07.state_table(context=context, top_k=top_k))
        say(ch07.dsa_text(ch07.dsa_reads(context, top_k=top_k)))

    return explorer(render, controls, rows=1)


def flash_explorer() -> Any:
    """Chapter 07, part 6: FlashAttention's HBM bytes on a GPU, with the shared memory per thread block
    (it starts at the GPU's own figure, and moves to it when the GPU changes) and the causal mask, live."""
    from . import ch07_attention_variants as ch07  # defers matplotlib, pandas

    w = _widgets()
    low, high, step = ch07.FLASH_SHARED_KIB_RANGE

    def own_kib(gpu: str) -> int:
        return ch07.flash_tiling(gpu).sram_bytes // 1024

    controls = {
        "gpu": w.Dropdown(options=list_gpus(), value=ch07.DEFAULT_GPU, description="GPU"),
        "shared_kib": w.IntSlider(min=low, max=high, step=step, value=own_kib(ch07.DEFAULT_GPU),
                                  description="M: shared memory per thread block (KiB)",
                                  style={"description_width": "initial"}),
        "causal": w.Checkbox(value=True, description="causal mask"),
    }
    controls["gpu"].observe(lambda change: setattr(controls["shared_kib"], "value", own_kib(change["new"])),
                            names="value")

    def render(gpu: str, shared_kib: int, causal: bool) -> None:
        flash = ch07.flash_result(ch07.flash_tiling(gpu, causal=causal, sram_bytes=shared_kib * 1024), gpu)
        show_figure(ch07.hbm_figure(flash))
        say(ch07.flash_text(flash))
        show_table(ch07.flash_table(flash))

    return explorer(render, controls, rows=1)


def scaling_explorer() -> Any:
    """Chapter 14: TP scaling on catalogued GPUs for one model, batch and context, live (the notebook's
    own ``tp_scaling`` experiment, through ``ch14.scaling_result``)."""
    from . import ch14_tensor_parallel as ch14  # defers matplotlib, pandas

    w = _widgets()
    s = ch14.sizes("cpu", "quick")
    controls = {
        "model": w.Dropdown(options=["llama-3-70b", "llama-3-8b", "mistral-7b", "qwen2.5-7b"], value=s.scaling_model,
                            description="model"),
        "batch": w.IntSlider(min=1, max=128, value=s.scaling_batch, description="users (batch)"),
        "context": w.Dropdown(options=[1024, 4096, 8192, 32768], value=s.scaling_context, description="context"),
    }

    def render(model: str, batch: int, context: int) -> None:
        scaling = ch14.scaling_result(model, batch, context)
        figs = ch14.scaling_figures(scaling)
        show_figure(figs["tp_scaling"])
        say(ch14.scaling_text(scaling))
        for name, frame in ch14.scaling_tables(scaling).items():
            show_table(frame, name)
        show_figure(figs["frontier"])

    return explorer(render, controls)


def where_next_explorer() -> Any:
    """Chapter 16: the four directions and the tiers race for one model, GPU and long request, live."""
    from . import ch16_where_next as ch16  # defers matplotlib, pandas (the chapter imports them)

    w = _widgets()
    s = ch16.sizes()
    controls = {
        "model": w.Dropdown(options=list_models(), value=s.model, description="model"),
        "gpu": w.Dropdown(options=list_gpus(), value=s.gpu, description="GPU"),
        "long_context": w.IntSlider(min=4096, max=262144, step=4096, value=s.long_context, description="long request"),
    }

    def render(model: str, gpu: str, long_context: int) -> None:
        sizes = replace(s, model=model, gpu=gpu, long_context=long_context)
        say(ch16.directions_text(ch16.directions(sizes)))
        tiers = ch16.tiers(model, gpu, sizes.contexts)
        show_figure(ch16.tiers_figure(tiers))
        say(ch16.tiers_text(tiers))

    return explorer(render, controls, rows=1)


def kv_visualizer() -> Any:
    """Chapter 03's KV visualizer (:func:`infer_lab.course.calculator.kv_visualizer_ipywidget`)."""
    from . import calculator  # defers pandas (calculator imports it)

    box = calculator.kv_visualizer_ipywidget()
    if autorun():
        show_figure(calculator.kv_visualizer_figure(calculator.kv_curves(**calculator.DEFAULTS_KV)))
    return box


def capacity_calculator() -> Any:
    """Chapter 05's capacity calculator (:func:`infer_lab.course.calculator.capacity_calculator_ipywidget`)."""
    from . import calculator  # defers pandas (calculator imports it)

    box = calculator.capacity_calculator_ipywidget()
    if autorun():
        result = calculator.capacity_plans(**calculator.DEFAULTS_CAPACITY)
        say(result.verdict)
        show_table(calculator.plans_table(result.plans))
    return box
