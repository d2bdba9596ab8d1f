// Probes of the register layouts in flashref/hardware/fragments.py (not a kernel version).
//
// One warp each. tests/hardware/test_fragments.py launches them and compares every lane's
// registers with the Python maps:
//   probe_ldmatrix: a 16 x 16 tile of 16-bit codes (row << 8 | col) goes to shared
//     memory; one ldmatrix.x4 (or .x4.trans) with the address pattern of the kernels'
//     Q, K or V load (versions 3-11, loop offsets at 0) fills r0..r3 of each lane,
//     which are written out unchanged: out[lane][reg], half 0 in the low 16 bits.
//   probe_mma: each lane passes in its A (a0..a3) and B (b0, b1) registers as the
//     Python maps lay them out; one mma.m16n8k16 with C = 0 runs, and every lane
//     writes its d0..d3: out[lane][reg].
// The PTX wrappers are those of the kernels. Compiled at run time by NVRTC; no headers.

#define LDS 16  // row stride of the shared tile in halves (32 bytes: rows stay 16-byte aligned)

typedef unsigned short half_t;  // fp16 (or any 16-bit) bits, moved untouched by ldmatrix
typedef unsigned int u32;

__device__ __forceinline__ u32 smem_addr(const void* p)
{
    u32 r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

__device__ __forceinline__ void ldsm_x4(const half_t* p, u32& r0, u32& r1, u32& r2, u32& r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(smem_addr(p)) : "memory");
}

__device__ __forceinline__ void ldsm_x4_trans(const half_t* p, u32& r0, u32& r1, u32& r2, u32& r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(smem_addr(p)) : "memory");
}

// c += A B for one 16 x 8 x 16 tile, fp16 inputs, fp32 accumulators
__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// pattern 0: Q (A operand), 1: K (B operand, no .trans), 2: V (B operand, .trans).
// pattern is the same for the whole warp, so every lane takes the same branch.
extern "C" __global__ void probe_ldmatrix(const half_t* __restrict__ tile,  // (16, 16)
                                          u32* __restrict__ out,            // (32, 4)
                                          int pattern)
{
    __shared__ uint4 Ts_[16 * LDS / 8];  // uint4: 16-byte aligned, as ldmatrix rows must be
    half_t* Ts = (half_t*)Ts_;           // (16, LDS)
    const int lane = threadIdx.x % 32;
    for (int i = lane; i < 16 * 16; i += 32) Ts[(i / 16) * LDS + i % 16] = tile[i];
    __syncthreads();

    const int row0 = 0, k0 = 0, j = 0, kk = 0, n = 0;  // the kernels' loop offsets
    u32 r0, r1, r2, r3;
    if (pattern == 0)
        ldsm_x4(Ts + (row0 + lane % 16) * LDS + k0 + (lane / 16) * 8, r0, r1, r2, r3);
    else if (pattern == 1)
        ldsm_x4(Ts + (j * 8 + (lane % 8) + (lane / 16) * 8) * LDS + k0 + ((lane / 8) % 2) * 8,
                r0, r1, r2, r3);
    else
        ldsm_x4_trans(Ts + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LDS + n * 8 + (lane / 16) * 8,
                      r0, r1, r2, r3);
    out[lane * 4 + 0] = r0;
    out[lane * 4 + 1] = r1;
    out[lane * 4 + 2] = r2;
    out[lane * 4 + 3] = r3;
}

extern "C" __global__ void probe_mma(const u32* __restrict__ a,  // (32, 4): a0..a3 of each lane
                                     const u32* __restrict__ b,  // (32, 2): b0, b1 of each lane
                                     float* __restrict__ out)    // (32, 4): d0..d3 of each lane
{
    const int lane = threadIdx.x % 32;
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    mma16816(c, a[lane * 4 + 0], a[lane * 4 + 1], a[lane * 4 + 2], a[lane * 4 + 3],
             b[lane * 2 + 0], b[lane * 2 + 1]);
    for (int i = 0; i < 4; i++) out[lane * 4 + i] = c[i];
}
