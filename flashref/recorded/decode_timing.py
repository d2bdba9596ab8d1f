"""The measurements of the appendix "Timing a decode step", from the recorded runs.

``results/gpu_decode.json`` (through :class:`flashref.recorded.decode.DecodeRun`): the timed
calls with their host and kernel times, the paged calls' host work, the replayed rows of
every version; ``results/gpu_decode_splits*.json``: the split-count sweep;
``results/gpu_decode_profile*.json``: Nsight Compute counters of the versions and of cuDNN;
``results/gpu_prefill_stamps.json`` (``python -m flashref.bench prefill_stamps``): clock stamps
inside the chunked prefill's blocks.
Each function returns the lines of one table and the lines under it that say what it
shows, so that a cell of the appendix is one call.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np

from flashref.gpu import decode as dec
from flashref.gpu.decode import BLOCKS_V5, choose_num_splits

from .decode import impl_names, shape_of, shape_text

__all__ = [
    "timed_table",
    "timed_checks",
    "host_kernel",
    "paged_host",
    "split_sweep",
    "profile_versions",
    "profile_small",
    "early_tiles",
    "profile_v7",
    "prefill_stamps",
]

NS = "gpu__time_duration.sum"  # every kernel of the call, in ns
DRAM = "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"
ISSUE = "smsp__issue_active.avg.pct_of_peak_sustained_active"


class _Out:
    """print's signature, collecting lines."""

    def __init__(self):
        self.text = ""

    def __call__(self, *args, sep=" ", end="\n"):
        self.text += sep.join(str(a) for a in args) + end

    @property
    def lines(self) -> list[str]:
        return self.text.rstrip("\n").split("\n")


def _names(run):
    return (
        run.meta,
        run.row,
        run.shapes,
        run.ours,
        run.ours_paged,
        run.version,
        run.paged_version,
        run.read_ceiling,
        run.measured,
    )


def timed_table(run):
    """GB/s of each implementation as a timed call (CUDA events around one call of the
    public API), ours as a multiple of cuDNN and of the read ceiling; rows not measured."""
    out = _Out()
    (meta, ROW, SHAPES, OURS, OURS_PAGED, V_OURS, V_PAGED, read_ceiling, measured) = _names(run)
    IMPLS = {  # implementation -> column heading
        OURS: "ours",
        OURS_PAGED: "paged",
        "sdpa_cudnn": "cuDNN",
        "sdpa_flash": "FLASH",
        "sdpa_math": "MATH",
    }
    impls = [i for i in IMPLS if any(i == impl for _, impl in ROW)]
    out(f"GB/s of K and V read by each implementation (ours: decode version {V_OURS},")
    out(f"version=None on this GPU, on a contiguous cache; paged: version {V_PAGED}")
    out("on a paged cache; SDPA's backends), ours as a multiple of cuDNN")
    out("and as a fraction of the read ceiling")
    out(
        f"{'':5}{'d':>4}{'B':>3}{'Hq':>4}{'Hkv':>4}{'Nq':>3}{'Nk':>8}"
        + "".join(f"{IMPLS[i]:>6}" for i in impls)
        + f"{'x cuDNN':>8}{'of read':>8}{'S':>4}"
    )
    for s in SHAPES:
        cells = "".join(
            f"{ROW[s, i]['gbps']:>6.0f}" if (s, i) in ROW else f"{'-':>6}" for i in impls
        )
        ours, cudnn = ROW.get((s, OURS)), ROW.get((s, "sdpa_cudnn"))
        ratio = f"{'-':>8}"
        if ours and cudnn:
            ratio = f"{ours['gbps'] / cudnn['gbps']:>8.2f}"
        frac = f"{ours['gbps'] / read_ceiling:>8.0%}" if ours else f"{'-':>8}"
        splits = f"{ours['num_splits'] or '-':>4}" if ours else f"{'-':>4}"
        dtype, dd, B, hq, hkv, nq, nk = s
        short = {"float16": "fp16", "bfloat16": "bf16"}.get(dtype, dtype)
        out(f"{short:5}{dd:>4}{B:>3}{hq:>4}{hkv:>4}{nq:>3}{nk:>8,}" + cells + ratio + frac + splits)
    for r in run.rows:
        if r["gbps"] is None:  # a shape or backend the run could not measure
            out(f"not measured: {r['impl']}, {shape_text(shape_of(r))}")
            out(textwrap.fill(r["note"], 76, initial_indent="  ", subsequent_indent="  "))
    return out.lines


def timed_checks(run):
    """The timed calls against two targets: at least 1.0x cuDNN, at least 85% of the read
    ceiling where Nk >= 32k (also on the kernels' time alone); the shapes below each."""
    out = _Out()
    (meta, ROW, SHAPES, OURS, OURS_PAGED, V_OURS, V_PAGED, read_ceiling, measured) = _names(run)
    vs_cudnn, vs_read = [], []  # (shape, met) for every shape with the data
    vs_read_k = []  # the 85% check on the kernels' time alone (kernel_us)
    for s in SHAPES:
        ours, cudnn = ROW.get((s, OURS)), ROW.get((s, "sdpa_cudnn"))
        if ours and cudnn:
            vs_cudnn.append((s, ours["gbps"] >= cudnn["gbps"]))
        if ours and s[-1] >= 32768:
            vs_read.append((s, ours["gbps"] >= 0.85 * read_ceiling))
        if ours and s[-1] >= 32768 and ours.get("kernel_us"):
            kernel_gbps = ours["bytes"] / ours["kernel_us"] * 1e-3  # B/us
            vs_read_k.append((s, kernel_gbps >= 0.85 * read_ceiling))
    out(
        f"version {V_OURS} >= 1.0x SDPA cuDNN: "
        f"{sum(m for _, m in vs_cudnn)} of {len(vs_cudnn)} shapes"
    )
    out(
        f"version {V_OURS} >= 85% of the read ceiling (Nk >= 32k): "
        f"{sum(m for _, m in vs_read)} of {len(vs_read)} shapes"
    )
    out(
        "  kernel-only figure (bytes / kernel_us, not the timed call): "
        f"{sum(m for _, m in vs_read_k)} of {len(vs_read_k)}"
    )
    for what, checks in (
        ("1.0x cuDNN", vs_cudnn),
        ("85% of read", vs_read),
        ("85%, kernels alone", vs_read_k),
    ):
        below = [s for s, met in checks if not met]
        for s in below[:8]:
            out(f"  below {what}: {shape_text(s)}")
        if len(below) > 8:
            out(f"  ... and {len(below) - 8} more below {what}")
    return out.lines


def host_kernel(run):
    """Per shape, ours and cuDNN: the timed call, its kernels (CUPTI) and the host's time;
    then what separates the timed ratio from the kernels'."""
    out = _Out()
    (meta, ROW, SHAPES, OURS, OURS_PAGED, V_OURS, V_PAGED, read_ceiling, measured) = _names(run)
    LEVEL = 0.05  # kernel times "level": within 5% of each other
    CUDNN = "sdpa_cudnn"
    timed_rows = [  # shapes where both rows have all three times
        s
        for s in SHAPES
        if all(
            (s, i) in ROW and ROW[s, i].get("kernel_us") and ROW[s, i].get("host_us")
            for i in (OURS, CUDNN)
        )
    ]
    T = {  # (shape, impl) -> (timed, kernels, host), us per call
        (s, i): (
            ROW[s, i]["ms"] * 1e3,
            ROW[s, i]["kernel_us"],
            ROW[s, i]["host_us"],
        )
        for s in timed_rows
        for i in (OURS, CUDNN)
    }
    out(f"us per call, version {V_OURS} (ours) and SDPA cuDNN: timed (events),")
    out("kernels (CUPTI), host; then ours / cuDNN's kernel time, and x cuDNN")
    out("as in the table above (cuDNN's timed call / ours)")
    out(f"{'':20}{'ours':^21}{'cuDNN':^21}".rstrip())
    out(
        f"{'':5}{'B':>3}{'Hkv':>4}{'Nk':>8}"
        + f"{'timed':>7}{'kernels':>8}{'host':>6}" * 2
        + f"{'kernels':>8}{'x cuDNN':>8}"
    )
    for s in timed_rows:
        o, c = T[s, OURS], T[s, CUDNN]
        dtype, _, B, _, hkv, _, nk = s
        short = {"float16": "fp16", "bfloat16": "bf16"}.get(dtype, dtype)
        out(
            f"{short:5}{B:>3}{hkv:>4}{nk:>8,}"
            + "".join(f"{t[0]:>7.0f}{t[1]:>8.1f}{t[2]:>6.0f}" for t in (o, c))
            + f"{o[1] / c[1]:>8.3f}{c[0] / o[0]:>8.2f}"
        )
    kr = [T[s, OURS][1] / T[s, CUDNN][1] for s in timed_rows]
    xr = [T[s, CUDNN][0] / T[s, OURS][0] for s in timed_rows]
    out(
        f"\nkernels, ours / cuDNN's time over {len(kr)} shapes: median "
        f"{np.median(kr):.3f}, min {min(kr):.3f}, max {max(kr):.3f}"
    )
    level = all(abs(x - 1) <= LEVEL for x in kr)
    out(f"  within {LEVEL:.0%} of cuDNN's at every shape: {level}")
    out(f"timed call, x cuDNN: median {np.median(xr):.2f}, min {min(xr):.2f}, max {max(xr):.2f}")
    heavy = {  # shapes where the host's time in the call exceeds the kernels'
        i: {s for s in timed_rows if T[s, i][2] > T[s, i][1]} for i in (OURS, CUDNN)
    }
    both = heavy[OURS] & heavy[CUDNN]
    out(
        f"more host than kernel time: ours at {len(heavy[OURS])}, cuDNN at "
        f"{len(heavy[CUDNN])}, both at {len(both)} of {len(timed_rows)} shapes"
    )
    if both:
        hx = [T[s, CUDNN][0] / T[s, OURS][0] for s in both]
        out(
            f"  where both are, x cuDNN from {min(hx):.2f} to {max(hx):.2f}; "
            f"at 1.0 or more at {sum(x >= 1 for x in hx)} of {len(hx)}"
        )
    below = [s for s in timed_rows if T[s, CUDNN][0] < T[s, OURS][0]]
    longer = [  # ours spends longer outside its kernels than cuDNN does
        s for s in below if T[s, OURS][0] - T[s, OURS][1] > T[s, CUDNN][0] - T[s, CUDNN][1]
    ]
    out(
        f"below 1.0x cuDNN: {len(below)} shapes, both more host than kernel "
        f"at {len(both & set(below))} of them;"
    )
    out(
        "  ours longer outside its kernels (timed - kernels) than cuDNN at "
        f"{len(longer)} of {len(below)}"
    )
    one = [s for s in timed_rows if ROW[s, OURS]["num_splits"] == 1]
    if one:
        hs = [T[s, OURS][2] for s in one]
        out("our host time where the call is one split (one kernel, one host")
        out(f"  path): {min(hs):.0f} to {max(hs):.0f} us, {len(one)} shapes")
    return out.lines


def paged_host(run):
    """The host time of a paged call (host tables, checked and copied every call) beside the
    contiguous call's, and the two kernels' time ratio."""
    out = _Out()
    (meta, ROW, SHAPES, OURS, OURS_PAGED, V_OURS, V_PAGED, read_ceiling, measured) = _names(run)
    pairs = [  # shapes with host and kernel times for both caches
        s
        for s in SHAPES
        if all(
            (s, i) in ROW and ROW[s, i].get("host_us") and ROW[s, i].get("kernel_us")
            for i in (OURS, OURS_PAGED)
        )
    ]
    out(f"host us per call: version {V_OURS} contiguous (cont.), version {V_PAGED} paged")
    out(f"{'':16}{'fp16':^16}{'bf16':^16}".rstrip())
    out(f"{'B':>3}{'Hkv':>5}{'Nk':>8}" + f"{'cont.':>8}{'paged':>8}" * 2)
    dtypes = ("float16", "bfloat16")
    for B, hkv, nk in sorted({(s[2], s[4], s[6]) for s in pairs}):
        cells = ""
        for dt in dtypes:
            key = (dt, B, hkv, nk)
            s = next((x for x in pairs if x[::2] == key), None)
            if s is None:
                cells += f"{'-':>8}{'-':>8}"
                continue
            cells += "".join(f"{ROW[s, i]['host_us']:>8.0f}" for i in (OURS, OURS_PAGED))
        out(f"{B:>3}{hkv:>5}{nk:>8,}" + cells)
    hc = np.array([ROW[s, OURS]["host_us"] for s in pairs])
    hp = np.array([ROW[s, OURS_PAGED]["host_us"] for s in pairs])
    kp = [ROW[s, OURS_PAGED]["kernel_us"] / ROW[s, OURS]["kernel_us"] for s in pairs]
    out(
        f"paged host time longer at {int((hp > hc).sum())} of {len(pairs)} "
        f"shapes; median {np.median(hp):.0f} us against {np.median(hc):.0f}"
    )
    out(
        f"kernels, paged / contiguous time: median {np.median(kp):.3f}, "
        f"min {min(kp):.3f}, max {max(kp):.3f}"
    )
    return out.lines


def split_sweep(paths):
    """Per recorded sweep (``paths``), per shape: the split rule's count, the count of the
    same rule filling two blocks per SM, the fastest count, their replayed times, cuDNN's;
    and whether the rule's count is the fastest or within the fastest's rounds."""
    out = _Out()

    for path in map(Path, paths):
        name = path.name
        if not path.exists():
            out(f"no recorded split sweep: {name} is missing; run")
            out("flashref/bench/decode_split_sweep.py on a GPU")
            continue
        sweep = json.loads(path.read_text())
        sm, sr = sweep["meta"], sweep["rows"]
        dd = sr[0]["d"]
        out(f"{name}: {sm['gpu']}, {sm['date']}, {sm['dtype']}, d = {dd}, us per call replayed")
        out(
            f"{'':4}{'B':>3}{'Hkv':>4}{'Nk':>8}{'rule S':>7}{'us':>8}"
            f"{'2/SM S':>7}{'us':>8}{'best S':>7}{'us':>8}{'cuDNN':>8}"
        )
        fine, cases = 0, 0
        for v in sorted({r["impl"] for r in sr if r["impl"] != "sdpa_cudnn"}):
            for B, hkv, nk in sorted({(r["B"], r["Hkv"], r["Nk"]) for r in sr}):
                rs = {
                    r["num_splits"]: r
                    for r in sr
                    if (r["B"], r["Hkv"], r["Nk"], r["impl"]) == (B, hkv, nk, v)
                }
                cud = next(
                    r["us"]
                    for r in sr
                    if (r["B"], r["Hkv"], r["Nk"], r["impl"]) == (B, hkv, nk, "sdpa_cudnn")
                )
                rule = next(S for S, r in rs.items() if r["chosen"])
                two = choose_num_splits(
                    B, hkv, nk, sm["sm_count"], blocks_per_sm=BLOCKS_V5[dd, 1]
                )  # the rule counting the blocks that fit (two per SM here)
                best = min(rs, key=lambda S, rs=rs: rs[S]["us"])
                two_us = f"{rs[two]['us']:>8.2f}" if two in rs else f"{'-':>8}"
                out(
                    f"{v:4}{B:>3}{hkv:>4}{nk:>8,}{rule:>7}{rs[rule]['us']:>8.2f}"
                    f"{two:>7}{two_us}{best:>7}{rs[best]['us']:>8.2f}{cud:>8.2f}"
                )
                cases += 1  # the rule's S is the fastest, or its rounds reach it
                fine += rs[rule]["us_min"] <= rs[best]["us_max"]
        out(
            f"the rule's split count the fastest, or its fastest round within "
            f"the fastest's rounds: {fine} of {cases}"
        )
    return out.lines


def _profile(path):
    """(the profile's data or None, its rows by (B, Hkv, Nk, paged, version), versions)."""
    path = Path(path)
    if not path.exists():
        return None, {}, []
    prof = json.loads(path.read_text())
    rows = {(r["B"], r["Hkv"], r["Nk"], r["paged"], r["version"]): r for r in prof["rows"]}
    return prof, rows, sorted({k[4] for k in rows if k[4] is not None})


def profile_versions(path):
    """Versions 1 to 6 under Nsight Compute at the profile's largest shape (one split),
    contiguous and paged: DRAM throughput, issue slots, time; what the TMA versions change;
    and what each version keeps in flight per SM and the copies a tile takes."""

    out = _Out()
    PROFILE = Path(path)
    prof, PROF, pv = _profile(PROFILE)
    if prof is None:
        out(f"no recorded profile: {PROFILE.name} is missing; run")
        out("python -m flashref.bench profile --decode on a GPU")
    else:
        pm = prof["meta"]
        out(f"counters ({PROFILE.name}): {pm['gpu']}, ncu {pm['ncu'].split()[1]}, {pm['date']}")
        big = max({k[:3] for k in PROF}, key=np.prod)  # (B, Hkv, Nk), largest
        r0 = PROF[(*big, False, pv[0])]
        out(
            f"B = {big[0]}, Hq = {r0['Hq']}, Hkv = {big[1]}, Nk = {big[2]:,}, "
            f"{r0['dtype']}, d = {r0['d']}, Nq = 1, splits: 1"
        )
        out(f"{'':8}{'contiguous':^24}{'paged':^24}".rstrip())
        out(f"{'version':>8}" + f"{'DRAM %':>8}{'issue %':>9}{'us':>7}" * 2)
        for v in pv:
            line = "".join(
                f"{r[DRAM]:>8.1f}{r[ISSUE]:>9.1f}{r[NS] / 1e3:>7.0f}"
                for r in (PROF[(*big, p, v)] for p in (False, True))
            )
            out(f"{v:>8}" + line)
        TMA = [v for v in pv if v in dec.SM90A_VERSIONS]  # versions 5 and 6
        for p in (False, True):
            rs = {v: PROF[(*big, p, v)] for v in pv}
            top = max(rs, key=lambda v: rs[v][DRAM])
            low = min(rs, key=lambda v: rs[v][ISSUE])
            fast = min(rs, key=lambda v: rs[v][NS])
            read = [r["dram__bytes_read.sum"] for r in rs.values()]
            out(
                f"{'paged' if p else 'contiguous'}: a TMA version has the highest "
                f"DRAM % {top in TMA}, the lowest issue % {low in TMA}, the"
            )
            out(
                f"  shortest time {fast in TMA}; DRAM bytes read within 0.1% "
                f"across versions: {max(read) <= 1.001 * min(read)}"
            )
            old = [rs[v] for v in pv if v not in TMA]  # versions 1-4
            new = [rs[v] for v in TMA]
            issue = [n[ISSUE] / r[ISSUE] for n in new for r in old]
            time = [n[NS] / r[NS] for n in new for r in old]
            out(
                f"  versions 5-6 against 1-4: DRAM % "
                f"{min(r[DRAM] for r in new):.1f}-{max(r[DRAM] for r in new):.1f}"
                f" against "
                f"{min(r[DRAM] for r in old):.1f}-{max(r[DRAM] for r in old):.1f},"
            )
            out(
                f"  issue % x {min(issue):.2f}-{max(issue):.2f}, "
                f"time x {min(time):.2f}-{max(time):.2f}"
            )

        d_p = r0["d"]
        tile = 2 * dec.BC * d_p * 2  # bytes of a 64-key tile of K and V, fp16
        ring = {  # bytes of K/V buffers in shared memory per SM
            "version 1": dec.BLOCKS_PER_SM * dec.STAGES * tile,
            "2-4": dec.BLOCKS_PER_SM
            * dec.NWARPS
            * dec.STAGES_W[d_p]
            * 2
            * dec.BK
            * d_p
            * 2,  # each warp's ring of 16-key sub-tiles
            "5-7": dec.BLOCKS_V5[d_p, 1] * dec.STAGES_V5[d_p, 1] * tile,
        }
        out(
            f"K/V ring per SM at d = {d_p}: "
            + ", ".join(f"{v}: {b // 1024} KiB" for v, b in ring.items())
            + f"; the same: {len(set(ring.values())) == 1}"
        )
        out(
            f"copies per 64-key tile of K and V: {tile // 16:,} cp.async of 16 "
            "bytes (versions 1-4),"
        )
        out(f"  {2 * d_p // 64} TMA boxes of 64 x 64 (versions 5 to 7)")
    return out.lines


def profile_small(run, path, where):
    """At the profile's smallest shape: each version's kernels under ncu beside its timed
    call and host time in the decode run (``where``: its file's name), with each run's
    split count; then the shapes where the better TMA version trails the better of versions
    3 and 4 in the timed calls."""

    out = _Out()
    (meta, ROW, SHAPES, OURS, OURS_PAGED, V_OURS, V_PAGED, read_ceiling, measured) = _names(run)
    PROFILE = Path(path)
    prof, PROF, pv = _profile(PROFILE)
    TMA = [v for v in pv if v in dec.SM90A_VERSIONS]
    if prof is not None:
        small = min({k[:3] for k in PROF}, key=np.prod)  # (B, Hkv, Nk)
        rs = {v: PROF[(*small, False, v)] for v in pv}
        r0 = rs[pv[0]]
        shape = (r0["dtype"], r0["d"], small[0], r0["Hq"], small[1], 1, small[2])
        out(f"B = {small[0]}, Hkv = {small[1]}, Nk = {small[2]:,}, in us: kernels under ncu")
        out(f"({PROFILE.name}), the timed call and its host time ({where})")
        out(
            f"{'version':>8}{'split':>8}{'merge':>8}{'ncu':>8}{'timed':>8}"
            f"{'host':>8}{'S ncu':>7}{'S timed':>8}"
        )
        ncu, timed, host = {}, {}, {}
        for v, r in rs.items():
            ks = r["per_kernel"]
            ncu[v] = r[NS] / 1e3
            timed[v] = ROW[shape, impl_names(v)[0]]["ms"] * 1e3
            host[v] = ROW[shape, impl_names(v)[0]].get("host_us")
            merge = f"{ks[1]['us']:>8.1f}" if len(ks) > 1 else f"{'-':>8}"
            hs = f"{host[v]:>8.1f}" if host[v] is not None else f"{'-':>8}"
            # splits: the profile's grid over (B, Hkv) (one row block), the run's
            s_ncu = int(r["launch__grid_size"]) // (small[0] * small[1])
            s_timed = ROW[shape, impl_names(v)[0]]["num_splits"]
            out(
                f"{v:>8}{ks[0]['us']:>8.1f}{merge}{ncu[v]:>8.1f}{timed[v]:>8.1f}"
                + hs
                + f"{s_ncu:>7}{s_timed:>8}"
            )
        out(
            f"versions 5, 6 under ncu at most version 3's: "
            f"{all(ncu[v] <= ncu[3] for v in TMA)}; timed longer: "
            f"{all(timed[v] > timed[3] for v in TMA)}"
        )
        outside = all(timed[v] - ncu[v] > timed[3] - ncu[3] for v in TMA)
        hosted = all(None not in (host[v], host[3]) and host[v] > host[3] for v in TMA)
        out(f"  timed - ncu longer than version 3's: {outside}; host time longer: {hosted}")
        # every shape where the better TMA version trails the better of 3 and 4
        out("\nthe better of versions 5, 6 / the better of 3 and 4, GB/s, where")
        out("below 1 in fp16 or bf16 (S: splits):")
        out(f"{'B':>3}{'Hkv':>5}{'Nk':>9}{'S':>4}{'fp16':>7}{'bf16':>7}")
        behind, noise = [], {}  # noise: (B, Hkv, Nk) -> within the rounds' spread

        def spread(r):  # (slowest - fastest round) / median of one row
            return (r["ms_max"] - r["ms_min"]) / r["ms"]

        for B, hkv, nk in sorted({(s[2], s[4], s[6]) for s in SHAPES}):
            ratio, within = {}, []
            for s in SHAPES:
                if (s[2], s[4], s[6]) == (B, hkv, nk):
                    g = {v: ROW[s, impl_names(v)[0]] for v in (3, 4, *TMA)}
                    new = max(TMA, key=lambda v, g=g: g[v]["gbps"])
                    old = max((3, 4), key=lambda v, g=g: g[v]["gbps"])
                    ratio[s[0]] = g[new]["gbps"] / g[old]["gbps"]
                    worst = max(spread(g[new]), spread(g[old]))
                    within.append(ratio[s[0]] >= 1 or 1 - ratio[s[0]] <= worst)
            if min(ratio.values()) < 1:
                behind.append((B, hkv, nk))
                noise[B, hkv, nk] = all(within)
                S = ROW[(s[0], s[1], B, s[3], hkv, 1, nk), OURS]["num_splits"]
                out(
                    f"{B:>3}{hkv:>5}{nk:>9,}{S:>4}{ratio['float16']:>7.2f}{ratio['bfloat16']:>7.2f}"
                )
        others = [k for k in behind if k[0] != 1 and k[2] != 4096]
        out(
            "all of them at B = 1 or Nk = 4,096:",
            not others,
        )
        out(
            f"the others ({len(others)}) behind by less than their rows' spread "
            f"of rounds: {all(noise[k] for k in others)}"
        )
        ahead = [  # B >= 8, Nk >= 32k: a TMA version the fastest of all?
            max(pv, key=lambda v: ROW[s, impl_names(v)[0]]["gbps"]) in TMA
            for s in SHAPES
            if s[2] >= 8 and s[6] >= 32768
        ]
        out(
            f"B >= 8 and Nk >= 32k: version 5 or 6 the fastest at {sum(ahead)} "
            f"of {len(ahead)} shapes"
        )
    return out.lines


def early_tiles(run):
    """Version 7 beside version 6 replayed at the same split counts: the prologue's share."""
    out = _Out()
    (meta, ROW, SHAPES, OURS, OURS_PAGED, V_OURS, V_PAGED, read_ceiling, measured) = _names(run)
    GRAPH = run.graph
    if GRAPH:
        new_v, old_v = 7, 6  # version 7 is version 6 with the early requests
        a, b = impl_names(new_v)[0], impl_names(old_v)[0]
        pairs7 = [s for s in GRAPH if (s, a) in ROW and (s, b) in ROW]
        out(f"us per call replayed, version {new_v} beside version {old_v} (same split counts)")
        out(
            f"{'':5}{'B':>3}{'Hkv':>4}{'Nk':>8}{'S':>4}{f'v{old_v}':>9}{f'v{new_v}':>9}{'ratio':>7}"
        )
        faster, slower = [], []
        for s in pairs7:
            ra, rb = ROW[s, a], ROW[s, b]
            dtype, _, B, _, hkv, _, nk = s
            short = {"float16": "fp16", "bfloat16": "bf16"}.get(dtype, dtype)
            out(
                f"{short:5}{B:>3}{hkv:>4}{nk:>8,}{ra['num_splits']:>4}"
                f"{rb['graph_us']:>9.2f}{ra['graph_us']:>9.2f}"
                f"{ra['graph_us'] / rb['graph_us']:>7.3f}"
            )
            if ra["graph_us_max"] < rb["graph_us_min"]:  # every round faster
                faster.append(s)
            elif ra["graph_us_min"] > rb["graph_us_max"]:  # every round slower
                slower.append(s)
        out(
            f"version {new_v} faster in every round at {len(faster)} of "
            f"{len(pairs7)} shapes, slower in every round at {len(slower)}"
        )
        short_calls = [s for s in faster if ROW[s, a]["graph_us"] < 100]
        gain = min(ROW[s, a]["graph_us"] / ROW[s, b]["graph_us"] for s in pairs7)
        out(
            f"  of the faster, calls under 100 us: {len(short_calls)}; the "
            f"largest gain: x {gain:.3f}"
        )
        for s in slower:
            out(f"  slower: {shape_text(s)}")
    return out.lines


def profile_v7(path):
    """Version 7 and cuDNN under Nsight Compute: kernels, grid, time, DRAM bytes, DRAM
    throughput and warps active of the longest kernel; the two compared shape by shape."""
    out = _Out()
    PROFILE7 = Path(path)
    prof7 = json.loads(PROFILE7.read_text()) if PROFILE7.exists() else None
    if prof7 is None:
        out(f"no recorded profile: {PROFILE7.name} is missing; run python -m")
        out(f"flashref.bench profile --decode --versions 7 --out {PROFILE7.name}")
    else:
        p7 = prof7["meta"]
        out(
            f"counters ({PROFILE7.name}): {p7['gpu']}, ncu "
            f"{p7['ncu'].split()[1]}, {p7['date']}; fp16, d = 128, Nq = 1"
        )
        out(
            f"{'':14}{'B':>3}{'Hkv':>4}{'Nk':>8}{'kernels':>8}{'grid':>7}"
            f"{'us':>8}{'DRAM MB':>9}{'DRAM %':>7}{'warps %':>8}"
        )
        P7 = {}
        for r in prof7["rows"]:
            who = "cuDNN" if r["version"] is None else f"version {r['version']}"
            where = (r["B"], r["Hkv"], r["Nk"], r["paged"])
            P7[where, r["version"]] = r
            k0 = max(r["per_kernel"], key=lambda k: k["us"])  # its longest kernel
            grid = int(r["launch__grid_size"])
            out(
                f"{who + (' paged' if r['paged'] else ''):14}{r['B']:>3}"
                f"{r['Hkv']:>4}{r['Nk']:>8,}{r['kernels']:>8}{grid:>7}"
                f"{r[NS] / 1e3:>8.1f}{r['dram__bytes_read.sum'] / 1e6:>9.1f}"
                f"{k0['dram_pct']:>7.1f}{k0['warps_active_pct']:>8.1f}"
            )
        for where in sorted({w for w, v in P7 if v is None}):
            ours, cud = P7.get((where, 7)), P7[where, None]
            if ours is None:
                continue
            t = ours[NS] / cud[NS]
            rd = ours["dram__bytes_read.sum"] / cud["dram__bytes_read.sum"]
            out(
                f"B = {where[0]}, Hkv = {where[1]}, Nk = {where[2]:,}: version 7 "
                f"/ cuDNN time x {t:.3f}, DRAM bytes read x {rd:.3f}"
            )
    return out.lines


# (column, stamp): the producer thread's stamps, then the first consumer thread's
STAMP_COLUMNS = (
    ("Q ask", "q_asked"),
    ("len", "length_read"),
    ("K0 ask", "tile0_asked"),
    ("ready", "consumer_ready"),
    ("Q in", "q_landed"),
    ("K0 in", "tile0_landed"),
    ("P0", "tile0_done"),
    ("loop", "loop_done"),
    ("end", "end"),
)


def prefill_stamps(path):
    """Inside the chunked prefill's blocks (``python -m flashref.bench prefill_stamps``): each
    step's time from the block's start, the median over blocks, per chunk; then, per chunk, how
    much of a block is its start (until its first key tile lands) and its end (after its
    last)."""
    out = _Out()
    path = Path(path)
    if not path.exists():
        out(f"no recorded stamps: {path.name} is missing; run")
        out(f"python -m flashref.bench prefill_stamps --out results/{path.name} on a Hopper GPU")
        return out.lines
    data = json.loads(path.read_text())
    m = data["meta"]
    mhz = [r["sm_mhz"] for r in data["rows"]]
    out(f"stamps ({path.name}): {m['gpu']}, driver {m['driver']}, {m['date']},")
    sources = ", ".join(f"{k} {v}" for k, v in m["other_sources"].items())
    out(f"  commit {m['commit'][:7]}, {sources}")
    out(f"  SM clock {min(mhz):,.0f}-{max(mhz):,.0f} MHz (the stamps' cycles over %globaltimer)")
    out("us from a block's start, median over the blocks; one split, fp16, pages of 128, B = 1")

    shape = (("H", 3), ("d", 4), ("Nq", 5), ("L", 6))  # the chunk's columns, and widths

    def chunk(r):  # the chunk's shape, the first columns of every row below
        return "".join(f"{r[k]:>{w}}" for k, w in shape)

    out(
        "".join(f"{k:>{w}}" for k, w in shape)
        + f"{'blocks':>7}"
        + "".join(f"{c:>7}" for c, _ in STAMP_COLUMNS[:3])
        + " |"
        + "".join(f"{c:>6}" for c, _ in STAMP_COLUMNS[3:])
        + f"{'last':>6}"
    )
    for r in data["rows"]:
        s = r["stamps_us"]
        out(
            f"{chunk(r)}{r['blocks']:>7}"
            + "".join(f"{s[k]:>7.2f}" for _, k in STAMP_COLUMNS[:3])
            + " |"
            + "".join(f"{s[k]:>6.2f}" for _, k in STAMP_COLUMNS[3:])
            + f"{r['last_end_us']:>6.2f}"
        )
    out("producer: Q ask, len (the sequence's length read), K0 ask (the first key tile asked);")
    out("consumer: ready (registers raised), Q in and K0 in (landed), P0 (the first tile's")
    out("  scores and P), loop (the last tile done), end (the output written);")
    out("last: the last block's end, from the first block's start (the kernel's blocks)")
    out("a block's start (until K0 in) and end (after the loop), and their share of it:")
    for r in data["rows"]:
        s = r["stamps_us"]
        start, tail = s["tile0_landed"], s["end"] - s["loop_done"]
        out(
            f"{chunk(r)}{'':>7}  {start:.2f} + {tail:.2f} of "
            f"{s['end']:.2f} us: {(start + tail) / s['end']:.0%}"
        )
    return out.lines
