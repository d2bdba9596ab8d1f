"""flashref.hardware.fragments against the PTX ISA, against the kernels' source, and on a GPU.

The CPU tests restate the layouts the way the PTX ISA documents them, independently
of how the library builds them (the library composes 8 x 8 ldmatrix blocks; the
tests use the ISA's row/col formulas):

* "Matrix Fragments for mma.m16n8k16 with floating point type" (section 9.7.14.5.8
  of PTX ISA 8.x, 9.7.15.5.8 in later editions), https://docs.nvidia.com/cuda/
  parallel-thread-execution/#warp-level-matrix-fragment-mma-16816-float
* "Warp-level matrix load instruction: ldmatrix", https://docs.nvidia.com/cuda/
  parallel-thread-execution/#warp-level-matrix-instructions-ldmatrix

The GPU tests (marker ``gpu``) run ``flashref/kernels/probes/probe_fragments.cu`` and
compare every lane's registers with the library's maps.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from flashref.gpu import KERNEL_DIR, VERSIONS
from flashref.hardware import fragment_figures as ff
from flashref.hardware import fragments as fr

LANES = range(32)

# ---------------------------------------------------------------- the PTX ISA, as written


def isa_mma_a(lane, i):
    """a_i, i = 0..7 (four .f16x2 registers, elements low to high): PTX ISA Figure 79's formula."""
    groupID, threadID_in_group = lane >> 2, lane % 4
    row = groupID if (0 <= i < 2 or 4 <= i < 6) else groupID + 8
    col = (threadID_in_group * 2) + (i & 0x1) + (8 if i >= 4 else 0)
    return row, col


def isa_mma_b(lane, i):
    """b_i, i = 0..3 (two .f16x2 registers): PTX ISA Figure 81's formula; (row, col) = (k, n)."""
    groupID, threadID_in_group = lane >> 2, lane % 4
    row = (threadID_in_group * 2) + (i & 0x1) + (8 if i >= 2 else 0)
    return row, groupID


def isa_mma_c(lane, i):
    """c_i, i = 0..3 (four .f32 registers): PTX ISA Figure 83's formula."""
    groupID, threadID_in_group = lane >> 2, lane % 4
    row = groupID if i < 2 else groupID + 8
    return row, (threadID_in_group * 2) + (i & 0x1)


def isa_ldmatrix_x4(lane, reg, half, trans):
    """ldmatrix, in the ISA's words: thread 0 receives the first fragment (two b16 elements,
    one register), thread 1 the next, "a group of four threads loads an entire row"; with
    .x4 "elements of the [m-th] matrix are loaded in the subsequent destination registers";
    ".trans indicates that the matrix is loaded in column-major format". Returns
    (matrix, row, col) of the element in the matrix as stored (row = addressed row).
    """
    position = 2 * lane + half  # 0..63: the element's place in the order of loading
    if trans:  # column-major order: consecutive elements run down a column
        return reg, position % 8, position // 8
    return reg, position // 8, position % 8


def isa_ldmatrix_x4_row_lane(matrix, row):
    """.x4: threads 0-7 give addr0-addr7 (rows of the first matrix), 8-15 addr8-addr15, ..."""
    threads = {0: range(0, 8), 1: range(8, 16), 2: range(16, 24), 3: range(24, 32)}
    return threads[matrix][row]


def test_mma_a_is_the_isa_layout():
    for lane in LANES:
        for i in range(8):
            assert fr.mma_a(lane, i // 2, i % 2) == isa_mma_a(lane, i), (lane, i)


def test_mma_b_is_the_isa_layout():
    for lane in LANES:
        for i in range(4):
            assert fr.mma_b(lane, i // 2, i % 2) == isa_mma_b(lane, i), (lane, i)


def test_mma_c_is_the_isa_layout():
    for lane in LANES:
        for i in range(4):
            assert fr.mma_c(lane, i) == isa_mma_c(lane, i), (lane, i)


@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_is_the_isa_layout(trans):
    for lane in LANES:
        for reg in range(4):
            for half in range(2):
                got = fr.ldmatrix_x4(lane, reg, half, trans)
                assert got == isa_ldmatrix_x4(lane, reg, half, trans), (lane, reg, half)
    for m in range(4):
        for row in range(8):
            assert fr.ldmatrix_x4_row_lane(m, row) == isa_ldmatrix_x4_row_lane(m, row)


def test_isa_restatements_are_not_vacuous():
    """The formulas above differ where the layouts differ (a test that cannot fail is none)."""
    assert isa_mma_a(5, 1) == (1, 3) and isa_mma_a(5, 2) == (9, 2) and isa_mma_a(5, 4) == (1, 10)
    assert isa_mma_b(5, 1) == (3, 1) and isa_mma_b(5, 2) == (10, 1)
    assert isa_ldmatrix_x4(5, 0, 1, False) == (0, 1, 3)
    assert isa_ldmatrix_x4(5, 0, 1, True) == (0, 3, 1)
    assert fr.ldmatrix_x4(5, 0, 1, True) != fr.ldmatrix_x4(5, 0, 1, False)


# ---------------------------------------------------------------- bijections and inverses


@pytest.mark.parametrize("operand", ["A", "B", "C"])
def test_every_element_held_exactly_once(operand):
    src = fr.fragment_map(operand)  # (32, regs, halves, 2)
    rows, cols = fr.SHAPES[operand]
    assert src.shape[1] * src.shape[2] * 32 == rows * cols
    counts = np.zeros((rows, cols), dtype=int)
    np.add.at(counts, (src[..., 0], src[..., 1]), 1)
    assert (counts == 1).all()
    lane_of, reg_of, half_of = fr.owners(src, (rows, cols))
    for (lane, reg, half), _ in np.ndenumerate(src[..., 0]):
        row, col = src[lane, reg, half]
        assert (lane_of[row, col], reg_of[row, col], half_of[row, col]) == (lane, reg, half)


@pytest.mark.parametrize("name", ["Q", "K", "V"])
def test_each_load_covers_its_16x16_tile_once(name):
    load = fr.KERNEL_LOADS[name]
    lane_of, _, _ = fr.owners(fr.ldmatrix_x4_load(load.address, load.trans), (16, 16))
    assert (lane_of >= 0).all()


def test_owners_rejects_doubles_and_out_of_range():
    src = fr.fragment_map("C").copy()
    src[1, 0, 0] = src[0, 0, 0]
    with pytest.raises(ValueError, match=r"element \(0, 0\) is held twice"):
        fr.owners(src, (16, 8))
    with pytest.raises(ValueError, match="outside shape"):
        fr.owners(fr.fragment_map("A"), (16, 8))  # A's columns 8..15 do not fit
    with pytest.raises(ValueError, match="outside shape"):
        fr.owners(fr.fragment_map("C") - 1, (16, 8))  # -1 would wrap around silently
    with pytest.raises(ValueError, match=r"src must have shape \(32, regs, halves, 2\)"):
        fr.owners(np.zeros((16, 2), dtype=int), (16, 8))


# ---------------------------------------------------------------- the kernels' loads


@pytest.mark.parametrize("name", ["Q", "K", "V"])
def test_loads_give_every_lane_its_mma_fragments(name):
    assert fr.check_load(name) is True


def test_a_wrong_load_is_caught():
    """The check compares something: .trans on K, or lane / 16 for lane / 8 % 2, fail it."""
    K, Q = fr.KERNEL_LOADS["K"], fr.KERNEL_LOADS["Q"]
    assert not np.array_equal(fr.ldmatrix_x4_load(K.address, True), K.expected())
    V = fr.KERNEL_LOADS["V"]
    assert not np.array_equal(fr.ldmatrix_x4_load(V.address, False), V.expected())

    def q_swapped(lane):  # lanes 8-15 at columns 8..15 instead of rows 8..15
        return lane % 8 + (lane // 16) * 8, ((lane // 8) % 2) * 8

    assert not np.array_equal(fr.ldmatrix_x4_load(q_swapped, False), Q.expected())
    assert not np.array_equal(replace(K, rows_are_n=False).expected(), K.expected())


def test_blocks_and_description():
    assert fr.ldmatrix_x4_blocks(fr.q_address).tolist() == [[0, 0], [8, 0], [0, 8], [8, 8]]
    assert fr.ldmatrix_x4_blocks(fr.k_address).tolist() == [[0, 0], [0, 8], [8, 0], [8, 8]]
    assert fr.ldmatrix_x4_blocks(fr.v_address).tolist() == [[0, 0], [8, 0], [0, 8], [8, 8]]
    assert fr.describe_load("Q") == "\n".join(
        [
            "Q_i (queries x d), the A operand of S = Q_i K_j^T:",
            "  ldmatrix.x4 at Qs + (row0 + lane % 16) * LDS + k0 + (lane / 16) * 8",
            "  lanes  0- 7 -> rows  0- 7, columns  0- 7: matrix 0 -> a0",
            "  lanes  8-15 -> rows  8-15, columns  0- 7: matrix 1 -> a1",
            "  lanes 16-23 -> rows  0- 7, columns  8-15: matrix 2 -> a2",
            "  lanes 24-31 -> rows  8-15, columns  8-15: matrix 3 -> a3",
            "  every lane's registers are its mma A fragments: True",
        ]
    )
    with pytest.raises(ValueError, match="lanes 0-7 do not point at one 8 x 8 block"):
        fr.ldmatrix_x4_blocks(lambda lane: (2 * lane, 0))


def test_c_pairs_of_two_tiles_are_an_a_fragment():
    """P V: accumulator tiles 2 kk and 2 kk + 1 of S, packed in pairs, are A for slice kk."""
    for lane in LANES:
        for reg in range(4):
            tile, c_lo, c_hi = fr.a_from_c(reg)
            for half, c in enumerate((c_lo, c_hi)):
                row, n = fr.mma_c(lane, c)
                assert fr.mma_a(lane, reg, half) == (row, 8 * tile + n)


# ---------------------------------------------------------------- the kernels' source

# every version that uses ldmatrix (3 to 11 today) must use the three patterns of the library
LDSM_VERSIONS = [v for v in VERSIONS.values() if "ldmatrix" in v.path.read_text()]
# the Hopper versions (arch sm_90a) read shared memory through wgmma descriptors, not
# ldmatrix, and hold S as one flat accumulator array: their P packing is checked apart
HOPPER_VERSIONS = [v for v in VERSIONS.values() if v.arch]
PACK_VERSIONS = [
    v for v in VERSIONS.values() if "pack_half2(s" in v.path.read_text() and not v.arch
]
LDSM = re.compile(r"\b(ldsm_x4|ldsm_x4_trans)\(\s*(\w+)\s*\+")
PACK = re.compile(
    r"\ba(?:\[mi\]\[)?(\d)\]? = pack_half2\(s(?:\[mi\])?\[2 \* kk( \+ 1)?\]\[(\d)\], "
    r"s(?:\[mi\])?\[2 \* kk( \+ 1)?\]\[(\d)\]\)"
)


def _first_argument(text: str, start: int) -> str:
    """The text from ``start`` up to the first comma outside parentheses."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if text[i] == "," and depth == 0:
            return text[start:i]
    raise AssertionError("unterminated call")


def _ldsm_calls(path):
    """[(trans, base, expression)] for every ldsm_x4(...) call in a .cu file."""
    text = path.read_text()
    calls = []
    for m in LDSM.finditer(text):
        if text[m.start() - 20 : m.start()].rstrip().endswith("void"):
            continue  # the wrapper's own definition
        calls.append((m.group(1) == "ldsm_x4_trans", m.group(2), _first_argument(text, m.start(2))))
    return calls


def _evaluate(expression: str, lane: int, **offsets) -> tuple[int, int]:
    """Evaluate a kernel's address (C integer arithmetic, all operands >= 0) as (row, col)."""
    LDS = 1000  # any stride wider than a row decodes the offset uniquely
    names = dict(
        Qs=0,
        Ks=0,
        Vs=0,
        Ts=0,
        LDS=LDS,
        lane=lane,
        warp=0,
        wrow0=0,
        mi=0,
        row0=0,
        k0=0,
        kk=0,
        j=0,
        n=0,
    )
    names.update(offsets)
    # the expression is read from this repository's .cu files; it has names and + * / % only
    offset = eval(expression.replace("/", "//"), {"__builtins__": {}}, names)
    return divmod(offset, LDS)


# the loop offsets set in the second evaluation, and what they mean to the library
OFFSETS = dict(warp=1, wrow0=16, row0=16, k0=16, kk=1, j=2, n=2)
LIBRARY = {
    "Q": lambda lane: fr.q_address(lane, row0=16, k0=16),  # warp * 16, wrow0 + mi * 16; kk * 16
    "K": lambda lane: fr.k_address(lane, j=2, k0=16),
    "V": lambda lane: fr.v_address(lane, kk=1, n=2),
}


# Versions 12 and later take each lane's offset once, in bytes (``a_lane``, ``k_lane``,
# ``v_lane``, added to the shared-memory base ``Qs`` or folded into ``Ks`` and ``Vs``), and add
# compile-time byte offsets at each call: ``Qs + a_lane + (mi * 16 * LDS + k0) * 2``.
LANE_DEF = re.compile(r"const u32 ([akv]_lane) = (.*?);")


def _byte_address(expression: str, lane_defs: dict, lane: int, **offsets) -> tuple[int, int]:
    LDS = 1000
    names = dict(LDS=LDS, lane=lane, warp=0, wrow0=0, mi=0, k0=0, kk=0, j=0, n=0)
    names.update(offsets)
    lanes = {
        k: eval(v.replace("/", "//"), {"__builtins__": {}}, names) for k, v in lane_defs.items()
    }
    names.update(lanes)
    # Ks and Vs already hold their lane offsets; Qs does where the call does not add a_lane
    names.update(
        Qs=0 if "a_lane" in expression else lanes["a_lane"],
        Ks=lanes["k_lane"],
        Vs=lanes["v_lane"],
        HB=0,
    )
    offset = eval(expression.replace("/", "//"), {"__builtins__": {}}, names)
    assert offset % 2 == 0, f"odd byte offset {offset} in {expression}"
    return divmod(offset // 2, LDS)


def _check_call(name, trans, expression, lane_defs=None):
    load = fr.KERNEL_LOADS[name]
    assert trans == load.trans, f"{name} load: .trans is {trans}, fragments.py says {load.trans}"
    for lane in LANES:
        if lane_defs:
            got = _byte_address(expression, lane_defs, lane)
            got_offsets = _byte_address(expression, lane_defs, lane, **OFFSETS)
        else:
            got = _evaluate(expression, lane)
            got_offsets = _evaluate(expression, lane, **OFFSETS)
        assert got == load.address(lane), (name, expression, lane)
        assert got_offsets == LIBRARY[name](lane), (name, lane)


def test_versions_3_to_11_are_checked():
    assert {v.number for v in LDSM_VERSIONS} >= set(range(3, 12))
    assert {v.number for v in PACK_VERSIONS} >= set(range(3, 12))


def test_every_tensor_core_version_is_checked():
    tensor_core = {n for n, v in VERSIONS.items() if v.dtype != "float32" and not v.arch}
    assert {v.number for v in LDSM_VERSIONS} == tensor_core
    assert not {v.number for v in LDSM_VERSIONS} & {v.number for v in HOPPER_VERSIONS}


# a Hopper version packs P as a[kk][r] (or p[kk][r]) = pack_half2(s[i], s[i']) over the flat
# accumulator s[4 j + e] (wgmma's C layout: 8-column tile j, element e of the mma.sync C fragment)
FLAT_PACK = re.compile(r"[ap]\[kk\]\[r\] = pack_half2\(s\[([^\]]+)\], s\[([^\]]+)\]\)")


@pytest.mark.parametrize("ver", HOPPER_VERSIONS, ids=lambda v: f"v{v.number}")
def test_hopper_p_to_a_is_a_from_c(ver):
    found = FLAT_PACK.findall(ver.source())
    assert len(found) == 1, found
    lo, hi = found[0]
    for kk in range(4):
        for r in range(4):
            i_lo, i_hi = (eval(x, {}, {"kk": kk, "r": r}) for x in (lo, hi))  # noqa: S307
            j, e_lo, e_hi = i_lo // 4, i_lo % 4, i_hi % 4
            assert i_hi // 4 == j, (kk, r)
            assert (j - 2 * kk, e_lo, e_hi) == fr.a_from_c(r), (kk, r)


@pytest.mark.parametrize("ver", LDSM_VERSIONS, ids=lambda v: f"v{v.number}")
def test_kernel_addresses_are_the_library_patterns(ver):
    calls = _ldsm_calls(ver.path)
    bases = {"Qs": "Q", "Ks": "K", "Vs": "V"}
    assert {bases[base] for _, base, _ in calls} == {"Q", "K", "V"}, calls
    lane_defs = dict(LANE_DEF.findall(ver.path.read_text())) or None
    for trans, base, expression in calls:
        _check_call(bases[base], trans, expression, lane_defs)


@pytest.mark.parametrize("ver", PACK_VERSIONS, ids=lambda v: f"v{v.number}")
def test_kernel_p_to_a_is_a_from_c(ver):
    found = {}
    for reg, plus1, c_lo, plus1b, c_hi in PACK.findall(ver.path.read_text()):
        assert plus1 == plus1b
        found[int(reg)] = (1 if plus1 else 0, int(c_lo), int(c_hi))
    assert found == {reg: fr.a_from_c(reg) for reg in range(4)}


def test_probe_uses_the_kernel_patterns():
    calls = _ldsm_calls(KERNEL_DIR / "probes" / "probe_fragments.cu")
    assert len(calls) == 3
    for name, (trans, _, expression) in zip("QKV", calls, strict=True):
        _check_call(name, trans, expression)


# ---------------------------------------------------------------- errors


def test_bad_indices_are_named():
    for bad, exc, msg in [
        (32, ValueError, r"lane must be in 0\.\.31, got 32"),
        (-1, ValueError, r"lane must be in 0\.\.31, got -1"),
        (1.0, TypeError, "lane must be an int, got float"),
        (True, TypeError, "lane must be an int, got bool"),
    ]:
        for call in (
            lambda x: fr.mma_a(x, 0, 0),
            lambda x: fr.mma_c(x, 0),
            lambda x: fr.ldmatrix_x4(x, 0, 0),
            fr.q_address,
        ):
            with pytest.raises(exc, match=msg):
                call(bad)
    with pytest.raises(ValueError, match=r"reg must be in 0\.\.1, got 2"):
        fr.mma_b(0, 2, 0)
    with pytest.raises(ValueError, match=r"half must be in 0\.\.1, got 2"):
        fr.mma_a(0, 0, 2)
    with pytest.raises(ValueError, match=r"matrix must be in 0\.\.3, got 4"):
        fr.ldmatrix_x4_row_lane(4, 0)
    with pytest.raises(TypeError, match="trans must be a bool, got int"):
        fr.ldmatrix_x4(0, 0, 0, 1)
    with pytest.raises(ValueError, match=r"operand must be one of \['A', 'B', 'C'\], got 'D'"):
        fr.fragment_map("D")
    with pytest.raises(ValueError, match=r"name must be one of \['K', 'Q', 'V'\], got 'O'"):
        fr.describe_load("O")


def test_bad_addresses_are_named():
    with pytest.raises(TypeError, match="address must be a function of the lane, got int"):
        fr.ldmatrix_x4_load(0)
    for bad in (lambda lane: lane, lambda lane: (lane, -8), lambda lane: (0.5, 0)):
        with pytest.raises(ValueError, match=r"address\(lane\) must return \(row, column\)"):
            fr.ldmatrix_x4_load(bad)


# ---------------------------------------------------------------- figures


@pytest.fixture
def close_figures():
    """The drawings are pyplot figures: close them after each test."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def _cell_labels(fig):
    return [t.get_text() for t in fig.axes[0].texts if "\n" in t.get_text()]


def _expected_labels(src, shape, letter, halves, column_blocks):
    """The labels the maps give, in drawing order: block by block, row by row."""
    lane_of, reg_of, half_of = fr.owners(src, shape)
    labels = []
    for cols in column_blocks:
        for r in range(shape[0]):
            for c in cols:
                half = f".{half_of[r, c]}" if halves == 2 else ""
                labels.append(f"T{lane_of[r, c]}\n{letter}{reg_of[r, c]}{half}")
    return labels


def test_draw_mma_labels_come_from_the_maps(close_figures):
    fig = ff.draw_mma("A")
    assert fig.get_size_inches()[0] * fig.dpi == 800
    labels = _cell_labels(fig)
    assert labels == _expected_labels(fr.fragment_map("A"), (16, 16), "a", 2, [range(16)])
    assert labels[1] == "T0\na0.1" and labels[8] == "T0\na2.0"  # row 0, columns 1 and 8
    labels = _cell_labels(ff.draw_mma("B", "C"))
    assert labels[:128] == _expected_labels(fr.fragment_map("B"), (16, 8), "b", 2, [range(8)])
    assert labels[128:] == _expected_labels(fr.fragment_map("C"), (16, 8), "c", 1, [range(8)])
    assert labels[128 + 2] == "T1\nc0"  # fp32: no half
    with pytest.raises(ValueError, match="at least one of"):
        ff.draw_mma()
    with pytest.raises(ValueError, match="operand must be one of"):
        ff.draw_mma("A", "D")


@pytest.mark.parametrize("name", ["Q", "K", "V"])
def test_draw_load_labels_and_address_lanes(name, close_figures):
    load = fr.KERNEL_LOADS[name]
    fig = ff.draw_load(name)
    src = fr.ldmatrix_x4_load(load.address, load.trans)
    letter = "a" if name == "Q" else "b"
    blocks = [range(8), range(8, 16)]
    assert _cell_labels(fig) == _expected_labels(src, (16, 16), letter, 2, blocks)
    arrows = [t for t in fig.axes[0].texts if t.get_text().endswith("\u2192")]
    assert sorted(t.get_text() for t in arrows) == sorted(f"T{lane}\u2192" for lane in LANES)
    for t in arrows:  # each sits on the row its lane's address starts
        row, _ = load.address(int(t.get_text()[1:-1]))
        assert t.get_position()[1] == row + 0.5
    with pytest.raises(ValueError, match="name must be one of"):
        ff.draw_load("S")


def test_import_needs_neither_cupy_nor_matplotlib():
    code = (
        "import sys\n"
        "import flashref.hardware.fragments, flashref.hardware.fragment_figures\n"
        "print('cupy' in sys.modules, 'matplotlib' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# ---------------------------------------------------------------- on the GPU


@pytest.fixture(scope="module")
def probes():
    import cupy as cp

    module = cp.RawModule(
        code=(KERNEL_DIR / "probes" / "probe_fragments.cu").read_text(), options=("--std=c++17",)
    )
    return cp, module


@pytest.mark.gpu
@pytest.mark.parametrize("pattern,name", [(0, "Q"), (1, "K"), (2, "V")])
def test_gpu_ldmatrix_registers_are_the_maps(probes, pattern, name):
    cp, module = probes
    rows, cols = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
    tile = cp.asarray((rows << 8 | cols).astype(np.uint16))  # (16, 16): each entry its (row, col)
    out = cp.full((32, 4), 0xFFFFFFFF, dtype=cp.uint32)  # poisoned: decodes to (255, 255)
    module.get_function("probe_ldmatrix")((1,), (32,), (tile, out, np.int32(pattern)))
    regs = cp.asnumpy(out)  # (32, 4)
    halves = np.stack([regs & 0xFFFF, regs >> 16], axis=-1)  # (32, 4, 2): half 0 = low bits
    got = np.stack([halves >> 8, halves & 0xFF], axis=-1).astype(np.int64)  # (32, 4, 2, 2)
    load = fr.KERNEL_LOADS[name]
    assert np.array_equal(got, fr.ldmatrix_x4_load(load.address, load.trans))
    assert np.array_equal(got, load.expected())


def _pack(M, src):
    """(32, regs) uint32: each lane's registers for matrix M (fp16) laid out by src."""
    bits = M.astype(np.float16)[src[..., 0], src[..., 1]].view(np.uint16)  # (32, regs, 2)
    return bits[..., 0].astype(np.uint32) | (bits[..., 1].astype(np.uint32) << 16)


def _mma(probes, A, B):
    """D = A B (C = 0) on the tensor cores, returned as each lane's d0..d3, (32, 4)."""
    cp, module = probes
    out = cp.full((32, 4), np.nan, dtype=cp.float32)  # poisoned: an unwritten d stays NaN
    a = cp.asarray(_pack(A, fr.fragment_map("A")))  # (32, 4)
    b = cp.asarray(_pack(B, fr.fragment_map("B")))  # (32, 2)
    module.get_function("probe_mma")((1,), (32,), (a, b, out))
    return cp.asnumpy(out)


@pytest.mark.gpu
def test_gpu_mma_layouts(probes):
    """Inputs are small integers, so every product and sum is exact in fp16 and fp32.

    A = I and B[k, n] = 8 k + n give D = B: each d reveals its (row, n) (the C map,
    with A's rows and B's columns). B selecting column n + 8 s of A[r, k] = 16 r + k
    reveals A. Random integers check the whole product. (No product can see an order
    of k that A and B share; the ldmatrix probe and the ISA tests pin that.)
    """
    C = fr.fragment_map("C")[:, :, 0]  # (32, 4, 2): (row, n) of d0..d3
    k, n = np.meshgrid(np.arange(16), np.arange(8), indexing="ij")
    D = _mma(probes, np.eye(16), 8 * k + n)  # (32, 4)
    assert np.array_equal(D, 8 * C[..., 0] + C[..., 1])
    r, kk = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
    for s in (0, 1):
        D = _mma(probes, 16 * r + kk, (k == n + 8 * s).astype(float))
        assert np.array_equal(D, 16 * C[..., 0] + C[..., 1] + 8 * s)
    rng = np.random.default_rng(8)
    A, B = rng.integers(-3, 4, (16, 16)), rng.integers(-3, 4, (16, 8))
    D = _mma(probes, A, B)
    assert np.array_equal(D, (A @ B)[C[..., 0], C[..., 1]])
