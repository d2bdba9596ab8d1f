// decode version 7: version 6 with the first tiles asked for before the block's barrier.
// Same grid, split rule, partial layout, shared memory and combine kernel as version 6.
//
//   version 5 / 6: thread 0 makes the ring's mbarriers, the 4 consumer warps copy the
//   block's Q rows in (cp.async), and only after the block-wide barrier that follows does
//   the producer warp ask for its first tile. So every block pays two DRAM latencies in a
//   row before its first key: Q's, then the first tile's. A block of a short split (a few
//   tiles) or of a short cache spends a good part of its life there, and in a graph of
//   many such calls (a decode step) that start-up is most of the call.
//   version 7: the producer warp's lane makes the mbarriers itself and asks for the first
//   STAGES tiles (or all of the split's, if fewer) before the barrier; the consumer warps
//   load Q meanwhile. The barrier then orders the mbarriers' initialisation before the
//   consumers' first wait, as before, and the producer goes on from tile STAGES. Nothing
//   else changes: the tile loop, the masking, the merge and the combine are version 6's.
//
//   Deterministic as versions 3 to 6. Measured: the recorded run (results/gpu_decode.json,
//   rows flashref_v7 and flashref_paged_v7), printed by chapter 10; this comment holds no
//   numbers.
//
// sm_90a only, as versions 5 and 6. Compiled at run time by NVRTC with -arch=sm_90a,
// -DHEAD_DIM=<d> (64 or 128), -DROW_TILES=<1 or 2> (and -DFLASHREF_BF16 for bfloat16), as
// version 6, whose text (and versions 5 to 2's) is pasted in below.

#define V5_KERNEL decode_split_kv_v7  // version 5's split kernel under this version's name,
#define V5_PARTIALS_ONLY              // ending when its partials are written (as version 6),
#define V5_EARLY_START                // its first tiles asked for before the block's barrier
#include "decode_split_kv_v5.cu"      // the split kernel; through version 3, decode_combine_v3
