"""Tensor parallelism, written from scratch and run for real on several processes.

A decoder layer's matmuls are split across ``world_size`` ranks. The column-parallel ones
(q/k/v and gate/up) give each rank some output features of its own (its attention heads, its
slice of the MLP); the row-parallel ones (o and down) give each rank a partial sum of the full
output, and an all-reduce adds the partial sums: two all-reduces per layer. Each idea has its
own file:

=============  ===========================================================================
``shard``      which heads and MLP columns each rank owns, and the rank's slices of the weights
``comm``       the all-reduce, wrapped to count its calls and bytes and to time it
``cache``      a per-rank KV cache: one region per sequence for the rank's own KV heads
``layers``     the TP decoder layer and the sharded model (prefill and decode steps)
``runtime``    process groups (gloo on a CPU, nccl on GPUs), the worker processes, greedy runs
``bench``      all-reduce time vs message size, measured on the live process group
=============  ===========================================================================

This is the mechanism, small enough to read. For serving a model across GPUs, use a
distributed engine (``infer-lab engines launch vllm --tp N``).
"""

from __future__ import annotations

from .comm import CommStats, Communicator
from .shard import RankShare, ShardPlan, plan_shards, shard_model

__all__ = ["CommStats", "Communicator", "RankShare", "ShardPlan", "plan_shards", "shard_model"]
