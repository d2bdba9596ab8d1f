// version 22: version 21 with FlashAttention-3's 128 x 128 tile at d = 128: Bc = 128 and two
// K/V stages (sm_90a only).
//
// What changes from version 21 (d = 128 only; d = 64 compiles to version 21's kernel):
//   * version 21 takes version 14's Bc = 64 at d = 128, so each S = Q K^T is a chain of m64n64
//     wgmma and each O += P V has only 64 keys (4 wgmma of k = 16). The fixed costs of a tile
//     (the full-barrier wait, the wgmma fences, commit and wait, the softmax's row reductions,
//     shuffles and the __any_sync of the lazy rescale, the rescale of O) are paid once per 64
//     keys. Here Bc = 128: S is m64n128 (as at d = 64), O += P V runs over 128 keys (8 wgmma),
//     and the fixed costs are paid once per 128 keys, half as often per FLOP;
//   * a K or V tile is 128 x 128: two swizzled boxes of 128 rows x 64 columns (32 KB), so V's
//     descriptor LBO (BOX_KV) is 16384 bytes. Shared memory: Q 32 KB + 2 stages x (32 + 32) KB
//     + 1024 for alignment = 161 KB (three stages would be 225 KB: they fit the 227 KB opt-in
//     too, but two is FlashAttention-3's choice for this tile and leaves room to spare);
//   * registers per consumer thread: S (64 floats), O (64) and the packed P of the tile before
//     (32) are live at once during the overlap, 160 of the 240 that setmaxnreg gives; ptxas
//     reports no spills (tests/gpu/test_kernels_compile.py checks it);
//   * causal: with Bc = Br = 128 both consumer warpgroups of a block have the same tiles
//     (n_mine = n_tiles), so the loop that only releases the other warpgroup's tiles runs
//     for neither; it stays for the general rule.
// Everything else (the producer, the skewed loop, ragged N, lse) is version 21's, whose text
// is included below with this tile and ring defined in front of it.
//
// Measured: see the recorded run (results/gpu_hopper.json), printed by chapter 12; this
// comment holds no numbers, so it cannot disagree with them.
//
// Compiled at run time by NVRTC with -arch=sm_90a, -DHEAD_DIM=<d>, d in {64, 128} (and
// -DFLASHREF_BF16 for bfloat16). The caller guarantees scale > 0 (a negative scale is folded
// into Q) and passes the tensor maps of Q (box 64 x 64) and K, V (box 128 x 64) viewed as
// (B*H*N, d) (flashref.gpu.tma.tensor_map).

#define Bc 128                   // key tile at both head dims
#define KV_STAGES (D > 64 ? 2 : 3)  // K/V tiles the producer may have in flight
#define FLASH_KERNEL flash_v22

#include "v21_overlap.cu"
