"""infer_lab: the library behind a hands-on course on LLM inference at scale.

Modules mirror the course notebooks: ``models`` (three model sources), ``hardware`` (what you
have and its measured ceilings), ``harness`` (honest timing), ``analysis`` (memory equation,
roofline, capacity), ``quant``, ``attention`` and ``engine`` (a from-scratch serving engine).
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"

# CPU threads on a busy machine: OpenMP's wait policy, set before torch loads.
#
# PyTorch's CPU kernels (and MKL's) run on OpenMP threads, one per core. Between two parallel
# regions an idle OpenMP thread spin-waits before it sleeps (GNU libgomp, which Linux torch wheels
# ship: 300,000 spins, about 3 ms). On a quiet machine that saves a wake-up per region; beside other
# programs the spinning thread burns the time slice its partner needs, and each of a decode step's
# many small regions waits at its barrier for a thread the scheduler has not run yet, so the course
# slowed 10-60x under a load that explains 2-5x. OMP_WAIT_POLICY=PASSIVE makes a waiting thread
# sleep at once: the work then slows in proportion to the load. Measured on the course's 2-core
# machine (AMD EPYC, torch 2.13 CPU, 2 torch threads; median seconds [range] of 3-12 runs; "quiet"
# = this process at real-time priority, "N hogs" = N other processes spinning in a loop):
#
#   work                        policy          quiet              2 hogs              4 hogs
#   1 request, 32 tokens        default         0.49 [0.45-0.65]   5.3 [3.3-6.4]       11.4 [9.7-12.6]
#   (engine.generate)           PASSIVE         0.66 [0.61-0.76]   1.45 [0.88-1.68]    1.56 [1.41-1.68]
#   4 requests x 16 tokens      default         0.35 [0.33-0.40]   3.0 [2.8-22.1]      6.9 [6.5-63.4]
#                               PASSIVE         0.48 [0.46-0.52]   1.22 [0.62-1.41]    1.55 [1.03-1.69]
#   ch02's "memory" part        default         1.25 [1.14-1.32]   7.0 [6.4-7.9]       19.3 [12.4-61.0]
#                               PASSIVE         1.33 [1.18-1.42]   3.3 [2.6-3.7]       3.7 [3.6-5.2]
#
# The part used 2.4 s of CPU quiet with either policy, but 5.2 s (2 hogs) and 9.5 s (4 hogs) with
# the default one; 2.2-2.5 s with PASSIVE. The price on a quiet machine is a wake-up per region:
# one request decodes at 48 instead of 65 tokens/s, 4 requests at 133 instead of 183, a notebook part 6 %
# slower. Shorter spins (GOMP_SPINCOUNT=1000-100000) or one torch thread did worse under load.
#
# So infer_lab asks for PASSIVE waiting unless you chose a policy yourself: OMP_WAIT_POLICY or
# GOMP_SPINCOUNT in the environment wins (``GOMP_SPINCOUNT=300000 infer-lab ...`` brings back
# libgomp's default spin, the fastest on a machine that stays quiet). OpenMP reads it once, when
# torch is imported, so it applies only where infer_lab is imported before torch (the CLI,
# scripts/workshop.py's marimo server and its kernels, most notebooks, the tests' conftest);
# processes started from there inherit it. ``infer-lab env`` prints the policy and whether it applies.
#
# ``infer-lab serve`` is the exception: a server process that has the machine's cores to itself
# spins briefly (GOMP_SPINCOUNT=10000) unless told ``--omp-wait passive``; see
# infer_lab/commands/serve.py for its measurements.
_OMP_MARK = "INFER_LAB_CHOSE_OMP_WAIT"  # beside the policy infer_lab set, so a child process knows whose it is
_INHERITED = (_os.environ.get(_OMP_MARK) == _os.environ.get("OMP_WAIT_POLICY") == "PASSIVE"
              and "GOMP_SPINCOUNT" not in _os.environ)  # set by an infer_lab parent, not by you
OMP_WAIT_POLICY_SET_BY = ("you" if {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(_os.environ) and not _INHERITED
                          else "infer_lab")
OMP_WAIT_POLICY_APPLIES = "torch" not in _sys.modules  # torch imported first read the policy already
if OMP_WAIT_POLICY_SET_BY == "infer_lab":
    _os.environ["OMP_WAIT_POLICY"] = _os.environ[_OMP_MARK] = "PASSIVE"
