// Probes of the Hopper wrappers in hopper_common.cuh (not a kernel version). sm_90a only.
//
// One block of one warpgroup (128 threads) each. flashref/bench/hopper_probe.py launches them,
// one stage per process (a bad wgmma poisons the CUDA context, a bad barrier hangs), and
// compares every output with the NumPy models of flashref/hardware/hopper.py:
//   probe_tma          (i)   TMA loads a (box_rows, 64) box, 128-byte swizzle, into shared
//                            memory, waiting on an mbarrier with expect_tx; the raw shared
//                            bytes are written back: out[i] = 16-bit word i of the tile
//   probe_pipeline     (i')  `tiles` 64 x 64 boxes through a ring of two buffers, each with
//                            its own mbarrier re-armed per use: the wait parity of use u of
//                            a buffer is u % 2; out[t] = the shared image of tile t
//   probe_ss_hand_nN   (ii)  Q (64 x 64) and K (N x 64) stored into shared memory by the
//                            threads with the swizzle formula (no TMA); S = Q K^T by 4 wgmma
//                            m64nNk16 (k = 64 in steps of 16, descriptors 32 bytes apart)
//   probe_ss_tma_nN    (iii) the same with Q and K loaded by TMA
//   probe_rs_nN        (iv)  S = Q K^T (SS, N = 64), P = S rounded to 16 bits in the A
//                            fragment layout, O = P V by 4 wgmma m64nNk16 with A from
//                            registers and V (64 x N, as V[key][d]) MN-major from TMA,
//                            LBO and SBO of V's descriptor given by the host
// Each wgmma stage writes its accumulators twice: raw[thread][register] untouched, and
// D[row][col] placed by the fragment map of hopper_common.cuh, so the host can tell a wrong
// map from a wrong product. flags[0] = 1 if __CUDA_ARCH_FEAT_SM90_ALL (the sm_90a feature
// macro) was defined, flags[1] = 1 when the barrier wait returned.
#include "mma_common.cuh"
#include "hopper_common.cuh"

#ifdef __CUDA_ARCH_FEAT_SM90_ALL
#define FEAT_SM90A 1
#else
#define FEAT_SM90A 0
#endif

// raw[tid][i] = d[i]; D (64 x 2R) placed by the accumulator layout of wgmma m64nNk16
template <int R>
__device__ __forceinline__ void store_acc(const float (&d)[R], float* raw, float* D)
{
    const int tid = threadIdx.x, w = tid / 32, g = (tid % 32) / 4, t = tid % 4;
#pragma unroll
    for (int i = 0; i < R; i++) raw[tid * R + i] = d[i];
#pragma unroll
    for (int j = 0; j < R / 4; j++) {
        const int row = 16 * w + g, col = 8 * j + 2 * t;
        D[row * 2 * R + col] = d[4 * j];
        D[row * 2 * R + col + 1] = d[4 * j + 1];
        D[(row + 8) * 2 * R + col] = d[4 * j + 2];
        D[(row + 8) * 2 * R + col + 1] = d[4 * j + 3];
    }
}

// S (64 x N) = Q K^T from swizzled tiles at shared addresses q and k: 4 k-steps of 16
template <int N>
__device__ __forceinline__ void qk_ss(float (&s)[N / 2], u32 q, u32 k)
{
#pragma unroll
    for (int i = 0; i < N / 2; i++) s[i] = 0.f;
    wgmma_fence_acc(s);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        if constexpr (N == 64)
            wgmma_ss_n64<0>(s, desc_kmajor_sw128(q, ks), desc_kmajor_sw128(k, ks), 1);
        else
            wgmma_ss_n128<0>(s, desc_kmajor_sw128(q, ks), desc_kmajor_sw128(k, ks), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_acc(s);
}

// thread 0 sets up the barrier; everyone sees it initialised
__device__ __forceinline__ void barrier_setup(u32 bar)
{
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        mbar_fence_init();
    }
    __syncthreads();
}

__shared__ alignas(1024) half_t Qs[64 * 64];   // 8 KB, (64, 64) swizzled
__shared__ alignas(1024) half_t Ks[128 * 64];  // 16 KB, (N, 64) swizzled
__shared__ alignas(1024) half_t Vs[128 * 64];  // 16 KB, (64, N) as N / 64 boxes of (64, 64)
__shared__ alignas(8) u64 bar_;
__shared__ alignas(8) u64 bars_[2];  // one per ring buffer (probe_pipeline)

extern "C" __global__ void __launch_bounds__(128)
probe_tma(const __grid_constant__ TensorMap map, half_t* __restrict__ out,  // (box_rows * 64,)
          int box_rows, int row0, int* __restrict__ flags)                    // (2,)
{
    const u32 bar = smem_u32(&bar_), dst = smem_u32(Ks);
    barrier_setup(bar);
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, box_rows * 64 * 2);
        tma_load_2d(dst, &map, 0, row0, bar);
    }
    mbar_wait(bar, 0);
    for (int i = threadIdx.x; i < box_rows * 64; i += blockDim.x) out[i] = Ks[i];
    if (threadIdx.x == 0) {
        flags[0] = FEAT_SM90A;
        flags[1] = 1;
    }
}

extern "C" __global__ void __launch_bounds__(128)
probe_pipeline(const __grid_constant__ TensorMap map, half_t* __restrict__ out,  // (tiles, 4096)
               int tiles, int* __restrict__ flags)                                 // (2,)
{
    const u32 bar0 = smem_u32(&bars_[0]), buf0 = smem_u32(Ks);  // bar b: bar0 + 8 b
    const int BUF = 64 * 64 * 2;  // buffer b: buf0 + BUF b (8 KB, 1024-aligned)
    if (threadIdx.x == 0) {
        mbar_init(bar0, 1);
        mbar_init(bar0 + 8, 1);
        mbar_fence_init();
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int t = 0; t < 2 && t < tiles; t++) {
            mbar_arrive_expect_tx(bar0 + 8 * t, BUF);
            tma_load_2d(buf0 + BUF * t, &map, 0, 64 * t, bar0 + 8 * t);
        }
    for (int t = 0; t < tiles; t++) {
        const int b = t % 2;
        mbar_wait(bar0 + 8 * b, (t / 2) % 2);  // use t / 2 of buffer b
        const half_t* tile = Ks + b * 64 * 64;
        for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) out[t * 64 * 64 + i] = tile[i];
        __syncthreads();  // every thread has read buffer b: it may be refilled
        if (threadIdx.x == 0 && t + 2 < tiles) {
            fence_proxy_async();  // order the generic reads before the async-proxy write
            mbar_arrive_expect_tx(bar0 + 8 * b, BUF);
            tma_load_2d(buf0 + BUF * b, &map, 0, 64 * (t + 2), bar0 + 8 * b);
        }
    }
    if (threadIdx.x == 0) {
        flags[0] = FEAT_SM90A;
        flags[1] = 1;
    }
}

template <int N>
__device__ __forceinline__ void ss_hand(const half_t* Q, const half_t* K, float* raw, float* S)
{
    // Q (64, 64), K (N, 64) row-major in global memory: element (r, c) to its swizzled place
    for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x)
        *(half_t*)((char*)Qs + swizzle128(i / 64, i % 64)) = Q[i];
    for (int i = threadIdx.x; i < N * 64; i += blockDim.x)
        *(half_t*)((char*)Ks + swizzle128(i / 64, i % 64)) = K[i];
    fence_proxy_async();  // generic-proxy stores -> read by wgmma (async proxy)
    __syncthreads();
    float s[N / 2];
    qk_ss<N>(s, smem_u32(Qs), smem_u32(Ks));
    store_acc(s, raw, S);
}

template <int N>
__device__ __forceinline__ void ss_tma(const TensorMap* qmap, const TensorMap* kmap, float* raw,
                                       float* S, int* flags)
{
    const u32 bar = smem_u32(&bar_);
    barrier_setup(bar);
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, (64 + N) * 64 * 2);
        tma_load_2d(smem_u32(Qs), qmap, 0, 0, bar);
        tma_load_2d(smem_u32(Ks), kmap, 0, 0, bar);
    }
    mbar_wait(bar, 0);
    if (threadIdx.x == 0) {
        flags[0] = FEAT_SM90A;
        flags[1] = 1;
    }
    float s[N / 2];
    qk_ss<N>(s, smem_u32(Qs), smem_u32(Ks));
    store_acc(s, raw, S);
}

template <int N>
__device__ __forceinline__ void rs(const TensorMap* qmap, const TensorMap* kmap,
                                   const TensorMap* vmap, float* raw, float* O, u32 lbo, u32 sbo,
                                   int* flags)
{
    const u32 bar = smem_u32(&bar_);
    barrier_setup(bar);
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, (64 + 64 + N) * 64 * 2);
        tma_load_2d(smem_u32(Qs), qmap, 0, 0, bar);
        tma_load_2d(smem_u32(Ks), kmap, 0, 0, bar);
        for (int b = 0; b < N / 64; b++)  // V (64 keys, N) as boxes of 64 columns
            tma_load_2d(smem_u32(Vs) + b * 64 * 64 * 2, vmap, 64 * b, 0, bar);
    }
    mbar_wait(bar, 0);
    if (threadIdx.x == 0) {
        flags[0] = FEAT_SM90A;
        flags[1] = 1;
    }
    float s[32];  // S (64 x 64): the scores of 64 keys
    qk_ss<64>(s, smem_u32(Qs), smem_u32(Ks));
    u32 a[4][4];  // P's A fragments for keys 16 kk .. 16 kk + 15: accumulator columns of S
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) a[kk][r] = pack_half2(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
    float o[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; i++) o[i] = 0.f;
    wgmma_fence_acc(o);
    wgmma_fence();  // after the last ordinary write of a and o
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const u64 dv = desc_sw128(smem_u32(Vs) + 2048 * kk, lbo, sbo);
        if constexpr (N == 64)
            wgmma_rs_n64<1>(o, a[kk][0], a[kk][1], a[kk][2], a[kk][3], dv, 1);
        else
            wgmma_rs_n128<1>(o, a[kk][0], a[kk][1], a[kk][2], a[kk][3], dv, 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_acc(o);
    store_acc(o, raw, O);
}

#define SS_PROBES(N)                                                                               \
    extern "C" __global__ void __launch_bounds__(128)                                              \
    probe_ss_hand_n##N(const half_t* __restrict__ Q, const half_t* __restrict__ K,                 \
                       float* __restrict__ raw, float* __restrict__ S)                             \
    {                                                                                              \
        ss_hand<N>(Q, K, raw, S);                                                                  \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(128)                                              \
    probe_ss_tma_n##N(const __grid_constant__ TensorMap qmap, const __grid_constant__ TensorMap kmap, \
                      float* __restrict__ raw, float* __restrict__ S, int* __restrict__ flags)     \
    {                                                                                              \
        ss_tma<N>(&qmap, &kmap, raw, S, flags);                                                    \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(128)                                              \
    probe_rs_n##N(const __grid_constant__ TensorMap qmap, const __grid_constant__ TensorMap kmap,  \
                  const __grid_constant__ TensorMap vmap, float* __restrict__ raw,                 \
                  float* __restrict__ O, unsigned lbo, unsigned sbo, int* __restrict__ flags)      \
    {                                                                                              \
        rs<N>(&qmap, &kmap, &vmap, raw, O, lbo, sbo, flags);                                       \
    }

SS_PROBES(64)
SS_PROBES(128)
