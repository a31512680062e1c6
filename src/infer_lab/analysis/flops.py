"""Where the FLOPs of one forward pass go, component by component, from a model's config alone.

The components of a Llama-family decoder, in the order a token meets them:

* **embedding**: a row lookup, no arithmetic (0 FLOP);
* **attention projections**: q, k, v and o, ``2 x params`` FLOPs per token (a multiply and an add
  per weight);
* **attention scores**: ``Q·Kᵀ`` and the weighted sum of V over the cached context, the only part
  whose work grows with the context;
* **MLP**: gate, up and down (or the routed experts of a mixture-of-experts layer);
* **norms**: two RMSNorms per layer for every token, and the final one for the last position, counted as :data:`NORM_FLOPS_PER_ELEMENT` FLOPs per
  element (square, sum, scale by the reciprocal root, multiply by the weight);
* **LM head**: the last hidden state times the vocabulary matrix.

The matmul counts are the roofline's own (:func:`infer_lab.analysis.roofline.step_ops`), so the two
never disagree. Residual adds, RoPE and the SiLU gate are elementwise like the norms and of the same
small size; they are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from .memory import ModelLike, as_shape
from .roofline import step_ops

COMPONENTS = ("embedding", "attention projections", "attention scores", "MLP", "norms", "LM head")
LAYER_COMPONENTS = ("attention projections", "attention scores", "MLP", "norms")
NORM_FLOPS_PER_ELEMENT = 4


@dataclass(frozen=True)
class ComponentFlops:
    """FLOPs of one forward pass by component (:data:`COMPONENTS`), for ``tokens`` new tokens of
    one sequence whose last token attends ``context`` tokens (itself included)."""

    model: str
    tokens: int
    context: int
    flops: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.flops.values())

    def share(self, component: str) -> float:
        """The fraction (0..1) of the pass's FLOPs in ``component``."""
        return self.flops[component] / self.total

    @property
    def layers(self) -> float:
        """FLOPs in the decoder layers: projections, attention scores, MLP and norms (the final norm
        included, so that every norm is in one place; it is one of ``2 x layers + 1``)."""
        return sum(self.flops[c] for c in LAYER_COMPONENTS)

    @property
    def layers_share(self) -> float:
        return self.layers / self.total


def _component(op_name: str) -> str:
    if op_name.startswith(("q/", "o projection")):
        return "attention projections"
    if op_name.startswith("attention"):
        return "attention scores"
    if op_name.startswith(("MLP", "MoE")):
        return "MLP"
    if op_name == "LM head":
        return "LM head"
    raise ValueError(f"no component for the op {op_name!r}")


def flops_by_component(model: ModelLike, context: int, tokens: int = 1) -> ComponentFlops:
    """FLOPs by component of one pass that feeds ``tokens`` new tokens to one sequence, the last of
    them at position ``context`` (a decode step: ``tokens=1``; a prefill: ``tokens == context``).

    Only the last position's logits are computed, as a server does.
    """
    if not 1 <= tokens <= context:
        raise ValueError(f"need 1 <= tokens <= context, got tokens={tokens}, context={context}")
    shape = as_shape(model)
    flops = dict.fromkeys(COMPONENTS, 0.0)
    for op in step_ops(shape, 1, tokens, past=context - tokens, logits="last"):
        flops[_component(op.name)] += op.flops
    flops["norms"] = float(NORM_FLOPS_PER_ELEMENT * shape.hidden * (2 * shape.layers * tokens + 1))  # final norm: last row
    return ComponentFlops(shape.name, tokens, context, flops)
