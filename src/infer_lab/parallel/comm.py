"""The all-reduce of a tensor-parallel rank, wrapped so every call is counted, sized and timed.

The model calls :meth:`Communicator.all_reduce` after its row-parallel matmuls; nothing else
in it knows about processes. The wrapper adds the rank's partial sums into the full sum in
place (``torch.distributed.all_reduce``, SUM) and records how many bytes it sent through the
collective and how long the rank spent inside it. That time is not only the transfer: a rank
that finished its matmuls early waits there for the slower one, so load imbalance shows up as
communication time (the chapter separates the two with the fitted all-reduce model).

With one rank there is nothing to reduce: :meth:`all_reduce` returns the tensor and counts
nothing, so the same model code runs unsplit.

On a GPU (nccl) the collective is queued on the stream; the timer synchronizes the device
before and after so the time is the collective's, which costs a little overlap a production
engine would keep.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class CommStats:
    """All-reduces since the last reset: calls, bytes (sum of message sizes) and seconds inside them."""

    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def __sub__(self, other: CommStats) -> CommStats:
        return CommStats(self.calls - other.calls, self.bytes - other.bytes, self.seconds - other.seconds)


class Communicator:
    """One rank's view of its tensor-parallel group; counts and times every all-reduce.

    Args:
        rank, world_size: this process's place in the group.
        group: the ``torch.distributed`` process group (``None``: the default group).
        device: where the tensors live (a CUDA device makes the timer synchronize it).
    """

    def __init__(self, rank: int = 0, world_size: int = 1, group=None, device: torch.device | str = "cpu"):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside a group of {world_size}")
        self.rank, self.world_size, self.group = rank, world_size, group
        self.device = torch.device(device)
        self._calls = 0
        self._bytes = 0
        self._seconds = 0.0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over the ranks, in place, and return it (counted and timed)."""
        if self.world_size == 1:
            return t

        self._sync()
        t0 = time.perf_counter()
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        self._sync()
        self._seconds += time.perf_counter() - t0
        self._calls += 1
        self._bytes += t.numel() * t.element_size()
        return t

    def barrier(self) -> None:
        """Wait for every rank (not counted: it carries no data)."""
        if self.world_size > 1:
            dist.barrier(group=self.group)

    def stats(self) -> CommStats:
        """Totals so far; subtract two snapshots for one step's share."""
        return CommStats(self._calls, self._bytes, self._seconds)

    def reset(self) -> None:
        self._calls, self._bytes, self._seconds = 0, 0, 0.0
