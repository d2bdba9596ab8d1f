// decode: split-KV attention (Flash-Decoding) for a few queries against a long K/V cache,
// with grouped K/V heads and an optional block table (the paged cache). Not a numbered
// version: it is flashref.split_kv_attention and flashref.paged_attention on the GPU, and it
// is launched by flashref.gpu.decode (decode_attention, paged_decode_attention).
//
// Why a kernel of its own. With Nq <= 16 new queries per sequence the forward kernels give a
// block 128 query rows of which at most 16 exist, one block per (sequence, head): a batch of
// one keeps 32 of the H200's 132 SMs busy, each streaming a whole K/V head. Decoding is
// memory-bound (every key and value is used by G * Nq rows only), so the design goal is to
// read K and V once, at the HBM read bandwidth:
//
//   grid (num_splits, Hkv * row_blocks, B): block (s, hkv, b) computes the partial result of
//   split s of sequence b's keys for all G * Nq query rows of K/V head hkv. The G query heads
//   of one K/V head are adjacent in q (B, Hq, Nq, D), so those rows form one contiguous
//   (G * Nq, D) slab: packed into the M dimension of mma.sync m16n8k16 (ROWS = 16 * ROW_TILES
//   rows per block), they all share every K and V fragment, and K/V are read once per K/V head
//   (once per row block when G * Nq > ROWS).
//
//   keys: sequence b has L = lengths[b] keys, T = ceil(L / Bc) tiles of Bc = 64; split s takes
//   tiles [s T / S, (s + 1) T / S). Inside a block the 4 warps share each tile, warp w taking
//   keys 16 w .. 16 w + 15: every warp keeps its own online-softmax state (m, l, O) for all
//   ROWS rows, and the four states are merged through shared memory at the end (the merge of
//   chapter 2, inside a block). Tiles arrive by cp.async (16-byte copies) STAGES = 3 deep: two
//   tiles are in flight while one is computed, and two blocks fit on an SM.
//
//   pages: key position p of sequence b lives in page block_table[b][p / page_size], slot
//   p % page_size of the pool K (num_pages, Hkv, page_size, D). Without a block table the
//   pool is the contiguous cache (B, Hkv, Nk, D) read as B pages of Nk slots, page b for
//   sequence b: one code path for both, the table looked up per copied row.
//
//   output: with one split the block writes O (16-bit) and lse itself; with more it writes
//   its normalised partial O_s (fp32) and lse_s, and decode_combine (below) merges them by
//   lse: lse = log sum_s exp(lse_s), O = sum_s exp(lse_s - lse) O_s. A split or a row that
//   sees no key has lse_s = -inf and weight 0; a row that sees none at all gets zeros and
//   lse = -inf.
//
// causal is bottom-right, as flashref.paged_attention: query i of a sequence of length L sees
// keys j <= i + L - Nq. The caller guarantees scale > 0 (a negative scale is folded into Q).
//
// Measured: results/gpu_decode.json (python -m flashref.bench decode); this comment holds no
// numbers, so it cannot disagree with them.
//
// Compiled at run time by NVRTC with -DHEAD_DIM=<d> (64 or 128), -DROW_TILES=<1 or 2> (and
// -DFLASHREF_BF16 for bfloat16); the PTX wrappers are in mma_common.cuh.

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef ROW_TILES
#define ROW_TILES 1
#endif
#define D HEAD_DIM
#define MT ROW_TILES             // 16-row groups per block (every warp holds all of them)
#define ROWS (16 * MT)           // packed query rows (head, query) per block
#define NWARPS 4
#define NTHREADS (NWARPS * 32)
#define Bc (16 * NWARPS)         // 64 keys per tile, 16 per warp
#define STAGES 3                 // K/V tiles in shared memory: 2 in flight, 1 computed
#define LDS (D + 8)              // shared-memory row stride in halves: +16 bytes per row
#define LDR (D + 4)              // row stride (floats) of the cross-warp merge buffer

#include "mma_common.cuh"  // typedefs, NEG_INF and the PTX wrappers: ldmatrix, mma, cp.async

constexpr int CHUNKS = D / 8;             // 16-byte pieces per row
constexpr int RSTEP = NTHREADS / CHUNKS;  // rows covered by one pass of the block's threads
constexpr int TILE_BYTES = Bc * LDS * 2;  // one (Bc, LDS) tile of K or V
constexpr int STAGE_BYTES = 2 * TILE_BYTES;  // a K tile, then its V tile
static_assert(ROWS % RSTEP == 0 && Bc % RSTEP == 0, "copy passes must tile the rows");
static_assert((NWARPS * ROWS * (LDR + 2)) * 4 <= STAGES * STAGE_BYTES, "merge buffer fits");

// start copying keys [c0, c0 + Bc) of sequence b, K/V head hkv, into the stage at s (K tile,
// then V tile); zeros past L. Thread tid copies piece tid % CHUNKS of rows tid / CHUNKS + k RSTEP.
__device__ __forceinline__ void load_kv_tile(u32 s, const half_t* K, const half_t* V,
                                             const int* bt, int b, int hkv, int Hkv, int ps,
                                             int c0, int L)
{
    const int r = threadIdx.x / CHUNKS, c = threadIdx.x % CHUNKS;
#pragma unroll
    for (int k = 0; k < Bc / RSTEP; k++) {
        const int p = c0 + r + k * RSTEP;  // the key's position in its sequence
        const bool ok = p < L;
        size_t off = 0;
        if (ok) {
            int page = b, slot = p;  // contiguous cache: page b, ps = Nk (no division)
            if (bt) {
                const int pi = p / ps;  // which of the sequence's pages
                page = bt[pi], slot = p - pi * ps;
            }
            off = (((size_t)page * Hkv + hkv) * ps + slot) * D + c * 8;
        }
        const u32 dst = s + ((r + k * RSTEP) * LDS + c * 8) * 2;
        cp_async16(dst, K + off, ok);
        cp_async16(dst + TILE_BYTES, V + off, ok);
    }
}

extern "C" __global__ void __launch_bounds__(NTHREADS, 2)
decode_split_kv(const half_t* __restrict__ Q,   // (B, Hq, Nq, D)
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
    const u32 KV = Qs + ROWS * LDS * 2;  // STAGES x (K tile, V tile), each (Bc, LDS)

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
    const int* bt = block_table ? block_table + (size_t)b * max_pages : nullptr;
    const size_t qrow0 = ((size_t)b * Hq + (size_t)hkv * G) * Nq;  // global row of packed row 0
    const half_t* Qb = Q + qrow0 * D;  // (M, D): the G heads' queries, one contiguous slab

    {  // Q rows [row0, row0 + ROWS) of the slab, zeros past M: joins the first copy group
        const int r = threadIdx.x / CHUNKS, c = threadIdx.x % CHUNKS;
#pragma unroll
        for (int k = 0; k < ROWS / RSTEP; k++) {
            const int R = row0 + r + k * RSTEP;
            const bool ok = R < M;
            cp_async16(Qs + ((r + k * RSTEP) * LDS + c * 8) * 2, ok ? Qb + (size_t)R * D + c * 8 : Q, ok);
        }
    }
#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {  // the first STAGES - 1 tiles: one group each
        if (st < n_tiles) load_kv_tile(KV + st * STAGE_BYTES, K, V, bt, b, hkv, Hkv, page_size, (t0 + st) * Bc, L);
        cp_async_commit();
    }

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
    const u32 k_lane = ((warp * 16 + (lane % 8) + (lane / 16) * 8) * LDS + ((lane / 8) % 2) * 8) * 2;
    const u32 v_lane = ((warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LDS + (lane / 16) * 8) * 2;
    const float sl2 = scale * 1.4426950408889634f;  // exp(scale x) = 2^(sl2 x)

    for (int it = 0; it < n_tiles; it++) {
        cp_async_wait<STAGES - 2>();  // tile it has landed (this thread's copies) ...
        __syncthreads();              // ... everyone's; and everyone is done with tile it - 1
        {
            const int nx = it + STAGES - 1;  // refill the buffer of tile it - 1
            if (nx < n_tiles)
                load_kv_tile(KV + (nx % STAGES) * STAGE_BYTES, K, V, bt, b, hkv, Hkv, page_size, (t0 + nx) * Bc, L);
            cp_async_commit();  // (an empty group near the end keeps the count uniform)
        }
        const u32 Ks = KV + (it % STAGES) * STAGE_BYTES + k_lane;
        const u32 Vs = KV + (it % STAGES) * STAGE_BYTES + TILE_BYTES + v_lane;
        const int c0 = (t0 + it) * Bc + warp * 16;  // this warp's first key

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
    __syncthreads();  // every warp is done with the tiles: their space holds the merge

    // merge the 4 warps' states (m_w, l_w, O_w) of every row, then write O and lse
    float* Ored = (float*)((char*)smem_ + ROWS * LDS * 2);  // (NWARPS, ROWS, LDR)
    float* mred = Ored + NWARPS * ROWS * LDR;               // (NWARPS, ROWS)
    float* lred = mred + NWARPS * ROWS;                     // (NWARPS, ROWS)
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float lr = l[mi][h];
            lr += __shfl_xor_sync(0xffffffffu, lr, 1);
            lr += __shfl_xor_sync(0xffffffffu, lr, 2);
            const int row = mi * 16 + g + h * 8;
            if (t == 0) mred[warp * ROWS + row] = m[mi][h], lred[warp * ROWS + row] = lr;
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                *(float2*)&Ored[(warp * ROWS + row) * LDR + n * 8 + 2 * t] =
                    make_float2(o[mi][n][2 * h], o[mi][n][2 * h + 1]);
        }
    __syncthreads();
    for (int e = threadIdx.x; e < ROWS * D / 2; e += NTHREADS) {  // two columns per step
        const int row = e / (D / 2), col = (e % (D / 2)) * 2;
        const int R = row0 + row;
        if (R >= M) break;  // rows only grow with e
        float m_all = NEG_INF;
#pragma unroll
        for (int w = 0; w < NWARPS; w++) m_all = fmaxf(m_all, mred[w * ROWS + row]);
        float ox = 0.f, oy = 0.f, l_all = 0.f;
#pragma unroll
        for (int w = 0; w < NWARPS; w++) {
            const float mw = mred[w * ROWS + row];
            const float wt = (mw == NEG_INF) ? 0.f : ex2((mw - m_all) * sl2);  // a warp that saw nothing: 0
            const float2 ow = *(const float2*)&Ored[(w * ROWS + row) * LDR + col];
            l_all += wt * lred[w * ROWS + row];
            ox += wt * ow.x;
            oy += wt * ow.y;
        }
        const float inv = (l_all > 0.f) ? 1.f / l_all : 0.f;  // a row that saw no key: zeros
        const float lse_r = (l_all > 0.f) ? m_all * scale + logf(l_all) : NEG_INF;
        const size_t grow = qrow0 + R;  // (b, h, i) as one index
        if (S == 1) {
            ((u32*)O)[(grow * D + col) / 2] = pack_half2(ox * inv, oy * inv);
            if (col == 0) lse[grow] = lse_r;
        } else {
            *(float2*)&O_part[(grow * S + split) * D + col] = make_float2(ox * inv, oy * inv);
            if (col == 0) lse_part[grow * S + split] = lse_r;
        }
    }
}

// The combine step: one warp per query row (b, h, i) merges its S partial results by lse.
extern "C" __global__ void __launch_bounds__(128)
decode_combine(const float* __restrict__ O_part,    // (rows, S, D)
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
