"""The CPU benchmark's code path, run on tiny sizes: it works and prints its table.

Not a timed test: the numbers it prints are not checked, only that they are there
(and that tiled and naive agree, which the benchmark reports beside its timings).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from flashref import tiled_attention
from flashref.bench import cpu
from flashref.bench.__main__ import main as bench_main


def test_cpu_bench_prints_table_and_progress(capsys):
    argv = ["--sizes", "64,96", "--repeats", "2", "--big", "200", "--sweep-n", "128"]
    assert cpu.main(argv) == 0
    out, err = capsys.readouterr()
    print(out)
    assert "numpy" in out and "BLAS" in out and "CPUs" in out
    assert "block_q = Br = 256, block_k = Bc = 512" in out
    assert re.search(r"\[1/\d+\] per-tile overhead", err)
    total = int(re.search(r"\[1/(\d+)\]", err).group(1))
    assert f"[{total}/{total}] peak memory tiled N=200" in err
    assert len(re.findall(r"^ +\d+ x \d+ +\d+ +\d+ +[\d.]+", out, flags=re.M)) == len(
        cpu.SWEEP_BLOCKS
    )
    table = out.split("-" * 20, 1)[1]  # the main table, below its header rule
    for N in (64, 96):
        row = re.search(rf"^ +{N} (.*)$", table, flags=re.M)
        assert row, f"no row for N={N}"
        cells = row.group(1).split()
        modes = cpu.timing_modes([1, 2], cpu.parse_args([]).workers)[0]
        # per timing mode 2 times and a ratio; then 2 peaks, ratio, runs, rel diff
        assert len(cells) == 3 * len(modes) + 5, cells
        # float32 tiled vs naive: both accumulate in float32 over <= 96 keys, so they agree
        # to a few units of roundoff (1.2e-7); 1e-5 catches any real disagreement.
        assert float(cells[-1]) < 1e-5
    assert re.search(r"^ +200 +- +[\d.]+ ", table, flags=re.M)
    assert "200^2 x 4 B" in out


def test_cpu_bench_is_reachable_from_the_dispatcher(capsys):
    with pytest.raises(SystemExit) as info:
        bench_main(["cpu", "--help"])
    assert info.value.code == 0
    assert "--block-q" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--sizes", "abc"], ["--sizes", "0"], ["--repeats", "0"]])
def test_cpu_bench_rejects_bad_options(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cpu.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert argv[0] in err and "usage:" in err


@pytest.mark.parametrize("workers", [2, 3])
def test_tiled_parallel_is_bitwise_tiled_attention(workers):
    # Splitting the query tiles among threads changes who computes a tile, not how:
    # every output row must carry exactly the bits tiled_attention gives it.
    q, k, v = cpu.one_head(333, seed=3)
    expected = tiled_attention(q, k, v, block_q=64, block_k=48)
    got = cpu.tiled_parallel(q, k, v, 64, 48, workers)
    assert np.array_equal(got, expected)
