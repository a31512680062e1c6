"""Subcommands of ``infer-lab``; see :mod:`infer_lab.cli` for the contract."""
