// Shared by every tensor-core version (3 and later): the PTX instructions they use, each
// wrapped once, with the data layout it assumes. A version's file includes this header and
// holds only its algorithm, so the diff between two versions shows only what changed.
//
// flashref's loader pastes this file in place of the #include line before NVRTC compiles a
// version (so CuPy's kernel cache sees the whole source); nvcc compile checks use -I.
//
// Element type: 16-bit floats, fp16 by default, bf16 when compiled with -DFLASHREF_BF16.
// Both go through the same mma.sync shape and fragment layout; only the instruction's type
// suffix and the fp32 -> 16-bit conversion differ. Accumulation is always fp32.
#pragma once

typedef unsigned short half_t;  // the bits of one fp16 (or bf16) element
typedef unsigned int u32;

#define NEG_INF __int_as_float(0xff800000)

#ifdef FLASHREF_BF16
#define MMA_AB "bf16"  // mma.sync operand type, also the cvt.rn.<type>x2 target
#else
#define MMA_AB "f16"
#endif

// ---- shared-memory addresses ---------------------------------------------------------------
// The instructions below take a 32-bit address in the shared state space.
//
// smem_addr: converts a generic pointer with an inline cvta, as versions 3-11 do at every call.
// The conversion is opaque to the compiler, so a constant offset added to the pointer cannot be
// folded into the instruction's immediate: every ldmatrix pays for its own address arithmetic.
__device__ __forceinline__ u32 smem_addr(const void* p)
{
    u32 r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

// smem_u32: the same conversion through the compiler's intrinsic (version 12 and later). Done
// once per buffer, it gives a base to which constant offsets are added; the compiler folds
// them into each ldmatrix / cp.async as an immediate offset.
__device__ __forceinline__ u32 smem_u32(const void* p)
{
    return (u32)__cvta_generic_to_shared(p);
}

// ---- ldmatrix: four 8 x 8 matrices of 16-bit elements from shared memory -------------------
// Lane i gives the address of one 8-element (16-byte) row: lanes 0-7 the rows of matrix 0,
// 8-15 of matrix 1, 16-23 of matrix 2, 24-31 of matrix 3. Each lane receives one register per
// matrix, r_m, holding two adjacent elements of matrix m: row lane / 4, columns 2 (lane % 4)
// and 2 (lane % 4) + 1. With .trans each matrix is transposed on the way (row <-> column).
__device__ __forceinline__ void ldsm_x4(u32 a, u32& r0, u32& r1, u32& r2, u32& r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a) : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(u32 a, u32& r0, u32& r1, u32& r2, u32& r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a) : "memory");
}
// the same from a generic pointer (versions 3-11)
__device__ __forceinline__ void ldsm_x4(const half_t* p, u32& r0, u32& r1, u32& r2, u32& r3)
{
    ldsm_x4(smem_addr(p), r0, r1, r2, r3);
}
__device__ __forceinline__ void ldsm_x4_trans(const half_t* p, u32& r0, u32& r1, u32& r2, u32& r3)
{
    ldsm_x4_trans(smem_addr(p), r0, r1, r2, r3);
}

// ---- mma.sync m16n8k16: c (16 x 8, fp32) += a (16 x 16) b (16 x 8) --------------------------
// With g = lane / 4 and t = lane % 4 (PTX ISA, "Matrix Fragments for mma.m16n8k16"):
//   a0: A[g][2t, 2t+1]      a1: A[g+8][2t, 2t+1]    a2: A[g][2t+8, 2t+9]    a3: A[g+8][2t+8, 2t+9]
//   b0: B[2t, 2t+1][g]      b1: B[2t+8, 2t+9][g]    (B is k x n, held by columns)
//   c0, c1: C[g][2t, 2t+1]  c2, c3: C[g+8][2t, 2t+1]
// An ldmatrix.x4 of a 16 x 16 row-major tile, lanes 0-15 pointing at its rows and lanes 16-31
// at the same rows 8 columns on, returns exactly a0..a3. The C layout is the A layout of a
// 16 x 8 half, which is why P can go from the first product's accumulators straight into the
// second product's A operand without passing through shared memory.
__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_AB "." MMA_AB ".f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// two fp32 -> one register of two 16-bit elements (lo in the low 16 bits), round to nearest
__device__ __forceinline__ u32 pack_half2(float lo, float hi)
{
    u32 r;
    asm("cvt.rn." MMA_AB "x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// 2^x with the hardware's approximate exponential (-inf -> 0)
__device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// ---- cp.async: 16 bytes global -> shared without passing through registers -----------------
// With ok == false nothing is read and the 16 bytes are zero-filled.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool ok)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async16(half_t* dst, const half_t* src, bool ok)
{
    cp_async16(smem_addr(dst), src, ok);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

// ---- red.global.add.v2.f32: two fp32 atomic additions in one instruction (sm_90 and later) --
// Adds a to p[0] and b to p[1]; p must be 8-byte aligned. The mma C fragment gives each lane
// two adjacent columns of a row (c0, c1 and c2, c3), which is what this takes: backward
// version 4 adds its dQ fragments with it. Vector red exists from sm_90 on only; compiled for
// an earlier GPU, this is two scalar atomicAdd.
__device__ __forceinline__ void red_add_v2(float* p, float a, float b)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" :: "l"(p), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
}

// ---- red.global.add.v4.f32: four fp32 atomic additions in one instruction (sm_90 and later) -
// Adds a, b, c, e to p[0..3]; p must be 16-byte aligned. Each lane's mma C fragment holds two
// adjacent columns per row, so a lane gathers four from its neighbour (t ^ 1) first: backward
// version 5 does. Before sm_90, two red_add_v2 (which are then four scalar atomicAdd).
__device__ __forceinline__ void red_add_v4(float* p, float a, float b, float c, float e)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "f"(a), "f"(b), "f"(c), "f"(e) : "memory");
#else
    red_add_v2(p, a, b);
    red_add_v2(p + 2, c, e);
#endif
}
