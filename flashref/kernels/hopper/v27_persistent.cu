// version 27: version 26 made persistent: one block per SM walks a list of work tiles (a query
// block of one head each), and its producer runs on into the next tile (sm_90a only).
//
// What changes from versions 23 (d = 64) and 26 (d = 128), whose tiles it keeps (Br = Bc = 128,
// three K/V stages at both head dims):
//   * in those versions a block computes one query block and exits. With few key tiles per
//     block (short sequences, and causal blocks near the top) the block's prologue (Q's load,
//     the first K/V tile, S_0 alone) and its epilogue (O / l, the stores) are a large share of
//     its time, and with one block per SM nothing runs beside them;
//   * here the grid is min(work tiles, SMs) blocks (the host never launches a block without a
//     work tile; the kernel returns at once if it had one), and block b takes work tiles b,
//     b + gridDim.x, ... of the list that work_tile() orders;
//   * the order (work_tile()): without causal the Tr query blocks of a head are side by side,
//     as in version 23's grid, so the blocks running at one time cover about SMs / Tr heads,
//     (SMs / Tr) x Nk x d x 4 bytes of K and V (under 10 MB at N = 1024, inside the 60 MB
//     L2), and each K/V tile comes from DRAM about once for all the query blocks of its head.
//     With causal a static walk ends balanced only if the long work tiles come first (each
//     block then takes one of nearly every length, and the blocks end close together), so the
//     list runs level by level: every head's last query block, then every head's one before
//     it, and so on, every other level through the heads backwards. Over all B x H heads at
//     once that would put a head's next query block one level, B x H work tiles, after this
//     one: its K/V would still be in L2 only while B x H x Nk x d x 4 bytes fit, and past that
//     causal would read K/V from DRAM once per work tile, about (Tr + 1) / 2 times over. So
//     the levels run over sections of G heads, G x Nk x d x 4 <= L2_KV_BYTES (half the L2,
//     the rest for the stream of the blocks running at one time), section after section: a
//     section's K/V stays in L2 while its levels run, and is read from DRAM about once. The
//     whole list is longest first whenever B x H heads fit in one section; otherwise each
//     section is, and a section holds G x Tr work tiles, so every block still takes tiles of
//     nearly every length in each (flashref.hardware.work_tiles mirrors the order; its test bounds
//     the spread);
//   * the producer never stops between work tiles: the K/V tiles of all of a block's work tiles
//     share one running count kv (stage kv % KV_STAGES, parity (kv / KV_STAGES) & 1, so a
//     stage's use count runs over work tiles). Q has one buffer, filled per work tile (qbar,
//     parity n & 1 for the block's n-th work tile) and emptied on q_empty: each consumer thread
//     arrives once its warpgroup's last S = Q K^T of the tile has completed (after wgmma_wait),
//     and the producer waits for it (parity (n - 1) & 1) before loading the next Q. The next
//     work tile's Q and first K/V tiles then land during this one's last softmax, its last
//     O += P V and its epilogue;
//   * the ping-pong turns run on across work tiles: each warpgroup takes n_tiles + 1 turns per
//     work tile (empty ones for causal tiles past its rows), the same count for both, so the turns
//     stay in step; warpgroup 1 hands on after every turn except its very last one of its last
//     work tile (turn_end's `more`). flashref.hardware.pingpong.run_blocks models the schedule over a
//     list of work tiles with their causal splits (tests/hardware/test_pingpong_model.py);
//   * deadlock: no wait of the producer depends on a later work tile (q_empty of tile n needs
//     only tile n's K/V; a stage's release needs only tiles already loaded), and no barrier can
//     run two phases ahead of its waiter (Q of tile n + 1 needs q_empty of tile n, which needs
//     both warpgroups past their wait for Q of tile n; the same for full and empty). A
//     warpgroup never has 0 own key tiles (causal row r sees key 0, so n_mine >= 1), and the
//     last work tile ends as version 23's block does.
// Everything else (the tiles, the softmax, causal per tile, ragged N, lse) is version 23's.
//
// Measured: see the recorded run (results/gpu_hopper.json), printed by chapter 12; this
// comment holds no numbers, so it cannot disagree with them.
//
// The producer's K/V load and work_tile() are in tile_scheduler.cuh, which versions 28 to
// 30 share.
//
// Compiled at run time by NVRTC with -arch=sm_90a, -DHEAD_DIM=<d>, d in {64, 128} (and
// -DFLASHREF_BF16 for bfloat16). The caller guarantees scale > 0 (a negative scale is folded
// into Q), passes version 23's tensor maps of Q (box 64 x 64) and K, V (box Bc x 64) viewed as
// (B*H*N, d) (flashref.gpu.tma.tensor_map), then BH = B*H, on Version.grid's
// min(Tr x BH, SMs) blocks (flashref/gpu/forward_versions.py).

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#define D HEAD_DIM
#define NWG 2                    // consumer warpgroups per block
#define Br (NWG * 64)            // 128 query rows per block
#define Bc 128                   // key tile at both head dims (versions 23 and 26)
#define KV_STAGES 3              // K/V tiles the producer may have in flight (version 26's ring)
#define NCONSUMERS (NWG * 128)   // threads that arrive on an "empty" barrier
#define NTHREADS ((NWG + 1) * 128)  // + the producer warpgroup
#define PRODUCER_REGS 24         // setmaxnreg budgets: 128 (24 + 2 x 240) = 384 x 168
#define CONSUMER_REGS 240
#define NBOX (D / 64)            // 64-column boxes per row of a tile
#define TAU 8.0f                 // rescale when the maximum grows by more than 2^TAU
#define L2_KV_BYTES (30ll << 20) // causal: K and V of a section of heads, half the 60 MB L2
#define PINGPONG_BAR 1           // named barrier of consumer warpgroup cw's turn: PINGPONG_BAR + cw

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

// the end of turn `turn` (of this tile's n_turns): hand the tensor cores to the other
// warpgroup, except after warpgroup 1's last turn of the block's last tile (`more`: another
// tile follows): no turn of warpgroup 0 follows that one to wait for it
__device__ __forceinline__ void turn_end(int cw, int turn, int n_turns, bool more)
{
    if (cw == 0 || more || turn + 1 < n_turns) named_bar_arrive(PINGPONG_BAR + 1 - cw, NCONSUMERS);
}

#include "tile_scheduler.cuh"  // load_kv, work_tile (the order of the work tiles)

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
flash_v27(const half_t* __restrict__ Q,  // (B*H, Nq, D), read through qmap
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
                if (n >= 1) mbar_wait(q_empty, (n - 1) & 1);  // both warpgroups' last S of n - 1
                mbar_arrive_expect_tx(qbar, Q_BYTES);  // Q_i: both consumers' rows
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
    const int cw = wg - 1;                  // consumer warpgroup 0 or 1
    const int wrow0 = cw * 64 + warp * 16;  // first row of this warp inside the block
    const float sl2 = scale * 1.4426950408889634f;  // exp(scale x) = 2^(sl2 x)
    const u32 Qw = Qs + cw * 64 * 128;  // this warpgroup's 64 rows inside each box
    if (cw == 1) named_bar_arrive(PINGPONG_BAR, NCONSUMERS);  // warpgroup 0 takes turn 0 first

    int kv = 0;  // K/V tiles this block has consumed before this work tile (the producer's count)
    for (int item = blockIdx.x, n = 0; item < n_items; item += gridDim.x, n++) {
        int q_block, bh;
        work_tile(item, Tr, BH, G, causal, q_block, bh);
        const int q0 = q_block * Br;
        const int kv_end = causal ? min(Nk, q0 + Br) : Nk;
        const int n_tiles = (kv_end + Bc - 1) / Bc;
        const bool more = item + (int)gridDim.x < n_items;  // another work tile follows

        float o[D / 2];  // this warpgroup's 64 x D block of O, wgmma accumulator layout
#pragma unroll
        for (int i = 0; i < D / 2; i++) o[i] = 0.f;
        float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};  // rows g and g + 8; m in raw-score units
        // tiles 0 .. n_mine - 1 are this warpgroup's (causal: the rest lie past its last row)
        const int row0 = q0 + wrow0;
        const int n_mine = causal ? min(n_tiles, (q0 + cw * 64 + 63) / Bc + 1) : n_tiles;
        float s[Bc / 2];      // S_j, then P_j (64 x Bc): s[4 j + e] is row g + 8 (e / 2), key 8 j + 2 t + e % 2
        u32 p[Bc / 16][4];    // P_{j-1} as A fragments, read by the O += P V in flight
        float alpha[2] = {1.f, 1.f};
        const int n_turns = n_tiles + 1;  // the same for both warpgroups
        mbar_wait(qbar, n & 1);  // Q of work tile n has landed

        mbar_wait(full0 + 8 * (kv % KV_STAGES), (kv / KV_STAGES) & 1);  // tile 0: S_0 alone
        __syncwarp();
        turn_begin(cw);       // turn 0
        wgmma_fence();
        qk_issue(s, Qw, Ks_buf + (kv % KV_STAGES) * KV_BYTES);
        turn_end(cw, 0, n_turns, more);
        wgmma_wait<0>();
        wgmma_fence_acc(s);
        if (n_mine == 1) mbar_arrive(q_empty);  // this warpgroup's last S has read Q
        softmax_tile(s, m, l, alpha, 0, row0, Nk, causal, sl2, g, t);

        for (int it = 1; it < n_mine; it++) {
            const int st = (kv + it) % KV_STAGES, pst = (kv + it - 1) % KV_STAGES;
            pack_p(p, s);
            mbar_wait(full0 + 8 * st, ((kv + it) / KV_STAGES) & 1);  // tile it landed in stage st
            __syncwarp();
            turn_begin(cw);      // turn it
            wgmma_fence_acc(o);  // the rescale of o stays above the fence
            wgmma_fence();       // after the ordinary accesses of p, s and o
            qk_issue(s, Qw, Ks_buf + st * KV_BYTES);        // group 1: S_it = Q K_it^T
            pv_issue(o, p, Vs_buf + pst * KV_BYTES);        // group 2: O += P_{it-1} V_{it-1}
            turn_end(cw, it, n_turns, more);                 // the other warpgroup's products next
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
        turn_begin(cw);  // turn n_mine
        wgmma_fence_acc(o);
        wgmma_fence();
        pv_issue(o, p, Vs_buf + last * KV_BYTES);
        turn_end(cw, n_mine, n_turns, more);
        wgmma_wait<0>();
        wgmma_fence_acc(o);
        mbar_arrive(empty0 + 8 * last);
        for (int it = n_mine; it < n_tiles; it++) {  // causal: the other warpgroup's tiles
            const int st = (kv + it) % KV_STAGES;
            mbar_wait(full0 + 8 * st, ((kv + it) / KV_STAGES) & 1);
            turn_begin(cw);  // turn it + 1, empty: passed on so that the turns stay in step
            turn_end(cw, it + 1, n_turns, more);
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
