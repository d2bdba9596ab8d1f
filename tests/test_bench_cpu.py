"""The CPU benchmark's code path, run on tiny sizes: it works and prints its table.

Not a timed test: the numbers it prints are not checked, only that they are there
(and that tiled and naive agree, which the benchmark reports beside its timings).
"""

from __future__ import annotations

import re

import pytest

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
        settings = cpu.thread_settings([1, 2])[0]
        # per BLAS setting 2 times and a ratio; then 2 peaks, ratio, runs, rel diff
        assert len(cells) == 3 * len(settings) + 5, cells
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
