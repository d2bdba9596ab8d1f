"""Serving benchmark: the paged cache on the GPU as a decode loop replays it.

    python -m flashref.bench serving [--rounds 3] [--dtypes float16] [--sections ...] [--out PATH]

Four measurements, both replayed from CUDA graphs (``flashref.bench.timing.graph_time``:
inputs rotated among copies that together overflow the L2, device events around a replay),
each beside a baseline captured and replayed the same way in the same run:

- **Paged decode** (``decode``): ``PagedDecodePlan.run`` (the plan of
  ``flashref.gpu.DevicePagedKVCache.plan``) on pools of ``page_size`` 64 and 128 whose
  pages are in a random order (a cache that has served other sequences), every sequence
  full, beside SDPA cuDNN's decode on a contiguous cache of the same keys (grouped heads
  through ``enable_gqa``, or K/V repeated where cuDNN refuses that: the row's note says).
  The shapes of the decode benchmark (``flashref.bench decode``): Nq = 1, d = 128, Hq = 32,
  Hkv 32 or 8, B 1, 8, 32, Nk 4096 and 32768. GB/s = bytes of K and V / time.
- **Append** (``append``): ``DevicePagedKVCache.append`` of a step's new K and V for
  B = 64 sequences (Hkv = 8, d = 128) and n new tokens each, beside ``torch.Tensor.copy_``
  of the same bytes between two contiguous buffers. GB/s = bytes of K and V written / time.
- **Chunked prefill** (``prefill``): a 4096-token prompt's attention in chunks of 512 through
  ``flashref.gpu.paged_prefill_attention`` (pages of 128 in a random order, bottom-right
  causal, the chunks' K/V already in the pools, key splits chosen by the default), beside
  the same chunks with one split (``splits=1``), one causal ``flash_attention`` over the
  contiguous prompt and SDPA cuDNN's; B = 1, (H, d) = (32, 128) and (16, 64).
- **Generation** (``generation``): the chapter 8 model (trained here for 300 steps with SDPA)
  generating greedily with ``flashref.transformer.generate.PagedGenerator`` beside
  ``StaticSDPAGenerator``, B = 1 and 32: tokens per second of the replayed steps, the tokens'
  agreement, and the host-device copies the profiler sees in the replay loop.

Writes ``results/gpu_serving.json`` (or ``--out``) with its provenance: GPU, driver,
versions, date, SM clocks over the run, the commit and the hash of the decode version's
source and of the kernels that are not numbered versions (``other_sources``: the cache's
``paged_cache.cu``, the prefill's ``paged_prefill.cu``, includes pasted in).
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

from flashref.gpu import DevicePagedKVCache, PagedDecodePlan, flash_attention
from flashref.gpu._runtime import require_gpu
from flashref.gpu.decode import HOPPER_DEFAULT_VERSION
from flashref.gpu.registry import KERNEL_DIR, paste_includes
from flashref.transformer.booktext import CharCorpus, book_text
from flashref.transformer.generate import GENERATORS, generator, greedy_logits
from flashref.transformer.model import VAL_SEED, Config, train

from ._common import ClockSampler, import_torch, write_result
from .cli import ArgumentParser, at_least
from .provenance import provenance, source_hash
from .roofs import device_facts, hbm_roof
from .timing.graph_time import CapturedCalls, graph_calls, input_sets

HQ, NQ, D = 32, 1, 128
BATCHES, KV_HEADS, CONTEXTS = (1, 8, 32), (32, 8), (4096, 32768)
PAGE_SIZES = (64, 128)
APPEND_B, APPEND_HKV, APPEND_TOKENS = 64, 8, (1, 16, 128, 512)
REPLAYS = 5
SECTIONS = ("decode", "append", "prefill", "generation")
OTHER_SOURCES = ("decode/paged_cache.cu", "decode/paged_prefill.cu")  # not numbered versions
PROG = "python -m flashref.bench serving"
OUT = Path("results/gpu_serving.json")


def paged_pool(torch, k, ps, gen):
    """k (B, Hkv, Nk, D) as a pool of pages in a random order and its block table."""
    B, Hkv, Nk, d = k.shape
    n = Nk // ps
    pages = k.reshape(B, Hkv, n, ps, d).transpose(1, 2).reshape(B * n, Hkv, ps, d)
    perm = torch.randperm(B * n, generator=gen)
    pool = torch.empty(pages.shape, dtype=pages.dtype, device=pages.device)  # contiguous
    pool[perm.cuda()] = pages  # page j of the sequences goes to slot perm[j] of the pool
    table = perm.reshape(B, n).to(torch.int32).cuda()
    return pool, table


def _sdpa(torch, q, k, v):
    """(run, note): SDPA cuDNN on q, k, v, grouped heads through enable_gqa or repeated."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdpa = torch.nn.functional.scaled_dot_product_attention
    for how in ("enable_gqa", "repeated") if k.shape[1] != q.shape[1] else ("plain",):
        kk, vv = k, v
        if how == "repeated":
            G = q.shape[1] // k.shape[1]
            kk, vv = (x.repeat_interleave(G, dim=1) for x in (k, v))

        def run(kk=kk, vv=vv, gqa=how == "enable_gqa"):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return sdpa(q, kk, vv, enable_gqa=gqa)

        try:
            run()
            torch.cuda.synchronize()
            return run, {
                "plain": None,
                "enable_gqa": "enable_gqa=True",
                "repeated": "K/V repeated to Hq heads (not timed)",
            }[how]
        except Exception as exc:  # cuDNN may refuse a shape
            note = f"{how}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return None, f"refused: {note}"


def _replayed(torch, cp, calls, rounds) -> tuple[float, list[float]]:
    graph = CapturedCalls(torch, cp, calls)
    times = [graph.replay_us(REPLAYS) for _ in range(rounds)]
    return statistics.median(times), times


def decode_rows(ctx, dtype, rounds) -> list[dict]:
    torch, cp = ctx["torch"], ctx["cp"]
    rows = []
    for Nk in CONTEXTS:
        for Hkv in KV_HEADS:
            for B in BATCHES:
                kv_bytes = 2 * B * Hkv * Nk * D * 2
                sets = input_sets(kv_bytes, ctx["l2_bytes"])
                base = {
                    "dtype": dtype,
                    "B": B,
                    "Hq": HQ,
                    "Hkv": Hkv,
                    "Nq": NQ,
                    "Nk": Nk,
                    "d": D,
                    "bytes": kv_bytes,
                    "graph_sets": sets,
                }
                free = torch.cuda.mem_get_info()[0]
                if (1 + len(PAGE_SIZES)) * sets * kv_bytes > 0.8 * free:
                    rows.append(
                        {
                            **base,
                            "note": "not run: the pools and the contiguous "
                            "cache would not fit in memory",
                        }
                    )
                    continue
                gen = torch.Generator().manual_seed(B * 1000 + Hkv + Nk)
                dt = getattr(torch, dtype)
                inputs = [
                    tuple(
                        torch.randn(s, generator=gen).to(dt).cuda()
                        for s in ((B, HQ, NQ, D), (B, Hkv, Nk, D), (B, Hkv, Nk, D))
                    )
                    for _ in range(sets)
                ]
                calls = graph_calls(kv_bytes, sets)
                row = dict(base, graph_calls=calls)
                cudnn = []
                for q, k, v in inputs:
                    run, note = _sdpa(torch, q, k, v)
                    if run is None:
                        break
                    cudnn.append(run)
                row["cudnn_note"] = note
                if len(cudnn) == sets:
                    us, times = _replayed(
                        torch, cp, [cudnn[i % sets] for i in range(calls)], rounds
                    )
                    row["cudnn_us"], row["cudnn_round_us"] = us, times
                    row["cudnn_gbps"] = kv_bytes / us * 1e-3
                    want = cudnn[0]().float()
                for ps in PAGE_SIZES:
                    plans = []
                    for q, k, v in inputs:
                        kp, table = paged_pool(torch, k, ps, torch.Generator().manual_seed(7))
                        vp, _ = paged_pool(torch, v, ps, torch.Generator().manual_seed(7))
                        lengths = torch.full((B,), Nk, dtype=torch.int32, device="cuda")
                        plan = PagedDecodePlan(q, kp, vp, table, lengths)
                        plans.append((plan, q, kp, vp, table, lengths))
                    us, times = _replayed(
                        torch,
                        cp,
                        [(lambda p=plans[i % sets]: p[0].run(*p[1:4])) for i in range(calls)],
                        rounds,
                    )
                    key = f"paged{ps}"
                    row[f"{key}_us"], row[f"{key}_round_us"] = us, times
                    row[f"{key}_gbps"] = kv_bytes / us * 1e-3
                    row[f"{key}_splits"] = plans[0][0].decode.num_splits
                    row[f"{key}_version"] = plans[0][0].decode.version
                    if "cudnn_us" in row:
                        row[f"{key}_ratio_to_cudnn"] = row["cudnn_us"] / us
                        got = plans[0][0].run(*plans[0][1:4]).float()
                        row[f"{key}_rel_diff_to_cudnn"] = float((got - want).norm() / want.norm())
                    del plans
                rows.append(row)
                print(
                    f"[{dtype} B={B} Hkv={Hkv} Nk={Nk}] cuDNN {row.get('cudnn_gbps', 0):.0f}"
                    + "".join(f", paged{ps} {row[f'paged{ps}_gbps']:.0f}" for ps in PAGE_SIZES)
                    + " GB/s",
                    file=sys.stderr,
                )
                del inputs, cudnn
                torch.cuda.empty_cache()
    return rows


def append_rows(ctx, dtype, rounds) -> list[dict]:
    torch, cp = ctx["torch"], ctx["cp"]
    rows = []
    dt = getattr(torch, dtype)
    for n in APPEND_TOKENS:
        ps = 64
        per_seq = -(-n // ps) + 1
        cache = DevicePagedKVCache(
            APPEND_B * per_seq,
            ps,
            APPEND_HKV,
            D,
            max_batch=APPEND_B,
            max_pages_per_seq=per_seq,
            max_step_tokens=APPEND_B * n,
            dtype=dtype,
        )
        seqs = [cache.new_sequence() for _ in range(APPEND_B)]
        cache.begin_step(seqs, n)
        new = torch.randn((2, APPEND_B, APPEND_HKV, n, D), device="cuda").to(dt)
        written = 2 * new[0].numel() * 2
        sets = 1
        calls = graph_calls(written, sets)

        def append(c=cache, k=new[0], v=new[1]):
            c.append(0, k, v)

        us, times = _replayed(torch, cp, [append] * calls, rounds)
        src, dst = new.clone(), torch.empty_like(new)
        cus, ctimes = _replayed(torch, cp, [lambda s=src, t=dst: t.copy_(s)] * calls, rounds)
        torch.cuda.synchronize()
        K, V = cache.gather(seqs[-1], 0)
        exact = bool(torch.equal(K, new[0, -1]) and torch.equal(V, new[1, -1]))
        rows.append(
            {
                "dtype": dtype,
                "B": APPEND_B,
                "Hkv": APPEND_HKV,
                "n": n,
                "d": D,
                "page_size": ps,
                "bytes_written": written,
                "graph_calls": calls,
                "append_us": us,
                "append_round_us": times,
                "append_gbps": written / us * 1e-3,
                "copy_us": cus,
                "copy_round_us": ctimes,
                "copy_gbps": written / cus * 1e-3,
                "ratio_to_copy": cus / us,
                "fraction_of_hbm_copy": 2 * written / us * 1e-3 / ctx["copy_gbps"],
                "exact": exact,
            }
        )
        print(
            f"[append B={APPEND_B} n={n}] {written / us * 1e-3:.0f} GB/s written, copy_ "
            f"{written / cus * 1e-3:.0f}",
            file=sys.stderr,
        )
        del cache, new, src, dst
        torch.cuda.empty_cache()
    return rows


GEN_BATCHES, GEN_PROMPT, GEN_NEW, GEN_TRAIN_STEPS = (1, 32), 64, 192, 300
PREFILL_N, PREFILL_CHUNK, PREFILL_SHAPES = 4096, 512, ((32, 128), (16, 64))  # (H, d), B = 1
PREFILL_PAGE = 128


def prefill_rows(ctx, dtype, rounds) -> list[dict]:
    """A PREFILL_N-token prompt's attention in chunks of PREFILL_CHUNK through the paged cache
    (``paged_prefill_attention``, bottom-right, pages in a random order; the chunks' K/V
    already in the pools) beside one causal ``flash_attention`` over the contiguous prompt,
    and SDPA cuDNN's, each a whole prompt per graph call."""
    rows = []
    for H, d in PREFILL_SHAPES:
        rows.append(_prefill_row(ctx, dtype, H, d, rounds))
        ctx["torch"].cuda.empty_cache()
    return rows


def _prefill_row(ctx, dtype, H, d, rounds) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashref.gpu._launch import device_facts as gpu_facts
    from flashref.gpu.decode.prefill import BC, BR, default_splits, paged_prefill_attention

    torch, cp = ctx["torch"], ctx["cp"]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    gen = torch.Generator().manual_seed(H + d)
    q, k, v = (
        torch.randn((1, H, PREFILL_N, d), generator=gen).to(getattr(torch, dtype)).cuda()
        for _ in range(3)
    )
    kp, table = paged_pool(torch, k, PREFILL_PAGE, torch.Generator().manual_seed(5))
    vp, _ = paged_pool(torch, v, PREFILL_PAGE, torch.Generator().manual_seed(5))
    starts = range(0, PREFILL_N, PREFILL_CHUNK)
    chunks = [q[:, :, c : c + PREFILL_CHUNK].contiguous() for c in starts]
    lens = [torch.tensor([c + PREFILL_CHUNK], dtype=torch.int32, device="cuda") for c in starts]

    def chunked(splits=None):
        return [
            paged_prefill_attention(x, kp, vp, table, n, splits=splits)
            for x, n in zip(chunks, lens, strict=True)
        ]

    def one():
        return flash_attention(q, k, v, causal=True)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(q, k, v, is_causal=True)

    row = {
        "dtype": dtype,
        "B": 1,
        "H": H,
        "d": d,
        "N": PREFILL_N,
        "chunk": PREFILL_CHUNK,
        "page_size": PREFILL_PAGE,
        "flops": 2 * H * PREFILL_N**2 * d,
        "splits": default_splits(-(-PREFILL_CHUNK // BR) * H, -(-PREFILL_N // BC), gpu_facts()[2]),
    }
    for name, fn in (
        ("chunked", chunked),
        ("chunked_one_split", lambda: chunked(1)),
        ("one_forward", one),
        ("cudnn", cudnn),
    ):
        us, times = _replayed(torch, cp, [fn] * 4, rounds)
        row[f"{name}_us"], row[f"{name}_round_us"] = us, times
        row[f"{name}_tflops"] = row["flops"] / us * 1e-6
    row["ratio_to_one_forward"] = row["one_forward_us"] / row["chunked_us"]
    row["ratio_to_cudnn"] = row["cudnn_us"] / row["chunked_us"]
    row["ratio_to_one_split"] = row["chunked_one_split_us"] / row["chunked_us"]
    got, want = torch.cat(chunked(), dim=2).float(), one().float()
    row["rel_diff_to_one_forward"] = float((got - want).norm() / want.norm())
    # what each chunk's kernels take (the profiler's device times, one eager prompt), beside
    # the key tiles of each chunk's longest work tile: a fixed cost per launch and a cost per
    # tile (flashref.recorded.decode.prefill_fit)
    sms = gpu_facts()[2]
    for name, splits in (("default", None), ("one_split", 1)):
        kernels = _device_times(torch, lambda s=splits: chunked(s))
        row.setdefault("chunk_kernel_us", {})[name] = [
            t for n, t in kernels if n == "paged_prefill"
        ]
        row.setdefault("combine_kernel_us", {})[name] = [
            t for n, t in kernels if n == "paged_prefill_combine"
        ]
        row.setdefault("chunk_longest_tiles", {})[name] = [
            _longest_tiles(c + PREFILL_CHUNK, PREFILL_CHUNK, H, splits, PREFILL_N, sms)
            for c in starts
        ]
    print(
        f"[prefill H={H} d={d}] chunked {row['chunked_us']:.0f} us ({row['splits']} splits; "
        f"one split {row['chunked_one_split_us']:.0f}), one forward "
        f"{row['one_forward_us']:.0f} us, cuDNN {row['cudnn_us']:.0f} us",
        file=sys.stderr,
    )
    return row


def _device_times(torch, fn) -> list[tuple[str, float]]:
    """(kernel name, device us) of each kernel ``fn`` launches, in order (torch.profiler)."""
    fn()
    torch.cuda.synchronize()
    cuda = torch.profiler.ProfilerActivity.CUDA
    with torch.profiler.profile(activities=[cuda]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [(e.name, e.device_time) for e in sorted(events, key=lambda e: e.time_range.start)]


def _longest_tiles(L: int, Nq: int, H: int, splits, capacity: int, sms: int) -> int:
    """Key tiles of the longest work tile of one chunk (B = 1, bottom-right causal): the
    kernel's split rule (``split_tile`` in paged_prefill.cu) on the host."""
    from flashref.gpu.decode.prefill import BC, BR, default_splits

    Tr = -(-Nq // BR)
    S = splits or default_splits(Tr * H, -(-capacity // BC), sms)
    longest = 0
    for j in range(Tr):
        n = -(-min(L, (j + 1) * BR + L - Nq) // BC)
        e = max(1, min(S, n // 2))
        longest = max(longest, -(-n // e))
    return longest


def _copies(torch, events) -> dict:
    """Host-device copies among a profiler's device events: ``{"HtoD": n, "DtoH": n}``."""
    names = [e.name for e in events]
    return {k: sum(1 for n in names if "Memcpy" in n and k in n) for k in ("HtoD", "DtoH")}


def _gaps(torch, model, prompts, a, b, first) -> list:
    """For each sequence where the two generators part at token j: the difference of the two
    tokens' logits there, from the model run again without a cache (SDPA, bfloat16 autocast,
    the head in float32: ``generate.greedy_logits``) over the prompt and the common prefix;
    None where they never part. A gap near zero is a near tie, where rounding decides the
    greedy choice."""

    out = []
    for i, j in enumerate(first):
        if j is None:
            out.append(None)
            continue
        seq = torch.cat([prompts[i], a[i, :j]])[None]
        with torch.no_grad():
            logits = greedy_logits(model, seq)[0, -1]
        out.append(float((logits[a[i, j]] - logits[b[i, j]]).abs()))
    return out


def generation_rows(ctx, rounds) -> tuple[dict, list[dict]]:
    """The chapter 8 model, trained, generating greedily with each generator."""

    torch = ctx["torch"]
    cfg = Config()
    corpus = CharCorpus(book_text())
    trained = train("sdpa", steps=GEN_TRAIN_STEPS, cfg=cfg, corpus=corpus, keep_model=True)
    model = trained["model"]
    model_meta = {
        "config": dataclasses.asdict(cfg),
        "train_steps": GEN_TRAIN_STEPS,
        "val_loss": trained["val_loss"],
        "prompt": GEN_PROMPT,
        "new_tokens": GEN_NEW,
    }
    rows = []
    for B in GEN_BATCHES:
        x, _ = next(corpus.batches(batch_size=B, context=GEN_PROMPT, seed=VAL_SEED, split="val"))
        prompts = torch.from_numpy(x).cuda()
        row = {"B": B}
        tokens = {}
        for name in GENERATORS:
            runs = [
                generator(name, model, cfg, B).generate(prompts, GEN_NEW) for _ in range(rounds)
            ]
            rates = [B * r["steps"] / r["decode_s"] for r in runs]
            row[f"{name}_tokens_per_s"] = statistics.median(rates)
            row[f"{name}_round_tokens_per_s"] = rates
            row[f"{name}_step_us"] = statistics.median(
                r["decode_s"] / r["steps"] * 1e6 for r in runs
            )
            row[f"{name}_prefill_s"] = statistics.median(r["prefill_s"] for r in runs)
            tokens[name] = runs[0]["tokens"]
            row[f"{name}_loop_host_copies"] = runs[0]["loop_host_copies"]
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            generator(name, model, cfg, B).generate(prompts, GEN_NEW, loop_context=prof)
            row[f"{name}_loop_copies"] = _copies(torch, prof.events())
        a, b = tokens["flashref"], tokens["sdpa"]
        same = (a == b).all(dim=1)
        row["ratio_tokens_per_s"] = row["flashref_tokens_per_s"] / row["sdpa_tokens_per_s"]
        row["sequences_equal"] = int(same.sum())
        diff = (a != b).float().argmax(dim=1)
        row["first_difference"] = [None if s else int(d) for s, d in zip(same, diff, strict=True)]
        row["gap_at_difference"] = _gaps(torch, model, prompts, a, b, row["first_difference"])
        rows.append(row)
        print(
            f"[generate B={B}] flashref {row['flashref_tokens_per_s']:.0f} tok/s, SDPA "
            f"{row['sdpa_tokens_per_s']:.0f}; {row['sequences_equal']}/{B} equal",
            file=sys.stderr,
        )
    return model_meta, rows


def run(args) -> dict:
    cp = require_gpu()
    torch, _, _ = import_torch()
    if torch is None:
        raise SystemExit(f"{PROG}: torch is needed (the baseline and the graphs)")
    facts = device_facts(cp)
    copy = hbm_roof(cp)["hbm_copy_tbps"] * 1e3
    ctx = {"cp": cp, "torch": torch, "l2_bytes": facts["l2_bytes"], "copy_gbps": copy}

    meta = {
        **provenance(cp, torch, decode=[HOPPER_DEFAULT_VERSION]),
        "other_sources": {
            name: source_hash(paste_includes(KERNEL_DIR / name)) for name in OTHER_SOURCES
        },
        "hbm_copy_gbps": copy,
        "sm_count": facts["sm_count"],
        "timing": (
            "CUDA graphs (torch.cuda.graph, relaxed mode, on a side stream), inputs "
            "rotated among graph_sets copies together >= 3x the L2; device events "
            f"around one replay / graph_calls, each round the median of {REPLAYS} "
            "replays, the row the median over rounds"
        ),
        "decode_rule": "GB/s = bytes of K and V (every key valid) / time per call",
        "append_rule": (
            "GB/s = bytes of the new K and V written / time per call; "
            "fraction_of_hbm_copy counts them read and written against the "
            "measured device-to-device copy"
        ),
    }
    out = {"meta": meta}
    with ClockSampler() as clock:
        for name, rows_of in (
            ("decode", decode_rows),
            ("append", append_rows),
            ("prefill", prefill_rows),
        ):
            if name in args.sections:
                out[name] = [r for dtype in args.dtypes for r in rows_of(ctx, dtype, args.rounds)]
        if "generation" in args.sections:
            meta["generation_model"], out["generation"] = generation_rows(ctx, args.rounds)
    meta["clocks"] = clock.summary()
    return out


def print_table(result: dict) -> None:
    print("# paged decode replayed from a graph: GB/s (ratio to cuDNN's contiguous)")
    print("| dtype | B | Hkv | Nk | cuDNN | page 64 | page 128 |")
    print("|---|---|---|---|---|---|---|")
    for r in result.get("decode", []):
        if "note" in r:
            print(f"| {r['dtype']} | {r['B']} | {r['Hkv']} | {r['Nk']} | {r['note']} | | |")
            continue
        cells = [
            f"{r[f'paged{ps}_gbps']:.0f} ({r.get(f'paged{ps}_ratio_to_cudnn', 0):.2f})"
            for ps in PAGE_SIZES
        ]
        print(
            f"| {r['dtype']} | {r['B']} | {r['Hkv']} | {r['Nk']} | "
            f"{r.get('cudnn_gbps', 0):.0f} | {' | '.join(cells)} |"
        )
    print("\n# append of a step's K and V, B = 64, Hkv = 8, d = 128: GB/s written")
    print("| n | bytes | append | copy_ | ratio | fraction of HBM copy |")
    print("|---|---|---|---|---|---|")
    for r in result.get("append", []):
        print(
            f"| {r['n']} | {r['bytes_written']} | {r['append_gbps']:.0f} | "
            f"{r['copy_gbps']:.0f} | {r['ratio_to_copy']:.2f} | "
            f"{r['fraction_of_hbm_copy']:.2f} |"
        )
    print(f"\n# chunked prefill, B = 1, N = {PREFILL_N}, chunks of {PREFILL_CHUNK}: us per prompt")
    print(
        "| dtype | H | d | splits | chunked | one split | one forward | cuDNN | ratio to one "
        "forward | to cuDNN |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in result.get("prefill", []):
        print(
            f"| {r['dtype']} | {r['H']} | {r['d']} | {r['splits']} | {r['chunked_us']:.0f} | "
            f"{r['chunked_one_split_us']:.0f} | "
            f"{r['one_forward_us']:.0f} | {r['cudnn_us']:.0f} | "
            f"{r['ratio_to_one_forward']:.2f} | {r['ratio_to_cudnn']:.2f} |"
        )
    print("\n# generation, the chapter 8 model, greedy, graph-replayed steps: tokens/s")
    print(
        "| B | flashref | SDPA static cache | ratio | equal sequences | largest logit gap where "
        "they part | copies in the loop |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in result.get("generation", []):
        print(
            f"| {r['B']} | {r['flashref_tokens_per_s']:.0f} | {r['sdpa_tokens_per_s']:.0f} | "
            f"{r['ratio_tokens_per_s']:.2f} | {r['sequences_equal']}/{r['B']} | "
            f"{max([g for g in r['gap_at_difference'] if g is not None], default=0):.3f} | "
            f"{r['flashref_loop_copies']} / {r['sdpa_loop_copies']} |"
        )


def main(argv=None) -> int:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=at_least(1), default=3, help="timed rounds per row")
    p.add_argument(
        "--dtypes",
        nargs="+",
        default=["float16"],
        choices=["float16", "bfloat16"],
        help="dtypes of the cache",
    )
    p.add_argument(
        "--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS, help="what to measure"
    )
    p.add_argument("--out", type=Path, default=OUT, help="where the JSON goes")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(result, args.out)
    print_table(result)
    return 0
