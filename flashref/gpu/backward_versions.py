"""The numbered backward kernel versions (bwd1, bwd2, ...): what each is, how it is launched.

Beside the forward's ``VERSIONS`` (``forward_versions.py``), on the same base
(``registry.KernelVersion``): a backward version is one ``flashref/kernels/backward/bwdNN_*.cu``
file holding the main kernel ``flash_bwdN``; the preprocess ``D = rowsum(dO * O)`` and the dQ
conversion around it are shared by every version (``backward/pre_post.cu``). Nothing here imports
CuPy, so the registry can be read, and the sources compiled with nvcc, on a machine without a GPU.
``base_of`` and ``kernel_diff`` say what one version changes from the one it builds on, as the
forward's do (``forward_versions.kernel_diff``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..hardware.backward_grid import BackwardGrid, BackwardTiles, tiles_grid
from .registry import KERNEL_DIR, KernelVersion, paste_includes, registered, version_diff

PRE_POST_FILE = "backward/pre_post.cu"  # bwd_preprocess and bwd_dq_convert
PRE_THREADS = 128  # bwd_preprocess: threads per block, d / 8 of them per row
CONVERT_THREADS = 256  # bwd_dq_convert: threads per block, two elements each
DQ_ROW_BYTES = 64 * 4 + 32  # a staged row of dQ (dq_bulk): 64 floats and 32 bytes of padding


def pre_post_source() -> str:
    return paste_includes(KERNEL_DIR / PRE_POST_FILE)


@dataclass(frozen=True)
class BwdVersion(KernelVersion):
    """One backward version: its main kernel's file, tile sizes and what dQ costs."""

    number: int
    name: str
    summary: str
    file: str  # under flashref/kernels/backward/
    Bc: int  # keys per thread block (the block owns dK_j, dV_j of these)
    Br: int  # queries per inner tile
    threads: int
    # False: dQ is summed with float32 atomics, in a varying order, then converted. True: a
    # second kernel flash_bwdN_dq computes dQ per query tile and writes it once.
    deterministic_dq: bool
    dtypes: tuple[str, ...] = ("float16", "bfloat16")
    head_dims: tuple[int, ...] = (64, 128)
    min_cc: tuple[int, int] = (8, 0)  # mma.sync m16n8k16 bf16, cp.async, ldmatrix
    arch: str | None = None  # an architecture-specific target ("sm_90a"): that GPU only
    tma: bool = False  # takes the TMA descriptors of Q, K, V, dO after the common arguments
    # float32 atomic additions into each dQ element per key tile of Bc keys (where dQ is added
    # by atomics): 1 where the block sums dS K_j over all its keys first, NWG where each of
    # NWG consumer warpgroups adds its own keys' share
    dq_adds_per_tile: int = 1
    # (d, blocks): thread blocks per SM that the kernel's __launch_bounds__ keeps the registers
    # low enough for at head dim d (the compile check holds ptxas's count and the shared memory
    # to it); a d not listed makes no such promise
    blocks_per_sm: tuple[tuple[int, int], ...] = ()
    # True: each consumer warpgroup stages its share of dQ_i in shared memory (64 rows of 64
    # floats, rows DQ_ROW_BYTES apart) and the copy engine adds it to dQacc, one bulk
    # reduce-add per row
    dq_bulk: bool = False
    # True: the consumers stage dQ_i in shared memory (Br rows of d floats, 4 d +
    # dq_stage_pad bytes apart) and a producer warp adds it to dQacc with bulk reduce-adds:
    # one per row where the rows are padded, one per 32 rows where they are dense (and so
    # contiguous, as in dQacc)
    dq_writer: bool = False
    # the bytes of padding after each staged row of a dq_writer version (rows 4 d + this apart)
    dq_stage_pad: int = 32
    # staging buffers of a dq_writer version (2: tile i + 1 is stored while tile i is sent)
    dq_stage_buffers: int = 1
    # True: each consumer warpgroup computes its share of dQ_i's columns (d / 2: m64n32k16 at
    # d = 64) over all Bc keys on every tile, instead of one consumer the whole of it in turn
    dq_columns_split: bool = False
    # True: the staging buffer is d / 32 boxes of Br rows x 32 floats in the 128-byte swizzle,
    # and the writer adds each box to dQacc with a tensor-map reduce-add
    # (cp.reduce.async.bulk.tensor); the kernel takes dQacc's map (_launch.dq_tensor_map)
    # after the other four
    dq_tensor_map: bool = False

    kind = "backward "  # how errors name it: "backward version 8 (wgmma)"
    folder = "backward"

    @property
    def kernel(self) -> str:
        return f"flash_bwd{self.number}"

    def dq_adds(self, Nk: int) -> int:
        """Float32 additions into each element of dQacc for ``Nk`` keys (0 without atomics):
        the number of terms whose order varies from run to run."""
        if self.deterministic_dq:
            return 0
        return -(-Nk // self.Bc) * self.dq_adds_per_tile

    @property
    def dq_kernel(self) -> str | None:
        return f"flash_bwd{self.number}_dq" if self.deterministic_dq else None

    def smem_bytes(self, d: int) -> int:
        """Dynamic shared memory of the main kernel, matching the layout in the .cu file:
        lse and D of two query tiles (fp32), dS^T (Bc, Br + 8) where dQ is added by atomics,
        K_j and V_j (Bc, d + 8), two buffers each of Q_i and dO_i (Br, d + 8), 16-bit. A TMA
        version's tiles are unpadded (the 128-byte swizzle), its dS^T has two buffers, and
        1024 bytes align the first tile (lse and D are in static shared memory there)."""
        if self.tma:  # K_j, V_j (Bc, d); 2 stages of Q_i, dO_i (Br, d); dS^T (2, Bc, Br)
            tiles = 2 * (2 * self.Bc * d + 4 * self.Br * d + 2 * self.Bc * self.Br) + 1024
            stage = (self.Bc // 64) * 64 * DQ_ROW_BYTES if self.dq_bulk else 0
            if self.dq_writer:
                stage = self.dq_stage_buffers * self.Br * (4 * d + self.dq_stage_pad)
            return tiles + stage
        row = d + 8
        dS = 0 if self.deterministic_dq else self.Bc * (self.Br + 8)
        return 4 * 4 * self.Br + 2 * (dS + 2 * self.Bc * row + 4 * self.Br * row)

    def dq_smem_bytes(self, d: int) -> int:
        """The dQ pass (``dq_kernel``): Q_i and dO_i (Br, d + 8), two buffers each of K_j and
        V_j (Bc, d + 8), 16-bit."""
        return 2 * (2 * self.Br + 4 * self.Bc) * (d + 8)


BWD_VERSIONS: dict[int, BwdVersion] = {
    v.number: v
    for v in (
        BwdVersion(
            1,
            "atomic_dq",
            "FlashAttention-2's backward on mma.sync: K/V tile per block, 4 warps of 16 "
            "keys, S^T and dP^T recomputed per query tile, dQ by float32 atomics",
            "bwd01_atomic_dq.cu",
            Bc=64,
            Br=64,
            threads=128,
            deterministic_dq=False,
        ),
        BwdVersion(
            2,
            "dq_pass",
            "bwd1 without atomics: dK, dV kernel, then a dQ kernel per query tile that "
            "recomputes S and dP (7 products instead of 5, dQ deterministic)",
            "bwd02_dq_pass.cu",
            Bc=64,
            Br=64,
            threads=128,
            deterministic_dq=True,
        ),
        BwdVersion(
            3,
            "bc128",
            "bwd1 with 8 warps and Bc = 128: each query tile copied serves twice the "
            "keys, half the dQ atomics",
            "bwd03_bc128.cu",
            Bc=128,
            Br=64,
            threads=256,
            deterministic_dq=False,
        ),
        BwdVersion(
            4,
            "red_v2",
            "bwd3 adding dQ with red.global.add.v2.f32: one atomic per two elements",
            "bwd04_red_pairs.cu",
            Bc=128,
            Br=64,
            threads=256,
            deterministic_dq=False,
        ),
        BwdVersion(
            5,
            "red_v4",
            "bwd4 adding dQ with red.global.add.v4.f32 after one exchange between lane "
            "pairs: one atomic per four elements",
            "bwd05_red_quads.cu",
            Bc=128,
            Br=64,
            threads=256,
            deterministic_dq=False,
        ),
        BwdVersion(
            6,
            "two_syncs",
            "bwd5 without the barrier at the end of each query tile: the next tile's "
            "first barrier already orders the reuse of dS^T and the buffers",
            "bwd06_two_syncs.cu",
            Bc=128,
            Br=64,
            threads=256,
            deterministic_dq=False,
        ),
        BwdVersion(
            7,
            "bc64_occupancy",
            "bwd6 with 4 warps and Bc = 64, registers held to three blocks per SM at "
            "d = 64 (two at d = 128): more warps per scheduler, twice the dQ atomics",
            "bwd07_bc64_occupancy.cu",
            Bc=64,
            Br=64,
            threads=128,
            deterministic_dq=False,
            blocks_per_sm=((64, 3), (128, 2)),
        ),
        BwdVersion(
            8,
            "wgmma",
            "FlashAttention-3's backward on sm_90a: a producer warpgroup (TMA ring of "
            "Q_i, dO_i; lse, D by plain loads), 2 consumer warpgroups of 64 keys (Bc = "
            "128), all five products by wgmma, dS^T from shared memory as a transposed "
            "A, dQ by red.global.add.v4",
            "bwd08_wgmma.cu",
            Bc=128,
            Br=64,
            threads=384,
            deterministic_dq=False,
            min_cc=(9, 0),
            arch="sm_90a",
            tma=True,
            dq_adds_per_tile=2,
        ),
        BwdVersion(
            9,
            "bulk_dq",
            "bwd8 adding dQ by the copy engine: each warp stages its rows of dQ_i in "
            "shared memory and sends each row with one bulk reduce-add "
            "(cp.reduce.async.bulk) instead of red.global.add.v4 after a shuffle",
            "bwd09_bulk_dq.cu",
            Bc=128,
            Br=64,
            threads=384,
            deterministic_dq=False,
            min_cc=(9, 0),
            arch="sm_90a",
            tma=True,
            dq_adds_per_tile=2,
            dq_bulk=True,
        ),
        BwdVersion(
            10,
            "early_dv",
            "bwd9 issuing dV += P^T dO as soon as P^T is packed, so that the tensor "
            "cores compute it while the warpgroup computes dS^T",
            "bwd10_early_dv.cu",
            Bc=128,
            Br=64,
            threads=384,
            deterministic_dq=False,
            min_cc=(9, 0),
            arch="sm_90a",
            tma=True,
            dq_adds_per_tile=2,
            dq_bulk=True,
        ),
        BwdVersion(
            11,
            "dq_once",
            "bwd8 computing dQ_i once per block over all 128 keys, by the two consumer "
            "warpgroups in turn (a 256-thread named barrier on dS^T): half the dQ "
            "atomics",
            "bwd11_dq_once.cu",
            Bc=128,
            Br=64,
            threads=384,
            deterministic_dq=False,
            min_cc=(9, 0),
            arch="sm_90a",
            tma=True,
            dq_adds_per_tile=1,
        ),
        BwdVersion(
            12,
            "dq_writer",
            "bwd11 with dQ_i sent by a producer warp: the dQ consumer stages it in "
            "shared memory and goes on, and the warp adds each row with one bulk "
            "reduce-add (FlashAttention-3's dQ writer)",
            "bwd12_dq_writer.cu",
            Bc=128,
            Br=64,
            threads=384,
            deterministic_dq=False,
            min_cc=(9, 0),
            arch="sm_90a",
            tma=True,
            dq_adds_per_tile=1,
            dq_writer=True,
        ),
        BwdVersion(
            13,
            "dq_split",
            "bwd12 with dQ_i split by columns between the two consumers, each over all "
            "128 keys on every tile (FlashAttention-3's split), staged while dK's wgmma "
            "runs",
            "bwd13_dq_split.cu",
            Bc=128,
            Br=64,
            threads=384,
            deterministic_dq=False,
            min_cc=(9, 0),
            arch="sm_90a",
            tma=True,
            dq_adds_per_tile=1,
            dq_writer=True,
            dq_columns_split=True,
        ),
        BwdVersion(
            14,
            "dq_two_copies",
            "bwd13 sending dQ_i in two bulk reduce-adds of 32 rows instead of one per "
            "row: the staging buffer is dense, so 32 rows are one contiguous run of dQacc",
            "bwd14_dq_two_copies.cu",
            Bc=128,
            Br=64,
            threads=384,
            deterministic_dq=False,
            min_cc=(9, 0),
            arch="sm_90a",
            tma=True,
            dq_adds_per_tile=1,
            dq_writer=True,
            dq_stage_pad=0,
            dq_columns_split=True,
        ),
        BwdVersion(
            15,
            "dq_two_buffers",
            "bwd14 with two dQ staging buffers: the consumers store tile i + 1 while the "
            "copy engine still reads tile i",
            "bwd15_dq_two_buffers.cu",
            Bc=128,
            Br=64,
            threads=384,
            deterministic_dq=False,
            min_cc=(9, 0),
            arch="sm_90a",
            tma=True,
            dq_adds_per_tile=1,
            dq_writer=True,
            dq_stage_pad=0,
            dq_stage_buffers=2,
            dq_columns_split=True,
        ),
        BwdVersion(
            16,
            "dq_tensor_reduce",
            "bwd14 with dQ_i staged in the 128-byte swizzle (no bank conflicts in the "
            "consumers' stores) and sent by a tensor-map reduce-add per 32 columns",
            "bwd16_dq_tensor_reduce.cu",
            Bc=128,
            Br=64,
            threads=384,
            deterministic_dq=False,
            min_cc=(9, 0),
            arch="sm_90a",
            tma=True,
            dq_adds_per_tile=1,
            dq_writer=True,
            dq_stage_pad=0,
            dq_columns_split=True,
            dq_tensor_map=True,
        ),
        BwdVersion(
            17,
            "br128",
            "bwd16 with query tiles of 128 rows at d = 64: S^T and dP^T m64n128, dQ_i "
            "split by rows (m64n64 each), half the tiles and barriers per key block",
            "bwd17_br128.cu",
            Bc=128,
            Br=128,
            threads=384,
            deterministic_dq=False,
            head_dims=(64,),
            min_cc=(9, 0),
            arch="sm_90a",
            tma=True,
            dq_adds_per_tile=1,
            dq_writer=True,
            dq_stage_pad=0,
            dq_tensor_map=True,
        ),
        BwdVersion(
            18,
            "dq_store_order",
            "bwd16 with the consumers' dQ_i stores reordered (lanes t = 2, 3 store column "
            "group n ^ 2) so that the swizzle serves each in two wavefronts, not four",
            "bwd18_dq_store_order.cu",
            Bc=128,
            Br=64,
            threads=384,
            deterministic_dq=False,
            min_cc=(9, 0),
            arch="sm_90a",
            tma=True,
            dq_adds_per_tile=1,
            dq_writer=True,
            dq_stage_pad=0,
            dq_columns_split=True,
            dq_tensor_map=True,
        ),
        BwdVersion(
            19,
            "br128_store_order",
            "bwd17 with version 18's order of the dQ_i stores (d = 64)",
            "bwd19_br128_store_order.cu",
            Bc=128,
            Br=128,
            threads=384,
            deterministic_dq=False,
            head_dims=(64,),
            min_cc=(9, 0),
            arch="sm_90a",
            tma=True,
            dq_adds_per_tile=1,
            dq_writer=True,
            dq_stage_pad=0,
            dq_tensor_map=True,
        ),
    )
}

# version=None picks, for each (dtype, d, causal), the backward version whose worst ratio to the
# fastest over the sequence lengths of the recorded run, results/gpu_backward.json, is highest
# (flashref.recorded.defaults.best_backward, the book's one rule, best_worst_case): on
# compute capability 9.0 among every version (BWD_HOPPER_PREFERENCE), on any other GPU among
# those that run there, the ones not built for sm_90a (BWD_PREFERENCE). A test checks both
# tables against the file.
BWD_PREFERENCE = {
    ("float16", 64, False): 2,
    ("float16", 64, True): 2,
    ("float16", 128, False): 6,
    ("float16", 128, True): 4,
    ("bfloat16", 64, False): 2,
    ("bfloat16", 64, True): 2,
    ("bfloat16", 128, False): 6,
    ("bfloat16", 128, True): 4,
}
BWD_HOPPER_PREFERENCE = {
    ("float16", 64, False): 19,
    ("float16", 64, True): 19,
    ("float16", 128, False): 18,
    ("float16", 128, True): 18,
    ("bfloat16", 64, False): 19,
    ("bfloat16", 64, True): 19,
    ("bfloat16", 128, False): 18,
    ("bfloat16", 128, True): 18,
}


def default_bwd_version(dtype: str, d: int, causal: bool, cc=None) -> int | None:
    """The backward version ``version=None`` runs on a GPU of compute capability ``cc``
    (None: any GPU's table), or None when no version takes that dtype and d."""
    table = BWD_HOPPER_PREFERENCE if cc is not None and tuple(cc) == (9, 0) else BWD_PREFERENCE
    return table.get((dtype, d, causal))


def code_lines(number: int) -> list[str]:
    """The lines of backward version ``number``'s .cu file after its header comment."""
    return registered(BWD_VERSIONS, number, "number").code_lines()


def base_of(number: int) -> int | None:
    """The backward version that ``number`` changes, as the first line of its header names it
    (``// backward version 3: version 1 with ...``); None for a version that builds on none."""
    return registered(BWD_VERSIONS, number, "number").base_number()


def kernel_diff(old: int, new: int) -> str:
    """The code lines that differ from backward version ``old`` to ``new``, header comments
    and indentation-only moves left out (the rules of the forward's ``kernel_diff``)."""
    a = registered(BWD_VERSIONS, old, "old")
    b = registered(BWD_VERSIONS, new, "new")
    return version_diff(a, b)


def backward_tiles(number: int) -> BackwardTiles:
    """What backward version ``number`` fixes of its grid (``flashref.hardware.backward_grid``):
    its tiles and how it adds dQ."""
    v = registered(BWD_VERSIONS, number, "number")
    return BackwardTiles(v.number, v.Bc, v.Br, v.dq_adds_per_tile, not v.deterministic_dq)


def version_grid(number: int, Nq: int, Nk: int, causal: bool = False) -> BackwardGrid:
    """``backward_grid`` with backward version ``number``'s tiles and way of adding dQ."""
    return tiles_grid(backward_tiles(number), Nq, Nk, causal)
