// decode version 3: version 2's split kernel, unchanged, and a combine kernel written for
// latency. Same grid, same split rule, same partial layout; what changes is the merge.
//
//   version 2's combine: one warp per row (b, h, i); each lane owns two columns and walks
//   the S splits one after another, loading lse_s and the split's two floats of O at each
//   step (unrolled by 4). The H200 profile of version 2 at B = 1, Hkv = 8, Nk = 32k (32
//   splits) put the combine at about 40% of the call: few warps, each waiting on a chain
//   of loads (long_scoreboard the top stall).
//   version 3's combine: still one warp per row and 4 rows per block, but
//     - lse: lane j loads lse_j, lse_{j+32}, ... (every split at once, independent loads),
//       converted to base 2 (log2e folded in); the warp's max and sum by shuffles;
//     - O: lanes across d with 16-byte loads (4 floats each: D / 4 lanes per split, so a
//       warp covers one split of d = 128 or two of d = 64), and CH = 16 splits' loads issued
//       into registers before any of them is used: at S <= 16 one round trip, at S = 32 two;
//     - each split's weight 2^(lse2_s - lse2) taken from the lane that holds it by a shuffle.
//   The partial layout O_part (rows, S, D) is already what this reads coalesced: a row's S
//   splits are S * D consecutive floats, so the split kernel is not touched.
//
//   Not done here: merging in the last split block to finish (a counter per row block),
//   which would save the second launch at few splits.
//
//   Speed: not measured yet; python -m flashref.bench decode and profile --decode list it
//   beside versions 1 and 2 (rows flashref_v3, flashref_paged_v3; case decode_v3).
//
// Compiled at run time by NVRTC with -DHEAD_DIM=<d> (64 or 128), -DROW_TILES=<1 or 2> (and
// -DFLASHREF_BF16 for bfloat16), as version 2, whose text is pasted in below.

#include "v02_warp_rings.cu"  // the split kernel decode_split_kv_v2 (and version 2's combine)

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
