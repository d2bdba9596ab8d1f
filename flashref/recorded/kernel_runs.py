"""Tables and verdicts that chapters 5 and 7 print from the recorded GPU runs.

The chapters read ``results/gpu_bench.json`` (``python -m flashref.bench gpu``: every
version and SDPA's backends over interleaved rounds) and ``results/gpu_profile.json``
(``python -m flashref.bench profile``: Nsight Compute counters of one call per version).
:class:`Bench` and :class:`Profile` index them; the functions below turn them into the
lines a chapter prints, so that a chapter's cell is one call.

One rule decides whether a step from one version to another helped, and every chapter
uses it (:func:`step_verdict`):

1. At one shape (run dtype, head dimension, mask, sequence length) the two versions'
   interleaved rounds are compared: the new version is *faster* if every one of its rounds
   took less time than every round of the old one, *slower* if every one took more, and
   otherwise *within the spread* (:func:`compare_rounds`).
2. Identical work does not always give overlapping rounds. The control pair, versions 14
   and 17 without a causal mask, run the same arithmetic (version 17's one change never
   triggers there), so the share of shapes at which their rounds separate is the run's
   noise floor (:func:`control_share`).
3. A step is a **gain** at one head dimension and mask if it was faster at a larger share
   of the shapes (every run dtype and sequence length of the file) than the control pair
   ever separated, a **loss** if it was slower at a larger share, and otherwise **within
   the spread**.

A row timed in a single round (versions 1 and 2, slow enough to be timed once) has no
rounds to compare: it is given the widest spread of any row of the file on either side of
its one time (:func:`round_interval`).

The rule that picks the version ``version=None`` runs is ``flashref.recorded.defaults``;
what changed in a kernel's code from one version to the next, ``flashref.gpu.listing``.
NumPy-free; the standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path

from ..hardware.occupancy import resident_warps
from .files import read_json

GAIN, LOSS = "gain", "loss"
FASTER, SLOWER = "faster", "slower"
WITHIN = "within the spread"
NO_SPREAD = "no spread measured"  # a file in which no row has two rounds
MARK = {FASTER: "+", SLOWER: "-", WITHIN: "=", NO_SPREAD: "?"}
CONTROL = (14, 17)  # the same arithmetic without a causal mask
SHAPES = ((64, False), (64, True), (128, False), (128, True))  # (d, causal)

__all__ = [
    "Bench",
    "Profile",
    "COUNTERS",
    "counter_lines",
    "round_interval",
    "compare_rounds",
    "step_counts",
    "control_share",
    "control_lines",
    "step_verdict",
    "step_lines",
    "speed_lines",
    "steps_lines",
    "ratio_lines",
    "occupancy_lines",
    "shape_name",
]


def _read(path) -> dict:
    """A benchmark or profile file (``files.read_json``) with its list of rows and its meta."""
    path = Path(path)
    data = read_json(path)
    if not isinstance(data.get("rows"), list):
        raise ValueError(f"{path}: expected a JSON object with a list 'rows'")
    if not isinstance(data.get("meta"), dict):
        raise ValueError(f"{path}: expected a JSON object with an object 'meta'")
    return data


def _check_number(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} = {value!r}; expected a version number (an int >= 1)")
    return value


def _check_causal(causal, name: str = "causal") -> bool:
    if not isinstance(causal, bool):
        raise TypeError(f"{name} = {causal!r}; expected True or False")
    return causal


def shape_name(d: int, causal: bool) -> str:
    """``"d = 64"`` or ``"d = 64, causal"``."""
    return f"d = {d}" + (", causal" if _check_causal(causal) else "")


class Bench:
    """A benchmark file (``gpu_bench.json``), its rows indexed by shape.

    ``Bench.load(path)`` reads one; ``Bench(data, name)`` takes its parsed JSON (tests
    build small ones). ``row(impl, run_dtype, d, causal, N)`` is one row or None;
    ``dtypes`` the run dtypes in the file's order, ``Ns`` its sequence lengths, ``widest``
    the largest spread of any row timed over two rounds or more (None if there is none),
    ``cold`` the file's cold first calls (an empty list if it has none).
    """

    KEYS = ("impl", "run_dtype", "d", "causal", "N", "tflops", "round_ms")

    def __init__(self, data: dict, name: str = "benchmark"):
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            raise ValueError(f"{name}: data must be a dict with a list 'rows'")
        self.name, self.meta, self.rows = name, data.get("meta", {}), data["rows"]
        self.cold = data.get("cold") or []
        self._index = {}
        for i, r in enumerate(self.rows):
            missing = [k for k in self.KEYS if k not in r]
            if missing:
                raise ValueError(f"{name}: rows[{i}] has no {missing[0]!r}")
            self._index[r["impl"], r["run_dtype"], r["d"], r["causal"], r["N"]] = r
        self.dtypes = tuple(dict.fromkeys(r["run_dtype"] for r in self.rows))
        self.Ns = tuple(sorted({r["N"] for r in self.rows}))
        spreads = [_spread(r) for r in self.rows if len(r["round_ms"] or ()) >= 2]
        self.widest = max(spreads) if spreads else None

    @classmethod
    def load(cls, path) -> Bench:
        """Read ``path`` (a ``gpu_bench.json``)."""
        return cls(_read(path), Path(path).name)

    def row(self, impl: str, run_dtype: str, d: int, causal: bool, N: int) -> dict | None:
        """The row of ``impl`` ("v14", "sdpa_flash", ...) at one shape, None if not run."""
        r = self._index.get((impl, run_dtype, d, _check_causal(causal), N))
        return r if r is not None and r["tflops"] else None

    def version(self, number: int, run_dtype: str, d: int, causal: bool, N: int):
        """The row of version ``number`` at one shape, None if not run."""
        return self.row(f"v{_check_number(number, 'number')}", run_dtype, d, causal, N)

    def has(self, number: int) -> bool:
        """Whether the file holds any timed row of version ``number``."""
        impl = f"v{_check_number(number, 'number')}"
        return any(r["impl"] == impl and r["tflops"] for r in self.rows)


def _spread(r: dict) -> float:
    t = sorted(r["round_ms"])
    return (t[-1] - t[0]) / t[len(t) // 2]


class Profile:
    """A profile file (``gpu_profile.json``): ``row(number, d)`` is version ``number``'s
    Nsight Compute row at head dimension ``d`` (None if absent); ``dims`` its head dims."""

    def __init__(self, data: dict, name: str = "profile"):
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            raise ValueError(f"{name}: data must be a dict with a list 'rows'")
        self.name, self.meta, self.rows = name, data.get("meta", {}), data["rows"]
        self._index = {(r.get("impl"), r.get("d")): r for r in self.rows}
        self.dims = tuple(sorted({r["d"] for r in self.rows if "d" in r}))

    @classmethod
    def load(cls, path) -> Profile:
        """Read ``path`` (a ``gpu_profile.json``)."""
        return cls(_read(path), Path(path).name)

    def row(self, number: int, d: int) -> dict | None:
        return self._index.get((f"v{_check_number(number, 'number')}", d))


# ---- counters -------------------------------------------------------------------------

_PCT = "avg.pct_of_peak_sustained_active"
_MMA = "sm__inst_executed_pipe_tensor_op_hmma.sum"


def _ldsm_per_mma(r):
    return r["smsp__inst_executed_op_ldsm.sum"] / r[_MMA] if r[_MMA] else math.nan


def _stalls(reason):
    return lambda r: r["stalls_per_issue"].get(reason, math.nan)


COUNTERS: dict[str, tuple[Callable[[dict], float], str]] = {  # name: (value of a row, format)
    "time in ncu, ms": (lambda r: r["gpu__time_duration.sum"] / 1e6, ".2f"),
    "SM clock, GHz": (lambda r: r["sm__cycles_elapsed.avg.per_second"] / 1e9, ".2f"),
    "DRAM bytes, MB": (
        lambda r: (r["dram__bytes_read.sum"] + r["dram__bytes_write.sum"]) / 1e6,
        ".0f",
    ),
    "L2 bytes, GB": (lambda r: r["lts__t_bytes.sum"] / 1e9, ".2f"),
    "tensor pipe active, %": (lambda r: r[f"sm__pipe_tensor_op_hmma_cycles_active.{_PCT}"], ".1f"),
    "mma instructions, M": (lambda r: r[_MMA] / 1e6, ".0f"),
    "ldmatrix, M": (lambda r: r["smsp__inst_executed_op_ldsm.sum"] / 1e6, ".1f"),
    "ldmatrix per mma": (_ldsm_per_mma, ".3f"),
    "bank conflicts, M": (
        lambda r: r["l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"] / 1e6,
        ".3g",
    ),
    "bank conflicts of stores, M": (
        lambda r: r["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"] / 1e6,
        ".3g",
    ),
    "instructions issued, M": (lambda r: r["smsp__inst_executed.sum"] / 1e6, ".0f"),
    "issue slots busy, %": (lambda r: r[f"smsp__issue_active.{_PCT}"], ".1f"),
    "resident warps, % of max": (lambda r: r[f"sm__warps_active.{_PCT}"], ".1f"),
    "registers per thread": (lambda r: r["launch__registers_per_thread"], ".0f"),
    "shared memory per block, KiB": (
        lambda r: r["launch__shared_mem_per_block_dynamic"] / 1024,
        ".1f",
    ),
    "thread blocks": (lambda r: r["launch__grid_size"], ".0f"),
    "stalls per issue, all reasons": (
        lambda r: sum(v for k, v in r["stalls_per_issue"].items() if k != "selected"),
        ".2f",
    ),
}
# the backward profile's counters (chapter 8): the tensor pipe counting wgmma's cycles too,
# dQ's atomic reductions, and the warps each scheduler had to choose from
_PIPE_ALL = f"sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.{_PCT}"
COUNTERS.update(
    {
        "tensor pipe active (any mma), %": (lambda r: r[_PIPE_ALL], ".1f"),
        "wgmma instructions, M": (
            lambda r: r["sm__inst_executed_pipe_tensor_op_gmma.sum"] / 1e6,
            ".1f",
        ),
        "reduction instructions, M": (
            lambda r: r["smsp__inst_executed_op_global_red.sum"] / 1e6,
            ".2f",
        ),
        "L2 reduction requests, M": (lambda r: r["lts__t_requests_op_red.sum"] / 1e6, ".1f"),
        "warps per scheduler": (lambda r: r["smsp__warps_active.avg.per_cycle_active"], ".2f"),
        "eligible warps per scheduler": (
            lambda r: r["smsp__warps_eligible.avg.per_cycle_active"],
            ".2f",
        ),
    }
)
for _reason in (
    "long_scoreboard",
    "short_scoreboard",
    "wait",
    "barrier",
    "math_pipe_throttle",
    "dispatch_stall",
    "mio_throttle",
    "lg_throttle",
):
    COUNTERS[f"  stalls: {_reason.replace('_', ' ')}"] = (_stalls(_reason), ".2f")


def counter_lines(
    profile: Profile,
    numbers: Iterable[int],
    names: Iterable[str],
    ratio: bool = False,
    dims: Iterable[int] | None = None,
) -> list[str]:
    """The named counters (keys of :data:`COUNTERS`) of these versions at every head dim
    (or at ``dims`` only).

    With ``ratio=True`` (two versions) a column new/old follows each head dimension.
    A version missing from the profile prints ``-``.
    """
    if not isinstance(profile, Profile):
        raise TypeError(f"profile is a {type(profile).__name__}; expected a Profile")
    numbers = [_check_number(n, "numbers[]") for n in numbers]
    names = list(names)
    unknown = [n for n in names if n not in COUNTERS]
    if unknown:
        raise ValueError(f"names: no counter {unknown[0]!r}; known: {', '.join(COUNTERS)}")
    if not numbers or not names:
        raise ValueError("numbers and names must each name at least one")
    if ratio and len(numbers) != 2:
        raise ValueError(f"ratio=True compares two versions; numbers has {len(numbers)}")
    dims = profile.dims if dims is None else list(dims)
    missing = [d for d in dims if d not in profile.dims]
    if missing or not dims:
        raise ValueError(f"dims: {dims} is not a non-empty subset of the profile's {profile.dims}")
    head = ""
    for d in dims:
        head += "".join(f"{f'v{n} d={d}':>10}" for n in numbers)
        head += f"{'new/old':>8}" if ratio else ""
    lines = [f"{'':30}" + head]
    for name in names:
        value, fmt = COUNTERS[name]
        cells = ""
        for d in dims:
            got = [profile.row(n, d) for n in numbers]
            vals = [None if r is None else value(r) for r in got]
            cells += "".join(f"{'-':>10}" if v is None else format(v, ">10" + fmt) for v in vals)
            if ratio:
                a, b = vals
                cells += f"{b / a:7.2f}x" if a and b is not None else f"{'-':>8}"
        lines.append(f"{name:30}{cells}")
    return lines


# ---- the rule ---------------------------------------------------------------------------


def round_interval(row: dict, widest: float | None) -> tuple[float, float] | None:
    """(fastest, slowest) round of a benchmark row, in ms.

    A row timed in one round has no rounds to compare: its interval is its time widened by
    ``widest`` (a fraction, the largest spread of the file) on either side; without a
    ``widest`` it is None.
    """
    rounds = row.get("round_ms") if isinstance(row, dict) else None
    if not rounds:
        raise ValueError(f"row has no rounds (round_ms = {rounds!r}); expected a benchmark row")
    if len(rounds) >= 2:
        return min(rounds), max(rounds)
    if widest is None:
        return None
    if not widest >= 0:
        raise ValueError(f"widest = {widest!r}; expected a spread >= 0")
    return rounds[0] * (1 - widest), rounds[0] * (1 + widest)


def compare_rounds(old: dict, new: dict, widest: float | None = None) -> str:
    """``"faster"`` if every round of ``new`` took less time than every round of ``old``,
    ``"slower"`` if every one took more, otherwise ``"within the spread"``.

    ``old`` and ``new`` are benchmark rows of one shape; ``widest`` widens a row timed in a
    single round (:func:`round_interval`), and without it such a comparison is
    ``"no spread measured"``.
    """
    for row, name in ((old, "old"), (new, "new")):
        if not isinstance(row, dict):
            raise TypeError(f"{name} is a {type(row).__name__}; expected a benchmark row (dict)")
    a, b = round_interval(old, widest), round_interval(new, widest)
    if a is None or b is None:
        return NO_SPREAD
    if b[1] < a[0]:
        return FASTER
    if b[0] > a[1]:
        return SLOWER
    return WITHIN


def step_counts(bench: Bench, old: int, new: int, d: int, causal: bool) -> dict[str, int]:
    """How many shapes of one head dim and mask (every run dtype and N at which both
    versions ran) gave each result of :func:`compare_rounds` for the step old -> new."""
    if not isinstance(bench, Bench):
        raise TypeError(f"bench is a {type(bench).__name__}; expected a Bench")
    old, new = _check_number(old, "old"), _check_number(new, "new")
    _check_causal(causal)
    counts = {FASTER: 0, SLOWER: 0, WITHIN: 0, NO_SPREAD: 0}
    for dtype in bench.dtypes:
        for N in bench.Ns:
            a = bench.version(old, dtype, d, causal, N)
            b = bench.version(new, dtype, d, causal, N)
            if a is not None and b is not None:
                counts[compare_rounds(a, b, bench.widest)] += 1
    return counts


def _check_pair(bench: Bench, pair, name: str) -> tuple[int, int]:
    if not (isinstance(pair, tuple) and len(pair) == 2):
        raise TypeError(f"{name} = {pair!r}; expected two version numbers (old, new)")
    pair = (_check_number(pair[0], f"{name}[0]"), _check_number(pair[1], f"{name}[1]"))
    for n in pair:
        if not bench.has(n):
            raise ValueError(f"{name}: {bench.name} has no rows of version {n}")
    return pair


def control_share(bench: Bench, pair: tuple[int, int] = CONTROL) -> float:
    """The largest share of shapes, at any one head dimension without a causal mask, at
    which the control pair's rounds separated (faster or slower): the run's noise floor."""
    if not isinstance(bench, Bench):
        raise TypeError(f"bench is a {type(bench).__name__}; expected a Bench")
    old, new = _check_pair(bench, pair, "pair")
    shares = []
    for d in sorted({d for d, _ in SHAPES}):
        c = step_counts(bench, old, new, d, False)
        n = sum(c.values())
        if n:
            shares.append(max(c[FASTER], c[SLOWER]) / n)
    if not shares:
        raise ValueError(f"pair: versions {old} and {new} share no shape without a mask")
    return max(shares)


def control_lines(bench: Bench, pair: tuple[int, int] = CONTROL) -> list[str]:
    """What the control pair did: its counts per head dim (no mask), its TFLOP/s ratios."""
    old, new = _check_pair(bench, pair, "pair")
    lines = [f"v{new} against v{old} without a causal mask (the same arithmetic):"]
    ratios = []
    for d in sorted({d for d, _ in SHAPES}):
        c = step_counts(bench, old, new, d, False)
        n = sum(c.values())
        lines.append(
            f"  d = {d:3}: rounds faster at {c[FASTER]}, slower at {c[SLOWER]},"
            f" overlapping at {c[WITHIN]} of {n} shapes"
        )
        for dtype in bench.dtypes:
            for N in bench.Ns:
                a, b = (bench.version(x, dtype, d, False, N) for x in (old, new))
                if a is not None and b is not None:
                    ratios.append(b["tflops"] / a["tflops"] - 1)
    lines.append(f"  TFLOP/s differ by {min(ratios):+.1%} to {max(ratios):+.1%}")
    lines.append(f"  largest share of shapes separated: {control_share(bench, pair):.0%}")
    return lines


def step_verdict(
    bench: Bench, old: int, new: int, d: int, causal: bool, control: float | None = None
) -> tuple[str, dict[str, int]]:
    """``("gain" | "loss" | "within the spread", counts)`` for the step old -> new at one
    head dimension and mask, over every run dtype and N of the file.

    A gain if the new version's rounds were all faster at a larger share of those shapes
    than the control pair ever separated (``control``, by default :func:`control_share`
    of the file), a loss if all slower at a larger share, otherwise within the spread.
    ``counts`` is :func:`step_counts`. A step none of whose shapes could be compared is
    ``"no spread measured"``.
    """
    counts = step_counts(bench, old, new, d, causal)
    if control is None:
        control = control_share(bench)
    elif (
        isinstance(control, bool) or not isinstance(control, int | float) or not (0 <= control <= 1)
    ):
        raise ValueError(f"control = {control!r}; expected a share between 0 and 1")
    n = counts[FASTER] + counts[SLOWER] + counts[WITHIN]
    if not n:
        if not counts[NO_SPREAD]:
            raise ValueError(f"versions {old} and {new} share no shape at {shape_name(d, causal)}")
        return NO_SPREAD, counts
    if counts[FASTER] / n > control:
        return GAIN, counts
    if counts[SLOWER] / n > control:
        return LOSS, counts
    return WITHIN, counts


# ---- tables -----------------------------------------------------------------------------


def _share_head_dim(bench: Bench, old: int, new: int, d: int) -> bool:
    """Whether versions old and new both have a row at head dim d (any dtype, mask, N)."""
    return any(
        bench.version(old, dt, d, c, N) is not None and bench.version(new, dt, d, c, N) is not None
        for dt in bench.dtypes
        for c in (False, True)
        for N in bench.Ns
    )


def step_lines(
    bench: Bench,
    old: int,
    new: int,
    at: int = 4096,
    run_dtype: str = "float16",
    control: float | None = None,
) -> list[str]:
    """A step in three lines: for each head dim and mask, new/old TFLOP/s at one N and run
    dtype, and the verdict over the whole file (:func:`step_verdict`) with the number of
    shapes at which the new version's rounds were faster and slower. A head dim at which
    one of the two has no row (a version built for d = 64 only) is left out."""
    control = control_share(bench) if control is None else control
    head = f"v{old} -> v{new}, TFLOP/s new/old at N = {at} ({run_dtype})"
    lines = [head + "; verdict (shapes faster, slower of n):"]
    for d in sorted({d for d, _ in SHAPES}):
        if not _share_head_dim(bench, old, new, d):  # a version built for other head dims
            continue
        cells = []
        for causal in (False, True):
            a = bench.version(old, run_dtype, d, causal, at)
            b = bench.version(new, run_dtype, d, causal, at)
            ratio = "  -  " if a is None or b is None else f"{b['tflops'] / a['tflops']:.2f}x"
            word, c = step_verdict(bench, old, new, d, causal, control)
            n = sum(c.values())
            text = f"{ratio} {word} ({c[FASTER]}, {c[SLOWER]} of {n})"
            cells.append(("causal " if causal else "") + text)
        lines.append(f"  d = {d:<4} {cells[0]:39}{cells[1]}")
    return lines


def speed_lines(
    bench: Bench, old: int, new: int, at: int | None = None, control: float | None = None
) -> list[str]:
    """The step old -> new at every shape: new/old TFLOP/s marked ``+`` (rounds faster),
    ``-`` (slower) or ``=`` (within the spread); with ``at``, each version's TFLOP/s and
    spread at N = ``at``; then the verdict of each head dim and mask."""
    control = control_share(bench) if control is None else control
    a, b = f"v{old}", f"v{new}"
    lines = [
        f"{b} / {a}, TFLOP/s (rounds: + faster, - slower, = within the spread)",
        f"{'':25}" + "".join(f"{N:>8}" for N in bench.Ns),
    ]
    for dtype in bench.dtypes:
        for d, causal in SHAPES:
            cells = ""
            for N in bench.Ns:
                x = bench.version(old, dtype, d, causal, N)
                y = bench.version(new, dtype, d, causal, N)
                if x is None or y is None:
                    cells += f"{'-':>8}"
                    continue
                mark = MARK[compare_rounds(x, y, bench.widest)]
                cells += f"{y['tflops'] / x['tflops']:7.2f}{mark}"
            if cells.strip("- "):
                lines.append(f"{dtype:9}{shape_name(d, causal):16}{cells}")
    if at is not None:
        lines.append(f"{f'TFLOP/s (spread), N = {at}':25}{a:>17}{b:>17}")
        for dtype in bench.dtypes:
            for d, causal in SHAPES:
                got = [bench.version(n, dtype, d, causal, at) for n in (old, new)]
                if None in got:
                    continue
                cells = "".join(f"{r['tflops']:10.1f} ({_spread_text(r)})" for r in got)
                lines.append(f"{dtype:9}{shape_name(d, causal):16}{cells}")
    lines.append("verdict over every run dtype and N:")
    for d, causal in SHAPES:
        if not _share_head_dim(bench, old, new, d):  # a version built for other head dims
            continue
        word, c = step_verdict(bench, old, new, d, causal, control)
        n = f"faster {c[FASTER]}, slower {c[SLOWER]}, within {c[WITHIN]}"
        lines.append(f"  {shape_name(d, causal):16}{word:19}({n})")
    return lines


def _spread_text(r: dict) -> str:
    return f"{_spread(r):4.1%}" if len(r["round_ms"]) >= 2 else "1 round"


def steps_lines(
    bench: Bench, steps: Iterable[tuple[int, int]], control: float | None = None
) -> list[str]:
    """One line per step (old, new): the verdict of each head dim and mask, and the range
    of new/old TFLOP/s over every shape both ran."""
    control = control_share(bench) if control is None else control
    lines = [
        f"{'step':12}" + "".join(f"{shape_name(d, c):>19}" for d, c in SHAPES) + f"{'new/old':>12}"
    ]
    for old, new in steps:
        words = [step_verdict(bench, old, new, d, c, control)[0] for d, c in SHAPES]
        ratios = [
            y["tflops"] / x["tflops"]
            for dtype in bench.dtypes
            for d, c in SHAPES
            for N in bench.Ns
            if (x := bench.version(old, dtype, d, c, N)) is not None
            and (y := bench.version(new, dtype, d, c, N)) is not None
        ]
        span = f"{min(ratios):.2f}-{max(ratios):.2f}"
        lines.append(
            f"{f'v{old} -> v{new}':12}" + "".join(f"{w:>19}" for w in words) + f"{span:>12}"
        )
    return lines


def ratio_lines(bench: Bench, impl, against: str = "sdpa_flash") -> list[str]:
    """``impl``'s TFLOP/s over ``against``'s at every run dtype, shape and N. ``impl`` is an
    implementation name ("v10") or a function of (run dtype, d, causal) that names one."""
    if not (isinstance(impl, str) or callable(impl)):
        raise TypeError(f"impl = {impl!r}; expected a name such as 'v14' or a function")
    lines = [f"{'':29}" + "".join(f"{N:>7}" for N in bench.Ns)]
    for dtype in bench.dtypes:
        for d, causal in SHAPES:
            name = impl(dtype, d, causal) if callable(impl) else impl
            cells = ""
            for N in bench.Ns:
                x = bench.row(name, dtype, d, causal, N)
                y = bench.row(against, dtype, d, causal, N)
                ok = x is not None and y is not None
                cells += f"{x['tflops'] / y['tflops']:7.2f}" if ok else f"{'-':>7}"
            lines.append(f"{dtype:9}{shape_name(d, causal):16}{name:>4}{cells}")
    return lines


# ---- occupancy --------------------------------------------------------------------------


def occupancy_lines(
    versions: dict, profile: Profile, budget: dict, numbers: Iterable[int] | None = None
) -> list[str]:
    """Resident warps per SM of each version at every head dim: computed from the budgets
    with the profile's registers, and measured (achieved occupancy x the maximum)."""
    numbers = list(versions) if numbers is None else list(numbers)
    lines = [
        f"resident warps per SM (of {budget['warps']}): computed from the budgets,",
        "and measured (ncu: achieved occupancy x the maximum)",
    ]
    head = f"{'threads':>8}{'smem KiB':>9}{'regs':>5}{'warps':>6}{'ncu':>5}"
    lines.append(f"{'':5}" + "".join(f"{f'd = {d}':^33}" for d in profile.dims))
    lines.append(f"{'':5}" + head * len(profile.dims))
    for number in numbers:
        info, line = versions[number], f"v{number:<4}"
        for d in profile.dims:
            r = profile.row(number, d)
            if r is None:
                line += f"{'-':>33}"
                continue
            regs = int(r["launch__registers_per_thread"])
            achieved = r[f"sm__warps_active.{_PCT}"] / 100 * budget["warps"]
            line += (
                f"{info.threads:8}{info.smem_bytes(d) / 1024:9.1f}{regs:5}"
                f"{resident_warps(info, d, regs, budget):6}{achieved:5.0f}"
            )
        lines.append(line)
    return lines
