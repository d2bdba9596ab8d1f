"""Nsight Compute over ``ncu_target``: ``main`` (``python -m flashref.bench profile``), ``decode``,
``hopper`` and ``source`` (stall sampling by instruction), sharing ``ncu``."""
