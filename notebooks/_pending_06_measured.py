# Cells of the section "What the H200 moves" of
# notebooks/06_io_complexity.ipynb.
#
# They read results/gpu_io.json (DRAM and L2 bytes recorded with Nsight Compute
# on the GPU), which does not exist yet. Once it does: insert these cells
# before the chapter's "## Summary", re-execute the notebook, and write the
# reading of each table from the recorded numbers where the markdown cells say
# so (and point to this section from the end of "What a GPU's caches change",
# which now ends "a question for its counters."). Besides the schema that
# io_model.load_measured checks, the file's meta must carry "l2_cache_bytes",
# the L2 size the GPU reports
# (cupy.cuda.runtime.getDeviceProperties(0)["l2CacheSize"]).
#
# Cells are separated by "# %%" lines; "# %% [markdown]" cells are markdown,
# each line behind "# ". The cells use the chapter's imports (np, plt, io,
# flashref, ROOT); tests/test_io_model.py runs them on a fixture.
# ruff: noqa: F821, E402

# %% [markdown]
# ## What the H200 moves
#
# The model makes three predictions that a GPU's counters can check. For a
# flash kernel, the bytes DRAM serves are the compulsory ones ($Q$, $K$, $V$
# read once, $O$ and `lse` written once), and the bytes the SMs ask of L2 are
# at least the walk ($K$ and $V$ once per query tile). For naive CuPy
# (`flashref.bench`'s matrix product, softmax, matrix product), DRAM serves the
# passes of `io.NAIVE_CUPY`: the score matrix is read 7 times and written 5
# times, where the paper's Algorithm 0 reads and writes it twice each.
#
# Nsight Compute counted, for every kernel of one call, the bytes read from and
# written to DRAM (`dram__bytes_read.sum`, `dram__bytes_write.sum`) and the
# bytes through the L2 (`lts__t_bytes.sum`), and the file sums them per call.
# The recorded run:

# %%
IO_FILE = ROOT / "results" / "gpu_io.json"
meta, measured = io.load_measured(IO_FILE)
for key in ("gpu", "driver", "ncu", "cupy", "torch", "date", "clock_control"):
    print(f"{key:14} {meta[key]}")
print(f"{'SM clock':14} {meta['sm_clock_mhz']:.0f} MHz")
if "l2_cache_bytes" not in meta:
    raise KeyError(f"{IO_FILE}: meta has no 'l2_cache_bytes' (the L2 size)")
L2 = meta["l2_cache_bytes"]
print(f"{'L2 cache':14} {L2 / 2**20:.0f} MiB")
print(f"{len(measured)} measured calls")

# %% [markdown]
# Model and measurement side by side, call by call. The flash kernels are
# modelled with their own query tiles: `Br` from `flashref.gpu.VERSIONS` for
# this book's versions, and 128 rows for SDPA's FLASH backend
# (FlashAttention-2's launch templates for sm_90 use 128-row query tiles at $d
# = 64$ and $d = 128$). A ratio is measured / model.

# %%
import flashref.gpu

Br = {f"v{n}": info.Br for n, info in flashref.gpu.VERSIONS.items()}
Br["sdpa_flash"] = 128  # FlashAttention-2, sm_90: 128-row query tiles
table = io.compare(measured, Br=Br, l2_bytes=L2)
GB = 1e9
print(f"{'':18}{'':15}{'DRAM (GB)':^24}{'L2 (GB)':^24}")
print(
    f"{'impl':18}{'N':>6}{'B':>4}{'H':>4}{'model':>9}{'measured':>9}"
    f"{'ratio':>6}{'model':>9}{'measured':>9}{'ratio':>6}"
)
for r in table:
    print(
        f"{r['impl']:18}{r['N']:6}{r['B']:4}{r['H']:4}"
        f"{r['model_dram_bytes'] / GB:9.3f}{r['dram_bytes'] / GB:9.3f}"
        f"{r['dram_ratio']:6.2f}{r['model_l2_bytes'] / GB:9.2f}"
        f"{r['l2_bytes'] / GB:9.2f}{r['l2_ratio']:6.2f}"
    )

# %% [markdown]
# The same against $N$ for chapter 5's shapes ($H = 16$, $B = 2 \cdot 16384 /
# N$, $d = 64$): lines are the model, markers the measurement.

# %%
sweep = [
    r for r in table
    if r["H"] == 16 and r["B"] * r["N"] == 2 * 16384 and r["d"] == 64
    and not r["causal"]
]  # fmt: skip
impls = list(dict.fromkeys(r["impl"] for r in sweep))
fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharex=True)
for ax, (model, seen, what) in zip(
    axes,
    [("model_dram_bytes", "dram_bytes", "DRAM"),
     ("model_l2_bytes", "l2_bytes", "L2")],
    strict=True,
):  # fmt: skip
    for i, impl in enumerate(impls):
        pts = sorted((r["N"], r[model], r[seen]) for r in sweep
                     if r["impl"] == impl)  # fmt: skip
        N, m, s = (np.array(x) for x in zip(*pts, strict=True))
        colour = plt.cm.tab10(i)
        ax.loglog(N, m / GB, color=colour, label=f"{impl}, model")
        ax.loglog(N, s / GB, "o", color=colour, label=f"{impl}, measured")
    ax.set(xlabel="sequence length N", ylabel=f"{what} bytes per call (GB)",
           title=f"{what}, {meta['gpu']}")  # fmt: skip
    ax.grid(True, which="major", alpha=0.3)
axes[0].legend(fontsize=9)
fig.tight_layout()
plt.show()

# %% [markdown]
# Bytes over time: the DRAM bandwidth each call achieved, measured bytes
# divided by the summed kernel time.

# %%
for r in table:
    if r["ms"] is None:
        continue
    tbps = r["dram_bytes"] / (r["ms"] * 1e-3) / 1e12
    print(f"{r['impl']:18} N = {r['N']:6}: {r['ms']:8.3f} ms, "
          f"{tbps:5.2f} TB/s from DRAM")  # fmt: skip

# %% [markdown]
# ### The paper's shape
#
# Figure 2 of the paper (arXiv v2) measured forward and backward together on an
# A100: 40.3 GB and 41.7 ms for standard attention, 4.4 GB and 7.3 ms for
# FlashAttention. Here is the forward pass alone at the same shape ($N = 1024$,
# $d = 64$, 16 heads, batch 64) on the recorded GPU:

# %%
paper = [
    r for r in table
    if (r["N"], r["B"], r["H"], r["d"]) == (1024, 64, 16, 64)
]  # fmt: skip
print(f"{'impl':18}{'DRAM (GB)':>10}{'model':>8}{'L2 (GB)':>9}{'ms':>9}")
for r in paper:
    ms = f"{r['ms']:9.3f}" if r["ms"] is not None else f"{'-':>9}"
    print(
        f"{r['impl']:18}{r['dram_bytes'] / GB:10.2f}"
        f"{r['model_dram_bytes'] / GB:8.2f}{r['l2_bytes'] / GB:9.2f}{ms}"
    )
print("paper, forward + backward, A100: standard 40.3 GB 41.7 ms,")
print("                                 FlashAttention 4.4 GB 7.3 ms")

# %% [markdown]
# (To be written from the recorded numbers: where the flash kernels' DRAM bytes
# sit against the compulsory traffic, how far L2 exceeds the walk, and what
# naive CuPy's passes over the score matrix cost, against the model's 12
# passes.)
