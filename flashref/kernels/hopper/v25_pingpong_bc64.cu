// version 25: version 23's ping-pong on version 21's tile at d = 128 (Bc = 64, three K/V
// stages); d = 64 is version 23 (sm_90a only).
//
// What changes from version 23 (d = 128 only):
//   * version 22 moved d = 128 from version 21's 64-key tiles in three stages to 128-key
//     tiles in two, and the recorded run found it slower than version 21 at every d = 128
//     shape; version 23's ping-pong then made up more than that loss. Which of the two steps
//     carries the gain is not separated by those runs: this version applies the ping-pong
//     alone to version 21's tile, so that version 21 -> 25 measures the ping-pong by itself and
//     22 -> 23 the same schedule on the larger tile;
//   * Bc = 64 at d = 128: S is a chain of m64n64 wgmma, O += P V runs over 64 keys, a K or V
//     tile is 64 x 128 (two swizzled boxes of 64 rows), three stages: Q 32 KB + 3 x (16 + 16)
//     KB + 1024 for alignment, as version 21;
//   * causal: with Bc = 64 < Br = 128 the two consumer warpgroups of a diagonal block have
//     different tile counts (version 21's n_mine); version 23's turns already stay in step
//     for that case (every warpgroup takes n_tiles + 1 turns, the tiles past its rows as empty
//     turns), which tests/hardware/test_pingpong_model.py runs for every split.
// The text of version 23 is included below with these three definitions in front of it.
//
// Measured: see the recorded run (results/gpu_hopper.json), printed by chapter 12; this
// comment holds no numbers, so it cannot disagree with them.
//
// Compiled at run time by NVRTC with -arch=sm_90a, -DHEAD_DIM=<d>, d in {64, 128} (and
// -DFLASHREF_BF16 for bfloat16), with version 23's tensor maps (K, V box Bc x 64).

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#define Bc (HEAD_DIM > 64 ? 64 : 128)  // version 21's key tile
#define KV_STAGES 3                     // version 21's ring
#define FLASH_KERNEL flash_v25

#include "v23_pingpong.cu"
