// version 30: version 28 with version 29's lean consumer loop: three consumer warpgroups
// (Br = 192, d = 64) in persistent blocks, wgmma descriptors made once, the K/V stage as a
// running counter, the row maximum as a tree and the row sum as four chains, and a producer
// that sleeps in its waits (sm_90a only).
//
// What changes from version 28 (same tile, three K/V stages, the same 160 registers per
// consumer thread, persistent schedule, work-tile order and q_empty; no turns), each change
// version 29's, whose header gives the reasons:
//   * the descriptors: the base descriptors of this warpgroup's 64 rows of Q (warpgroup cw's
//     rows start cw x 64 x 128 bytes into each box), of stage 0's K tile and of the first 16
//     keys of stage 0's V tile are made once per block; each use adds a compile-time step
//     (desc_step) and the stage's offset (DESC_STAGE) to the 64-bit word, exact because
//     every operand address lies below 256 KB. The warpgroup index is broadcast from lane 0
//     (__shfl_sync), so that it, the descriptors and the stage can sit in uniform registers;
//   * the stage and parity: version 28 derived them from its running count kv ((kv + it) %
//     KV_STAGES, ((kv + it) / KV_STAGES) & 1). Here the consumer and the producer each carry
//     (st, ph) over the block's work tiles and step them once per K/V tile (ring_next): the
//     consumer after S_0, after each tile of its loop and after each tile it does not use
//     (causal tiles past its rows, or all of a work tile's tiles for a warpgroup with no row
//     below Nq), so that every warpgroup stays on the producer's order;
//   * the row maximum as a pairwise tree (max_tree, exact) and the row sum as four chains
//     added pairwise at the end (a fixed order: bitwise repeatable);
//   * P's packing: version 28 packed P at the top of the next iteration, before the wait for
//     the next K/V stage. Here, as in version 29, P is packed as soon as the product that read
//     the previous P has completed (after wgmma_wait<0>, before the loop's end), and P_0 right
//     after the softmax of S_0, so that no conversion lies between the stage's wait and the
//     wgmma that follow it whatever the compiler schedules at the loop's top;
//   * the producer's waits (q_empty and a free stage) with mbar_wait_suspend; the consumers
//     keep mbar_wait.
// Everything else (the schedule and its deadlock argument, the idle warpgroup past Nq, the
// softmax, causal per tile, ragged N, lse) is version 28's: see its header.
// flashref.hardware.persistent3 models the three warpgroups and the producer
// (tests/hardware/test_persistent3_model.py runs its checks on this text as on version 28's).
//
// Measured: see the recorded run (results/gpu_hopper.json), printed by chapter 12; this
// comment holds no numbers, so it cannot disagree with them.
//
// The loop's pieces are version 29's, from consumer_loop.cuh; the producer's K/V load and the
// work-tile order come from tile_scheduler.cuh, as in versions 27 to 29.
//
// Compiled at run time by NVRTC with -arch=sm_90a, -DHEAD_DIM=64 (and -DFLASHREF_BF16 for
// bfloat16). Arguments and launch as version 28's (flashref/gpu/forward_versions.py).

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#if HEAD_DIM != 64
#error "version 30 is written for d = 64 only (-DHEAD_DIM=64)"
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
#define PRODUCER_SUSPEND_NS 20000  // longest sleep of the producer in one try_wait, well above a tile

#include "mma_common.cuh"     // half_t, u32, NEG_INF, pack_half2, ex2, smem_u32
#include "hopper_common.cuh"  // wgmma, descriptors, mbarrier, TMA

#include "consumer_loop.cuh"  // tile constants, qk/pv issue, pack_p, max_tree, ring_next, softmax_tile

#include "tile_scheduler.cuh"  // load_kv, work_tile (the order of the work tiles)

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
flash_v30(const half_t* __restrict__ Q,  // (B*H, Nq, D), read through qmap
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

    // the warpgroup, broadcast from lane 0: visibly the same in every lane of the warp
    const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
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
            int st = 0;           // the next K/V tile's stage,
            u32 ph = 0;           // the parity of that stage's next filling,
            bool refill = false;  // and whether the stage was filled before (then: wait for it)
            for (int item = blockIdx.x, n = 0; item < n_items; item += gridDim.x, n++) {
                int q_block, bh;
                work_tile(item, Tr, BH, G, causal, q_block, bh);
                const int q0 = q_block * Br;
                const int kv_end = causal ? min(Nk, q0 + Br) : Nk;
                const int n_tiles = (kv_end + Bc - 1) / Bc;
                if (n >= 1)  // every consumer thread's arrival in n - 1
                    mbar_wait_suspend(q_empty, (n - 1) & 1, PRODUCER_SUSPEND_NS);
                mbar_arrive_expect_tx(qbar, Q_BYTES);  // Q_i: the three consumers' rows
#pragma unroll
                for (int b = 0; b < NBOX; b++)
#pragma unroll
                    for (int w = 0; w < NWG; w++)
                        tma_load_2d(Qs + b * BOX_Q + w * 64 * 128, &qmap, 64 * b, bh * Nq + q0 + 64 * w, qbar);
                for (int it = 0; it < n_tiles; it++) {
                    if (refill)  // the consumers left the tile KV_STAGES before this one
                        mbar_wait_suspend(empty0 + 8 * st, ph ^ 1, PRODUCER_SUSPEND_NS);
                    load_kv(Ks_buf + st * KV_BYTES, Vs_buf + st * KV_BYTES, &kmap, &vmap,
                            bh * Nk + it * Bc, full0 + 8 * st);
                    ring_next(st, ph);
                    refill |= st == 0;
                }
            }
        }
        return;
    }

    setmaxnreg_inc<CONSUMER_REGS>();
    const int cw = wg - 1;                  // consumer warpgroup 0, 1 or 2
    const int wrow0 = cw * 64 + warp * 16;  // first row of this warp inside the block
    const float sl2 = scale * 1.4426950408889634f;  // exp(scale x) = 2^(sl2 x)
    // the base descriptors: k-step 0 of this warpgroup's 64 rows of Q (inside each box), of
    // stage 0's K tile and the first 16 keys of stage 0's V tile; stage st is + st DESC_STAGE
    const u64 dq = desc_kmajor_sw128(Qs + cw * 64 * 128, 0);
    const u64 dk0 = desc_kmajor_sw128(Ks_buf, 0);
    const u64 dv0 = desc_mnmajor_sw128(Vs_buf, 0, BOX_KV);

    int st = 0;  // the ring's next K/V tile (the producer's order): its stage,
    u32 ph = 0;  // and the parity of that stage's filling
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
            mbar_wait(full0 + 8 * st, ph);  // tile 0: S_0 alone
            __syncwarp();
            wgmma_fence();
            qk_issue(s, dq, dk0 + st * DESC_STAGE);
            wgmma_wait<0>();
            wgmma_fence_acc(s);
            if (n_mine == 1) mbar_arrive(q_empty);  // this warpgroup's last S has read Q
            softmax_tile(s, m, l, alpha, 0, row0, Nk, causal, sl2, g, t);
            pack_p(p, s);  // P_0: no product reads p now
            int pst = st;  // the stage of the tile whose P V comes next
            ring_next(st, ph);

            for (int it = 1; it < n_mine; it++) {
                mbar_wait(full0 + 8 * st, ph);  // tile it landed in stage st
                __syncwarp();
                wgmma_fence_acc(o);  // the rescale of o stays above the fence
                wgmma_fence();       // after the ordinary accesses of p, s and o
                qk_issue(s, dq, dk0 + st * DESC_STAGE);         // group 1: S_it = Q K_it^T
                pv_issue(o, p, dv0 + pst * DESC_STAGE);         // group 2: O += P_{it-1} V_{it-1}
                wgmma_wait<1>();                                 // S_it is done, the product may run on
                wgmma_fence_acc(s);
                if (it + 1 == n_mine) mbar_arrive(q_empty);     // the last S: Q may be overwritten
                const bool rescale = softmax_tile(s, m, l, alpha, it * Bc, row0, Nk, causal, sl2, g, t);
                wgmma_wait<0>();
                wgmma_fence_acc(o);
                pack_p(p, s);  // P_it, now that the product that read P_{it-1} has completed
                mbar_arrive(empty0 + 8 * pst);  // this thread is done with tile it - 1's stage
                pst = st;
                ring_next(st, ph);
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
            wgmma_fence_acc(o);  // O += P V of this warpgroup's last tile (stage pst)
            wgmma_fence();
            pv_issue(o, p, dv0 + pst * DESC_STAGE);
            wgmma_wait<0>();
            wgmma_fence_acc(o);
            mbar_arrive(empty0 + 8 * pst);
        }
        for (int it = n_mine; it < n_tiles; it++) {  // the tiles it does not use
            mbar_wait(full0 + 8 * st, ph);
            mbar_arrive(empty0 + 8 * st);
            ring_next(st, ph);
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
            for (int c = 0; c < D / 8; c++)
                Orow[c * 4 + t] = pack_half2(o[4 * c + 2 * h] * inv, o[4 * c + 2 * h + 1] * inv);
            if (t == 0) lse[(size_t)bh * Nq + row] = (lr > 0.f) ? m[h] * scale + logf(lr) : NEG_INF;
        }
    }
}
