// version 15: version 14 with each row's max and sum as four independent chains, not one.
//
// What changes from version 14: each thread reduces 2 Bc / 8 scores per row to the row's
// maximum, and as many probabilities to their sum. Written as one loop, each fmaxf (or add)
// waits for the one before it: a chain of Bc / 8 dependent instructions per row, each paying
// the pipeline's latency, with only the 2 MI rows of the thread to overlap. Here four
// partial results per row are kept apart and combined at the end: the same instructions in
// a quarter of the dependent steps. (A full tree needs Bc / 8 partials per row, which pushed
// d = 64 into spills.) fmaxf is exact in any order; the sum's rounding changes only in its
// last bits (every order is an equally good fp32 sum).
//
// Measured: see the recorded run (results/gpu_bench.json, results/gpu_profile.json), printed
// by chapter 7; this comment holds no numbers, so it cannot disagree with them.
//
// Compiled at run time by NVRTC with -DHEAD_DIM=<d>, d in {64, 128} (and -DFLASHREF_BF16 for
// bfloat16 inputs); the PTX wrappers are in mma_common.cuh.
// The caller guarantees scale > 0 (a negative scale is folded into Q).

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#define D HEAD_DIM
#define MI 2                     // 16-row groups per warp
#define Br (NWARPS * 16 * MI)    // 128 query rows per block
#define Bc (D > 64 ? 64 : 128)   // key tile: FlashAttention-2's choice on sm_90
#define NWARPS 4
#define NTHREADS (NWARPS * 32)
#define LDS (D + 8)              // shared-memory row stride in halves: +16 bytes per row
#define TAU 8.0f                 // rescale when the maximum grows by more than 2^TAU

#include "mma_common.cuh"  // typedefs, NEG_INF and the PTX wrappers: ldmatrix, mma, cp.async

constexpr int CHUNKS = D / 8;             // 16-byte pieces per row
constexpr int RSTEP = NTHREADS / CHUNKS;  // rows covered by one pass of the block's threads

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

extern "C" __global__ void __launch_bounds__(NTHREADS)
flash_v15(const half_t* __restrict__ Q,  // (B*H, Nq, D)
         const half_t* __restrict__ K,  // (B*H, Nk, D)
         const half_t* __restrict__ V,  // (B*H, Nk, D)
         half_t* __restrict__ O,        // (B*H, Nq, D)
         float* __restrict__ lse,       // (B*H, Nq)
         int Nq, int Nk, float scale, int causal)
{
    extern __shared__ uint4 smem_[];
    const u32 Qs = smem_u32(smem_);                // (Br, LDS) halves, as a shared address
    const u32 Ks_buf = Qs + Br * LDS * 2;          // (2, Bc, LDS): two K tiles
    const u32 Vs_buf = Ks_buf + 2 * Bc * LDS * 2;  // (2, Bc, LDS): two V tiles

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3;
    const int bh = blockIdx.y;
    const int q_block = causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // longest blocks first
    const int q0 = q_block * Br;
    const half_t* Qb = Q + (size_t)bh * Nq * D;
    const half_t* Kb = K + (size_t)bh * Nk * D;
    const half_t* Vb = V + (size_t)bh * Nk * D;

    const int kv_end = causal ? min(Nk, q0 + Br) : Nk;
    const int n_tiles = (kv_end + Bc - 1) / Bc;
    load_tile_async<Br>(Qs, Qb, q0, Nq);  // Q_i and the first K, V tiles: one group
    load_tile_async<Bc>(Ks_buf, Kb, 0, Nk);
    load_tile_async<Bc>(Vs_buf, Vb, 0, Nk);
    cp_async_commit();

    float o[MI][D / 8][4];  // this warp's 32 x D block of O: MI row groups x D/8 tiles of 16 x 8
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int n = 0; n < D / 8; n++) o[mi][n][0] = o[mi][n][1] = o[mi][n][2] = o[mi][n][3] = 0.f;
    float m[MI][2], l[MI][2];  // rows g and g+8 of each row group; m in raw-score units
#pragma unroll
    for (int mi = 0; mi < MI; mi++) m[mi][0] = m[mi][1] = NEG_INF, l[mi][0] = l[mi][1] = 0.f;
    const int wrow0 = warp * 16 * MI;  // first row of this warp inside the block
    // each lane's byte offset inside the fragments it loads (the ldmatrix row it points at)
    const u32 a_lane = ((wrow0 + lane % 16) * LDS + (lane / 16) * 8) * 2;         // Q, A operand
    const u32 k_lane = (((lane % 8) + (lane / 16) * 8) * LDS + ((lane / 8) % 2) * 8) * 2;  // K
    const u32 v_lane = (((lane % 8) + ((lane / 8) % 2) * 8) * LDS + (lane / 16) * 8) * 2;  // V^T
    const float sl2 = scale * 1.4426950408889634f;  // exp(scale x) = 2^(sl2 x)

    for (int it = 0; it < n_tiles; it++) {
        const int c0 = it * Bc;
        const u32 Ks = Ks_buf + (it & 1) * Bc * LDS * 2 + k_lane;
        const u32 Vs = Vs_buf + (it & 1) * Bc * LDS * 2 + v_lane;
        if (it + 1 < n_tiles) {  // prefetch tile it+1 into the other buffer
            load_tile_async<Bc>(Ks_buf + ((it + 1) & 1) * Bc * LDS * 2, Kb, c0 + Bc, Nk);
            load_tile_async<Bc>(Vs_buf + ((it + 1) & 1) * Bc * LDS * 2, Vb, c0 + Bc, Nk);
        }
        cp_async_commit();  // (an empty group on the last tile keeps the count uniform)
        cp_async_wait<1>();  // everything but the newest group has landed: tile it is here
        __syncthreads();

        // S = Q_i K_j^T for this warp's 32 rows: each K fragment feeds MI mma
        float s[MI][Bc / 8][4];
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int j = 0; j < Bc / 8; j++) s[mi][j][0] = s[mi][j][1] = s[mi][j][2] = s[mi][j][3] = 0.f;
#pragma unroll
        for (int k0 = 0; k0 < D; k0 += 16) {
            u32 a[MI][4];
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
                ldsm_x4(Qs + a_lane + (mi * 16 * LDS + k0) * 2, a[mi][0], a[mi][1], a[mi][2], a[mi][3]);
#pragma unroll
            for (int j = 0; j < Bc / 8; j += 2) {
                u32 b0, b1, b2, b3;  // b0, b1 for key tile j; b2, b3 for key tile j+1
                ldsm_x4(Ks + (j * 8 * LDS + k0) * 2, b0, b1, b2, b3);
#pragma unroll
                for (int mi = 0; mi < MI; mi++) {
                    mma16816(s[mi][j], a[mi][0], a[mi][1], a[mi][2], a[mi][3], b0, b1);
                    mma16816(s[mi][j + 1], a[mi][0], a[mi][1], a[mi][2], a[mi][3], b2, b3);
                }
            }
        }

        // mask keys past Nk and, with causal, keys after the query (only tiles that need it)
        if (c0 + Bc > Nk || (causal && c0 + Bc - 1 > q0 + wrow0)) {
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int j = 0; j < Bc / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int col = c0 + j * 8 + 2 * t + (e & 1);
                        int row = q0 + wrow0 + mi * 16 + g + (e >> 1) * 8;
                        if (col >= Nk || (causal && col > row)) s[mi][j][e] = NEG_INF;
                    }
        }

        // online softmax on the fragments: h = 0 is row g (c0, c1), h = 1 is row g+8 (c2, c3)
        float mx[MI][2];
        bool grow = false;  // does any of this thread's rows need a new reference maximum?
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float part[4];  // four independent chains, then a tree of two steps
#pragma unroll
                for (int j = 0; j < 4; j++) part[j] = fmaxf(s[mi][j][2 * h], s[mi][j][2 * h + 1]);
#pragma unroll
                for (int j = 4; j < Bc / 8; j++)
                    part[j % 4] = fmaxf(part[j % 4], fmaxf(s[mi][j][2 * h], s[mi][j][2 * h + 1]));
                float x = fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3]));
                x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));  // the 4 lanes of a quad
                x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));  // share one row
                mx[mi][h] = x;
                grow |= (x - m[mi][h]) * sl2 > TAU;  // m = -inf and a finite x: true
            }
        if (__any_sync(0xffffffffu, grow)) {  // uniform across the warp
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float m_new = fmaxf(m[mi][h], mx[mi][h]);
                    float alpha = (m_new == NEG_INF) ? 1.f : ex2((m[mi][h] - m_new) * sl2);
                    m[mi][h] = m_new;
                    l[mi][h] *= alpha;
#pragma unroll
                    for (int n = 0; n < D / 8; n++) {
                        o[mi][n][2 * h] *= alpha;
                        o[mi][n][2 * h + 1] *= alpha;
                    }
                }
        }
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float m_sl2 = (m[mi][h] == NEG_INF ? 0.f : m[mi][h]) * sl2;  // nothing seen: 0
                float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int j = 0; j < Bc / 8; j++) {
                    s[mi][j][2 * h] = ex2(fmaf(s[mi][j][2 * h], sl2, -m_sl2));  // P <= 2^TAU, fp32
                    s[mi][j][2 * h + 1] = ex2(fmaf(s[mi][j][2 * h + 1], sl2, -m_sl2));
                    part[j % 4] += s[mi][j][2 * h] + s[mi][j][2 * h + 1];
                }
                l[mi][h] += (part[0] + part[1]) + (part[2] + part[3]);
            }

        // O += P V_j: each V fragment (ldmatrix.trans) feeds MI mma
#pragma unroll
        for (int kk = 0; kk < Bc / 16; kk++) {
            u32 a[MI][4];
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                a[mi][0] = pack_half2(s[mi][2 * kk][0], s[mi][2 * kk][1]);
                a[mi][1] = pack_half2(s[mi][2 * kk][2], s[mi][2 * kk][3]);
                a[mi][2] = pack_half2(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
                a[mi][3] = pack_half2(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
            }
#pragma unroll
            for (int n = 0; n < D / 8; n += 2) {
                u32 b0, b1, b2, b3;  // b0, b1 for d tile n; b2, b3 for d tile n+1
                ldsm_x4_trans(Vs + (kk * 16 * LDS + n * 8) * 2, b0, b1, b2, b3);
#pragma unroll
                for (int mi = 0; mi < MI; mi++) {
                    mma16816(o[mi][n], a[mi][0], a[mi][1], a[mi][2], a[mi][3], b0, b1);
                    mma16816(o[mi][n + 1], a[mi][0], a[mi][1], a[mi][2], a[mi][3], b2, b3);
                }
            }
        }
        __syncthreads();  // every warp is done with this buffer before it is refilled
    }

    // finish: the row sum over the quad, then O / l and lse = m * scale + log(l)
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float lr = l[mi][h];
            lr += __shfl_xor_sync(0xffffffffu, lr, 1);
            lr += __shfl_xor_sync(0xffffffffu, lr, 2);
            int row = q0 + wrow0 + mi * 16 + g + h * 8;
            if (row >= Nq) continue;
            float inv = (lr > 0.f) ? 1.f / lr : 0.f;  // a row that saw no key gets zeros
            u32* Orow = (u32*)(O + ((size_t)bh * Nq + row) * D);
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                Orow[n * 4 + t] = pack_half2(o[mi][n][2 * h] * inv, o[mi][n][2 * h + 1] * inv);
            if (t == 0) lse[(size_t)bh * Nq + row] = (lr > 0.f) ? m[mi][h] * scale + logf(lr) : NEG_INF;
        }
}
