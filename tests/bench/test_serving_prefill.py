"""The serving benchmark's host mirror of the prefill kernel's split rule (no GPU needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashref.bench.serving import PREFILL_CHUNK, PREFILL_N, _longest_tiles
from flashref.gpu.decode.prefill import BC, BR, default_splits

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_longest_work_tile_follows_the_split_rule():
    # the first chunk of 512 at 16 heads: query blocks of 1, 2, 3, 4 key tiles; two splits
    # only where a split keeps two tiles (the last block), so the longest is the third, 3
    assert default_splits(4 * 16, PREFILL_N // BC, 132) == 2
    assert _longest_tiles(512, 512, 16, None, PREFILL_N, 132) == 3
    assert _longest_tiles(4096, 512, 16, None, PREFILL_N, 132) == 16  # 32 tiles in two
    assert _longest_tiles(4096, 512, 16, 1, PREFILL_N, 132) == 32  # unsplit
    assert _longest_tiles(4096, 512, 32, None, PREFILL_N, 132) == 32  # 128 tiles: no split
    assert _longest_tiles(4096, 512, 16, 3, PREFILL_N, 132) == 11  # ceil(32 / 3)


def test_recorded_prefill_rows_match_the_rule():
    data = json.loads((RESULTS / "gpu_serving.json").read_text())
    sms = data["meta"]["sm_count"]
    for r in data["prefill"]:
        H, chunk, N = r["H"], r["chunk"], r["N"]
        assert r["splits"] == default_splits(-(-chunk // BR) * H, -(-N // BC), sms)
        starts = range(0, N, chunk)
        for name, splits in (("default", None), ("one_split", 1)):
            want = [_longest_tiles(c + chunk, chunk, H, splits, N, sms) for c in starts]
            assert r["chunk_longest_tiles"][name] == want
            assert len(r["chunk_kernel_us"][name]) == len(want)
        assert r["chunk"] == PREFILL_CHUNK and r["N"] == PREFILL_N


@pytest.mark.parametrize("splits", [-1, 17])
def test_split_counts_out_of_range_are_refused(splits, no_cupy):
    import numpy as np

    from flashref.gpu.decode.prefill import paged_prefill_attention

    q = np.zeros((1, 2, 10, 64), np.float16)
    kp = np.zeros((4, 2, 64, 64), np.float16)
    with pytest.raises(ValueError, match=f"splits={splits}; it must be in 1 .. 16"):
        paged_prefill_attention(q, kp, kp, [[0, 1]], [10], splits=splits)
