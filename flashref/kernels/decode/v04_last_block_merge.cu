// decode version 4: version 3 in one launch, and each warp's next copy asked for before it
// waits. The split kernel is version 2's and the merge is version 3's combine, row for row;
// what changes is who runs the merge and when, and where the refill sits in the K/V loop.
//
//   version 3: the split kernel writes every split's partial (O_s, lse_s), then a second
//   kernel merges each row's S partials. Beside a short split kernel (many splits, few keys
//   each) the second launch and its ramp are a visible part of the call.
//   version 4: each split block writes its partials, makes them visible to the whole GPU
//   (__threadfence), and one thread counts the block in: atomicAdd on a counter of its row
//   block (b, blockIdx.y). The block that sees S - 1 is the last of the row block's S splits
//   to finish; every partial of its rows is then in memory, and it merges them itself (its
//   4 warps take its rows in turn, each row with version 3's warp merge), then sets the
//   counter back to 0 for the next call. One split (S = 1) writes O directly, as before, and
//   never touches a counter.
//
//   Refills before waits (the split kernel's EARLY_REFILL): in version 2 a warp waits for
//   sub-tile it to land and only then asks for sub-tile it + STAGES_W - 1, into the buffer
//   sub-tile it - 1 left free a whole wait earlier; so while it waits, STAGES_W - 1 of its
//   sub-tiles are in flight. Here the refill is issued first and the wait follows (one more
//   __syncwarp: every lane is done with the buffer before any lane refills it), so all
//   STAGES_W are in flight while it waits, in the same shared memory. The one-split large
//   batches, whose profile showed few warps each waiting on its copies (long_scoreboard),
//   are what this is for. Bytes of K and V in flight per SM at most, 2 blocks of 4 warps,
//   16-key sub-tiles (computed from the ring, not measured):
//     d = 128, STAGES_W = 3: 8 KiB a sub-tile (K and V); 2 per warp, 128 KiB per SM before,
//                           3 per warp, 192 KiB per SM now;
//     d = 64,  STAGES_W = 5: 4 KiB a sub-tile; 4 per warp, 128 KiB per SM before,
//                           5 per warp, 160 KiB per SM now.
//   While a warp computes a sub-tile, STAGES_W - 1 are in flight, as before.
//
//   Deterministic: the merge reads the S partials in split order, whichever block runs it,
//   so the same call gives the same bits. The partials were written by other blocks of this
//   launch: they are read with ld.global.cg (through L2, not a possibly stale L1 line).
//   Counters: flashref.gpu.decode.counters keeps one zeroed buffer per (device, stream, size
//   class); a launch that fails before it runs leaves it as it was, and the buffer of a call
//   that raised is dropped, never reused.
//
//   Speed: not measured yet; python -m flashref.bench decode and profile --decode list it
//   beside versions 1 to 3 (rows flashref_v4, flashref_paged_v4; case decode_v4).
//
// Compiled at run time by NVRTC with -DHEAD_DIM=<d> (64 or 128), -DROW_TILES=<1 or 2> (and
// -DFLASHREF_BF16 for bfloat16), as version 3, whose text (and version 2's) is pasted in below.
// The ending, merge_if_last_split, is in split_merge.cuh (pasted in with version 3's text):
// version 5 ends with it too.

#include "v03_register_merge.cu"  // split_kv_v2_body<>, combine_row_v3<>, merge_if_last_split (and the v2, v3 kernels)

extern "C" __global__ void __launch_bounds__(NTHREADS, 2)
decode_split_kv_v4(const half_t* __restrict__ Q,   // (B, Hq, Nq, D)
                   const half_t* __restrict__ K,   // (num_pages, Hkv, page_size, D)
                   const half_t* __restrict__ V,   // (num_pages, Hkv, page_size, D)
                   const int* __restrict__ block_table,  // (B, max_pages), or null: contiguous
                   const int* __restrict__ lengths,      // (B,), or null: every L = page_size
                   half_t* __restrict__ O,         // (B, Hq, Nq, D)
                   float* __restrict__ lse,        // (B, Hq, Nq)
                   float* __restrict__ O_part,     // (B, Hq, Nq, S, D), written when S > 1
                   float* __restrict__ lse_part,   // (B, Hq, Nq, S), written when S > 1
                   int Hq, int Hkv, int Nq, int page_size, int max_pages, float scale, int causal,
                   unsigned* __restrict__ counters)  // (B, gridDim.y), 0 before and after
{
    split_kv_v2_body<true>(Q, K, V, block_table, lengths, O, lse, O_part, lse_part, Hq, Hkv,
                           Nq, page_size, max_pages, scale, causal);
    merge_if_last_split(O_part, lse_part, O, lse, Hq, Hkv, Nq, counters);
}
