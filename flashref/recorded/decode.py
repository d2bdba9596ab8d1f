"""What chapter 10 prints from the recorded decode and serving runs.

``results/gpu_decode.json`` (``python -m flashref.bench decode``): every decode version and
SDPA's backends at each shape, timed as calls and replayed from CUDA graphs.
``results/gpu_serving.json`` (``python -m flashref.bench serving``): the paged cache on the
GPU as a decode loop replays it (paged decode beside cuDNN's contiguous decode, the append
kernel beside ``copy_``, the chapter 8 model generating). :class:`DecodeRun` indexes the
first; each function below returns the lines of one table, so that a chapter's cell is one
call. The appendix "Timing a decode step" reads the same run through
``flashref.recorded.decode_timing``. NumPy-free; the standard library only (and matplotlib
inside :func:`draw_replayed`).
"""

from __future__ import annotations

import json
import statistics
import textwrap
from pathlib import Path

__all__ = [
    "DecodeRun",
    "shape_of",
    "shape_text",
    "short_dtype",
    "provenance_lines",
    "replayed_lines",
    "draw_replayed",
    "version_lines",
    "serving_provenance_lines",
    "paged_decode_lines",
    "append_lines",
    "generation_lines",
]

CUDNN = "sdpa_cudnn"
IMPLS = {"sdpa_cudnn": "cuDNN", "sdpa_flash": "FLASH", "sdpa_math": "MATH"}


def impl_names(version: int) -> tuple[str, str]:
    """The rows ``python -m flashref.bench decode`` writes for a decode version: contiguous and
    paged (version 1 keeps its plain names)."""
    tail = "" if version == 1 else f"_v{version}"
    return f"flashref{tail}", f"flashref_paged{tail}"


def shape_of(r: dict) -> tuple:
    """A row's shape: ``(dtype, d, B, Hq, Hkv, Nq, Nk)``."""
    return (r["dtype"], r["d"], r["B"], r["Hq"], r["Hkv"], r["Nq"], r["Nk"])


def shape_text(s: tuple) -> str:
    dtype, dd, B, hq, hkv, nq, nk = s
    return f"{dtype}, d {dd}, B {B}, Hq {hq}, Hkv {hkv}, Nq {nq}, Nk {nk:,}"


def short_dtype(dtype: str) -> str:
    return {"float16": "fp16", "bfloat16": "bf16"}.get(dtype, dtype)


def _median(xs):
    return statistics.median(xs)


class DecodeRun:
    """The recorded decode run, indexed by (shape, implementation).

    ``version`` and ``paged_version``: the decode versions whose rows are "ours" (what
    ``version=None`` runs on the recorded GPU, contiguous and on the run's pages).
    """

    def __init__(self, data: dict, version: int, paged_version: int):
        self.meta = data["meta"]
        self.rows = data["rows"]
        self.measured = [r for r in self.rows if r["gbps"] is not None]
        self.row = {(shape_of(r), r["impl"]): r for r in self.measured}
        self.shapes = sorted({shape_of(r) for r in self.measured})
        self.version, self.paged_version = version, paged_version
        self.ours = impl_names(version)[0]
        self.ours_paged = impl_names(paged_version)[1]
        self.read_ceiling = self.meta["hbm_read_gbps"]
        self.graph = [s for s in self.shapes if self.get(s, self.ours, "graph_gbps")]

    @classmethod
    def load(cls, path, version: int, paged_version: int) -> DecodeRun:
        return cls(json.loads(Path(path).read_text(encoding="utf-8")), version, paged_version)

    def get(self, s, impl, key):
        """Row ``(s, impl)``'s ``key``, or None where the row or the value is missing."""
        r = self.row.get((s, impl))
        return r.get(key) if r else None


def provenance_lines(run: DecodeRun, where: str, rules=("timing", "graph_rule")) -> list[str]:
    """The run's GPU, driver, versions, date, ceilings and the timing rules named."""
    m = run.meta
    out = [
        f"decode run ({where}): {m['gpu']}, driver {m['driver']}, {m['date']}",
        f"  CUDA runtime {m['cuda_runtime']}, CuPy {m['cupy']}, torch {m['torch']}, "
        f"{m['sm_count']} SMs",
        f"  measured HBM read {m['hbm_read_gbps']:,.0f} GB/s, copy {m['hbm_copy_gbps']:,.0f} GB/s",
    ]
    for rule in rules:
        if rule in m:
            out += textwrap.wrap(m[rule], 74, initial_indent="  ", subsequent_indent="  ")
    return out


def replayed_lines(run: DecodeRun, dtypes=("float16",)) -> list[str]:
    """GB/s replayed from a CUDA graph: ours beside cuDNN and FLASH at each shape of
    ``dtypes``, ours as a multiple of cuDNN and of the read ceiling, split counts; then, over
    every dtype, the counts at 1.0x cuDNN or more and at 85% of the read ceiling, and the
    shapes below cuDNN whose rounds do not overlap cuDNN's."""
    ours, ceiling = run.ours, run.read_ceiling

    def g(s, impl):
        return run.get(s, impl, "graph_gbps")

    out = [
        f"GB/s replayed from a CUDA graph: version {run.version} (ours), SDPA cuDNN and FLASH;",
        "ours as a multiple of cuDNN and as a fraction of the read ceiling",
        f"{'':5}{'B':>3}{'Hkv':>4}{'Nk':>8}{'ours':>6}{'cuDNN':>6}{'FLASH':>6}"
        f"{'x cuDNN':>8}{'of read':>8}{'S':>4}",
    ]
    for s in run.graph:
        dtype, _, B, _, hkv, _, nk = s
        if dtype not in dtypes:
            continue
        cells = "".join(
            f"{g(s, i):>6.0f}" if g(s, i) else f"{'-':>6}" for i in (ours, CUDNN, "sdpa_flash")
        )
        x = f"{g(s, ours) / g(s, CUDNN):>8.2f}" if g(s, CUDNN) else f"{'-':>8}"
        out.append(
            f"{short_dtype(dtype):5}{B:>3}{hkv:>4}{nk:>8,}{cells}{x}"
            f"{g(s, ours) / ceiling:>8.0%}{run.row[s, ours]['num_splits']:>4}"
        )
    pairs = [(s, g(s, ours) / g(s, CUDNN)) for s in run.graph if g(s, CUDNN)]
    reach = [g(s, ours) >= 0.85 * ceiling for s in run.graph if s[-1] >= 32768]
    names = " and ".join(short_dtype(x) for x in sorted({s[0] for s in run.graph}))
    out += [
        "",
        f"over every shape of the run ({names}, {len(pairs)} shapes):",
        f"  >= 1.0x cuDNN: {sum(x >= 1 for _, x in pairs)} of {len(pairs)}; x cuDNN median "
        f"{_median([x for _, x in pairs]):.3f}, min {min(x for _, x in pairs):.3f}, "
        f"max {max(x for _, x in pairs):.3f}",
        f"  >= 85% of the read ceiling where Nk >= 32k: {sum(reach)} of {len(reach)}",
    ]
    below = [s for s, x in pairs if x < 1]
    apart = [
        s for s in below if run.row[s, ours]["graph_us_min"] > run.row[s, CUDNN]["graph_us_max"]
    ]
    out.append(
        f"  below 1.0x cuDNN: {len(below)}; of them every round slower than every "
        f"round of cuDNN's: {len(apart)}"
    )
    for s in apart:
        out.append(f"    {shape_text(s)}: x {g(s, ours) / g(s, CUDNN):.3f}")
    return out


def draw_replayed(run: DecodeRun, dtype: str = "float16", d: int = 128):
    """GB/s replayed against Nk, one panel per (B, Hkv): ours, cuDNN and FLASH, the measured
    read ceiling dashed. Returns the figure."""
    import matplotlib.pyplot as plt

    panel = sorted({(s[2], s[4]) for s in run.graph if s[:2] == (dtype, d)})
    ncols = min(3, len(panel))
    nrows = -(-len(panel) // ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows), sharey=True, squeeze=False
    )
    impls = {run.ours: f"version {run.version}", CUDNN: "cuDNN", "sdpa_flash": "FLASH"}
    nks = sorted({s[-1] for s in run.graph})
    for ax, (B, hkv) in zip(axes.flat, panel, strict=False):
        for n, (impl, label) in enumerate(impls.items()):
            pts = sorted(
                (s[-1], run.get(s, impl, "graph_gbps"))
                for s in run.graph
                if s[:3] == (dtype, d, B) and s[4] == hkv and run.get(s, impl, "graph_gbps")
            )
            if pts:
                ax.semilogx(*zip(*pts, strict=True), "o-", base=2, color=f"C{n}", label=label)
        ax.set_xticks(nks, [f"{n // 1024}k" for n in nks])
        ax.axhline(run.read_ceiling, color="0.4", ls="--", lw=1)
        ax.set(title=f"B = {B}, Hkv = {hkv}", xlabel="Nk")
        ax.grid(True, alpha=0.3)
    for ax in axes.flat[len(panel) :]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("GB/s of K, V read")
    axes.flat[0].legend(fontsize=9)
    fig.suptitle(
        f"Decode replayed from a CUDA graph, {dtype}, d = {d}, Nq = 1, "
        f"{run.meta['gpu']} (dashed: measured HBM read)",
        fontsize=12,
    )
    fig.tight_layout()
    return fig


def version_scores(run: DecodeRun) -> dict[int, tuple[float, int, int, int, int, float]]:
    """Per version the run measured: (median x cuDNN replayed, shapes at 1.0x or more, shapes
    compared, shapes at 85% of the read ceiling with Nk >= 32k, such shapes, timed median)."""
    scores = {}
    for v in run.meta["decode_versions"]:
        name = impl_names(v)[0]
        both = [
            s
            for s in run.shapes
            if run.get(s, name, "graph_gbps") and run.get(s, CUDNN, "graph_gbps")
        ]
        x = [run.row[s, name]["graph_gbps"] / run.row[s, CUDNN]["graph_gbps"] for s in both]
        timed = [run.row[s, name]["gbps"] / run.row[s, CUDNN]["gbps"] for s in both]
        long = [s for s in both if s[-1] >= 32768]
        n85 = sum(run.row[s, name]["graph_gbps"] >= 0.85 * run.read_ceiling for s in long)
        scores[v] = (_median(x), sum(r >= 1 for r in x), len(x), n85, len(long), _median(timed))
    return scores


def version_lines(run: DecodeRun, sm90a_versions, defaults: tuple[int, int]) -> list[str]:
    """Each version replayed against cuDNN, and the default-choosing rule (the highest median
    ratio, ties broken by the shapes at 1.0x or more) among all versions and among those that
    run on any GPU, beside ``defaults`` (version=None on compute capability 9.0, elsewhere)."""
    score = version_scores(run)
    out = [
        f"{'version':>8}{'>= cuDNN':>10}{'median x cuDNN':>16}{'>= 85% read':>13}"
        f"{'timed median':>14}"
    ]
    for v, (med, n1, n, n85, nlong, timed) in score.items():
        out.append(f"{v:>8}{n1:>5} of {n:<3}{med:>14.3f}{n85:>7} of {nlong:<3}{timed:>11.3f}")

    def key(v):
        return score[v][:2]

    best = max(score, key=key)
    anywhere = [v for v in score if v not in sm90a_versions]
    best_anywhere = max(anywhere, key=key)
    out.append(f"the rule picks version {best} of all, {best_anywhere} of those for any GPU;")
    out.append(
        f"  version=None: {defaults[0]} on 9.0, {defaults[1]} elsewhere; the same: "
        f"{(best, best_anywhere) == tuple(defaults)}"
    )
    spread = _median(
        [
            (r["graph_us_max"] - r["graph_us_min"]) / r["graph_us"]
            for r in run.measured
            if r.get("graph_us")
        ]
    )
    group = [v for v in score if v in sm90a_versions] if best in sm90a_versions else anywhere
    for pick, pool in ((best, group), (best_anywhere, anywhere)):
        runner = max((v for v in pool if v != pick), key=key)
        margin = score[pick][0] / score[runner][0] - 1
        out.append(
            f"version {pick} over version {runner}: median ratio +{margin:.1%}; inside "
            f"a row's median spread of rounds"
        )
        out.append(f"  ({spread:.1%}): {margin < spread}")
    return out


# -- the serving run -----------------------------------------------------------------------


def serving_provenance_lines(
    data: dict, where: str, beside: tuple[str, str] | None = None
) -> list[str]:
    """The serving run's GPU, driver, versions, date, commit, clocks and timing rule.

    ``beside``: ``(name, gpu)`` of another run printed on the same page; where its GPU is not
    this run's, a line says so, and that the two compare by their ratios (each to a baseline
    measured in its own run), not by their GB/s or times."""
    m = data["meta"]
    c = m["clocks"]
    out = [
        f"serving run ({where}): {m['gpu']}, driver {m['driver']}, {m['date']}, commit "
        f"{m['commit'][:7]}",
        f"  CUDA runtime {m['cuda_runtime']}, CuPy {m['cupy']}, torch {m['torch']}, "
        f"{m['sm_count']} SMs",
        f"  SM clock {c['min_mhz']}-{c['max_mhz']} MHz over {c['samples']} samples during the run",
    ]
    sources = {**m["sources"], **m.get("other_sources", {})}
    out += textwrap.wrap(
        "sources: " + ", ".join(f"{k} {v}" for k, v in sources.items()),
        86,
        initial_indent="  ",
        subsequent_indent="    ",
    )
    out += textwrap.wrap(m["timing"], 86, initial_indent="  ", subsequent_indent="  ")
    if beside is not None and beside[1] != m["gpu"]:
        out += textwrap.wrap(
            f"another GPU than {beside[0]} ({beside[1]}): compare the two by their ratios, "
            "each to a baseline of its own run, not by GB/s or times",
            86,
            initial_indent="  ",
            subsequent_indent="  ",
        )
    return out


def _paged_ratios(rows) -> tuple[list[float], list[int]]:
    """Every paged / cuDNN ratio of decode rows that have both, and the page sizes."""
    rows = [r for r in rows if "note" not in r and "cudnn_gbps" in r]
    sizes = (
        sorted(int(k[5:-5]) for k in rows[0] if k.startswith("paged") and k.endswith("_gbps"))
        if rows
        else []
    )
    return [r[f"paged{p}_ratio_to_cudnn"] for r in rows for p in sizes], sizes


def _ratio_summary(ratios) -> str:
    return (
        f"median {_median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}; at "
        f"1.00 or more (to two places): {sum(round(x, 2) >= 1 for x in ratios)} of "
        f"{len(ratios)}"
    )


def paged_decode_lines(data: dict, dtype: str = "float16") -> list[str]:
    """Paged decode replayed (``PagedDecodePlan.run``, pages in a random order) beside cuDNN's
    contiguous decode, GB/s and ratio at each page size, for the rows of ``dtype``; then the
    ratios' range, and one line of the same for each other dtype recorded."""
    mine = [r for r in data["decode"] if r["dtype"] == dtype]
    ratios, sizes = _paged_ratios(mine)
    out = [
        f"GB/s replayed, {dtype}: cuDNN on a contiguous cache, flashref's plan on pages (x cuDNN)",
        f"{'':5}{'B':>3}{'Hkv':>4}{'Nk':>8}{'cuDNN':>7}"
        + "".join(f"{f'page {p}':>15}" for p in sizes)
        + f"{'S':>4}",
    ]
    for r in mine:
        head = f"{short_dtype(r['dtype']):5}{r['B']:>3}{r['Hkv']:>4}{r['Nk']:>8,}"
        if "note" in r or "cudnn_gbps" not in r:
            out.append(head + "  " + r.get("note", r.get("cudnn_note") or "no cuDNN row"))
            continue
        cells = "".join(
            f"{r[f'paged{p}_gbps']:>8.0f} ({r[f'paged{p}_ratio_to_cudnn']:.2f})" for p in sizes
        )
        out.append(f"{head}{r['cudnn_gbps']:>7.0f}{cells}{r[f'paged{sizes[0]}_splits']:>4}")
    out.append(f"paged / cuDNN, {short_dtype(dtype)}, over {len(ratios)} rows:")
    out.append("  " + _ratio_summary(ratios))
    for other in sorted({r["dtype"] for r in data["decode"]} - {dtype}):
        rest, _ = _paged_ratios([r for r in data["decode"] if r["dtype"] == other])
        if rest:
            out.append(f"the same shapes in {other}, over {len(rest)} rows:")
            out.append("  " + _ratio_summary(rest))
    return out


def append_lines(data: dict, dtype: str = "float16") -> list[str]:
    """The append kernel (one step's new K and V for a batch) beside ``copy_`` of the same
    bytes, GB/s written, and the share of the measured HBM copy bandwidth, for ``dtype``;
    then one line per other dtype recorded: its shares of the HBM copy."""
    a = [r for r in data["append"] if r["dtype"] == dtype]
    r0 = a[0]
    out = [
        f"append of n new tokens for B = {r0['B']} sequences, Hkv = {r0['Hkv']}, "
        f"d = {r0['d']}, {r0['dtype']}: GB/s written",
        f"{'n':>5}{'bytes':>13}{'us':>8}{'append':>8}{'copy_':>7}{'ratio':>7}"
        f"{'of HBM copy':>13}{'exact':>7}",
    ]
    for r in a:
        out.append(
            f"{r['n']:>5}{r['bytes_written']:>13,}{r['append_us']:>8.1f}"
            f"{r['append_gbps']:>8.0f}{r['copy_gbps']:>7.0f}{r['ratio_to_copy']:>7.2f}"
            f"{r['fraction_of_hbm_copy']:>13.0%}{r['exact']!s:>7}"
        )
    for other in sorted({r["dtype"] for r in data["append"]} - {dtype}):
        rest = [r for r in data["append"] if r["dtype"] == other]
        shares = ", ".join(f"n {r['n']}: {r['fraction_of_hbm_copy']:.0%}" for r in rest)
        exact = all(r["exact"] for r in rest)
        out.append(f"{other}: of HBM copy {shares}; exact {exact}")
    return out


def generation_lines(data: dict) -> list[str]:
    """The chapter 8 model generating greedily, flashref's paged cache against SDPA over a
    static contiguous cache: tokens/s, step time, the copies a profiler saw in the replay
    loop, and where the two generators' greedy sequences first differ."""
    m = data["meta"]["generation_model"]
    c = m["config"]
    out = [
        f"the chapter 8 model ({c['n_layers']} layers, d_model {c['d_model']}, "
        f"{c['n_heads']} heads, context {c['context']}, trained {m['train_steps']} steps):",
        f"prompt {m['prompt']} tokens, {m['new_tokens']} new, greedy, one graph replay a token",
        f"{'B':>4}{'flashref tok/s':>16}{'SDPA tok/s':>12}{'ratio':>7}{'step us':>9}{'SDPA':>7}",
    ]
    for r in data["generation"]:
        out.append(
            f"{r['B']:>4}{r['flashref_tokens_per_s']:>16,.0f}"
            f"{r['sdpa_tokens_per_s']:>12,.0f}{r['ratio_tokens_per_s']:>7.2f}"
            f"{r['flashref_step_us']:>9.0f}{r['sdpa_step_us']:>7.0f}"
        )
    for r in data["generation"]:
        copies = {
            g: ", ".join(f"{k} {n}" for k, n in r[f"{g}_loop_copies"].items())
            for g in ("flashref", "sdpa")
        }
        first = sorted(x for x in r["first_difference"] if x is not None)
        diverge = f", first differences at tokens {first}" if first else ""
        if len(first) > 8:
            diverge = (
                f"; the others first differ between new tokens {first[0]} and "
                f"{first[-1]} (median {_median(first):.0f})"
            )
        out.append(
            f"B = {r['B']}: copies in the replay loop (profiler): flashref "
            f"{copies['flashref']}; SDPA {copies['sdpa']}"
        )
        out.append(
            f"  the paged cache's own count of host-to-device copies in the loop: "
            f"{r['flashref_loop_host_copies']}"
        )
        out.append(f"  greedy sequences identical: {r['sequences_equal']} of {r['B']}{diverge}")
        gaps = [g for g in r.get("gap_at_difference", []) if g is not None]
        if gaps:
            out.append(
                f"  where they part, the two tokens' logits differ by at most {max(gaps):.3f}"
            )
    return out


def prefill_fit(kernel_us, tiles) -> tuple[float, float]:
    """Least squares of each chunk's kernel time against its longest work tile's key tiles:
    ``(fixed, per_tile)`` in us, kernel_us ~ fixed + per_tile x tiles."""
    import numpy as np

    per_tile, fixed = np.polyfit(np.asarray(tiles, float), np.asarray(kernel_us, float), 1)
    return float(fixed), float(per_tile)


def prefill_lines(data: dict) -> list[str]:
    """Chunked prefill (``paged_prefill_attention``, one prompt in chunks through the pages)
    with its default key splits and with one, beside one causal forward over the contiguous
    prompt and SDPA cuDNN's, us per prompt; each shape's work tiles per chunk against the
    GPU's SMs, and the fit of its chunks' kernel times (``prefill_fit``)."""
    sms = data["meta"]["sm_count"]
    out = [
        "one prompt of N tokens, B = 1: us per prompt (ratio: the other's time / chunked)",
        f"{'':5}{'H':>3}{'d':>5}{'N':>6}{'chunk':>6}{'tiles':>6}{'S':>3}{'chunked':>8}"
        f"{'S = 1':>7}{'forward':>8}{'cuDNN':>6}{'x fwd':>6}{'x cuDNN':>8}",
    ]
    for r in data["prefill"]:
        tiles = -(-r["chunk"] // 128) * r["B"] * r["H"]  # query blocks of 128 x heads
        out.append(
            f"{short_dtype(r['dtype']):5}{r['H']:>3}{r['d']:>5}{r['N']:>6}{r['chunk']:>6}"
            f"{tiles:>6}{r['splits']:>3}{r['chunked_us']:>8.0f}"
            f"{r['chunked_one_split_us']:>7.0f}{r['one_forward_us']:>8.0f}"
            f"{r['cudnn_us']:>6.0f}{r['ratio_to_one_forward']:>6.2f}"
            f"{r['ratio_to_cudnn']:>8.2f}"
        )
    out.append(f"tiles: work tiles (query block, head) of one chunk, for {sms} SMs;")
    out.append("S: key splits per query block (the default); S = 1: the same chunks unsplit")
    out.append("each chunk's kernels: fixed + per tile x (key tiles of its longest work tile),")
    out.append("  least squares over the chunks (the profiler's kernel times):")
    for r in data["prefill"]:
        fixed, per_tile = prefill_fit(
            r["chunk_kernel_us"]["default"], r["chunk_longest_tiles"]["default"]
        )
        n = len(r["chunk_kernel_us"]["default"])
        merge = sum(r["combine_kernel_us"]["default"])
        out.append(
            f"  {short_dtype(r['dtype'])} H {r['H']} d {r['d']}: fixed {fixed:.1f} us, "
            f"{per_tile:.2f} us per tile; {n} chunks pay {n * fixed:.0f} us fixed"
            + (f" and {merge:.0f} us of merging" if merge else "")
        )
    return out
