"""The engine's CPU speed-ups, kept apart from the components a learner swaps.

* :mod:`.prepack`: GEMM weights reordered once for oneDNN (the fast small-batch path on a CPU);
* :mod:`.gemm_choice`: prepacked or plain GEMMs, chosen by timing both on this machine per step size;
* :mod:`.cpu_decode`: one user's decode step compiled, its GEMVs written as fused multiply-sum loops.

Each is an optimization of the library's own execution (:mod:`..executor`), with the plain path as
its reference: the engine's output is token-identical to transformers with or without them, and a
learner's forward pass or KV store (the course's build track) runs without them.
"""
