// version 28: version 24 made persistent as version 27 makes version 23 persistent: three
// consumer warpgroups (Br = 192, d = 64) in blocks that walk a list of work tiles (sm_90a only).
//
// What changes from version 24 (its tile, its consumers' loop and its registers are kept):
//   * version 24 launches one block per query block of 192 rows; as in version 23 the block's
//     prologue (Q's load, the first K/V tile, S_0 alone) and epilogue (O / l, the stores) stand
//     beside nothing on their SM, and matter most where a block has few key tiles (short
//     sequences, causal blocks near the top). Here, as in version 27, min(work tiles, SMs)
//     blocks take work tiles blockIdx.x, + gridDim.x, ... of the list that version 27's
//     work_tile() orders (a head's query blocks side by side; causal: sections of heads whose
//     K/V fits half the L2, level by level, longest first), with Tr = ceil(Nq / 192);
//   * the producer runs on into the next work tile: one running count kv of K/V tiles over the
//     block's work tiles (stage kv % KV_STAGES, parity (kv / KV_STAGES) & 1), one Q buffer of
//     192 rows filled per work tile (qbar, parity n & 1 for the block's n-th one) and emptied on
//     q_empty, whose count is all 3 x 128 consumer threads: a thread arrives once per work tile,
//     after its warpgroup's last S = Q K^T of it has completed, or, for a warpgroup with no
//     tile of its own there, right after Q's wait; the producer waits for q_empty (parity
//     (n - 1) & 1) before it loads the next Q;
//   * version 24's consumers overlap inside a warpgroup (the next S during this softmax) and
//     take no turns, so unlike version 27 nothing is carried from one work tile to the next but
//     kv and the two parities: no named barrier, no hand-over at a tile's end;
//   * a warpgroup whose 64 rows all lie past Nq (the last query block of a ragged Nq) computes
//     nothing, as in version 24, and only waits for Q and every K/V tile and releases them; in
//     a persistent block it then goes on to its next work tile, where it may have rows again,
//     so every warpgroup waits for each work tile's Q (qbar's phases stay in step for all);
//   * deadlock: as version 27's, no wait of the producer depends on a later work tile (q_empty
//     of tile n needs only every consumer thread's one arrival in tile n, which needs Q of tile
//     n and K/V tiles of tile n only; a stage's release needs only tiles already loaded), and
//     no barrier runs two phases ahead of a waiter (Q of tile n + 1 needs q_empty of tile n,
//     which needs all three warpgroups past their wait for Q of tile n; a stage's next filling
//     needs its release by all 384 consumer threads, each after its wait for that filling).
//     Every consumer thread arrives exactly once per work tile on q_empty (n_mine = 0: after
//     the wait; n_mine = 1: after S_0; otherwise after S of its tile n_mine - 1) and once per
//     K/V tile on that tile's empty barrier, whether the tile is its own or not; causal row r
//     sees key 0, so a warpgroup with a row below Nq has n_mine >= 1, and its causal count
//     min(n_tiles, (q0 + 64 cw + 63) / Bc + 1) is per warpgroup, as in version 24, whatever Nk
//     is (n_tiles = ceil(min(Nk, q0 + Br) / Bc) >= 1 for Nk >= 1). The last work tile ends as
//     version 24's block does. flashref.hardware.persistent3 models the three warpgroups and the
//     producer over a block's work tiles (tests/hardware/test_persistent3_model.py).
// Everything else (the softmax, causal per tile, ragged N, lse, the registers) is version 24's.
//
// Measured: see the recorded run (results/gpu_hopper.json), printed by chapter 12; this
// comment holds no numbers, so it cannot disagree with them.
//
// The producer's K/V load and work_tile() are version 27's, from tile_scheduler.cuh.
//
// Compiled at run time by NVRTC with -arch=sm_90a, -DHEAD_DIM=64 (and -DFLASHREF_BF16 for
// bfloat16). The caller guarantees scale > 0 (a negative scale is folded into Q), passes the
// tensor maps of Q (box 64 x 64) and K, V (box Bc x 64) viewed as (B*H*N, d)
// (flashref.gpu.tma.tensor_map), then BH = B*H, on Version.grid's min(Tr x BH, SMs)
// blocks (flashref/gpu/forward_versions.py).

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#if HEAD_DIM != 64
#error "version 28 is written for d = 64 only (-DHEAD_DIM=64)"
#endif
#define D HEAD_DIM
#define NWG 3                    // consumer warpgroups per block
#define Br (NWG * 64)            // 192 query rows per block
#define Bc 128                   // key tile, as version 21 at d = 64
#define KV_STAGES 3              // K/V tiles the producer may have in flight
#define NCONSUMERS (NWG * 128)   // threads that arrive on an "empty" barrier and on q_empty
#define NTHREADS ((NWG + 1) * 128)  // + the producer warpgroup
#define PRODUCER_REGS 24         // setmaxnreg budgets: 128 (24 + 3 x 160) = 64512 <= 512 x 128
#define CONSUMER_REGS 160
#define NBOX (D / 64)            // 64-column boxes per row of a tile
#define TAU 8.0f                 // rescale when the maximum grows by more than 2^TAU
#define L2_KV_BYTES (30ll << 20) // causal: K and V of a section of heads, half the 60 MB L2

#include "mma_common.cuh"     // half_t, u32, NEG_INF, pack_half2, ex2, smem_u32
#include "hopper_common.cuh"  // wgmma, descriptors, mbarrier, TMA

constexpr u32 Q_BYTES = Br * D * 2;       // (NBOX, Br, 64) swizzled
constexpr u32 KV_BYTES = Bc * D * 2;      // one K or V tile: (NBOX, Bc, 64) swizzled
constexpr u32 BOX_Q = Br * 128;           // bytes from one 64-column box of Q to the next
constexpr u32 BOX_KV = Bc * 128;          // ... of a K or V tile (V's descriptor LBO)

__shared__ alignas(8) u64 bars_[2 + 2 * KV_STAGES];  // Q, q_empty, full[KV_STAGES], empty[KV_STAGES]

// issue S (64 x Bc) = Q_wg K^T as one commit group (not waited for): k = D in steps of 16,
// box kb = ks / 4, step ks % 4 inside it; the first step ignores the old S (scale_d = 0)
__device__ __forceinline__ void qk_issue(float (&s)[Bc / 2], u32 q, u32 k)
{
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        const u64 da = desc_kmajor_sw128(q + (ks / 4) * BOX_Q, ks % 4);
        const u64 db = desc_kmajor_sw128(k + (ks / 4) * BOX_KV, ks % 4);
        wgmma_ss_n128<0>(s, da, db, ks > 0);
    }
    wgmma_commit();
}

// P's A fragments from the accumulator columns of S (a_from_c): 16 keys per kk. The empty asm
// keeps the packing (and so every read of s) above the wgmma_fence that follows it.
__device__ __forceinline__ void pack_p(u32 (&p)[Bc / 16][4], const float (&s)[Bc / 2])
{
#pragma unroll
    for (int kk = 0; kk < Bc / 16; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            p[kk][r] = pack_half2(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
            asm volatile("" : "+r"(p[kk][r]) :: "memory");
        }
}

// issue O (64 x D) += P V as one commit group (not waited for), 16 keys per wgmma
__device__ __forceinline__ void pv_issue(float (&o)[D / 2], const u32 (&p)[Bc / 16][4], u32 v)
{
#pragma unroll
    for (int kk = 0; kk < Bc / 16; kk++) {
        const u64 dv = desc_mnmajor_sw128(v, kk, BOX_KV);
        wgmma_rs_n64<1>(o, p[kk][0], p[kk][1], p[kk][2], p[kk][3], dv, 1);
    }
    wgmma_commit();
}

// version 20's online softmax of one tile on the fragments, O left alone: masks keys past Nk
// (and, with causal, after the query), updates m and l, overwrites s with P; returns whether
// (warp-uniformly) O must be multiplied by alpha[h] (h = 0: row g, h = 1: row g + 8)
__device__ __forceinline__ bool softmax_tile(float (&s)[Bc / 2], float (&m)[2], float (&l)[2],
                                             float (&alpha)[2], int c0, int row0, int Nk,
                                             int causal, float sl2, int g, int t)
{
    if (c0 + Bc > Nk || (causal && c0 + Bc - 1 > row0)) {  // only the tiles that need it
#pragma unroll
        for (int j = 0; j < Bc / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int col = c0 + j * 8 + 2 * t + (e & 1);
                int row = row0 + g + (e >> 1) * 8;
                if (col >= Nk || (causal && col > row)) s[4 * j + e] = NEG_INF;
            }
    }
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
    const bool rescale = __any_sync(0xffffffffu, grow);  // uniform across the warp
    if (rescale) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float m_new = fmaxf(m[h], mx[h]);
            alpha[h] = (m_new == NEG_INF) ? 1.f : ex2((m[h] - m_new) * sl2);
            m[h] = m_new;
            l[h] *= alpha[h];
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
    return rescale;
}

#include "tile_scheduler.cuh"  // load_kv, work_tile (the order of the work tiles)

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
flash_v28(const half_t* __restrict__ Q,  // (B*H, Nq, D), read through qmap
          const half_t* __restrict__ K,  // (B*H, Nk, D), read through kmap
          const half_t* __restrict__ V,  // (B*H, Nk, D), read through vmap
          half_t* __restrict__ O,        // (B*H, Nq, D)
          float* __restrict__ lse,       // (B*H, Nq)
          int Nq, int Nk, float scale, int causal,
          const __grid_constant__ TensorMap qmap,   // (B*H*Nq, D), box (64, 64)
          const __grid_constant__ TensorMap kmap,   // (B*H*Nk, D), box (Bc, 64)
          const __grid_constant__ TensorMap vmap,   // (B*H*Nk, D), box (Bc, 64)
          int BH)                                   // heads of this launch (B*H)
{
    extern __shared__ uint4 smem_[];
    const u32 Qs = (smem_u32(smem_) + 1023) & ~1023u;  // (NBOX, Br, 64), 1024-byte aligned
    const u32 Ks_buf = Qs + Q_BYTES;                    // (KV_STAGES, NBOX, Bc, 64): stage st at + st KV_BYTES
    const u32 Vs_buf = Ks_buf + KV_STAGES * KV_BYTES;   // (KV_STAGES, NBOX, Bc, 64)
    const u32 qbar = smem_u32(&bars_[0]), q_empty = qbar + 8;
    const u32 full0 = qbar + 16, empty0 = qbar + 16 + 8 * KV_STAGES;  // stage st: + 8 st

    const int wg = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3;
    const int Tr = (Nq + Br - 1) / Br;
    const int n_items = Tr * BH;  // work tiles; this block takes blockIdx.x, + gridDim.x, ...
    // causal: heads per section, their K and V (Nk x D x 2 x 2 bytes each) within L2_KV_BYTES
    const int G = (int)max(1ll, min((long long)BH, L2_KV_BYTES / ((long long)Nk * D * 4)));
    if ((int)blockIdx.x >= n_items) return;  // never: the host launches min(n_items, SMs) blocks

    if (threadIdx.x == 0) {
        mbar_init(qbar, 1);
        mbar_init(q_empty, NCONSUMERS);
        for (int st = 0; st < KV_STAGES; st++) {
            mbar_init(full0 + 8 * st, 1);
            mbar_init(empty0 + 8 * st, NCONSUMERS);
        }
        mbar_fence_init();
    }
    __syncthreads();

    if (wg == 0) {  // the producer warpgroup: all four warps give registers back, one thread copies
        setmaxnreg_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            int kv = 0;  // K/V tiles this block has loaded: tile kv goes to stage kv % KV_STAGES
            for (int item = blockIdx.x, n = 0; item < n_items; item += gridDim.x, n++) {
                int q_block, bh;
                work_tile(item, Tr, BH, G, causal, q_block, bh);
                const int q0 = q_block * Br;
                const int kv_end = causal ? min(Nk, q0 + Br) : Nk;
                const int n_tiles = (kv_end + Bc - 1) / Bc;
                if (n >= 1) mbar_wait(q_empty, (n - 1) & 1);  // every consumer thread's arrival in n - 1
                mbar_arrive_expect_tx(qbar, Q_BYTES);  // Q_i: the three consumers' rows
#pragma unroll
                for (int b = 0; b < NBOX; b++)
#pragma unroll
                    for (int w = 0; w < NWG; w++)
                        tma_load_2d(Qs + b * BOX_Q + w * 64 * 128, &qmap, 64 * b, bh * Nq + q0 + 64 * w, qbar);
                for (int it = 0; it < n_tiles; it++, kv++) {
                    const int st = kv % KV_STAGES, use = kv / KV_STAGES;  // use-th filling of stage st
                    if (use >= 1) mbar_wait(empty0 + 8 * st, (use - 1) & 1);  // kv - KV_STAGES left it
                    load_kv(Ks_buf + st * KV_BYTES, Vs_buf + st * KV_BYTES, &kmap, &vmap,
                            bh * Nk + it * Bc, full0 + 8 * st);
                }
            }
        }
        return;
    }

    setmaxnreg_inc<CONSUMER_REGS>();
    const int cw = wg - 1;                  // consumer warpgroup 0, 1 or 2
    const int wrow0 = cw * 64 + warp * 16;  // first row of this warp inside the block
    const float sl2 = scale * 1.4426950408889634f;  // exp(scale x) = 2^(sl2 x)
    const u32 Qw = Qs + cw * 64 * 128;  // this warpgroup's 64 rows inside each box

    int kv = 0;  // K/V tiles this block has consumed before this work tile (the producer's count)
    for (int item = blockIdx.x, n = 0; item < n_items; item += gridDim.x, n++) {
        int q_block, bh;
        work_tile(item, Tr, BH, G, causal, q_block, bh);
        const int q0 = q_block * Br;
        const int kv_end = causal ? min(Nk, q0 + Br) : Nk;
        const int n_tiles = (kv_end + Bc - 1) / Bc;

        float o[D / 2];  // this warpgroup's 64 x D block of O, wgmma accumulator layout
#pragma unroll
        for (int i = 0; i < D / 2; i++) o[i] = 0.f;
        float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};  // rows g and g + 8; m in raw-score units
        // tiles 0 .. n_mine - 1 are this warpgroup's (causal: the rest lie past its last row); a
        // warpgroup whose 64 rows all lie past Nq (the last query block of a ragged Nq) has none
        const int row0 = q0 + wrow0;
        const int n_mine = q0 + cw * 64 >= Nq ? 0
                         : causal ? min(n_tiles, (q0 + cw * 64 + 63) / Bc + 1) : n_tiles;
        float s[Bc / 2];      // S_j, then P_j (64 x Bc): s[4 j + e] is row g + 8 (e / 2), key 8 j + 2 t + e % 2
        u32 p[Bc / 16][4];    // P_{j-1} as A fragments, read by the O += P V in flight
        float alpha[2] = {1.f, 1.f};
        mbar_wait(qbar, n & 1);  // Q of work tile n has landed (every warpgroup waits for it)
        if (n_mine == 0) mbar_arrive(q_empty);  // no S of this warpgroup reads this Q

        if (n_mine > 0) {  // this warpgroup's tiles: version 24's skewed loop
            mbar_wait(full0 + 8 * (kv % KV_STAGES), (kv / KV_STAGES) & 1);  // tile 0: S_0 alone
            __syncwarp();
            wgmma_fence();
            qk_issue(s, Qw, Ks_buf + (kv % KV_STAGES) * KV_BYTES);
            wgmma_wait<0>();
            wgmma_fence_acc(s);
            if (n_mine == 1) mbar_arrive(q_empty);  // this warpgroup's last S has read Q
            softmax_tile(s, m, l, alpha, 0, row0, Nk, causal, sl2, g, t);

            for (int it = 1; it < n_mine; it++) {
                const int st = (kv + it) % KV_STAGES, pst = (kv + it - 1) % KV_STAGES;
                pack_p(p, s);
                mbar_wait(full0 + 8 * st, ((kv + it) / KV_STAGES) & 1);  // tile it landed in stage st
                __syncwarp();
                wgmma_fence_acc(o);  // the rescale of o stays above the fence
                wgmma_fence();       // after the ordinary accesses of p, s and o
                qk_issue(s, Qw, Ks_buf + st * KV_BYTES);        // group 1: S_it = Q K_it^T
                pv_issue(o, p, Vs_buf + pst * KV_BYTES);        // group 2: O += P_{it-1} V_{it-1}
                wgmma_wait<1>();                                 // S_it is done, the product may run on
                wgmma_fence_acc(s);
                if (it + 1 == n_mine) mbar_arrive(q_empty);     // the last S: Q may be overwritten
                const bool rescale = softmax_tile(s, m, l, alpha, it * Bc, row0, Nk, causal, sl2, g, t);
                wgmma_wait<0>();
                wgmma_fence_acc(o);
                mbar_arrive(empty0 + 8 * pst);  // this thread is done with tile it - 1's stage
                if (rescale) {
#pragma unroll
                    for (int c = 0; c < D / 8; c++) {
                        o[4 * c] *= alpha[0];
                        o[4 * c + 1] *= alpha[0];
                        o[4 * c + 2] *= alpha[1];
                        o[4 * c + 3] *= alpha[1];
                    }
                }
            }
            const int last = (kv + n_mine - 1) % KV_STAGES;  // O += P V of this warpgroup's last tile
            pack_p(p, s);
            wgmma_fence_acc(o);
            wgmma_fence();
            pv_issue(o, p, Vs_buf + last * KV_BYTES);
            wgmma_wait<0>();
            wgmma_fence_acc(o);
            mbar_arrive(empty0 + 8 * last);
        }
        for (int it = n_mine; it < n_tiles; it++) {  // the tiles it does not use
            const int st = (kv + it) % KV_STAGES;
            mbar_wait(full0 + 8 * st, ((kv + it) / KV_STAGES) & 1);
            mbar_arrive(empty0 + 8 * st);
        }
        kv += n_tiles;

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
            for (int c = 0; c < D / 8; c++)
                Orow[c * 4 + t] = pack_half2(o[4 * c + 2 * h] * inv, o[4 * c + 2 * h + 1] * inv);
            if (t == 0) lse[(size_t)bh * Nq + row] = (lr > 0.f) ? m[h] * scale + logf(lr) : NEG_INF;
        }
    }
}
