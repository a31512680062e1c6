"""How much slower than the reference machine this run is: the factor behind every settle timeout
and latency bound of the browser, Jupyter and server tests.

A notebook that settles in 20 s on a quiet 2-core machine takes several times that while other
programs keep the cores busy; a fixed 60 s bound then fails a notebook that is only slow. So the
bounds are written for the reference machine (a quiet 2-core AMD EPYC, the CI machine) and
multiplied by :attr:`Slowness.factor`, measured once per test session from two things:

* the **probe**: the median of 3 runs of a fixed CPU workload (a pure-Python loop and
  single-threaded float32 matmuls, about 70 ms a run on the reference machine), divided by
  :data:`REFERENCE_PROBE_S`. It catches a slower CPU and contention at the moment it runs.
* the **load**: ``1 + load1 / cpus`` from the 1-minute load average read when the session
  started (``os.getloadavg()``, ``os.cpu_count()``): a test that keeps every core busy gets
  ``cpus / (cpus + load1)`` of the CPU beside that many other runnable threads, so it takes that
  many times as long. It catches a load that the short probe happened to miss.

The factor is the larger of the two, never below 1 and at most :data:`CAP` (a hung notebook must
still fail in finite time). ``INFER_LAB_TEST_SLOWNESS=3`` sets it outright (the probe still runs
and is reported). Every failure message built with :meth:`Slowness.explain` says what was
measured: the factor, the probe, the load average then and now, and the elapsed time.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from dataclasses import dataclass

REFERENCE_PROBE_S = 0.072  # median probe on the reference machine, quiet (AMD EPYC, 2 cores): 70-74 ms
CAP = 10.0
ENV = "INFER_LAB_TEST_SLOWNESS"


@dataclass(frozen=True)
class Slowness:
    """The session's slowness factor and what it was computed from."""

    factor: float
    probe_s: float
    reference_s: float
    load1: float | None  # 1-minute load average when the session started
    cpus: int
    forced: bool = False  # set by INFER_LAB_TEST_SLOWNESS

    def scale(self, base_s: float) -> float:
        """A bound written for the reference machine, scaled to this run."""
        return base_s * self.factor

    def text(self) -> str:
        """One line for a failure message: the factor and everything it came from."""
        start = f"{self.load1:.1f}" if self.load1 is not None else "unknown"
        now = load1()
        how = f"set by {ENV}" if self.forced else f"capped at {CAP:g}"
        return (f"slowness factor {self.factor:.2f} ({how}): probe {self.probe_s * 1e3:.0f} ms against "
                f"{self.reference_s * 1e3:.0f} ms on the reference machine; 1-minute load average {start} "
                f"at the start of the run, {'unknown' if now is None else f'{now:.1f}'} now, on {self.cpus} CPUs")

    def explain(self, what: str, elapsed_s: float | None, base_s: float) -> str:
        """'<what>: 75.2 s elapsed against a bound of 90.0 s (60 s x factor 1.50); <text>'."""
        took = "elapsed time unknown" if elapsed_s is None else f"{elapsed_s:.1f} s elapsed"
        return (f"{what}: {took} against a bound of {self.scale(base_s):.1f} s ({base_s:g} s on the reference "
                f"machine x {self.factor:.2f}); {self.text()}")


def load1() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows
        return None


def probe_once() -> float:
    """Wall seconds of one fixed CPU workload: a Python loop and single-threaded matmuls."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.ones(256, 256)
        start = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i % 7
        for _ in range(150):
            a = torch.mm(a, a).clamp_(max=1.0)
        return time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)


def probe_seconds(repeats: int = 3) -> float:
    """The median of ``repeats`` probes (the first run also pays for warming the allocator)."""
    return statistics.median(probe_once() for _ in range(repeats))


def factor_from(probe_s: float, load1: float | None, cpus: int, reference_s: float = REFERENCE_PROBE_S) -> float:
    """max(probe / reference, 1 + load1 / cpus), clamped to [1, CAP]."""
    from_load = 1.0 + load1 / max(cpus, 1) if load1 is not None else 1.0
    return min(CAP, max(1.0, probe_s / reference_s, from_load))


def measure(start_load1: float | None = None) -> Slowness:
    """Probe now; ``start_load1`` is the load average read when the session started (read now when None)."""
    start_load1 = load1() if start_load1 is None else start_load1
    cpus = os.cpu_count() or 1
    probe = probe_seconds()
    forced = os.environ.get(ENV)
    if forced:
        factor = float(forced)
        if not factor >= 1.0:
            raise ValueError(f"{ENV} must be a number >= 1, got {forced!r}")
        return Slowness(factor, probe, REFERENCE_PROBE_S, start_load1, cpus, forced=True)
    return Slowness(factor_from(probe, start_load1, cpus), probe, REFERENCE_PROBE_S, start_load1, cpus)


START_LOAD1 = load1()  # read when this module is first imported (tests/conftest.py: as the run starts)


@functools.cache
def session() -> Slowness:
    """This test run's factor, measured once (at the first ask) against the load read at the start."""
    return measure(START_LOAD1)


def latency_bound(base_s: float, most: float = 3.0) -> float:
    """A latency bound written for the reference machine, scaled by this run's factor up to ``most`` times.

    For bounds that catch a blocked event loop (a healthy one answers in milliseconds, a blocked one
    in many seconds): scaled enough to pass on a busy machine, not so far that a block would hide.
    """
    return base_s * min(most, session().factor)
