// The dK/dV loop of backward versions 8 to 19 (FlashAttention-3's backward; Triton names the
// same loop _attn_bwd_dkdv): the pieces every one of them runs word for word and that leave the
// PTX as it is when they move here, so that each version's file holds less of what it does not
// change. Version 8 (bwd08_wgmma.cu, whose comment explains the layouts, the ring and the
// masks) wrote them; they have not changed since.
//   pack_a       a (64 x Br) accumulator as A fragments (P^T, dS^T for the dV, dK products)
//   load_tiles   the producer's thread 0: K_j and V_j once, Q_i and dO_i into the ring
//   load_lse_d   the producer's warp 1: lse_i * log2e and D_i into shared memory
//   store_dkdv   a consumer's end: dK_j = scale * sum dS^T Q_i, dV_j = sum P^T dO_i
// Each of versions 8 to 19 includes this file after its tile constants (D, Br, STAGES, NBOX,
// Q_BYTES, KV_BYTES, BOX_Q, BOX_KV, LOG2E) and its shared lse_s_ and D_s_, and calls all four.
// What stays in each version: the block's layout and barriers, the loop over query tiles, the
// five products and where dQ goes, and the tile's P^T and dS^T from S^T and dP^T, 38 lines
// that versions 8, 9 and 11 to 19 also share word for word: moved into a function here, they
// change the PTX of versions 16 to 19 (the dQ staging address's terms reach ptxas in another
// order), and moved for versions 8 to 15 alone they would show in the diffs between those and
// 16 to 19 as a change that is not one. A text move leaves the PTX as it was (python -m
// flashref.bench.ptx_snapshot): for that, store_dkdv takes the thread's first key,
// kw0 + 16 warp + g, from its caller.
//
// Compiled with the version (-arch=sm_90a, -DHEAD_DIM=<d>, -DFLASHREF_BF16 for bfloat16).

#pragma once

// A fragments of a (64 x Br) accumulator, 16 queries per kk (a_from_c); the empty asm keeps
// the packing above the wgmma_fence that follows it
__device__ __forceinline__ void pack_a(u32 (&a)[Br / 16][4], const float (&c)[Br / 2])
{
#pragma unroll
    for (int kk = 0; kk < Br / 16; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            a[kk][r] = pack_half2(c[8 * kk + 2 * r], c[8 * kk + 2 * r + 1]);
            asm volatile("" : "+r"(a[kk][r]) :: "memory");
        }
}

// The producer's thread 0: K_j and V_j once (counted on kvbar), then Q_i and dO_i of each of
// the block's n_tiles query tiles into stage it % STAGES of the ring, once its consumers have
// emptied it (the stages' full and empty barriers from full0 and empty0, 8 bytes apart)
__device__ __forceinline__ void load_tiles(u32 Ks, u32 Vs, u32 Qs_buf, u32 dOs_buf, u32 kvbar,
                                           u32 full0, u32 empty0, const TensorMap* qmap,
                                           const TensorMap* kmap, const TensorMap* vmap,
                                           const TensorMap* domap, int bh, int Nq, int Nk,
                                           int c0, int i_start, int n_tiles)
{
    mbar_arrive_expect_tx(kvbar, 2 * KV_BYTES);
#pragma unroll
    for (int b = 0; b < NBOX; b++) {
        tma_load_2d(Ks + b * BOX_KV, kmap, 64 * b, bh * Nk + c0, kvbar);
        tma_load_2d(Vs + b * BOX_KV, vmap, 64 * b, bh * Nk + c0, kvbar);
    }
    for (int it = 0; it < n_tiles; it++) {
        const int st = it % STAGES, use = it / STAGES;  // use-th filling of stage st
        if (use >= 1) mbar_wait(empty0 + 8 * st, (use - 1) & 1);
        const u32 full = full0 + 8 * st;
        const int row = bh * Nq + (i_start + it) * Br;
        mbar_arrive_expect_tx(full, 2 * Q_BYTES);
#pragma unroll
        for (int b = 0; b < NBOX; b++) {
            tma_load_2d(Qs_buf + st * Q_BYTES + b * BOX_Q, qmap, 64 * b, row, full);
            tma_load_2d(dOs_buf + st * Q_BYTES + b * BOX_Q, domap, 64 * b, row, full);
        }
    }
}

// The producer's warp 1: lse * log2e (+inf for a query past Nq or one that saw no key, so that
// P = 0, as version 1) and D of each query tile into its stage of lse_s_ and D_s_, counted on
// the stage's full barrier: plain loads, as a row of lse (Nq floats) fits no TMA box
__device__ __forceinline__ void load_lse_d(const float* lse, const float* Dvec, u32 full0,
                                           u32 empty0, int bh, int Nq, int i_start, int n_tiles,
                                           int lane)
{
    const float inf = __int_as_float(0x7f800000);
    for (int it = 0; it < n_tiles; it++) {
        const int st = it % STAGES, use = it / STAGES;
        if (use >= 1) mbar_wait(empty0 + 8 * st, (use - 1) & 1);
        const int q0 = (i_start + it) * Br;
#pragma unroll
        for (int r = lane; r < Br; r += 32) {
            const bool in = q0 + r < Nq;
            const float x = in ? lse[(size_t)bh * Nq + q0 + r] : inf;
            lse_s_[st][r] = x == NEG_INF ? inf : x * LOG2E;
            D_s_[st][r] = in ? Dvec[(size_t)bh * Nq + q0 + r] : 0.f;
        }
        mbar_arrive(full0 + 8 * st);  // release: the stores above come first
    }
}

// dK_j = scale * sum dS^T Q, dV_j = sum P^T dO from a consumer's accumulators dk, dv (wgmma
// layout): this thread's rows key0 and key0 + 8 (key0 = kw0 + 16 warp + g), those < Nk
__device__ __forceinline__ void store_dkdv(half_t* dK, half_t* dV, const float (&dk)[D / 2],
                                           const float (&dv)[D / 2], float scale, int bh, int Nk,
                                           int key0, int t)
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int key = key0 + 8 * h;
        if (key >= Nk) continue;
        u32* dKrow = (u32*)(dK + ((size_t)bh * Nk + key) * D);
        u32* dVrow = (u32*)(dV + ((size_t)bh * Nk + key) * D);
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            dKrow[n * 4 + t] = pack_half2(dk[4 * n + 2 * h] * scale, dk[4 * n + 2 * h + 1] * scale);
            dVrow[n * 4 + t] = pack_half2(dv[4 * n + 2 * h], dv[4 * n + 2 * h + 1]);
        }
    }
}
