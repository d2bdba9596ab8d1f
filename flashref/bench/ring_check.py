"""The GPU half of ``python -m flashref.bench ring``: the check, the timings, the table.

``check_gpu`` compares the gathered ring output with attention on the whole sequence,
``bench`` times the ring forward beside the single-GPU forward and reads each step's CUDA
events (``ring_dist.step_times``), ``summarise`` turns the times into the fraction of ideal
and the hidden share of the transfers, ``print_table`` prints them, ``provenance`` says
where they were measured. Rank functions: ``dist`` is initialised when they run.
"""

from __future__ import annotations

import datetime
import json
import os
import platform

import numpy as np

from ..gpu.tolerances import CEILING, LSE_TOL, tolerance

CHECK_ROWS = 64  # query rows compared with the float64 reference


def rel(a, b) -> float:
    """Normwise relative error in float64; NaN anywhere gives NaN, which fails every <=."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _gather_objects(x, W):
    import torch.distributed as dist

    out = [None] * W
    dist.all_gather_object(out, x)
    return out


def check_gpu(q, k, v, O, lse, causal):
    import torch

    from ..ring.dist import flash_attend

    dtype, N, d = str(q.dtype).removeprefix("torch."), q.shape[-2], q.shape[-1]
    scale = d**-0.5
    O_one, _ = flash_attend(q, k, v, causal=causal, scale=scale)  # the single-GPU forward
    rows = torch.linspace(0, N - 1, CHECK_ROWS, device=q.device).round().long().unique()
    S = (q[..., rows, :].double() @ k.double().transpose(-1, -2)) * scale  # (B, H, rows, N)
    hide = torch.arange(N, device=q.device)[None, :] > rows[:, None]  # (rows, N)
    if causal:
        S = S.masked_fill(hide, -torch.inf)
    lse_ref = torch.logsumexp(S, -1)  # (B, H, rows)
    O_ref = torch.softmax(S, -1) @ v.double()  # (B, H, rows, d)
    del S

    def rnd(x):  # a same-precision naive attention stores every intermediate in dtype
        return x.to(q.dtype).float()

    S = rnd((q[..., rows, :].float() @ k.float().transpose(-1, -2)) * scale)
    if causal:
        S = S.masked_fill(hide, -torch.inf)
    P = rnd(torch.exp(rnd(S - S.amax(-1, keepdim=True))))
    O_naive = rnd(rnd(P / P.sum(-1, keepdim=True)).to(q.dtype) @ v)
    del S, P
    cpu = {
        n: x.cpu().numpy() if x.dtype == torch.float64 else x.float().cpu().numpy()
        for n, x in dict(
            O=O[..., rows, :],
            one=O_one[..., rows, :],
            naive=O_naive,
            ref=O_ref,
            lse=lse[..., rows],
            lse_ref=lse_ref,
        ).items()
    }
    err, naive_err = rel(cpu["O"], cpu["ref"]), rel(cpu["naive"], cpu["ref"])
    tol = tolerance(dtype, naive_err)
    lse_err = float(np.max(np.abs(cpu["lse"] - cpu["lse_ref"]) / (1 + np.abs(cpu["lse_ref"]))))
    whole = rel(O.float().cpu().numpy(), O_one.float().cpu().numpy())
    nan = int(torch.isnan(O).sum())
    diff = np.abs(cpu["O"] - cpu["ref"])  # (B, H, rows, d)
    worst = np.unravel_index(np.argmax(np.where(np.isnan(diff), np.inf, diff)), diff.shape)
    return {
        "reference": f"float64 on {len(rows)} query rows; flashref single-GPU forward",
        "rel_err": err,
        "single_gpu_rel_err": rel(cpu["one"], cpu["ref"]),
        "naive_rel_err": naive_err,
        "tolerance": tol,
        "lse_err": lse_err,
        "lse_tolerance": LSE_TOL,
        "vs_single_gpu_rel": whole,
        "vs_single_gpu_tolerance": CEILING[dtype],
        "nan_count": nan,
        "worst_element": {
            "index (B, H, row, d)": [
                int(worst[0]),
                int(worst[1]),
                int(rows[worst[2]]),
                int(worst[3]),
            ],
            "got": float(cpu["O"][worst]),
            "ref": float(cpu["ref"][worst]),
        },
        "passed": bool(nan == 0 and err <= tol and lse_err <= LSE_TOL and whole <= CEILING[dtype]),
    }


def bench(rank, W, q, k, v, full, kw, args):
    """Ring time (slowest rank, median), per-step times per rank, single-GPU time on rank 0."""
    import torch
    import torch.distributed as dist

    from ..ring import dist as rd

    for _ in range(args.warmup):
        rd.ring_forward(q, k, v, **kw)
    ring_ms, steps = [], []
    for _ in range(args.reps):
        timings = []
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        dist.barrier()  # every rank starts together
        start.record()
        rd.ring_forward(q, k, v, **kw, timings=timings)
        end.record()
        torch.cuda.synchronize()
        t = torch.tensor([start.elapsed_time(end)], device=q.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the ring is as slow as its slowest rank
        ring_ms.append(t.item())
        steps.append(rd.step_times(timings))
    per_step = [
        {key: float(np.median([rep[s][key] for rep in steps])) for key in steps[0][s]}
        for s in range(W)
    ]
    out = {
        "ring_ms_all": ring_ms,
        "steps": _gather_objects(per_step, W),
        "devices": _gather_objects(torch.cuda.get_device_name(rank), W),
    }
    if rank == 0:
        q1, k1, v1 = full

        def one():
            return rd.flash_attend(q1, k1, v1, causal=args.causal, scale=args.head_dim**-0.5)

        for _ in range(args.warmup):
            one()
        single = []
        for _ in range(args.reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            one()
            end.record()
            torch.cuda.synchronize()
            single.append(start.elapsed_time(end))
        out["single_ms_all"] = single
    dist.barrier()
    return out


def provenance(args, W) -> dict:
    import torch

    prov = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "processes": W,
        "backend": "nccl" if args.gpus else "gloo",
        "env": {
            n: os.environ.get(n)
            for n in (
                "NCCL_NVLS_ENABLE",
                "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                "NVSHMEM_DISABLE_NVLS",
            )
        },
    }
    if args.gpus:
        import cupy

        nccl = torch.cuda.nccl.version()
        prov["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        prov["cupy"] = cupy.__version__
        from .provenance import driver_version

        prov["driver"] = driver_version(cupy.cuda.runtime)
        prov["timing"] = (
            f"CUDA events; median of {args.reps} forwards after {args.warmup} "
            "warm-up; ring time = slowest rank per forward"
        )
    else:
        prov["cpu"] = platform.processor() or platform.machine()
    return prov


def summarise(result: dict) -> dict:
    """Medians, the fraction of ideal and the hidden share of the transfers."""
    if "ring_ms_all" not in result:
        return result
    ring, single = np.median(result["ring_ms_all"]), np.median(result["single_ms_all"])
    W = result["provenance"]["processes"]
    rows = [s for rank in result["steps"] for s in rank if "comm_ms" in s]
    comm = sum(s["comm_ms"] for s in rows)
    hidden = 1.0 - sum(s["exposed_ms"] for s in rows) / comm if comm > 0 else None
    return {
        **result,
        "ring_ms": float(ring),
        "single_ms": float(single),
        "ideal_ms": float(single / W),
        "fraction_of_ideal": float(single / W / ring),
        "hidden_fraction": hidden,
    }


def print_table(result: dict) -> None:
    s, prov = result["shape"], result["provenance"]
    print(
        f"ring attention: {prov['processes']} x {prov['backend']}, (B, H, N, d) = "
        f"({s['batch']}, {s['heads']}, {s['seq']}, {s['head_dim']}), {s['dtype']}, "
        f"{s['layout']}, causal={s['causal']}"
    )
    if "check" in result:
        c = result["check"]
        print(
            f"check: {'passed' if c['passed'] else 'FAILED'}: rel err {c['rel_err']:.3e} "
            f"(tolerance {c['tolerance']:.3e}) against {c['reference']}"
        )
        if not c["passed"]:
            print(json.dumps(c, indent=1))
    if "ring_ms" in result:
        print(
            f"{', '.join(result['devices'])}; driver {prov['driver']}, torch {prov['torch']}, "
            f"NCCL {prov['nccl']}"
        )
        print(
            f"ring {result['ring_ms']:.2f} ms, single GPU {result['single_ms']:.2f} ms, "
            f"ideal {result['ideal_ms']:.2f} ms: {100 * result['fraction_of_ideal']:.1f}% of "
            "ideal"
        )
        print(
            f"{'rank':>4} {'step':>4} {'compute ms':>10} {'comm ms':>8} {'exposed ms':>10} "
            f"{'hidden':>6}"
        )
        for r, steps in enumerate(result["steps"]):
            for i, st in enumerate(steps):
                comm = (
                    f"{st['comm_ms']:8.3f} {st['exposed_ms']:10.3f} {100 * st['hidden']:5.1f}%"
                    if "comm_ms" in st
                    else f"{'-':>8} {'-':>10} {'-':>6}"
                )
                print(f"{r:4d} {i:4d} {st['compute_ms']:10.3f} {comm}")
        if result["hidden_fraction"] is not None:
            print(f"transfer time hidden behind compute: {100 * result['hidden_fraction']:.1f}%")
