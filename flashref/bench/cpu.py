"""Naive vs tiled NumPy attention on the CPU: time and peak memory.

``python -m flashref.bench cpu [--sizes 1024,2048,4096,8192] [--repeats 7]
[--block-q 256] [--block-k 512] [--big 65536] [--sweep-n 4096]``

One head, d = 64, float32. For each N (Nq = Nk = N): the median time of
several calls after a warm-up call (naive and tiled calls alternate, so both
see the same machine load), and the peak memory of one more call of each,
traced by ``tracemalloc`` in a separate call because tracing slows NumPy down.
Then tiled attention alone at a large N, where the naive score matrix would
not fit. Progress goes to stderr, the results to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import platform
import statistics
import sys
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from flashref.attention import naive_attention, tiled_attention

from .cli import ArgumentParser, at_least

D = 64
DTYPE = np.float32
SWEEP_BLOCKS = [(64, 64), (128, 128), (256, 256), (256, 512), (512, 512), (512, 1024)]


PROG = "python -m flashref.bench cpu"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ArgumentParser(
        prog=PROG,
        description="Naive vs tiled NumPy attention (one head, d=64, float32): time, memory.",
    )
    p.add_argument("--sizes", default="1024,2048,4096,8192", help="comma-separated N values")
    p.add_argument(
        "--repeats", type=at_least(1), default=7, help="timed runs per N up to 4096 (fewer above)"
    )
    p.add_argument("--block-q", type=at_least(1), default=256, help="Br for tiled_attention")
    p.add_argument("--block-k", type=at_least(1), default=512, help="Bc for tiled_attention")
    p.add_argument(
        "--big", type=at_least(0), default=65536, help="N for the tiled-only row (0: skip)"
    )
    p.add_argument(
        "--sweep-n", type=at_least(0), default=4096, help="N for the block sweep (0: skip)"
    )
    p.add_argument(
        "--blas-threads",
        default="1,2",
        help="comma-separated BLAS thread counts; the timings are measured under each, both"
        " versions alike (default 1,2: one core each, then OpenBLAS's two threads)",
    )
    p.add_argument(
        "--workers",
        type=at_least(0),
        default=min(2, os.cpu_count() or 1),
        help="also time tiled attention with its query tiles split over this many threads"
        " (one BLAS thread each) against naive on as many BLAS threads (below 2: skip)",
    )
    args = p.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        p.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if not args.sizes or min(args.sizes) < 1 or args.repeats < 1:
        p.error("--sizes must be positive integers and --repeats at least 1")
    try:
        args.blas_threads = [int(s) for s in args.blas_threads.split(",") if s.strip()]
    except ValueError:
        p.error(f"--blas-threads must be comma-separated integers, got {args.blas_threads!r}")
    if not args.blas_threads or min(args.blas_threads) < 1:
        p.error("--blas-threads must be positive integers")
    return args


@contextlib.contextmanager
def blas_limit(threads: int | None):
    """Run the block with the BLAS limited to ``threads`` threads (None: as configured)."""
    if threads is None:
        yield
        return
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=threads, user_api="blas"):
        yield


@dataclass(frozen=True)
class Mode:
    """One way to use the cores while timing: BLAS threads for each version, query-tile workers."""

    label: str
    naive_blas: int | None  # None: the BLAS as configured
    tiled_blas: int | None
    workers: int = 1  # threads each taking a share of the query tiles


def timing_modes(blas_threads: list[int], workers: int) -> tuple[list[Mode], str | None]:
    """The modes to time under; without threadpoolctl only the BLAS as configured."""
    try:
        import threadpoolctl  # noqa: F401
    except ImportError:
        note = "threadpoolctl is not installed: timings use the BLAS as configured"
        return [Mode("BLAS as configured", None, None)], note
    modes = [Mode(f"{n} BLAS thread{'s' * (n > 1)}", n, n) for n in blas_threads]
    if workers >= 2:
        modes.append(Mode(f"{workers} query-tile threads", workers, 1, workers))
    return modes, None


def tiled_parallel(q, k, v, Br: int, Bc: int, workers: int) -> np.ndarray:
    """``tiled_attention`` with its query tiles shared among ``workers`` threads.

    FlashAttention-2's outer loop runs over query tiles that share nothing, so
    they can run at the same time (on a GPU, one thread block each). Here each
    thread takes a contiguous run of whole query tiles; NumPy releases the GIL
    inside its kernels, so the threads really run in parallel. The result is
    bit for bit that of ``tiled_attention``: the same tiles, in the same order.
    """
    tiles = -(-q.shape[-2] // Br)
    bounds = [min(Br * (tiles * i // workers), q.shape[-2]) for i in range(workers + 1)]

    def rows(a: int, b: int) -> np.ndarray:
        return tiled_attention(q[..., a:b, :], k, v, block_q=Br, block_k=Bc)

    with ThreadPoolExecutor(workers) as pool:
        return np.concatenate(list(pool.map(rows, bounds[:-1], bounds[1:])), axis=-2)


def repeats_for(N: int, repeats: int) -> int:
    """All the runs up to N = 4096; fewer above (each call costs ~N^2), never below 3."""
    return repeats if N <= 4096 else max(min(3, repeats), round(repeats * 4096 / N))


def one_head(N: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((N, D), dtype=DTYPE) for _ in range(3))  # (N, d) each


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def peak_bytes(fn) -> int:
    """Peak memory NumPy allocated during one call of ``fn`` (inputs already exist)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def machine() -> list[str]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    blas = "unknown"
    try:
        info = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        blas = f"{info['name']} {info.get('version', '')}".strip()
    except Exception:  # older NumPy, or a build that does not report it
        pass
    try:
        ram = f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.1f} GiB RAM"
    except (ValueError, OSError, AttributeError):
        ram = "RAM unknown"
    caches = []
    for index in range(8):
        base = f"/sys/devices/system/cpu/cpu0/cache/index{index}"
        try:
            with open(f"{base}/level") as f, open(f"{base}/type") as g, open(f"{base}/size") as h:
                level, kind, size = f.read().strip(), g.read().strip(), h.read().strip()
        except OSError:
            break
        if kind != "Instruction":
            caches.append(f"L{level} {size}")
    return [
        f"machine: {cpu}, {os.cpu_count()} CPUs, {ram}"
        + (f", caches per core {', '.join(caches)}" if caches else ""),
        f"python {platform.python_version()}, numpy {np.__version__}, BLAS {blas}, "
        f"BLAS threads: {blas_threads()}",
    ]


def blas_threads() -> str:
    """The thread setting the BLAS was started with, as far as the environment says."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(var):
            return f"{var}={os.environ[var]}"
    return f"not set (OpenBLAS then uses up to {os.cpu_count()})"


def load_note() -> str | None:
    """A warning when other processes compete for the cores (1-minute load average)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    if load < 0.5 * (os.cpu_count() or 1):
        return None
    return (
        f"note: load average {load:.1f} on {os.cpu_count()} CPUs at the start: other work"
        " competes for the cores,\n  so times will be noisy, multithreaded BLAS most of all."
    )


def fmt_mib(n: float) -> str:
    return f"{n / 2**20:.1f}" if n >= 10 * 2**20 else f"{n / 2**20:.2f}"


def fmt_bytes(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


class Progress:
    def __init__(self, total: int):
        self.total, self.step = total, 0

    def __call__(self, what: str) -> None:
        self.step += 1
        print(f"[{self.step}/{self.total}] {what} ...", file=sys.stderr, flush=True)


def per_tile_overhead() -> float:
    """Seconds of fixed cost per tile: 256 tiny (16 x 16) tiles, where arithmetic is nil."""
    q, k, v = one_head(256, seed=1)
    tiled_attention(q, k, v, block_q=16, block_k=16)  # warm-up
    times = [timed(lambda: tiled_attention(q, k, v, block_q=16, block_k=16))[0] for _ in range(5)]
    return statistics.median(times) / 256


def sweep(N: int, chosen: tuple[int, int], progress: Progress) -> list[str]:
    """Time tiled_attention at one N for a few block shapes (3 runs each, median)."""
    q, k, v = one_head(N)
    lines = [f"block sweep at N = {N} (tiled only, median of 3 runs after a warm-up):"]
    lines.append(f"  {'Br x Bc':>11} {'tiles':>7} {'S tile KiB':>11} {'ms':>8}")
    for Br, Bc in SWEEP_BLOCKS:
        progress(f"sweep Br={Br} Bc={Bc} N={N}")
        fn = functools.partial(tiled_attention, q, k, v, block_q=Br, block_k=Bc)
        fn()
        ms = statistics.median(timed(fn)[0] for _ in range(3)) * 1e3
        tiles = -(-N // Br) * -(-N // Bc)
        mark = "  <- used below" if (Br, Bc) == chosen else ""
        lines.append(
            f"  {f'{Br} x {Bc}':>11} {tiles:>7} {Br * Bc * 4 / 1024:>11.0f} {ms:>8.1f}{mark}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    Br, Bc = args.block_q, args.block_k
    sweep_steps = len(SWEEP_BLOCKS) if args.sweep_n else 0
    modes, why_not = timing_modes(args.blas_threads, args.workers)
    progress = Progress(
        1 + sweep_steps + (2 + len(modes)) * len(args.sizes) + (2 if args.big else 0)
    )

    for line in machine():
        print(line)
    note = load_note()
    if note:
        print(note)
    print(f"problem: one head, d = {D}, {np.dtype(DTYPE).name}, Nq = Nk = N, no mask")

    progress("per-tile overhead")
    overhead = per_tile_overhead()
    print(f"blocks used: block_q = Br = {Br}, block_k = Bc = {Bc} (--block-q, --block-k). Why:")
    print(
        f"  every tile pays a fixed ~{overhead * 1e6:.0f} us of Python and NumPy call overhead"
        " (measured on 16 x 16 tiles),\n"
        "  so tiles must be big enough for it to vanish beside their arithmetic; yet one S\n"
        f"  tile is Br*Bc*4 = {Br * Bc * 4 // 1024} KiB, and its few tile-sized temporaries"
        " (S, S - m, P)\n"
        "  should stay in cache, or tiling loses its point. The library's default 64 x 64 is\n"
        "  sized for reading the code, not for NumPy speed; the sweep shows the trade-off."
    )
    first = modes[0]  # the sweep and the large-N row run under the first mode
    if args.sweep_n:
        with blas_limit(first.tiled_blas):
            lines = sweep(args.sweep_n, (Br, Bc), progress)
        lines[0] = lines[0].replace(":", f", {first.label}:", 1)
        for line in lines:
            print(line)

    if why_not:
        print(f"note: {why_not}")
    time_cols = "".join(f" {'naive ms':>9} {'tiled ms':>9} {'tiled/naive':>11}" for _ in modes)
    header = (
        f"{'N':>6}{time_cols} {'naive MiB':>10} {'tiled MiB':>10} {'naive/tiled':>12}"
        f" {'runs':>5} {'rel diff':>9}"
    )
    groups = "".join(f" {'-- ' + m.label + ' ':-<31}" for m in modes)
    print("\n" + f"{'':>6}{groups}")
    print(header)
    print("-" * len(header))
    ratios = {m: {} for m in modes}  # tiled/naive per mode and N, for the verdict
    bytes_per_score = None  # naive's measured peak / N^2 at the largest N measured
    for N in args.sizes:
        q, k, v = one_head(N)
        naive = functools.partial(naive_attention, q, k, v)
        tiled = functools.partial(tiled_attention, q, k, v, block_q=Br, block_k=Bc)
        runs = repeats_for(N, args.repeats)
        O_naive, O_tiled = naive(), tiled()  # warm-up; kept to check agreement
        rel_diff = float(np.abs(O_tiled - O_naive).max() / np.abs(O_naive).max())
        cells = ""
        for m in modes:
            progress(f"time naive and tiled N={N}, {m.label} ({runs} runs each, alternating)")
            tiled_m = tiled
            if m.workers > 1:
                tiled_m = functools.partial(tiled_parallel, q, k, v, Br, Bc, m.workers)
                if not np.array_equal(tiled_m(), O_tiled):  # the same tiles: the same bits
                    raise RuntimeError("tiled_parallel differs from tiled_attention")
            t_naive, t_tiled = [], []
            for _ in range(runs + 1):  # the first round warms up this mode
                with blas_limit(m.naive_blas):
                    t_naive.append(timed(naive)[0])
                with blas_limit(m.tiled_blas):
                    t_tiled.append(timed(tiled_m)[0])
            tn, tt = statistics.median(t_naive[1:]), statistics.median(t_tiled[1:])
            ratios[m][N] = tt / tn
            cells += f" {tn * 1e3:>9.1f} {tt * 1e3:>9.1f} {tt / tn:>11.2f}"
        progress(f"peak memory naive N={N}")
        mn = peak_bytes(naive)
        progress(f"peak memory tiled N={N}")
        mt = peak_bytes(tiled)
        bytes_per_score = mn / N**2
        mem_ratio = f"{mn / mt:.0f}x" if mn >= 10 * mt else f"{mn / mt:.1f}x"
        print(
            f"{N:>6}{cells} {fmt_mib(mn):>10} {fmt_mib(mt):>10} {mem_ratio:>12}"
            f" {runs:>5} {rel_diff:>9.1e}"
        )
        del q, k, v, O_naive, O_tiled
    if args.big:
        N = args.big
        q, k, v = one_head(N)
        progress(f"time tiled N={N}, {first.label} (1 run; the code path is warm)")
        with blas_limit(first.tiled_blas):
            t_big, _ = timed(lambda: tiled_attention(q, k, v, block_q=Br, block_k=Bc))
        progress(f"peak memory tiled N={N}")
        m_big = peak_bytes(lambda: tiled_attention(q, k, v, block_q=Br, block_k=Bc))
        cells = f" {'-':>9} {t_big * 1e3:>9.1f} {'-':>11}" + f" {'-':>9} {'-':>9} {'-':>11}" * (
            len(modes) - 1
        )
        print(f"{N:>6}{cells} {'-':>10} {fmt_mib(m_big):>10} {'-':>12} {1:>5} {'-':>9}")
        s_bytes = N * N * np.dtype(DTYPE).itemsize
        print(
            f"\nN = {N:,}: tiled attention took {t_big:.1f} s ({first.label}) and peaked"
            f" at {fmt_bytes(m_big)}."
        )
        print(f"The naive score matrix S alone would need {N:,}^2 x 4 B = {fmt_bytes(s_bytes)}.")
        if bytes_per_score is not None:
            b = bytes_per_score
            print(
                f"Naive's measured peak at N = {args.sizes[-1]:,} is {b:.1f} B per score (about"
                f" {b / 4:.1f} float32\narrays of N x N alive at once): at N = {N:,} that"
                f" suggests ~{fmt_bytes(b * N * N)} for the naive version."
            )

    print()
    for m in modes:
        big = {N: r for N, r in ratios[m].items() if N >= 4096}
        if big:
            worst = max(big.values())
            verdict = "tiled no slower than naive" if worst <= 1.0 else "tiled SLOWER than naive"
            shown = ", ".join(f"{r:.2f} at N = {N}" for N, r in big.items())
            print(f"{m.label}: tiled/naive {shown}: {verdict}")

    try:
        print(f"\nload average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    except OSError:
        pass
    print(
        "Times: median of the runs shown, after one warm-up round, in each mode; naive and"
        " tiled calls\nalternate. 'n BLAS threads': both versions with the BLAS limited to n"
        " threads\n(threadpoolctl). 'n query-tile threads': naive on n BLAS threads against"
        " tiled with\nits query tiles split over n threads of one BLAS thread each"
        " (FlashAttention-2's parallelism).\n"
        "Memory: tracemalloc peak during one separate call (NumPy's arrays; BLAS's small\n"
        "internal buffers are not traced). rel diff: max|tiled - naive| / max|naive|, from"
        " the warm-up calls."
    )
    return 0
