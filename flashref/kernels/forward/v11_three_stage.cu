// version 11: version 10 with a three-stage cp.async pipeline and one barrier per tile.
//
// What changes from version 10: three buffers each of K and V instead of two.
// The copy of tile j+2 is issued right after the barrier at the top of tile j,
// so copies run two tiles ahead of the math, and the barrier at the end of each
// tile goes away: the buffer being refilled at tile j was last read at tile
// j-1, and every warp has passed the top barrier of tile j only after finishing
// j-1. One __syncthreads per key tile instead of two, and a deeper prefetch,
// for (Br + 6 Bc) x (D + 8) halves of shared memory.
// What the counters show against version 10: fewer barrier stalls, but they were a
// small part of all stalls; dispatch stalls grow, the tensor pipe is a little less
// busy, and the resident warps do not change (registers decide them, not the extra
// shared memory). The kernel is slower than version 10 in the recorded run: the
// two-buffer pipeline already hid the copies (version 5 had removed the warps'
// waits on global loads), and the saved barrier was not on the critical path.
//
// Measured: see the recorded run (results/gpu_bench.json, results/gpu_profile.json), printed
// by chapter 5; this comment holds no numbers, so it cannot disagree with them.
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
#define Bc (D > 64 ? 32 : 64)    // key tile: 32 at d = 128 keeps S and O in 255 registers
#define NWARPS 4
#define STAGES 3                 // K/V buffers in flight
#define NTHREADS (NWARPS * 32)
#define LDS (D + 8)              // shared-memory row stride in halves: +16 bytes per row

#include "mma_common.cuh"  // typedefs, NEG_INF and the PTX wrappers: ldmatrix, mma, cp.async

// start copying rows [row0, row0 + ROWS) of an (N, D) fp16 matrix into shared memory, zeros past N
template <int ROWS>
__device__ __forceinline__ void load_tile_async(half_t* dst, const half_t* src, int row0, int N)
{
    constexpr int CHUNKS = D / 8;  // 16-byte pieces per row
#pragma unroll
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += NTHREADS) {
        int r = i / CHUNKS, c = i % CHUNKS;
        bool ok = row0 + r < N;
        cp_async16(dst + r * LDS + c * 8, src + (ok ? (size_t)(row0 + r) * D + c * 8 : 0), ok);
    }
}

extern "C" __global__ void __launch_bounds__(NTHREADS)
flash_v11(const half_t* __restrict__ Q,  // (B*H, Nq, D)
         const half_t* __restrict__ K,  // (B*H, Nk, D)
         const half_t* __restrict__ V,  // (B*H, Nk, D)
         half_t* __restrict__ O,        // (B*H, Nq, D)
         float* __restrict__ lse,       // (B*H, Nq)
         int Nq, int Nk, float scale, int causal)
{
    extern __shared__ uint4 smem_[];
    half_t* Qs = (half_t*)smem_;             // (Br, LDS)
    half_t* Ks_buf = Qs + Br * LDS;               // (STAGES, Bc, LDS): K tiles
    half_t* Vs_buf = Ks_buf + STAGES * Bc * LDS;  // (STAGES, Bc, LDS): V tiles

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
    load_tile_async<Br>(Qs, Qb, q0, Nq);  // group 0: Q_i and K, V tile 0
    load_tile_async<Bc>(Ks_buf, Kb, 0, Nk);
    load_tile_async<Bc>(Vs_buf, Vb, 0, Nk);
    cp_async_commit();
    if (n_tiles > 1) {  // group 1: K, V tile 1
        load_tile_async<Bc>(Ks_buf + Bc * LDS, Kb, Bc, Nk);
        load_tile_async<Bc>(Vs_buf + Bc * LDS, Vb, Bc, Nk);
    }
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
    const float sl2 = scale * 1.4426950408889634f;  // exp(scale x) = 2^(sl2 x)

    for (int it = 0; it < n_tiles; it++) {
        const int c0 = it * Bc;
        const half_t* Ks = Ks_buf + (it % STAGES) * Bc * LDS;
        const half_t* Vs = Vs_buf + (it % STAGES) * Bc * LDS;
        cp_async_wait<1>();  // groups 0 .. it have landed (only tile it+1 may be in flight)
        __syncthreads();     // tile it is visible to all; every warp is done with tile it-1
        if (it + 2 < n_tiles) {  // refill the buffer of tile it-1 with tile it+2
            load_tile_async<Bc>(Ks_buf + ((it + 2) % STAGES) * Bc * LDS, Kb, c0 + 2 * Bc, Nk);
            load_tile_async<Bc>(Vs_buf + ((it + 2) % STAGES) * Bc * LDS, Vb, c0 + 2 * Bc, Nk);
        }
        cp_async_commit();  // (empty groups near the end keep the count uniform)

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
                ldsm_x4(Qs + (wrow0 + mi * 16 + (lane % 16)) * LDS + k0 + (lane / 16) * 8,
                        a[mi][0], a[mi][1], a[mi][2], a[mi][3]);
#pragma unroll
            for (int j = 0; j < Bc / 8; j += 2) {
                u32 b0, b1, b2, b3;  // b0, b1 for key tile j; b2, b3 for key tile j+1
                ldsm_x4(Ks + (j * 8 + (lane % 8) + (lane / 16) * 8) * LDS + k0 + ((lane / 8) % 2) * 8,
                        b0, b1, b2, b3);
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
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float mx = NEG_INF;
#pragma unroll
                for (int j = 0; j < Bc / 8; j++) mx = fmaxf(mx, fmaxf(s[mi][j][2 * h], s[mi][j][2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the 4 lanes of a quad
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));  // share one row
                float m_new = fmaxf(m[mi][h], mx);
                float m_use = (m_new == NEG_INF) ? 0.f : m_new;  // nothing seen yet: shift by 0
                float alpha = ex2((m[mi][h] - m_use) * sl2);
                m[mi][h] = m_new;
                const float m_sl2 = m_use * sl2;
                float sum = 0.f;
#pragma unroll
                for (int j = 0; j < Bc / 8; j++)
#pragma unroll
                    for (int e = 2 * h; e < 2 * h + 2; e++) {
                        s[mi][j][e] = ex2(fmaf(s[mi][j][e], sl2, -m_sl2));  // P, still fp32
                        sum += s[mi][j][e];
                    }
                l[mi][h] = alpha * l[mi][h] + sum;
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    o[mi][n][2 * h] *= alpha;
                    o[mi][n][2 * h + 1] *= alpha;
                }
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
                ldsm_x4_trans(Vs + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LDS + n * 8 + (lane / 16) * 8,
                              b0, b1, b2, b3);
#pragma unroll
                for (int mi = 0; mi < MI; mi++) {
                    mma16816(o[mi][n], a[mi][0], a[mi][1], a[mi][2], a[mi][3], b0, b1);
                    mma16816(o[mi][n + 1], a[mi][0], a[mi][1], a[mi][2], a[mi][3], b2, b3);
                }
            }
        }
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
