"""Steps of ``infer-lab tour``, one per course module; see :mod:`infer_lab.tour` for the contract."""
