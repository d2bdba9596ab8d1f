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
// flashref.gpu.persistent3 models the three warpgroups and the producer
// (tests/test_persistent3_model.py runs its checks on this text as on version 28's).
//
// Measured: see the recorded run (results/gpu_hopper.json), printed by chapter 11; this
// comment holds no numbers, so it cannot disagree with them.
//
// Compiled at run time by NVRTC with -arch=sm_90a, -DHEAD_DIM=64 (and -DFLASHREF_BF16 for
// bfloat16). Arguments and launch as version 28's (flashref/gpu/versions.py).

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

constexpr u32 Q_BYTES = Br * D * 2;       // (NBOX, Br, 64) swizzled
constexpr u32 KV_BYTES = Bc * D * 2;      // one K or V tile: (NBOX, Bc, 64) swizzled
constexpr u32 BOX_Q = Br * 128;           // bytes from one 64-column box of Q to the next
constexpr u32 BOX_KV = Bc * 128;          // ... of a K or V tile (V's descriptor LBO)
// descriptor steps: an operand `bytes` further on has the descriptor + bytes / 16, since the
// start address field (bits 0-13) holds address / 16. Exact while every address is below
// 256 KB (2^14 x 16 bytes), so that the field never carries into the next: desc_sw128 keeps
// the address's offset in the block's shared window, and a block's shared memory (at most
// 227 KB, after 1 KB the system reserves) lies below 228 KB
__host__ __device__ constexpr u64 desc_step(u32 bytes) { return bytes >> 4; }
constexpr u64 DESC_STAGE = desc_step(KV_BYTES);  // from one K (or V) stage to the next
static_assert(Q_BYTES + 2 * KV_STAGES * KV_BYTES + 1024 <= 227 * 1024, "the layout fits a block");

__shared__ alignas(8) u64 bars_[2 + 2 * KV_STAGES];  // Q, q_empty, full[KV_STAGES], empty[KV_STAGES]

// issue S (64 x Bc) = Q_wg K^T as one commit group (not waited for): k = D in steps of 16,
// box kb = ks / 4, step ks % 4 inside it (32 bytes each); the first step ignores the old S
// (scale_d = 0). dq, dk: the descriptors of k-step 0 of this warpgroup's Q and of the K tile
__device__ __forceinline__ void qk_issue(float (&s)[Bc / 2], u64 dq, u64 dk)
{
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        const u64 da = dq + desc_step((ks / 4) * BOX_Q + 32 * (ks % 4));
        const u64 db = dk + desc_step((ks / 4) * BOX_KV + 32 * (ks % 4));
        wgmma_ss_n128<0>(s, da, db, ks > 0);  // Bc = 128 keys: n = 128
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

// issue O (64 x D) += P V as one commit group (not waited for), 16 keys (2048 bytes) per
// wgmma; dv0: the descriptor of the V tile's first 16 keys
__device__ __forceinline__ void pv_issue(float (&o)[D / 2], const u32 (&p)[Bc / 16][4], u64 dv0)
{
#pragma unroll
    for (int kk = 0; kk < Bc / 16; kk++) {
        const u64 dv = dv0 + desc_step(2048 * kk);
        wgmma_rs_n64<1>(o, p[kk][0], p[kk][1], p[kk][2], p[kk][3], dv, 1);
    }
    wgmma_commit();
}

// the maximum of x[0 .. 2 W - 1], pairwise: x[i] = max(x[i], x[i + W]) for i < W, then the same
// on the first W (depth log2(2 W) instead of 2 W - 1); overwrites x
template <int W, int N>
__device__ __forceinline__ float max_tree(float (&x)[N])
{
    static_assert(2 * W == N || (W & (W - 1)) == 0, "max_tree: 2 W values, W a power of two");
#pragma unroll
    for (int i = 0; i < W; i++) x[i] = fmaxf(x[i], x[i + W]);
    if constexpr (W > 1)
        return max_tree<W / 2>(x);
    else
        return x[0];
}

// the next K/V tile's place in the ring: stage st + 1, or stage 0 with the parity flipped
__device__ __forceinline__ void ring_next(int& st, u32& ph)
{
    if (++st == KV_STAGES) {
        st = 0;
        ph ^= 1;
    }
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
        float v[Bc / 4];  // this thread's Bc / 4 values of row g + 8 h
#pragma unroll
        for (int i = 0; i < Bc / 4; i++) v[i] = s[4 * (i / 2) + 2 * h + i % 2];
        float x = max_tree<Bc / 8>(v);
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
        float part[4];  // four independent partial sums: value i of the row goes to part[i % 4]
#pragma unroll
        for (int i = 0; i < Bc / 4; i++) {
            float& x = s[4 * (i / 2) + 2 * h + i % 2];
            x = ex2(fmaf(x, sl2, -m_sl2));  // P <= 2^TAU, fp32
            part[i % 4] = i < 4 ? x : part[i % 4] + x;
        }
        l[h] += (part[0] + part[1]) + (part[2] + part[3]);
    }
    return rescale;
}

// the producer thread: the K and V tile at row0 into stage (Ks, Vs), counted on barrier full
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

// work tile `item` of Tr * BH: its query block and (batch, head). Without causal the Tr query
// blocks of one head are side by side, as version 23's grid has them; with causal the heads
// go in sections of G, and inside a section level by level (every head's longest query block
// first), every other level through the section's heads backwards
__device__ __forceinline__ void work_tile(int item, int Tr, int BH, int G, int causal, int& q_block,
                                          int& bh)
{
    if (!causal) {
        bh = item / Tr;
        q_block = item % Tr;
        return;
    }
    const int h0 = item / (G * Tr) * G, Gs = min(G, BH - h0);  // the section's first head, heads
    const int j = item - h0 * Tr;                               // place inside the section
    const int level = j / Gs, r = j % Gs;
    q_block = Tr - 1 - level;
    bh = h0 + ((level & 1) ? Gs - 1 - r : r);
}

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
