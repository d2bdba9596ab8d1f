// decode version 7: version 6 with the first tiles asked for before the block's barrier.
// Same grid, split rule, partial layout, shared memory and combine kernel as version 6.
//
//   version 5 / 6: thread 0 makes the ring's mbarriers, the 4 consumer warps copy the
//   block's Q rows in (cp.async), and only after the block-wide barrier that follows does
//   the producer warp ask for its first tile. So every block pays two DRAM latencies in a
//   row before its first key: Q's, then the first tile's. A block of a short split (a few
//   tiles) or of a short cache spends a good part of its life there, and in a graph of
//   many such calls (a decode step) that start-up is most of the call.
//   version 7: the producer warp's lane makes the mbarriers itself and asks for the first
//   STAGES tiles (or all of the split's, if fewer) before the barrier; the consumer warps
//   load Q meanwhile. The barrier then orders the mbarriers' initialisation before the
//   consumers' first wait, as before, and the producer goes on from tile STAGES. Nothing
//   else changes: the tile loop, the masking, the merge and the combine are version 6's.
//
//   Deterministic as versions 3 to 6. Measured: the recorded run (results/gpu_decode.json,
//   rows flashref_v7 and flashref_paged_v7), printed by chapter 10; this comment holds no
//   numbers.
//
// sm_90a only, as versions 5 and 6. Compiled at run time by NVRTC with -arch=sm_90a,
// -DHEAD_DIM=<d> (64 or 128), -DROW_TILES=<1 or 2> (and -DFLASHREF_BF16 for bfloat16), as
// version 6. The split kernel is written out whole below (version 6's, with the change above:
// `kernel_diff` shows it); split_kv.cuh brings version 2's tiling and merge_warps_v2,
// split_merge.cuh version 3's combine kernel (decode_combine_v3).

#include "split_kv.cuh"        // D, MT, ROWS, NWARPS, NTHREADS, Bc, LDS, LDR, CHUNKS, RSTEP, merge_warps_v2
#include "split_merge.cuh"     // combine_row_v3, decode_combine_v3, merge_if_last_split
#include "hopper_common.cuh"      // mbarrier, tma_load_2d, fence_proxy_async, TensorMap
#include "paged_kv.cuh"         // pool_row: a key's row of the paged pools

#if HEAD_DIM == 128 && ROW_TILES == 2
#define STAGES 6                  // (K, V) tiles of 64 keys in the ring
#define BLOCKS 1                  // blocks per SM: 2 would cap registers at 168 (spills)
#elif HEAD_DIM == 128
#define STAGES 3
#define BLOCKS 2
#else
#define STAGES 6
#define BLOCKS 2
#endif
#define NTHREADS5 (NTHREADS + 32)  // 4 consumer warps and the producer warp
#define BOX 64                     // columns per TMA box: one 128-byte swizzled row

constexpr int NBOX = D / BOX;                 // boxes per tile of K (or of V)
constexpr int BOX_BYTES = Bc * BOX * 2;       // 8 KiB: 64 rows of 128 bytes
constexpr int KV_BYTES = NBOX * BOX_BYTES;    // one tile of K (or V)
constexpr int STAGE5_BYTES = 2 * KV_BYTES;    // K tile, then V tile
constexpr int Q_BYTES = ROWS * LDS * 2;       // Q (ROWS, LDS) halves, padded as version 2
static_assert(NWARPS * ROWS * (LDR + 2) * 4 <= STAGES * STAGE5_BYTES, "merge buffer fits the ring");

// byte offset, in a tile of K or V, of the 16-byte chunk of row r that holds column c (c % 8 == 0)
__device__ __forceinline__ u32 tile_chunk(int r, int c)
{
    return (c / BOX) * BOX_BYTES + r * 128 + ((((c % BOX) >> 3) ^ (r & 7)) << 4);
}

extern "C" __global__ void __launch_bounds__(NTHREADS5, BLOCKS)
decode_split_kv_v7(const half_t* __restrict__ Q,   // (B, Hq, Nq, D)
                   const half_t* __restrict__ K,   // (num_pages, Hkv, page_size, D): via kmap
                   const half_t* __restrict__ V,   // (num_pages, Hkv, page_size, D): via vmap
                   const int* __restrict__ block_table,  // (B, max_pages), or null: contiguous
                   const int* __restrict__ lengths,      // (B,), or null: every L = page_size
                   half_t* __restrict__ O,         // (B, Hq, Nq, D)
                   float* __restrict__ lse,        // (B, Hq, Nq)
                   float* __restrict__ O_part,     // (B, Hq, Nq, S, D), written when S > 1
                   float* __restrict__ lse_part,   // (B, Hq, Nq, S), written when S > 1
                   int Hq, int Hkv, int Nq, int page_size, int max_pages, float scale, int causal,
                   const __grid_constant__ TensorMap kmap,  // K as (num_pages Hkv page_size, D)
                   const __grid_constant__ TensorMap vmap)  // V, the same
{
    extern __shared__ uint4 smem5_[];  // (smem_ is version 2's)
    const u32 ring = (smem_u32(smem5_) + 1023) & ~1023u;  // STAGES x (K, V) tiles, swizzled
    const u32 Qs = ring + STAGES * STAGE5_BYTES;         // (ROWS, LDS) halves
    const u32 full = Qs + Q_BYTES;                       // STAGES mbarriers: tile landed
    const u32 empty = full + STAGES * 8;                 // STAGES mbarriers: stage free

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
    const int n_tiles = t1 - t0;
    const size_t qrow0 = ((size_t)b * Hq + (size_t)hkv * G) * Nq;  // global row of packed row 0
    const float sl2 = scale * 1.4426950408889634f;  // exp(scale x) = 2^(sl2 x)

    // version 7: the producer's lane makes the barriers and asks for the
    // first STAGES tiles at once, so their DRAM latency overlaps the consumers' Q load. Its
    // request of tile it of the split into stage it % STAGES is the loop body of versions 5 and
    // 6's producer below, as a function here; theirs is left as it is, so that versions 5 and 6
    // build to the code their recorded runs measured.
    const int* bt = block_table ? block_table + (size_t)b * max_pages : nullptr;
    auto issue = [&](int it) {
        const int s = it % STAGES;
        if (it >= STAGES) mbar_wait(empty + 8 * s, (it / STAGES - 1) & 1);  // fill it/STAGES - 1 consumed
        const int c0 = (t0 + it) * Bc;  // the tile's first key, < L
        int page = b, slot = c0;        // contiguous cache: page b of page_size = Nk slots
        if (bt) page = bt[c0 / page_size], slot = c0 % page_size;
        const int row = pool_row(page, slot, hkv, Hkv, page_size);  // rows < 2^31 (host check)
        const u32 Ks = ring + s * STAGE5_BYTES, Vs = Ks + KV_BYTES;
        mbar_arrive_expect_tx(full + 8 * s, STAGE5_BYTES);
#pragma unroll
        for (int x = 0; x < NBOX; x++) {
            tma_load_2d(Ks + x * BOX_BYTES, &kmap, x * BOX, row, full + 8 * s);
            tma_load_2d(Vs + x * BOX_BYTES, &vmap, x * BOX, row, full + 8 * s);
        }
    };
    const int early = n_tiles < STAGES ? n_tiles : STAGES;
    if (warp == NWARPS && lane == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(full + 8 * s, 1), mbar_init(empty + 8 * s, NWARPS);
        mbar_fence_init();
        for (int it = 0; it < early; it++) issue(it);
    }
    if (warp < NWARPS) {  // Q rows [row0, row0 + ROWS) of the slab, zeros past M (as version 2)
        const half_t* Qb = Q + qrow0 * D;  // (M, D): the G heads' queries, one contiguous slab
        const int r = threadIdx.x / CHUNKS, c = threadIdx.x % CHUNKS;
#pragma unroll
        for (int k = 0; k < ROWS / RSTEP; k++) {
            const int R = row0 + r + k * RSTEP;
            const bool ok = R < M;
            cp_async16(Qs + ((r + k * RSTEP) * LDS + c * 8) * 2, ok ? Qb + (size_t)R * D + c * 8 : Q, ok);
        }
        cp_async_commit();
        cp_async_wait<0>();
    }
    __syncthreads();  // Q and the barriers are ready: the only barrier before the merge

    float o[MT][D / 8][4];  // this warp's partial O for all ROWS rows: MT x D/8 tiles of 16 x 8
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int n = 0; n < D / 8; n++) o[mi][n][0] = o[mi][n][1] = o[mi][n][2] = o[mi][n][3] = 0.f;
    float m[MT][2], l[MT][2];  // rows g and g+8 of each row group; m in raw-score units
#pragma unroll
    for (int mi = 0; mi < MT; mi++) m[mi][0] = m[mi][1] = NEG_INF, l[mi][0] = l[mi][1] = 0.f;

    if (warp == NWARPS) {  // the producer: one lane asks for every tile of the split
        if (lane == 0)
            for (int it = early; it < n_tiles; it++) issue(it);  // tiles 0 .. early - 1: asked for
    } else {  // a consumer: keys 16 warp .. 16 warp + 15 of every tile
        // each lane's ldmatrix row (as version 2's k_lane, v_lane) and the XOR of its chunk
        const int kr = 16 * warp + (lane % 8) + (lane / 16) * 8, kc = ((lane / 8) % 2) * 8;
        const int vr = 16 * warp + (lane % 8) + ((lane / 8) % 2) * 8, vc = (lane / 16) * 8;
        const u32 a_lane = ((lane % 16) * LDS + (lane / 16) * 8) * 2;  // Q, A operand
        for (int it = 0; it < n_tiles; it++) {
            const int s = it % STAGES;
            const u32 Ks = ring + s * STAGE5_BYTES, Vs = Ks + KV_BYTES;
            const int c0 = (t0 + it) * Bc + 16 * warp;  // this warp's first key
            mbar_wait(full + 8 * s, (it / STAGES) & 1);  // the tile has landed
            if (c0 < L) {
                if (c0 + 16 > L) {  // V rows of keys >= L: zeros (they may hold NaN)
                    for (int e = lane; e < (c0 + 16 - L) * (D / 8); e += 32) {
                        const int r = 16 * warp + (L - c0) + e / (D / 8), c = (e % (D / 8)) * 8;
                        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};"
                                     :: "r"(Vs + tile_chunk(r, c)), "r"(0u) : "memory");
                    }
                    fence_proxy_async();  // before the producer's next TMA write of this stage
                    __syncwarp();
                }
                // S = Q K^T for all ROWS rows and this warp's 16 keys (as version 2)
                float sc[MT][2][4];
#pragma unroll
                for (int mi = 0; mi < MT; mi++)
#pragma unroll
                    for (int j = 0; j < 2; j++) sc[mi][j][0] = sc[mi][j][1] = sc[mi][j][2] = sc[mi][j][3] = 0.f;
#pragma unroll
                for (int k0 = 0; k0 < D; k0 += 16) {
                    u32 b0, b1, b2, b3;  // b0, b1 for keys 0-7; b2, b3 for keys 8-15
                    ldsm_x4(Ks + tile_chunk(kr, k0 + kc), b0, b1, b2, b3);
#pragma unroll
                    for (int mi = 0; mi < MT; mi++) {
                        u32 a0, a1, a2, a3;
                        ldsm_x4(Qs + a_lane + (mi * 16 * LDS + k0) * 2, a0, a1, a2, a3);
                        mma16816(sc[mi][0], a0, a1, a2, a3, b0, b1);
                        mma16816(sc[mi][1], a0, a1, a2, a3, b2, b3);
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
                                if (p >= L || (causal && p > i + last)) sc[mi][j][e] = NEG_INF;
                            }
                }
                // online softmax on the fragments: h = 0 is row g, h = 1 is row g+8 (as version 2)
#pragma unroll
                for (int mi = 0; mi < MT; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float x = fmaxf(fmaxf(sc[mi][0][2 * h], sc[mi][0][2 * h + 1]),
                                        fmaxf(sc[mi][1][2 * h], sc[mi][1][2 * h + 1]));
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
                                sc[mi][j][e] = ex2(fmaf(sc[mi][j][e], sl2, -m_sl2));  // P <= 1, fp32
                                sum += sc[mi][j][e];
                            }
                        l[mi][h] = l[mi][h] * alpha + sum;
                    }
                // O += P V for this warp's 16 keys: the accumulators are the A operand (16 x 16)
#pragma unroll
                for (int mi = 0; mi < MT; mi++) {
                    const u32 a0 = pack_half2(sc[mi][0][0], sc[mi][0][1]);
                    const u32 a1 = pack_half2(sc[mi][0][2], sc[mi][0][3]);
                    const u32 a2 = pack_half2(sc[mi][1][0], sc[mi][1][1]);
                    const u32 a3 = pack_half2(sc[mi][1][2], sc[mi][1][3]);
#pragma unroll
                    for (int n = 0; n < D / 8; n += 2) {
                        u32 b0, b1, b2, b3;  // b0, b1 for d tile n; b2, b3 for d tile n+1
                        ldsm_x4_trans(Vs + tile_chunk(vr, n * 8 + vc), b0, b1, b2, b3);
                        mma16816(o[mi][n], a0, a1, a2, a3, b0, b1);
                        mma16816(o[mi][n + 1], a0, a1, a2, a3, b2, b3);
                    }
                }
            }
            __syncwarp();  // every lane's reads of the stage are done ...
            if (lane == 0) mbar_arrive(empty + 8 * s);  // ... the warp hands it back
        }
    }
    __syncthreads();  // every tile has landed and been used: the ring's space holds the merge

    merge_warps_v2((float*)((char*)smem5_ + (ring - smem_u32(smem5_))), o, m, l, warp, NTHREADS5,
                   row0, M, qrow0, split, S, sl2, scale, O, lse, O_part, lse_part);
}
