"""Chapter 14 · Tensor parallelism: reference solutions."""


def ring_allreduce_s(n_ranks: int, message_bytes: int, bus_bandwidth_Bps: float, hop_latency_s: float,
                     base_latency_s: float) -> float:
    """t_base + 2(N-1) t_hop + 2(N-1)/N x S / B_bus."""
    if n_ranks == 1:
        return 0.0
    steps = 2 * (n_ranks - 1)
    return base_latency_s + steps * hop_latency_s + steps / n_ranks * message_bytes / bus_bandwidth_Bps


def tp_decode_allreduces(layers: int, hidden: int, batch: int, bytes_per_value: int) -> tuple[int, int]:
    """Two per layer (after attention, after the MLP), one hidden vector per token each."""
    return 2 * layers, batch * hidden * bytes_per_value


def kv_copies(kv_heads: int, tp: int, mla: bool) -> float:
    """Whole KV heads per rank: split without copies up to tp = kv_heads, then one head per rank; MLA: every rank."""
    if tp == 1:
        return 1.0
    if mla:
        return float(tp)
    return max(1.0, tp / kv_heads)
