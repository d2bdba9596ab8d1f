"""Where a step of chapter 8's training run spends its time: flashref's attention against SDPA's.

    python -m flashref.bench training_step [--attention flashref sdpa] [--steps 10]
                                           [--device cuda] [--out gpu_training_step.json]

Chapter 8 records the training run through ``flashref.torch.attention`` beside the same run
through SDPA (``results/gpu_training.json``); this tool says where such a step spends its
time (chapter 8 prints ``results/gpu_training_step.json``, which it wrote). For each
attention, twice, interleaved, it builds ``flashref.transformer.model``'s model from seed 0, runs
five warm-up steps, then

* times ``--steps`` whole steps (forward, backward, clipping, AdamW, ``loss.item()``), the
  median wall time per step;
* times the forward and backward alone, before and after the GPU has finished them (the host
  time, and the host time plus what the GPU still had to do);
* profiles ``--steps`` steps with ``torch.profiler``: per step, each operator's self CPU
  time and calls (the largest), the CUDA runtime and driver calls, the GPU time of all
  kernels, and the inclusive CPU time of the attention's own ranges (``ATTENTION_RANGES``).

It prints the tables, and with ``--out`` writes them as JSON with the run's provenance (on a
GPU ``flashref.bench.training.provenance``'s: device, driver, versions, date, the commit and
the source hashes of the kernels the model runs). Needs torch; ``--attention flashref`` needs a CUDA
device and CuPy. On a machine without a GPU, ``--device cpu --attention sdpa`` runs the same
steps on the CPU (a check of the tool, not a measurement for the book).
"""

from __future__ import annotations

import datetime
import platform
import statistics
import time
from pathlib import Path

from flashref.bench import training
from flashref.bench._common import ClockSampler
from flashref.bench.provenance import git_commit
from flashref.transformer import model as charmodel

from ._common import write_result
from .cli import ArgumentParser, at_least

API_PREFIXES = ("cuda", "cu")  # the CUDA runtime's and driver's calls, as the profiler names them
# The profiler's ranges of one attention call, forward and backward, each side (inclusive CPU
# time): flashref's autograd Function (without the Python of flashref.torch.attention before
# it: its checks are a dictionary lookup) and its backward node; SDPA's operator and its
# backward node, whatever backend SDPA picked
ATTENTION_RANGES = {
    "flashref": ("_EagerAttention", "autograd::engine::evaluate_function: _EagerAttentionBackward"),
    "sdpa": (
        "aten::scaled_dot_product_attention",
        "autograd::engine::evaluate_function: ScaledDotProduct",
    ),
}


def summarize(events, steps: int, top: int = 25, attention: str | None = None) -> dict:
    """Per step, from ``torch.profiler``'s ``key_averages()`` (or anything with ``key``,
    ``count``, ``self_cpu_time_total``, ``cpu_time_total`` and ``self_device_time_total`` in
    microseconds): ``{"cpu_us", "gpu_us", "operators": [[name, self CPU us, calls], ...]
    (the ``top`` largest self CPU times), "api": {name: [calls, self CPU us]},
    "attention_us": [forward, backward]}``: the last, with ``attention`` ("flashref" or
    "sdpa"), the inclusive CPU time of that side's ``ATTENTION_RANGES`` (None without)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be a positive int, got {top!r}")
    events = list(events)

    def gpu(e):
        return getattr(e, "self_device_time_total", 0) or 0

    if attention is not None and attention not in ATTENTION_RANGES:
        raise ValueError(f"attention must be one of {sorted(ATTENTION_RANGES)}, got {attention!r}")
    ranked = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    inclusive = None
    if attention is not None:
        forward, backward = ATTENTION_RANGES[attention]
        inclusive = [
            sum(e.cpu_time_total for e in events if e.key == forward) / steps,
            sum(e.cpu_time_total for e in events if e.key.startswith(backward)) / steps,
        ]
    return {
        "attention_us": inclusive,
        "cpu_us": sum(e.self_cpu_time_total for e in events) / steps,
        "gpu_us": sum(gpu(e) for e in events) / steps,
        "operators": [[e.key, e.self_cpu_time_total / steps, e.count / steps] for e in ranked],
        "api": {
            e.key: [e.count / steps, e.self_cpu_time_total / steps]
            for e in events
            if e.key.startswith(API_PREFIXES)
        },
    }


def _step_fn(attention: str, device: str, seed: int = 0):
    """One training step of chapter 8's model, as ``flashref.transformer.model.train`` runs it
    (``charmodel.training_parts``), and its forward and backward alone."""

    cfg = charmodel.Config()
    corpus = charmodel.CharCorpus(charmodel.book_text())
    model, loss_of, update = charmodel.training_parts(
        attention, seed=seed, dtype="bfloat16", device=device, cfg=cfg, corpus=corpus
    )
    batches = corpus.batches(batch_size=cfg.batch_size, context=cfg.context, seed=seed)

    def forward_backward():
        loss = loss_of(*next(batches))
        model.zero_grad(set_to_none=True)  # as update does before its backward
        loss.backward()
        return loss

    def step():
        loss = loss_of(*next(batches))
        update(loss)
        return loss.item()  # waits for the step, as charmodel.train's loop does

    return step, forward_backward


def measure(attention: str, device: str, steps: int) -> dict:
    """The timings and the profile of one attention's steps (see the module's docstring)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def sync():
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()

    step, forward_backward = _step_fn(attention, device)
    for _ in range(5):
        step()
    wall = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        wall.append(time.perf_counter() - t0)
    host, done = [], []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        forward_backward()
        host.append(time.perf_counter() - t0)
        sync()
        done.append(time.perf_counter() - t0)
    activities = [ProfilerActivity.CPU]
    if torch.device(device).type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
    return {
        "attention": attention,
        "step_ms": statistics.median(wall) * 1e3,
        "forward_backward_host_ms": statistics.median(host) * 1e3,
        "forward_backward_done_ms": statistics.median(done) * 1e3,
        "profile": summarize(prof.key_averages(), steps, attention=attention),
    }


def lines(run: dict, top: int = 15) -> list[str]:
    """A run's timings, its largest operators and its runtime/driver calls, as text."""
    p = run["profile"]
    out = [
        f"{run['attention']}: step {run['step_ms']:.2f} ms; forward + backward: host "
        f"{run['forward_backward_host_ms']:.2f} ms, done {run['forward_backward_done_ms']:.2f}"
        f" ms; profiled per step: CPU {p['cpu_us'] / 1e3:.2f} ms, GPU {p['gpu_us'] / 1e3:.2f}"
        " ms"
    ]
    if p.get("attention_us"):
        fwd, bwd = p["attention_us"]
        out.append(f"  attention's ranges, CPU us per step: forward {fwd:.1f}, backward {bwd:.1f}")
    out.append(f"  {'operator (self CPU us per step, calls per step)':64}{'us':>9}{'calls':>7}")
    for name, us, calls in p["operators"][:top]:
        out.append(f"  {name[:64]:64}{us:9.1f}{calls:7.1f}")
    for name, (calls, us) in sorted(p["api"].items(), key=lambda kv: -kv[1][1]):
        out.append(f"  api {name[:60]:60}{us:9.1f}{calls:7.1f}")
    return out


def provenance(device: str, steps: int) -> dict:
    """On a GPU, ``flashref.bench.training.provenance``'s (GPU, driver, versions, the model, the
    commit and the source hashes of the kernel versions the model's attention runs); on the
    CPU (a check of the tool) the processor, versions, date and commit."""
    import torch

    common = {"profiled_steps": steps, "rounds": 2, "tool": PROG}
    if torch.device(device).type == "cuda":
        cfg = charmodel.Config()
        corpus = charmodel.CharCorpus(charmodel.book_text())
        return training.provenance(cfg, steps, "bfloat16", corpus) | common
    return {
        "device": platform.processor(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "commit": git_commit(),
    } | common


PROG = "python -m flashref.bench training_step"


def main(argv=None) -> int:
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--attention", nargs="+", default=["flashref", "sdpa"], choices=("flashref", "sdpa")
    )
    parser.add_argument("--steps", type=at_least(1), default=10, help="steps timed and profiled")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, help="write the runs as JSON here")
    args = parser.parse_args(argv)
    import torch  # missing: one line and exit 3 (cli.run)

    if "flashref" in args.attention and torch.device(args.device).type != "cuda":
        parser.error(f"--attention flashref runs on a CUDA device, not --device {args.device}")

    runs = []
    with ClockSampler(min_util=5) as clocks:  # the SM clock while kernels run (NVML)
        for attention in args.attention * 2:  # interleaved: a drift of the machine hits both
            run = measure(attention, args.device, args.steps)
            print(*lines(run), sep="\n", flush=True)
            runs.append(run)
    if args.out:
        meta = provenance(args.device, args.steps) | {"sm_clock": clocks.summary()}
        data = {"meta": meta, "runs": runs}
        write_result(data, args.out)
        print(f"wrote {args.out}")
    return 0
