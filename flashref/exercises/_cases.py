"""The inputs every exercise checker runs: ordinary cases first, then adversarial ones.

Scores near +-1000 (exp overflows or underflows without the shift), the maximum
in the first or the last tile (every earlier tile must be rescaled), ties, ragged
tails, tile sizes 1 and larger than N, N = 1, -inf entries, rows of a batch,
Nq != Nk with causal masking, and one long sequence for the peak-memory check
of the tiled exercise. Softmax inputs carry two labels: the streamed exercises
speak of blocks, safe softmax (which has none) of the row. Each family has its
own seeded generator, so a checker's cases are the same on every run.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# --- softmax: x (N,) or (rows, N) with a block size ----------------------------------------


def rising(rng, shape, lo, hi) -> np.ndarray:
    """Scores that trend from lo to hi along the last axis: the maximum grows block by block."""
    return np.linspace(lo, hi, shape[-1]) + rng.uniform(-0.5, 0.5, shape)


class SoftmaxInput(NamedTuple):
    """One softmax input, labelled for the streamed exercises and for the whole-row one."""

    label: str  # for the exercises that stream in blocks: may speak of blocks
    whole_row_label: str | None  # for safe softmax, which has no blocks; None: not used there
    x: np.ndarray  # float64, (N,) or (rows, N)
    block: int


SAME = object()  # a whole-row label the same as the streamed one


def softmax_inputs() -> list[SoftmaxInput]:
    """The softmax checkers' inputs, ordinary first, then adversarial."""
    rng = np.random.default_rng(20240601)
    x_inf = rng.normal(0.0, 2.0, (3, 18))
    x_inf[rng.random((3, 18)) < 0.3] = -np.inf
    x_inf[:, 5] = 1.0  # every row keeps at least one finite score
    x_lead = rng.normal(0.0, 2.0, (2, 12))
    x_lead[:, :4] = -np.inf  # a whole first block masked, as with left padding
    far = np.stack([1000.0 + rising(rng, (9,), 0, 4), -1000.0 + rising(rng, (9,), 0, 4)])
    rows = [
        ("ordinary scores", SAME, rng.normal(0.0, 2.0, 37), 8),
        ("rows of a batch", SAME, rng.normal(0.0, 3.0, (4, 29)), 5),
        (
            "scores near 1000, rising: the maximum in the last block",
            "scores near 1000, rising: the maximum at the end of the row",
            1000 + rising(rng, (3, 20), 0, 12),
            4,
        ),
        ("scores near -1000", SAME, -1000.0 + rising(rng, (2, 23), -6, 6), 6),
        (
            "maximum in the first block",
            "falling scores: the maximum at the start of the row",
            rising(rng, (17,), 8, -8),
            4,
        ),
        (
            "ties: the maximum repeated in several blocks",
            "ties: the maximum repeated",
            rng.choice([0.0, 2.0, 5.0], (3, 16)),
            4,
        ),
        ("one row near 1000, one near -1000", SAME, far, 3),
        ("block size 1", None, rising(rng, (2, 11), -3, 3), 1),
        ("block size larger than N", None, rising(rng, (2, 7), -3, 3), 16),
        (
            "scores spanning -1000 to 1000 in one row",
            SAME,
            rng.permutation(np.linspace(-1e3, 1e3, 15)),
            2,
        ),
        ("-inf entries (masked scores)", SAME, x_inf, 4),
        (
            "a whole first block of -inf",
            "the first four scores -inf (left padding)",
            x_lead,
            4,
        ),
        ("N = 1", SAME, rng.normal(0.0, 1.0, (3, 1)), 2),
    ]
    return [
        SoftmaxInput(label, label if whole is SAME else whole, x, B) for label, whole, x, B in rows
    ]


# --- attention: one query, and the tiled loop -------------------------------------------


def project_scores(q, K, target):
    """Move each row of K along q so that its score ``K_j . q / sqrt(d)`` equals ``target[j]``."""
    d = q.shape[-1]
    s = K @ q / np.sqrt(d)  # (N,)
    return K + np.outer((target - s) * np.sqrt(d) / (q @ q), q)  # (N, d)


def one_query_cases():
    """(label, q (d,), K (N, d), V (N, dv), tile_size): ordinary first, then adversarial."""
    rng = np.random.default_rng(2022)

    def rand(N, d, dv):
        return rng.standard_normal(d), rng.standard_normal((N, d)), rng.standard_normal((N, dv))

    cases = []
    for label, N, d, dv, tile in [
        ("random", 16, 8, 4, 4),
        ("N not a multiple of tile_size", 37, 8, 4, 8),
        ("d and dv not powers of two", 23, 5, 3, 6),
        ("tile_size 1", 10, 8, 4, 1),
        ("tile_size larger than N", 12, 8, 4, 32),
        ("N = 1", 1, 8, 4, 1),
        ("N = 1, tile_size larger than N", 1, 8, 4, 4),
    ]:
        cases.append((label, *rand(N, d, dv), tile))
    # Scores near +1000 rising tile by tile: exp overflows without the shift, and the
    # maximum arrives in the last tile, so every earlier tile must be rescaled.
    q, K, V = rand(40, 8, 4)
    target = 990.0 + np.linspace(0.0, 10.0, 40) + 0.5 * rng.standard_normal(40)
    cases.append(("large scores, maximum in the last tile", q, project_scores(q, K, target), V, 8))
    # Scores near -1000: exp underflows to 0 without the shift.
    q, K, V = rand(29, 8, 4)
    target = -1000.0 + np.linspace(0.0, 6.0, 29) + 0.5 * rng.standard_normal(29)
    cases.append(("large negative scores", q, project_scores(q, K, target), V, 5))
    # Scores near +1000 with two keys tied for the maximum, in different tiles, their values
    # opposite: the output is the difference of their weights, which float32's rounding of
    # a score near 1000 (its spacing there is 6e-5) moves by more than the tolerance.
    q, K, V = rand(24, 8, 4)
    target = 980.0 + 2.0 * rng.standard_normal(24)
    target[7], target[19] = 1000.0, 1000.0 + 1e-3
    V[7], V[19] = 3.0, -3.0  # the largest values: the tolerance is set by them
    label = "large scores, two keys tied for the maximum"
    cases.append((label, q, project_scores(q, K, target), V, 8))
    return cases


def tiled_cases():
    """(label, q (Nq, d), k (Nk, d), v (Nk, dv), block_q, block_k, causal)."""
    rng = np.random.default_rng(2023)

    def rand(Nq, Nk, d, dv):
        return (
            rng.standard_normal((Nq, d)),
            rng.standard_normal((Nk, d)),
            rng.standard_normal((Nk, dv)),
        )

    cases = []
    for label, Nq, Nk, d, dv, Br, Bc, causal in [
        ("random", 64, 64, 16, 8, 16, 16, False),
        ("random", 64, 64, 16, 8, 16, 16, True),
        ("N not a multiple of the blocks", 45, 45, 8, 5, 16, 8, False),
        ("N not a multiple of the blocks", 45, 45, 8, 5, 16, 8, True),
        ("Nq < Nk", 20, 50, 8, 4, 8, 16, True),
        ("Nq > Nk", 50, 20, 8, 4, 16, 8, True),
        ("Nq > Nk", 50, 20, 8, 4, 16, 8, False),
        ("block sizes 1", 7, 9, 8, 4, 1, 1, True),
        ("blocks larger than N", 10, 10, 8, 4, 64, 64, False),
        ("blocks larger than N", 10, 10, 8, 4, 64, 64, True),
        ("N = 1", 1, 1, 8, 4, 4, 4, False),
        ("N = 1", 1, 1, 8, 4, 4, 4, True),
    ]:
        cases.append((label, *rand(Nq, Nk, d, dv), Br, Bc, causal))
    # Large scores whose maximum, for every query, lies in the last key tile.
    for causal in (False, True):
        q, k, v = rand(48, 48, 8, 4)
        direction = q.mean(axis=0)
        target = 990.0 + np.linspace(0.0, 10.0, 48)  # score of key j against the mean query
        k = project_scores(direction, k, target)
        q = direction + 0.02 * (q - direction)  # queries close to the mean: similar scores
        cases.append(("large scores, maximum in the last tile", q, k, v, 16, 16, causal))
    return cases


def memory_cases():
    """Cases large enough for their peak memory to show whether the loop tiles (``_memory``).

    Nq = Nk = 2048, d = 16: the whole score matrix is 32 MiB. Tiles of 512 x 32, then 32 x 512,
    so that an array spanning every key of a query tile (``(Br, Nk)``: 8 MiB) or every query
    of a key tile (``(Nq, Bc)``: 8 MiB), whichever loop order leaves it, is well over a tiled
    loop's budget (3 MiB), which is itself well over what a tiled loop needs. A tiled NumPy
    loop takes about 0.1 s here.
    """
    rng = np.random.default_rng(2024)
    q, k, v = (rng.standard_normal((2048, 16)) for _ in range(3))
    label = "a long sequence, peak memory measured"
    return [
        (f"{label}, tall tiles", q, k, v, 512, 32, False),
        (f"{label}, wide tiles", q, k, v, 32, 512, False),
    ]
