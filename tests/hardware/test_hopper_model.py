"""flashref.hardware.hopper's models of the 128-byte swizzle and the wgmma fragments, on the CPU.

The swizzle is restated the way the hardware applies it, as an XOR of address bits
(bits 4-6, the 16-byte chunk, with bits 7-9, the row within a group of 8), independently of
the library's chunk arithmetic; the wgmma fragments are checked, warp by warp, against the
mma.sync layouts of flashref.hardware.fragments (themselves checked against the PTX ISA).
The GPU side is tests/gpu/test_hopper_probe.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from flashref.bench import hopper_probe as hpp
from flashref.gpu import KERNEL_DIR
from flashref.gpu.tma import tensor_map
from flashref.hardware import fragments as fr
from flashref.hardware import hopper as hp


def bits_swizzle(linear_byte: int, span_rows: int) -> int:
    """The swizzle as address bits: XOR bits 4.. (chunk) with bits 7.. (row in the group)."""
    mask = span_rows - 1
    return linear_byte ^ (((linear_byte >> 7) & mask) << 4)


# ---------------------------------------------------------------- the swizzle


@pytest.mark.parametrize("swizzle", [128, 64, 32, 0])
@pytest.mark.parametrize("rows", [1, 8, 64, 128])
def test_swizzle_is_a_bijection_onto_the_tile(swizzle, rows):
    r, c = np.indices((rows, 64))
    off = hp.swizzle_offset(r, c, swizzle)
    assert off.min() == 0 and off.max() == rows * 128 - 2
    assert np.unique(off).size == rows * 64 and (off % 2 == 0).all()
    assert (off // 128 == r).all()  # the swizzle stays inside a row


@pytest.mark.parametrize("swizzle,span", [(128, 8), (64, 4), (32, 2), (0, 1)])
def test_swizzle_is_the_address_bit_xor(swizzle, span):
    for r in range(24):
        for c in range(64):
            assert hp.swizzle_offset(r, c, swizzle) == bits_swizzle(r * 128 + 2 * c, span)


def test_swizzle128_chunk_pattern():
    chunks = hp.chunk_map(8)  # (8, 8): where logical chunk j of row r is stored
    assert chunks[0].tolist() == list(range(8))  # row 0 unchanged
    assert chunks[1].tolist() == [1, 0, 3, 2, 5, 4, 7, 6]
    assert chunks[3].tolist() == [3, 2, 1, 0, 7, 6, 5, 4]
    assert chunks[7].tolist() == [7, 6, 5, 4, 3, 2, 1, 0]
    assert np.array_equal(hp.chunk_map(16)[8:], chunks)  # period 8 rows = 1024 bytes
    # each column of chunks (one logical chunk) visits all 8 positions: the 8 rows a
    # wgmma core matrix reads are in 8 different 16-byte bank groups
    assert all(sorted(chunks[:, j]) == list(range(8)) for j in range(8))
    assert hp.chunk_map(2, swizzle=0).tolist() == [list(range(8))] * 2


def test_the_kernel_formula_is_the_model():
    """swizzle128 in hopper_common.cuh, evaluated as written, is swizzle128_offset."""
    text = (KERNEL_DIR / "common" / "hopper_common.cuh").read_text()
    m = re.search(r"u32 swizzle128\(int r, int c\)\s*\{\s*return (.*?);", text, re.DOTALL)
    assert m, "swizzle128 not found in hopper_common.cuh"
    expr = m.group(1)
    for r in range(16):
        for c in range(64):
            got = eval(expr, {"__builtins__": {}}, {"r": r, "c": c})  # + * >> ^ & << only
            assert got == hp.swizzle128_offset(r, c), (r, c, expr)


def test_swizzle_tile_round_trip_and_differs_from_linear():
    rng = np.random.default_rng(0)
    tile = rng.integers(0, 2**16, (128, 64)).astype(np.uint16)
    image = hp.swizzle_tile(tile)
    assert np.array_equal(hp.unswizzle_tile(image, 128), tile)
    assert np.array_equal(hp.swizzle_tile(tile, 0), tile.ravel())
    assert not np.array_equal(image, tile.ravel())
    assert np.array_equal(image[:64], tile[0])  # row 0 is not moved
    assert np.array_equal(image[64 + 8 : 64 + 16], tile[1, :8])  # row 1: chunk 0 -> 1


def test_swizzle_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"swizzle must be one of \[0, 32, 64, 128\]"):
        hp.swizzle_offset(0, 0, 256)
    with pytest.raises(ValueError, match="c must be in 0..63"):
        hp.swizzle_offset(0, 64)
    with pytest.raises(ValueError, match="r must be >= 0"):
        hp.swizzle_offset(-1, 0)
    with pytest.raises(TypeError, match="r must hold integers"):
        hp.swizzle_offset(0.5, 0)
    with pytest.raises(ValueError, match=r"tile must have shape \(rows, 64\)"):
        hp.swizzle_tile(np.zeros((8, 32), np.uint16))
    with pytest.raises(ValueError, match=r"image must have shape \(512,\)"):
        hp.unswizzle_tile(np.zeros(64, np.uint16), 8)


# ---------------------------------------------------------------- wgmma fragments


@pytest.mark.parametrize("n", [64, 128])
def test_accumulator_map_is_a_bijection(n):
    src = hp.wgmma_c_map(n)  # (128, n / 2, 2)
    assert src.shape == (128, n // 2, 2)
    counts = np.zeros((64, n), dtype=int)
    np.add.at(counts, (src[..., 0], src[..., 1]), 1)
    assert (counts == 1).all()


@pytest.mark.parametrize("n", [64, 128])
def test_each_warp_holds_16_rows_in_the_mma_sync_c_layout(n):
    for thread in range(128):
        w, lane = divmod(thread, 32)
        for reg in range(n // 2):
            row, col = fr.mma_c(lane, reg % 4)  # one 16 x 8 C tile per 4 registers
            assert hp.wgmma_c(thread, reg, n) == (16 * w + row, 8 * (reg // 4) + col)


def test_a_fragments_are_the_mma_sync_a_layout_per_warp():
    src = hp.wgmma_a_map()  # (128, 4, 2, 2)
    counts = np.zeros((64, 16), dtype=int)
    np.add.at(counts, (src[..., 0], src[..., 1]), 1)
    assert (counts == 1).all()
    for thread in range(128):
        w, lane = divmod(thread, 32)
        for reg in range(4):
            for half in range(2):
                row, k = fr.mma_a(lane, reg, half)
                assert hp.wgmma_a(thread, reg, half) == (16 * w + row, k)


def test_p_from_accumulators_is_the_a_operand():
    """The probe's a[kk][r] = pack(s[8 kk + 2 r], s[8 kk + 2 r + 1]) is A of keys 16 kk.."""
    for thread in range(128):
        for kk in range(4):
            for reg in range(4):
                for half in range(2):
                    row, k = hp.wgmma_a(thread, reg, half)
                    assert hp.wgmma_c(thread, 8 * kk + 2 * reg + half, 64) == (row, 16 * kk + k)


def test_place_puts_each_register_where_the_map_says():
    src = hp.wgmma_c_map(64)
    D = np.arange(64 * 64, dtype=np.float64).reshape(64, 64)
    raw = D[src[..., 0], src[..., 1]]  # (128, 32)
    assert np.array_equal(hp.place(raw, src, (64, 64)), D)
    assert np.isnan(hp.place(raw[:64], src[:64], (64, 64))[32:]).all()  # warps 2, 3 missing
    with pytest.raises(ValueError, match="raw has shape"):
        hp.place(raw[:, :4], src, (64, 64))


def test_fragment_errors_name_the_argument():
    with pytest.raises(ValueError, match="n must be 64 or 128"):
        hp.wgmma_c(0, 0, 96)
    with pytest.raises(ValueError, match=r"thread must be in 0\.\.127, got 128"):
        hp.wgmma_c(128, 0)
    with pytest.raises(ValueError, match=r"reg must be in 0\.\.31, got 32"):
        hp.wgmma_c(0, 32, 64)
    assert hp.wgmma_c(0, 32, 128) == (0, 64)
    with pytest.raises(TypeError, match="half must be an int, got bool"):
        hp.wgmma_a(0, 0, True)


# ---------------------------------------------------------------- tensor map arguments


def fake(shape=(64, 64), dtype="float16", strides=None, ptr=0x10000):
    """What tensor_map reads of a CuPy array, without a GPU."""
    strides = strides or (2 * shape[1], 2)
    return SimpleNamespace(shape=shape, dtype=dtype, strides=strides, data=SimpleNamespace(ptr=ptr))


@pytest.mark.parametrize(
    "kwargs,box,exc,msg",
    [
        (dict(dtype="float32", strides=(256, 4)), 64, TypeError, "x must be float16 or bfloat16"),
        (dict(shape=(64, 60), strides=(120, 2)), 64, ValueError, "multiple of 16 bytes.*120"),
        (dict(strides=(256, 4)), 64, ValueError, "row-major with contiguous rows"),
        (dict(ptr=0x10008), 64, ValueError, "16-byte aligned address, got 0x10008"),
        (dict(), 257, ValueError, r"box_rows must be in 1\.\.256, got 257"),
        (dict(), 0, ValueError, r"box_rows must be in 1\.\.256, got 0"),
        (dict(), 64.0, TypeError, "box_rows must be an int, got float"),
        (dict(shape=(0, 64)), 64, ValueError, "1..2\\^32 rows and columns"),
    ],
)
def test_tensor_map_checks_before_the_driver(kwargs, box, exc, msg):
    with pytest.raises(exc, match=msg):
        tensor_map(fake(**kwargs), box)


def test_tensor_map_box_width_for_the_128_byte_swizzle():
    with pytest.raises(ValueError, match=r"at most 128 for the 128-byte swizzle.*box_cols=128"):
        tensor_map(fake(shape=(64, 128)), 64, box_cols=128)
    with pytest.raises(ValueError, match="multiple of 16.*box_cols=4"):
        tensor_map(fake(), 64, box_cols=4)
    with pytest.raises(ValueError, match="x must be 2-D"):
        tensor_map(fake(shape=(2, 64, 64), strides=(8192, 128, 2)), 64)
    with pytest.raises(TypeError, match=r"x must be a CuPy array \(GPU memory\), got ndarray"):
        tensor_map(np.zeros((64, 64), np.float16), 64)
    for dtype in ("float16", "bfloat16"):  # valid arguments pass the checks
        assert hp.check_tensor_map_args((100, 64), dtype, (128, 2), 0x10000, 64) == 2
        assert hp.check_tensor_map_args((100, 128), dtype, (256, 2), 0x10000, 128, 64) == 2


def test_imports_need_neither_cupy_nor_cuda_bindings():
    code = (
        "import sys\n"
        "import flashref, flashref.hardware.hopper, flashref.bench.hopper_probe\n"
        "print('cupy' in sys.modules, 'cuda.bindings' in sys.modules, 'cuda' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]


# ---------------------------------------------------------------- the probe's diagnosis


def test_probe_diagnosis_names_planted_faults():
    """What hopper_probe reports for results a wrong layout would give (no GPU needed)."""
    rng = np.random.default_rng(1)
    Q, K = (rng.integers(-2, 3, (64, 64)).astype(np.float64) for _ in range(2))
    S, src = Q @ K.T, hp.wgmma_c_map(64)
    raw = S[src[..., 0], src[..., 1]]  # (128, 32): what a right kernel leaves in registers
    checks = hpp._check_product("S", raw, S, S, 64, hpp.product_hypotheses(Q, K))
    assert [c[1] for c in checks] == [True, True]
    wrong = hpp.read_as(Q, 0) @ hpp.read_as(K, 0).T  # descriptors without the swizzle bits
    raw_wrong = wrong[src[..., 0], src[..., 1]]
    checks = hpp._check_product("S", raw_wrong, wrong, S, 64, hpp.product_hypotheses(Q, K))
    assert checks[0][1] and not checks[1][1]
    assert "matches: ['Q and K read with no swizzle']" in checks[1][2]
    assert re.search(r"\d+ of 4096 differ; \(0, \d+\): expected", checks[1][2])
    # the right product in the registers, placed by interleaved warps: named as a map fault
    inter = src.copy()
    inter[..., 0] = 4 * (src[..., 0] % 16) + (np.arange(128) // 32)[:, None]
    raw_inter = np.empty_like(raw)
    raw_inter[...] = S[inter[..., 0], inter[..., 1]]
    checks = hpp._check_product("S", raw_inter, hp.place(raw_inter, src, (64, 64)), S, 64, {})
    assert "warp w holding rows w, w + 4" in checks[1][2]
    # a NaN (an element never written) fails the comparisons
    assert np.isnan(hpp.rel_err(np.where(S == S[0, 0], np.nan, S), S))
    assert "expected" in hpp.first_mismatches(np.full((2, 2), np.nan), np.zeros((2, 2)))


def test_probe_arguments_are_checked():
    with pytest.raises(ValueError, match="stage must be one of"):
        hpp.run("wgmma", "float16", 64)
    with pytest.raises(ValueError, match="dtype must be float16 or bfloat16"):
        hpp.run("tma", "float32", 64)
    with pytest.raises(ValueError, match="n must be 64 or 128"):
        hpp.run("tma", "float16", 256)
    assert '#include "' not in hpp.source() and "wgmma_rs_n128" in hpp.source()


# ---------------------------------------------------------------- figures


@pytest.fixture
def close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def test_draw_swizzle_puts_each_chunk_where_the_model_says(close_figures):
    from flashref.hardware import hopper_figures as hf

    fig = hf.draw_swizzle()
    assert fig.get_size_inches()[0] * fig.dpi == 800
    ax = fig.axes[0]
    labels = [t for t in ax.texts if re.fullmatch(r"\d\.\d", t.get_text())]
    assert len(labels) == 2 * 64  # every chunk, once on each side
    right = [t for t in labels if t.get_position()[0] > 10]
    stored = hp.chunk_map(8)
    for t in right:
        r, j = map(int, t.get_text().split("."))
        x, y = t.get_position()
        assert y == r + 0.5 and x == 1.2 + 8 + 2.0 + stored[r, j] + 0.5, t.get_text()
    assert sorted(t.get_text() for t in right) == sorted(
        f"{r}.{j}" for r in range(8) for j in range(8)
    )


@pytest.mark.parametrize("n,warp", [(64, 0), (128, 2)])
def test_draw_accumulators_labels_come_from_the_map(n, warp, close_figures):
    from flashref.hardware import hopper_figures as hf

    fig = hf.draw_accumulators(n, warp)
    assert fig.get_size_inches()[0] * fig.dpi == 800
    texts = [t.get_text() for t in fig.axes[1].texts]
    labels = [x for x in texts if re.fullmatch(r"T\d+ d\d+", x)]
    src = hp.wgmma_c_map(n)
    held = {tuple(src[t, i]): (t, i) for t in range(128) for i in range(n // 2)}
    want = []
    for r in range(16 * warp, 16 * warp + 16):
        for c in range(8):
            want.append("T{} d{}".format(*held[r, c]))
    assert labels == want
    assert labels[:3] == [f"T{32 * warp} d0", f"T{32 * warp} d1", f"T{32 * warp + 1} d0"]
    # the line on the next columns: columns 8-15 are the same threads, registers 4 on
    assert all(
        held[r, c + 8] == (held[r, c][0], held[r, c][1] + 4)
        for r in range(16 * warp, 16 * warp + 16)
        for c in range(8)
    )
    assert any(x.startswith("columns 8-15: the same threads, registers d4-d7;") for x in texts)
    with pytest.raises(ValueError, match=r"warp must be in 0\.\.3, got 4"):
        hf.draw_accumulators(64, 4)


def _boxes(ax):
    """(column, row, text) of each labelled box of a draw_pingpong panel."""
    return sorted(
        (int(t.get_position()[0]), int(t.get_position()[1]), t.get_text())
        for t in ax.texts
        if "\n" in t.get_text()
    )


def test_draw_pingpong_draws_the_models_order(close_figures):
    import matplotlib.pyplot as plt

    from flashref.hardware import hopper_figures as hf
    from flashref.hardware import pingpong as pp

    fig = hf.draw_pingpong(3)
    assert fig.get_size_inches()[0] * fig.dpi == 800
    free, turns = (_boxes(ax) for ax in fig.axes)
    for got, program in ((free, pp.without_turns()), (turns, pp.consumer)):
        want = [
            (col, cw, hf._box_text(kind, op))
            for col, cw, kind, op in hf.schedule_boxes(pp.run(3, (3, 3), 2, program=program))
        ]
        assert got == sorted(want)

    def issuing(boxes, cw):  # the columns in which warpgroup cw issues products
        return {c for c, r, t in boxes if r == cw and t.startswith(("GEMMs", "last"))}

    assert issuing(free, 0) == issuing(free, 1) and len(issuing(free, 0)) == 4  # v21: at once
    assert len(issuing(turns, 0)) == 4 and not issuing(turns, 0) & issuing(turns, 1)  # v23
    # warpgroup 1's GEMMs of tile 0 beside warpgroup 0's softmax of tile 0
    assert (1, 0, "softmax\n0") in turns and (1, 1, "GEMMs\n0") in turns
    texts = [t.get_text() for t in fig.texts]
    assert any("order of events, not time" in t for t in texts)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(labels) == 2 and "empty" not in " ".join(labels)
    plt.close(fig)
    causal = hf.draw_pingpong(4, (2, 4))
    assert sum(t == "empty\nturn" for _, r, t in _boxes(causal.axes[1]) if r == 0) == 2
    assert "empty turn" in causal.legends[0].get_texts()[-1].get_text()


def test_draw_pingpong_refuses_bad_arguments_before_drawing(close_figures):
    import matplotlib.pyplot as plt

    from flashref.hardware import hopper_figures as hf

    before = plt.get_fignums()
    with pytest.raises(ValueError, match=r"n_mine\[0\] must be in 1\.\.3, got 4"):
        hf.draw_pingpong(3, (4, 3))
    with pytest.raises(ValueError, match=r"n_tiles must be >= 1, got 0"):
        hf.draw_pingpong(0)
    assert plt.get_fignums() == before
