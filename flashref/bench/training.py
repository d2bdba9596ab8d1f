"""The training run chapter 8 prints: the small transformer trained with flashref's attention
and with SDPA, in turn.

    python -m flashref.bench training --steps 300 --out results/gpu_training.json

trains ``flashref.transformer.model``'s model three times on the book's own prose: with
``flashref.torch.attention``, with PyTorch's ``scaled_dot_product_attention`` from the same
seed (the same initial weights and the same batches), and with SDPA from another seed,
whose distance from the first SDPA run says how far apart two equally good runs end. It
writes every loss curve with its provenance (GPU, driver, library versions, date, model
shape, seconds per step, the commit and the source hashes of the kernels the model runs)
as JSON; ``flashref.recorded.training`` reads it back for chapter 8. Needs torch, a CUDA
device and CuPy.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..gpu._runtime import device_cc
from ..gpu.backward import resolve_bwd_version
from ..gpu.forward import resolve_version
from ..transformer.booktext import CharCorpus, book_text
from ..transformer.model import Config, train_in_turn
from . import provenance as prov
from ._common import ClockSampler, write_result
from .cli import ArgumentParser, at_least

PROG = "python -m flashref.bench training"


def provenance(cfg: Config, steps: int, dtype: str, corpus: CharCorpus) -> dict:
    """Where and how the runs were made (``flashref.bench.provenance.provenance``: GPU,
    driver, versions, date, commit, source hashes), with the model, the data and the
    versions ``version=None`` runs for the model's attention on this GPU."""
    import cupy
    import numpy
    import torch

    d = cfg.d_model // cfg.n_heads
    cc = device_cc(cupy)
    versions = {
        "forward": resolve_version(None, dtype, d, True, cc).number,
        "backward": resolve_bwd_version(None, dtype, d, True, cc).number,
    }
    return prov.provenance(
        cupy, torch, forward=[versions["forward"]], backward=[versions["backward"]]
    ) | {
        "torch_cuda": torch.version.cuda,
        "numpy": numpy.__version__,
        "model": dataclasses.asdict(cfg) | {"vocab_size": corpus.vocab_size},
        "steps": steps,
        "dtype": dtype,
        "flashref_versions": versions,
        "text_chars": {"train": len(corpus.train), "val": len(corpus.val)},
    }


def compare(*, steps=300, seed=0, dtype="bfloat16", cfg=None) -> dict:
    """flashref and SDPA from ``seed``, and SDPA from ``seed + 1``, trained in turn
    (``flashref.transformer.model.train_in_turn``): ``{"meta", "runs"}``."""
    cfg = cfg or Config()
    corpus = CharCorpus(book_text())
    plan = [("flashref", seed), ("sdpa", seed), ("sdpa", seed + 1)]
    runs = train_in_turn(plan, steps=steps, dtype=dtype, cfg=cfg, corpus=corpus)
    for run in runs:
        curve = f"loss {run['loss'][0]:.3f} -> {run['loss'][-1]:.3f}, val {run['val_loss']:.3f}"
        print(
            f"{run['attention']:8} seed {run['seed']}: {curve}, "
            f"{run['s_per_step'] * 1e3:.1f} ms/step",
            flush=True,
        )
    return {"meta": provenance(cfg, steps, dtype, corpus) | {"order": "in turn"}, "runs": runs}


def main(argv=None) -> int:
    parser = ArgumentParser(prog=PROG, description=__doc__)
    parser.add_argument("--steps", type=at_least(1), default=300, help="training steps per run")
    parser.add_argument("--seed", type=int, default=0, help="seed of the two compared runs")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--out", type=Path, default=Path("results/gpu_training.json"))
    args = parser.parse_args(argv)
    with ClockSampler(min_util=5) as clocks:  # the SM clock while kernels run (NVML)
        result = compare(steps=args.steps, seed=args.seed, dtype=args.dtype)
    result["meta"]["sm_clock"] = clocks.summary()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(result, args.out)
    print(f"wrote {args.out}")
    return 0
