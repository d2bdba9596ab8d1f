// The two small kernels around every backward version (bwd1, bwd2, ...): the preprocess
// D = rowsum(dO * O) before the main kernel, and the conversion of dQ from its float32
// accumulator into the inputs' 16-bit dtype after it.
//
// bwd_preprocess: one row of D per D/8 threads. dO and O are (B*H, Nq, D) in fp16 or bf16,
// row-major, 16-byte aligned; each thread reads 8 elements of each with one 16-byte load,
// multiplies in fp32 and the D/8 threads of a row (neighbouring lanes of one warp) add their
// partial sums with shuffles. D is (B*H, Nq) fp32: the number the softmax's Jacobian needs
// once per query, dS = P * (dP - D), computed once here instead of once per key tile.
//
// bwd_dq_convert: dQ = scale * dQacc, fp32 (B*H, Nq, D) -> 16-bit, two elements per thread.
// The main kernels add each key tile's share into dQacc with atomics (or write it in a
// separate pass); the scale is applied here, once per element, rather than per addition.
//
// Compiled at run time by NVRTC with -DHEAD_DIM=<d>, d in {64, 128} (and -DFLASHREF_BF16 for
// bfloat16 inputs); the PTX wrappers are in mma_common.cuh.

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#define D HEAD_DIM
#define NTHREADS 128

#include "mma_common.cuh"  // typedefs and pack_half2

constexpr int CHUNKS = D / 8;              // threads per row, 8 elements (16 bytes) each
constexpr int ROWS = NTHREADS / CHUNKS;    // rows per block

// one 16-bit element (in the low half of a register) to fp32
__device__ __forceinline__ float lo_to_float(u32 x)
{
#ifdef FLASHREF_BF16
    return __uint_as_float(x << 16);
#else
    float f;
    asm("{ .reg .b16 h; cvt.u16.u32 h, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "r"(x));
    return f;
#endif
}

__device__ __forceinline__ float dot_pair(u32 a, u32 b)  // a.lo b.lo + a.hi b.hi in fp32
{
    return lo_to_float(a) * lo_to_float(b) + lo_to_float(a >> 16) * lo_to_float(b >> 16);
}

extern "C" __global__ void __launch_bounds__(NTHREADS)
bwd_preprocess(const half_t* __restrict__ O,   // (B*H, Nq, D)
               const half_t* __restrict__ dO,  // (B*H, Nq, D)
               float* __restrict__ Dvec,       // (B*H, Nq): D = rowsum(dO * O)
               int Nq)
{
    const int bh = blockIdx.y;
    const int row = blockIdx.x * ROWS + threadIdx.x / CHUNKS;
    const int c = threadIdx.x % CHUNKS;
    float sum = 0.f;
    if (row < Nq) {
        const size_t at = ((size_t)bh * Nq + row) * D + c * 8;
        const uint4 o = *(const uint4*)(O + at), g = *(const uint4*)(dO + at);
        sum = dot_pair(o.x, g.x) + dot_pair(o.y, g.y) + dot_pair(o.z, g.z) + dot_pair(o.w, g.w);
    }
#pragma unroll
    for (int off = CHUNKS / 2; off > 0; off /= 2)  // the CHUNKS lanes of a row are neighbours
        sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (row < Nq && c == 0) Dvec[(size_t)bh * Nq + row] = sum;
}

extern "C" __global__ void __launch_bounds__(256)
bwd_dq_convert(const float2* __restrict__ dQacc,  // (B*H*Nq*D/2,) pairs of fp32
               u32* __restrict__ dQ,              // (B*H*Nq*D/2,) pairs of 16-bit
               long long pairs, float scale)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < pairs;
         i += (long long)gridDim.x * blockDim.x) {
        const float2 x = dQacc[i];
        dQ[i] = pack_half2(x.x * scale, x.y * scale);
    }
}
