// decode version 3: version 2's split kernel, unchanged, and a combine kernel written for
// latency. Same grid, same split rule, same partial layout; what changes is the merge.
//
//   version 2's combine: one warp per row (b, h, i); each lane owns two columns and walks
//   the S splits one after another, loading lse_s and the split's two floats of O at each
//   step (unrolled by 4). The H200 profile of version 2 at B = 1, Hkv = 8, Nk = 32k (32
//   splits) put the combine at about 40% of the call: few warps, each waiting on a chain
//   of loads (long_scoreboard the top stall).
//   version 3's combine: still one warp per row and 4 rows per block, but
//     - lse: lane j loads lse_j, lse_{j+32}, ... (every split at once, independent loads),
//       converted to base 2 (log2e folded in); the warp's max and sum by shuffles;
//     - O: lanes across d with 16-byte loads (4 floats each: D / 4 lanes per split, so a
//       warp covers one split of d = 128 or two of d = 64), and CH = 16 splits' loads issued
//       into registers before any of them is used: at S <= 16 one round trip, at S = 32 two;
//     - each split's weight 2^(lse2_s - lse2) taken from the lane that holds it by a shuffle.
//   The partial layout O_part (rows, S, D) is already what this reads coalesced: a row's S
//   splits are S * D consecutive floats, so the split kernel is not touched.
//
//   Not done here: merging in the last split block to finish (a counter per row block),
//   which would save the second launch at few splits.
//
//   Speed: not measured yet; python -m flashref.bench decode and profile --decode list it
//   beside versions 1 and 2 (rows flashref_v3, flashref_paged_v3; case decode_v3).
//
// Compiled at run time by NVRTC with -DHEAD_DIM=<d> (64 or 128), -DROW_TILES=<1 or 2> (and
// -DFLASHREF_BF16 for bfloat16), as version 2, whose text is pasted in below. The merge
// (combine_row_v3) and its kernel (decode_combine_v3) are in split_merge.cuh: versions 4 to
// 7 merge with them too.

#include "v02_warp_rings.cu"  // the split kernel decode_split_kv_v2 (and version 2's combine)
#include "split_merge.cuh"     // combine_row_v3, decode_combine_v3 (and version 4's merge_if_last_split)
