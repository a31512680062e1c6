"""Part 1 of chapter 04: prefill and decode predicted op by op on a datasheet GPU (analytic, live in the notebook)."""

from __future__ import annotations

from dataclasses import dataclass

from ...analysis import memory, roofline
from ...analysis.roofline import Prediction, Roof
from ...units import human
from ..library_code import code_block
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER
from .shared import OpRow, op_rows, roofline_figure


@dataclass(frozen=True)
class DatasheetView:
    """A model on a datasheet GPU: the prediction and each op of the prefill and the decode step."""

    model: str
    roof: Roof
    batch: int
    context: int
    prediction: Prediction
    prefill_ops: list[OpRow]
    decode_ops: list[OpRow]


def datasheet_view_of(roof: Roof, prediction: Prediction, prefill: list[roofline.OpCost],
                      decode: list[roofline.OpCost]) -> DatasheetView:
    """What the notebook's ``datasheet_prediction`` returns, as a :class:`DatasheetView`."""
    return DatasheetView(prediction.model, roof, prediction.batch, prediction.context, prediction,
                         op_rows(prefill, roof), op_rows(decode, roof))


def datasheet_view(model: str, gpu: str, batch: int = 1, context: int = 4096) -> DatasheetView:
    """TTFT of one ``context``-token prompt and the decode step at ``batch`` on ``gpu``'s datasheet:
    the notebook's own ``datasheet_prediction`` (``infer_lab/notebooks/04_prefill_decode_roofline.py``)."""
    experiment = notebook_function(NUMBER, "datasheet_prediction")
    return datasheet_view_of(*experiment(model, gpu, batch, context))


def roof_code() -> str:
    """The roofline itself, the library's real code: one op's time and the FLOP/s the roof allows."""
    return code_block(Roof.time_s, Roof.attainable_flops)


def datasheet_text(view: DatasheetView) -> str:
    roof, pred = view.roof, view.prediction
    cb = pred.critical_batch
    critical = (f"**{cb:,}**" if cb else "**never at this context**: each sequence adds its own KV reads, "
                "whose intensity stays low")
    return (
        f"**{roof.name}** (datasheet): {roof.peak_flops / 1e12:,.0f} TFLOP/s bf16 dense, "
        f"{human(roof.bandwidth_Bps / 1e12, 3)} TB/s, ridge point **{human(roof.ridge_point, 3)} FLOP/B**.\n\n"
        f"Predicted for {view.model}: TTFT **{human(pred.ttft_s * 1e3, 3)} ms** for a {view.context:,}-token prompt "
        f"(intensity {pred.prefill.intensity:,.0f} FLOP/B: {pred.prefill.bound}-bound); ITL "
        f"**{human(pred.itl_s * 1e3, 3)} ms** at batch {view.batch:,} (intensity {human(pred.decode.intensity, 3)} FLOP/B: "
        f"{pred.decode.bound}-bound), so {pred.tokens_per_s:,.0f} tokens/s in total. Critical batch, where "
        f"decode turns compute-bound: {critical}."
    )


def prefill_crossover_tokens(model: str = "mistral-7b", gpu: str = "H100-SXM", dtype: str = "bf16",
                             max_tokens: int = 1 << 20) -> int | None:
    """Shortest prompt (tokens, one sequence) whose whole prefill is compute-bound on ``gpu``'s datasheet
    (intensity at or above the ridge point), from the roofline's op count; None if none up to ``max_tokens``."""
    roof = roofline.gpu_roof(gpu)
    kw = dict(weight_dtype=dtype, kv_dtype=dtype, act_dtype=dtype)

    def compute_bound(tokens: int) -> bool:
        return roofline.predict_prefill(model, roof, 1, tokens, **kw).bound == "compute"

    return roofline.smallest_true(compute_bound, max_tokens)


def prefill_bound_text(model: str = "mistral-7b", gpu: str = "H100-SXM", dtype: str = "bf16",
                       short_prompt: int = 64) -> str:
    """When prefill is compute-bound: the crossover prompt length on ``gpu``'s datasheet and the
    intensity (FLOP/B) of a ``short_prompt``-token prefill, both from the roofline's op count."""
    roof = roofline.gpu_roof(gpu)
    kw = dict(weight_dtype=dtype, kv_dtype=dtype, act_dtype=dtype)
    short = roofline.predict_prefill(model, roof, 1, short_prompt, **kw)
    bytes_per_weight = memory.WEIGHT_FORMATS[dtype].bits / 8
    crossover = prefill_crossover_tokens(model, gpu, dtype)
    when = (f"from about **{crossover:,} prompt tokens**" if crossover else "at no prompt length up to a million "
            "tokens")
    return (f"each weight byte read serves every prompt token: 2 FLOPs per weight per token against {bytes_per_weight:g} B "
            f"per {dtype} weight, about {human(2 / bytes_per_weight, 3)} FLOP/B per prompt token. Prefill is "
            f"compute-bound only once that passes the ridge point: {when} for {roofline.as_shape(model).name} on the "
            f"{roof.name}'s datasheet (ridge {human(roof.ridge_point, 3)} FLOP/B), counting the tokens prefilled "
            f"together. A {short_prompt:,}-token prefill sits at {human(short.intensity, 3)} FLOP/B: "
            f"**{short.bound}-bound**" + (f", as is any prompt or chunked-prefill chunk shorter than {crossover:,} tokens"
                                          if crossover and short.bound == "memory" else ""))


def decode_intensity_text(model: str = "mistral-7b", context: int = 4096, dtype: str = "bf16") -> str:
    """'about 1.0 FLOP per byte at batch 1', computed from the roofline's op count."""
    ops = roofline.decode_ops(model, 1, context, weight_dtype=dtype, kv_dtype=dtype, act_dtype=dtype)
    intensity = sum(o.flops for o in ops) / sum(o.bytes for o in ops)
    return f"about {human(intensity, 2)} FLOP per byte at batch 1 ({model}, {dtype}, {context:,} tokens)"


OP_COLUMNS = [
    Column("name", "op (all layers)", "text"), Column("flops", "GFLOP", scale=1e-9), Column("bytes", "MB moved", scale=1e-6),
    Column("intensity", "FLOP/B"), Column("time_s", "time (µs)", scale=1e6), Column("bound", "bound", "text"),
]


def ops_table(rows: list[OpRow]):
    return people_table(rows, OP_COLUMNS)


def datasheet_figure(view: DatasheetView):
    p = view.prediction
    return roofline_figure(view.roof, [p.prefill, p.decode], {"prefill": view.prefill_ops, "decode": view.decode_ops},
                           title=f"{view.model} on {view.roof.name}\ndatasheet roof, predicted only (analytic)")
