"""Reading the recorded training run and backward benchmark that chapter 8 prints.

``results/gpu_training.json`` is written by ``python -m flashref.charmodel``;
``results/gpu_backward.json`` by the GPU benchmark of the backward kernels;
``results/gpu_calls.json`` (its host rows) by ``python -m flashref.bench calls``. Both are read
with every field checked (a missing key, a wrong type, NaN or infinity is a ValueError
naming the file, the entry and the field), so a chapter never prints from a broken file.
NumPy and the standard library only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

_NUM = (int, float)
TRAINING_META = {"gpu": str, "driver": str, "torch": str, "cupy": str, "date": str,
                 "model": dict, "steps": int, "dtype": str}  # fmt: skip
TRAINING_RUN = {"attention": str, "seed": int, "loss": list, "val_loss": _NUM,
                "first_step_s": _NUM, "s_per_step": _NUM}  # fmt: skip
BACKWARD_META = {"gpu": str, "driver": str, "date": str}
BACKWARD_ROW = {"impl": str, "direction": str, "dtype": str, "d": int, "causal": bool,
                "N": int, "B": int, "H": int, "ms": _NUM, "ms_min": _NUM, "ms_max": _NUM,
                "tflops": _NUM}  # fmt: skip
IMPLS = ("flashref", "sdpa_flash", "sdpa_cudnn")
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


ADAPTER_STEP = "flashref.torch.attention forward + backward"  # the host row of bench calls


def step_host_share(runs, n_layers: int, calls_path) -> dict:
    """How much of the training run's longer step is the attention call's host time.

    ``runs``: the training runs (``load_training``); ``calls_path``: a ``gpu_calls.json``
    whose host rows time ``flashref.torch.attention``'s forward and backward beside SDPA's
    at a tiny shape (``bench calls``). Returns ``{"flashref_ms", "sdpa_ms"`` (per step, the
    runs from one seed), ``"gap_ms"``, ``"flashref_us"``, ``"sdpa_us"`` (host time of one
    forward + backward), ``"host_ms"`` (``n_layers`` calls a step: the extra host time per
    step), ``"share"`` (of the gap), ``"shape"``, ``"date"``, ``"commit"}``.
    """
    flash, sdpa = _pair(runs)
    data = _read(Path(calls_path))
    rows = [r for r in data.get("host", []) if str(r.get("call", "")).startswith(ADAPTER_STEP)]
    if not rows:
        raise ValueError(f"{calls_path}: no host row of {ADAPTER_STEP!r}")
    row = rows[0]
    _check(row, {"flashref_us": _NUM, "sdpa_us": _NUM}, f"{calls_path}: {row['call']!r}")
    gap_ms = (flash["s_per_step"] - sdpa["s_per_step"]) * 1e3
    host_ms = n_layers * (row["flashref_us"] - row["sdpa_us"]) / 1e3
    meta = data.get("meta", {})
    return {
        "flashref_ms": flash["s_per_step"] * 1e3,
        "sdpa_ms": sdpa["s_per_step"] * 1e3,
        "gap_ms": gap_ms,
        "flashref_us": row["flashref_us"],
        "sdpa_us": row["sdpa_us"],
        "host_ms": host_ms,
        "share": host_ms / gap_ms if gap_ms > 0 else None,
        "shape": row["call"][len(ADAPTER_STEP) :].strip(),
        "date": meta.get("date"),
        "commit": str(meta.get("commit", ""))[:7],
    }


def step_host_lines(h: dict, n_layers: int, calls_name: str) -> list[str]:
    """``step_host_share``'s result as the lines chapter 8 prints."""
    return [
        f"step: flashref {h['flashref_ms']:.1f} ms, SDPA {h['sdpa_ms']:.1f} ms, "
        f"{h['flashref_ms'] / h['sdpa_ms']:.2f} times, {h['gap_ms']:.1f} ms more",
        f"host time of one forward + backward {h['shape']} ({calls_name}, {h['date']}):",
        f"  flashref {h['flashref_us']:.0f} us, SDPA {h['sdpa_us']:.0f} us",
        f"{n_layers} layers a step: {h['host_ms']:.2f} ms of the {h['gap_ms']:.1f} ms"
        + ("" if h["share"] is None else f" ({h['share']:.0%})"),
    ]


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
    """Lines of a table: flashref's TFLOP/s beside SDPA FLASH's and cuDNN's, and the ratios,
    for every (dtype, d, causal, N) and flashref version measured in ``direction``."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    rows = [r for r in rows if r["direction"] == direction]
    index = {(r["impl"], r["dtype"], r["d"], r["causal"], r["N"]): r for r in rows}
    ours = sorted(
        (r for r in rows if r["impl"] == "flashref"),
        key=lambda r: (r["dtype"], r["d"], r["causal"], r["N"], str(r["version"])),
    )
    lines = [f"{direction}, TFLOP/s",
             f"{'dtype':9}{'d':>4} {'causal':7}{'N':>6} {'version':>7}{'flashref':>9}"
             f"{'FLASH':>7}{'cuDNN':>7}{'/ FLASH':>8}{'/ cuDNN':>8}"]  # fmt: skip
    for r in ours:
        key = (r["dtype"], r["d"], r["causal"], r["N"])
        base = [index.get((impl, *key)) for impl in ("sdpa_flash", "sdpa_cudnn")]
        tf = [f"{b['tflops']:7.0f}" if b else f"{'-':>7}" for b in base]
        ratio = [f"{r['tflops'] / b['tflops']:8.2f}" if b else f"{'-':>8}" for b in base]
        shape = f"{r['dtype']:9}{r['d']:>4} {r['causal']!s:7}{r['N']:>6} {r['version']!s:>7}"
        lines.append(f"{shape}{r['tflops']:9.0f}{''.join(tf)}{''.join(ratio)}")
    return lines
