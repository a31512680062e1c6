"""Chapter 14 · Tensor parallelism: exercises.

Fill in each function, then run `infer-lab check 14`. Bandwidths are bytes/s in one
direction, latencies seconds. The split of a layer across processes, run for real on 2 of them,
is stage 8 of the build track (`infer-lab check engine tp`).
"""


def ring_allreduce_s(n_ranks: int, message_bytes: int, bus_bandwidth_Bps: float, hop_latency_s: float,
                     base_latency_s: float) -> float:
    """Seconds for a ring all-reduce of ``message_bytes`` held by each of ``n_ranks`` GPUs.

    The ring reduce-scatters, then all-gathers: N-1 steps each, and in every step each rank
    sends 1/N of the message to its neighbour (``bus_bandwidth_Bps``) and pays one hop's
    latency. The collective also costs ``base_latency_s`` to launch. One rank: 0 s.
    """
    raise NotImplementedError


def tp_decode_allreduces(layers: int, hidden: int, batch: int, bytes_per_value: int) -> tuple[int, int]:
    """Predict the all-reduces of one tensor-parallel decode step of ``batch`` sequences.

    Each layer's attention output and MLP output are partial sums across the ranks, to be
    added up before the next step of the layer; each is one vector of ``hidden`` values per
    token.

    Returns:
        ``(count, bytes of each)``.
    """
    raise NotImplementedError


def kv_copies(kv_heads: int, tp: int, mla: bool) -> float:
    """Predict how many copies of the model's KV cache a TP group of ``tp`` GPUs holds in all.

    Ranks split the KV heads: each rank holds the heads its query heads need, and a KV head
    cannot be split (ranks may hold different numbers of heads, as the chapter's TP engine
    splits SmolLM2's 3 KV heads 2 + 1 on 2 ranks). With more ranks than KV heads, each rank
    holds one head (vLLM's way; the chapter's engine refuses). An MLA model caches one latent
    per token that every head needs. 1.0 means no duplication.
    """
    raise NotImplementedError
