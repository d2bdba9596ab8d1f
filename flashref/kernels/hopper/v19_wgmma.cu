// version 19: version 14's online softmax on Hopper's own instructions: wgmma for both
// products, K/V tiles by TMA into a ring of two stages guarded by mbarriers (sm_90a only).
//
// What changes from version 14 (the instructions, not the algorithm):
//   * a block is NWG = 2 warpgroups of 128 threads; warpgroup wg owns query rows
//     64 wg .. 64 wg + 63 of the block (Br = 128), and inside them warp w of the warpgroup
//     owns 16 rows, exactly as a version-14 warp owns one of its 16-row groups;
//   * Q is loaded once by TMA, K and V tiles of Bc keys by TMA into a ring of two stages.
//     Stage s has a "full" barrier (TMA's bytes landed; wait parity = use of the stage % 2)
//     and an "empty" barrier (all NTHREADS threads finished reading it). Thread 0 issues
//     every copy: at the top of tile `it` it waits until tile it - 1 has left its stage and
//     refills that stage with tile it + 1, so one tile is in flight while one is computed;
//   * every shared tile is a set of 64-column boxes in the 128-byte swizzle (d = 128: two
//     boxes per tile), read by wgmma through descriptors (hopper_common.cuh);
//   * S = Q K^T is an SS wgmma m64nBck16 per 16 of d; the accumulator of each warp has the
//     mma.sync C layout, so version 14's masking, row max (one quad shuffle), lazy rescale
//     (TAU) and row sum read line for line; P is packed in registers into the RS A layout and
//     O += P V is an RS wgmma m64nDk16 per 16 keys, V read MN-major from its [key][d] tile;
//   * ragged N: rows of a (B*H*N, d) tensor map past its end read as zeros; a key tile that
//     runs into the next head reads that head's keys, and every key >= Nk is masked to -inf
//     in S (so P is 0 there); rows >= Nq are computed but not stored.
//   * causal: tiles past the block's diagonal are not loaded; a warpgroup whose 64 rows all
//     precede a tile skips its products (it still waits for and releases the stage).
// No warp specialisation yet: the warps that compute also wait for the copies.
//
// Measured: see the recorded run (results/gpu_bench.json), printed by chapter 7; this
// comment holds no numbers, so it cannot disagree with them.
//
// Compiled at run time by NVRTC with -arch=sm_90a, -DHEAD_DIM=<d>, d in {64, 128} (and
// -DFLASHREF_BF16 for bfloat16). The caller guarantees scale > 0 (a negative scale is folded
// into Q) and passes the tensor maps of Q (box 64 x 64) and K, V (box Bc x 64) viewed as
// (B*H*N, d) (flashref.gpu.tma.tensor_map).

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#define D HEAD_DIM
#define NWG 2                    // consumer warpgroups per block
#define Br (NWG * 64)            // 128 query rows per block
#define Bc (D > 64 ? 64 : 128)   // key tile, as version 14
#define NTHREADS (NWG * 128)
#define NBOX (D / 64)            // 64-column boxes per row of a tile
#define TAU 8.0f                 // rescale when the maximum grows by more than 2^TAU

#include "mma_common.cuh"     // half_t, u32, NEG_INF, pack_half2, ex2, smem_u32
#include "hopper_common.cuh"  // wgmma, descriptors, mbarrier, TMA

constexpr u32 Q_BYTES = Br * D * 2;       // (NBOX, Br, 64) swizzled
constexpr u32 KV_BYTES = Bc * D * 2;      // one K or V tile: (NBOX, Bc, 64) swizzled
constexpr u32 BOX_Q = Br * 128;           // bytes from one 64-column box of Q to the next
constexpr u32 BOX_KV = Bc * 128;          // ... of a K or V tile (V's descriptor LBO)

__shared__ alignas(8) u64 bars_[5];  // Q, full[2], empty[2]

// S (64 x Bc) = Q_wg K^T: k = D in steps of 16, box kb = ks / 4, step ks % 4 inside it
__device__ __forceinline__ void qk(float (&s)[Bc / 2], u32 q, u32 k)
{
#pragma unroll
    for (int i = 0; i < Bc / 2; i++) s[i] = 0.f;
    wgmma_fence_acc(s);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        const u64 da = desc_kmajor_sw128(q + (ks / 4) * BOX_Q, ks % 4);
        const u64 db = desc_kmajor_sw128(k + (ks / 4) * BOX_KV, ks % 4);
#if Bc == 64
        wgmma_ss_n64<0>(s, da, db, 1);
#else
        wgmma_ss_n128<0>(s, da, db, 1);
#endif
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_acc(s);
}

// O (64 x D) += P V: P's A fragments from the accumulator columns of S, 16 keys per wgmma
__device__ __forceinline__ void pv(float (&o)[D / 2], const float (&s)[Bc / 2], u32 v)
{
    u32 a[Bc / 16][4];
#pragma unroll
    for (int kk = 0; kk < Bc / 16; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) a[kk][r] = pack_half2(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
    wgmma_fence_acc(o);
    wgmma_fence();  // after the last ordinary write of a and o
#pragma unroll
    for (int kk = 0; kk < Bc / 16; kk++) {
        const u64 dv = desc_mnmajor_sw128(v, kk, BOX_KV);
#if D == 64
        wgmma_rs_n64<1>(o, a[kk][0], a[kk][1], a[kk][2], a[kk][3], dv, 1);
#else
        wgmma_rs_n128<1>(o, a[kk][0], a[kk][1], a[kk][2], a[kk][3], dv, 1);
#endif
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_acc(o);
}

// thread 0: tile `tile` of K and V into stage `st`, counted on barrier full
__device__ __forceinline__ void load_kv(u32 Ks, u32 Vs, const TensorMap* kmap, const TensorMap* vmap,
                                        int row0, u32 full)
{
    mbar_arrive_expect_tx(full, 2 * KV_BYTES);
#pragma unroll
    for (int b = 0; b < NBOX; b++) {
        tma_load_2d(Ks + b * BOX_KV, kmap, 64 * b, row0, full);
        tma_load_2d(Vs + b * BOX_KV, vmap, 64 * b, row0, full);
    }
}

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
flash_v19(const half_t* __restrict__ Q,  // (B*H, Nq, D), read through qmap
          const half_t* __restrict__ K,  // (B*H, Nk, D), read through kmap
          const half_t* __restrict__ V,  // (B*H, Nk, D), read through vmap
          half_t* __restrict__ O,        // (B*H, Nq, D)
          float* __restrict__ lse,       // (B*H, Nq)
          int Nq, int Nk, float scale, int causal,
          const __grid_constant__ TensorMap qmap,   // (B*H*Nq, D), box (64, 64)
          const __grid_constant__ TensorMap kmap,   // (B*H*Nk, D), box (Bc, 64)
          const __grid_constant__ TensorMap vmap)   // (B*H*Nk, D), box (Bc, 64)
{
    extern __shared__ uint4 smem_[];
    const u32 Qs = (smem_u32(smem_) + 1023) & ~1023u;  // (NBOX, Br, 64), 1024-byte aligned
    const u32 Ks_buf = Qs + Q_BYTES;                    // (2, NBOX, Bc, 64): stage st at + st KV_BYTES
    const u32 Vs_buf = Ks_buf + 2 * KV_BYTES;           // (2, NBOX, Bc, 64)
    const u32 qbar = smem_u32(&bars_[0]);
    const u32 full0 = qbar + 8, empty0 = qbar + 24;     // stage st: + 8 st

    const int wg = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3;
    const int bh = blockIdx.y;
    const int q_block = causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // longest blocks first
    const int q0 = q_block * Br;
    const int wrow0 = wg * 64 + warp * 16;  // first row of this warp inside the block

    const int kv_end = causal ? min(Nk, q0 + Br) : Nk;
    const int n_tiles = (kv_end + Bc - 1) / Bc;

    if (threadIdx.x == 0) {
        mbar_init(qbar, 1);
        for (int st = 0; st < 2; st++) {
            mbar_init(full0 + 8 * st, 1);
            mbar_init(empty0 + 8 * st, NTHREADS);
        }
        mbar_fence_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // Q_i (both warpgroups' rows) and the first K, V tile
        mbar_arrive_expect_tx(qbar, Q_BYTES);
#pragma unroll
        for (int b = 0; b < NBOX; b++)
#pragma unroll
            for (int w = 0; w < NWG; w++)
                tma_load_2d(Qs + b * BOX_Q + w * 64 * 128, &qmap, 64 * b, bh * Nq + q0 + 64 * w, qbar);
        load_kv(Ks_buf, Vs_buf, &kmap, &vmap, bh * Nk, full0);
    }

    float o[D / 2];  // this warpgroup's 64 x D block of O, wgmma accumulator layout
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};  // rows g and g + 8; m in raw-score units
    const float sl2 = scale * 1.4426950408889634f;  // exp(scale x) = 2^(sl2 x)
    const u32 Qw = Qs + wg * 64 * 128;  // this warpgroup's 64 rows inside each box
    mbar_wait(qbar, 0);

    for (int it = 0; it < n_tiles; it++) {
        const int st = it & 1, c0 = it * Bc;
        if (threadIdx.x == 0 && it + 1 < n_tiles) {  // refill the other stage with tile it + 1
            const int nst = st ^ 1;
            if (it >= 1) mbar_wait(empty0 + 8 * nst, ((it - 1) / 2) & 1);  // tile it - 1 left it
            load_kv(Ks_buf + nst * KV_BYTES, Vs_buf + nst * KV_BYTES, &kmap, &vmap,
                    bh * Nk + c0 + Bc, full0 + 8 * nst);
        }
        mbar_wait(full0 + 8 * st, (it / 2) & 1);  // tile it has landed in stage st
        __syncwarp();  // the warp converged again before the .aligned wgmma instructions

        // causal: a warpgroup whose last row precedes the tile's first key has nothing to add
        if (!(causal && c0 > q0 + wg * 64 + 63)) {
            float s[Bc / 2];  // S (64 x Bc): s[4 j + e] is row g + 8 (e / 2), key 8 j + 2 t + e % 2
            qk(s, Qw, Ks_buf + st * KV_BYTES);

            // mask keys past Nk and, with causal, keys after the query (only tiles that need it)
            if (c0 + Bc > Nk || (causal && c0 + Bc - 1 > q0 + wrow0)) {
#pragma unroll
                for (int j = 0; j < Bc / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int col = c0 + j * 8 + 2 * t + (e & 1);
                        int row = q0 + wrow0 + g + (e >> 1) * 8;
                        if (col >= Nk || (causal && col > row)) s[4 * j + e] = NEG_INF;
                    }
            }

            // online softmax on the fragments: h = 0 is row g (e = 0, 1), h = 1 is row g+8 (2, 3)
            float mx[2];
            bool grow = false;  // does any of this thread's rows need a new reference maximum?
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float x = NEG_INF;
#pragma unroll
                for (int j = 0; j < Bc / 8; j++) x = fmaxf(x, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
                x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));  // the 4 lanes of a quad
                x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));  // share one row
                mx[h] = x;
                grow |= (x - m[h]) * sl2 > TAU;  // m = -inf and a finite x: true
            }
            if (__any_sync(0xffffffffu, grow)) {  // uniform across the warp
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float m_new = fmaxf(m[h], mx[h]);
                    float alpha = (m_new == NEG_INF) ? 1.f : ex2((m[h] - m_new) * sl2);
                    m[h] = m_new;
                    l[h] *= alpha;
#pragma unroll
                    for (int n = 0; n < D / 8; n++) {
                        o[4 * n + 2 * h] *= alpha;
                        o[4 * n + 2 * h + 1] *= alpha;
                    }
                }
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float m_sl2 = (m[h] == NEG_INF ? 0.f : m[h]) * sl2;  // nothing seen: 0
                float sum = 0.f;
#pragma unroll
                for (int j = 0; j < Bc / 8; j++)
#pragma unroll
                    for (int e = 2 * h; e < 2 * h + 2; e++) {
                        s[4 * j + e] = ex2(fmaf(s[4 * j + e], sl2, -m_sl2));  // P <= 2^TAU, fp32
                        sum += s[4 * j + e];
                    }
                l[h] += sum;
            }

            pv(o, s, Vs_buf + st * KV_BYTES);  // O += P V_j, waited for: the stage is read
        }
        mbar_arrive(empty0 + 8 * st);  // this thread is done with stage st
    }

    // finish: the row sum over the quad, then O / l and lse = m * scale + log(l)
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float lr = l[h];
        lr += __shfl_xor_sync(0xffffffffu, lr, 1);
        lr += __shfl_xor_sync(0xffffffffu, lr, 2);
        int row = q0 + wrow0 + g + h * 8;
        if (row >= Nq) continue;
        float inv = (lr > 0.f) ? 1.f / lr : 0.f;  // a row that saw no key gets zeros
        u32* Orow = (u32*)(O + ((size_t)bh * Nq + row) * D);
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            Orow[n * 4 + t] = pack_half2(o[4 * n + 2 * h] * inv, o[4 * n + 2 * h + 1] * inv);
        if (t == 0) lse[(size_t)bh * Nq + row] = (lr > 0.f) ? m[h] * scale + logf(lr) : NEG_INF;
    }
}
