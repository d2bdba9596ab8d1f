"""GPU time of one decode call for each split count, replayed from a CUDA graph, beside cuDNN.

    python -m flashref.bench decode_split_sweep [--versions 4 5 6] [--dtype float16] [--d 128]
                                       [--out PATH]

For the shapes where the split count matters (few sequences or short caches; Hq = 32, Nq = 1,
``--d`` 128 or 64), each version runs with the split count ``choose_num_splits`` picks and
with others around it, each timed as ``flashref.bench decode`` times its graph rows
(``flashref.bench.timing.graph_time``: inputs rotated out of the L2, calls captured in one graph,
the median of replays), interleaved over rounds; SDPA cuDNN is timed the same way in the same
run. Prints microseconds per call and writes the rows (with provenance) to ``--out``.
"""

from __future__ import annotations

import functools
import statistics
import sys
from pathlib import Path

from flashref.bench.decode import decode_inputs, run_meta, sdpa_decode
from flashref.bench.roofs import device_facts
from flashref.bench.timing.graph_time import CapturedCalls, graph_calls, input_sets
from flashref.gpu.decode import (
    MAX_SPLITS,
    MIN_TILES_PER_SPLIT,
    TILE_KEYS,
    decode_attention,
    decode_plan,
)

from ._common import write_result
from .cli import ArgumentParser, at_least

SHAPES = (
    (1, 8, 4096),
    (1, 32, 4096),
    (8, 8, 4096),
    (32, 32, 4096),
    (1, 8, 32768),
    (8, 8, 32768),
    (1, 8, 131072),
)  # (B, Hkv, Nk)
HQ = 32
REPLAYS = 5


PROG = "python -m flashref.bench decode_split_sweep"


def candidates(auto: int, top: int) -> list[int]:
    """Split counts to try: the chosen one and some around it, within 1..top."""
    near = {
        auto,
        auto // 2,
        (3 * auto) // 4,
        auto + 1,
        auto - 1,
        (5 * auto) // 4,
        2 * auto,
        1,
        2,
        4,
        8,
        16,
        32,
        64,
    }
    return sorted(s for s in near if 1 <= s <= top)


def main(argv=None) -> int:
    parser = ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, nargs="+", default=[4, 5, 6])
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--d", type=int, default=128, choices=(64, 128))
    parser.add_argument("--rounds", type=at_least(1), default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    import cupy as cp
    import torch

    if args.dtype == "bfloat16":
        import ml_dtypes  # noqa: F401  (the NumPy name CuPy needs)

    facts = device_facts(cp)
    meta = run_meta(cp, torch, facts, None, None, args.versions)
    for k in ("hbm_read_gbps", "hbm_copy_gbps", "gbps_rule", "host_rule", "kernel_rule"):
        meta.pop(k)
    meta["timing"] = (
        f"flashref.bench.timing.graph_time: median of {REPLAYS} replays per round, "
        f"median over {args.rounds} interleaved rounds; us per call"
    )
    meta["dtype"], D = args.dtype, args.d
    rows = []
    for B, Hkv, Nk in SHAPES:
        kv_bytes = 2 * B * Hkv * Nk * D * 2
        n_sets = input_sets(kv_bytes, facts["l2_bytes"])
        n_calls = graph_calls(kv_bytes, n_sets)
        sets = [decode_inputs(cp, B, Hkv, Nk, args.dtype, seed=i, d=D) for i in range(n_sets)]
        top = min(MAX_SPLITS, max(1, (-(-Nk // TILE_KEYS)) // MIN_TILES_PER_SPLIT))
        graphs = {}
        for version in args.versions:
            auto = decode_plan(B, HQ, Hkv, 1, Nk, D, facts["sm_count"], None, version).num_splits
            for S in candidates(auto, top):

                def make(q, k, v, S=S, version=version):
                    return lambda: decode_attention(
                        q, k, v, num_splits=S, version=version, return_lse=True
                    )

                calls = [make(*sets[i % n_sets]) for i in range(n_calls)]
                graphs[version, S, S == auto] = CapturedCalls(torch, cp, calls)

        how = "enable_gqa" if Hkv != HQ else "plain"
        cudnn = functools.partial(sdpa_decode, backend="CUDNN_ATTENTION", how=how)
        graphs["cudnn", None, None] = CapturedCalls(
            torch, cp, [cudnn(*sets[i % n_sets]) for i in range(n_calls)]
        )
        times = {key: [] for key in graphs}
        for _ in range(args.rounds):
            for key, g in graphs.items():
                times[key].append(g.replay_us(REPLAYS))
        base = statistics.median(times["cudnn", None, None])
        for (version, S, chosen), ts in times.items():
            us = statistics.median(ts)
            rows.append(
                {
                    "B": B,
                    "Hq": HQ,
                    "Hkv": Hkv,
                    "Nq": 1,
                    "Nk": Nk,
                    "d": D,
                    "impl": "sdpa_cudnn" if version == "cudnn" else f"v{version}",
                    "num_splits": S,
                    "chosen": chosen,
                    "us": us,
                    "us_min": min(ts),
                    "us_max": max(ts),
                    "ratio_to_cudnn": base / us,
                    "graph_calls": n_calls,
                    "graph_sets": n_sets,
                }
            )
            mark = "*" if chosen else " "
            print(
                f"B={B:2d} Hkv={Hkv:2d} Nk={Nk:6d} {rows[-1]['impl']:>10s} S={S!s:>4s}{mark} "
                f"{us:9.2f} us [{min(ts):.2f}, {max(ts):.2f}]  x{base / us:.3f} cuDNN"
            )
        del graphs, sets
        cp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_result({"meta": meta, "rows": rows}, args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0
