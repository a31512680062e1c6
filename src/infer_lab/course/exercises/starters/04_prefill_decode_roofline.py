"""Chapter 04 · Prefill vs decode and the roofline: exercises.

Fill in each function, then run `infer-lab check 04`. FLOP/s and bytes/s are per second.
"""

from infer_lab.analysis.roofline import gpu_roof, predict_decode  # noqa: F401  (for critical_batch)


def roofline_time_s(flops: float, n_bytes: float, peak_flops: float, bandwidth_Bps: float) -> float:
    """The roofline's time of one op, in seconds.

    The op needs ``flops`` arithmetic and moves ``n_bytes`` through memory; the device does
    ``peak_flops`` FLOP/s and moves ``bandwidth_Bps`` bytes/s, and the two overlap.
    """
    raise NotImplementedError


def critical_batch_estimate(peak_flops: float, bandwidth_Bps: float, bytes_per_weight: float) -> float:
    """Predict the decode batch at which a decode step turns compute-bound.

    Count only the weights: a step reads each weight once (``bytes_per_weight`` bytes) and
    uses it for every sequence of the batch (2 FLOP each). Find the batch where the FLOPs
    per byte reach the ridge point. A float is fine.
    """
    raise NotImplementedError


def critical_batch(model: str, gpu: str, context: int, max_batch: int = 1 << 16) -> int | None:
    """The smallest decode batch whose step is compute-bound at ``context``; None if none up to ``max_batch``.

    ``predict_decode(model, gpu_roof(gpu), batch, context)`` returns a step with ``.flops``
    and ``.bytes`` (the KV reads of every sequence included); the step is compute-bound when
    ``flops / peak_flops >= bytes / bandwidth_Bps`` of the roof. Larger batches are never
    less compute-bound, so a binary search works.
    """
    raise NotImplementedError
