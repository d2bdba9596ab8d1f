"""Reading the recorded backward benchmark that chapter 8 and its appendix print.

``results/gpu_backward.json`` is written by the GPU benchmark of the backward kernels
(``python -m flashref.bench backward``), read with every field checked
(``flashref.recorded.files``). ``backward_bench`` and ``backward_profile`` hand the backward
run and its counters to ``flashref.recorded.kernel_runs``, so that a backward step is judged
by the same rule as a forward one; ``flashref.recorded.defaults.best_backward`` picks the
backward's default versions from it. The standard library only.
"""

from __future__ import annotations

from pathlib import Path

from .files import NUM, check_fields, read_json
from .kernel_runs import NO_SPREAD, Bench, Profile, compare_rounds

BACKWARD_META = {"gpu": str, "driver": str, "date": str}
BACKWARD_ROW = {
    "impl": str,
    "direction": str,
    "dtype": str,
    "d": int,
    "causal": bool,
    "N": int,
    "B": int,
    "H": int,
    "ms": NUM,
    "ms_min": NUM,
    "ms_max": NUM,
    "tflops": NUM,
}
# flashref: a version through its internal launch (a study of the kernel); flashref_public:
# the public flash_attention_backward with version=None on torch tensors, timed as SDPA
IMPLS = ("flashref", "flashref_public", "sdpa_flash", "sdpa_cudnn")
DIRECTIONS = ("forward", "backward")


def load_backward(path):
    """``(meta, rows)`` from a ``gpu_backward.json``, every field checked."""
    path = Path(path)
    data = read_json(path)
    check_fields(data, {"meta": dict, "rows": list}, str(path))
    check_fields(data["meta"], BACKWARD_META, f"{path}: meta")
    for i, row in enumerate(data["rows"]):
        where = f"{path}: rows[{i}]"
        check_fields(row, BACKWARD_ROW, where)
        if row["impl"] not in IMPLS:
            raise ValueError(f"{where}['impl'] = {row['impl']!r}; expected one of {IMPLS}")
        if row["direction"] not in DIRECTIONS:
            raise ValueError(f"{where}['direction'] = {row['direction']!r}; not {DIRECTIONS}")
        if "version" not in row:
            raise ValueError(f"{where} has no 'version'")
    return data["meta"], data["rows"]


def ratios_to_flash(rows, direction: str = "backward") -> list[tuple[dict, float]]:
    """``(row, flashref TFLOP/s / SDPA FLASH TFLOP/s)`` for every flashref row measured in
    ``direction`` that has a FLASH row of the same dtype, d, causal and N."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    flash = {
        (r["dtype"], r["d"], r["causal"], r["N"]): r["tflops"]
        for r in rows
        if r["impl"] == "sdpa_flash" and r["direction"] == direction
    }
    out = []
    for r in rows:
        key = (r["dtype"], r["d"], r["causal"], r["N"])
        if r["impl"] == "flashref" and r["direction"] == direction and key in flash:
            out.append((r, r["tflops"] / flash[key]))
    return out


def backward_table(rows, direction: str = "backward") -> list[str]:
    """Lines of one table per (dtype, d, causal) measured in ``direction``: a row per
    flashref version, then SDPA FLASH's and cuDNN's, and a column per N holding the
    TFLOP/s and the ratios to cuDNN's and to FLASH's ("-" where a row is missing)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    rows = [r for r in rows if r["direction"] == direction]
    index = {(r["impl"], r["version"], r["dtype"], r["d"], r["causal"], r["N"]): r for r in rows}
    Ns = sorted({r["N"] for r in rows})
    lines = [f"{direction}: TFLOP/s, then its ratio to cuDNN's and to FLASH's"]
    for case in sorted({(r["dtype"], r["d"], r["causal"]) for r in rows}):
        versions = sorted(
            {
                r["version"]
                for r in rows
                if r["impl"] == "flashref" and (r["dtype"], r["d"], r["causal"]) == case
            }
        )
        named = [
            (f"bwd{n}" if direction == "backward" else f"v{n}", "flashref", n) for n in versions
        ]
        named += [("SDPA FLASH", "sdpa_flash", None), ("SDPA cuDNN", "sdpa_cudnn", None)]
        base = {
            impl: {N: index.get((impl, None, *case, N)) for N in Ns}
            for impl in ("sdpa_cudnn", "sdpa_flash")
        }
        dtype, d, causal = case
        lines.append("")
        lines.append(
            f"{f'{dtype}, d = {d}, causal {causal}':28}" + "".join(f"{f'N = {N}':>17}" for N in Ns)
        )
        for label, impl, n in named:
            cells = ""
            for N in Ns:
                r = index.get((impl, n, *case, N))
                if r is None:
                    cells += f"{'-':>17}"
                    continue
                ratios = [
                    f"{r['tflops'] / b[N]['tflops']:5.2f}" if b[N] else f"{'-':>5}"
                    for b in base.values()
                ]
                cells += f"{r['tflops']:5.0f} {' '.join(ratios)}"
            lines.append(f"{label:28}{cells}")
    return lines


# ---- the backward run as chapter 5's Bench and Profile ------------------------------------


def backward_bench(path):
    """The backward rows of a ``gpu_backward.json`` as a :class:`.kernel_runs.Bench`, so that
    chapter 5's rule (:func:`.kernel_runs.step_verdict`) judges a backward
    step as it judges a forward one: backward version ``n`` is the Bench's ``"v{n}"``, SDPA's
    rows keep their names (``"sdpa_flash"``, ``"sdpa_cudnn"``), the run dtype is the file's
    ``dtype``. Every field is checked first (:func:`load_backward`)."""
    meta, rows = load_backward(path)
    out = []
    for i, r in enumerate(rows):
        if r["direction"] != "backward":
            continue
        if "round_ms" not in r or not isinstance(r["round_ms"], list) or not r["round_ms"]:
            raise ValueError(f"{path}: rows[{i}] has no rounds ('round_ms')")
        impl = r["impl"]
        if impl == "flashref":
            n = r["version"]
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{path}: rows[{i}]['version'] = {n!r}; expected a version")
            impl = f"v{n}"
        out.append(
            {
                "impl": impl,
                "run_dtype": r["dtype"],
                "d": r["d"],
                "causal": r["causal"],
                "N": r["N"],
                "tflops": r["tflops"],
                "round_ms": r["round_ms"],
            }
        )
    return Bench({"meta": meta, "rows": out}, Path(path).name)


def backward_profile(path):
    """A ``gpu_backward_profile.json`` as a :class:`flashref.recorded.kernel_runs.Profile`: its rows
    ``"bwd{n}"`` become ``"v{n}"``, so ``counter_lines`` prints backward version ``n``."""
    path = Path(path)
    data = read_json(path)
    check_fields(data, {"meta": dict, "rows": list}, str(path))
    rows = []
    for i, r in enumerate(data["rows"]):
        check_fields(r, {"impl": str, "d": int}, f"{path}: rows[{i}]")
        if not r["impl"].startswith("bwd") or not r["impl"][3:].isdigit():
            raise ValueError(f"{path}: rows[{i}]['impl'] = {r['impl']!r}; expected 'bwd<n>'")
        rows.append({**r, "impl": f"v{int(r['impl'][3:])}"})
    return Profile({"meta": data["meta"], "rows": rows}, path.name)


def stall_sampling_lines(paths: dict, top: int = 5) -> list[str]:
    """Where the warps of one kernel stall, per head dim, from ``python -m flashref.bench
    profile --source N --backward`` files: ``paths`` maps a label (``"bwd8"``) to such a file.
    One line per (label, d): the share of all warp samples of each of the ``top`` reasons
    with the largest share anywhere (``selected``: issuing, not a stall)."""
    tables = {}
    for label, path in paths.items():
        data = read_json(Path(path))
        for i, r in enumerate(data.get("rows", [])):
            check_fields(r, {"d": int, "stall_share": dict}, f"{path}: rows[{i}]")
            tables[label, r["d"]] = r["stall_share"]
    if not tables:
        raise ValueError(f"no rows with stall shares in {list(paths.values())}")
    dims = sorted({d for _, d in tables})
    largest: dict = {}  # reason -> its largest share in any file and d
    for shares in tables.values():
        for reason, x in shares.items():
            largest[reason] = max(x, largest.get(reason, 0.0))
    reasons = sorted(largest, key=lambda x: (-largest[x], x))[:top]
    lines = [f"{'share of samples':18}" + "".join(f"{x:>14}" for x in reasons)]
    for d in dims:
        for label in paths:
            if (label, d) in tables:
                shares = tables[label, d]
                cells = "".join(f"{shares.get(x, 0.0):14.1%}" for x in reasons)
                lines.append(f"{f'{label} d = {d}':18}" + cells)
    return lines


def against_flash_lines(
    rows, picks: dict, at_least: int = 4096, target: float = 0.8, goal: float = 1.0
) -> list[str]:
    """How chosen versions compare with SDPA FLASH's backward at ``N >= at_least``.

    ``picks`` maps a label to a function of (dtype, d, causal, N) and the flashref versions
    measured there (a dict version -> row) that returns the version to take (None: none).
    For each label: the range of TFLOP/s over FLASH's, how many configurations reach
    ``target`` and ``goal``, and the range over cuDNN's.
    """
    index = {
        (r["impl"], r["dtype"], r["d"], r["causal"], r["N"]): r
        for r in rows
        if r["direction"] == "backward" and r["impl"] != "flashref"
    }
    ours: dict = {}
    for r in rows:
        if r["impl"] == "flashref" and r["direction"] == "backward" and r["N"] >= at_least:
            key = (r["dtype"], r["d"], r["causal"], r["N"])
            ours.setdefault(key, {})[r["version"]] = r
    configs = sorted(k for k in ours if ("sdpa_flash", *k) in index)
    lines = [f"N >= {at_least}, {len(configs)} configurations, TFLOP/s over SDPA FLASH's:"]
    for label, pick in picks.items():
        chosen = [(k, pick(*k, ours[k])) for k in configs]
        chosen = [(k, n) for k, n in chosen if n is not None and n in ours[k]]
        if not chosen:
            lines.append(f"  {label}: not in this file")
            continue
        xs = [ours[k][n]["tflops"] / index["sdpa_flash", *k]["tflops"] for k, n in chosen]
        xc = [
            ours[k][n]["tflops"] / index["sdpa_cudnn", *k]["tflops"]
            for k, n in chosen
            if ("sdpa_cudnn", *k) in index
        ]
        names = ", ".join(f"bwd{n}" for n in sorted({n for _, n in chosen}))
        lines.append(
            f"  {label} ({names}): {min(xs):.2f} to {max(xs):.2f};"
            f" >= {target} at {sum(x >= target for x in xs)} of {len(xs)},"
            f" >= {goal} at {sum(x >= goal for x in xs)} of {len(xs)}"
        )
        if xc:
            lines.append(f"    over cuDNN's: {min(xc):.2f} to {max(xc):.2f}")
        below = [(k, n) for (k, n), x in zip(chosen, xs, strict=True) if x < goal]
        if 0 < len(below) <= 3:  # a few: say whether FLASH's rounds were all faster
            for k, n in below:
                flash, mine = index["sdpa_flash", *k], ours[k][n]
                word = compare_rounds(flash, mine) if "round_ms" in mine else NO_SPREAD
                lines.append(
                    f"    below {goal} at {k[0]} d = {k[1]}, causal {k[2]}, N = {k[3]}:"
                    f" {mine['tflops'] / flash['tflops']:.3f}, rounds {word}"
                )
    return lines


def public_against_cudnn_lines(
    rows, large: int = 4096, target_large: float = 0.9, small: int = 1024, target_small: float = 0.8
) -> list[str]:
    """What a user gets: the rows ``flashref_public`` (``flash_attention_backward`` with
    ``version=None``, timed as SDPA's backward is) over SDPA cuDNN's backward of the same
    dtype, d, causal and N. One line for ``N >= large`` and one for ``N == small``: the range
    of the ratio, how many configurations reach the target, and the versions that ran."""
    cudnn = {
        (r["dtype"], r["d"], r["causal"], r["N"]): r["tflops"]
        for r in rows
        if r["impl"] == "sdpa_cudnn" and r["direction"] == "backward"
    }
    public = [
        (r, r["tflops"] / cudnn[r["dtype"], r["d"], r["causal"], r["N"]])
        for r in rows
        if r["impl"] == "flashref_public"
        and r["direction"] == "backward"
        and (r["dtype"], r["d"], r["causal"], r["N"]) in cudnn
    ]
    if not public:
        return ["no flashref_public rows in this file"]
    lines = []
    for label, keep, target in (
        (f"N >= {large}", lambda n: n >= large, target_large),
        (f"N = {small}", lambda n: n == small, target_small),
    ):
        xs = [(r, x) for r, x in public if keep(r["N"])]
        if not xs:
            continue
        ratios = [x for _, x in xs]
        versions = ", ".join(f"bwd{n}" for n in sorted({r["version"] for r, _ in xs}))
        lines.append(
            f"{label}: public call over cuDNN's {min(ratios):.2f} to {max(ratios):.2f};"
            f" >= {target} at {sum(x >= target for x in ratios)} of {len(ratios)}"
            f" ({versions})"
        )
    return lines
