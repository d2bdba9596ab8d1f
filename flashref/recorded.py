"""Reading the recorded training run and backward benchmark that chapter 8 prints.

``results/gpu_training.json`` is written by ``python -m flashref.charmodel``;
``results/gpu_backward.json`` by the GPU benchmark of the backward kernels;
``results/gpu_training_step.json`` by ``tools/profile_training_step.py``. All are read
with every field checked (a missing key, a wrong type, NaN or infinity is a ValueError
naming the file, the entry and the field), so a chapter never prints from a broken file.
``backward_bench`` and ``backward_profile`` hand the backward run and its counters to
``flashref.reporting``, so that a backward step is judged by the same rule as a forward one.
The standard library only; ``training_figure`` imports matplotlib when it draws.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .reporting import NO_SPREAD, Bench, Profile, best_worst_case, compare_rounds

_NUM = (int, float)
TRAINING_META = {"gpu": str, "driver": str, "torch": str, "cupy": str, "date": str,
                 "model": dict, "steps": int, "dtype": str}  # fmt: skip
TRAINING_RUN = {"attention": str, "seed": int, "loss": list, "val_loss": _NUM,
                "first_step_s": _NUM, "s_per_step": _NUM}  # fmt: skip
BACKWARD_META = {"gpu": str, "driver": str, "date": str}
BACKWARD_ROW = {"impl": str, "direction": str, "dtype": str, "d": int, "causal": bool,
                "N": int, "B": int, "H": int, "ms": _NUM, "ms_min": _NUM, "ms_max": _NUM,
                "tflops": _NUM}  # fmt: skip
# flashref: a version through its internal launch (a study of the kernel); flashref_public:
# the public flash_attention_backward with version=None on torch tensors, timed as SDPA
IMPLS = ("flashref", "flashref_public", "sdpa_flash", "sdpa_cudnn")
DIRECTIONS = ("forward", "backward")


def _read(path: Path) -> dict:
    def no_constant(name):  # json.loads takes NaN and Infinity unless told not to
        raise ValueError(f"{path}: {name} is not a measurement")

    data = json.loads(path.read_text(encoding="utf-8"), parse_constant=no_constant)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _check(obj, fields: dict, where: str) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected an object, got {type(obj).__name__}")
    for key, kind in fields.items():
        if key not in obj:
            raise ValueError(f"{where} has no {key!r}")
        value = obj[key]
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            raise ValueError(f"{where}[{key!r}] = {value!r:.60}; expected {kind}")
        if kind is _NUM and not value >= 0:
            raise ValueError(f"{where}[{key!r}] = {value!r}; expected a number >= 0")


def load_training(path):
    """``(meta, runs)`` from a ``gpu_training.json``, every field checked.

    Each run's ``loss`` must hold ``meta["steps"]`` finite numbers, and there must be a
    flashref run and an SDPA run from the same seed.
    """
    path = Path(path)
    data = _read(path)
    _check(data, {"meta": dict, "runs": list}, str(path))
    meta, runs = data["meta"], data["runs"]
    _check(meta, TRAINING_META, f"{path}: meta")
    for i, run in enumerate(runs):
        where = f"{path}: runs[{i}]"
        _check(run, TRAINING_RUN, where)
        loss = run["loss"]
        if len(loss) != meta["steps"]:
            raise ValueError(f"{where} has {len(loss)} losses; meta says {meta['steps']} steps")
        bad = [j for j, x in enumerate(loss) if not isinstance(x, _NUM) or not x >= 0]
        if bad:
            raise ValueError(f"{where}['loss'][{bad[0]}] = {loss[bad[0]]!r}; expected a loss")
    if _pair(runs) is None:
        raise ValueError(f"{path}: no flashref run with an SDPA run from the same seed")
    return meta, runs


def _pair(runs):
    """The first flashref run and the SDPA run from its seed, or None."""
    for f in runs:
        for s in runs:
            if (f["attention"], s["attention"], f["seed"]) == ("flashref", "sdpa", s["seed"]):
                return f, s
    return None


def end_loss(run, window: int) -> float:
    """Mean training loss over the last ``window`` steps (exactly summed)."""
    tail = run["loss"][-window:]
    return math.fsum(tail) / len(tail)


def training_summary(runs, window: int = 50) -> dict:
    """How far apart the runs end: flashref against SDPA from its seed, and, when recorded,
    that SDPA run against SDPA from another seed (the gap that seeds alone make).

    Returns ``{"window", "flashref", "sdpa", "other_seed"}`` (the runs; ``other_seed`` None
    when absent) and the gaps ``"end_gap"`` (of ``end_loss``), ``"val_gap"`` (of the
    validation losses) and ``"max_step_gap"`` (largest gap of one step's loss, the same
    batch in both runs), with ``"seed_end_gap"``, ``"seed_val_gap"`` when there is another
    seed.
    """
    flash, sdpa = _pair(runs)
    others = [r for r in runs if r["attention"] == "sdpa" and r["seed"] != sdpa["seed"]]
    other = others[0] if others else None
    steps = zip(flash["loss"], sdpa["loss"], strict=True)
    out = {
        "window": window,
        "flashref": flash,
        "sdpa": sdpa,
        "other_seed": other,
        "end_gap": abs(end_loss(flash, window) - end_loss(sdpa, window)),
        "val_gap": abs(flash["val_loss"] - sdpa["val_loss"]),
        "max_step_gap": max(abs(a - b) for a, b in steps),
    }
    if other is not None:
        out["seed_end_gap"] = abs(end_loss(other, window) - end_loss(sdpa, window))
        out["seed_val_gap"] = abs(other["val_loss"] - sdpa["val_loss"])
    return out


STEP_RUN = {"attention": str, "step_ms": _NUM, "forward_backward_host_ms": _NUM,
            "forward_backward_done_ms": _NUM, "profile": dict}  # fmt: skip
STEP_PROFILE = {"cpu_us": _NUM, "gpu_us": _NUM, "attention_us": list}
STEP_SIDES = ("flashref", "sdpa")


def clock_text(c: dict) -> str:
    """A recorded ``sm_clock`` (``ClockSampler.summary``) as ``"1965-1980 MHz"`` (or one value
    where the clock did not move)."""
    lo, hi = c["min_mhz"], c["max_mhz"]
    return f"{lo} MHz" if lo == hi else f"{lo}-{hi} MHz"


def load_step_profile(path):
    """``(meta, runs)`` from the file ``tools/profile_training_step.py --out`` writes, every
    field the chapter reads checked; both sides must be there, each with the profiler's
    attention ranges (two numbers: forward, backward)."""
    path = Path(path)
    data = _read(path)
    _check(data, {"meta": dict, "runs": list}, str(path))
    _check(data["meta"], {"gpu": str, "date": str, "commit": str}, f"{path}: meta")
    for i, run in enumerate(data["runs"]):
        where = f"{path}: runs[{i}]"
        _check(run, STEP_RUN, where)
        _check(run["profile"], STEP_PROFILE, f"{where}['profile']")
        pair = run["profile"]["attention_us"]
        if len(pair) != 2 or not all(isinstance(x, _NUM) and x >= 0 for x in pair):
            raise ValueError(f"{where}['profile']['attention_us'] = {pair!r}; expected two "
                             "numbers >= 0 (forward, backward)")  # fmt: skip
    sides = {run["attention"] for run in data["runs"]}
    if not set(STEP_SIDES) <= sides:
        raise ValueError(f"{path}: runs of {sorted(sides)}; expected both of {STEP_SIDES}")
    return data["meta"], data["runs"]


def step_profile_lines(meta: dict, runs) -> list[str]:
    """What chapter 8 prints of the profiled training step: per side and round, the step's
    wall time, the forward + backward's host time and its completion, the GPU's kernel time
    and the host time of the attention's own ranges, all per step; then how long after the
    host the GPU finished, at most, and whether that is under 2% of the shortest step (the
    step is the host's), and the attention ranges' difference between the sides."""
    by = {side: [r for r in runs if r["attention"] == side] for side in STEP_SIDES}
    clock = f", SM {clock_text(meta['sm_clock'])}" if meta.get("sm_clock") else ""
    lines = [f"{meta['gpu']}, {meta['date']}, commit {meta['commit'][:7]}{clock}: "
             f"{min(len(v) for v in by.values())} rounds a side, interleaved",
             f"{'':10}{'step ms':>14}{'fwd+bwd host':>15}{'done ms':>13}{'GPU ms':>12}"
             f"{'attention us':>15}"]  # fmt: skip

    def pair(values, spec):
        return "  ".join(format(v, spec) for v in values)

    for side, rs in by.items():
        lines.append(
            f"  {side:8}{pair([r['step_ms'] for r in rs], '6.1f'):>14}"
            f"{pair([r['forward_backward_host_ms'] for r in rs], '6.1f'):>15}"
            f"{pair([r['forward_backward_done_ms'] for r in rs], '5.1f'):>13}"
            f"{pair([r['profile']['gpu_us'] / 1e3 for r in rs], '4.1f'):>12}"
            f"{pair([sum(r['profile']['attention_us']) for r in rs], '5.0f'):>15}"
        )
    lag = max(r["forward_backward_done_ms"] - r["forward_backward_host_ms"] for r in runs)
    short = min(r["step_ms"] for r in runs)
    lines.append(f"the GPU done at most {lag:.2f} ms after the host, under 2% of a step: "
                 f"{lag < 0.02 * short}")  # fmt: skip

    def middle(side):
        xs = sorted(sum(r["profile"]["attention_us"]) for r in by[side])
        return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2

    extra = (middle("flashref") - middle("sdpa")) / 1e3
    lines.append(f"attention's ranges, flashref minus SDPA (medians): {extra:+.2f} ms a step")
    return lines


def load_backward(path):
    """``(meta, rows)`` from a ``gpu_backward.json``, every field checked."""
    path = Path(path)
    data = _read(path)
    _check(data, {"meta": dict, "rows": list}, str(path))
    _check(data["meta"], BACKWARD_META, f"{path}: meta")
    for i, row in enumerate(data["rows"]):
        where = f"{path}: rows[{i}]"
        _check(row, BACKWARD_ROW, where)
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
    index = {(r["impl"], r["version"], r["dtype"], r["d"], r["causal"], r["N"]): r
             for r in rows}  # fmt: skip
    Ns = sorted({r["N"] for r in rows})
    lines = [f"{direction}: TFLOP/s, then its ratio to cuDNN's and to FLASH's"]
    for case in sorted({(r["dtype"], r["d"], r["causal"]) for r in rows}):
        versions = sorted({r["version"] for r in rows if r["impl"] == "flashref"
                           and (r["dtype"], r["d"], r["causal"]) == case})  # fmt: skip
        named = [(f"bwd{n}" if direction == "backward" else f"v{n}", "flashref", n)
                 for n in versions]  # fmt: skip
        named += [("SDPA FLASH", "sdpa_flash", None), ("SDPA cuDNN", "sdpa_cudnn", None)]
        base = {impl: {N: index.get((impl, None, *case, N)) for N in Ns}
                for impl in ("sdpa_cudnn", "sdpa_flash")}  # fmt: skip
        dtype, d, causal = case
        lines.append("")
        lines.append(f"{f'{dtype}, d = {d}, causal {causal}':28}"
                     + "".join(f"{f'N = {N}':>17}" for N in Ns))  # fmt: skip
        for label, impl, n in named:
            cells = ""
            for N in Ns:
                r = index.get((impl, n, *case, N))
                if r is None:
                    cells += f"{'-':>17}"
                    continue
                ratios = [f"{r['tflops'] / b[N]['tflops']:5.2f}" if b[N] else f"{'-':>5}"
                          for b in base.values()]  # fmt: skip
                cells += f"{r['tflops']:5.0f} {' '.join(ratios)}"
            lines.append(f"{label:28}{cells}")
    return lines


# ---- the backward run as chapter 5's Bench and Profile ------------------------------------


def backward_bench(path):
    """The backward rows of a ``gpu_backward.json`` as a :class:`flashref.reporting.Bench`,
    so that chapter 5's rule (:func:`flashref.reporting.step_verdict`) judges a backward
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
        out.append({"impl": impl, "run_dtype": r["dtype"], "d": r["d"], "causal": r["causal"],
                    "N": r["N"], "tflops": r["tflops"], "round_ms": r["round_ms"]})  # fmt: skip
    return Bench({"meta": meta, "rows": out}, Path(path).name)


def backward_profile(path):
    """A ``gpu_backward_profile.json`` as a :class:`flashref.reporting.Profile`: its rows
    ``"bwd{n}"`` become ``"v{n}"``, so ``counter_lines`` prints backward version ``n``."""
    path = Path(path)
    data = _read(path)
    _check(data, {"meta": dict, "rows": list}, str(path))
    rows = []
    for i, r in enumerate(data["rows"]):
        _check(r, {"impl": str, "d": int}, f"{path}: rows[{i}]")
        if not r["impl"].startswith("bwd") or not r["impl"][3:].isdigit():
            raise ValueError(f"{path}: rows[{i}]['impl'] = {r['impl']!r}; expected 'bwd<n>'")
        rows.append({**r, "impl": f"v{int(r['impl'][3:])}"})
    return Profile({"meta": data["meta"], "rows": rows}, path.name)


def best_backward(rows, allowed) -> dict:
    """For each (dtype, d, causal) of the backward rows, the flashref version among
    ``allowed`` that ``version=None`` should take: the book's rule
    (``flashref.reporting.best_worst_case``, the highest worst-case ratio to the fastest over
    the sequence lengths) that chose ``BWD_PREFERENCE`` and ``BWD_HOPPER_PREFERENCE``."""
    allowed = set(allowed)
    by_case: dict = {}
    for r in rows:
        if r["impl"] == "flashref" and r["direction"] == "backward" and r["version"] in allowed:
            case = by_case.setdefault((r["dtype"], r["d"], r["causal"]), {})
            case.setdefault(r["version"], {})[r["N"]] = r["tflops"]
    return {case: best_worst_case(by_version) for case, by_version in sorted(by_case.items())}


def stall_sampling_lines(paths: dict, top: int = 5) -> list[str]:
    """Where the warps of one kernel stall, per head dim, from ``python -m flashref.bench
    profile --source N --backward`` files: ``paths`` maps a label (``"bwd8"``) to such a file.
    One line per (label, d): the share of all warp samples of each of the ``top`` reasons
    with the largest share anywhere (``selected``: issuing, not a stall)."""
    tables = {}
    for label, path in paths.items():
        data = _read(Path(path))
        for i, r in enumerate(data.get("rows", [])):
            _check(r, {"d": int, "stall_share": dict}, f"{path}: rows[{i}]")
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


def against_flash_lines(rows, picks: dict, at_least: int = 4096, target: float = 0.8,
                        goal: float = 1.0) -> list[str]:  # fmt: skip
    """How chosen versions compare with SDPA FLASH's backward at ``N >= at_least``.

    ``picks`` maps a label to a function of (dtype, d, causal, N) and the flashref versions
    measured there (a dict version -> row) that returns the version to take (None: none).
    For each label: the range of TFLOP/s over FLASH's, how many configurations reach
    ``target`` and ``goal``, and the range over cuDNN's.
    """
    index = {(r["impl"], r["dtype"], r["d"], r["causal"], r["N"]): r
             for r in rows if r["direction"] == "backward" and r["impl"] != "flashref"}  # fmt: skip
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
        xc = [ours[k][n]["tflops"] / index["sdpa_cudnn", *k]["tflops"]
              for k, n in chosen if ("sdpa_cudnn", *k) in index]  # fmt: skip
        names = ", ".join(f"bwd{n}" for n in sorted({n for _, n in chosen}))
        lines.append(f"  {label} ({names}): {min(xs):.2f} to {max(xs):.2f};"
                     f" >= {target} at {sum(x >= target for x in xs)} of {len(xs)},"
                     f" >= {goal} at {sum(x >= goal for x in xs)} of {len(xs)}")  # fmt: skip
        if xc:
            lines.append(f"    over cuDNN's: {min(xc):.2f} to {max(xc):.2f}")
        below = [(k, n) for (k, n), x in zip(chosen, xs, strict=True) if x < goal]
        if 0 < len(below) <= 3:  # a few: say whether FLASH's rounds were all faster
            for k, n in below:
                flash, mine = index["sdpa_flash", *k], ours[k][n]
                word = compare_rounds(flash, mine) if "round_ms" in mine else NO_SPREAD
                lines.append(f"    below {goal} at {k[0]} d = {k[1]}, causal {k[2]}, N = {k[3]}:"
                             f" {mine['tflops'] / flash['tflops']:.3f}, rounds {word}")  # fmt: skip
    return lines


def public_against_cudnn_lines(
    rows, large: int = 4096, target_large: float = 0.9, small: int = 1024, target_small: float = 0.8
) -> list[str]:
    """What a user gets: the rows ``flashref_public`` (``flash_attention_backward`` with
    ``version=None``, timed as SDPA's backward is) over SDPA cuDNN's backward of the same
    dtype, d, causal and N. One line for ``N >= large`` and one for ``N == small``: the range
    of the ratio, how many configurations reach the target, and the versions that ran."""
    cudnn = {(r["dtype"], r["d"], r["causal"], r["N"]): r["tflops"] for r in rows
             if r["impl"] == "sdpa_cudnn" and r["direction"] == "backward"}  # fmt: skip
    public = [(r, r["tflops"] / cudnn[r["dtype"], r["d"], r["causal"], r["N"]]) for r in rows
              if r["impl"] == "flashref_public" and r["direction"] == "backward"
              and (r["dtype"], r["d"], r["causal"], r["N"]) in cudnn]  # fmt: skip
    if not public:
        return ["no flashref_public rows in this file"]
    lines = []
    for label, keep, target in ((f"N >= {large}", lambda n: n >= large, target_large),
                                (f"N = {small}", lambda n: n == small, target_small)):  # fmt: skip
        xs = [(r, x) for r, x in public if keep(r["N"])]
        if not xs:
            continue
        ratios = [x for _, x in xs]
        versions = ", ".join(f"bwd{n}" for n in sorted({r["version"] for r, _ in xs}))
        lines.append(f"{label}: public call over cuDNN's {min(ratios):.2f} to {max(ratios):.2f};"
                     f" >= {target} at {sum(x >= target for x in ratios)} of {len(ratios)}"
                     f" ({versions})")  # fmt: skip
    return lines


# ---- the training run ------------------------------------------------------------------------


def training_lines(meta: dict, runs, summary: dict) -> list[str]:
    """What chapter 8 prints of a training record: the run, each run's step time, the end
    and validation losses, and the two gaps (``training_summary``) side by side."""
    m, s, w = meta["model"], summary, summary["window"]
    lines = [f"{meta['gpu']}, torch {meta['torch']}, {meta['date']}: {m.get('n_layers')} layers,"
             f" d_model {m.get('d_model')}, {meta['steps']} steps in {meta['dtype']}"]  # fmt: skip
    if meta.get("sm_clock"):  # the model on a line of its own
        head, model = lines[0].split(": ", 1)
        lines[0:1] = [f"{head}, SM {clock_text(meta['sm_clock'])}:", f"  {model}"]
    lines.append(f"{'':18}{'ms per step':>12}{f'loss, last {w}':>15}{'validation':>12}")
    for key in ("flashref", "sdpa", "other_seed"):
        run = s[key]
        if run is not None:
            name = f"{run['attention']}, seed {run['seed']}"
            lines.append(f"  {name:16}{run['s_per_step'] * 1e3:12.1f}"
                         f"{end_loss(run, w):15.3f}{run['val_loss']:12.3f}")  # fmt: skip
    lines.append(f"flashref against SDPA, same seed: end gap {s['end_gap']:.3f},"
                 f" validation gap {s['val_gap']:.3f}")  # fmt: skip
    if s["other_seed"] is not None:
        lines.append(f"SDPA against SDPA, other seed:    end gap {s['seed_end_gap']:.3f},"
                     f" validation gap {s['seed_val_gap']:.3f}")  # fmt: skip
        lines.append("flashref's validation loss as close to SDPA's as two seeds' are: "
                     f"{s['val_gap'] <= s['seed_val_gap']}")  # fmt: skip
    flash, sdpa = s["flashref"], s["sdpa"]
    ratio = flash["s_per_step"] / sdpa["s_per_step"]
    lines.append(f"flashref's step over SDPA's, same seed: {ratio:.2f}")
    return lines


def training_figure(summary: dict):
    """The loss curves of the runs and, below, each run's loss minus SDPA's from the same
    seed; returns the matplotlib figure (matplotlib is imported here, on demand)."""
    import matplotlib.pyplot as plt

    s = summary
    fig, (ax, gap) = plt.subplots(2, 1, figsize=(8, 3.8), sharex=True, height_ratios=(2, 1))
    color = {}
    for key in ("flashref", "sdpa", "other_seed"):
        run = s[key]
        if run is not None:
            name = f"{run['attention']}, seed {run['seed']}"
            color[key] = ax.plot(run["loss"], lw=1, label=name)[0].get_color()
    ax.set(ylabel="training loss (nats per char)")
    ax.legend()
    base = s["sdpa"]
    for key in ("flashref", "other_seed"):
        run = s[key]
        if run is not None:
            diff = [a - b for a, b in zip(run["loss"], base["loss"], strict=True)]
            label = (f"{run['attention']}, seed {run['seed']} minus {base['attention']},"
                     f" seed {base['seed']}")  # fmt: skip
            gap.plot(diff, lw=1, color=color[key], label=label)
    gap.axhline(0, color="gray", lw=0.5)
    gap.set(xlabel="step", ylabel="loss difference")
    gap.legend(fontsize=8.5, ncol=2, loc="lower center")  # one row: less of the curves hidden
    return fig
