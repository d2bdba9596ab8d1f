// decode version 6: version 5's split kernel (TMA producer warp, swizzled ring) with version
// 3's separate combine kernel. Same grid, split rule, partial layout and shared memory as
// version 5; what changes is only who merges the partials, and when.
//
//   version 5 (as version 4): each split block writes its partials, makes them visible
//   (__threadfence), counts itself in on its row block's counter (atomicAdd), and the last
//   of the S blocks merges the row block's partials at the end of the split kernel. At the
//   one-split shapes (large batches) none of this runs and version 5 is the fastest; at the
//   many-split shapes the recorded run has version 3 (two launches: split kernel, then
//   decode_combine_v3) ahead of both versions 4 and 5, though version 5's copies are the
//   better ones. Version 6 separates the two effects: version 5's copies, version 3's merge.
//   version 6: version 5's split kernel, built from its text with V5_PARTIALS_ONLY: no
//   counters, no fence, no last-block merge; at S > 1 each block writes its partials
//   (O_s, lse_s) and ends, as version 2's split kernel does; at S = 1 it writes O and lse
//   directly, as before. decode_combine_v3 then merges each row's S partials in a second
//   launch, which flashref.gpu.decode makes after the split kernel (stream order: every
//   partial is written before the combine reads it, and plain loads see them).
//   The split kernel still takes K and V's tensor maps (its producer warp loads by TMA); it
//   no longer takes the counters.
//
//   Deterministic as versions 3 to 5: the combine reads a row's partials in split order.
//   Measured: the recorded run (results/gpu_decode.json, rows flashref_v6 and
//   flashref_paged_v6), printed by chapter 10; this comment holds no numbers.
//
// sm_90a only, as version 5 (flashref.gpu.decode refuses it on another GPU, and page sizes
// that are not a multiple of 64, before any work). Compiled at run time by NVRTC with
// -arch=sm_90a, -DHEAD_DIM=<d> (64 or 128), -DROW_TILES=<1 or 2> (and -DFLASHREF_BF16 for
// bfloat16), as version 5, whose text (and versions 4 to 2's) is pasted in below.

#define V5_KERNEL decode_split_kv_v6  // version 5's split kernel under this version's name,
#define V5_PARTIALS_ONLY              // ending when its partials are written (no counters)
#include "decode_split_kv_v5.cu"      // the split kernel; through version 3, decode_combine_v3
