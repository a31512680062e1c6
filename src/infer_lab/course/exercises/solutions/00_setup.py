"""Chapter 00 · Setup: reference solutions."""


def ridge_point(peak_flops: float, bandwidth_Bps: float) -> float:
    """FLOP per byte where compute time equals memory time: peak / bandwidth."""
    return peak_flops / bandwidth_Bps


def decode_intensity(batch: int, bytes_per_weight: float) -> float:
    """2 FLOP (one multiply-add) per weight per sequence, over the weight's bytes read once."""
    return 2.0 * batch / bytes_per_weight


def mlp_flops(tokens: int, hidden: int, intermediate: int, layers: int) -> float:
    """Three (hidden x intermediate) matmuls per layer, 2 FLOP per weight per token."""
    return 2.0 * tokens * 3 * hidden * intermediate * layers
