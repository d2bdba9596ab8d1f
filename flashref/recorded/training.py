"""Reading the recorded training run and its step profile that chapter 8 prints.

``results/gpu_training.json`` is written by ``python -m flashref.bench training``;
``results/gpu_training_step.json`` by ``python -m flashref.bench training_step``. Both are read with
every field checked (``flashref.recorded.files``: a missing key, a wrong type, NaN or
infinity is a ValueError naming the file, the entry and the field), so a chapter never
prints from a broken file. The standard library only; ``training_figure`` imports
matplotlib when it draws.
"""

from __future__ import annotations

import math
from pathlib import Path

from .files import NUM, check_fields, read_json

TRAINING_META = {
    "gpu": str,
    "driver": str,
    "torch": str,
    "cupy": str,
    "date": str,
    "model": dict,
    "steps": int,
    "dtype": str,
}
TRAINING_RUN = {
    "attention": str,
    "seed": int,
    "loss": list,
    "val_loss": NUM,
    "first_step_s": NUM,
    "s_per_step": NUM,
}


def load_training(path):
    """``(meta, runs)`` from a ``gpu_training.json``, every field checked.

    Each run's ``loss`` must hold ``meta["steps"]`` finite numbers, and there must be a
    flashref run and an SDPA run from the same seed.
    """
    path = Path(path)
    data = read_json(path)
    check_fields(data, {"meta": dict, "runs": list}, str(path))
    meta, runs = data["meta"], data["runs"]
    check_fields(meta, TRAINING_META, f"{path}: meta")
    for i, run in enumerate(runs):
        where = f"{path}: runs[{i}]"
        check_fields(run, TRAINING_RUN, where)
        loss = run["loss"]
        if len(loss) != meta["steps"]:
            raise ValueError(f"{where} has {len(loss)} losses; meta says {meta['steps']} steps")
        bad = [j for j, x in enumerate(loss) if not isinstance(x, NUM) or not x >= 0]
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


STEP_RUN = {
    "attention": str,
    "step_ms": NUM,
    "forward_backward_host_ms": NUM,
    "forward_backward_done_ms": NUM,
    "profile": dict,
}
STEP_PROFILE = {"cpu_us": NUM, "gpu_us": NUM, "attention_us": list}
STEP_SIDES = ("flashref", "sdpa")


def clock_text(c: dict) -> str:
    """A recorded ``sm_clock`` (``ClockSampler.summary``) as ``"1965-1980 MHz"`` (or one value
    where the clock did not move)."""
    lo, hi = c["min_mhz"], c["max_mhz"]
    return f"{lo} MHz" if lo == hi else f"{lo}-{hi} MHz"


def load_step_profile(path):
    """``(meta, runs)`` from the file ``python -m flashref.bench training_step --out`` writes, every
    field the chapter reads checked; both sides must be there, each with the profiler's
    attention ranges (two numbers: forward, backward)."""
    path = Path(path)
    data = read_json(path)
    check_fields(data, {"meta": dict, "runs": list}, str(path))
    check_fields(data["meta"], {"gpu": str, "date": str, "commit": str}, f"{path}: meta")
    for i, run in enumerate(data["runs"]):
        where = f"{path}: runs[{i}]"
        check_fields(run, STEP_RUN, where)
        check_fields(run["profile"], STEP_PROFILE, f"{where}['profile']")
        pair = run["profile"]["attention_us"]
        if len(pair) != 2 or not all(isinstance(x, NUM) and x >= 0 for x in pair):
            raise ValueError(
                f"{where}['profile']['attention_us'] = {pair!r}; expected two "
                "numbers >= 0 (forward, backward)"
            )
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
    lines = [
        f"{meta['gpu']}, {meta['date']}, commit {meta['commit'][:7]}{clock}: "
        f"{min(len(v) for v in by.values())} rounds a side, interleaved",
        f"{'':10}{'step ms':>14}{'fwd+bwd host':>15}{'done ms':>13}{'GPU ms':>12}"
        f"{'attention us':>15}",
    ]

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
    lines.append(
        f"the GPU done at most {lag:.2f} ms after the host, under 2% of a step: "
        f"{lag < 0.02 * short}"
    )

    def middle(side):
        xs = sorted(sum(r["profile"]["attention_us"]) for r in by[side])
        return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2

    extra = (middle("flashref") - middle("sdpa")) / 1e3
    lines.append(f"attention's ranges, flashref minus SDPA (medians): {extra:+.2f} ms a step")
    return lines


# ---- the training run ------------------------------------------------------------------------


def training_lines(meta: dict, runs, summary: dict) -> list[str]:
    """What chapter 8 prints of a training record: the run, each run's step time, the end
    and validation losses, and the two gaps (``training_summary``) side by side."""
    m, s, w = meta["model"], summary, summary["window"]
    lines = [
        f"{meta['gpu']}, torch {meta['torch']}, {meta['date']}: {m.get('n_layers')} layers,"
        f" d_model {m.get('d_model')}, {meta['steps']} steps in {meta['dtype']}"
    ]
    if meta.get("sm_clock"):  # the model on a line of its own
        head, model = lines[0].split(": ", 1)
        lines[0:1] = [f"{head}, SM {clock_text(meta['sm_clock'])}:", f"  {model}"]
    lines.append(f"{'':18}{'ms per step':>12}{f'loss, last {w}':>15}{'validation':>12}")
    for key in ("flashref", "sdpa", "other_seed"):
        run = s[key]
        if run is not None:
            name = f"{run['attention']}, seed {run['seed']}"
            lines.append(
                f"  {name:16}{run['s_per_step'] * 1e3:12.1f}"
                f"{end_loss(run, w):15.3f}{run['val_loss']:12.3f}"
            )
    lines.append(
        f"flashref against SDPA, same seed: end gap {s['end_gap']:.3f},"
        f" validation gap {s['val_gap']:.3f}"
    )
    if s["other_seed"] is not None:
        lines.append(
            f"SDPA against SDPA, other seed:    end gap {s['seed_end_gap']:.3f},"
            f" validation gap {s['seed_val_gap']:.3f}"
        )
        lines.append(
            "flashref's validation loss as close to SDPA's as two seeds' are: "
            f"{s['val_gap'] <= s['seed_val_gap']}"
        )
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
            label = (
                f"{run['attention']}, seed {run['seed']} minus {base['attention']},"
                f" seed {base['seed']}"
            )
            gap.plot(diff, lw=1, color=color[key], label=label)
    gap.axhline(0, color="gray", lw=0.5)
    gap.set(xlabel="step", ylabel="loss difference")
    gap.legend(fontsize=8.5, ncol=2, loc="lower center")  # one row: less of the curves hidden
    return fig
