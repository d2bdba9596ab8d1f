// The consumer-loop pieces of versions 29 and 30 (version 29's header says why each is as it
// is): the tile constants and descriptor steps, the ring's barriers, S = Q K^T and
// O += P V issued from descriptors stepped by constants, P's packing, the tree maximum, the
// ring's running stage and parity, and the online softmax of one tile. Included after the
// version's D, Br, Bc, KV_STAGES and TAU and after mma_common.cuh and hopper_common.cuh.

#pragma once

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
#if D == 64
        wgmma_rs_n64<1>(o, p[kk][0], p[kk][1], p[kk][2], p[kk][3], dv, 1);
#else
        wgmma_rs_n128<1>(o, p[kk][0], p[kk][1], p[kk][2], p[kk][3], dv, 1);
#endif
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
