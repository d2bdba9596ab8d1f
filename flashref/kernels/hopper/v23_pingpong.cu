// version 23: version 22 with the two consumer warpgroups taking turns at the tensor cores
// (FlashAttention-3's ping-pong schedule between warpgroups; sm_90a only).
//
// What changes from version 22:
//   * in version 22 the two consumer warpgroups run the same loop independently: nothing stops
//     both from issuing their products at the same moment and then both computing exponentials
//     while the tensor cores wait (version 21's overlap hides only part of a softmax behind one
//     warpgroup's own O += P V);
//   * here each warpgroup issues its wgmma only in its turn: it waits on its named barrier
//     (bar.sync, id PINGPONG_BAR + cw, 256 threads), issues S_j = Q K_j^T and O += P_{j-1} V_{j-1},
//     and hands the turn to the other warpgroup with bar.arrive on that one's barrier. The
//     other then issues its products, which the tensor cores run after these, while this
//     warpgroup computes the softmax of S_j: warpgroup 1's GEMMs during warpgroup 0's softmax
//     and the other way round. Warpgroup 1 hands warpgroup 0 the first turn at the start;
//   * every warpgroup takes exactly n_tiles + 1 turns, the same count for both, so the turns
//     alternate 0, 1, 0, 1, ... to the end: turn 0 issues S_0 alone, turns 1 .. n_mine - 1 the
//     skewed loop's two groups, turn n_mine the last O += P V alone, and each tile that only
//     lies past the warpgroup's last row (causal: it < n_tiles but not its own) an empty turn,
//     taken between waiting for the tile and releasing its stage. A warpgroup with fewer tiles
//     than the other therefore still passes the turn on as often as the other waits for it;
//   * warpgroup 1's last turn hands nothing on: no turn of warpgroup 0 follows it, and its
//     arrival would stay counted on the barrier when the block exits. Each barrier then sees
//     as many arrivals as waits (warpgroup 0's: the first hand-over and warpgroup 1's first
//     n_tiles turns; warpgroup 1's: warpgroup 0's n_tiles + 1 turns; tests/hardware/test_pingpong_model.py
//     runs the schedule for every tile count and causal split);
//   * the turn waits come after the wait for the tile's full barrier, so a warpgroup waiting for
//     TMA does not hold the turn. A turn k waits at most for tile k, and each warpgroup releases
//     tile k - 1 in its turn k: with two or more stages the producer's next tile never depends
//     on a turn that waits for it.
// Everything else (the producer, the tiles, the softmax, causal, ragged N, lse) is version 22's.
//
// Measured: see the recorded run (results/gpu_hopper.json), printed by chapter 12; this
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
#ifndef Bc                       // version 25 includes this file with its own tile
#define Bc 128                   // key tile at both head dims
#define KV_STAGES (D > 64 ? 2 : 3)  // K/V tiles the producer may have in flight
#define FLASH_KERNEL flash_v23
#endif
#define NCONSUMERS (NWG * 128)   // threads that arrive on an "empty" barrier
#define NTHREADS ((NWG + 1) * 128)  // + the producer warpgroup
#define PRODUCER_REGS 24         // setmaxnreg budgets: 128 (24 + 2 x 240) = 384 x 168
#define CONSUMER_REGS 240
#define NBOX (D / 64)            // 64-column boxes per row of a tile
#define TAU 8.0f                 // rescale when the maximum grows by more than 2^TAU
#define PINGPONG_BAR 1           // named barrier of consumer warpgroup cw's turn: PINGPONG_BAR + cw

#include "mma_common.cuh"     // half_t, u32, NEG_INF, pack_half2, ex2, smem_u32
#include "hopper_common.cuh"  // wgmma, descriptors, mbarrier, TMA

constexpr u32 Q_BYTES = Br * D * 2;       // (NBOX, Br, 64) swizzled
constexpr u32 KV_BYTES = Bc * D * 2;      // one K or V tile: (NBOX, Bc, 64) swizzled
constexpr u32 BOX_Q = Br * 128;           // bytes from one 64-column box of Q to the next
constexpr u32 BOX_KV = Bc * 128;          // ... of a K or V tile (V's descriptor LBO)

__shared__ alignas(8) u64 bars_[1 + 2 * KV_STAGES];  // Q, full[KV_STAGES], empty[KV_STAGES]

// issue S (64 x Bc) = Q_wg K^T as one commit group (not waited for): k = D in steps of 16,
// box kb = ks / 4, step ks % 4 inside it; the first step ignores the old S (scale_d = 0)
__device__ __forceinline__ void qk_issue(float (&s)[Bc / 2], u32 q, u32 k)
{
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        const u64 da = desc_kmajor_sw128(q + (ks / 4) * BOX_Q, ks % 4);
        const u64 db = desc_kmajor_sw128(k + (ks / 4) * BOX_KV, ks % 4);
#if Bc == 64
        wgmma_ss_n64<0>(s, da, db, ks > 0);   // version 25 at d = 128: n = 64
#else
        wgmma_ss_n128<0>(s, da, db, ks > 0);  // Bc = 128 keys: n = 128
#endif
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
#if D == 64
        wgmma_rs_n64<1>(o, p[kk][0], p[kk][1], p[kk][2], p[kk][3], dv, 1);
#else
        wgmma_rs_n128<1>(o, p[kk][0], p[kk][1], p[kk][2], p[kk][3], dv, 1);
#endif
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

// ping-pong: wait until it is consumer warpgroup cw's turn to issue wgmma
__device__ __forceinline__ void turn_begin(int cw)
{
    named_bar_sync(PINGPONG_BAR + cw, NCONSUMERS);
}

// the end of turn `turn` (of n_turns): hand the tensor cores to the other warpgroup, except
// after warpgroup 1's last turn (no turn of warpgroup 0 follows to wait for it)
__device__ __forceinline__ void turn_end(int cw, int turn, int n_turns)
{
    if (cw == 0 || turn + 1 < n_turns) named_bar_arrive(PINGPONG_BAR + 1 - cw, NCONSUMERS);
}

// the producer thread: tile `tile` of K and V into stage `st`, counted on barrier full
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
FLASH_KERNEL(const half_t* __restrict__ Q,  // (B*H, Nq, D), read through qmap
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
    const u32 Ks_buf = Qs + Q_BYTES;                    // (KV_STAGES, NBOX, Bc, 64): stage st at + st KV_BYTES
    const u32 Vs_buf = Ks_buf + KV_STAGES * KV_BYTES;   // (KV_STAGES, NBOX, Bc, 64)
    const u32 qbar = smem_u32(&bars_[0]);
    const u32 full0 = qbar + 8, empty0 = qbar + 8 + 8 * KV_STAGES;  // stage st: + 8 st

    const int wg = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3;
    const int bh = blockIdx.y;
    const int q_block = causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // longest blocks first
    const int q0 = q_block * Br;

    const int kv_end = causal ? min(Nk, q0 + Br) : Nk;
    const int n_tiles = (kv_end + Bc - 1) / Bc;

    if (threadIdx.x == 0) {
        mbar_init(qbar, 1);
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
            mbar_arrive_expect_tx(qbar, Q_BYTES);  // Q_i: both consumers' rows
#pragma unroll
            for (int b = 0; b < NBOX; b++)
#pragma unroll
                for (int w = 0; w < NWG; w++)
                    tma_load_2d(Qs + b * BOX_Q + w * 64 * 128, &qmap, 64 * b, bh * Nq + q0 + 64 * w, qbar);
            for (int it = 0; it < n_tiles; it++) {
                const int st = it % KV_STAGES, use = it / KV_STAGES;  // use-th filling of stage st
                if (use >= 1) mbar_wait(empty0 + 8 * st, (use - 1) & 1);  // tile it - KV_STAGES left it
                load_kv(Ks_buf + st * KV_BYTES, Vs_buf + st * KV_BYTES, &kmap, &vmap,
                        bh * Nk + it * Bc, full0 + 8 * st);
            }
        }
        return;
    }

    setmaxnreg_inc<CONSUMER_REGS>();
    const int cw = wg - 1;                  // consumer warpgroup 0 or 1
    const int wrow0 = cw * 64 + warp * 16;  // first row of this warp inside the block
    float o[D / 2];  // this warpgroup's 64 x D block of O, wgmma accumulator layout
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};  // rows g and g + 8; m in raw-score units
    const float sl2 = scale * 1.4426950408889634f;  // exp(scale x) = 2^(sl2 x)
    const u32 Qw = Qs + cw * 64 * 128;  // this warpgroup's 64 rows inside each box
    mbar_wait(qbar, 0);

    // tiles 0 .. n_mine - 1 are this warpgroup's (causal: the rest lie past its last row)
    const int row0 = q0 + wrow0;
    const int n_mine = causal ? min(n_tiles, (q0 + cw * 64 + 63) / Bc + 1) : n_tiles;
    float s[Bc / 2];      // S_j, then P_j (64 x Bc): s[4 j + e] is row g + 8 (e / 2), key 8 j + 2 t + e % 2
    u32 p[Bc / 16][4];    // P_{j-1} as A fragments, read by the O += P V in flight
    float alpha[2] = {1.f, 1.f};

    const int n_turns = n_tiles + 1;  // the same for both warpgroups
    if (cw == 1) named_bar_arrive(PINGPONG_BAR, NCONSUMERS);  // warpgroup 0 takes turn 0 first

    mbar_wait(full0, 0);  // tile 0: S_0 and its softmax alone (O is still zero)
    __syncwarp();
    turn_begin(cw);       // turn 0
    wgmma_fence();
    qk_issue(s, Qw, Ks_buf);
    turn_end(cw, 0, n_turns);
    wgmma_wait<0>();
    wgmma_fence_acc(s);
    softmax_tile(s, m, l, alpha, 0, row0, Nk, causal, sl2, g, t);

    for (int it = 1; it < n_mine; it++) {
        const int st = it % KV_STAGES, pst = (it - 1) % KV_STAGES;
        pack_p(p, s);
        mbar_wait(full0 + 8 * st, (it / KV_STAGES) & 1);  // tile it has landed in stage st
        __syncwarp();
        turn_begin(cw);      // turn it
        wgmma_fence_acc(o);  // the rescale of o stays above the fence
        wgmma_fence();       // after the ordinary accesses of p, s and o
        qk_issue(s, Qw, Ks_buf + st * KV_BYTES);        // group 1: S_it = Q K_it^T
        pv_issue(o, p, Vs_buf + pst * KV_BYTES);        // group 2: O += P_{it-1} V_{it-1}
        turn_end(cw, it, n_turns);                       // the other warpgroup's products next
        wgmma_wait<1>();                                 // S_it is done, the product may run on
        wgmma_fence_acc(s);
        const bool rescale = softmax_tile(s, m, l, alpha, it * Bc, row0, Nk, causal, sl2, g, t);
        wgmma_wait<0>();
        wgmma_fence_acc(o);
        mbar_arrive(empty0 + 8 * pst);  // this thread is done with tile it - 1's stage
        if (rescale) {
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                o[4 * n] *= alpha[0];
                o[4 * n + 1] *= alpha[0];
                o[4 * n + 2] *= alpha[1];
                o[4 * n + 3] *= alpha[1];
            }
        }
    }
    const int last = (n_mine - 1) % KV_STAGES;  // O += P V of this warpgroup's last tile
    pack_p(p, s);
    turn_begin(cw);  // turn n_mine
    wgmma_fence_acc(o);
    wgmma_fence();
    pv_issue(o, p, Vs_buf + last * KV_BYTES);
    turn_end(cw, n_mine, n_turns);
    wgmma_wait<0>();
    wgmma_fence_acc(o);
    mbar_arrive(empty0 + 8 * last);
    for (int it = n_mine; it < n_tiles; it++) {  // causal: the other warpgroup's tiles
        const int st = it % KV_STAGES;
        mbar_wait(full0 + 8 * st, (it / KV_STAGES) & 1);
        turn_begin(cw);  // turn it + 1, empty: passed on so that the turns stay in step
        turn_end(cw, it + 1, n_turns);
        mbar_arrive(empty0 + 8 * st);
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
