"""Running tensor parallelism: process groups, worker processes, the greedy step loop.

**Processes.** :class:`TPGroup` starts ``world_size`` worker processes (``torch.multiprocessing``,
spawn), hands each its shard of the weights (through shared memory: the parent shards once)
and joins them into one ``torch.distributed`` group: **gloo** on a CPU, **nccl** with one GPU per
rank. The workers stay up between commands, so one group serves many runs; the parent only
sends commands and collects each rank's answer. The nccl path is the same code with the
shards moved to ``cuda:<rank>``; it has not been run on a multi-GPU machine here.

**The step loop** (:func:`greedy_generate`, identical on every rank): one prefill step over all
prompts in a flat batch, then decode steps of one token per unfinished sequence, greedy, until
each sequence has ``max_new_tokens`` tokens or emits EOS (kept, as transformers does). Each step
records its wall time and, from the communicator, its all-reduces: calls, bytes and the seconds
spent inside them; compute is the rest.

World size 1 runs in the calling process (:func:`run_local`): the same model code with a
communicator that has nothing to reduce.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import statistics
import sys
import time
import traceback
import types
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..engine import EngineModel
from .bench import AllReduceSweep, default_sizes, time_allreduces
from .comm import Communicator
from .layers import TPModel
from .shard import ModelShard, shard_layer, shard_model

# ---------------------------------------------------------------------------------------------
# What a run returns


@dataclass(frozen=True)
class StepTiming:
    """One forward step on one rank. Seconds; ``allreduce_bytes`` sums the messages' sizes."""

    step: int
    phase: str  # "prefill" or "decode"
    seqs: int
    tokens: int
    wall_s: float
    comm_s: float
    allreduce_calls: int
    allreduce_bytes: int

    @property
    def compute_s(self) -> float:
        """Wall time outside the all-reduces (matmuls, attention, the LM head, bookkeeping)."""
        return self.wall_s - self.comm_s


@dataclass(frozen=True)
class RankRun:
    """One rank's greedy run: the tokens it picked and every step's timing."""

    rank: int
    world_size: int
    backend: str
    device: str
    threads: int
    token_ids: list[list[int]]
    steps: list[StepTiming]
    kv_cache_bytes: int
    split_params: int
    replicated_params: int


@dataclass(frozen=True)
class StepSplit:
    """Medians over a run's decode steps (seconds): wall, inside all-reduces, and the rest."""

    steps: int
    wall_s: float
    comm_s: float
    compute_s: float
    allreduce_calls: int  # per step
    allreduce_bytes: int  # per step

    @property
    def comm_share(self) -> float:
        return self.comm_s / self.wall_s if self.wall_s else 0.0


def decode_split(steps: list[StepTiming]) -> StepSplit:
    """Median wall / communication / compute of the decode steps (the prefill step left out)."""
    dec = [s for s in steps if s.phase == "decode"] or list(steps)
    return StepSplit(
        steps=len(dec),
        wall_s=statistics.median(s.wall_s for s in dec),
        comm_s=statistics.median(s.comm_s for s in dec),
        compute_s=statistics.median(s.compute_s for s in dec),
        allreduce_calls=round(statistics.median(s.allreduce_calls for s in dec)),
        allreduce_bytes=round(statistics.median(s.allreduce_bytes for s in dec)),
    )


@dataclass(frozen=True)
class TPRun:
    """A greedy run at one world size: every rank's view (they must agree on the tokens)."""

    world_size: int
    ranks: list[RankRun]
    wall_s: float

    @property
    def token_ids(self) -> list[list[int]]:
        return self.ranks[0].token_ids

    @property
    def steps(self) -> list[StepTiming]:
        return self.ranks[0].steps

    @property
    def threads(self) -> int:
        return self.ranks[0].threads

    @property
    def allreduce_count(self) -> int:
        """All-reduces of the whole run on rank 0."""
        return sum(s.allreduce_calls for s in self.steps)

    @property
    def allreduce_bytes(self) -> int:
        return sum(s.allreduce_bytes for s in self.steps)

    def decode_split(self, rank: int = 0) -> StepSplit:
        return decode_split(self.ranks[rank].steps)

    def prefill_step(self, rank: int = 0) -> StepTiming:
        return self.ranks[rank].steps[0]


# ---------------------------------------------------------------------------------------------
# The step loop (every rank runs it)


def greedy_generate(
    model: TPModel,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos_token_id: int | None = None,
    ignore_eos: bool = False,
) -> tuple[list[list[int]], list[StepTiming], int]:
    """Greedy tokens of every prompt, each step's timing, and the KV cache's bytes on this rank."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    limit = model.shape.max_position_embeddings
    longest = max(len(p) for p in prompts) + max_new_tokens
    if longest > limit:
        raise ValueError(f"prompt + new tokens reach {longest} positions; {model.shape.name} has {limit}")
    comm, dev = model.comm, model.device
    cache = model.new_cache(len(prompts), longest)
    out: list[list[int]] = [[] for _ in prompts]
    lengths = [len(p) for p in prompts]
    steps: list[StepTiming] = []

    def finished(s: int) -> bool:
        return len(out[s]) >= max_new_tokens or (not ignore_eos and out[s][-1] == eos_token_id)

    def timed(phase: str, seqs: list[int], tokens: int, fn, *args):
        before = comm.stats()
        t0 = time.perf_counter()
        picks = fn(*args).argmax(dim=-1).tolist()  # .tolist() waits for the device
        wall = time.perf_counter() - t0
        d = comm.stats() - before
        steps.append(StepTiming(len(steps), phase, len(seqs), tokens, wall, d.seconds, d.calls, d.bytes))
        for s, tok in zip(seqs, picks, strict=True):
            out[s].append(int(tok))

    active = list(range(len(prompts)))
    timed("prefill", active, sum(lengths), model.prefill, prompts, active, cache)
    active = [s for s in active if not finished(s)]
    while active:
        tokens, lens = [out[s][-1] for s in active], [lengths[s] for s in active]
        timed("decode", active, len(active), model.decode, tokens, active, lens, cache)
        for s in active:
            lengths[s] += 1
        active = [s for s in active if not finished(s)]
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return out, steps, cache.bytes


def _rank_run(model: TPModel, backend: str, prompts, max_new_tokens, eos_token_id, ignore_eos, warmup) -> RankRun:
    if warmup:  # first calls allocate and pick kernels: keep them out of the timings
        greedy_generate(model, prompts[:1], min(2, max_new_tokens), eos_token_id, True)
    model.comm.reset()
    tokens, steps, kv_bytes = greedy_generate(model, prompts, max_new_tokens, eos_token_id, ignore_eos)
    split, replicated = model.shard.param_counts()
    return RankRun(model.comm.rank, model.comm.world_size, backend, str(model.device), torch.get_num_threads(),
                   tokens, steps, kv_bytes, split, replicated)


def tp_engine_model(lm: Any):
    """The engine's model over a loaded model's weights (shared, not copied), named as ``lm`` is,
    so messages say ``smollm2-135m`` rather than a cache path."""
    model = EngineModel.from_hf(lm.model)
    model.shape = replace(model.shape, name=lm.name)
    return model


def run_local(
    engine_model: Any,
    prompts: list[list[int]],
    max_new_tokens: int,
    ignore_eos: bool = False,
    threads: int | None = None,
    warmup: bool = True,
) -> TPRun:
    """World size 1 in this process: the unsplit reference, through the same model code.

    ``threads``: torch threads for the run (default: as they are); restored afterwards.
    """
    (shard,) = shard_model(engine_model, 1)
    model = TPModel(shard, Communicator(0, 1, device=shard.embed.device))
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        t0 = time.perf_counter()
        run = _rank_run(model, "none", prompts, max_new_tokens, engine_model.shape.eos_token_id, ignore_eos, warmup)
        return TPRun(1, [run], time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------------
# Worker processes


def _init_group(rank: int, world_size: int, init_method: str, backend: str, timeout_s: float) -> None:
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))


def _worker(rank: int, world_size: int, init_method: str, backend: str, shard: ModelShard, threads: int,
            commands, results, timeout_s: float, layer=None) -> None:
    """One rank: join the group, then serve commands until "stop". Every answer is (rank, kind, payload)."""
    try:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # ranks on one machine talk over loopback
        torch.set_num_threads(threads)
        device = torch.device("cpu")
        if backend == "nccl":
            device = torch.device("cuda", rank)
            torch.cuda.set_device(device)
            shard = shard.to(device)
        _init_group(rank, world_size, init_method, backend, timeout_s)
        comm = Communicator(rank, world_size, device=device)
        model = TPModel(shard, comm)
        if layer is not None:
            model.layer_fn = layer
        results.put((rank, "ready", None))
        while True:
            cmd, kwargs = commands.get()
            if cmd == "stop":
                break
            try:
                if cmd == "generate":
                    payload = _rank_run(model, backend, **kwargs)
                elif cmd == "allreduce":
                    payload = time_allreduces(comm, **kwargs)
                else:
                    raise ValueError(f"unknown command {cmd!r}")
                results.put((rank, "ok", payload))
            except Exception:
                results.put((rank, "error", traceback.format_exc()))
    except Exception:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@contextlib.contextmanager
def _main_module_hidden():
    """Start spawned workers without re-running ``__main__`` in each of them.

    A spawned child normally imports the parent's main module again (a script, a notebook,
    pytest), which re-runs its top level, or refuses to start when that module lacks an
    ``if __name__ == "__main__"`` guard. The workers need nothing from it (their code is in
    this module), so the main module is hidden while they start.
    """
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_backend() -> str:
    """``nccl`` when there is a CUDA GPU per rank, else ``gloo`` (CPU processes)."""
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > 1 else "gloo"


@dataclass
class TPGroup:
    """``world_size`` worker processes holding the shards of one model, joined in one group.

    Use it as a context manager; it starts the workers (a few seconds: each imports torch) and
    stops them on exit, also after an error. ``threads_per_rank`` defaults to this process's
    torch threads divided by the ranks (at least 1), so the group uses the same cores as a
    world-size-1 run here.

    Two plug points (stage 8 of the course's build track): ``split`` cuts each layer for each rank in
    this process (:func:`~infer_lab.parallel.shard.shard_model`'s ``split``); ``layer`` replaces
    :attr:`TPModel.layer_fn` in every worker, so it must pickle (spawned workers import it: a
    module-level function, or a picklable callable). ``None``: the library's own.

    >>> with TPGroup(EngineModel.from_hf(lm.model), world_size=2) as group:  # doctest: +SKIP
    ...     run = group.generate(prompts, max_new_tokens=8)
    """

    engine_model: Any
    world_size: int = 2
    backend: str | None = None
    threads_per_rank: int | None = None
    timeout_s: float = 300.0
    split: Any = None
    layer: Any = None
    _procs: list = field(default_factory=list, repr=False)
    _commands: list = field(default_factory=list, repr=False)
    _results: Any = field(default=None, repr=False)

    def __post_init__(self):
        if self.world_size < 2:
            raise ValueError("a TP group needs at least 2 ranks; world size 1 is run_local(...)")
        self.backend = self.backend or default_backend()
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {self.backend!r}")
        if self.backend == "nccl" and torch.cuda.device_count() < self.world_size:
            raise ValueError(f"nccl needs one GPU per rank: {self.world_size} ranks, "
                             f"{torch.cuda.device_count()} GPUs here (use backend='gloo')")
        self.threads_per_rank = self.threads_per_rank or max(1, torch.get_num_threads() // self.world_size)
        self.shards = shard_model(self.engine_model, self.world_size, self.split or shard_layer)  # checks the split first

    @property
    def plan(self):
        return self.shards[0].plan

    def start(self) -> TPGroup:
        if self._procs:
            return self
        ctx = mp.get_context("spawn")
        init = f"tcp://127.0.0.1:{_free_port()}"
        self._results = ctx.Queue()
        self._commands = [ctx.Queue() for _ in range(self.world_size)]
        with _main_module_hidden():
            for rank, shard in enumerate(self.shards):
                p = ctx.Process(target=_worker, daemon=True, name=f"tp-rank-{rank}",
                                args=(rank, self.world_size, init, self.backend, shard, self.threads_per_rank,
                                      self._commands[rank], self._results, self.timeout_s, self.layer))
                p.start()
                self._procs.append(p)
        try:
            self._collect("ready")
        except BaseException:
            self.close()
            raise
        return self

    def _collect(self, expect: str) -> list[Any]:
        """One answer per rank, in rank order; a clear error when a rank fails or dies."""
        answers: dict[int, Any] = {}
        deadline = time.monotonic() + self.timeout_s
        while len(answers) < self.world_size:
            try:
                rank, kind, payload = self._results.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in self._procs if p.exitcode is not None]
                if dead:
                    raise RuntimeError(f"TP worker {dead[0].name} exited with code {dead[0].exitcode}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"TP workers did not answer within {self.timeout_s:.0f} s") from None
                continue
            if kind == "error":
                raise RuntimeError(f"TP rank {rank} failed:\n{payload}")
            if kind != expect:
                raise RuntimeError(f"TP rank {rank} answered {kind!r}, expected {expect!r}")
            answers[rank] = payload
        return [answers[r] for r in range(self.world_size)]

    def _ask(self, cmd: str, **kwargs: Any) -> list[Any]:
        if not self._procs:
            raise RuntimeError("the TP group is not started: use it as a context manager or call start()")
        for q in self._commands:
            q.put((cmd, kwargs))
        try:
            return self._collect("ok")
        except BaseException:
            self.close()
            raise

    def generate(self, prompts: list[list[int]], max_new_tokens: int, ignore_eos: bool = False,
                 warmup: bool = True, require_agreement: bool = True) -> TPRun:
        """Greedy tokens of every prompt on every rank; an error if the ranks disagree (unless
        ``require_agreement`` is False: then every rank's tokens come back, for the caller to compare)."""
        t0 = time.perf_counter()
        ranks = self._ask("generate", prompts=[list(map(int, p)) for p in prompts],
                          max_new_tokens=max_new_tokens, eos_token_id=self.engine_model.shape.eos_token_id,
                          ignore_eos=ignore_eos, warmup=warmup)
        wall = time.perf_counter() - t0
        for r in ranks[1:] if require_agreement else ():
            if r.token_ids != ranks[0].token_ids:
                raise RuntimeError(f"rank {r.rank} picked different tokens than rank 0: the ranks diverged")
        return TPRun(self.world_size, ranks, wall)

    def allreduce_sweep(self, sizes_bytes: tuple[int, ...] | None = None, repeats: int = 20,
                        warmup: int = 3) -> AllReduceSweep:
        """Time all-reduces of each size on this group (rank 0's times) and fit latency + bandwidth."""
        sizes = tuple(sizes_bytes or default_sizes())
        times = self._ask("allreduce", sizes_bytes=sizes, repeats=repeats, warmup=warmup)
        return AllReduceSweep.from_times(self.world_size, self.backend, self.threads_per_rank, sizes, times[0])

    def close(self) -> None:
        """Stop the workers (politely, then by force) and forget them."""
        for q in self._commands:
            try:
                q.put(("stop", {}))
            except Exception:
                pass
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        self._procs, self._commands = [], []

    def __enter__(self) -> TPGroup:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
