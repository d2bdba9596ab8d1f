// The tile copies of backward versions 1 to 7 (mma.sync, cp.async): CHUNKS (16-byte pieces
// of a row), RSTEP (rows one pass of the block's threads covers), LOG2E, and load_tile_async,
// which starts copying ROWS rows of an (N, D) matrix into shared memory, zeros past N, as one
// cp.async per piece. Version 1 (bwd01_atomic_dq.cu, whose comment explains the loop) wrote
// them; they have not changed since. Versions 1 to 7 include this file after their D,
// NTHREADS and LDS and after mma_common.cuh. load_rows (lse and D of a query tile) stays in
// each version's file: version 3 changed it (its threads past 2 Br take no row).
//
// Compiled with the version (-DHEAD_DIM=<d>, -DFLASHREF_BF16 for bfloat16).

#pragma once

constexpr int CHUNKS = D / 8;             // 16-byte pieces per row
constexpr int RSTEP = NTHREADS / CHUNKS;  // rows covered by one pass of the block's threads
constexpr float LOG2E = 1.4426950408889634f;

// start copying rows [row0, row0 + ROWS) of an (N, D) matrix into shared memory at address s,
// zeros past N. Thread tid copies piece tid % CHUNKS of rows tid / CHUNKS + k * RSTEP.
template <int ROWS>
__device__ __forceinline__ void load_tile_async(u32 s, const half_t* src, int row0, int N)
{
    const int r = threadIdx.x / CHUNKS, c = threadIdx.x % CHUNKS;
    const half_t* g = src + (size_t)(row0 + r) * D + c * 8;  // this thread's first piece
    const u32 dst = s + (r * LDS + c * 8) * 2;
    const int rows_left = N - row0 - r;
#pragma unroll
    for (int k = 0; k < ROWS / RSTEP; k++) {
        const bool ok = k * RSTEP < rows_left;
        cp_async16(dst + k * RSTEP * LDS * 2, ok ? g + k * RSTEP * D : src, ok);
    }
}
