"""The numbered forward versions: what each computes on, how it is launched, what it needs.

Each ``Version`` names one ``.cu`` file, under ``flashref/kernels/forward/`` for the ``mma.sync``
versions 1-18 and ``flashref/kernels/hopper/`` for the sm_90a versions 19-30; its header comment
says what changed from the version it builds on. Nothing here imports CuPy, so the registry can be
read (and the sources compiled with nvcc) on a machine without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from .registry import KERNEL_DIR, KernelVersion, registered, version_diff

__all__ = ["KERNEL_DIR", "VERSIONS", "Version", "PREFERENCE", "HOPPER_PREFERENCE"]


@dataclass(frozen=True)
class Version(KernelVersion):
    """One forward kernel version: what it computes on, how it is launched, what it needs."""

    number: int
    name: str
    dtypes: tuple[str, ...]  # input/output dtypes; accumulation is always float32
    head_dims: tuple[int, ...]
    summary: str
    file: str  # under flashref/kernels/forward/ (mma.sync) or hopper/ (arch="sm_90a")
    Br: int  # query rows per thread block
    threads: int  # threads per block
    min_cc: tuple[int, int] = (8, 0)  # lowest compute capability (major, minor) it runs on
    bc64: int = 64  # key tile Bc at d = 64 ...
    bc128: int = 64  # ... and at d = 128
    kv_buffers: int = 2  # shared-memory buffers each of K and V (at d = 64 if the next is set)
    kv_buffers128: int | None = None  # ... at d = 128, where it differs
    padded: bool = True  # shared-memory rows of d + 8 halves
    arch: str | None = None  # an architecture-specific target ("sm_90a"): that GPU only
    tma: bool = False  # takes the TMA descriptors of Q, K, V after the common arguments
    persistent: bool = False  # a block per SM walks the work tiles; takes B*H after the maps

    @property
    def dtype(self) -> str:
        """The first (default) dtype."""
        return self.dtypes[0]

    @property
    def kernel(self) -> str:
        return f"flash_v{self.number}"

    @property
    def folder(self) -> str:
        return "hopper" if self.arch else "forward"

    def Bc(self, d: int) -> int:
        return self.bc64 if d <= 64 else self.bc128

    def stages(self, d: int) -> int:
        """Shared-memory buffers each of K and V at head dim ``d``."""
        return self.kv_buffers128 if d > 64 and self.kv_buffers128 else self.kv_buffers

    def smem_bytes(self, d: int) -> int:
        """Dynamic shared memory per block, matching the layout in the .cu file."""
        if self.number == 1:  # Q (Br, d+1), K and V (Bc, d), S (Br, Bc+1); Br = Bc = 32
            return 4 * (32 * (d + 1) + 2 * 32 * d + 32 * 33)
        if self.number == 2:  # Q, K (64, d+1), V (64, d), S (64, 65), m, l, alpha (64,)
            return 4 * (2 * 64 * (d + 1) + 64 * d + 64 * 65 + 3 * 64)
        if self.tma:  # Q (Br, d), K and V (stages(d), Bc, d), unpadded; + 1024-byte alignment
            return 2 * (self.Br + 2 * self.stages(d) * self.Bc(d)) * d + 1024
        row = d + 8 if self.padded else d  # halves per shared-memory row
        return 2 * (self.Br + 2 * self.kv_buffers * self.Bc(d)) * row

    def grid(self, Nq: int, BH: int, sm_count: int) -> tuple[int, int]:
        """The launch grid for ``BH`` heads of ``Nq`` queries: (Tr, BH) blocks, one per work
        tile (a query block of one head); a persistent version's min(Tr * BH, sm_count) blocks,
        each walking the tiles blockIdx.x, + gridDim.x, ... (never a block without one)."""
        for name, value in (("Nq", Nq), ("BH", BH), ("sm_count", sm_count)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        Tr = -(-Nq // self.Br)
        if not self.persistent:
            return (Tr, BH)
        return (min(Tr * BH, sm_count), 1)


def max_persistent_blocks(text: str | None) -> int | None:
    """The environment variable FLASHREF_MAX_PERSISTENT_BLOCKS read as a cap on a persistent
    version's grid (so that each block walks many work tiles); None where it is unset or empty."""
    if text is None or text == "":
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"FLASHREF_MAX_PERSISTENT_BLOCKS must be an integer >= 1, got {text!r}")
    return int(text)


_FP32 = ("float32",)
_TC = ("float16", "bfloat16")  # tensor-core versions: mma.sync .f16 or .bf16
_FP32_DIMS = tuple(range(1, 129))
_TC_DIMS = (64, 128)
_ANY_CC = (5, 0)  # plain CUDA: any GPU a current CuPy supports

VERSIONS: dict[int, Version] = {
    v.number: v
    for v in (
        Version(
            1,
            "scalar",
            _FP32,
            _FP32_DIMS,
            "one thread per query row, K/V tiles in shared memory",
            "v01_scalar.cu",
            32,
            32,
            min_cc=_ANY_CC,
        ),
        Version(
            2,
            "fp32_8warps",
            _FP32,
            _FP32_DIMS,
            "8 warps share each 64 x 64 score tile through shared memory, register blocking",
            "v02_fp32_8warps.cu",
            64,
            256,
            min_cc=_ANY_CC,
        ),
        Version(
            3,
            "mma",
            _TC,
            _TC_DIMS,
            "tensor cores: mma.sync m16n8k16 + ldmatrix, softmax on fragments",
            "v03_mma.cu",
            64,
            128,
            kv_buffers=1,
            padded=False,
        ),
        Version(
            4,
            "padded",
            _TC,
            _TC_DIMS,
            "v3 + shared-memory rows padded by 8 halves (no ldmatrix bank conflicts)",
            "v04_padded.cu",
            64,
            128,
            kv_buffers=1,
        ),
        Version(
            5,
            "cp_async",
            _TC,
            _TC_DIMS,
            "v4 + cp.async copies, double-buffered K/V tiles",
            "v05_cp_async.cu",
            64,
            128,
        ),
        Version(
            6,
            "exp2",
            _TC,
            _TC_DIMS,
            "v5 + ex2.approx with scale*log2(e) folded into one FMA",
            "v06_exp2.cu",
            64,
            128,
        ),
        Version(
            7,
            "q_regs",
            _TC,
            _TC_DIMS,
            "v6 + Q fragments loaded into registers once",
            "v07_q_regs.cu",
            64,
            128,
        ),
        Version(
            8,
            "br128",
            _TC,
            _TC_DIMS,
            "v7 with Br = 128 rows per block (8 warps)",
            "v08_br128.cu",
            128,
            256,
        ),
        Version(
            9,
            "warp32rows",
            _TC,
            _TC_DIMS,
            "v6 with 32 rows per warp (4 warps, Br = 128): each K/V fragment feeds 2 mma",
            "v09_warp32rows.cu",
            128,
            128,
            bc128=32,
        ),
        Version(
            10,
            "causal_order",
            _TC,
            _TC_DIMS,
            "v9 with the longest causal query blocks launched first",
            "v10_causal_order.cu",
            128,
            128,
            bc128=32,
        ),
        Version(
            11,
            "three_stage",
            _TC,
            _TC_DIMS,
            "v10 with three K/V buffers: copies two tiles ahead, one barrier per tile",
            "v11_three_stage.cu",
            128,
            128,
            bc128=32,
            kv_buffers=3,
        ),
        Version(
            12,
            "static_addr",
            _TC,
            _TC_DIMS,
            "v10 with copy offsets and shared addresses fixed at compile time",
            "v12_static_addr.cu",
            128,
            128,
            bc128=32,
        ),
        Version(
            13,
            "fa2_tiles",
            _TC,
            _TC_DIMS,
            "v12 with FlashAttention-2's sm_90 tiles: Bc = 128 at d = 64, 64 at d = 128",
            "v13_fa2_tiles.cu",
            128,
            128,
            bc64=128,
            bc128=64,
        ),
        Version(
            14,
            "lazy_rescale",
            _TC,
            _TC_DIMS,
            "v13 rescaling O only when a row maximum grows by more than 2^8",
            "v14_lazy_rescale.cu",
            128,
            128,
            bc64=128,
            bc128=64,
        ),
        Version(
            15,
            "split_chains",
            _TC,
            _TC_DIMS,
            "v14 with each row's max and sum as four independent chains",
            "v15_split_chains.cu",
            128,
            128,
            bc64=128,
            bc128=64,
        ),
        Version(
            16,
            "halves_in_flight",
            _TC,
            _TC_DIMS,
            "v15 with the two halves of each key tile interleaved: S mma beside exp",
            "v16_halves_in_flight.cu",
            128,
            128,
            bc64=128,
            bc128=64,
        ),
        Version(
            17,
            "causal_skip",
            _TC,
            _TC_DIMS,
            "v14 with causal warps that see no key of a tile skipping it",
            "v17_causal_skip.cu",
            128,
            128,
            bc64=128,
            bc128=64,
        ),
        Version(
            18,
            "br256",
            _TC,
            _TC_DIMS,
            "v14 with 8 warps and Br = 256: half the L2 traffic for K and V",
            "v18_br256.cu",
            256,
            256,
            bc64=128,
            bc128=64,
        ),
        Version(
            19,
            "wgmma",
            _TC,
            _TC_DIMS,
            "Hopper: wgmma for both products, K/V by TMA into 2 mbarrier stages, Br = 128",
            "v19_wgmma.cu",
            128,
            256,
            min_cc=(9, 0),
            bc64=128,
            bc128=64,
            arch="sm_90a",
            tma=True,
        ),
        Version(
            20,
            "warp_specialised",
            _TC,
            _TC_DIMS,
            "v19 + a producer warpgroup issuing TMA into 3 stages, setmaxnreg 24 / 240",
            "v20_warp_specialised.cu",
            128,
            384,
            min_cc=(9, 0),
            bc64=128,
            bc128=64,
            kv_buffers=3,
            arch="sm_90a",
            tma=True,
        ),
        Version(
            21,
            "overlap",
            _TC,
            _TC_DIMS,
            "v20 with the next tile's S = Q K^T issued before this tile's softmax",
            "v21_overlap.cu",
            128,
            384,
            min_cc=(9, 0),
            bc64=128,
            bc128=64,
            kv_buffers=3,
            arch="sm_90a",
            tma=True,
        ),
        Version(
            22,
            "bc128",
            _TC,
            _TC_DIMS,
            "v21 with FlashAttention-3's 128 x 128 tile at d = 128: Bc = 128, 2 stages",
            "v22_bc128.cu",
            128,
            384,
            min_cc=(9, 0),
            bc64=128,
            bc128=128,
            kv_buffers=3,
            kv_buffers128=2,
            arch="sm_90a",
            tma=True,
        ),
        Version(
            23,
            "pingpong",
            _TC,
            _TC_DIMS,
            "v22 with the consumer warpgroups taking turns at wgmma (named barriers)",
            "v23_pingpong.cu",
            128,
            384,
            min_cc=(9, 0),
            bc64=128,
            bc128=128,
            kv_buffers=3,
            kv_buffers128=2,
            arch="sm_90a",
            tma=True,
        ),
        Version(
            24,
            "three_consumers",
            _TC,
            (64,),
            "v21 at d = 64 only, with 3 consumer warpgroups: Br = 192, setmaxnreg 24 / 160",
            "v24_three_consumers.cu",
            192,
            512,
            min_cc=(9, 0),
            bc64=128,
            kv_buffers=3,
            arch="sm_90a",
            tma=True,
        ),
        Version(
            25,
            "pingpong_bc64",
            _TC,
            _TC_DIMS,
            "v23's ping-pong on v21's d = 128 tile: Bc = 64, 3 stages (d = 64: v23)",
            "v25_pingpong_bc64.cu",
            128,
            384,
            min_cc=(9, 0),
            bc64=128,
            bc128=64,
            kv_buffers=3,
            arch="sm_90a",
            tma=True,
        ),
        Version(
            26,
            "pingpong_3stages",
            _TC,
            _TC_DIMS,
            "v23 with three K/V stages of 128 x 128 tiles at d = 128 (225 KB of shared memory)",
            "v26_pingpong_3stages.cu",
            128,
            384,
            min_cc=(9, 0),
            bc64=128,
            bc128=128,
            kv_buffers=3,
            arch="sm_90a",
            tma=True,
        ),
        Version(
            27,
            "persistent",
            _TC,
            _TC_DIMS,
            "v23 (d = 64) / v26 (d = 128) made persistent: min(tiles, SMs) blocks walk the "
            "(q block, head) tiles, the producer running on into the next tile",
            "v27_persistent.cu",
            128,
            384,
            min_cc=(9, 0),
            bc64=128,
            bc128=128,
            kv_buffers=3,
            arch="sm_90a",
            tma=True,
            persistent=True,
        ),
        Version(
            28,
            "persistent3",
            _TC,
            (64,),
            "v24 (3 consumer warpgroups, Br = 192, d = 64 only) made persistent as v27: "
            "min(tiles, SMs) blocks, the producer running on into the next tile",
            "v28_persistent3.cu",
            192,
            512,
            min_cc=(9, 0),
            bc64=128,
            kv_buffers=3,
            arch="sm_90a",
            tma=True,
            persistent=True,
        ),
        Version(
            29,
            "lean_loop",
            _TC,
            _TC_DIMS,
            "v27 with fewer instructions per key tile: wgmma descriptors made once, running "
            "stage counters, a tree row max, four row-sum chains, a producer that sleeps",
            "v29_lean_loop.cu",
            128,
            384,
            min_cc=(9, 0),
            bc64=128,
            bc128=128,
            kv_buffers=3,
            arch="sm_90a",
            tma=True,
            persistent=True,
        ),
        Version(
            30,
            "lean3",
            _TC,
            (64,),
            "v28 (3 consumer warpgroups, Br = 192, d = 64 only) with v29's leaner loop: "
            "descriptors made once, running stage counters, tree max, a producer that sleeps",
            "v30_lean3.cu",
            192,
            512,
            min_cc=(9, 0),
            bc64=128,
            kv_buffers=3,
            arch="sm_90a",
            tma=True,
            persistent=True,
        ),
    )
}

# version=None picks, for each (dtype, d, causal), the version whose worst ratio to the fastest
# version over N = 1024 ... 16384 is highest in the recorded run (results/gpu_bench.json;
# flashref.recorded.defaults.best_worst_case, the book's one rule; a test checks that this
# table still says what that file says). float32 inputs of any head dim take version 2.
PREFERENCE: dict[tuple[str, int | None, bool], int] = {
    **{("float32", None, c): 2 for c in (False, True)},
    ("float16", 64, False): 14,
    ("float16", 64, True): 17,
    ("float16", 128, False): 17,
    ("float16", 128, True): 17,
    ("bfloat16", 64, False): 14,
    ("bfloat16", 64, True): 14,
    ("bfloat16", 128, False): 14,
    ("bfloat16", 128, True): 17,
}

# On compute capability 9.0 (H100, H200), where the sm_90a versions run, version=None picks from
# this table instead, by the same rule over N = 1024, 4096, 16384 in the recorded Hopper run
# (results/gpu_hopper.json, chapter 12; a test checks it). Every other GPU keeps PREFERENCE,
# and float32 keeps version 2 everywhere.
HOPPER_CC = (9, 0)
HOPPER_PREFERENCE: dict[tuple[str, int, bool], int] = {
    ("float16", 64, False): 30,
    ("float16", 64, True): 30,
    ("float16", 128, False): 29,
    ("float16", 128, True): 29,
    ("bfloat16", 64, False): 30,
    ("bfloat16", 64, True): 30,
    ("bfloat16", 128, False): 29,
    ("bfloat16", 128, True): 29,
}


def default_forward_version(dtype: str, d: int, causal: bool, cc: tuple[int, int] | None = None):
    """The version ``version=None`` runs for (dtype, d, causal) on a GPU of compute capability
    ``cc`` (None: the table for any GPU), or None when no version takes that dtype and d."""
    if cc == HOPPER_CC and (dtype, d, causal) in HOPPER_PREFERENCE:
        return HOPPER_PREFERENCE[dtype, d, causal]
    number = PREFERENCE.get((dtype, d, causal))
    if number is None and dtype == "float32" and d in VERSIONS[2].head_dims:
        number = PREFERENCE[("float32", None, causal)]  # any d the fp32 kernels take
    return number


def code_lines(number: int) -> list[str]:
    """The lines of version ``number``'s .cu file after its header comment."""
    return registered(VERSIONS, number, "number").code_lines()


def base_of(number: int) -> int:
    """The version that ``number`` changes, as its header's first line names it."""
    base = registered(VERSIONS, number, "number").base_number()
    return number - 1 if base is None else base


def kernel_diff(old: int, new: int) -> str:
    """What changed in the code from version ``old`` to ``new``, header comments left out.

    Lines are matched by their text without leading spaces, so a block that only moved in or
    out by a level of indentation does not show as changed; changed lines are printed as the
    new file has them, ``-`` for the old version's lines and ``+`` for the new one's.
    """
    return version_diff(registered(VERSIONS, old, "old"), registered(VERSIONS, new, "new"))


def lds_of(version: int, d: int) -> int:
    """The shared-memory row stride, in elements, of ``mma.sync`` version ``version`` at head
    dim ``d``: ``d``, or ``d + 8`` where the version pads its rows (version 4 on); what
    ``flashref.hardware.banks`` takes as ``lds``."""
    if version not in VERSIONS or VERSIONS[version].arch:
        raise ValueError(f"version must be one of the mma.sync versions 3..18, got {version!r}")
    if VERSIONS[version].dtype == "float32":
        raise ValueError(f"version {version} is fp32 and does not use ldmatrix")
    return d + 8 if VERSIONS[version].padded else d
