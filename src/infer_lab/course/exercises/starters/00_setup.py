"""Chapter 00 · Setup: exercises.

Fill in each function, then run `infer-lab check 00` (add `--file PATH` if this file lives
elsewhere). Every check says which case failed and by how much. Units are in the docstrings:
FLOP/s and bytes/s are per second, GB = 1e9 bytes.
"""


def ridge_point(peak_flops: float, bandwidth_Bps: float) -> float:
    """The ridge point of a device, in FLOP per byte.

    A kernel that does fewer FLOPs per byte it moves than this waits on memory; one that
    does more waits on the arithmetic units.

    Args:
        peak_flops: the device's peak matmul throughput, FLOP/s.
        bandwidth_Bps: its memory bandwidth, bytes/s.
    """
    raise NotImplementedError


def decode_intensity(batch: int, bytes_per_weight: float) -> float:
    """Predict the arithmetic intensity (FLOP per byte) of one decode step.

    One decode step reads every weight once from memory and uses it once for each of the
    ``batch`` sequences (one multiply-add per weight per sequence). Ignore the KV cache and
    the activations: the check compares with the roofline's full count and accepts 10 %.

    Args:
        batch: sequences decoding together (one new token each).
        bytes_per_weight: 2 for bf16, 4 for fp32, 1 for fp8.
    """
    raise NotImplementedError


def mlp_flops(tokens: int, hidden: int, intermediate: int, layers: int) -> float:
    """FLOPs of the gated (SwiGLU) MLP of every layer for ``tokens`` tokens in one forward pass.

    Per layer: ``gate`` and ``up`` are (hidden -> intermediate) matmuls and ``down`` is
    (intermediate -> hidden). A matmul of a token with an (n x m) weight is n * m
    multiply-adds. The element-wise SiLU and product are negligible: leave them out.

    Returns:
        FLOPs (a float), all layers.
    """
    raise NotImplementedError
