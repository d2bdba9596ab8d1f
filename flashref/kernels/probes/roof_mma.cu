// Microbenchmark: the mma.sync roof, the peak rate of mma.sync.m16n8k16 (fp32 accumulate)
// on this GPU, with its SM clock measured in the same launch.
//
// Every warp issues ITERS x CHAINS mma instructions on operands held in registers (random
// 16-bit values, not zeros: zeros can run faster than real data). CHAINS independent
// accumulators per warp keep the tensor pipe busy while each mma's result is pending. Thread 0
// of block 0 reads the SM cycle counter and the global nanosecond timer around its loop, so
// the launch also reports the clock the tensor cores ran at.
// FLOPs = blocks x warps per block x ITERS x CHAINS x 2 x 16 x 8 x 16.
#include "mma_common.cuh"

#define CHAINS 8

extern "C" __global__ void __launch_bounds__(128)
roof_mma(const u32* __restrict__ in,  // (6 * 32,) operand registers, one set per lane
         float* __restrict__ out,     // (gridDim.x * 128,) keeps the results alive
         long long* __restrict__ clocks,  // (2,) SM cycles and ns of block 0's loop
         int iters)
{
    const int lane = threadIdx.x % 32;
    const u32 a0 = in[lane], a1 = in[32 + lane], a2 = in[64 + lane], a3 = in[96 + lane];
    const u32 b0 = in[128 + lane], b1 = in[160 + lane];
    float c[CHAINS][4];
#pragma unroll
    for (int j = 0; j < CHAINS; j++) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
    long long t0 = clock64(), n0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(n0));
    for (int i = 0; i < iters; i++)
#pragma unroll
        for (int j = 0; j < CHAINS; j++) mma16816(c[j], a0, a1, a2, a3, b0, b1);
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < CHAINS; j++) sum += c[j][0] + c[j][1] + c[j][2] + c[j][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        long long t1 = clock64(), n1;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(n1));
        clocks[0] = t1 - t0;
        clocks[1] = n1 - n0;
    }
}
