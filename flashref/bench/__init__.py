"""Benchmarks: ``python -m flashref.bench cpu`` and ``python -m flashref.bench gpu``.

They print numbers beside a baseline measured in the same run; they are not tests.
"""
