"""The rule that picks each family's default version from a recorded run.

One rule picks the version ``version=None`` runs (:func:`best_worst_case`): per (dtype, head
dimension, mask), the version whose *worst* ratio to the fastest version at each sequence
length is highest, so that a small win at one length cannot hide a large loss at another
(a median over the lengths can); equal worst cases are split by the median TFLOP/s. The
default tables of the forward and backward versions are checked against it.
The forward's tables (``PREFERENCE``, ``HOPPER_PREFERENCE`` in ``flashref.gpu.forward_versions``)
are checked against :func:`best_worst_case` of ``forward_tflops`` of the recorded forward
runs, the backward's (``flashref.gpu.backward_versions``) against :func:`best_backward` of
the recorded backward run. The standard library only.
"""

from __future__ import annotations

import statistics

__all__ = ["worst_cases", "forward_tflops", "best_worst_case", "best_backward"]


def worst_cases(tflops: dict) -> dict:
    """``{version: (worst ratio, median TFLOP/s)}`` of ``tflops``, ``{version: {N: TFLOP/s}}``:
    each version's smallest ratio, over the lengths N, of its TFLOP/s to the fastest
    version's at that N (1.0: never beaten). Every version must have run at every N."""
    if not tflops:
        raise ValueError("tflops must hold at least one version")
    lengths = {frozenset(by_n) for by_n in tflops.values()}
    if len(lengths) != 1 or not next(iter(lengths)):
        raise ValueError(f"every version must have run at the same lengths N, got {tflops}")
    best = {n: max(by_n[n] for by_n in tflops.values()) for n in next(iter(lengths))}
    return {
        version: (min(by_n[n] / best[n] for n in by_n), statistics.median(by_n.values()))
        for version, by_n in tflops.items()
    }


def forward_tflops(rows) -> dict:
    """``{(dtype, d, causal): {version: {N: TFLOP/s}}}`` of flashref's rows of a forward
    benchmark file (``gpu_bench.json``, ``gpu_hopper.json``), those whose kernel ran in the
    dtype it was asked for: what :func:`best_worst_case` takes, per case."""
    out: dict = {}
    for r in rows:
        if r["family"] == "flashref" and r["tflops"] and r["dtype"] == r["run_dtype"]:
            key = (r["dtype"], r["d"], r["causal"])
            out.setdefault(key, {}).setdefault(r["version"], {})[r["N"]] = r["tflops"]
    return out


def best_worst_case(tflops: dict) -> int:
    """The version ``version=None`` takes, from ``{version: {N: TFLOP/s}}`` of one (dtype, d,
    mask): the highest worst-case ratio to the fastest (:func:`worst_cases`), ties broken by
    the higher median TFLOP/s, then by the lower version number."""
    cases = worst_cases(tflops)
    return max(sorted(cases), key=lambda v: cases[v])


def best_backward(rows, allowed) -> dict:
    """For each (dtype, d, causal) of the backward rows, the flashref version among
    ``allowed`` that ``version=None`` should take: the book's rule
    (:func:`best_worst_case`, the highest worst-case ratio to the fastest over the sequence
    lengths) that chose ``BWD_PREFERENCE`` and ``BWD_HOPPER_PREFERENCE``."""
    allowed = set(allowed)
    by_case: dict = {}
    for r in rows:
        if r["impl"] == "flashref" and r["direction"] == "backward" and r["version"] in allowed:
            case = by_case.setdefault((r["dtype"], r["d"], r["causal"]), {})
            case.setdefault(r["version"], {})[r["N"]] = r["tflops"]
    return {case: best_worst_case(by_version) for case, by_version in sorted(by_case.items())}
