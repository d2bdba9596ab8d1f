"""Did a correct tiled answer tile? Its peak memory says.

NumPy reports its array allocations to ``tracemalloc``, so the traced peak during
one call is the extra memory that call needed (the inputs exist before tracing
starts). Plain attention builds the whole score matrix ``S (Nq, Nk)``; a tiled
loop holds the output, the running ``m`` and ``l``, and a few arrays the size of
one ``(Br, Bc)`` tile. ``check_tiled_attention`` measures one case large enough
for the two to be told apart by a wide margin.

The budget for a tiled loop (``tiled_budget``) is twice the bytes of q, k, v and
O together (room for a scaled copy of q, a transposed copy of k, the output and
a second buffer for it) plus eight float64 ``(Br, Bc)`` tiles (S, P, a mask and
the temporaries ``np.exp`` and ``np.where`` make). At Nq = Nk = 2048,
d = dv = 16 and 128 x 128 tiles that is 3 MiB, against 32 MiB for S alone.
Measured peaks there: 0.6-0.8 MiB for five correct tiled solutions (both loop
orders, flashref's own), 6.25 MiB for one that tiles the queries but takes every
key at once (``(Br, Nk)`` strips), 65-96 MiB for plain attention.
"""

from __future__ import annotations

import tracemalloc
from contextlib import contextmanager

NOT_TILED = "not tiled: the whole (Nq, Nk) score matrix was built"
UNTILED_KEYS = "keys not tiled: score arrays wider than block_k"


class _Peak:
    bytes: int = 0


@contextmanager
def peak_memory(measure: bool = True):
    """Yield an object whose ``bytes`` is, afterwards, the peak traced during the block.

    Works whether or not tracing was already on (then only the peak is reset, and
    tracing stays on).
    """
    peak = _Peak()
    if not measure:
        yield peak
        return
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        yield peak
        peak.bytes = max(tracemalloc.get_traced_memory()[1] - before, 0)
    finally:
        if not was_tracing:
            tracemalloc.stop()


def tiled_budget(Nq: int, Nk: int, d: int, dv: int, Br: int, Bc: int) -> int:
    """Bytes a float64 tiled loop may need beyond its inputs (see the module docstring)."""
    q_k_v_O = 8 * (Nq * d + Nk * d + Nk * dv + Nq * dv)
    return 2 * q_k_v_O + 8 * 8 * min(Br, Nq) * min(Bc, Nk)


def memory_verdict(peak: int, Nq: int, Nk: int, budget: int, blocks: str):
    """(problem, diagnosis) when ``peak`` is over the budget, else None."""
    if peak <= budget:
        return None
    mib = 2**20
    problem = f"the output is right, but the call's peak memory was {peak / mib:.1f} MiB"
    within = f"a tiled loop with {blocks} needs at most {budget / mib:.1f} MiB"
    if peak >= 8 * Nq * Nk:
        S = f"the ({Nq}, {Nk}) score matrix alone is {8 * Nq * Nk / mib:.0f} MiB"
        return f"{problem}:\n  {S};\n  {within}", NOT_TILED
    return f"{problem}:\n  {within}", UNTILED_KEYS
