// The frame of the split-KV decode kernels, versions 2 to 7: the block's tiling (ROWS packed
// query rows (head, query) of one K/V head, NWARPS = 4 computing warps, Bc = 64 keys per tile
// of the split rule, shared-memory rows of LDS halves), the copy geometry of its Q rows
// (CHUNKS, RSTEP), and the split kernel's last step, merge_warps_v2: the warps' states
// (m, l, O) merged through shared memory and O and lse written (one split) or the split's
// partials. Version 2 (v02_warp_rings.cu, whose comment explains the design) wrote them;
// they have not changed since. Included by version 2's file (and so by versions 3 and 4,
// which paste it in) and by versions 5 to 7, which copy K and V their own way (TMA) and end
// as version 2 does. split_merge.cuh, which merges a row's partials, comes after it.
//
// Compiled with -DHEAD_DIM=<d> (64 or 128), -DROW_TILES=<1 or 2> (and -DFLASHREF_BF16 for
// bfloat16), as every decode version from 2 on.

#pragma once

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef ROW_TILES
#define ROW_TILES 1
#endif
#define D HEAD_DIM
#define MT ROW_TILES             // 16-row groups per block (every warp holds all of them)
#define ROWS (16 * MT)           // packed query rows (head, query) per block
#define NWARPS 4
#define NTHREADS (NWARPS * 32)
#define Bc (16 * NWARPS)         // 64 keys per tile: the unit of the split rule
#define LDS (D + 8)              // shared-memory row stride in halves: +16 bytes per row
#define LDR (D + 4)              // row stride (floats) of the cross-warp merge buffer

#include "mma_common.cuh"  // typedefs, NEG_INF and the PTX wrappers: ldmatrix, mma, cp.async

constexpr int CHUNKS = D / 8;             // 16-byte pieces per row
constexpr int RSTEP = NTHREADS / CHUNKS;  // rows covered by one pass of the block's threads

// The end of the split kernel: the NWARPS warps' states (m_w, l_w, O_w) of every row merged
// through shared memory at red (the rings' space, free by now), then O and lse written (one
// split) or the split's partials. Every thread of the block calls it (it has a barrier);
// the final loop is shared by all `nthreads` of them. Versions 5 to 7 call it too.
__device__ __forceinline__ void
merge_warps_v2(float* red, const float (&o)[MT][D / 8][4], const float (&m)[MT][2],
               const float (&l)[MT][2], int warp, int nthreads, int row0, int M, size_t qrow0,
               int split, int S, float sl2, float scale, half_t* __restrict__ O,
               float* __restrict__ lse, float* __restrict__ O_part, float* __restrict__ lse_part)
{
    const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    float* Ored = red;                                      // (NWARPS, ROWS, LDR)
    float* mred = Ored + NWARPS * ROWS * LDR;               // (NWARPS, ROWS)
    float* lred = mred + NWARPS * ROWS;                     // (NWARPS, ROWS)
    if (warp < NWARPS)  // a warp that holds a state (version 5's producer warp does not)
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float lr = l[mi][h];
            lr += __shfl_xor_sync(0xffffffffu, lr, 1);
            lr += __shfl_xor_sync(0xffffffffu, lr, 2);
            const int row = mi * 16 + g + h * 8;
            if (t == 0) mred[warp * ROWS + row] = m[mi][h], lred[warp * ROWS + row] = lr;
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                *(float2*)&Ored[(warp * ROWS + row) * LDR + n * 8 + 2 * t] =
                    make_float2(o[mi][n][2 * h], o[mi][n][2 * h + 1]);
        }
    __syncthreads();
    for (int e = threadIdx.x; e < ROWS * D / 2; e += nthreads) {  // two columns per step
        const int row = e / (D / 2), col = (e % (D / 2)) * 2;
        const int R = row0 + row;
        if (R >= M) break;  // rows only grow with e
        float m_all = NEG_INF;
#pragma unroll
        for (int w = 0; w < NWARPS; w++) m_all = fmaxf(m_all, mred[w * ROWS + row]);
        float ox = 0.f, oy = 0.f, l_all = 0.f;
#pragma unroll
        for (int w = 0; w < NWARPS; w++) {
            const float mw = mred[w * ROWS + row];
            const float wt = (mw == NEG_INF) ? 0.f : ex2((mw - m_all) * sl2);  // a warp that saw nothing: 0
            const float2 ow = *(const float2*)&Ored[(w * ROWS + row) * LDR + col];
            l_all += wt * lred[w * ROWS + row];
            ox += wt * ow.x;
            oy += wt * ow.y;
        }
        const float inv = (l_all > 0.f) ? 1.f / l_all : 0.f;  // a row that saw no key: zeros
        const float lse_r = (l_all > 0.f) ? m_all * scale + logf(l_all) : NEG_INF;
        const size_t grow = qrow0 + R;  // (b, h, i) as one index
        if (S == 1) {
            ((u32*)O)[(grow * D + col) / 2] = pack_half2(ox * inv, oy * inv);
            if (col == 0) lse[grow] = lse_r;
        } else {
            *(float2*)&O_part[(grow * S + split) * D + col] = make_float2(ox * inv, oy * inv);
            if (col == 0) lse_part[grow * S + split] = lse_r;
        }
    }
}
