"""The backward grid model (``flashref.hardware.backward_grid``), on the CPU.

Checked against a brute-force count over (query, key) pairs, against the tiles that
``tiled_attention_backward`` visits, against ``BwdVersion.dq_adds`` and against the lines
of the kernels it restates. No GPU needed.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from flashref import backward, tiled_attention_backward
from flashref.gpu.backward_versions import BWD_VERSIONS, backward_tiles, code_lines, version_grid
from flashref.hardware import backward_grid as bg

SHAPES = [  # Nq, Nk, Bc, Br
    (512, 512, 64, 64),
    (512, 512, 128, 64),
    (100, 100, 128, 64),
    (192, 192, 128, 64),
    (1, 1, 64, 64),
    (300, 700, 64, 32),
    (700, 300, 32, 64),
    (333, 517, 48, 16),
    (517, 333, 16, 48),
]


def brute_force(Nq, Nk, Bc, Br, causal, slices):
    """Visits and additions from every (query, key) pair of the padded tiles: block j
    visits tile i when some query of the tile may see some key of the block, and a share
    of Bc / slices keys adds into dQ_i when some query of the tile may see one of them."""
    Tr, Tc, W = -(-Nq // Br), -(-Nk // Bc), Bc // slices
    visits, adds = set(), np.zeros(Nq, dtype=int)  # adds per query row, i.e. per element

    def sees(i, k0, k1):
        q = np.arange(i * Br, (i + 1) * Br)[:, None]  # (Br, 1)
        k = np.arange(k0, k1)[None, :]  # (1, k1 - k0)
        return bool(np.any(k <= q)) if causal else True

    for j in range(Tc):
        for i in range(Tr):
            if sees(i, j * Bc, (j + 1) * Bc):
                visits.add((i, j))
                rows = slice(i * Br, min((i + 1) * Br, Nq))
                for s in range(slices):
                    adds[rows] += sees(i, j * Bc + s * W, j * Bc + (s + 1) * W)
    return visits, adds


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("slices", [1, 2])
@pytest.mark.parametrize("Nq,Nk,Bc,Br", SHAPES)
def test_the_model_is_the_brute_force_count(Nq, Nk, Bc, Br, causal, slices):
    g = bg.backward_grid(Nq, Nk, Bc, Br, causal, slices)
    visits, adds = brute_force(Nq, Nk, Bc, Br, causal, slices)
    assert set(g.pairs()) == visits
    assert [adds[r] for r in range(Nq)] == [g.adds[r // Br] for r in range(Nq)]
    for walk in g.walks:  # each walk runs down the query tiles, none twice
        assert list(walk) == sorted(set(walk))
        assert not walk or walk[-1] == g.Tr - 1


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,Bc,Br", SHAPES)
def test_the_pairs_are_the_numpy_loops_tiles_in_its_order(Nq, Nk, Bc, Br, causal, monkeypatch):
    seen = []
    allowed = backward.allowed_pairs

    def recording(mask, causal_, rows, cols, *more):
        seen.append((rows.start // Br, cols.start // Bc))
        return allowed(mask, causal_, rows, cols, *more)

    monkeypatch.setattr(backward, "allowed_pairs", recording)
    q, k = np.zeros((Nq, 2)), np.zeros((Nk, 2))
    o, lse = np.zeros((Nq, 2)), np.zeros(Nq)
    tiled_attention_backward(q, k, k, o, lse, o, block_q=Br, block_k=Bc, causal=causal)
    assert bg.backward_grid(Nq, Nk, Bc, Br, causal).pairs() == seen


@pytest.mark.parametrize("number", sorted(BWD_VERSIONS))
@pytest.mark.parametrize("N", [1, 64, 100, 192, 512, 1000, 4096])
def test_every_element_gets_dq_adds_without_the_mask(number, N):
    ver = BWD_VERSIONS[number]
    g = version_grid(number, N, N)
    assert set(g.adds) == {ver.dq_adds(N)}  # 0 for the second pass
    causal = version_grid(number, N, N, causal=True)
    assert max(causal.adds) <= ver.dq_adds(N) and causal.pairs() == [
        p for p in g.pairs() if p in set(causal.pairs())
    ]
    if N % ver.Bc == 0:  # the last query tile sees every key: all the additions
        assert causal.adds[-1] == ver.dq_adds(N)


def test_a_second_pass_adds_nothing_and_a_key_tile_past_every_query_visits_nothing():
    assert set(version_grid(2, 512, 512, causal=True).adds) == {0}
    g = bg.backward_grid(64, 256, 64, 64, causal=True)  # keys 64.. follow every query
    assert [list(w) for w in g.walks] == [[0], [], [], []] and g.adds == (1,)


def test_version_8s_second_consumer_skips_the_first_tile_it_visits():
    g = version_grid(8, 512, 512, causal=True)  # Bc = 128, Br = 64, 2 shares
    assert g.adding[1] == (1, 2, 2, 2, 2, 2)  # tile 2: keys 192.. follow queries 128..191
    assert g.adds == (1, 2, 3, 4, 5, 6, 7, 8)


def test_the_kernels_lines_the_model_restates():
    for number, ver in BWD_VERSIONS.items():
        code = " ".join(code_lines(number))
        assert "const int i_start = causal ? c0 / Br : 0;" in code, number
        assert "const int c0 = blockIdx.x * Bc;" in code, number
        skip = re.search(r"if \(causal && q0 \+ Br - 1 < kw0\)", code)
        assert bool(skip) == (ver.dq_adds_per_tile > 1), number


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="Bc = 100 must be a multiple of slices = 3"):
        bg.backward_grid(10, 10, 100, 64, slices=3)
    with pytest.raises(ValueError, match="Nq must be >= 1, got 0"):
        bg.backward_grid(0, 10, 64, 64)
    with pytest.raises(TypeError, match="Br must be an int"):
        bg.backward_grid(10, 10, 64, 64.0)
    with pytest.raises(ValueError, match="block must be in 0..7, got 8"):
        bg.draw_backward_grid(backward_tiles(1), 512, block=8)


@pytest.fixture
def close_figures():
    """The drawings are pyplot figures: close them after each test."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


@pytest.mark.parametrize("number,causal", [(1, True), (8, True), (3, False), (2, True)])
def test_the_drawing_is_the_model(number, causal, close_figures):
    fig = bg.draw_backward_grid(backward_tiles(number), 512, causal=causal, block=1)
    assert fig.get_size_inches()[0] * fig.dpi == 800
    texts = [t.get_text() for t in fig.axes[0].texts]
    g = version_grid(number, 512, 512, causal)
    dq = [t for t in texts if t.startswith("dQ") and t[2:3].isdigit()]
    if BWD_VERSIONS[number].deterministic_dq:
        assert dq == [f"dQ{i}" for i in range(g.Tr)]
    else:
        assert dq == [f"dQ{i} +{n}" for i, n in enumerate(g.adds)]
    steps = [t for t in texts if t.isdigit()]
    assert steps == [str(s + 1) for s in range(len(g.walks[1]))]
