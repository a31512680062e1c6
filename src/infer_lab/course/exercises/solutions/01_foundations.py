"""Chapter 01 · Foundations: reference solutions."""


def layers_flop_share(vocab: int, hidden: int, layers: int, weights_per_layer: int) -> float:
    """2 FLOPs per weight in the layers and in the head: the factor 2 cancels."""
    in_layers = layers * weights_per_layer
    return in_layers / (in_layers + vocab * hidden)


def memory_over_compute(bytes_per_weight: float, bandwidth_Bps: float, flops_per_s: float) -> float:
    """Per weight: bytes_per_weight / bandwidth to read it, 2 / flops_per_s to use it."""
    return (bytes_per_weight / bandwidth_Bps) / (2 / flops_per_s)
