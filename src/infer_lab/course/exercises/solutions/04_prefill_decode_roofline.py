"""Chapter 04 · Prefill vs decode and the roofline: reference solutions."""

from infer_lab.analysis.roofline import gpu_roof, predict_decode


def roofline_time_s(flops: float, n_bytes: float, peak_flops: float, bandwidth_Bps: float) -> float:
    """The slower of computing and moving the bytes."""
    return max(flops / peak_flops, n_bytes / bandwidth_Bps)


def critical_batch_estimate(peak_flops: float, bandwidth_Bps: float, bytes_per_weight: float) -> float:
    """Intensity 2 B / bytes_per_weight reaches the ridge peak / bandwidth at B = ridge x bytes / 2."""
    return peak_flops / bandwidth_Bps * bytes_per_weight / 2


def critical_batch(model: str, gpu: str, context: int, max_batch: int = 1 << 16) -> int | None:
    """Binary search for the first batch whose compute time reaches its memory time."""
    roof = gpu_roof(gpu)

    def compute_bound(batch: int) -> bool:
        step = predict_decode(model, roof, batch, context)
        return step.flops / roof.peak_flops >= step.bytes / roof.bandwidth_Bps

    if not compute_bound(max_batch):
        return None
    lo, hi = 1, max_batch
    while lo < hi:
        mid = (lo + hi) // 2
        if compute_bound(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
