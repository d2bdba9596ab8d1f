// prefill: version 29's kernel reading K and V through a block table (a paged cache), with
// the causal mask bottom-right (sm_90a only). Not a numbered version: it is the forward of a
// prompt chunk written into a paged cache, launched by flashref.gpu.decode.prefill
// (paged_prefill_attention), and it takes the pools and tables of flashref.gpu.decode.
//
// A serving engine writes a long prompt into its cache chunk by chunk: the chunk's keys and
// values are appended first, then its Nq queries attend to all L keys of their sequence, the
// earlier chunks' and their own. Query i of the chunk sits at position L - Nq + i, so it
// sees keys j <= i + L - Nq: the causal mask aligned bottom-right. What changes from
// version 29 (same tiles, ring, ping-pong turns, persistent schedule and loop):
//   * the work tile's sequence: (b, query head hq) from its bh = b * Hq + hq; its K/V head is
//     hq / (Hq / Hkv) (grouped heads read their K/V head's pages, no copy), its length L =
//     lengths[b], its offset L - Nq;
//   * the producer's K/V load: a key tile of Bc = 128 is two boxes of 64 rows, each looked up
//     in the block table: key k lies in page block_table[b][k / page_size], slot
//     k % page_size, which is row (page * Hkv + hkv) * page_size + slot of the pools seen as
//     (num_pages * Hkv * page_size, D) (page_size a multiple of 64, so that a box lies in one
//     page). A box wholly past L is loaded from a row past the pools' end: TMA fills it with
//     zeros, and no page is looked up beyond the sequence's;
//   * the mask and the causal skip: keys past L, and with causal keys after row + L - Nq, are
//     masked (softmax_tile is given the row shifted by the offset); the last tile of a query
//     block is the one holding key q0 + Br - 1 + L - Nq;
//   * split keys (splits > 1): a chunk of few query blocks has fewer work tiles than the GPU
//     has SMs (4 query blocks x 16 heads = 64 for 132), so each (query block, head) can be
//     cut into `splits` work tiles by its key tiles, as the decode kernels split (chapter 10).
//     Split s of a query block with n key tiles takes tiles [s n / e, (s + 1) n / e), e =
//     min(splits, n / 2) (at least 1): at least two tiles each, so that consumer warpgroup 0,
//     whose last causal tile is at most one before warpgroup 1's, has a tile in every split.
//     A split s >= e is empty: no block loads anything for it, its rows get lse = -inf. Each
//     split writes its rows' O / l in float32 and their lse to O_part and lse_part, and
//     paged_prefill_combine merges a row's splits by their lse (a second launch);
//   * the start: a chunk's blocks hold a few key tiles each, so a block's start is a good part
//     of its life, and version 29's start reads three things in a row from global memory before
//     its first product: the sequence's length (to know whether the block has work and which
//     tiles are its), a page number, then the tile. Here a block whose first work tile is a
//     split 0 (every block, with one split) skips the empty-split check (a split 0 is never
//     empty), and its producer asks for that tile's Q and reads the pages of its keys 0 and
//     64 (split 0 starts at key 0) before it reads the length: the reads overlap, and the
//     first tile's copy waits for the length alone. Measured with clock64 stamps per block
//     and in results/gpu_serving.json's chunked prefill (this comment holds no numbers).
// Rows before the sequence's first key (L < Nq, a chunk not appended yet) would see no key:
// the host refuses tables it can check, and the pools' free slots must hold finite values
// (flashref.gpu.DevicePagedKVCache's pools start at zero).
//
// Compiled at run time by NVRTC with -arch=sm_90a, -DHEAD_DIM=<d>, d in {64, 128} (and
// -DFLASHREF_BF16 for bfloat16).

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
#define PRODUCER_SUSPEND_NS 20000  // longest sleep of the producer in one try_wait, well above a tile

#include "mma_common.cuh"     // half_t, u32, NEG_INF, pack_half2, ex2, smem_u32
#include "hopper_common.cuh"  // wgmma, descriptors, mbarrier, TMA

#include "hopper/consumer_loop.cuh"  // tile constants, qk/pv issue, pack_p, max_tree, ring_next, softmax_tile

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

#include "hopper/tile_scheduler.cuh"  // work_tile (the order of the work tiles)
#include "paged_kv.cuh"             // pool_row: a key's row of the paged pools

// the pools' row of key k of the sequence (K/V head hkv), k in page `page`; past_end (rows
// TMA fills with zeros) when k >= L: then every key of its box is past L
__device__ __forceinline__ int kv_row(int page, int k, int L, int hkv, int Hkv, int page_size,
                                      int past_end)
{
    return k < L ? pool_row(page, k % page_size, hkv, Hkv, page_size) : past_end;
}

// the producer thread: a K and V tile of Bc keys, two boxes of 64 rows from the pools' rows
// row[0] and row[1], into stage (Ks, Vs), counted on barrier full
__device__ __forceinline__ void load_kv_rows(u32 Ks, u32 Vs, const TensorMap* kmap,
                                             const TensorMap* vmap, const int (&row)[Bc / 64],
                                             u32 full)
{
    mbar_arrive_expect_tx(full, 2 * KV_BYTES);
#pragma unroll
    for (int half = 0; half < Bc / 64; half++)
#pragma unroll
        for (int b = 0; b < NBOX; b++) {
            tma_load_2d(Ks + b * BOX_KV + half * 64 * 128, kmap, 64 * b, row[half], full);
            tma_load_2d(Vs + b * BOX_KV + half * 64 * 128, vmap, 64 * b, row[half], full);
        }
}

// the tile of keys c0 .. c0 + Bc - 1, each box's page looked up in the sequence's block table
// bt (no page is looked up past L)
__device__ __forceinline__ void load_kv_paged(u32 Ks, u32 Vs, const TensorMap* kmap,
                                              const TensorMap* vmap, const int* bt, int c0, int L,
                                              int hkv, int Hkv, int page_size, int past_end,
                                              u32 full)
{
    int row[Bc / 64];
#pragma unroll
    for (int half = 0; half < Bc / 64; half++) {
        const int k = c0 + 64 * half;
        row[half] = k < L ? kv_row(bt[k / page_size], k, L, hkv, Hkv, page_size, past_end) : past_end;
    }
    load_kv_rows(Ks, Vs, kmap, vmap, row, full);
}

// the producer thread: query block q_block's Q rows of (batch, head) bh, both consumer
// warpgroups' 64, counted on barrier qbar
__device__ __forceinline__ void load_q(u32 Qs, const TensorMap* qmap, int bh, int Nq, int q_block,
                                       u32 qbar)
{
    mbar_arrive_expect_tx(qbar, Q_BYTES);
#pragma unroll
    for (int b = 0; b < NBOX; b++)
#pragma unroll
        for (int w = 0; w < NWG; w++)
            tma_load_2d(Qs + b * BOX_Q + w * 64 * 128, qmap, 64 * b, bh * Nq + q_block * Br + 64 * w, qbar);
}

// work tile `item` of Tr * BH * splits (the splits of one query block side by side): its query
// block, (batch, head) bh, sequence length L and key tiles [t_lo, t_hi); false if the split is
// empty (see the header)
__device__ __forceinline__ bool split_tile(int item, int Tr, int BH, int G, int causal, int splits,
                                           const int* lengths, int Hq, int Nq, int& q_block,
                                           int& bh, int& L, int& t_lo, int& t_hi)
{
    const int split = item % splits;
    work_tile(item / splits, Tr, BH, G, causal, q_block, bh);
    L = lengths[bh / Hq];
    const int kv_end = causal ? min(L, q_block * Br + Br + L - Nq) : L;
    const int n_tiles = (kv_end + Bc - 1) / Bc;
    const int e = max(1, min(splits, n_tiles / 2));
    t_lo = split * n_tiles / e;
    t_hi = (split + 1) * n_tiles / e;
    return split < e;
}

// whether this block has a non-empty work tile after `item` (its items go by gridDim.x)
__device__ __forceinline__ bool more_tiles(int item, int n_items, int Tr, int BH, int G, int causal,
                                           int splits, const int* lengths, int Hq, int Nq)
{
    int q_block, bh, L, t_lo, t_hi;
    for (int next = item + (int)gridDim.x; next < n_items; next += gridDim.x)
        if (split_tile(next, Tr, BH, G, causal, splits, lengths, Hq, Nq, q_block, bh, L, t_lo, t_hi))
            return true;
    return false;
}

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
paged_prefill(const half_t* __restrict__ Q,  // (B*Hq, Nq, D), read through qmap
              half_t* __restrict__ O,        // (B*Hq, Nq, D)
              float* __restrict__ lse,       // (B*Hq, Nq)
              const int* __restrict__ block_table,  // (B, max_pages)
              const int* __restrict__ lengths,      // (B,): keys of each sequence, >= Nq
              int Nq, int Nk_max, float scale, int causal,
              const __grid_constant__ TensorMap qmap,   // (B*Hq*Nq, D), box (64, 64)
              const __grid_constant__ TensorMap kmap,   // (num_pages*Hkv*page_size, D), box (64, 64)
              const __grid_constant__ TensorMap vmap,   // the same for V
              int BH, int Hq, int Hkv, int page_size, int max_pages, int past_end,
              int splits,                    // key splits per query block (1: O and lse directly)
              float* __restrict__ O_part,    // splits > 1: (B*Hq*Nq, splits, D), each split's O / l
              float* __restrict__ lse_part)  // splits > 1: (B*Hq*Nq, splits)
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
    const int n_items = Tr * BH * splits;  // work tiles; this block takes blockIdx.x, + gridDim.x, ...
    // causal: heads per section, their K and V (Nk x D x 2 x 2 bytes each) within L2_KV_BYTES
    const int G = (int)max(1ll, min((long long)BH, L2_KV_BYTES / ((long long)Nk_max * D * 4)));
    const int group = Hq / Hkv;  // query heads per K/V head
    if ((int)blockIdx.x >= n_items) return;  // never: the host launches min(n_items, SMs) blocks
    // a block whose work tiles are all empty splits writes their lse and leaves; a block whose
    // first work tile is a split 0 (never empty) has work, and reads no length to know it
    if (blockIdx.x % splits != 0) {
        int q_block, bh, L, t_lo, t_hi;
        if (!split_tile(blockIdx.x, Tr, BH, G, causal, splits, lengths, Hq, Nq, q_block, bh, L, t_lo, t_hi) &&
            !more_tiles(blockIdx.x, n_items, Tr, BH, G, causal, splits, lengths, Hq, Nq)) {
            for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
                split_tile(item, Tr, BH, G, causal, splits, lengths, Hq, Nq, q_block, bh, L, t_lo, t_hi);
                for (int r = threadIdx.x; r < Br; r += NTHREADS)
                    if (q_block * Br + r < Nq)
                        lse_part[((size_t)bh * Nq + q_block * Br + r) * splits + item % splits] = NEG_INF;
            }
            return;
        }
    }

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
            for (int item = blockIdx.x, n = 0; item < n_items; item += gridDim.x) {
                int q_block, bh, L, t_lo, t_hi;  // key tiles t_lo .. t_hi - 1 of query block q_block
                // a split 0 is never empty and starts at key 0: its Q and the pages of its first
                // tile are asked for before its sequence's length is read, not after it
                const bool split0 = item % splits == 0;
                int page0[Bc / 64];  // split 0: the pages of keys 0 and 64
                if (split0) {
                    work_tile(item / splits, Tr, BH, G, causal, q_block, bh);
                    const int* bt = block_table + (size_t)(bh / Hq) * max_pages;
#pragma unroll
                    for (int half = 0; half < Bc / 64; half++)  // used only for keys below L
                        page0[half] = 64 * half / page_size < max_pages ? bt[64 * half / page_size] : 0;
                    if (n >= 1)  // both warpgroups' last S of n - 1
                        mbar_wait_suspend(q_empty, (n - 1) & 1, PRODUCER_SUSPEND_NS);
                    load_q(Qs, &qmap, bh, Nq, q_block, qbar);
                }
                if (!split_tile(item, Tr, BH, G, causal, splits, lengths, Hq, Nq, q_block, bh, L, t_lo, t_hi))
                    continue;  // an empty split: nothing to load (n counts the loaded tiles)
                const int b_seq = bh / Hq, hkv = (bh % Hq) / group;
                const int* bt = block_table + (size_t)b_seq * max_pages;
                if (!split0) {
                    if (n >= 1)
                        mbar_wait_suspend(q_empty, (n - 1) & 1, PRODUCER_SUSPEND_NS);
                    load_q(Qs, &qmap, bh, Nq, q_block, qbar);
                }
                for (int it = t_lo; it < t_hi; it++) {
                    if (refill)  // the consumers left the tile KV_STAGES before this one
                        mbar_wait_suspend(empty0 + 8 * st, ph ^ 1, PRODUCER_SUSPEND_NS);
                    if (split0 && it == 0) {  // the pages read above
                        int row[Bc / 64];
#pragma unroll
                        for (int half = 0; half < Bc / 64; half++)
                            row[half] = kv_row(page0[half], 64 * half, L, hkv, Hkv, page_size, past_end);
                        load_kv_rows(Ks_buf + st * KV_BYTES, Vs_buf + st * KV_BYTES, &kmap, &vmap,
                                     row, full0 + 8 * st);
                    } else {
                        load_kv_paged(Ks_buf + st * KV_BYTES, Vs_buf + st * KV_BYTES, &kmap, &vmap,
                                      bt, it * Bc, L, hkv, Hkv, page_size, past_end, full0 + 8 * st);
                    }
                    ring_next(st, ph);
                    refill |= st == 0;
                }
                n++;
            }
        }
        return;
    }

    setmaxnreg_inc<CONSUMER_REGS>();
    const int cw = wg - 1;                  // consumer warpgroup 0 or 1
    const int wrow0 = cw * 64 + warp * 16;  // first row of this warp inside the block
    const float sl2 = scale * 1.4426950408889634f;  // exp(scale x) = 2^(sl2 x)
    // the base descriptors: k-step 0 of this warpgroup's 64 rows of Q (inside each box), of
    // stage 0's K tile and the first 16 keys of stage 0's V tile; stage st is + st DESC_STAGE
    const u64 dq = desc_kmajor_sw128(Qs + cw * 64 * 128, 0);
    const u64 dk0 = desc_kmajor_sw128(Ks_buf, 0);
    const u64 dv0 = desc_mnmajor_sw128(Vs_buf, 0, BOX_KV);
    if (cw == 1) named_bar_arrive(PINGPONG_BAR, NCONSUMERS);  // warpgroup 0 takes turn 0 first

    int st = 0;  // the ring's next K/V tile (the producer's order): its stage,
    u32 ph = 0;  // and the parity of that stage's filling
    for (int item = blockIdx.x, n = 0; item < n_items; item += gridDim.x) {
        int q_block, bh, L, t_lo, t_hi;  // key tiles t_lo .. t_hi - 1 of query block q_block
        const int split = item % splits;
        if (!split_tile(item, Tr, BH, G, causal, splits, lengths, Hq, Nq, q_block, bh, L, t_lo, t_hi)) {
            const int row = q_block * Br + wrow0 + (threadIdx.x % 128) % 16;  // an empty split:
            if ((threadIdx.x % 128) % 32 < 16 && row < Nq)                  // lse = -inf, no O
                lse_part[((size_t)bh * Nq + row) * splits + split] = NEG_INF;
            continue;
        }
        const int q0 = q_block * Br, off = L - Nq;  // query i sits at key i + off
        const int n_tiles = t_hi - t_lo;            // this split's tiles: it = 0 is tile t_lo
        const int c_lo = t_lo * Bc;                 // its first key
        // another non-empty work tile follows in this block
        const bool more = more_tiles(item, n_items, Tr, BH, G, causal, splits, lengths, Hq, Nq);

        float o[D / 2];  // this warpgroup's 64 x D block of O, wgmma accumulator layout
#pragma unroll
        for (int i = 0; i < D / 2; i++) o[i] = 0.f;
        float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};  // rows g and g + 8; m in raw-score units
        // tiles 0 .. n_mine - 1 are this warpgroup's (causal: the rest lie past its last row)
        const int row0 = q0 + wrow0 + off;  // in key positions: the mask's row
        const int n_mine = causal ? min(t_hi, (q0 + cw * 64 + 63 + off) / Bc + 1) - t_lo : n_tiles;
        float s[Bc / 2];      // S_j, then P_j (64 x Bc): s[4 j + e] is row g + 8 (e / 2), key 8 j + 2 t + e % 2
        u32 p[Bc / 16][4];    // P_{j-1} as A fragments, read by the O += P V in flight
        float alpha[2] = {1.f, 1.f};
        const int n_turns = n_tiles + 1;  // the same for both warpgroups
        mbar_wait(qbar, n & 1);  // Q of work tile n has landed

        mbar_wait(full0 + 8 * st, ph);  // tile 0: S_0 alone
        __syncwarp();
        turn_begin(cw);       // turn 0
        wgmma_fence();
        qk_issue(s, dq, dk0 + st * DESC_STAGE);
        turn_end(cw, 0, n_turns, more);
        wgmma_wait<0>();
        wgmma_fence_acc(s);
        if (n_mine == 1) mbar_arrive(q_empty);  // this warpgroup's last S has read Q
        softmax_tile(s, m, l, alpha, c_lo, row0, L, causal, sl2, g, t);
        pack_p(p, s);  // P_0: no product reads p now
        int pst = st;  // the stage of the tile whose P V comes next
        ring_next(st, ph);

        for (int it = 1; it < n_mine; it++) {
            mbar_wait(full0 + 8 * st, ph);  // tile it landed in stage st
            __syncwarp();
            turn_begin(cw);      // turn it
            wgmma_fence_acc(o);  // the rescale of o stays above the fence
            wgmma_fence();       // after the ordinary accesses of p, s and o
            qk_issue(s, dq, dk0 + st * DESC_STAGE);         // group 1: S_it = Q K_it^T
            pv_issue(o, p, dv0 + pst * DESC_STAGE);         // group 2: O += P_{it-1} V_{it-1}
            turn_end(cw, it, n_turns, more);                 // the other warpgroup's products next
            wgmma_wait<1>();                                 // S_it is done, the product may run on
            wgmma_fence_acc(s);
            if (it + 1 == n_mine) mbar_arrive(q_empty);     // the last S: Q may be overwritten
            const bool rescale = softmax_tile(s, m, l, alpha, c_lo + it * Bc, row0, L, causal, sl2, g, t);
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
        turn_begin(cw);  // turn n_mine: O += P V of this warpgroup's last tile (stage pst)
        wgmma_fence_acc(o);
        wgmma_fence();
        pv_issue(o, p, dv0 + pst * DESC_STAGE);
        turn_end(cw, n_mine, n_turns, more);
        wgmma_wait<0>();
        wgmma_fence_acc(o);
        mbar_arrive(empty0 + 8 * pst);
        for (int it = n_mine; it < n_tiles; it++) {  // causal: the other warpgroup's tiles
            mbar_wait(full0 + 8 * st, ph);
            turn_begin(cw);  // turn it + 1, empty: passed on so that the turns stay in step
            turn_end(cw, it + 1, n_turns, more);
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
            const float lse_r = (lr > 0.f) ? m[h] * scale + logf(lr) : NEG_INF;
            const size_t grow = (size_t)bh * Nq + row;
            if (splits == 1) {
                u32* Orow = (u32*)(O + grow * D);
#pragma unroll
                for (int c = 0; c < D / 8; c++)
                    Orow[c * 4 + t] = pack_half2(o[4 * c + 2 * h] * inv, o[4 * c + 2 * h + 1] * inv);
                if (t == 0) lse[grow] = lse_r;
            } else {
                float2* Orow = (float2*)(O_part + (grow * splits + split) * D);
#pragma unroll
                for (int c = 0; c < D / 8; c++)
                    Orow[c * 4 + t] = make_float2(o[4 * c + 2 * h] * inv, o[4 * c + 2 * h + 1] * inv);
                if (t == 0) lse_part[grow * splits + split] = lse_r;
            }
        }
        n++;
    }
}

// splits > 1: one warp per query row (bh, i) merges the row's splits by their lse, in split
// order: lse = log sum_s exp(lse_s), O = sum_s exp(lse_s - lse) O_s. An empty split (lse_s =
// -inf) is skipped: its O_s was never written.
extern "C" __global__ void __launch_bounds__(128)
paged_prefill_combine(const float* __restrict__ O_part,    // (rows, splits, D)
                      const float* __restrict__ lse_part,  // (rows, splits)
                      half_t* __restrict__ O,              // (rows, D)
                      float* __restrict__ lse,             // (rows,)
                      int rows, int splits)
{
    const int row = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;  // the whole warp
    const float* ls = lse_part + (size_t)row * splits;
    float mx = NEG_INF;
    for (int s = 0; s < splits; s++) mx = fmaxf(mx, ls[s]);
    float sum = 0.f;
    for (int s = 0; s < splits; s++)
        if (ls[s] != NEG_INF) sum += expf(ls[s] - mx);
    const float total = (mx == NEG_INF) ? NEG_INF : mx + logf(sum);
#pragma unroll
    for (int col = 2 * lane; col < D; col += 64) {
        float ox = 0.f, oy = 0.f;
        for (int s = 0; s < splits; s++) {
            if (ls[s] == NEG_INF) continue;
            const float w = expf(ls[s] - total);
            const float2 os = *(const float2*)&O_part[((size_t)row * splits + s) * D + col];
            ox += w * os.x;
            oy += w * os.y;
        }
        ((u32*)O)[((size_t)row * D + col) / 2] = pack_half2(ox, oy);
    }
    if (lane == 0) lse[row] = total;
}
