// decode version 2: version 1 (v01_split_kv.cu, whose comment explains the design) with
// each warp streaming its own keys. Same grid, same split rule, same outputs; what changes:
//
//   version 1: the block's 4 warps share every 64-key tile (warp w takes its keys 16 w ..
//   16 w + 15), the tile is copied by all 128 threads, and a __syncthreads per tile makes
//   every warp wait for the slowest copy and the slowest warp before the refill is issued.
//   version 2: the split's keys are cut into 16-key sub-tiles, warp w takes sub-tiles
//   w, w + 4, w + 8, ... (the same keys as version 1) and copies them itself into its own
//   STAGES_W-deep ring of (K, V) buffers with its own cp.async groups; a __syncwarp orders
//   them. The block meets at a barrier twice only: once when Q has landed, once at the end
//   where the 4 warps' (m, l, O) are merged as in version 1. A warp whose copies arrive
//   early computes and refills without waiting for the others, so the SM keeps its copies
//   in flight more evenly. Sub-tiles wholly past L are not copied or computed at all.
//
//   pages: a sub-tile starts at a multiple of 16, so when page_size is a multiple of 16 its
//   16 keys lie in one page and the block table is read once per sub-tile (one lookup per
//   warp instead of one division per copied row); other page sizes keep the per-row lookup.
//
//   combine: as version 1, with the loop over splits unrolled by 4 so that the loads of
//   several partial results are in flight together (it runs S dependent-latency steps per row).
//
// Shared memory: Q (ROWS, LDS), then NWARPS rings of STAGES_W x (K, V) sub-tiles of
// (16, LDS): at d = 128 that is 4 x 3 x 8.5 KiB, the same bytes as version 1's 3 x 32 KiB, so
// two blocks still fit on an SM and the split rule (two blocks per SM) is unchanged.
//
// Compiled at run time by NVRTC with -DHEAD_DIM=<d> (64 or 128), -DROW_TILES=<1 or 2> (and
// -DFLASHREF_BF16 for bfloat16). The block's tiling (D, ROWS, NWARPS, Bc, LDS, LDR) and its
// last step (merge_warps_v2: the warps' states merged, O or the partials written) are in
// split_kv.cuh, which versions 3 to 7 share; the PTX wrappers are in mma_common.cuh.

#include "split_kv.cuh"  // D, MT, ROWS, NWARPS, NTHREADS, Bc, LDS, LDR, CHUNKS, RSTEP, merge_warps_v2

#define BK 16                    // keys per warp sub-tile
#if HEAD_DIM == 128
#define STAGES_W 3               // per warp: 2 sub-tiles in flight, 1 computed
#else
#define STAGES_W 5               // rows are half as long: more sub-tiles in the same space
#endif

constexpr int WSTEP = 32 / CHUNKS;        // rows covered by one pass of a warp's lanes
constexpr int TILE_BYTES = BK * LDS * 2;  // one (BK, LDS) sub-tile of K or V
constexpr int STAGE_BYTES = 2 * TILE_BYTES;  // a K sub-tile, then its V sub-tile
constexpr int RING_BYTES = STAGES_W * STAGE_BYTES;  // one warp's ring
static_assert(ROWS % RSTEP == 0 && BK % WSTEP == 0, "copy passes must tile the rows");
static_assert((NWARPS * ROWS * (LDR + 2)) * 4 <= NWARPS * RING_BYTES, "merge buffer fits");

// this warp starts copying keys [c0, c0 + BK) of sequence b, K/V head hkv, into the stage at
// s (K sub-tile, then V sub-tile); zeros past L. Lane copies piece lane % CHUNKS of rows
// lane / CHUNKS + k WSTEP. The caller guarantees c0 < L (c0 is a key in use).
__device__ __forceinline__ void load_kv_subtile(u32 s, const half_t* K, const half_t* V,
                                                const int* bt, int b, int hkv, int Hkv, int ps,
                                                int c0, int L)
{
    const int lane = threadIdx.x % 32;
    const int r = lane / CHUNKS, c = lane % CHUNKS;
    const bool one_page = !bt || ps % BK == 0;  // then the BK keys share one page
    int page0 = b, slot0 = c0;                  // contiguous cache: page b, ps = Nk
    if (bt && one_page) {
        const int pi = c0 / ps;  // once per sub-tile, the same for every lane
        page0 = bt[pi], slot0 = c0 - pi * ps;
    }
#pragma unroll
    for (int k = 0; k < BK / WSTEP; k++) {
        const int row = r + k * WSTEP;
        const int p = c0 + row;  // the key's position in its sequence
        const bool ok = p < L;
        size_t off = 0;
        if (ok) {
            int page = page0, slot = slot0 + row;
            if (!one_page) {
                const int pi = p / ps;
                page = bt[pi], slot = p - pi * ps;
            }
            off = (((size_t)page * Hkv + hkv) * ps + slot) * D + c * 8;
        }
        const u32 dst = s + (row * LDS + c * 8) * 2;
        cp_async16(dst, K + off, ok);
        cp_async16(dst + TILE_BYTES, V + off, ok);
    }
}

// The split kernel's body, a function so that version 4 can add its own ending after it.
// EARLY_REFILL (version 4): each refill is issued before the wait for the sub-tile it follows.
template <bool EARLY_REFILL>
__device__ __forceinline__ void
split_kv_v2_body(const half_t* __restrict__ Q,   // (B, Hq, Nq, D)
                const half_t* __restrict__ K,   // (num_pages, Hkv, page_size, D)
                const half_t* __restrict__ V,   // (num_pages, Hkv, page_size, D)
                const int* __restrict__ block_table,  // (B, max_pages), or null: contiguous
                const int* __restrict__ lengths,      // (B,), or null: every L = page_size
                half_t* __restrict__ O,         // (B, Hq, Nq, D), written when gridDim.x == 1
                float* __restrict__ lse,        // (B, Hq, Nq), written when gridDim.x == 1
                float* __restrict__ O_part,     // (B, Hq, Nq, S, D), written when S > 1
                float* __restrict__ lse_part,   // (B, Hq, Nq, S), written when S > 1
                int Hq, int Hkv, int Nq, int page_size, int max_pages, float scale, int causal)
{
    extern __shared__ uint4 smem_[];
    const u32 Qs = smem_u32(smem_);     // (ROWS, LDS) halves
    const u32 KV = Qs + ROWS * LDS * 2;  // NWARPS rings of STAGES_W x (K, V) sub-tiles (BK, LDS)

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3;
    const int split = blockIdx.x, S = gridDim.x;
    const int hkv = blockIdx.y % Hkv, row0 = (blockIdx.y / Hkv) * ROWS;  // first packed row
    const int b = blockIdx.z;
    const int G = Hq / Hkv, M = G * Nq;  // packed rows of this K/V head: row R = (h - hkv G) Nq + i
    const int L = lengths ? lengths[b] : page_size;
    const int last = L - Nq;             // bottom-right causal: query i sees keys j <= i + last
    const int T = (L + Bc - 1) / Bc;     // the sequence's key tiles; this split's are [t0, t1)
    const int t0 = (int)((long long)split * T / S), t1 = (int)((long long)(split + 1) * T / S);
    // this warp's sub-tiles: u = 4 t0 + warp, + NWARPS, ... below min(4 t1, ceil(L / BK))
    const int u0 = t0 * (Bc / BK) + warp;
    const int u_end = min(t1 * (Bc / BK), (L + BK - 1) / BK);
    const int n_sub = u0 < u_end ? (u_end - u0 + NWARPS - 1) / NWARPS : 0;
    const u32 ring = KV + warp * RING_BYTES;
    const int* bt = block_table ? block_table + (size_t)b * max_pages : nullptr;
    const size_t qrow0 = ((size_t)b * Hq + (size_t)hkv * G) * Nq;  // global row of packed row 0
    const half_t* Qb = Q + qrow0 * D;  // (M, D): the G heads' queries, one contiguous slab

    {  // Q rows [row0, row0 + ROWS) of the slab, zeros past M: a copy group of its own
        const int r = threadIdx.x / CHUNKS, c = threadIdx.x % CHUNKS;
#pragma unroll
        for (int k = 0; k < ROWS / RSTEP; k++) {
            const int R = row0 + r + k * RSTEP;
            const bool ok = R < M;
            cp_async16(Qs + ((r + k * RSTEP) * LDS + c * 8) * 2, ok ? Qb + (size_t)R * D + c * 8 : Q, ok);
        }
    }
    cp_async_commit();
#pragma unroll
    for (int st = 0; st < STAGES_W - 1; st++) {  // the warp's first sub-tiles: one group each
        if (st < n_sub) load_kv_subtile(ring + st * STAGE_BYTES, K, V, bt, b, hkv, Hkv, page_size, (u0 + st * NWARPS) * BK, L);
        cp_async_commit();
    }
    cp_async_wait<STAGES_W - 1>();  // this thread's Q pieces have landed ...
    __syncthreads();                // ... and everyone's: the only barrier before the merge

    float o[MT][D / 8][4];  // this warp's partial O for all ROWS rows: MT x D/8 tiles of 16 x 8
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int n = 0; n < D / 8; n++) o[mi][n][0] = o[mi][n][1] = o[mi][n][2] = o[mi][n][3] = 0.f;
    float m[MT][2], l[MT][2];  // rows g and g+8 of each row group; m in raw-score units
#pragma unroll
    for (int mi = 0; mi < MT; mi++) m[mi][0] = m[mi][1] = NEG_INF, l[mi][0] = l[mi][1] = 0.f;
    // each lane's byte offset inside the fragments it loads (the ldmatrix row it points at)
    const u32 a_lane = ((lane % 16) * LDS + (lane / 16) * 8) * 2;  // Q, A operand
    const u32 k_lane = (((lane % 8) + (lane / 16) * 8) * LDS + ((lane / 8) % 2) * 8) * 2;
    const u32 v_lane = (((lane % 8) + ((lane / 8) % 2) * 8) * LDS + (lane / 16) * 8) * 2;
    const float sl2 = scale * 1.4426950408889634f;  // exp(scale x) = 2^(sl2 x)

    for (int it = 0; it < n_sub; it++) {
        if (!EARLY_REFILL)
            cp_async_wait<STAGES_W - 2>();  // sub-tile it has landed (this lane's copies) ...
        __syncwarp();  // ... every lane's; and every lane is done with it - 1
        {
            const int nx = it + STAGES_W - 1;  // refill the buffer of sub-tile it - 1
            if (nx < n_sub)
                load_kv_subtile(ring + (nx % STAGES_W) * STAGE_BYTES, K, V, bt, b, hkv, Hkv, page_size, (u0 + nx * NWARPS) * BK, L);
            cp_async_commit();  // (an empty group near the end keeps the count uniform)
        }
        if (EARLY_REFILL) {  // the wait comes after the refill: STAGES_W sub-tiles in flight
            cp_async_wait<STAGES_W - 1>();  // sub-tile it has landed (this lane's copies) ...
            __syncwarp();                   // ... every lane's
        }
        const u32 Ks = ring + (it % STAGES_W) * STAGE_BYTES + k_lane;
        const u32 Vs = ring + (it % STAGES_W) * STAGE_BYTES + TILE_BYTES + v_lane;
        const int c0 = (u0 + it * NWARPS) * BK;  // this warp's first key

        // S = Q K^T for all ROWS rows and this warp's 16 keys: each K fragment feeds MT mma
        float s[MT][2][4];
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
#pragma unroll
            for (int j = 0; j < 2; j++) s[mi][j][0] = s[mi][j][1] = s[mi][j][2] = s[mi][j][3] = 0.f;
#pragma unroll
        for (int k0 = 0; k0 < D; k0 += 16) {
            u32 b0, b1, b2, b3;  // b0, b1 for keys 0-7; b2, b3 for keys 8-15
            ldsm_x4(Ks + k0 * 2, b0, b1, b2, b3);
#pragma unroll
            for (int mi = 0; mi < MT; mi++) {
                u32 a0, a1, a2, a3;
                ldsm_x4(Qs + a_lane + (mi * 16 * LDS + k0) * 2, a0, a1, a2, a3);
                mma16816(s[mi][0], a0, a1, a2, a3, b0, b1);
                mma16816(s[mi][1], a0, a1, a2, a3, b2, b3);
            }
        }

        // mask keys past L and, with causal, keys after the query (only where a key may be)
        if (c0 + 16 > L || (causal && c0 + 15 > last)) {
#pragma unroll
            for (int mi = 0; mi < MT; mi++)
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int p = c0 + j * 8 + 2 * t + (e & 1);
                        const int i = (row0 + mi * 16 + g + (e >> 1) * 8) % Nq;  // the query
                        if (p >= L || (causal && p > i + last)) s[mi][j][e] = NEG_INF;
                    }
        }

        // online softmax on the fragments: h = 0 is row g (c0, c1), h = 1 is row g+8 (c2, c3)
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float x = fmaxf(fmaxf(s[mi][0][2 * h], s[mi][0][2 * h + 1]),
                                fmaxf(s[mi][1][2 * h], s[mi][1][2 * h + 1]));
                x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));  // the 4 lanes of a quad
                x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));  // share one row
                const float m_new = fmaxf(m[mi][h], x);
                const float alpha = (m_new == NEG_INF) ? 1.f : ex2((m[mi][h] - m_new) * sl2);
                m[mi][h] = m_new;
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    o[mi][n][2 * h] *= alpha;
                    o[mi][n][2 * h + 1] *= alpha;
                }
                const float m_sl2 = (m_new == NEG_INF ? 0.f : m_new) * sl2;  // nothing seen: 0
                float sum = 0.f;
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int e = 2 * h; e < 2 * h + 2; e++) {
                        s[mi][j][e] = ex2(fmaf(s[mi][j][e], sl2, -m_sl2));  // P <= 1, fp32
                        sum += s[mi][j][e];
                    }
                l[mi][h] = l[mi][h] * alpha + sum;
            }

        // O += P V for this warp's 16 keys: the accumulators are the A operand (16 x 16)
#pragma unroll
        for (int mi = 0; mi < MT; mi++) {
            const u32 a0 = pack_half2(s[mi][0][0], s[mi][0][1]);
            const u32 a1 = pack_half2(s[mi][0][2], s[mi][0][3]);
            const u32 a2 = pack_half2(s[mi][1][0], s[mi][1][1]);
            const u32 a3 = pack_half2(s[mi][1][2], s[mi][1][3]);
#pragma unroll
            for (int n = 0; n < D / 8; n += 2) {
                u32 b0, b1, b2, b3;  // b0, b1 for d tile n; b2, b3 for d tile n+1
                ldsm_x4_trans(Vs + n * 8 * 2, b0, b1, b2, b3);
                mma16816(o[mi][n], a0, a1, a2, a3, b0, b1);
                mma16816(o[mi][n + 1], a0, a1, a2, a3, b2, b3);
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with its ring: the rings' space holds the merge

    merge_warps_v2((float*)((char*)smem_ + ROWS * LDS * 2), o, m, l, warp, NTHREADS, row0, M,
                   qrow0, split, S, sl2, scale, O, lse, O_part, lse_part);
}

extern "C" __global__ void __launch_bounds__(NTHREADS, 2)
decode_split_kv_v2(const half_t* __restrict__ Q, const half_t* __restrict__ K,
                   const half_t* __restrict__ V, const int* __restrict__ block_table,
                   const int* __restrict__ lengths, half_t* __restrict__ O, float* __restrict__ lse,
                   float* __restrict__ O_part, float* __restrict__ lse_part,
                   int Hq, int Hkv, int Nq, int page_size, int max_pages, float scale, int causal)
{
    split_kv_v2_body<false>(Q, K, V, block_table, lengths, O, lse, O_part, lse_part, Hq, Hkv,
                            Nq, page_size, max_pages, scale, causal);
}

// The combine step (as version 1, its split loop unrolled): one warp per query row (b, h, i) merges its S partial results by lse.
extern "C" __global__ void __launch_bounds__(128)
decode_combine_v2(const float* __restrict__ O_part,    // (rows, S, D)
               const float* __restrict__ lse_part,  // (rows, S)
               half_t* __restrict__ O,              // (rows, D)
               float* __restrict__ lse,             // (rows,)
               int rows, int S)
{
    const int row = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;  // the whole warp
    const float* ls = lse_part + (size_t)row * S;
    float mx = NEG_INF;
    for (int s = lane; s < S; s += 32) mx = fmaxf(mx, ls[s]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.f;
    if (mx != NEG_INF)
        for (int s = lane; s < S; s += 32) sum += expf(ls[s] - mx);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const float total = (mx == NEG_INF) ? NEG_INF : mx + logf(sum);  // lse = log sum_s exp(lse_s)
    for (int col = 2 * lane; col < D; col += 64) {
        float ox = 0.f, oy = 0.f;
        if (total != NEG_INF)
#pragma unroll 4
            for (int s = 0; s < S; s++) {
                const float w = expf(ls[s] - total);  // exp(-inf) = 0: an empty split adds nothing
                const float2 os = *(const float2*)&O_part[((size_t)row * S + s) * D + col];
                ox += w * os.x;
                oy += w * os.y;
            }
        ((u32*)O)[((size_t)row * D + col) / 2] = pack_half2(ox, oy);
    }
    if (lane == 0) lse[row] = total;
}
