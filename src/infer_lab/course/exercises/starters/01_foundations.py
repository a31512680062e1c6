"""Chapter 01 · Foundations: exercises.

Fill in each function, then run `infer-lab check 01`. Shares are fractions (0..1), bandwidth is
bytes per second, compute is FLOP per second.
"""


def layers_flop_share(vocab: int, hidden: int, layers: int, weights_per_layer: int) -> float:
    """Predict the fraction (0..1) of one decode step's FLOPs that the decoder layers do.

    One token goes through ``layers`` layers of ``weights_per_layer`` weights each, then the LM
    head, a ``hidden x vocab`` matrix. Every weight a token is multiplied by costs 2 FLOPs (a
    multiply and an add); the embedding is a lookup. Leave out the norms and the attention over
    the cache (a short context).
    """
    raise NotImplementedError


def memory_over_compute(bytes_per_weight: float, bandwidth_Bps: float, flops_per_s: float) -> float:
    """Predict how many times longer a batch-1 decode step takes to read its weights than to do its
    arithmetic, on a device of ``bandwidth_Bps`` and ``flops_per_s``.

    The step reads every weight once (``bytes_per_weight`` bytes each) and does 2 FLOPs per weight.
    Leave out the KV cache and the activations.
    """
    raise NotImplementedError
