"""The models behind chapter 5's pictures, against the kernels' source, on the CPU.

``warp_split``: who computes what in versions 2 and 3; ``banks``: the banks an ``ldmatrix``
reads with and without version 4's padding; ``cp_async_ring``: the copies and barriers of
versions 5 and 11. Each model restates a kernel's index arithmetic, so each test also reads
that arithmetic in the ``.cu`` file: if a kernel changes, its picture's test fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from flashref.gpu import VERSIONS
from flashref.gpu.forward_versions import lds_of
from flashref.hardware import banks as bk
from flashref.hardware import cp_async_ring as cr
from flashref.hardware import fragments as fr
from flashref.hardware import kernel_figures as kf
from flashref.hardware import warp_split as ws


def source(number: int) -> str:
    return VERSIONS[number].path.read_text()


# ---------------------------------------------------------------- the warp split


def test_the_split_is_the_kernels_index_arithmetic():
    v2, v3 = source(2), source(3)
    for text in (
        "const int ty = tid / 16, tx = tid % 16;",
        "(ty + 16 * a) * (D + 1) + x",
        "(tx + 16 * b) * (D + 1) + x",
        "const int r = tid / 4, part = tid % 4;",
        "for (int j = part; j < Bc; j += 4)",
        "#define NTHREADS 256",
        "#define Br 64",
    ):
        assert text in v2, text
    for text in (
        "#define NWARPS 4",
        "#define Br 64",
        "#define Bc 64",
        "const int row_lo = q0 + warp * 16 + g;",
    ):
        assert text in v3, text
    assert VERSIONS[2].threads == ws.V2_THREADS and VERSIONS[3].threads == 32 * ws.V3_WARPS


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("step", [1, 2, 3])
@pytest.mark.parametrize("d", [64, 128])
def test_every_element_has_one_warp(version, step, d):
    owner = ws.owners(version, step, d)
    assert owner.shape == (64, d if step == 3 else 64)
    assert owner.min() >= 0 and owner.max() == (7 if version == 2 else 3)
    # every warp computes an equal share
    assert (np.bincount(owner.ravel()) == owner.size // (owner.max() + 1)).all()


def test_version_2_hands_its_rows_between_warps_and_version_3_does_not():
    s1, s2, s3 = (ws.v2_owners(step) for step in (1, 2, 3))
    assert ws.rows_of(s1, 0) == [0, 1, 16, 17, 32, 33, 48, 49]
    assert ws.rows_of(s2, 0) == list(range(8))
    assert ws.rows_of(s3, 0) == ws.rows_of(s1, 0)
    assert ws.exchanged(s1, s2) == 64 * 64 * 7 // 8  # 7 of every 8 scores change warp
    for w in range(8):  # the rows warp w softmaxes are other warps' scores
        assert set(ws.rows_of(s2, w)) != set(ws.rows_of(s1, w))
    t = [ws.v3_owners(step, 128) for step in (1, 2, 3)]
    assert ws.exchanged(t[0], t[1]) == 0
    for w in range(4):
        assert ws.rows_of(t[0], w) == ws.rows_of(t[2], w) == list(range(16 * w, 16 * w + 16))


def test_bad_split_arguments_are_named():
    with pytest.raises(ValueError, match="step must be one of"):
        ws.v2_owners(4)
    with pytest.raises(ValueError, match="d must be a multiple of 16"):
        ws.v3_owners(1, 100)
    with pytest.raises(ValueError, match="version must be 2 or 3"):
        ws.owners(4, 1)
    with pytest.raises(ValueError, match="differ in shape"):
        ws.exchanged(ws.v2_owners(1), ws.v2_owners(3, 128))


# ---------------------------------------------------------------- banks


def test_the_strides_are_the_kernels():
    assert "#define LDS D " in source(3) and "#define LDS (D + 8)" in source(4)
    assert lds_of(3, 64) == 64 and lds_of(4, 64) == 72 and lds_of(11, 128) == 136
    with pytest.raises(ValueError, match="fp32"):
        lds_of(2, 64)
    with pytest.raises(ValueError, match="mma.sync versions"):
        lds_of(19, 64)


@pytest.mark.parametrize("d", [64, 128])
def test_the_bank_maps_strides_are_the_registrys(d):
    """``draw_bank_map`` (a NumPy model, which imports no registry) draws the strides that
    the kernels' registry gives versions 3 and 4."""
    assert kf.bank_map_strides(d) == {v: lds_of(v, d) for v in (3, 4)}


@pytest.mark.parametrize("name", ["Q", "K", "V"])
@pytest.mark.parametrize("d", [64, 128])
def test_unpadded_rows_conflict_eight_ways_and_padded_ones_not_at_all(name, d):
    load = fr.KERNEL_LOADS[name]
    assert bk.passes(load.address, lds_of(3, d)).tolist() == [8, 8, 8, 8]
    assert bk.passes(load.address, lds_of(4, d)).tolist() == [1, 1, 1, 1]
    unpadded = bk.row_banks(load.address, d).reshape(4, 8, 4)  # (matrix, row, word)
    assert (unpadded == unpadded[:, :1]).all()  # a matrix's 8 rows in the same four banks
    padded = bk.row_banks(load.address, d + 8).reshape(4, 8, 4)
    for m in range(4):  # the 8 rows of a matrix cover the 32 banks once
        assert sorted(padded[m].ravel()) == list(range(32))


def test_passes_count_distinct_words_only():
    # 32 lanes on one 16-byte row: a broadcast, one pass
    assert bk.passes(lambda lane: (0, 0), 64).tolist() == [1, 1, 1, 1]
    # two rows 128 bytes apart in each matrix: two words per bank
    assert bk.passes(lambda lane: (lane % 2, 0), 64).tolist() == [2, 2, 2, 2]
    with pytest.raises(ValueError, match="lds must be a row stride"):
        bk.passes(fr.q_address, 65)


# ---------------------------------------------------------------- the cp.async ring


def test_the_ring_is_the_kernels_loop():
    v5, v11 = source(5), source(11)
    assert "(it + 1) & 1" in v5 and "cp_async_wait<1>();" in v5
    assert "#define STAGES 3" in v11 and "(it + 2) % STAGES" in v11 and "cp_async_wait<1>();" in v11
    assert VERSIONS[5].stages(64) == 2 and VERSIONS[11].stages(64) == 3
    # v5: issue, commit, wait, barrier ... barrier at the loop's end; v11: wait, barrier, issue
    loop5 = v5[v5.index("for (int it = 0;") :]
    assert (
        loop5.index("load_tile_async")
        < loop5.index("cp_async_wait<1>")
        < loop5.index("__syncthreads")
    )
    assert loop5.count("__syncthreads();") == 2
    loop11 = v11[v11.index("for (int it = 0;") :]
    assert (
        loop11.index("cp_async_wait<1>")
        < loop11.index("__syncthreads")
        < loop11.index("load_tile_async")
    )
    assert loop11.count("__syncthreads();") == 1


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("n_tiles", [1, 2, 3, 7])
def test_each_tile_is_copied_once_into_its_buffer_before_it_is_read(stages, n_tiles):
    events = cr.schedule(stages, n_tiles)
    issued = [e for e in events if e.what == "issue"]
    assert [e.tile for e in issued] == list(range(n_tiles))
    assert all(e.buffer == e.tile % stages for e in events if e.tile is not None)
    position = {(e.what, e.tile): i for i, e in enumerate(events) if e.tile is not None}
    for t in range(n_tiles):
        assert position[("issue", t)] < position[("compute", t)]
    assert cr.refills_are_safe(events)
    flight = cr.in_flight(events)
    for t in range(n_tiles):  # copies stages - 1 tiles ahead
        assert flight[t] == list(range(t + 1, min(t + stages, n_tiles)))


def test_one_barrier_is_enough_only_with_three_buffers():
    assert cr.barriers_per_tile(cr.schedule(2, 4)) == 2
    assert cr.barriers_per_tile(cr.schedule(3, 4)) == 1
    one_barrier = ("issue", "wait", "barrier", "compute")  # v5 without its last barrier
    assert not cr.refills_are_safe(cr.schedule(2, 4, one_barrier))
    assert not cr.refills_are_safe(cr.schedule(3, 4, one_barrier))  # issued before it
    assert cr.refills_are_safe(cr.schedule(3, 4, ("wait", "barrier", "issue", "compute")))
    with pytest.raises(ValueError, match="stages must be one of"):
        cr.schedule(4, 3)
    with pytest.raises(ValueError, match="order must hold"):
        cr.schedule(2, 3, ("issue", "compute"))
    with pytest.raises(ValueError, match="n_tiles must be an int"):
        cr.schedule(2, 0)


# ---------------------------------------------------------------- the figures


@pytest.fixture
def close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def test_figures_are_drawn_from_the_models(close_figures):
    fig = kf.draw_warp_split(64)
    assert fig.get_size_inches()[0] * fig.dpi == 800
    notes = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert notes == [
        "warp 0: 0-1, 16-17, 32-33, 48-49",
        "warp 0: 0-7",
        "warp 0: 0-1, 16-17, 32-33, 48-49",
        "warp 0: 0-15",
    ]
    fig = kf.draw_bank_map("K", 128)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0].endswith("8 passes") and titles[1].endswith("1 pass")
    assert "136 halves" in titles[1]
    fig = kf.draw_cp_async_ring(4)
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert "2 __syncthreads per tile" in titles[0] and "1 __syncthreads per tile" in titles[1]
    boxes, lines = kf.ring_boxes(cr.schedule(3, 4))
    assert sum(kind == "barrier" for _, kind in lines) == 4
    for buffer, x0, x1, _kind, tile in boxes:  # a buffer holds one tile at a time
        assert x0 < x1 and buffer == tile % 3
    for b in range(3):
        mine = sorted((x0, x1) for buf, x0, x1, _, _ in boxes if buf == b)
        assert all(a[1] <= c[0] + 1e-9 for a, c in zip(mine, mine[1:], strict=False))
