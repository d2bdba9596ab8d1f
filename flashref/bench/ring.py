"""Run ring attention on this machine's GPUs (NCCL) or CPUs (gloo), check it, time it.

    torchrun --nproc-per-node 2 -m flashref.bench ring --gpus 2 --seq 131072 [--layout zigzag]
             [--causal] [--dtype bf16] [--check] [--no-multicast] [--out results/gpu_ring.json]
    python -m flashref.bench ring --cpu 3 --seq 96 --layout zigzag --causal --check

One process per device, each running ``flashref.ring.dist.ring_forward`` on its shard.
Under ``torchrun`` (any number of nodes: its rendezvous, ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK``; each process uses GPU ``LOCAL_RANK``) this process is one of them;
started plainly, it starts them itself (``torch.multiprocessing.spawn``, one host, a file
rendezvous). Rank 0 draws seeded q, k, v of shape ``(batch, heads, seq, head_dim)`` and
broadcasts them; every rank keeps its shard.

The environment is the user's: ``--no-multicast`` sets ``MULTICAST_OFF`` (NCCL's, torch's
and NVSHMEM's NVLink multicast off) in every process, for a machine whose GPUs must not use
it; without it nothing is set. Under ``torchrun`` set them in the launching shell instead
(``NCCL_NVLS_ENABLE=0 torchrun ...``): NCCL reads them when it starts, and the flag sets
them in this process before NCCL starts.

``--check`` gathers the output on rank 0 and compares it with attention on the whole
sequence on one device: on CPUs (float64) ``flashref.naive_attention``, relative error at
most 1e-12 (as tests/ring/test_ring.py); on GPUs, on 64 query rows spread over the sequence,
the float64 reference, with the tolerance of tests/gpu/test_forward.py (``flashref.gpu.tolerances``:
twice the error of a same-precision naive attention on those rows, plus a floor), and
the whole output against flashref's single-GPU forward, within the dtype's ceiling.

On GPUs it also times the ring forward (CUDA events, median of ``--reps`` after
``--warmup``, the slowest rank each time) against the single-GPU forward of the whole
sequence on rank 0's GPU in the same run, the fraction of ideal (single / W over ring),
and per step the compute and transfer time on the two streams and the hidden share of
the transfer. It prints a table and writes JSON with provenance to ``--out``.

(A module of its own rather than ``python -m flashref.ring``: ``import flashref`` already
imports ``flashref.ring``, and running an imported module as ``__main__`` makes Python warn
and hold two copies of it.)
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from .._checks import check_causal, check_qkv, check_scale
from ..attention import naive_attention
from ..gpu import gpu_unavailable_reason
from ..gpu.forward import resolve_version
from ..ring.simulate import check_layout
from . import ring_check
from ._common import write_result
from .cli import ArgumentParser, at_least

DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
RTOL64 = 1e-12  # float64: see tests/ring/test_ring.py


PROG = "python -m flashref.bench ring"


# NVLink multicast (NVLS) off in NCCL, torch's symmetric memory and NVSHMEM: --no-multicast
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def multicast_off() -> None:
    """Set ``MULTICAST_OFF`` in ``os.environ`` (processes started after inherit it); a
    ``NCCL_NVLS_ENABLE`` already set to another value is an error, not overwritten."""
    value = os.environ.get("NCCL_NVLS_ENABLE")
    if value not in (None, "0"):
        raise RuntimeError(
            f"NCCL_NVLS_ENABLE is set to {value!r} and --no-multicast asks for 0: unset it or "
            "leave out --no-multicast"
        )
    os.environ.update(MULTICAST_OFF)


def torchrun_ranks() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_rank)`` when this process was started by ``torchrun``
    (its environment variables), else None."""
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    if not all(n in os.environ for n in names):
        return None
    return tuple(int(os.environ[n]) for n in names)


def spawn(fn, nprocs: int, *args) -> None:
    """Run ``fn(rank, nprocs, init_method, *args)`` in ``nprocs`` new processes on this host.

    They inherit this process's environment and meet through a file (``init_method``) in a
    fresh temporary directory, so no port can be taken already.
    """
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init_method = f"file://{os.path.join(tmp, 'rendezvous')}"
        mp.spawn(fn, args=(nprocs, init_method, *args), nprocs=nprocs, join=True)


ATTEND = ("reference", "flash")


def _gather(O, lse, pairs, layout, group=None):
    """Every rank's ``(O, lse, pairs)`` of ``group`` (default: all), in sequence order:
    ``(O, lse, pairs (W, W))``."""
    import torch
    import torch.distributed as dist

    from ..ring.dist import unshard

    W = dist.get_world_size(group)
    Os, lses = [torch.empty_like(O) for _ in range(W)], [torch.empty_like(lse) for _ in range(W)]
    dist.all_gather(Os, O, group=group)
    dist.all_gather(lses, lse, group=group)
    all_pairs = [None] * W
    dist.all_gather_object(all_pairs, pairs, group=group)
    lse = unshard([x[..., None] for x in lses], layout)[..., 0]  # (..., N)
    return unshard(Os, layout), lse, np.array(all_pairs).T  # (..., N, dv), (..., N), (W, W)


def _gloo_rank(rank, n, init_method, q, k, v, causal, layout, scale, attend, out_path, spare):
    """One of ``n`` processes; with ``spare`` > 0 the ring is the group of the last
    ``n - spare`` ranks (``ring_forward(group=)``) and the first ``spare`` only look on."""
    import torch
    import torch.distributed as dist

    from ..ring import dist as rd

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=n)
    try:
        group = dist.new_group(list(range(spare, n))) if spare else None  # every rank calls it
        if rank < spare:
            return
        r, W = rank - spare, n - spare  # the rank in the ring's group, its size
        fn = rd.reference_attend if attend == "reference" else rd.flash_attend_from_cpu
        parts = [rd.shard(torch.from_numpy(x), r, W, layout) for x in (q, k, v)]
        out = rd.ring_forward(
            *parts,
            N=q.shape[-2],
            causal=causal,
            layout=layout,
            attend=fn,
            scale=scale,
            group=group,
        )
        O, lse, pairs = _gather(*out, layout, group)
        if r == 0:
            np.savez(out_path, O=O.numpy(), lse=lse.numpy(), pairs=pairs)
    finally:
        dist.destroy_process_group()


def ring_attention_gloo(
    q,
    k,
    v,
    *,
    world_size,
    causal=False,
    layout="contiguous",
    scale=None,
    attend="reference",
    spare=0,
):
    """``flashref.ring_attention`` run by ``world_size`` real processes talking over gloo.

    NumPy arrays ``(..., N, d)`` in (one sequence: ``q`` and ``k`` of one length and the
    same heads), NumPy out: ``(O, lse, pairs)``, ``pairs (W, W)`` as ``RingSchedule.pairs``
    (step, rank). ``attend="reference"``: each rank computes in the inputs' dtype with
    ``reference_attend``; ``"flash"``: with flashref's kernel on GPU 0 (float16 inputs),
    so that the pairs a ring gives the kernel are tested on a machine with one GPU.
    ``spare``: as many more processes, ranks 0 .. spare - 1, outside the ring: the ring runs
    in the process group of the others (``ring_forward(group=)``), as in a larger mesh.
    """
    q, k, v, dtype, G = check_qkv(q, k, v)
    if G != 1 or q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"ring_attention_gloo takes q, k, v of one sequence with the same heads; got q "
            f"{q.shape}, k {k.shape} (grouped heads are for flashref.ring_attention)"
        )
    causal = check_causal(causal) is not None  # self-attention: Nq == Nk, both alignments agree
    check_layout(q.shape[-2], world_size, layout)
    scale = check_scale(scale, q.shape[-1], q.dtype)
    if attend not in ATTEND:
        raise ValueError(f"attend must be one of {ATTEND}, got {attend!r}")
    if attend == "flash" and dtype != np.float16:
        raise TypeError(f"attend='flash' takes float16 q, k, v (the kernel's dtype), got {dtype}")
    dtype = dtype.newbyteorder("=")  # torch takes native byte order only
    q, k, v = (np.ascontiguousarray(x, dtype=dtype) for x in (q, k, v))  # one dtype
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.npz")
        if isinstance(spare, bool) or not isinstance(spare, int) or spare < 0:
            raise ValueError(f"spare must be an int >= 0, got {spare!r}")
        spawn(_gloo_rank, world_size + spare, q, k, v, causal, layout, scale, attend, path, spare)
        with np.load(path) as f:
            return f["O"], f["lse"], f["pairs"]


def parse(argv):
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--gpus", type=at_least(1), help="processes, one per GPU, talking over NCCL")
    where.add_argument(
        "--cpu", type=at_least(1), help="processes on the CPU, talking over gloo (float64)"
    )
    p.add_argument("--seq", type=at_least(1), required=True, help="sequence length N")
    p.add_argument("--batch", type=at_least(1), default=1)
    p.add_argument("--heads", type=at_least(1), default=8)
    p.add_argument("--head-dim", type=at_least(1), default=128)
    p.add_argument("--layout", choices=("contiguous", "zigzag"), default="contiguous")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="GPU dtype")
    p.add_argument("--check", action="store_true", help="compare with one-device attention")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    p.add_argument("--warmup", type=at_least(0), default=2)
    p.add_argument("--reps", type=at_least(1), default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--no-multicast",
        action="store_true",
        help="NVLink multicast off in every process (NCCL_NVLS_ENABLE=0, ...)",
    )
    args = p.parse_args(argv)
    for name in ("gpus", "cpu", "seq", "batch", "heads", "head_dim", "reps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.no_multicast and os.environ.get("NCCL_NVLS_ENABLE") not in (None, "0"):
        p.error(
            f"NCCL_NVLS_ENABLE is set to {os.environ['NCCL_NVLS_ENABLE']!r} and --no-multicast "
            "asks for 0: unset it or leave out --no-multicast"
        )
    launched = torchrun_ranks()
    if launched is not None and launched[1] != (args.gpus or args.cpu):
        p.error(
            f"torchrun started {launched[1]} processes but --{'gpus' if args.gpus else 'cpu'} "
            f"asks for {args.gpus or args.cpu}: give the same number to both"
        )
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        p.error(f"ring attention runs under torch.distributed, and torch is not installed ({exc})")
    try:
        check_layout(args.seq, args.gpus or args.cpu, args.layout)
    except ValueError as exc:
        p.error(f"--seq {args.seq}: {exc}")
    if args.gpus:
        _check_gpus(p, args)
    return args


def _check_gpus(p, args):
    """Everything a GPU run needs, before any process starts."""
    import torch
    import torch.distributed as dist

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    launched = torchrun_ranks()
    if launched is not None:  # one process of this node: its GPU is LOCAL_RANK
        if launched[2] >= have:
            p.error(f"LOCAL_RANK {launched[2]}: torch sees {have} CUDA GPU(s) on this node")
    elif have < args.gpus:
        p.error(f"--gpus {args.gpus}: torch sees {have} CUDA GPU(s) on this machine")
    if not dist.is_nccl_available():
        p.error("--gpus: this torch was built without NCCL")
    reason = gpu_unavailable_reason()
    if reason:
        p.error(f"--gpus: flashref.gpu cannot run: {reason}")
    for causal in {False, args.causal}:  # a causal ring also runs unmasked pairs
        try:
            resolve_version(None, DTYPES[args.dtype], args.head_dim, causal)
        except ValueError as exc:
            p.error(f"--head-dim {args.head_dim}: {exc}")


def _setup(rank, W, init_method, gpu, local_rank):
    import torch
    import torch.distributed as dist

    if gpu:
        import cupy

        torch.cuda.set_device(local_rank)
        cupy.cuda.Device(local_rank).use()
        device = torch.device("cuda", local_rank)
        dist.init_process_group(
            "nccl", init_method=init_method, rank=rank, world_size=W, device_id=device
        )
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=W)
    return device


def _rank_main(rank, W, init_method, args, result_path, local_rank=None):
    import torch
    import torch.distributed as dist

    from ..ring import dist as rd

    gpu = bool(args.gpus)
    device = _setup(rank, W, init_method, gpu, rank if local_rank is None else local_rank)
    try:
        dtype = getattr(torch, DTYPES[args.dtype]) if gpu else torch.float64
        shape = (args.batch, args.heads, args.seq, args.head_dim)  # (B, H, N, d)
        gen = torch.Generator(device=device).manual_seed(args.seed)
        full = [torch.randn(shape, generator=gen, device=device, dtype=dtype) for _ in "qkv"]
        for x in full:
            dist.broadcast(x, src=0)  # rank 0's draw is everyone's
        q, k, v = (rd.shard(x, rank, W, args.layout) for x in full)  # (B, H, N/W, d)
        if rank != 0:
            full = None  # only rank 0 needs the whole sequence (check, single-GPU time)
        attend = rd.flash_attend if gpu else rd.reference_attend
        kw = dict(N=args.seq, causal=args.causal, layout=args.layout, attend=attend)
        O, lse, pairs = _gather(*rd.ring_forward(q, k, v, **kw), args.layout)
        result = {"pairs": pairs.tolist()}  # (steps, ranks)
        if args.check and rank == 0:
            check = ring_check.check_gpu if gpu else _check_cpu
            result["check"] = check(*full, O, lse, args.causal)
        del O, lse
        if gpu:
            result.update(ring_check.bench(rank, W, q, k, v, full, kw, args))
        if rank == 0:
            Path(result_path).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _check_cpu(q, k, v, O, lse, causal):
    O_ref, lse_ref = naive_attention(
        q.numpy(), k.numpy(), v.numpy(), causal=causal, return_lse=True
    )
    err = ring_check.rel(O.numpy(), O_ref)
    lse_err = ring_check.rel(lse.numpy(), lse_ref)
    return {
        "reference": "flashref.naive_attention, float64",
        "rel_err": err,
        "lse_rel_err": lse_err,
        "tolerance": RTOL64,
        "passed": bool(err <= RTOL64 and lse_err <= RTOL64),
    }


def main(argv=None) -> int:
    args = parse(argv)
    W = args.gpus or args.cpu
    if args.no_multicast:
        multicast_off()  # before NCCL starts, here and in the processes spawned
    launched = torchrun_ranks()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "result.json")
        if launched is None:
            spawn(_rank_main, W, args, path)
        else:  # this process is rank launched[0] of torchrun's W
            _rank_main(launched[0], W, "env://", args, path, local_rank=launched[2])
            if launched[0] != 0:
                return 0  # rank 0 reports
        result = json.loads(Path(path).read_text())
    shape = {
        "batch": args.batch,
        "heads": args.heads,
        "seq": args.seq,
        "head_dim": args.head_dim,
        "layout": args.layout,
        "causal": args.causal,
        "dtype": DTYPES[args.dtype] if args.gpus else "float64",
    }
    prov = ring_check.provenance(args, W)
    result = ring_check.summarise({"provenance": prov, "shape": shape, **result})
    ring_check.print_table(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_result(result, args.out)
        print(f"wrote {args.out}")
    return 0 if result.get("check", {}).get("passed", True) else 1
