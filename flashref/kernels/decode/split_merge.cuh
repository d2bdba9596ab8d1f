// The merge of a query row's split partials, versions 3 to 7: combine_row_v3 (one warp merges
// one row's S partials (O_s, lse_s) by their lse, every split's loads in flight together),
// the combine kernel decode_combine_v3 built on it (the second launch of versions 3, 6 and
// 7), and merge_if_last_split, the one-launch ending of versions 4 and 5 (the last of a row
// block's S split blocks to finish merges the row block's partials with combine_row_v3).
// Version 3 (v03_register_merge.cu) wrote the merge and its kernel, version 4
// (v04_last_block_merge.cu) the last-block ending; their comments say why each is as it is.
// Neither has changed since. Included by version 3's file (and so by version 4, which pastes
// it in) and by versions 5 to 7, after split_kv.cuh (D, NWARPS, ROWS, mma_common.cuh).

#pragma once

#define MAX_S 128                 // flashref.gpu.decode.MAX_SPLITS: lse registers per lane
constexpr int LPS = D / 4;        // lanes per split: one float4 of O each
constexpr int SPW = 32 / LPS;     // splits one warp loads in a step (1 at d = 128, 2 at d = 64)
constexpr int CH = 16;            // splits whose loads are in flight together
constexpr int U = CH / SPW;       // float4 loads per lane per round
static_assert(32 % LPS == 0 && CH % SPW == 0 && 32 % CH == 0 && MAX_S % 32 == 0, "lane map");

// CG: load the partials through L2 only (ld.global.cg), for a caller that reads partials
// written by other blocks of its own launch (version 4); the combine kernel loads them plainly.
template <bool CG>
__device__ __forceinline__ float ld_part(const float* p) { return CG ? __ldcg(p) : *p; }
template <bool CG>
__device__ __forceinline__ float4 ld_part4(const float* p)
{
    return CG ? __ldcg((const float4*)p) : *(const float4*)p;
}

// One query row (b, h, i), merged by one whole warp: O = sum_s 2^(lse2_s - lse2) O_s, with
// lse2 = log2 sum_s 2^(lse2_s) and lse2_s = lse_s log2(e); lse = lse2 ln(2).
template <bool CG>
__device__ __forceinline__ void
combine_row_v3(const float* __restrict__ O_part,    // (rows, S, D)
               const float* __restrict__ lse_part,  // (rows, S)
               half_t* __restrict__ O,              // (rows, D)
               float* __restrict__ lse,             // (rows,)
               int row, int S, int lane)
{
    const float* ls = lse_part + (size_t)row * S;

    float x2[MAX_S / 32];  // lse2 of splits lane, lane + 32, ...: all loads issued at once
#pragma unroll
    for (int k = 0; k < MAX_S / 32; k++) {
        const int s = lane + 32 * k;
        x2[k] = s < S ? ld_part<CG>(ls + s) * 1.4426950408889634f : NEG_INF;
    }
    float mx = NEG_INF;
#pragma unroll
    for (int k = 0; k < MAX_S / 32; k++) mx = fmaxf(mx, x2[k]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.f;
    if (mx != NEG_INF)
#pragma unroll
        for (int k = 0; k < MAX_S / 32; k++) sum += ex2(x2[k] - mx);  // 2^-inf = 0
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const float total2 = (mx == NEG_INF) ? NEG_INF : mx + log2f(sum);
    float w[MAX_S / 32];  // the weights of this lane's splits; 0 for an empty split or row
#pragma unroll
    for (int k = 0; k < MAX_S / 32; k++) w[k] = (total2 == NEG_INF) ? 0.f : ex2(x2[k] - total2);

    const int sub = lane / LPS, col = (lane % LPS) * 4;  // this lane's split offset and columns
    const float* Op = O_part + (size_t)row * S * D + col;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int k = 0; k < MAX_S / 32; k++) {
        if (32 * k >= S) break;  // uniform across the warp
#pragma unroll
        for (int c = 0; c < 32; c += CH) {
            if (32 * k + c >= S) break;
            float4 buf[U];  // U independent 16-byte loads before the first use, no branches:
#pragma unroll      // past the last split the index is clamped and its weight is 0
            for (int j = 0; j < U; j++) {
                const int s = min(32 * k + c + j * SPW + sub, S - 1);
                buf[j] = ld_part4<CG>(Op + s * D);  // s D < MAX_S D: 32-bit offsets
            }
#pragma unroll
            for (int j = 0; j < U; j++) {
                const float ws = __shfl_sync(0xffffffffu, w[k], c + j * SPW + sub);  // lane s % 32
                acc.x = fmaf(ws, buf[j].x, acc.x);
                acc.y = fmaf(ws, buf[j].y, acc.y);
                acc.z = fmaf(ws, buf[j].z, acc.z);
                acc.w = fmaf(ws, buf[j].w, acc.w);
            }
        }
    }
#pragma unroll
    for (int off = LPS; off < 32; off *= 2) {  // d = 64: the two half-warps' splits summed
        acc.x += __shfl_xor_sync(0xffffffffu, acc.x, off);
        acc.y += __shfl_xor_sync(0xffffffffu, acc.y, off);
        acc.z += __shfl_xor_sync(0xffffffffu, acc.z, off);
        acc.w += __shfl_xor_sync(0xffffffffu, acc.w, off);
    }
    if (sub == 0)
        *(uint2*)&O[(size_t)row * D + col] = make_uint2(pack_half2(acc.x, acc.y), pack_half2(acc.z, acc.w));
    if (lane == 0) lse[row] = total2 * 0.6931471805599453f;
}

// One warp per query row, 4 rows per block.
// __launch_bounds__(128, 4): without a minimum of blocks, ptxas aims at 32 registers per
// thread and keeps only about 4 of the U loads in flight (seen in the SASS, nvdisasm);
// with it, all U loads are issued before the first FMA (88 registers at d = 128).
extern "C" __global__ void __launch_bounds__(128, 4)
decode_combine_v3(const float* __restrict__ O_part,    // (rows, S, D)
                  const float* __restrict__ lse_part,  // (rows, S)
                  half_t* __restrict__ O,              // (rows, D)
                  float* __restrict__ lse,             // (rows,)
                  int rows, int S)
{
    const int row = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;  // the whole warp
    combine_row_v3<false>(O_part, lse_part, O, lse, row, S, lane);
}

// The ending of versions 4 and 5: after the split kernel's body, every thread of the block
// calls this. One split: nothing to do. Otherwise the block is counted in on its row block's
// counter, and the last of the S split blocks merges the row block's partials (its first
// NWARPS warps take the rows in turn) and sets the counter back to 0.
__device__ __forceinline__ void
merge_if_last_split(const float* __restrict__ O_part, const float* __restrict__ lse_part,
                    half_t* __restrict__ O, float* __restrict__ lse, int Hq, int Hkv, int Nq,
                    unsigned* __restrict__ counters)
{
    const int S = gridDim.x;
    if (S == 1) return;  // O and lse are written: nothing to merge

    __threadfence();  // this thread's partials are visible to every block ...
    __syncthreads();  // ... and every thread's, before the block is counted in
    unsigned seen = 0;
    if (threadIdx.x == 0) {
        unsigned* c = counters + (size_t)blockIdx.z * gridDim.y + blockIdx.y;
        seen = atomicAdd(c, 1u);          // splits of this row block counted before this one
        if (seen == S - 1) atomicExch(c, 0u);  // all S are in: ready for the next call
    }
    if (!__syncthreads_or(threadIdx.x == 0 && seen == S - 1)) return;  // not the last block
    __threadfence();  // the other blocks' partials are read after their count was seen

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int hkv = blockIdx.y % Hkv, row0 = (blockIdx.y / Hkv) * ROWS;  // as the body
    const int G = Hq / Hkv, M = G * Nq;
    const size_t qrow0 = ((size_t)blockIdx.z * Hq + (size_t)hkv * G) * Nq;
    if (warp < NWARPS)  // version 5's producer warp holds no rows
        for (int R = row0 + warp; R < min(row0 + ROWS, M); R += NWARPS)  // uniform in the warp
            combine_row_v3<true>(O_part, lse_part, O, lse, (int)(qrow0 + R), S, lane);
}
