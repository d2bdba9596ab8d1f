"""Tiled attention never forms the (Nq, Nk) score matrix: its peak memory shows it.

NumPy reports its array allocations to tracemalloc, so the traced peak during one
call is the extra memory that call needed (the inputs exist before tracing starts).
"""

from __future__ import annotations

import tracemalloc

import numpy as np

from flashref import naive_attention, tiled_attention


def peak_bytes(fn, *args, **kwargs) -> int:
    """Peak traced allocation during one call of ``fn``."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        fn(*args, **kwargs)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def one_head(N, d=64, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((N, d), dtype=np.float32) for _ in range(3))


def test_tiled_peak_is_a_small_fraction_of_naive_at_4096():
    N = 4096
    q, k, v = one_head(N)
    naive = peak_bytes(naive_attention, q, k, v)
    tiled = peak_bytes(tiled_attention, q, k, v)  # default blocks 64 x 64
    print(
        f"\nN={N}, d=64, float32, one head: peak naive {naive / 2**20:.1f} MiB, "
        f"tiled {tiled / 2**20:.2f} MiB, ratio {naive / tiled:.0f}x"
    )
    # tracemalloc must see the naive score matrix S (N*N float32 = 64 MiB), or this test
    # could not tell the two apart.
    assert naive >= N * N * 4
    assert tiled < naive / 20


def test_tiled_peak_grows_with_n_not_n_squared():
    # Doubling N doubles what tiled must hold (the scaled Q, the output O, lse) and leaves
    # its tiles unchanged: about 2x, where the naive version's S grows 4x.
    small, large = (peak_bytes(tiled_attention, *one_head(N)) for N in (1024, 2048))
    print(f"\ntiled peak: N=1024 {small / 2**20:.2f} MiB, N=2048 {large / 2**20:.2f} MiB")
    assert large < 2.5 * small
