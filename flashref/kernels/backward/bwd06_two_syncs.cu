// backward version 6: version 5 with two barriers per query tile instead of three.
//
// What changes from version 5: the __syncthreads at the end of each query tile goes. It kept
// two things from being overwritten while a warp might still read them, and neither needs it:
// - the buffer of tile i (Q_i, dO_i, lse, D), refilled by the prefetch at the top of tile
//   i + 1: every warp read it last in the dV, dK products, before the barrier after dS^T is
//   stored, so all warps are past their last read before any warp starts the refill;
// - dS^T, rewritten by tile i + 1: the stores come after the barrier at the top of tile i + 1,
//   which no warp reaches before finishing its dQ product of tile i.
// The dQ product (reading dS^T and K_j) of one warp now overlaps the next tile's waiting and
// loads of the others. Nothing else changes; dQ's additions and their varying order are those
// of version 5.
//
// Layouts as in version 3 (its header) and version 1.
//
// Compiled at run time by NVRTC with -DHEAD_DIM=<d>, d in {64, 128} (and -DFLASHREF_BF16 for
// bfloat16 inputs); the PTX wrappers are in mma_common.cuh. The speed is in results/, never here.

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#define D HEAD_DIM
#define NWARPS 8           // warps per block
#define NTHREADS (NWARPS * 32)
#define Bc (NWARPS * 16)   // 128 keys per block, 16 per warp
#define Br 64              // queries per inner tile
#define LDS (D + 8)        // shared row stride of Q, K, V, dO in halves (+16 bytes: no conflicts)
#define LDSS (Br + 8)      // shared row stride of dS^T in halves

#include "mma_common.cuh"  // typedefs, NEG_INF and the PTX wrappers: ldmatrix, mma, cp.async

#include "tile_loads.cuh"  // CHUNKS, RSTEP, LOG2E, load_tile_async

// lse * log2(e) and D of queries [q0, q0 + Br) into shared memory (threads 0..Br-1 take lse,
// Br..2Br-1 take D, the others none). A query past Nq or one that saw no key (lse = -inf)
// gets +inf: P = 0.
__device__ __forceinline__ void load_rows(float* lse_s, float* D_s, const float* lse,
                                          const float* Dvec, int q0, int Nq)
{
    const int r = threadIdx.x % Br, row = q0 + r;
    const float inf = __int_as_float(0x7f800000);
    if (threadIdx.x < Br) {
        const float x = row < Nq ? lse[row] : inf;
        lse_s[r] = x == NEG_INF ? inf : x * LOG2E;
    } else if (threadIdx.x < 2 * Br) {
        D_s[r] = row < Nq ? Dvec[row] : 0.f;
    }
}

extern "C" __global__ void __launch_bounds__(NTHREADS)
flash_bwd6(const half_t* __restrict__ Q,     // (B*H, Nq, D)
           const half_t* __restrict__ K,     // (B*H, Nk, D)
           const half_t* __restrict__ V,     // (B*H, Nk, D)
           const half_t* __restrict__ dO,    // (B*H, Nq, D)
           const float* __restrict__ lse,    // (B*H, Nq), natural log, scale included
           const float* __restrict__ Dvec,   // (B*H, Nq), rowsum(dO * O)
           float* __restrict__ dQacc,        // (B*H, Nq, D), zeroed; dQ / scale is added here
           half_t* __restrict__ dK,          // (B*H, Nk, D)
           half_t* __restrict__ dV,          // (B*H, Nk, D)
           int Nq, int Nk, float scale, int causal)
{
    extern __shared__ uint4 smem_[];
    float* lse_buf = (float*)smem_;                 // (2, Br): lse * log2e of two query tiles
    float* D_buf = lse_buf + 2 * Br;                // (2, Br)
    half_t* dSs = (half_t*)(D_buf + 2 * Br);        // (Bc, LDSS): dS^T, key-major
    const u32 dS_addr = smem_u32(dSs);
    const u32 Ks = dS_addr + Bc * LDSS * 2;         // (Bc, LDS)
    const u32 Vs = Ks + Bc * LDS * 2;               // (Bc, LDS)
    const u32 Qs_buf = Vs + Bc * LDS * 2;           // (2, Br, LDS)
    const u32 dOs_buf = Qs_buf + 2 * Br * LDS * 2;  // (2, Br, LDS)

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3;
    const int bh = blockIdx.y;
    const int c0 = blockIdx.x * Bc;  // this block's first key
    const half_t* Qb = Q + (size_t)bh * Nq * D;
    const half_t* dOb = dO + (size_t)bh * Nq * D;
    const float* lse_b = lse + (size_t)bh * Nq;
    const float* D_b = Dvec + (size_t)bh * Nq;

    const int i_start = causal ? c0 / Br : 0;  // earlier query tiles see none of these keys
    const int Tr = (Nq + Br - 1) / Br;
    load_tile_async<Bc>(Ks, K + (size_t)bh * Nk * D, c0, Nk);  // K_j, V_j and the first
    load_tile_async<Bc>(Vs, V + (size_t)bh * Nk * D, c0, Nk);  // Q_i, dO_i: one group
    if (i_start < Tr) {
        load_tile_async<Br>(Qs_buf, Qb, i_start * Br, Nq);
        load_tile_async<Br>(dOs_buf, dOb, i_start * Br, Nq);
        load_rows(lse_buf, D_buf, lse_b, D_b, i_start * Br, Nq);
    }
    cp_async_commit();

    float dk[D / 8][4], dv[D / 8][4];  // this warp's 16 keys x D of dK_j and dV_j
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.f;

    const int krow0 = warp * 16;  // this warp's first key inside the tile
    // each lane's byte offset inside the fragments it loads (the ldmatrix row it points at)
    const u32 a_lane = ((krow0 + lane % 16) * LDS + (lane / 16) * 8) * 2;  // K_w, V_w as A
    const u32 b_lane = (((lane % 8) + (lane / 16) * 8) * LDS + ((lane / 8) % 2) * 8) * 2;  // Q, dO rows as B
    const u32 t_lane = (((lane % 8) + ((lane / 8) % 2) * 8) * LDS + (lane / 16) * 8) * 2;  // Q, dO, K as B^T
    // the dQ product: warp w takes queries qrow0..qrow0+15 of the tile, columns dcol0..+D/2
    const int qrow0 = (warp % 4) * 16, dcol0 = (warp / 4) * (D / 2);
    const u32 ds_lane = (((lane % 8) + (lane / 16) * 8) * LDSS + qrow0 + ((lane / 8) % 2) * 8) * 2;
    const float sl2 = scale * LOG2E;  // exp(scale x) = 2^(sl2 x)

    for (int i = i_start; i < Tr; i++) {
        const int q0 = i * Br, buf = (i - i_start) & 1;
        const u32 Qs = Qs_buf + buf * Br * LDS * 2, dOs = dOs_buf + buf * Br * LDS * 2;
        const float* lse_s = lse_buf + buf * Br;
        const float* D_s = D_buf + buf * Br;
        if (i + 1 < Tr) {  // prefetch query tile i+1 into the other buffer
            const int nb = buf ^ 1;
            load_tile_async<Br>(Qs_buf + nb * Br * LDS * 2, Qb, q0 + Br, Nq);
            load_tile_async<Br>(dOs_buf + nb * Br * LDS * 2, dOb, q0 + Br, Nq);
            load_rows(lse_buf + nb * Br, D_buf + nb * Br, lse_b, D_b, q0 + Br, Nq);
        }
        cp_async_commit();   // (an empty group on the last tile keeps the count uniform)
        cp_async_wait<1>();  // everything but the newest group has landed: tile i is here
        __syncthreads();     // tile i visible to all; every warp's dQ of tile i - 1 is done

        // S^T = K_w Q_i^T and dP^T = V_w dO_i^T: 16 keys x Br queries each
        float s[Br / 8][4], dp[Br / 8][4];
#pragma unroll
        for (int j = 0; j < Br / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.f;
#pragma unroll
        for (int k0 = 0; k0 < D; k0 += 16) {
            u32 a[4], b[4];
            ldsm_x4(Ks + a_lane + k0 * 2, a[0], a[1], a[2], a[3]);
            ldsm_x4(Vs + a_lane + k0 * 2, b[0], b[1], b[2], b[3]);
#pragma unroll
            for (int j = 0; j < Br / 8; j += 2) {
                u32 q[4], o[4];  // [0], [1] for query tile j; [2], [3] for j+1
                ldsm_x4(Qs + b_lane + (j * 8 * LDS + k0) * 2, q[0], q[1], q[2], q[3]);
                ldsm_x4(dOs + b_lane + (j * 8 * LDS + k0) * 2, o[0], o[1], o[2], o[3]);
                mma16816(s[j], a[0], a[1], a[2], a[3], q[0], q[1]);
                mma16816(s[j + 1], a[0], a[1], a[2], a[3], q[2], q[3]);
                mma16816(dp[j], b[0], b[1], b[2], b[3], o[0], o[1]);
                mma16816(dp[j + 1], b[0], b[1], b[2], b[3], o[2], o[3]);
            }
        }

        // P^T = 2^(S^T sl2 - lse log2e); element e of tile j: key g + 8 (e >> 1), query
        // 8 j + 2 t + (e & 1). Then dS^T = P^T * (dP^T - D).
        const bool edge = c0 + Bc > Nk || (causal && c0 + krow0 + 15 > q0);
#pragma unroll
        for (int j = 0; j < Br / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = j * 8 + 2 * t + (e & 1);
                float p = ex2(fmaf(s[j][e], sl2, -lse_s[col]));
                if (edge) {
                    const int key = c0 + krow0 + g + (e >> 1) * 8;
                    if (key >= Nk || (causal && key > q0 + col)) p = 0.f;
                }
                s[j][e] = p;
                dp[j][e] = p * (dp[j][e] - D_s[col]);
            }

        // dV_w += P^T dO_i and dK_w += dS^T Q_i: A from registers, B by ldmatrix.trans
#pragma unroll
        for (int kk = 0; kk < Br / 16; kk++) {
            u32 p[4], ds[4];
            p[0] = pack_half2(s[2 * kk][0], s[2 * kk][1]);
            p[1] = pack_half2(s[2 * kk][2], s[2 * kk][3]);
            p[2] = pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            p[3] = pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            ds[0] = pack_half2(dp[2 * kk][0], dp[2 * kk][1]);
            ds[1] = pack_half2(dp[2 * kk][2], dp[2 * kk][3]);
            ds[2] = pack_half2(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
            ds[3] = pack_half2(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
            // dS^T to shared memory for dQ: rows krow0 + g (+8), queries 16 kk + 2t (+8)
            u32* row_g = (u32*)(dSs + (krow0 + g) * LDSS + kk * 16 + 2 * t);
            row_g[0] = ds[0];
            row_g[4] = ds[2];
            row_g[4 * LDSS] = ds[1];  // 8 rows on: 8 * LDSS halves = 4 * LDSS words
            row_g[4 * LDSS + 4] = ds[3];
#pragma unroll
            for (int n = 0; n < D / 8; n += 2) {
                u32 b0, b1, b2, b3;  // b0, b1 for d tile n; b2, b3 for d tile n+1
                ldsm_x4_trans(dOs + t_lane + (kk * 16 * LDS + n * 8) * 2, b0, b1, b2, b3);
                mma16816(dv[n], p[0], p[1], p[2], p[3], b0, b1);
                mma16816(dv[n + 1], p[0], p[1], p[2], p[3], b2, b3);
                ldsm_x4_trans(Qs + t_lane + (kk * 16 * LDS + n * 8) * 2, b0, b1, b2, b3);
                mma16816(dk[n], ds[0], ds[1], ds[2], ds[3], b0, b1);
                mma16816(dk[n + 1], ds[0], ds[1], ds[2], ds[3], b2, b3);
            }
        }
        __syncthreads();  // dS^T of all eight warps is in shared memory

        // dQ_i += dS K_j for queries qrow0..qrow0+15, columns dcol0..dcol0+D/2-1, over Bc keys
        {
            float dq[D / 16][4];
#pragma unroll
            for (int n = 0; n < D / 16; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
#pragma unroll
            for (int k0 = 0; k0 < Bc; k0 += 16) {
                u32 a0, a1, a2, a3;
                ldsm_x4_trans(dS_addr + ds_lane + k0 * LDSS * 2, a0, a1, a2, a3);
#pragma unroll
                for (int n = 0; n < D / 16; n += 2) {
                    u32 b0, b1, b2, b3;
                    ldsm_x4_trans(Ks + t_lane + (k0 * LDS + dcol0 + n * 8) * 2, b0, b1, b2, b3);
                    mma16816(dq[n], a0, a1, a2, a3, b0, b1);
                    mma16816(dq[n + 1], a0, a1, a2, a3, b2, b3);
                }
            }
            // pair (t, t ^ 1): the even lane keeps row g and takes the odd lane's two columns
            // of it; the odd lane keeps row g + 8 and takes the even lane's two of that row
            const int odd = t & 1;
            const int row = q0 + qrow0 + g + 8 * odd;
            float* out = dQacc + ((size_t)bh * Nq + row) * D + dcol0 + 4 * (t >> 1);
#pragma unroll
            for (int n = 0; n < D / 16; n++) {
                const float give0 = odd ? dq[n][0] : dq[n][2], give1 = odd ? dq[n][1] : dq[n][3];
                const float got0 = __shfl_xor_sync(0xffffffffu, give0, 1);
                const float got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
                const float keep0 = odd ? dq[n][2] : dq[n][0], keep1 = odd ? dq[n][3] : dq[n][1];
                // columns 4 (t / 2) .. +3 of the tile: the even lane's two come first
                if (row < Nq)  // after the shuffles: every lane of the pair takes part
                    red_add_v4(out + n * 8, odd ? got0 : keep0, odd ? got1 : keep1,
                               odd ? keep0 : got0, odd ? keep1 : got1);  // 16-byte aligned
            }
        }
        // no barrier here: the next tile's top barrier orders dS^T's reuse (see the header)
    }

    // dK_j = scale * sum dS^T Q, dV_j = sum P^T dO, rows c0 + krow0 + g (+8), if < Nk
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int key = c0 + krow0 + g + 8 * h;
        if (key >= Nk) continue;
        u32* dKrow = (u32*)(dK + ((size_t)bh * Nk + key) * D);
        u32* dVrow = (u32*)(dV + ((size_t)bh * Nk + key) * D);
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            dKrow[n * 4 + t] = pack_half2(dk[n][2 * h] * scale, dk[n][2 * h + 1] * scale);
            dVrow[n * 4 + t] = pack_half2(dv[n][2 * h], dv[n][2 * h + 1]);
        }
    }
}
