// backward version 12: version 11 with dQ_i sent by a producer warp: the dQ consumer stages
// dQ_i in shared memory and goes on, and the copy engine adds it to dQacc (sm_90a only).
//
// What changes from version 11: there the dQ consumer adds dQ_i itself, 16 red.global.add.v4
// per thread per 64 columns after a shuffle between lane pairs, and its warps then meet at the
// next wgmma (version 11's stall sampling, results/gpu_stall_sampling_bwd11.json, puts a
// fifth of all samples at a barrier). FlashAttention-3's backward instead hands dQ to a warp
// that does nothing else. Here:
//   * the dQ consumer stores dq (64 queries x D floats) into one staging buffer in shared
//     memory, rows DQ_ROW = 4 D + 32 bytes apart (the 32 bytes put the eight rows a warp stores
//     at once in four 32-byte bank windows, version 9's padding), then fence.proxy.async and
//     bar.arrive on named barrier DQ_FULL: no atomics, no shuffles, no divergent branch;
//   * warp 2 of the producer warpgroup waits there (bar.sync, 128 + 32 threads), sends each
//     row below Nq with one cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 of 4 D
//     bytes (version 9's instruction, two rows per lane), waits until the copies have read the
//     buffer (cp.async.bulk.wait_group.read 0) and bar.arrives on DQ_EMPTY, where the next
//     tile's dQ consumer waits before its first store. The first tile's consumer does not wait;
//     the warp does not arrive after the last tile, so no barrier phase is left open;
//   * the consumers' register budget is version 11's; the sending warp fits the producer's 24.
// The additions into dQacc are version 11's: one per element per 128 keys (dq_adds_per_tile
// 1), made by L2 from whole rows. Shared memory: version 11's plus 64 x (4 D + 32) bytes.
//
// Version 11's design, unchanged otherwise:
// What changes from version 8: there each consumer adds its own 64 keys' share of dQ_i, so
// every element of dQ gets two red.global.add per key tile of 128 keys, and the profile of
// version 8 (results/gpu_backward_profile.json) counts 402.7 million L2 reduction sectors at
// d = 64, N = 4096: 12.9 GB, as much as 2.8 TB/s over the kernel. Here:
//   * consumer (it & 1) computes dQ_i = dS K_j for query tile it over the block's 128 keys:
//     8 wgmma k-steps, the first four reading consumer 0's dS^T buffer, the last four consumer
//     1's, B = all 128 rows of K_j's box; the other consumer computes only dV_w and dK_w on
//     that tile, so over two tiles both do the same work;
//   * the dQ consumer waits at a named barrier of 256 threads (bar.sync) until both consumers
//     have stored dS^T; the other only arrives (bar.arrive) and goes on. The barrier id
//     alternates with the tile (1 + (it & 1)), so a consumer running ahead cannot arrive twice
//     at one phase; the dS^T buffer a consumer writes at tile it + 2 was last read at tile it,
//     and the consumer that read it has synced at tile it + 1 on the writer's arrival, which
//     comes after the read;
//   * dQ gets one atomic per element per 128 keys (dq_adds_per_tile 1), half of version 8's;
//   * no consumer skips a causal tile any more (its keys after every query of the tile): it
//     computes the tile with P^T = 0 and stores dS^T = 0, because the dQ consumer reads that
//     buffer. One tile in about N / 128 per block, for one of the two consumers.
//
// Version 8's design, unchanged otherwise:
//
// What changes from version 7:
//   * the five products are wgmma instructions of one warpgroup (4 warps, 64 rows of the
//     result) instead of mma.sync of one warp (16 rows): a block is a producer warpgroup and
//     NWG = 2 consumer warpgroups, each owning 64 of the block's Bc = 128 keys (version 3's
//     tile, so each query tile copied serves 128 keys);
//   * the copies are the copy engine's (TMA, 128-byte swizzle, 64-column boxes): K_j and V_j
//     once, then Q_i and dO_i per query tile into a ring of STAGES = 2 stages guarded by
//     full/empty mbarriers (version 21's ring), issued by one producer thread while the
//     consumers compute; setmaxnreg moves the producer's registers to the consumers, whose dK
//     and dV accumulators (64 x D each) live in registers for the whole block;
//   * lse_i and D_i are plain loads by a second producer warp into shared memory, counted on
//     the same full barrier: a row of lse holds Nq floats, so for a ragged Nq neither a TMA
//     box (16-byte strides) nor a bulk copy (16-byte aligned source) can fetch it, and the
//     warp stores +inf for a query past Nq or one that saw no key (P = 0, as version 1);
//   * dS^T goes to shared memory in the 128-byte swizzle (two buffers per consumer, so the
//     next tile's store never meets this tile's dQ product still reading it), and dQ_i is a
//     wgmma with A = dS read through a transposed (MN-major) descriptor: no ldmatrix.trans.
//     Each consumer adds its own 64 keys' share of dQ_i with red.global.add.v4 (version 5's
//     exchange between lane pairs), so no barrier joins the two consumers: dQ gets one atomic
//     per element per 64 keys, version 7's count;
//   * registers: a consumer holds dK_w and dV_w (64 x D each) for the whole block, S^T and
//     dP^T (64 x Br each) per tile; dQ_i's product runs one 64-column box of K_w at a time
//     (twice at d = 128), so its accumulator is 64 x 64 beside them.
//
// Layouts of the products, per consumer warpgroup (keys kw0 .. kw0 + 63 of the block):
//   S^T  (64 keys x Br queries) = K_w Q_i^T    SS: A = K_w K-major (rows of K along d),
//                                               B = Q_i K-major: version 21's S = Q K^T
//   dP^T (64 x Br)              = V_w dO_i^T   SS: the same with V_w and dO_i
//   dV_w (64 x D) += P^T dO_i                  RS: P^T packed from S^T's accumulator (version
//                                               21's P), B = dO_i MN-major (as V there)
//   dK_w (64 x D) += dS^T Q_i                  RS: dS^T packed likewise, B = Q_i MN-major
//   dQ_i (Br x D) += dS K_w                    SS: A = dS, MN-major from dS^T[key][query] in
//                                               shared memory; B = K_w MN-major (K[key][d])
// The accumulators have the mma.sync C layout per 8 columns (hopper_common.cuh), so the
// element (key, query) a thread holds, the masks, and the dQ exchange are version 7's.
// Causal: query tiles wholly before key tile j are never loaded; a consumer whose 64 keys all
// follow the tile's last query waits for the tile and releases it without computing. Ragged N:
// a box that runs past a head's last row reads the next head's rows (zeros past the tensor);
// their P is 0 (lse = +inf for such queries, the key mask for such keys), and no dQ, dK or dV
// row past Nq or Nk is written.
//
// Compiled at run time by NVRTC with -arch=sm_90a, -DHEAD_DIM=<d> (and -DFLASHREF_BF16 for
// bfloat16 inputs); the caller passes the tensor maps of Q, dO (box 64 x 64) and K, V (box
// Bc x 64) over (B*H*N, D) views (flashref.gpu.tma.tensor_map). The speed is in results/.

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#define D HEAD_DIM
#define NWG 2                    // consumer warpgroups per block
#define Bc (NWG * 64)            // 128 keys per block, 64 per consumer warpgroup
#define Br 64                    // queries per inner tile
#define STAGES 2                 // query tiles (Q_i, dO_i, lse_i, D_i) in the ring
#define NCONSUMERS (NWG * 128)   // threads that arrive on an "empty" barrier
#define NTHREADS ((NWG + 1) * 128)  // + the producer warpgroup
#define PRODUCER_REGS 24         // setmaxnreg budgets: 128 (24 + 2 x 240) = 384 x 168
#define CONSUMER_REGS 240
#define NBOX (D / 64)            // 64-column boxes per row of a tile
#define FULL_ARRIVALS 33         // the TMA thread's expect_tx + the 32 lanes that load lse, D
#define DQ_FULL 3                // named barriers: dQ_i staged (the consumer arrives, the
#define DQ_EMPTY 4               // writer warp syncs), staging free (the other way round)
#define DQ_BAR_THREADS (128 + 32)  // one consumer warpgroup and the writer warp

#include "mma_common.cuh"     // half_t, u32, NEG_INF, pack_half2, ex2, red_add_v4, smem_u32
#include "hopper_common.cuh"  // wgmma, descriptors, mbarrier, TMA

constexpr u32 Q_BYTES = Br * D * 2;       // one Q_i or dO_i tile: (NBOX, Br, 64) swizzled
constexpr u32 KV_BYTES = Bc * D * 2;      // K_j or V_j: (NBOX, Bc, 64) swizzled
constexpr u32 BOX_Q = Br * 128;           // bytes from one 64-column box of Q_i to the next
constexpr u32 BOX_KV = Bc * 128;          // ... of K_j or V_j
constexpr u32 DS_BYTES = 64 * Br * 2;     // one consumer's dS^T: (64 keys, Br queries) swizzled
constexpr u32 DQ_ROW = D * 4 + 32;        // bytes from one staged row of dQ_i to the next
constexpr float LOG2E = 1.4426950408889634f;

__shared__ alignas(8) u64 bars_[1 + 2 * STAGES];  // K/V, full[STAGES], empty[STAGES]
__shared__ float lse_s_[STAGES][Br];               // lse * log2e of the stage's queries
__shared__ float D_s_[STAGES][Br];                 // D of the stage's queries

__device__ __forceinline__ void st_shared_u32(u32 addr, u32 x)
{
    asm volatile("st.shared.b32 [%0], %1;" :: "r"(addr), "r"(x) : "memory");
}

__device__ __forceinline__ void st_shared_f2(u32 addr, float x, float y)
{
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" :: "r"(addr), "f"(x), "f"(y) : "memory");
}

// the copy engine adds `bytes` of float32 from shared memory at src to global memory at dst
// (both 16-byte aligned, bytes a multiple of 16); tracked in this thread's bulk async-groups
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, u32 src, u32 bytes)
{
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
                 :: "l"(dst), "r"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// every bulk copy this thread committed has finished reading shared memory (.read) or is done
__device__ __forceinline__ void bulk_wait_read_all() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// issue C (64 x Br) = A B^T with A a 64-row block of K_j or V_j (K-major, box stride BOX_KV)
// and B = Q_i or dO_i (K-major, box stride BOX_Q): k = D in steps of 16, box ks / 4
__device__ __forceinline__ void kmajor_issue(float (&c)[Br / 2], u32 a, u32 b)
{
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++)
        wgmma_ss_n64<0>(c, desc_kmajor_sw128(a + (ks / 4) * BOX_KV, ks % 4),
                        desc_kmajor_sw128(b + (ks / 4) * BOX_Q, ks % 4), ks > 0);
}

// issue acc (64 x D) += A B, A (64 x Br) from registers (a[kk]: queries 16 kk .. 16 kk + 15),
// B = Q_i or dO_i (Br x D) MN-major
__device__ __forceinline__ void rs_issue(float (&acc)[D / 2], const u32 (&a)[Br / 16][4], u32 b)
{
#pragma unroll
    for (int kk = 0; kk < Br / 16; kk++) {
        const u64 db = desc_mnmajor_sw128(b, kk, BOX_Q);
#if D == 64
        wgmma_rs_n64<1>(acc, a[kk][0], a[kk][1], a[kk][2], a[kk][3], db, 1);
#else
        wgmma_rs_n128<1>(acc, a[kk][0], a[kk][1], a[kk][2], a[kk][3], db, 1);
#endif
    }
}

// issue dQ (Br x 64) = dS K_j over the block's 128 keys, for the 64 columns of K_j's box at
// kb: A = dS from the two consumers' dS^T (MN-major; keys 0-63 in consumer 0's buffer at ds0,
// 64-127 in consumer 1's, 2 DS_BYTES further), B = K_j (MN-major, 128 rows), 16 keys per
// instruction; the first ignores the old dq
__device__ __forceinline__ void dq_issue(float (&dq)[32], u32 ds0, u32 kb)
{
#pragma unroll
    for (int kk = 0; kk < Bc / 16; kk++)
        wgmma_ss_n64<1, 1>(dq, desc_mnmajor_sw128(ds0 + (kk / 4) * 2 * DS_BYTES, kk % 4, DS_BYTES),
                           desc_mnmajor_sw128(kb, kk, BOX_KV), kk > 0);
}

#include "dkdv_loop.cuh"  // pack_a, load_tiles, load_lse_d, store_dkdv

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
flash_bwd12(const half_t* __restrict__ Q,     // (B*H, Nq, D), read through qmap
           const half_t* __restrict__ K,     // (B*H, Nk, D), read through kmap
           const half_t* __restrict__ V,     // (B*H, Nk, D), read through vmap
           const half_t* __restrict__ dO,    // (B*H, Nq, D), read through domap
           const float* __restrict__ lse,    // (B*H, Nq), natural log, scale included
           const float* __restrict__ Dvec,   // (B*H, Nq), rowsum(dO * O)
           float* __restrict__ dQacc,        // (B*H, Nq, D), zeroed; dQ / scale is added here
           half_t* __restrict__ dK,          // (B*H, Nk, D)
           half_t* __restrict__ dV,          // (B*H, Nk, D)
           int Nq, int Nk, float scale, int causal,
           const __grid_constant__ TensorMap qmap,   // (B*H*Nq, D), box (64, 64)
           const __grid_constant__ TensorMap kmap,   // (B*H*Nk, D), box (Bc, 64)
           const __grid_constant__ TensorMap vmap,   // (B*H*Nk, D), box (Bc, 64)
           const __grid_constant__ TensorMap domap)  // (B*H*Nq, D), box (64, 64)
{
    extern __shared__ uint4 smem_[];
    const u32 Ks = (smem_u32(smem_) + 1023) & ~1023u;  // (NBOX, Bc, 64), 1024-byte aligned
    const u32 Vs = Ks + KV_BYTES;                      // (NBOX, Bc, 64)
    const u32 Qs_buf = Vs + KV_BYTES;                  // (STAGES, NBOX, Br, 64)
    const u32 dOs_buf = Qs_buf + STAGES * Q_BYTES;     // (STAGES, NBOX, Br, 64)
    const u32 dSs_buf = dOs_buf + STAGES * Q_BYTES;    // (NWG, 2, 64, Br): dS^T, key-major
    const u32 dQs = dSs_buf + NWG * 2 * DS_BYTES;      // (Br, DQ_ROW bytes): dQ_i staged
    const u32 kvbar = smem_u32(&bars_[0]);
    const u32 full0 = kvbar + 8, empty0 = kvbar + 8 + 8 * STAGES;  // stage st: + 8 st

    const int wg = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3;
    const int bh = blockIdx.y;
    const int c0 = blockIdx.x * Bc;  // this block's first key
    const int i_start = causal ? c0 / Br : 0;  // earlier query tiles see none of these keys
    const int Tr = (Nq + Br - 1) / Br;
    const int n_tiles = Tr > i_start ? Tr - i_start : 0;

    if (threadIdx.x == 0) {
        mbar_init(kvbar, 1);
        for (int st = 0; st < STAGES; st++) {
            mbar_init(full0 + 8 * st, FULL_ARRIVALS);
            mbar_init(empty0 + 8 * st, NCONSUMERS);
        }
        mbar_fence_init();
    }
    __syncthreads();

    if (wg == 0) {  // the producer warpgroup: registers given back; thread 0 and warp 1 copy,
                    // warp 2 sends dQ
        setmaxnreg_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            load_tiles(Ks, Vs, Qs_buf, dOs_buf, kvbar, full0, empty0, &qmap, &kmap, &vmap, &domap, bh,
                       Nq, Nk, c0, i_start, n_tiles);
        } else if (warp == 1) {  // lse * log2e (+inf: P = 0) and D of each query tile
            load_lse_d(lse, Dvec, full0, empty0, bh, Nq, i_start, n_tiles, lane);
        } else if (warp == 2) {  // dQ_i += the staged dq: one bulk reduce-add per row < Nq
            for (int it = 0; it < n_tiles; it++) {
                named_bar_sync(DQ_FULL, DQ_BAR_THREADS);  // the dQ consumer has staged dQ_i
                const int q0 = (i_start + it) * Br;
#pragma unroll
                for (int r = lane; r < Br; r += 32)
                    if (q0 + r < Nq)
                        bulk_reduce_add_f32(dQacc + ((size_t)bh * Nq + q0 + r) * D, dQs + r * DQ_ROW,
                                            D * 4);
                bulk_commit();
                bulk_wait_read_all();  // the copies have read the staging buffer
                if (it + 1 < n_tiles) named_bar_arrive(DQ_EMPTY, DQ_BAR_THREADS);
            }
            bulk_wait_all();  // the additions are done before the block ends
        }
        return;
    }

    setmaxnreg_inc<CONSUMER_REGS>();
    const int cw = wg - 1;                  // consumer warpgroup 0 or 1
    const int kw0 = c0 + cw * 64;           // its first key
    const u32 Kw = Ks + cw * 64 * 128, Vw = Vs + cw * 64 * 128;  // its 64 rows in each box
    const u32 dSw = dSs_buf + cw * 2 * DS_BYTES;
    float dk[D / 2], dv[D / 2];  // 64 keys x D of dK_j, dV_j: wgmma accumulator layout
#pragma unroll
    for (int i = 0; i < D / 2; i++) dk[i] = dv[i] = 0.f;
    const float sl2 = scale * LOG2E;  // exp(scale x) = 2^(sl2 x)
    const bool ragged_keys = kw0 + 64 > Nk;
    mbar_wait(kvbar, 0);

    for (int it = 0; it < n_tiles; it++) {
        const int st = it % STAGES;
        const int q0 = (i_start + it) * Br;
        mbar_wait(full0 + 8 * st, (it / STAGES) & 1);  // Q_i, dO_i, lse_i, D_i have landed
        const u32 Qs = Qs_buf + st * Q_BYTES, dOs = dOs_buf + st * Q_BYTES;
        const u32 dSt = dSw + (it & 1) * DS_BYTES;
        const float* lse_s = lse_s_[st];
        const float* D_s = D_s_[st];

        // S^T = K_w Q_i^T and dP^T = V_w dO_i^T: two commit groups
        // s[4 j + e], dp[4 j + e]: key 16 warp + g + 8 (e / 2), query 8 j + 2 t + e % 2
        float s[Br / 2], dp[Br / 2];
        __syncwarp();
        wgmma_fence();
        kmajor_issue(s, Kw, Qs);
        wgmma_commit();
        kmajor_issue(dp, Vw, dOs);
        wgmma_commit();

        // P^T = 2^(S^T sl2 - lse log2e), masked where a key is past Nk or after the query
        wgmma_wait<1>();
        wgmma_fence_acc(s);
        const bool edge = ragged_keys || (causal && kw0 + 63 > q0);
#pragma unroll
        for (int j = 0; j < Br / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = 8 * j + 2 * t + (e & 1);
                float p = ex2(fmaf(s[4 * j + e], sl2, -lse_s[col]));
                if (edge) {
                    const int key = kw0 + 16 * warp + g + 8 * (e >> 1);
                    if (key >= Nk || (causal && key > q0 + col)) p = 0.f;
                }
                s[4 * j + e] = p;
            }
        // dS^T = P^T * (dP^T - D)
        wgmma_wait<0>();
        wgmma_fence_acc(dp);
#pragma unroll
        for (int j = 0; j < Br / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                dp[4 * j + e] = s[4 * j + e] * (dp[4 * j + e] - D_s[8 * j + 2 * t + (e & 1)]);

        u32 pa[Br / 16][4], dsa[Br / 16][4];  // P^T, dS^T as A fragments
        pack_a(pa, s);
        pack_a(dsa, dp);
        // dS^T into shared memory (16-bit, 128-byte swizzle): dsa[j / 2][2 (j % 2) + h] holds
        // row 16 warp + g + 8 h, queries 8 j + 2 t, + 1; every lane of a warp hits another bank
#pragma unroll
        for (int j = 0; j < Br / 8; j++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                st_shared_u32(dSt + swizzle128(16 * warp + g + 8 * h, 8 * j + 2 * t),
                              dsa[j / 2][2 * (j % 2) + h]);
        fence_proxy_async();               // the stores above, before wgmma reads them
        const bool dq_here = (it & 1) == cw;  // this consumer computes dQ_i this tile
        if (!dq_here) {  // the other reads this dS^T: arrive and go on
            named_bar_arrive(1 + (it & 1), 2 * 128);
            wgmma_fence_acc(dv);
            wgmma_fence_acc(dk);
            wgmma_fence();
            rs_issue(dv, pa, dOs);
            rs_issue(dk, dsa, Qs);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_acc(dv);
            wgmma_fence_acc(dk);
            mbar_arrive(empty0 + 8 * st);  // this thread is done with the stage
            continue;
        }
        named_bar_sync(1 + (it & 1), 2 * 128);  // both consumers have stored dS^T

        // dV_w += P^T dO_i, dK_w += dS^T Q_i and the first 64 columns of dQ_i = dS K_j in one
        // commit group; at d = 128 the other 64 columns after it, so that dq is 32 registers
        float dq[32];  // dQ_i's columns 64 cb .. 64 cb + 63 over the block's 128 keys
        wgmma_fence_acc(dv);
        wgmma_fence_acc(dk);
        wgmma_fence();
        rs_issue(dv, pa, dOs);
        rs_issue(dk, dsa, Qs);
#pragma unroll
        for (int cb = 0; cb < NBOX; cb++) {
            if (cb > 0) wgmma_fence();
            dq_issue(dq, dSs_buf + (it & 1) * DS_BYTES, Ks + cb * BOX_KV);
            wgmma_commit();
            if (cb == 0 && it > 0)  // the writer warp has sent the last tile's dQ
                named_bar_sync(DQ_EMPTY, DQ_BAR_THREADS);
            wgmma_wait<0>();
            wgmma_fence_acc(dq);
            if (cb == 0) {
                wgmma_fence_acc(dv);
                wgmma_fence_acc(dk);
                mbar_arrive(empty0 + 8 * st);  // this thread is done with the stage
            }
            // rows 16 warp + g (+8) of the staging buffer, columns 64 cb + 8 n + 2 t, + 1
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    st_shared_f2(dQs + (16 * warp + g + 8 * h) * DQ_ROW + (64 * cb + 8 * n + 2 * t) * 4,
                                 dq[4 * n + 2 * h], dq[4 * n + 2 * h + 1]);
        }
        fence_proxy_async();  // this thread's stores, before the copy engine reads them
        named_bar_arrive(DQ_FULL, DQ_BAR_THREADS);
    }

    // dK_j = scale * sum dS^T Q, dV_j = sum P^T dO: rows kw0 + 16 warp + g (+8), if < Nk
    store_dkdv(dK, dV, dk, dv, scale, bh, Nk, kw0 + 16 * warp + g, t);
}
