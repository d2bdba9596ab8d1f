// Microbenchmark: HBM read bandwidth. Every thread reads 16-byte pieces of a buffer far larger
// than L2 (a few GiB) with ld.global.cg, once, four independent loads in flight per thread per
// step; nothing is written but one word that is practically never stored. The XOR of
// everything read keeps the loads alive. This is the ceiling of a kernel that only reads
// (a decode kernel reads K and V and writes almost nothing); a copy also writes.
typedef unsigned int u32;

extern "C" __global__ void __launch_bounds__(256)
roof_hbm_read(const uint4* __restrict__ buf, long long n16, uint4* __restrict__ out)
{
    uint4 acc = make_uint4(0, 0, 0, 0);
    const long long step = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * step < n16; i += 4 * step) {
        uint4 x[4];
#pragma unroll
        for (int u = 0; u < 4; u++) x[u] = __ldcg(buf + i + u * step);
#pragma unroll
        for (int u = 0; u < 4; u++) acc.x ^= x[u].x, acc.y ^= x[u].y, acc.z ^= x[u].z, acc.w ^= x[u].w;
    }
    for (; i < n16; i += step) {
        uint4 x = __ldcg(buf + i);
        acc.x ^= x.x; acc.y ^= x.y; acc.z ^= x.z; acc.w ^= x.w;
    }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u) out[0] = acc;  // practically never
}
