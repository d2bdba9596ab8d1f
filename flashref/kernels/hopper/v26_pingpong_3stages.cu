// version 26: version 23 with three K/V stages at d = 128 (Bc = 128); d = 64 is version 23
// (sm_90a only).
//
// What changes from version 23 (d = 128 only):
//   * the profile of versions 22 and 23 at d = 128 (python -m flashref.bench profile --hopper)
//     shows their consumer warps stalled on long_scoreboard several times as often as version
//     21's, which has three stages of 64-key tiles: with 128-key tiles in two stages a
//     consumer that finishes a tile waits for the next one to land while the producer can
//     have only one more in flight;
//   * here the ring has three stages of 128 x 128 tiles: Q 32 KB + 3 x (32 + 32) KB + 1024 for
//     alignment = 225 KB of dynamic shared memory, under the 227 KB a block may opt in to on
//     sm_90 (with the barriers); one block per SM, as before;
//   * nothing else: version 23's text is included below with its tile and ring defined in
//     front of it.
//
// Measured: see the recorded run (results/gpu_hopper.json), printed by chapter 12; this
// comment holds no numbers, so it cannot disagree with them.
//
// Compiled at run time by NVRTC with -arch=sm_90a, -DHEAD_DIM=<d>, d in {64, 128} (and
// -DFLASHREF_BF16 for bfloat16), with version 23's tensor maps (K, V box 128 x 64).

#define Bc 128           // version 23's key tile at both head dims
#define KV_STAGES 3      // three stages at d = 128 as well
#define FLASH_KERNEL flash_v26

#include "v23_pingpong.cu"
