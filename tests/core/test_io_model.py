"""The IO model: its walks count what the library's loops load, equal its closed forms, and
reproduce the shape of Theorem 2; the loader of recorded counters checks its schema.

Every count is an exact integer, so every comparison here is exact equality."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flashref
import flashref.attention
from flashref import io_model as io

WALKS = {  # order -> (walk, closed form, library function with that loop order)
    "q_outer": (io.walk_q_outer, io.closed_form_q_outer, flashref.tiled_attention),
    "kv_outer": (io.walk_kv_outer, io.closed_form_kv_outer, flashref.tiled_attention_kv_outer),
}
by_order = pytest.mark.parametrize("order", list(WALKS))


def elements(traffic: io.Traffic, itemsize=2, stat_itemsize=4):
    """Reads and writes per array in elements (bytes / bytes per element)."""
    size = lambda name: stat_itemsize if name in io.STATS else itemsize  # noqa: E731
    return (
        {k: b // size(k) for k, b in traffic.reads.items()},
        {k: b // size(k) for k, b in traffic.writes.items()},
    )


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 90),
    st.integers(1, 90),
    st.integers(1, 9),
    st.integers(1, 9),
    st.integers(1, 50),
    st.integers(1, 50),
    st.booleans(),
    st.sampled_from(list(WALKS)),
)
def test_walk_equals_closed_form(Nq, Nk, d, dv, Br, Bc, causal, order):
    walk, formula, _ = WALKS[order]
    kw = dict(Br=Br, Bc=Bc, itemsize=2, stat_itemsize=4, causal=causal)
    assert walk(Nq, Nk, d, dv, **kw) == formula(Nq, Nk, d, dv, **kw)


def loads_by_library(fn, q, k, v, **kwargs):
    """Elements of q, k and v that ``fn`` loads tile by tile (it loads through ``load_tile``)."""
    names, seen = {id(q): "Q", id(k): "K", id(v): "V"}, Counter()
    original = flashref.attention.load_tile

    def recording(x, rows, dtype, scale=None):
        seen[names[id(x)]] += len(rows) * x.shape[-1]
        return original(x, rows, dtype, scale)

    flashref.attention.load_tile = recording
    try:
        fn(q, k, v, **kwargs)
    finally:
        flashref.attention.load_tile = original
    return dict(seen)


@by_order
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "Nq, Nk, d, dv, Br, Bc",
    [
        (100, 70, 8, 5, 32, 24),
        (70, 100, 8, 5, 16, 48),
        (1, 1, 1, 1, 1, 1),
        (333, 517, 16, 16, 64, 64),
        (50, 50, 4, 4, 64, 7),
    ],
)
def test_walk_loads_what_the_library_loads(order, causal, Nq, Nk, d, dv, Br, Bc):
    walk, _, library = WALKS[order]
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape) for shape in [(Nq, d), (Nk, d), (Nk, dv)])
    seen = loads_by_library(library, q, k, v, block_q=Br, block_k=Bc, causal=causal)
    reads, _ = elements(walk(Nq, Nk, d, dv, Br=Br, Bc=Bc, causal=causal))
    assert seen == {name: reads[name] for name in "QKV"}


def test_single_tile_reads_everything_once():
    # Tiles larger than the sequence: one pass, the compulsory traffic (Algorithm 1 also
    # writes the initial O, l, m and reads them back once).
    N, d = 100, 16
    reads, writes = elements(io.walk_q_outer(N, N, d, Br=128, Bc=128))
    assert reads == {"Q": N * d, "K": N * d, "V": N * d}
    assert writes == {"O": N * d, "lse": N}
    reads, writes = elements(io.walk_kv_outer(N, N, d, Br=128, Bc=128))
    assert reads == {"K": N * d, "V": N * d, "Q": N * d, "O": N * d, "l": N, "m": N}
    assert writes == {"O": 2 * N * d, "l": 2 * N, "m": 2 * N}


def test_smallest_on_chip_memory_gives_one_row_tiles():
    # M = 4d elements: Bc = Br = 1, so Algorithm 1 reads all of Q once per key row.
    Nq, Nk, d = 30, 20, 8
    assert io.paper_blocks(4 * d * 2, d, itemsize=2) == (1, 1)
    reads, _ = elements(io.flash_traffic(Nq, Nk, d, 4 * d * 2, order="kv_outer"))
    assert reads["Q"] == Nk * Nq * d and reads["K"] == Nk * d
    reads, _ = elements(io.flash_traffic(Nq, Nk, d, 4 * d * 2, order="q_outer"))
    assert reads["K"] == Nq * Nk * d and reads["Q"] == Nq * d


def test_block_sizes_follow_the_paper():
    # Bc = ceil(M / 4d) elements, Br = min(Bc, d); the FA-2 order swaps the two.
    assert io.paper_blocks(128 * 1024, 64, itemsize=2) == (64, 256)
    assert io.fa2_blocks(128 * 1024, 64, itemsize=2) == (256, 64)
    assert io.paper_blocks(1000, 10, itemsize=4) == (7, 7)  # 250 elements / 40 -> 7
    assert io.paper_blocks(100_000, 64, itemsize=1) == (64, 391)


@by_order
@pytest.mark.parametrize("causal", [False, True])
def test_more_on_chip_memory_never_moves_more_bytes_when_doubled(order, causal):
    for N, d in [(1, 1), (333, 16), (1000, 64), (1823, 128)]:
        M = 4 * d * 2
        while M <= 8 * N * d * 2:
            now = io.flash_traffic(N, N, d, M, order=order, causal=causal).total_bytes
            doubled = io.flash_traffic(N, N, d, 2 * M, order=order, causal=causal).total_bytes
            assert doubled <= now, (N, d, M)
            M = 2 * M + 2  # odd sizes too: block sizes that do not divide N


@pytest.mark.parametrize(
    "order, causal", [("kv_outer", False), ("kv_outer", True), ("q_outer", False)]
)
def test_traffic_is_monotone_in_every_step_of_M(order, causal):
    N, d = 1000, 64
    totals = [
        io.flash_traffic(N, N, d, M, order=order, causal=causal).total_bytes
        for M in range(4 * d * 2, 4 * N * d * 2 + 1, 2 * d)
    ]
    assert all(b <= a for a, b in zip(totals, totals[1:], strict=False))


def test_causal_fa2_order_is_not_monotone_in_every_step_of_M():
    # A query tile loads every key up to its last row: a tile size that no longer divides N
    # (250 -> 251 rows at N = 1000) loads more keys, even though it is larger.
    N, d = 1000, 64
    a, b = (io.closed_form_q_outer(N, N, d, Br=Br, Bc=64, causal=True) for Br in (250, 251))
    assert b.reads["K"] > a.reads["K"]


def quadratic_part(traffic_of_N, N):
    """b N^2 of T(N) = a N + b N^2, from exact values at N and 2N: T(2N) - 2 T(N) = 2 b N^2."""
    return (traffic_of_N(2 * N) - 2 * traffic_of_N(N)) // 2


@by_order
def test_doubling_M_halves_the_quadratic_term(order):
    # Theorem 2: the flash traffic's N^2 term is proportional to 1 / M. Exact with powers of 2.
    d = 64
    for M in (32 * 1024, 64 * 1024, 128 * 1024):

        def T(N, M=M):
            return io.flash_traffic(N, N, d, M, order=order).total_bytes

        assert quadratic_part(T, 4096) > 0
        q_M = quadratic_part(T, 4096)
        q_2M = quadratic_part(
            lambda N, M=M: io.flash_traffic(N, N, d, 2 * M, order=order).total_bytes, 4096
        )
        assert q_M == 2 * q_2M


@by_order
def test_flash_traffic_is_theta_N2_d2_over_M(order):
    # Over the Theorem's range d <= M <= N d (elements), count / (N^2 d^2 / M) stays between
    # two constants. Algorithm 1 moves about 3 N d elements per pass and FA-2 2 N d per query
    # tile, with 4 N d / M tiles: 12 and 8, plus the compulsory N d terms at large M.
    ratios = []
    for N in (256, 1024, 4096):
        for d in (16, 64, 128):
            for M in (4 * d, 16 * d, 64 * d, N * d):  # elements
                t = io.flash_traffic(N, N, d, 2 * M, order=order, itemsize=2, stat_itemsize=2)
                ratios.append(t.total_bytes / 2 / (N * N * d * d / M))
    low = {"kv_outer": 12, "q_outer": 8}[order]
    assert low <= min(ratios) and max(ratios) <= 2 * low, (min(ratios), max(ratios))


def test_standard_attention_is_4_Nd_plus_4_N2():
    # Algorithm 0: read Q, K, V; write and read S and P; write O. No M anywhere.
    for N, d in [(1, 1), (1024, 64), (777, 40)]:
        t = io.standard_traffic(N, N, d, itemsize=2)
        assert t.total_bytes == 2 * (4 * N * d + 4 * N * N)
        assert t.reads["S"] == t.writes["S"] == t.reads["P"] == t.writes["P"] == 2 * N * N


def test_naive_cupy_passes_over_the_score_matrix():
    # flashref.bench's naive CuPy reads S 7 times and writes it 5 times (P is written over S).
    N, d = 512, 64
    t = io.standard_traffic(N, N, d, steps=io.NAIVE_CUPY)
    assert (t.reads["S"], t.writes["S"]) == (7 * N * N * 2, 5 * N * N * 2)
    assert len(io.NAIVE_CUPY) == 8


def test_causal_visits_the_staircase():
    # With tile sizes dividing N, causal masking keeps T (T + 1) / 2 of T^2 tile pairs: the
    # re-read arrays (K, V in FA-2 order; Q in Algorithm 1) shrink by (T + 1) / 2T exactly.
    N, d, M = 8192, 64, 128 * 1024
    full, causal = (io.flash_traffic(N, N, d, M, order="q_outer", causal=c) for c in (False, True))
    Tr = N // io.fa2_blocks(M, d)[0]
    assert causal.reads["K"] * 2 * Tr == full.reads["K"] * (Tr + 1)
    full, causal = (io.flash_traffic(N, N, d, M, order="kv_outer", causal=c) for c in (False, True))
    Tc = N // io.paper_blocks(M, d)[1]
    assert causal.reads["Q"] * 2 * Tc == full.reads["Q"] * (Tc + 1)
    assert causal.reads["K"] == full.reads["K"]  # every K_j is still loaded once


def test_traffic_totals_and_times():
    t = io.Traffic({"Q": 3, "K": 4}, {"O": 5})
    assert (t.read_bytes, t.write_bytes, t.total_bytes) == (7, 5, 12)
    assert t.times(3) == io.Traffic({"Q": 9, "K": 12}, {"O": 15})


def test_gpu_traffic_dram_sees_compulsory_bytes_when_kv_fits_l2():
    N, d, Br, heads = 4096, 64, 128, 128
    kv = 2 * N * d * 2  # one head's K and V, fp16
    fits = io.gpu_traffic(N, N, d, Br=Br, heads=heads, l2_bytes=kv)
    assert fits.kv_fits_l2
    assert fits.dram.total_bytes == heads * (4 * N * d * 2 + N * 4)  # Q, K, V, O; lse fp32
    assert fits.dram.total_bytes - heads * N * 4 == 256 * 2**20  # Q, K, V, O: 256 MiB
    Tr = math.ceil(N / Br)
    assert fits.l2.reads["K"] == heads * Tr * N * d * 2
    spills = io.gpu_traffic(N, N, d, Br=Br, heads=heads, l2_bytes=kv - 1)
    assert not spills.kv_fits_l2 and spills.dram == spills.l2 == fits.l2


@pytest.mark.parametrize(
    "call, exc, needle",
    [
        (lambda: io.walk_q_outer(0, 4, 4, Br=1, Bc=1), ValueError, "Nq must be >= 1"),
        (lambda: io.walk_kv_outer(4, 4.0, 4, Br=1, Bc=1), TypeError, "Nk must be an int"),
        (lambda: io.closed_form_q_outer(4, 4, True, Br=1, Bc=1), TypeError, "d must be an int"),
        (lambda: io.closed_form_kv_outer(4, 4, 4, -1, Br=1, Bc=1), ValueError, "dv must be >= 1"),
        (lambda: io.walk_q_outer(4, 4, 4, Br=0, Bc=1), ValueError, "Br must be >= 1"),
        (lambda: io.walk_kv_outer(4, 4, 4, Br=1, Bc=2.5), TypeError, "Bc must be an int"),
        (lambda: io.walk_q_outer(4, 4, 4, Br=1, Bc=1, itemsize=0), ValueError, "itemsize must"),
        (lambda: io.closed_form_kv_outer(4, 4, 4, Br=1, Bc=1, causal=1), TypeError, "causal must"),
        (
            lambda: io.flash_traffic(4, 4, 4, 1024, order="q_outer", walk="y"),
            TypeError,
            "walk must",
        ),
        (lambda: io.paper_blocks(511, 64), ValueError, "4 * d = 256"),
        (lambda: io.fa2_blocks(1024, 0), ValueError, "d must be >= 1"),
        (lambda: io.flash_traffic(4, 4, 4, 1024, order="rows"), ValueError, "order must be"),
        (lambda: io.standard_traffic(4, 4, 4, steps=(("x", ("Z",), ()),)), ValueError, "'Z'"),
        (lambda: io.gpu_traffic(4, 4, 4, Br=1, heads=0, l2_bytes=1), ValueError, "heads must"),
        (lambda: io.Traffic({}, {}).times(0), ValueError, "n must be >= 1"),
    ],
)
def test_bad_input_names_the_argument(call, exc, needle):
    with pytest.raises(exc, match=re.escape(needle)):
        call()


def fixture_row(impl, N, B, H=16, d=64, dram_scale=1.025, l2_scale=1.5):
    """A row in the schema of results/gpu_io.json, made from the model. Not a measurement."""
    heads = B * H
    if impl.startswith("naive_cupy"):
        dram = l2 = io.standard_traffic(N, N, d, steps=io.NAIVE_CUPY).times(heads).total_bytes
    else:
        model = io.gpu_traffic(N, N, d, Br=128, heads=heads, l2_bytes=50_000_000)
        dram, l2 = model.dram.total_bytes, model.l2.total_bytes
    return {
        "impl": impl,
        "label": impl,
        "N": N,
        "B": B,
        "H": H,
        "d": d,
        "causal": False,
        "dtype": "float16",
        "kernels": 1,
        "dram_read_bytes": 0.75 * dram,
        "dram_write_bytes": (dram_scale - 0.75) * dram,
        "l2_bytes": l2_scale * l2,
        "ms": 1.0 if impl != "v10" else None,
    }


def fixture(tmp_path, rows=None) -> Path:
    """A small file in the schema of results/gpu_io.json, written here. Not a measurement."""
    meta = {
        "gpu": "test fixture",
        "driver": "0",
        "ncu": "0",
        "cupy": "0",
        "torch": None,
        "date": "2000-01-01",
        "clock_control": "none",
        "sm_clock_mhz": 1.0,
        "l2_cache_bytes": 50_000_000,
    }
    if rows is None:
        rows = [
            fixture_row("naive_cupy_fp16", 1024, 32),
            fixture_row("v10", 1024, 32),
            fixture_row("v10", 2048, 16),
        ]
    path = tmp_path / "gpu_io.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}))
    return path


def test_load_measured_round_trip(tmp_path):
    meta, rows = io.load_measured(fixture(tmp_path))
    assert meta["torch"] is None and len(rows) == 3


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda row: row.pop("l2_bytes"), "rows[0] has no 'l2_bytes'"),
        (lambda row: row.update(N=True), "rows[0]['N'] = True"),
        (lambda row: row.update(N=0), "rows[0]['N'] = 0; expected an int >= 1"),
        (lambda row: row.update(causal=0), "rows[0]['causal'] = 0"),
        (lambda row: row.update(dram_read_bytes=-1.0), "expected a number >= 0"),
        (lambda row: row.update(dtype="bfloat16"), "rows[0]['dtype'] = 'bfloat16'"),
        (lambda row: row.update(ms="1.0"), "rows[0]['ms'] = '1.0'"),
    ],
)
def test_load_measured_rejects_bad_rows(tmp_path, change, needle):
    path = fixture(tmp_path)
    data = json.loads(path.read_text())
    change(data["rows"][0])
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=re.escape(needle)):
        io.load_measured(path)


def test_load_measured_rejects_nan_and_missing_meta(tmp_path):
    path = fixture(tmp_path)
    path.write_text(path.read_text().replace('"l2_bytes": ', '"l2_bytes": NaN, "x": ', 1))
    with pytest.raises(ValueError, match="NaN is not a measurement"):
        io.load_measured(path)
    path = fixture(tmp_path)
    data = json.loads(path.read_text())
    del data["meta"]["ncu"]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=re.escape("meta has no 'ncu'")):
        io.load_measured(path)


def test_compare_puts_model_beside_measurement(tmp_path):
    _, rows = io.load_measured(fixture(tmp_path))
    table = io.compare(rows, Br={"v10": 128}, l2_bytes=50_000_000)
    assert [r["dram_ratio"] for r in table] == pytest.approx([1.025] * 3)
    assert [r["l2_ratio"] for r in table] == pytest.approx([1.5] * 3)
    naive = table[0]
    assert naive["model_dram_bytes"] > 2 * naive["algorithm0_bytes"]  # 12 passes over S, not 4
    with pytest.raises(ValueError, match="no model for impl 'v10'"):
        io.compare(rows, Br={}, l2_bytes=50_000_000)
    rows[0]["causal"] = True
    with pytest.raises(ValueError, match="causal bias pass is not modelled"):
        io.compare(rows, Br={"v10": 128}, l2_bytes=50_000_000)
