"""flashref.gpu.decode without a GPU: argument checks, the split-count rule, the launch plan.

Every refusal happens before CuPy is needed, so NumPy arrays stand in for GPU arrays here
(the checks read only ``shape``, ``dtype`` and ``ndim``); valid arguments on a machine
without CuPy end in ``GPUUnavailableError``.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import flashref.gpu as fg
from flashref.gpu import decode as dec
from flashref.gpu.decode import checks as dchk
from flashref.gpu.registry import KERNEL_DIR, paste_includes


def _qkv(Hq=8, Hkv=2, Nq=1, Nk=100, d=64, dtype=np.float16, B=2):
    q = np.zeros((B, Hq, Nq, d), dtype=dtype)
    k = np.zeros((B, Hkv, Nk, d), dtype=dtype)
    return q, k, k.copy()


@pytest.mark.parametrize(
    "kwargs,args,error,match",
    [
        ({}, _qkv(Nq=17), ValueError, r"1 <= Nq <= 16: .* use flashref.gpu.flash_attention"),
        ({}, _qkv(Nq=0), ValueError, r"q has 0 queries per sequence"),
        ({}, _qkv(Hq=6, Hkv=4), ValueError, r"q has 6 heads but k has 4"),
        ({}, _qkv(d=96), ValueError, r"head dim d=96; the decode kernel supports d in \(64, 128\)"),
        ({}, _qkv(dtype=np.float32), TypeError, r"q has dtype float32; the decode kernel"),
        ({}, (np.zeros((8, 1, 64), np.float16),) + _qkv()[1:], ValueError, r"expected \(B, Hq"),
        ({}, ([1.0],) + _qkv()[1:], TypeError, r"q must be a cupy.ndarray or a torch"),
        ({"causal": True}, _qkv(), ValueError, r"causal=True is the top-left mask"),
        ({"causal": "top_left"}, _qkv(), ValueError, r"of the decode kernels is bottom-right"),
        ({"causal": 1}, _qkv(), TypeError, r"causal must be False, True, 'top_left' or 'bott"),
        ({"return_lse": "yes"}, _qkv(), TypeError, r"return_lse must be a bool"),
        ({"scale": 0.0}, _qkv(), ValueError, r"scale must be finite and nonzero"),
        ({"num_splits": 0}, _qkv(), ValueError, r"num_splits must be >= 1, got 0"),
        ({"num_splits": 2.0}, _qkv(), TypeError, r"num_splits must be an int"),
        ({"lengths": [1, 101]}, _qkv(), ValueError, r"lengths\[1\] is 101; expected 0 <= length"),
        ({"lengths": [-1, 3]}, _qkv(), ValueError, r"lengths\[0\] is -1"),
        ({"lengths": [1, 2, 3]}, _qkv(), ValueError, r"lengths has shape \(3,\); expected \(2,\)"),
        ({"lengths": [1.0, 2.0]}, _qkv(), TypeError, r"lengths has dtype float64; expected int"),
    ],
)
def test_decode_attention_refuses(kwargs, args, error, match):
    with pytest.raises(error, match=match):
        fg.decode_attention(*args, **kwargs)


def test_decode_attention_shape_messages_are_the_cpu_ones():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"v has shape .* but k has 100 keys"):
        fg.decode_attention(q, k, v[:, :, :50])
    with pytest.raises(ValueError, match=r"k has shape .* but q has head dim 64"):
        fg.decode_attention(q, np.zeros((2, 2, 100, 128), np.float16), v)
    with pytest.raises(TypeError, match=r"must share one dtype"):
        fg.decode_attention(q, k, v.astype(np.float32))


def _paged(P=6, Hkv=2, ps=16, d=64):
    q = np.zeros((2, 4, 1, d), np.float16)
    kp = np.zeros((P, Hkv, ps, d), np.float16)
    return q, kp, kp.copy()


@pytest.mark.parametrize(
    "table,lengths,match",
    [
        (np.array([[0, 1], [2, 6]]), [5, 20], r"block_table\[1, 1\] is 6, a page sequence 1 uses"),
        (np.array([[0, -1], [2, 3]]), [17, 20], r"block_table\[0, 1\] is -1"),
        (np.array([[0, 1], [2, 3]]), [5, 33], r"lengths\[1\] is 33; expected 0 <= length <= 32"),
        (np.array([0, 1]), [5, 3], r"block_table has shape \(2,\); expected 2 dimension"),
        (np.array([[0, 1]]), [5, 3], r"block_table has shape \(1, 2\); expected \(2, max_pages\)"),
        (np.array([[0.0, 1]] * 2), [5, 3], r"block_table has dtype float64; expected integers"),
    ],
)
def test_paged_decode_attention_refuses(table, lengths, match):
    with pytest.raises((ValueError, TypeError), match=match):
        fg.paged_decode_attention(*_paged(), table, np.array(lengths))


def test_paged_shapes_and_unused_table_entries(no_cupy):
    q, kp, vp = _paged()
    with pytest.raises(ValueError, match=r"v_pages has shape .* but k_pages"):
        fg.paged_decode_attention(q, kp, vp[:, :, :8], np.zeros((2, 1), int), [1, 1])
    with pytest.raises(ValueError, match=r"q has 4 heads but k_pages has 3"):
        fg.paged_decode_attention(q, *_paged(Hkv=3)[1:], np.zeros((2, 1), int), [1, 1])
    # -1 past the pages in use is what PagedKVCache.block_table writes: accepted
    with pytest.raises(fg.GPUUnavailableError):
        fg.paged_decode_attention(q, kp, vp, np.array([[0, -1], [1, 2]]), [16, 17])
    with pytest.raises(TypeError, match="cache must be a PagedKVCache"):
        fg.cache_decode_attention(q, object(), [0])


def test_valid_arguments_reach_the_gpu_check(no_cupy):
    with pytest.raises(fg.GPUUnavailableError, match="CuPy is not installed"):
        fg.decode_attention(*_qkv(Nq=16), lengths=[0, 100], causal="bottom_right")


def test_choose_num_splits_fills_the_gpu_and_not_more():
    slots = 132 * dec.BLOCKS_PER_SM
    # a batch that fills the GPU already: no split
    assert fg.choose_num_splits(32, 8, 131072, 132) == 1
    # one sequence, 32 K/V heads: split until the blocks fill (almost) every slot once
    S = fg.choose_num_splits(1, 32, 4096, 132)
    assert 32 * S <= slots and 32 * S / slots >= 0.9, S
    # short caches: never more than tiles / MIN_TILES_PER_SPLIT splits
    assert fg.choose_num_splits(1, 1, 64 * 6, 132) == 6 // dec.MIN_TILES_PER_SPLIT
    assert fg.choose_num_splits(1, 1, 0, 132) == 1
    S = fg.choose_num_splits(1, 1, 10**7, 132)  # one head, a huge cache: as many as allowed
    assert 0.95 * dec.MAX_SPLITS <= S <= dec.MAX_SPLITS, S
    with pytest.raises(ValueError, match="sm_count must be >= 1"):
        fg.choose_num_splits(1, 1, 100, 0)


def test_decode_plan_packs_query_heads_into_rows():
    p = fg.decode_plan(8, 32, 8, 1, 4096, 128, 132)  # G * Nq = 4 rows: one 16-row tile
    assert (p.row_tiles, p.row_blocks, p.grid[1:]) == (1, 1, (8, 8))
    p = fg.decode_plan(1, 8, 1, 16, 4096, 64, 132, version=1)  # 128 rows: 2 tiles, 4 blocks
    assert (p.row_tiles, p.row_blocks, p.grid[1]) == (2, 4, 4)
    assert p.smem_bytes == dec.smem_bytes(64, 2, version=1) == 2 * (32 + 6 * 64) * 72
    assert fg.decode_plan(2, 4, 4, 1, 1000, 64, 132, num_splits=7).grid == (7, 4, 2)


def test_bench_decode_table_and_json_keys(tmp_path, capsys):
    """The benchmark's printing and JSON on a made-up result (the chapter reads these keys)."""
    from flashref.bench import decode as bench

    meta = {"gpu": "G", "hbm_read_gbps": 4000.0, "hbm_copy_gbps": 3000.0, "sm_count": 132}
    base = {"dtype": "float16", "d": 128, "B": 1, "Hq": 32, "Hkv": 8, "Nq": 1, "Nk": 4096}
    rows = [
        {
            **base,
            "impl": "flashref",
            "gbps": 3000.0,
            "num_splits": 8,
            "note": None,
            "ratio_to_cudnn": 1.5,
            "fraction_of_read": 0.75,
        },
        {
            **base,
            "impl": "sdpa_cudnn",
            "gbps": 2000.0,
            "num_splits": None,
            "note": None,
            "ratio_to_cudnn": 1.0,
            "fraction_of_read": 0.5,
        },
        {
            **base,
            "impl": "sdpa_math",
            "gbps": None,
            "num_splits": None,
            "note": "refused: X",
            "ratio_to_cudnn": None,
            "fraction_of_read": None,
        },
    ]
    bench.print_table({"meta": meta, "rows": rows})
    out = capsys.readouterr().out
    assert "3000 (1.50, 0.75)" in out and "2000 (1.00, 0.50)" in out
    assert "skipped" in out and "sdpa_math float16 B=1 Hkv=8 Nk=4096: refused: X" in out
    bench.write_json({"meta": meta, "rows": rows}, tmp_path / "d.json")
    assert json.loads((tmp_path / "d.json").read_text())["rows"][0]["num_splits"] == 8


def test_bench_decode_is_a_target():
    from flashref.bench.__main__ import TARGETS

    assert "decode" in TARGETS


@pytest.mark.parametrize(
    "version,error,match",
    [
        (8, ValueError, r"version is 8; the decode kernel versions are \[1, 2, 3, 4, 5, 6, 7\]"),
        (0, ValueError, r"version is 0"),
        ("2", TypeError, r"version must be an int in \[1, 2, 3, 4, 5, 6, 7\], got '2'"),
        (True, TypeError, r"version must be an int"),
        (2.0, TypeError, r"version must be an int"),
    ],
)
def test_decode_version_is_checked_first(version, error, match, no_cupy):
    """A bad version is refused before anything else (here: before a wrong shape is seen)."""
    q, k, v = _qkv()
    with pytest.raises(error, match=match):
        fg.decode_attention(q, k, v[:, :, :3], version=version)
    with pytest.raises(error, match=match):
        fg.paged_decode_attention(*_paged(), np.zeros((2, 1), int), [1, 1], version=version)
    with pytest.raises(error, match=match):
        dec.decode_plan(1, 8, 2, 1, 100, 64, 132, version=version)


def test_every_version_reaches_the_gpu_check(no_cupy):
    for version in dec.VERSIONS:
        with pytest.raises(fg.GPUUnavailableError, match="CuPy is not installed"):
            fg.decode_attention(*_qkv(), version=version)


def test_version_2_plan_and_shared_memory():
    """Version 2: the grid and split rule of version 1, the rings of 16-key sub-tiles."""
    p1 = fg.decode_plan(1, 32, 8, 1, 32768, 128, 132, version=1)
    p2 = fg.decode_plan(1, 32, 8, 1, 32768, 128, 132, version=2)
    assert (p1.version, p2.version) == (1, 2) and p1.grid == p2.grid and p1.threads == p2.threads
    assert p2.smem_bytes == dec.smem_bytes(128, 1, 2) == 2 * (16 + 4 * 3 * 2 * 16) * 136
    assert dec.smem_bytes(64, 2, 2) == 2 * (32 + 4 * 5 * 2 * 16) * 72
    for d in dec.HEAD_DIMS:  # two blocks per SM (the split rule's assumption) at every shape
        for tiles in (1, 2):
            assert dec.smem_bytes(d, tiles, 2) * dec.BLOCKS_PER_SM <= 228 * 1024 - 2 * 1024


def test_each_version_has_its_own_kernels():
    """Every version's file defines the kernels VERSIONS names for it
    (tests/gpu/test_kernels_compile.py finds every name among the compiled kernels), and no
    file holds a later version's code: no version's text names a later version's kernel."""
    for version, ver in dec.VERSIONS.items():
        text = dec.source(version)
        assert f"{ver.split_kernel}(" in text, version
        assert ver.combine_kernel is None or f"{ver.combine_kernel}(" in text, version
        later = [w.split_kernel for n, w in dec.VERSIONS.items() if n > version]
        assert not [k for k in later if k != ver.split_kernel and f"{k}(" in text], version
    assert dec.source(1) != dec.source(2)


def test_bench_decode_rows_per_version():
    from flashref.bench import decode as bench

    assert bench.impl_names(1) == ("flashref", "flashref_paged")
    assert bench.impl_names(2) == ("flashref_v2", "flashref_paged_v2")
    assert bench.impl_names(3) == ("flashref_v3", "flashref_paged_v3")
    assert bench.impl_names(4) == ("flashref_v4", "flashref_paged_v4")
    assert bench.impl_names(5) == ("flashref_v5", "flashref_paged_v5")
    assert bench.impl_names(7) == ("flashref_v7", "flashref_paged_v7")
    with pytest.raises(SystemExit):
        bench.main(["--versions", "8"])


def test_decode_profile_plan_and_kernel_rows():
    """profile --decode: every version at every shape; per kernel its time and top stalls."""
    from flashref.bench.profile import decode as pd

    plan = pd.decode_plan()
    contiguous = [s for s in pd.DECODE_SHAPES if not s[3]]
    assert len(plan) == len(dec.VERSIONS) * len(pd.DECODE_SHAPES) + len(contiguous)
    assert {c["impl"] for c in plan} == {f"decode_v{v}" for v in dec.VERSIONS} | {pd.CUDNN}
    shapes = {(c["B"], c["Hkv"], c["paged"]) for c in plan}
    assert shapes == {(1, 8, False), (8, 32, False), (8, 32, True), (32, 32, False)}
    cudnn = [c for c in plan if c["impl"] == pd.CUDNN]
    assert [(c["B"], c["Hkv"], c["Nk"]) for c in cudnn] == [s[:3] for s in contiguous]
    assert all(c["version"] is None and not c["paged"] for c in cudnn)
    assert [c["version"] for c in pd.decode_plan([2], cudnn=False)] == [2, 2, 2, 2]
    assert [c["version"] for c in pd.decode_plan([2])] == [2, None, 2, None, 2, 2, None]
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
    stalls = (("barrier", 0.5), ("long_scoreboard", 9.0), ("wait", 2.0), ("math", 0.1), ("lg", 1.0))
    kern = {
        "Kernel Name": "decode_split_kv_v2",
        "gpu__time_duration.sum": 30_000.0,
        "dram__bytes_read.sum": 134e6,
        "lts__t_sector_hit_rate.pct": 12.5,
        **{stall.format(n): x for n, x in stalls},
    }
    (row,) = pd.kernel_rows([kern])
    assert row["us"] == 30.0 and row["dram_read_mb"] == 134.0 and row["l2_hit_pct"] == 12.5
    assert list(row["top_stalls"]) == ["long_scoreboard", "wait", "lg", "barrier"]
    assert row["dram_pct"] is None  # a counter ncu did not report stays None, not 0


def test_version_3_is_version_2_with_its_own_combine():
    """Version 3: version 2's split kernel (its text pasted in), plan and shared memory; a
    combine kernel of its own, whose lse registers cover MAX_SPLITS splits."""
    v3 = dec.VERSIONS[3]
    assert (
        v3.split_kernel == dec.VERSIONS[2].split_kernel and v3.combine_kernel == "decode_combine_v3"
    )
    text2, text3 = dec.source(2), dec.source(3)
    assert text2 in text3 and not re.search(r"^#include", text3, re.M)  # nested ones too
    assert text3.count("decode_split_kv_v2(") == 1 and text3.count("decode_combine_v3(") == 1
    assert re.search(r"^#define MAX_S (\d+)", text3, re.M).group(1) == str(dec.MAX_SPLITS)
    for shape in ((1, 32, 8, 1, 32768, 128, 132), (8, 8, 1, 16, 4096, 64, 132)):
        p2, p3 = fg.decode_plan(*shape, version=2), fg.decode_plan(*shape, version=3)
        assert p3.version == 3 and (p2.grid, p2.threads, p2.smem_bytes, p2.num_splits) == (
            p3.grid,
            p3.threads,
            p3.smem_bytes,
            p3.num_splits,
        )


def test_version_3_refuses_more_splits_than_its_combine_holds(no_cupy):
    q, k, v = _qkv()
    match = r"num_splits is 129; decode version 3 merges at most 128 splits"
    with pytest.raises(ValueError, match=match):
        fg.decode_attention(q, k, v, num_splits=129, version=3)
    with pytest.raises(ValueError, match=match):
        fg.paged_decode_attention(
            *_paged(), np.zeros((2, 1), int), [1, 1], num_splits=129, version=3
        )
    with pytest.raises(ValueError, match=match):
        dec.decode_plan(1, 8, 2, 1, 100, 64, 132, num_splits=129, version=3)
    assert dec.decode_plan(1, 8, 2, 1, 100, 64, 132, num_splits=128, version=3).num_splits == 128
    assert dec.decode_plan(1, 8, 2, 1, 100, 64, 132, num_splits=129, version=2).num_splits == 129
    with pytest.raises(fg.GPUUnavailableError):  # 128 passes the check and reaches the GPU's
        fg.decode_attention(q, k, v, num_splits=128, version=3)


def test_default_decode_versions_are_the_best_in_the_recorded_run():
    """HOPPER_DEFAULT_VERSION is the version whose contiguous rows have the highest median
    ratio to SDPA cuDNN's bandwidth replayed from a CUDA graph over the shapes of
    results/gpu_decode.json (ties: the most shapes at 1.0x or more); DEFAULT_VERSION the same
    among the versions that run on any GPU (not sm_90a)."""
    import statistics
    from pathlib import Path

    doc = json.loads(
        (Path(__file__).resolve().parents[2] / "results" / "gpu_decode.json").read_text()
    )
    recorded = sorted(doc["meta"]["decode_versions"])  # a version newer than the run: not yet
    assert set(recorded) <= set(dec.VERSIONS), recorded
    assert {dec.DEFAULT_VERSION, dec.HOPPER_DEFAULT_VERSION} <= set(recorded), recorded
    from flashref.bench.decode import impl_names

    contiguous = {impl_names(v)[0]: v for v in recorded}  # row name -> version
    ratios: dict[int, list[float]] = {v: [] for v in recorded}
    for r in doc["rows"]:
        if r["impl"] in contiguous and r.get("graph_ratio_to_cudnn") is not None:
            ratios[contiguous[r["impl"]]].append(r["graph_ratio_to_cudnn"])
    assert all(len(rs) == len(ratios[dec.DEFAULT_VERSION]) > 0 for rs in ratios.values()), ratios
    score = {v: (statistics.median(rs), sum(x >= 1.0 for x in rs)) for v, rs in ratios.items()}
    assert max(score, key=score.get) == dec.HOPPER_DEFAULT_VERSION, score
    anywhere = {v: sc for v, sc in score.items() if v not in dec.SM90A_VERSIONS}
    assert max(anywhere, key=anywhere.get) == dec.DEFAULT_VERSION, anywhere


def test_default_decode_version_depends_on_the_gpu_and_never_refuses():
    """version=None: the Hopper version on 9.0 where its tile and row rules hold, version 3
    wherever the Hopper version would refuse the call (other GPUs, page sizes, huge pools)."""
    hopper, anywhere = dec.HOPPER_DEFAULT_VERSION, dec.DEFAULT_VERSION
    assert hopper in dec.SM90A_VERSIONS and anywhere not in dec.SM90A_VERSIONS
    assert dec.default_decode_version((9, 0)) == hopper  # a contiguous cache of any Nk
    assert dec.default_decode_version((9, 0), page_size=64) == hopper
    assert dec.default_decode_version((9, 0), page_size=128, rows=2**31 - 1) == hopper
    assert dec.default_decode_version((9, 0), page_size=100) == anywhere
    assert dec.default_decode_version((9, 0), page_size=16) == anywhere
    assert dec.default_decode_version((9, 0), rows=2**31) == anywhere
    for cc in ((8, 0), (8, 9), (10, 0), (12, 0)):
        assert dec.default_decode_version(cc) == anywhere
        assert dec.default_decode_version(cc, page_size=64) == anywhere
    assert dec.check_version(None) is None
    with pytest.raises(ValueError, match="num_splits is 129; the default decode version merges"):
        dec.check_splits(129, None)
    assert dec.check_splits(128, None) == 128


def test_version_5_plan_shared_memory_and_split_rule():
    """Version 5: 160 threads (a producer warp), a ring of STAGES_V5 64-key (K, V) tiles,
    BLOCKS_V5 blocks per SM, and a split rule that fills one block per SM."""
    p4 = fg.decode_plan(1, 32, 8, 1, 32768, 128, 132, version=4)
    p5 = fg.decode_plan(1, 32, 8, 1, 32768, 128, 132, version=5)
    assert p5.threads == 160 and p4.threads == 128 and p5.grid[1:] == p4.grid[1:]
    assert p5.smem_bytes == 1024 + 3 * 2 * 64 * 128 * 2 + 2 * 16 * 136 + 2 * 3 * 8
    assert dec.smem_bytes(64, 2, 5) == 1024 + 6 * 2 * 64 * 64 * 2 + 2 * 32 * 72 + 2 * 6 * 8
    for (d, tiles), blocks in dec.BLOCKS_V5.items():
        assert dec.smem_bytes(d, tiles, 5) * blocks <= 228 * 1024 - blocks * 1024, (d, tiles)
        stages = dec.STAGES_V5[(d, tiles)]  # K/V bytes in flight per SM while computing >= v2's
        v2 = dec.BLOCKS_PER_SM * dec.NWARPS * (dec.STAGES_W[d] - 1) * 2 * dec.BK * d * 2
        assert blocks * (stages - 1) * 2 * dec.BC * d * 2 >= v2, (d, tiles)
    # the split rule fills one block per SM (SPLIT_BLOCKS_V5), whatever fits: more splits
    # than version 4's rule at no shape, fewer wherever one wave of its blocks is short
    for shape in (
        (2, 32, 8, 8, 32768, 128, 132),
        (1, 32, 8, 1, 4096, 128, 132),
        (8, 32, 8, 1, 4096, 64, 132),
        (32, 32, 32, 1, 4096, 128, 132),
    ):
        p5, p4 = fg.decode_plan(*shape, version=5), fg.decode_plan(*shape, version=4)
        assert p5.num_splits == dec.choose_num_splits(
            shape[0],
            shape[2],
            shape[4],
            132,
            row_blocks=p5.row_blocks,
            blocks_per_sm=dec.SPLIT_BLOCKS_V5,
        ), shape
        assert p5.num_splits <= p4.num_splits, shape
    assert dec.SPLIT_BLOCKS_V5 == 1 and dec.split_blocks_per_sm(4, 128, 1) == dec.BLOCKS_PER_SM
    assert [dec.split_blocks_per_sm(v, d, t) for v in (5, 6, 7) for d, t in dec.BLOCKS_V5] == [
        1
    ] * 12
    # B = 1, Hkv = 8: 16 splits give 128 blocks, one per SM of 132 (version 4's rule: 31)
    assert fg.decode_plan(1, 32, 8, 1, 4096, 128, 132, version=6).num_splits == 16
    assert fg.decode_plan(1, 32, 8, 1, 4096, 128, 132, version=4).num_splits == 31


@pytest.mark.parametrize("version", [5, 6])
def test_version_5_refuses_page_sizes_and_other_gpus(version, no_cupy):
    """Versions 5 and 6 read 64-key tiles from one page: other page sizes are refused before
    any work, naming page_size (versions 1 to 4 take them); and they need compute capability
    9.0."""
    q = np.zeros((2, 8, 1, 64), np.float16)
    for ps in (16, 48, 100):
        kp = np.zeros((3, 2, ps, 64), np.float16)
        with pytest.raises(
            ValueError,
            match=rf"page_size is {ps}; decode version {version} "
            r"reads whole 64-key tiles from one page",
        ):
            fg.paged_decode_attention(q, kp, kp, np.zeros((2, 1), int), [1, 1], version=version)
        with pytest.raises(fg.GPUUnavailableError):  # version 4: the same call reaches the GPU
            fg.paged_decode_attention(q, kp, kp, np.zeros((2, 1), int), [1, 1], version=4)
    kp = np.zeros((3, 2, 128, 64), np.float16)
    with pytest.raises(fg.GPUUnavailableError):
        fg.paged_decode_attention(q, kp, kp, np.zeros((2, 1), int), [1, 1], version=version)
    with pytest.raises(fg.GPUUnavailableError):  # any Nk: a contiguous tile is in one sequence
        fg.decode_attention(*_qkv(Nk=100), version=version)
    with pytest.raises(
        RuntimeError,
        match=rf"decode version {version} is built for sm_90a .* compute "
        r"capability 9.0 exactly; this GPU \(X\) has compute capability 8.9",
    ):
        dchk.check_device((8, 9), version, "this GPU (X)")
    with pytest.raises(RuntimeError, match=r"has compute capability 10.0"):
        dchk.check_device((10, 0), version)
    dchk.check_device((9, 0), version)
    dchk.check_device((8, 0), 4)  # the other versions run anywhere
    with pytest.raises(ValueError, match=rf"holds 2147483648 K/V rows; decode version {version}"):
        dchk.check_page_size(64, 2**31, version, "k_pages")


def _code_changes(old: int, new: int) -> tuple[list[str], list[str]]:
    """(lines only the old version's file has, lines only the new one's has), header comments
    left out and lines compared without their indentation, each counted as often as it is
    there."""
    from collections import Counter

    a = Counter(x.strip() for x in dec.VERSIONS[old].code_lines())
    b = Counter(x.strip() for x in dec.VERSIONS[new].code_lines())
    return sorted((a - b).elements()), sorted((b - a).elements())


def test_version_6_is_version_5s_split_kernel_and_version_3s_combine():
    """Version 6: version 5's split kernel written out whole under its own name, less the
    counters and the last-block merge (the only lines that differ from version 5's file),
    version 3's combine kernel through split_merge.cuh (included, not copied, as version 3's
    file includes it), and version 5's plan: threads, grid, shared memory, split rule."""
    v6 = dec.VERSIONS[6]
    assert (v6.file, v6.split_kernel, v6.combine_kernel) == (
        "v06_tma_two_launches.cu",
        "decode_split_kv_v6",
        dec.VERSIONS[3].combine_kernel,
    )
    only5, only6 = _code_changes(5, 6)
    assert only6 == ["decode_split_kv_v6(const half_t* __restrict__ Q,   // (B, Hq, Nq, D)"]
    assert [line.split("(")[0].split("*")[0] for line in only5] == [
        "decode_split_kv_v5",
        "merge_if_last_split",
        "unsigned",
    ]
    merge = paste_includes(KERNEL_DIR / "decode" / "split_merge.cuh")
    text6 = dec.source(6)
    assert merge in dec.source(3) and merge in text6 and "V5_" not in text6  # no later switches
    assert text6.count("decode_combine_v3(") == 1 and not re.search(r"^#include", text6, re.M)
    for n in (5, 6, 7):  # the TMA versions paste in the shared pieces, not versions 2-4's kernels
        text = dec.source(n)
        assert "merge_warps_v2(" in text and "decode_split_kv_v2(" not in text, n
        assert "decode_split_kv_v4(" not in text and "decode_combine_v2(" not in text, n
    assert 6 in dec.SM90A_VERSIONS and 6 in dec.MERGE_IN_REGISTERS
    assert dec.threads(6) == dec.threads(5) == 160
    for d, tiles in dec.BLOCKS_V5:
        assert dec.smem_bytes(d, tiles, 6) == dec.smem_bytes(d, tiles, 5), (d, tiles)
        assert dec.blocks_per_sm(6, d, tiles) == dec.blocks_per_sm(5, d, tiles), (d, tiles)
    for shape in (
        (1, 32, 8, 1, 32768, 128, 132),
        (8, 8, 1, 16, 4096, 64, 132),
        (2, 32, 8, 8, 32768, 128, 132),
        (32, 32, 32, 1, 4096, 128, 132),
    ):
        p5, p6 = fg.decode_plan(*shape, version=5), fg.decode_plan(*shape, version=6)
        assert p6.version == 6 and (p5.grid, p5.threads, p5.smem_bytes, p5.num_splits) == (
            p6.grid,
            p6.threads,
            p6.smem_bytes,
            p6.num_splits,
        ), shape
    with pytest.raises(ValueError, match="num_splits is 129; decode version 6 merges at most 128"):
        dec.decode_plan(1, 8, 2, 1, 100, 64, 132, num_splits=129, version=6)


def test_decode_plan_is_kept_per_shape_and_still_checks_every_argument():
    """A repeated shape returns the kept plan (the split search is not redone per call); a bool
    or a NumPy integer is a different key, so the checks still see it."""
    from flashref.gpu.decode import api

    api._kept_plan.cache_clear()
    p = dec.decode_plan(1, 32, 8, 1, 32768, 128, 132)
    assert dec.decode_plan(1, 32, 8, 1, 32768, 128, 132) is p
    assert api._kept_plan.cache_info().hits == 1
    assert p.num_splits == dec.choose_num_splits(1, 8, 32768, 132)
    with pytest.raises(TypeError, match="B must be an int, got bool"):
        dec.decode_plan(True, 32, 8, 1, 32768, 128, 132)
    assert dec.decode_plan(np.int64(1), 32, 8, 1, 32768, 128, 132) == p  # checked, then equal


@pytest.mark.parametrize(
    "change, error, match",
    [
        ({"num_splits": 0}, ValueError, "num_splits must be >= 1, got 0"),
        ({"num_splits": -3}, ValueError, "num_splits must be >= 1, got -3"),
        ({"num_splits": 2.5}, TypeError, "num_splits must be an int, got float"),
        ({"num_splits": True}, TypeError, "num_splits must be an int, got bool"),
        ({"d": 7}, ValueError, r"d is 7; the decode kernel supports d in \(64, 128\)"),
        ({"d": 96}, ValueError, r"d is 96; the decode kernel supports d in \(64, 128\)"),
        ({"d": 64.0}, TypeError, "d must be an int, got float"),
        ({"Nq": 17}, ValueError, "Nq is 17; the decode kernel takes 1 <= Nq <= 16 queries"),
        ({"Nq": 0}, ValueError, "Nq must be >= 1, got 0"),
        ({"B": True}, TypeError, "B must be an int, got bool"),
        ({"Nk": -1}, ValueError, "Nk must be >= 0, got -1"),
        ({"sm_count": 0}, ValueError, "sm_count must be >= 1, got 0"),
        ({"Hkv": 3}, ValueError, "Hkv"),
    ],
    ids=lambda x: str(x) if isinstance(x, dict) else "",
)
def test_decode_plan_checks_its_arguments_as_the_entry_points_do(change, error, match):
    """decode_plan is public: a bad argument is an error naming it, never an empty grid or a
    bare KeyError."""
    args = {"B": 2, "Hq": 8, "Hkv": 2, "Nq": 1, "Nk": 100, "d": 64, "sm_count": 132}
    num_splits = change.pop("num_splits", None)
    with pytest.raises(error, match=match):
        fg.decode_plan(**{**args, **change}, num_splits=num_splits)


@pytest.mark.parametrize("name", ["block_table", "lengths"])
def test_a_ragged_list_is_an_error_naming_the_argument(name, no_cupy):
    q = np.zeros((2, 8, 1, 64), np.float16)
    pages = np.zeros((4, 2, 64, 64), np.float16)
    table, lengths = [[0, 1], [2, 3]], [100, 64]
    if name == "block_table":
        table = [[0, 1], [2]]
    else:
        lengths = [[100], 64]
    with pytest.raises(ValueError, match=f"{name} must be a rectangular array of integers"):
        fg.paged_decode_attention(q, pages, pages, table, lengths)


def test_prefill_splits_fill_the_sms_once_and_keep_two_key_tiles_each(no_cupy):
    from flashref.gpu.decode import prefill as pf

    # 512 queries x 16 heads: 64 work tiles for 132 SMs -> 2 splits (128 tiles, one wave)
    assert pf.default_splits(4 * 16, 32, 132) == 2
    assert pf.default_splits(4 * 32, 32, 132) == 1  # 128 tiles fill the SMs already
    assert pf.default_splits(16, 32, 132) == 8
    assert pf.default_splits(16, 5, 132) == 2  # at least two key tiles per split
    assert pf.default_splits(1, 10**6, 132) == pf.MAX_SPLITS
    assert pf.default_splits(0, 0, 132) == 1
    q = np.zeros((1, 2, 10, 64), np.float16)
    kp = np.zeros((4, 2, 64, 64), np.float16)
    for splits, error, match in (
        (0, ValueError, r"splits=0; it must be in 1 \.\. 16"),
        (True, TypeError, "splits must be an int or None, got bool"),
    ):
        with pytest.raises(error, match=match):  # before any work, without a GPU
            pf.paged_prefill_attention(q, kp, kp, [[0, 1]], [10], splits=splits)
    with pytest.raises(fg.GPUUnavailableError, match="CuPy is not installed"):
        pf.paged_prefill_attention(q, kp, kp, [[0, 1]], [10], splits=3)


@pytest.mark.parametrize("bad", [[1], np.array([1]), {1}])
@pytest.mark.parametrize("where", range(7))
def test_decode_plan_names_an_unhashable_argument(bad, where):
    """A list, an array or a set where a count goes is an error naming the argument (the
    plans are kept per argument tuple: an unhashable one is checked, not looked up)."""
    names = ("B", "Hq", "Hkv", "Nq", "Nk", "d", "sm_count")
    args = [1, 4, 4, 1, 256, 64, 132]
    args[where] = bad
    with pytest.raises(
        TypeError, match=f"^{names[where]} must be an int, got {type(bad).__name__}"
    ):
        dec.decode_plan(*args)
